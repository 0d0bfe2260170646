/* exec_op.h -- submitting work for a session: the one path every op takes
 * (client ops, and the ops autodiff and optimizers issue internally). */
#ifndef TDD_EXEC_OP_H
#define TDD_EXEC_OP_H

#include "session.h"

/* Validates and queues op on the inputs' device (dev for creation ops).
 * On success fills out[0..*n_out) with new values (references owned by the
 * caller) whose data will be ready in queue order; on failure returns a TD_E*
 * code with err filled and queues nothing. Poisoned inputs known now fail
 * with POISONED; inputs poisoned later poison the outputs when the op runs.
 * want_reply: the session's connection gets a reply once the op has run.
 * *n_out: 0 for "as many as the op makes", else the count expected.
 * args_out (may be NULL) receives the validated arguments (for autodiff). */
int tdd_submit_op(tdd_session *s, uint64_t req_id, bool want_reply, tdd_op op, const tdd_opreq *req,
                  tdd_value *const *in, int n_in, tdd_device *dev, tdd_value **out, int *n_out,
                  tdd_opargs *args_out, td_error *err);

/* The same, naming the outputs' client handle ids (out_ids[0..n), may be NULL)
 * so that replies sent before the caller binds them carry the ids. */
int tdd_submit_op_named(tdd_session *s, uint64_t req_id, bool want_reply, tdd_op op,
                        const tdd_opreq *req, tdd_value *const *in, int n_in, tdd_device *dev,
                        const uint64_t *out_ids, tdd_value **out, int *n_out, tdd_opargs *args_out,
                        td_error *err);

/* Checks that inputs share a backend and device; typed errors name both sides. */
int tdd_check_same_device(tdd_value *const *in, int n_in, td_error *err);

/* Queues a copy of src's data into dst's own storage, in place (an update every view of
 * dst's storage sees, as torch's copy_). Same device, dtype and shape; dst contiguous.
 * dst's readers from then on wait for the copy. On failure returns a TD_E* code with err
 * filled and queues nothing; a copy failing when it runs poisons dst. */
int tdd_submit_assign(tdd_session *s, uint64_t req_id, tdd_value *dst, tdd_value *src,
                      td_error *err);

/* A new contiguous value of dtype dt and shape[0..ndim) on dev, its storage charged to the
 * session's account; NULL with err set (RESOURCE_EXHAUSTED: host memory, the device's or
 * the quota). Nothing is queued: the caller fills it. */
tdd_value *tdd_value_alloc(tdd_session *s, tdd_device *dev, td_dtype dt, int ndim,
                           const int64_t *shape, td_error *err);

/* Queues a copy of src to a new contiguous value on dst. */
int tdd_submit_copy(tdd_session *s, uint64_t req_id, tdd_value *src, tdd_device *dst,
                    tdd_value **out, td_error *err);

/* Queues fn(arg) on dev's worker after the session's earlier work there;
 * done(arg, rc) then runs on the loop. For optimizer steps and the like. */
typedef int (*tdd_work_fn)(void *arg);
typedef void (*tdd_work_done_fn)(void *arg, int rc);
int tdd_submit_work(tdd_session *s, tdd_device *dev, tdd_work_fn fn, tdd_work_done_fn done,
                    void *arg);
/* The same on a thread of its own, on no device lane (tdd_exec_detached): for work that
 * waits on other daemons (a process group's peers), which must never hold up another
 * session's work. fn runs at once, beside the session's queued work: it waits itself for
 * what it reads. TD_ERESOURCE_EXHAUSTED when no thread could be started. */
int tdd_submit_detached(tdd_session *s, tdd_work_fn fn, tdd_work_done_fn done, void *arg);

/* How the end of a session's task is told, on the loop: rc and err its verdict
 * (err's request_id not yet set), reply the value a reply describes (NULL: Ok), kick
 * whether the session's connection may go on now (not when the task ran inline,
 * inside the request that queued it). Set once by the layer that answers requests:
 * work never names the wire. */
typedef void (*tdd_task_done_fn)(tdd_session *s, uint64_t req_id, bool want_reply, int rc,
                                 td_error *err, const tdd_value *reply, bool kick);
void tdd_exec_op_set_done(tdd_task_done_fn fn);

#endif
