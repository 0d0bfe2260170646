/* autograd.h -- autodiff in the daemon: graph recording, backward, gradients, optimizers. */
#ifndef TDD_AUTOGRAD_H
#define TDD_AUTOGRAD_H

#include "session.h"

struct tdd_node;

/* Whether op on in[] is recorded: grad mode on, an input that requires grad, not detach. */
bool tdd_autograd_tracks(const tdd_session *s, tdd_op op, tdd_value *const *in, int n_in);
/* A graph node for n_in inputs and n_out outputs, charged to the session's memory account
 * before the op is queued, so a graph the quota cannot hold fails the op with a typed
 * RESOURCE_EXHAUSTED (NULL, err set) instead of recording a broken history. */
struct tdd_node *tdd_autograd_reserve(tdd_session *s, int n_in, int n_out, td_error *err);
/* Gives back a reserved node that was not used (the op failed). */
void tdd_autograd_unreserve(struct tdd_node *n);
/* Records, in the reserved node n (consumed), the op that produced out[] from in[]; marks
 * the floating-point outputs as requiring grad. attrs are the request's attributes (views'
 * dims); may be NULL. */
void tdd_autograd_record(struct tdd_node *n, tdd_op op, const tdd_opargs *args,
                         const tdd_attrs *attrs, tdd_value *const *in, int n_in,
                         tdd_value *const *out, int n_out);
/* Records a ToDevice in n (consumed): the gradient flows back to the source device. */
void tdd_autograd_record_to_device(struct tdd_node *n, tdd_value *in, tdd_value *out);
/* Hands session.c its hooks, the Gradients and optimizer handles their free functions. */
void tdd_autograd_init(void);

#endif
