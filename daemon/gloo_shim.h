/* gloo_shim.h -- the C face of Gloo (gloo_shim.cc, C++): a process group's rendezvous
 * and its collectives on host memory. Every call blocks (a device worker runs them, never
 * the loop) and catches what Gloo throws: the result is 0 or a TD_E* code with a message
 * in msg. Gloo's own algorithms do the work; nothing here moves a byte between ranks. */
#ifndef TDD_GLOO_SHIM_H
#define TDD_GLOO_SHIM_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tdd_gloo tdd_gloo;

typedef enum { TDD_GLOO_F32, TDD_GLOO_F64, TDD_GLOO_I32, TDD_GLOO_I64 } tdd_gloo_dtype;
typedef enum { TDD_GLOO_SUM, TDD_GLOO_MAX } tdd_gloo_op;

/* Joins rank of size through Gloo's FileStore in dir (created, and emptied of this
 * rank's keys once every rank has joined), listening for peers on address. Waits at most
 * timeout_ms, which also bounds every later collective. NULL on failure, with *code
 * (TD_ETIMEOUT when a rank did not come, else TD_EINTERNAL, TD_ERESOURCE_EXHAUSTED) and
 * msg set. */
tdd_gloo *tdd_gloo_connect(const char *address, const char *dir, int rank, int size,
                           long timeout_ms, int *code, char *msg, size_t msglen);
/* Closes g's connections on a thread of the shim's (it may take ~10 ms a peer): returns at
 * once. NULL is ignored. */
void tdd_gloo_free(tdd_gloo *g);

/* The same in two steps, without a store: the ranks' addresses travel through whoever
 * calls (tensordd's own connections). tdd_gloo_prepare makes this rank's connections to
 * each peer, listening on address, and returns their addresses in one blob (*blob, malloc'd,
 * *blob_len bytes): size entries, each a 4-byte length (host order) and the bytes; entry r
 * is the address for rank r (empty for this rank). tdd_gloo_finish connects to every peer,
 * given addrs[r], lens[r]: rank r's address for this rank (entry `rank` of rank r's blob;
 * this rank's own is not read); one that is not an address is TD_EINVALID_ARGUMENT. */
tdd_gloo *tdd_gloo_prepare(const char *address, int rank, int size, long timeout_ms, void **blob,
                           size_t *blob_len, int *code, char *msg, size_t msglen);
int tdd_gloo_finish(tdd_gloo *g, const void *const *addrs, const size_t *lens, char *msg,
                    size_t msglen);

/* In place over count elements of buf. */
int tdd_gloo_allreduce(tdd_gloo *g, void *buf, size_t count, tdd_gloo_dtype dt, tdd_gloo_op op,
                       char *msg, size_t msglen);
/* buf (nbytes) of rank root to every rank. */
int tdd_gloo_broadcast(tdd_gloo *g, void *buf, size_t nbytes, int root, char *msg, size_t msglen);
/* Every rank's in (nbytes) into out (size * nbytes), in rank order. */
int tdd_gloo_allgather(tdd_gloo *g, const void *in, void *out, size_t nbytes, char *msg,
                       size_t msglen);

#ifdef __cplusplus
}
#endif

#endif
