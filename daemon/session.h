/* session.h -- a client's session: its handle table, its values (tensors as the
 * daemon tracks them), its first pending error and its memory account. */
#ifndef TDD_SESSION_H
#define TDD_SESSION_H

#include <stdbool.h>
#include <uthash.h> /* for the autodiff maps that include this header */

#include "device.h"
#include "exec.h"

struct tdd_conn;
struct tdd_node;

/* A tensor value. Shared by the handle table, queued tasks and autograd
 * nodes; refcounted on the loop thread. A value whose producing request
 * failed is poisoned: it remembers the origin request and code. */
typedef struct tdd_value {
    long refs;
    uint64_t handle; /* the client's id for it (0 if internal) */
    tdd_tensor t;    /* t.st is NULL when poisoned before any storage existed */
    tdd_device *dev;
    tdd_queue *fq; /* producer's queue and position; readers on other queues wait */
    uint64_t fseq;
    /* Poison: written by the loop at validation, or by the worker that ran
     * the producer before it completed; read by later tasks (ordered after
     * the producer) and by the loop after completion. */
    _Atomic int poison;  /* 0 or the origin's TD_E* code */
    uint64_t poison_req; /* the origin request id */
    /* autodiff (loop thread only) */
    bool requires_grad;
    struct tdd_node *grad_fn; /* the node that produced it, or NULL for leaves */
    /* (In-place updates are counted on the storage, t.st->version, shared by every view.) */
    uint64_t mark; /* loop-thread scratch: a pass's stamp, for O(1) "seen it" tests */
} tdd_value;

tdd_value *tdd_value_new(tdd_device *dev);
void tdd_value_ref(tdd_value *v);
void tdd_value_unref(tdd_value *v);
void tdd_value_poison(tdd_value *v, int code, uint64_t origin_req);
int tdd_value_poisoned(const tdd_value *v);

/* One entry of a session's handle table (id 0: an empty slot). */
typedef struct tdd_handle {
    uint64_t id;
    td_handle_kind kind;
    bool charged;  /* its bookkeeping (tdd_handle_cost) is on the session's account */
    bool poisoned; /* a failed request's placeholder: obj is a poisoned tdd_value whatever
                    * the kind (tensor handles never set it: their value carries the poison) */
    void *obj;     /* tdd_value*, or the autograd/optimizer object */
} tdd_handle;

/* The handle table: open addressing with linear probing, entries inline.
 * Handle ids are dense small integers and a pipelined client names several
 * per op, so lookups must not chase pointers (uthash's chains cost a quarter
 * of the daemon's time on small ops with 10^5 live handles). */
typedef struct {
    tdd_handle *slots;
    size_t cap; /* a power of two, or 0 */
    size_t n;
} tdd_handle_table;

/* Frees a non-tensor handle's object (set by autograd/optim at creation). */
typedef void (*tdd_obj_free_fn)(void *obj);

typedef struct tdd_session {
    uint64_t id;
    long refs;
    bool closed;
    struct tdd_conn *conn; /* NULL once the connection is gone */
    tdd_handle_table handles;
    uint64_t nhandles;
    /* --max-handles and --max-id-runs when the session opened (SIGHUP changes the
     * options for sessions opened after it) */
    uint64_t max_handles, max_id_runs;
    /* Every id the session has bound, as sorted runs [lo, hi] that neither overlap nor
     * touch: ids are never reused within a session, and a released id is told apart
     * from one never seen. A client counting ids up keeps this at one run. */
    struct tdd_id_run *id_runs;
    size_t n_id_runs, cap_id_runs;
    /* Ids of failed requests the session had no room to bind a placeholder for (its memory
     * quota was spent): a Release of one is answered Ok, as the client drops the handles
     * the failed request named. A few runs [lo, hi] in a fixed array, no allocation; past
     * TDD_DECLINED_RUNS the oldest is forgotten (its Release then says UNKNOWN_HANDLE). */
#define TDD_DECLINED_RUNS 16
    uint64_t declined[TDD_DECLINED_RUNS][2];
    size_t n_declined;
    tdd_account *acct;
    /* Ids that passed tdd_handle_check_new and are not bound yet: each holds the per-handle
     * charge (tdd_handle_cost) until tdd_handle_add takes it over or it is given back. */
    uint64_t reserved[2 * TDD_MAX_OP_OUTPUTS];
    size_t n_reserved;
    uint64_t inflight;   /* tasks queued for this session */
    bool has_err;        /* first error since the last synchronising request */
    uint64_t checks_req; /* the Sync waiting for devices' value checks (tdd_h_sync) */
    td_error err;
    bool grad_enabled;
    uint64_t rng; /* per-session random stream */
    uint64_t requests;
    char peer[64], client_name[64];
    struct tdd_session *prev, *next;
    void *autograd; /* per-session autodiff state (autograd.c) */
    /* Graphs (graph.c): the recording in progress, the replay the connection is inside
     * (blocked on queued work), and quiet: answers are not sent (a replay's requests). */
    void *capture, *replaying;
    bool quiet;
    /* Ids the request being replayed binds again (its outputs, bound by the previous run
     * of the graph): exempt from "ids are never reused" while it runs. */
    const uint64_t *rebind;
    size_t n_rebind;
    /* Resume (resume.c): the session outlives a dropped connection for a window; NULL
     * when its Hello asked for none. */
    struct tdd_resume *resume;
} tdd_session;

