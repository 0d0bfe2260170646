/* handlers.h -- one handler per request type, each a row of dispatch.c's table. The
 * generic path has done the checks every request shares (Hello first, payloads,
 * waiting for queued work and reporting the pending error for synchronising requests)
 * and binds placeholders for the new ids of a request that failed; a handler checks
 * what is its own, then answers through r (reply.h). Each returns a TDD_DISPATCH_*. */
#ifndef TDD_HANDLERS_H
#define TDD_HANDLERS_H

#include "reply.h"

/* session_req.c */
int tdd_h_hello(tdd_req *r);
int tdd_h_sync(tdd_req *r);
int tdd_h_goodbye(tdd_req *r);
/* The line Hello's reply carries for every client (e.g. no GPU). */
void tdd_hello_set_note(const char *note);

/* query_req.c */
int tdd_h_list_devices(tdd_req *r);
int tdd_h_stats(tdd_req *r);
/* ListOps: every op's schema from the op table (name, kind, inputs, attributes). */
int tdd_h_list_ops(tdd_req *r);
int tdd_h_describe(tdd_req *r);

/* data_req.c */
int tdd_h_upload(tdd_req *r);
int tdd_h_download(tdd_req *r);

/* op_req.c */
int tdd_h_op(tdd_req *r);
int tdd_h_to_device(tdd_req *r);
int tdd_h_release(tdd_req *r);
/* A request's device field: the default device when unset, else the one served here;
 * NULL with err set (DEVICE_UNAVAILABLE, or INVALID_ARGUMENT for an unknown backend). */
struct tdd_device *tdd_resolve_device(const Tensordd__V1__Device *d, td_error *err);

/* autograd_req.c */
int tdd_h_backward(tdd_req *r);
int tdd_h_grad(tdd_req *r);
int tdd_h_grad_remove(tdd_req *r);
int tdd_h_grad_replace(tdd_req *r);
int tdd_h_set_grad_mode(tdd_req *r);

/* optim_req.c */
int tdd_h_optimizer_create(tdd_req *r);
int tdd_h_optimizer_step(tdd_req *r);
int tdd_h_optimizer_state(tdd_req *r);
int tdd_h_optimizer_load_state(tdd_req *r);

#endif
