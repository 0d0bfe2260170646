/* conn.h -- one client connection: framing, payload landing, writes, backpressure. */
#ifndef TDD_CONN_H
#define TDD_CONN_H

#include <stdbool.h>
#include <uv.h>

#include "frame.h"
#include "session.h"
#include "tensordd.pb-c.h"

typedef struct tdd_conn tdd_conn;

/* An fd a peer sent, with the stream bytes [from, to) it came with. */
struct tdd_conn_fd {
    int fd;
    uint64_t from, to;
};
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
    bool blocked_ran; /* (dispatch) its handler ran and waits for the work it queued */
    /* The blocked request yielded (TDD_DISPATCH_YIELD): it is called again after the
     * loop's next turn (yielded), then as soon as its session has room (wait_room:
     * fewer than --max-inflight requests queued) rather than none queued. */
    bool yielded, wait_room;
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
    /* TLS (a tls:// listener's connection; NULL on plain TCP and Unix sockets):
     * ciphertext is read into tls_rbuf; replies wait in tls_q until encrypted, with
     * tls_inflight bytes of ciphertext queued on the socket. */
    struct tdd_tls *tls;
    uint8_t *tls_rbuf;
    struct write_req *tls_q, **tls_qtail;
    size_t tls_inflight;
    bool tls_busy, tls_pumping; /* decrypting / encrypting (no reentry) */
    bool tls_failed;            /* a TLS error: no close_notify */
    bool tls_fin, tls_fin_sent; /* shutdown asked for / under way */
    bool tls_dead;              /* srv_conn_close ran */
    bool sniffed;               /* the first bytes were looked at (TLS vs plaintext) */
    uint64_t linger_ms;         /* after a TLS failure: the peer's bytes dropped until then */
    /* Same-host zero copy (a Unix-socket connection with --max-conn-fds > 0): the fds the
     * peer sent that no request took yet, oldest first, each with the stream bytes
     * [from, to) it arrived with; rx_total counts the bytes received so far and frame_at
     * is where the frame being handled began. req_fd: the fd that came with the request
     * being handled (an Upload with payload_fd; -1: none; req_nfds: how many came), which
     * its handler takes (setting it to -1) or the server closes after it. send_fd: the
     * transport's, a frame (Response msg[0..mlen), no payload) with fd attached; it takes
     * fd, closing it once sent (or not). */
    bool fd_passing;
    int nfds, req_fd, req_nfds;
    struct tdd_conn_fd *fds;
    uint64_t rx_total, frame_at;
    void (*send_fd)(tdd_conn *c, const uint8_t *msg, size_t mlen, int fd);
};

/* How dispatch tells the connection what to do with a request. */
enum {
    TDD_DISPATCH_DONE = 0,    /* handled; the request is freed */
    TDD_DISPATCH_BLOCK = 1,   /* retry once the session's queued work is done */
    TDD_DISPATCH_PAYLOAD = 2, /* read plen payload bytes to pdst, then call pdone */
    TDD_DISPATCH_CLOSE = 3,   /* close after pending writes (protocol-level failure) */
    /* handled in part (a Replay's slice): call again on a later turn of the loop, once
     * the session has fewer than --max-inflight requests queued */
    TDD_DISPATCH_YIELD = 4
};

/* What the server calls for each request it unpacked (dispatch.c's tdd_dispatch, handed
 * over by main). payload_len: the bytes that follow it. Returns a TDD_DISPATCH_* code. */
typedef int (*tdd_request_fn)(tdd_conn *c, Tensordd__V1__Request *req, uint64_t payload_len);

int tdd_server_start(uv_loop_t *loop, const tdd_config *cfg, tdd_request_fn on_request);
/* What tdd_server_start would refuse before binding (TLS files, endpoints, a listener
 * beyond loopback without TLS or a token, --unix-group), checked without binding, for
 * --check-config: 0, or -1 with why[] (start applies the same check). */
int tdd_server_check(const tdd_config *cfg, char *why, size_t wn);
/* The i-th listener's endpoint as bound (port 0 resolved), or NULL. */
const char *tdd_server_endpoint(int i);
/* Sessions past Hello; whether a new one would be served (listening, not shutting
 * down, under --max-sessions). Loop thread. */
uint32_t tdd_server_admitted(void);
bool tdd_server_accepting(void);
/* Why a Hello would be refused now ("shutting down", "at --max-sessions", ...), or NULL
 * when it would be admitted: the rule srv_conn_admit applies (tdd_server_accepting is its
 * NULL). */
const char *tdd_server_refusal(void);
/* SIGHUP: the tls:// listeners' certificate, key and client CAs read again from cfg's
 * paths (connections already open keep theirs). 0 reloaded, 1 no tls:// listener, -1
 * not (why[] says; the old ones stay). */
int tdd_server_reload_tls(const tdd_config *cfg, char *why, size_t wn);
/* A tcp:// listener beyond loopback runs without TLS: the token may not go away. */
bool tdd_server_needs_token(void);
/* Stop accepting; let connections finish; the loop ends when all are closed. */
void tdd_server_shutdown(void);

#endif
