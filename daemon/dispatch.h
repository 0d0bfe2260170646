/* dispatch.h -- the request table: what the server hands every request to. */
#ifndef TDD_DISPATCH_H
#define TDD_DISPATCH_H

#include "conn.h"

/* Runs one request through the generic checks and its row's handler (a tdd_request_fn,
 * handed to the server by main). Returns a TDD_DISPATCH_* code. */
int tdd_dispatch(tdd_conn *c, Tensordd__V1__Request *req, uint64_t payload_len);

/* Every body case of Request has a row: 0, or -1 with each missing one logged (main
 * refuses to start: a request type the proto gained would be answered as unknown). */
int tdd_dispatch_check_table(void);

/* One request of a graph's replay (graph.c), with the session quiet: the generic checks
 * and the handler of its row; first: its first attempt (not the call again after
 * BLOCK), when the new ids it names are released if bound. A TDD_DISPATCH_* code. */
int tdd_dispatch_replayed(tdd_conn *c, Tensordd__V1__Request *req, bool first);

/* The ids req names as new handles (at most TDD_MAX_OP_OUTPUTS, into ids): their count. */
size_t tdd_dispatch_new_ids(const Tensordd__V1__Request *req, uint64_t *ids);

/* Called on the field of each handle a request reads (an Op's inputs, a Backward's loss,
 * grad_output and inputs, ...), which it may rewrite. */
typedef void (*tdd_id_fn)(uint64_t *id, void *arg);
/* Calls fn on each handle req reads, from its row of the request table: the one list a
 * replay's substitution (graph.c) and its rebinding (tdd_dispatch_replayed) both use. */
void tdd_dispatch_read_ids(Tensordd__V1__Request *req, tdd_id_fn fn, void *arg);

#endif
