/* conn.h -- one client connection: framing, payload landing, writes, backpressure. */
#ifndef TDD_CONN_H
#define TDD_CONN_H

#include <stdbool.h>
#include <uv.h>

#include "frame.h"
#include "session.h"
#include "tensordd.pb-c.h"

typedef struct tdd_conn tdd_conn;
typedef void (*tdd_payload_cb)(tdd_conn *c, void *arg, int status);

struct tdd_conn {
    union {
        uv_handle_t handle;
        uv_stream_t stream;
        uv_tcp_t tcp;
        uv_pipe_t pipe;
    } h;
    tdd_session *s;
    td_frame_parser fp;
    uint8_t *rbuf;
    size_t rcap, rlen, rpos;
    /* A raw payload in flight: lands at pdst (NULL: discarded). */
    bool in_payload;
    uint8_t *pdst;
    uint64_t plen, pgot;
    tdd_payload_cb pdone;
    void *parg;
    /* A synchronising request waiting for the session's queued work. */
    Tensordd__V1__Request *blocked;
    /* Requests are unpacked into this arena (one malloc-free bump region,
     * reset per request) unless arena_req, the request living there, is
     * still in use, when a nested one is unpacked with malloc. */
    struct tdd_arena *arena;
    Tensordd__V1__Request *arena_req;
    int paused; /* > 0: no frame is processed (a download is being written) */
    bool hello_done;
    bool reading;
    bool closing;
    bool draining;     /* daemon shutting down: answer Goodbye once idle */
    uint64_t wq_bytes; /* queued replies: frame bytes plus each write's bookkeeping */
    uint64_t wq_peak;
    /* Loop times (ms) the watchdog judges by: opened (Hello timeout), the last
     * traffic either way (idle timeout), the last progress of queued writes
     * (write timeout; wq_seen is the queue's size when it was last looked at). */
    uint64_t opened_ms, active_ms, wq_moved_ms;
    size_t wq_seen;
    uv_timer_t watch;
    tdd_conn *prev, *next;
};

/* How dispatch tells the connection what to do with a request. */
enum {
    TDD_DISPATCH_DONE = 0,    /* handled; the request is freed */
    TDD_DISPATCH_BLOCK = 1,   /* retry once the session's queued work is done */
    TDD_DISPATCH_PAYLOAD = 2, /* read plen payload bytes to pdst, then call pdone */
    TDD_DISPATCH_CLOSE = 3    /* close after pending writes (protocol-level failure) */
};

int tdd_server_start(uv_loop_t *loop, const tdd_config *cfg);
/* The i-th listener's endpoint as bound (port 0 resolved), or NULL. */
const char *tdd_server_endpoint(int i);
/* Stop accepting; let connections finish; the loop ends when all are closed. */
void tdd_server_shutdown(void);
/* Hello succeeded: the connection becomes a session, counted against
 * --max-sessions, and gets the full frame limits. A negative TD_E* (err set)
 * when the daemon serves its limit of sessions. */
int tdd_conn_admit(tdd_conn *c, td_error *err);

void tdd_conn_send(tdd_conn *c, Tensordd__V1__Response *r, const void *payload, uint64_t plen,
                   tdd_storage *hold);
void tdd_conn_send_error(tdd_conn *c, uint64_t id, const td_error *err);
void tdd_conn_send_ok(tdd_conn *c, uint64_t id);
/* Pauses frame processing until tdd_conn_resume (one call each). */
void tdd_conn_pause(tdd_conn *c);
void tdd_conn_resume(tdd_conn *c);
/* The session's queued work dropped: retry a blocked request, resume reading. */
void tdd_conn_kick(tdd_conn *c);

/* dispatch.c */
int tdd_dispatch(tdd_conn *c, Tensordd__V1__Request *req, uint64_t payload_len);
/* The one place a failed request's error goes: to the client now (synchronising
 * requests, want_reply) or into the session's pending error. TDD_DISPATCH_DONE. */
int tdd_answer_error(tdd_conn *c, const Tensordd__V1__Request *req, td_error *err);
/* Reports and clears the session's first pending error; 1 if there was one. */
int tdd_report_pending(tdd_conn *c, uint64_t req_id);
/* Replies with v's TensorInfo (and a payload for downloads). */
void tdd_send_tensor(tdd_conn *c, uint64_t req_id, const tdd_value *v, const void *payload,
                     uint64_t plen, tdd_storage *hold);
void tdd_dispatch_init(void);

/* wire.c: td_error -> protobuf Error, in one place. The buffer owns every
 * sub-message the Error points to. */
typedef struct {
    Tensordd__V1__Error e;
    Tensordd__V1__DeviceMismatch dm;
    Tensordd__V1__Device d[2];
    Tensordd__V1__DTypeMismatch dtm;
    Tensordd__V1__ShapeMismatch sm;
    Tensordd__V1__UnknownHandle uh;
    Tensordd__V1__WrongHandleKind whk;
    Tensordd__V1__Poisoned po;
    Tensordd__V1__ResourceExhausted re;
    Tensordd__V1__VersionMismatch vm;
    Tensordd__V1__InvalidArgument ia;
    char msg[256], arg[32], res[32], b0[16], b1[16];
    int64_t shapes[2][TD_MAX_NDIM];
} tdd_wire_error;

Tensordd__V1__Error *tdd_wire_error_fill(tdd_wire_error *w, const td_error *err,
                                         uint64_t request_id);
void tdd_wire_device(Tensordd__V1__Device *out, char *backend_buf, size_t len, const tdd_device *d);

/* counters for Stats */
typedef struct {
    uint64_t bytes_received, bytes_sent, requests;
    uint64_t errors[TD_ERRNO_COUNT];
    uint64_t start_ms;
} tdd_counters;
extern tdd_counters tdd_stats;
/* Counts a failed request once, where it failed (errors by code, for Stats). */
void tdd_count_error(int code);

#endif