/* What the layers above keep per value and per session (autodiff: a value's grad_fn,
 * a session's graph state), freed through hooks they hand down (tdd_session_set_hooks):
 * value_free when a value with a grad_fn dies, session_free when a session does. */
typedef struct {
    void (*value_free)(tdd_value *v);
    void (*session_free)(tdd_session *s);
} tdd_session_hooks;
void tdd_session_set_hooks(const tdd_session_hooks *h);
/* Called by tdd_session_close, first, for every way a session ends (Goodbye, a dropped
 * connection, a resume window that ran out, shutdown): what a layer above keeps for the
 * session outside its handle table, holding a reference on it (a push whose verdict no
 * request will collect), is dropped there. At most TDD_SESSION_CLOSE_FNS; a function
 * added twice is called once. */
typedef void (*tdd_session_close_fn)(tdd_session *s);
/* Work that may write st (NULL: any storage) is about to be queued for s: the layer that
 * keeps answers by reference (resume.c) copies what it keeps of st first. Submission
 * calls tdd_session_before_write; the keeper sets the function (one). */
typedef void (*tdd_session_write_fn)(tdd_session *s, const tdd_storage *st);
void tdd_session_on_write(tdd_session_write_fn fn);
void tdd_session_before_write(tdd_session *s, const tdd_storage *st);
#define TDD_SESSION_CLOSE_FNS 4
void tdd_session_on_close(tdd_session_close_fn fn);

extern tdd_session *tdd_sessions; /* every live session */
extern uint64_t tdd_nsessions;

tdd_session *tdd_session_new(struct tdd_conn *conn);
/* The connection is gone: drop every handle; frees once no task holds it. */
void tdd_session_close(tdd_session *s);
void tdd_session_ref(tdd_session *s);
void tdd_session_unref(tdd_session *s);

/* Records err as the session's first pending error (if none yet). */
void tdd_session_fail(tdd_session *s, const td_error *err);
/* Values alive in the daemon (every session), for Stats. */
uint64_t tdd_values_alive(void);

/* The entry for id, or NULL. Valid until the table next changes. */
tdd_handle *tdd_handle_find(tdd_session *s, uint64_t id);
/* Handle lookups with typed errors (UNKNOWN_HANDLE / WRONG_HANDLE_KIND). */
int tdd_handle_get(tdd_session *s, uint64_t id, td_handle_kind kind, void **obj, td_error *err);
/* The tensor value bound to id (UNKNOWN_HANDLE / WRONG_HANDLE_KIND otherwise). */
int tdd_value_get(tdd_session *s, uint64_t id, tdd_value **v, td_error *err);
/* What one handle costs the daemon beyond its tensor's bytes: the value, the storage
 * header, the smallest allocation and the table slots. Charged to the session's account
 * (--session-memory) while the handle is bound, so many small handles hit the quota. */
uint64_t tdd_handle_cost(void);
/* Checks a fresh output id: non-zero, unused, under the handle limit, and charges its
 * bookkeeping (RESOURCE_EXHAUSTED when the session's memory cannot hold it). The charge
 * is held for id until tdd_handle_add binds it or tdd_handle_unreserve gives it back;
 * checking the same id again holds no second charge. */
int tdd_handle_check_new(tdd_session *s, uint64_t id, td_error *err);
/* Gives back the charge of an id checked but not to be bound (a failed request). */
void tdd_handle_unreserve(tdd_session *s, uint64_t id);
/* Binds id (checked) to obj; takes the caller's reference. */
void tdd_handle_add(tdd_session *s, uint64_t id, td_handle_kind kind, void *obj);
/* A request that named id as a new handle failed with err: binds id to a poisoned
 * placeholder of that kind, remembering the origin (err's request and code, or the
 * origin err names when it is POISONED itself), so that Release of id succeeds and a
 * use of it is POISONED naming the origin. Nothing is bound when id is not a valid new
 * id (in use, released before, 0) or the session cannot hold one more handle. */
void tdd_handle_bind_failed(tdd_session *s, uint64_t id, td_handle_kind kind, const td_error *err);
/* Unbinds and drops the table's reference. */
int tdd_handle_release(tdd_session *s, uint64_t id, td_error *err);
/* Undoes the binding of id by a request that is to be sent again (an Upload whose payload
 * a dropped connection cut off): unbinds it and forgets that id was ever used. */
void tdd_handle_forget(tdd_session *s, uint64_t id);
void tdd_handle_set_free_fn(td_handle_kind kind, tdd_obj_free_fn fn);

/* Error helpers filling typed details. */
int tdd_err_unknown_handle(td_error *err, uint64_t id);
int tdd_err_poisoned(td_error *err, const tdd_value *v);
int tdd_err_devices(td_error *err, int code, const tdd_device *target, const tdd_device *grad,
                    uint32_t ti, uint32_t gi, const char *fmt, ...)
    __attribute__((format(printf, 7, 8)));

#endif
