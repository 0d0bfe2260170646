/* autograd.h -- autodiff in the daemon: graph recording, backward, gradients, optimizers. */
#ifndef TDD_AUTOGRAD_H
#define TDD_AUTOGRAD_H

#include "conn.h"

/* Records the op that produced out[] from in[] when grad mode is on and an
 * input requires grad; marks the (floating-point) outputs as requiring grad.
 * attrs are the request's attributes (views' dims); may be NULL. */
void tdd_autograd_record(tdd_session *s, tdd_op op, const tdd_opargs *args, const tdd_attrs *attrs,
                         tdd_value *const *in, int n_in, tdd_value *const *out, int n_out);
/* Records a ToDevice (the gradient flows back to the source device). */
void tdd_autograd_record_to_device(tdd_session *s, tdd_value *in, tdd_value *out);
/* The "detach" op: a new handle on the same data, outside the graph. */
/* Drops a value's reference on its grad_fn (session.c calls it when a value dies). */
void tdd_autograd_value_free(tdd_value *v);
/* Backward, Grad, GradRemove, GradReplace, SetGradMode, OptimizerCreate,
 * OptimizerStep. Returns a TDD_DISPATCH_* code. */
int tdd_autograd_dispatch(tdd_conn *c, Tensordd__V1__Request *req);
void tdd_autograd_init(void);
void tdd_autograd_session_free(tdd_session *s);

#endif
