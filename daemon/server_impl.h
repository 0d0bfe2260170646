/* server_impl.h -- what the transport's files (server*.c) share: the server's state, a
 * queued write, and the functions one of them calls in another. Private to them. */
#ifndef TDD_SERVER_IMPL_H
#define TDD_SERVER_IMPL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <uv.h>

#include "config.h"
#include "conn.h"
#include "log.h"
#include "tls.h"

#define RBUF_SIZE (64 * 1024)
/* What one queued write costs beyond its frame bytes: the write request (libuv's
 * uv_write_t is most of it) and the allocator's header and rounding. A client that
 * pipelines small requests and never reads is held to --max-write-queue in memory,
 * not in frame bytes (a 22-byte reply costs about 280). */
#define WRITE_COST (sizeof(write_req) + 32)
/* Messages a connection may send before Hello: Hello is small, and nothing before
 * it may make the daemon allocate up to --max-frame. */
#define PREAUTH_MAX_MSG (16u << 10)

/* A tls:// connection's ciphertext read buffer. */
#define TLS_RBUF (64u * 1024u)

typedef struct {
    union {
        uv_handle_t handle;
        uv_stream_t stream;
        uv_tcp_t tcp;
        uv_pipe_t pipe;
    } h;
    char endpoint[256];
    char unix_path[200];
    dev_t unix_dev; /* the socket this daemon created there */
    ino_t unix_ino;
    bool open; /* the handle is initialised (closed on a failed start) */
    bool tls;  /* tls://: connections speak TLS (--tls-cert, --tls-key) */
    bool bare; /* tcp:// beyond loopback: only the token guards it */
} listener;

/* The transport's state: one server per process, on the loop thread. */
struct tdd_server_state {
    uv_loop_t *loop;
    tdd_request_fn on_request; /* from main: the request table */
    listener listeners[TDD_MAX_LISTEN];
    int nlisteners;
    tdd_conn *conns;
    bool shutting_down;
    uint32_t n_handshaking; /* connections before Hello */
    uint32_t n_admitted;    /* connections past Hello: the sessions --max-sessions bounds */
    tdd_tls_ctx *tls_ctx;   /* the tls:// listeners' certificate, key and client CAs */
    /* a second after a connection closed the heap is trimmed (server_conn.c) */
    uv_timer_t trim_timer;
    bool trim_armed; /* trim_timer is open (from start to shutdown) */
};
extern struct tdd_server_state srv;

/* A debug line about c from a libuv callback (outside any request): JSON lines carry its
 * connection, and its session once Hello made one. */
#define conn_debug(c, ...)                                                                         \
    do {                                                                                           \
        tdd_log_ctx prev_;                                                                         \
        tdd_log_set_ctx(                                                                           \
            (tdd_log_ctx){(c)->s ? (c)->s->id : 0, (c)->s && (c)->hello_done ? (c)->s->id : 0},    \
            &prev_);                                                                               \
        tdd_debug(__VA_ARGS__);                                                                    \
        tdd_log_set_ctx(prev_, NULL);                                                              \
    } while (0)

typedef struct write_req {
    uv_write_t req;
    tdd_conn *c;
    size_t total;
    tdd_storage *hold;
    bool resume; /* the connection was paused for this write */
    /* TLS: the plaintext (frame rest, then payload) and how much of it is encrypted */
    struct write_req *next;
    const uint8_t *payload;
    size_t flen;
    uint64_t plen, off;
    uv_pipe_t *fdpipe;   /* a memfd sent with this frame (srv_conn_send_fd), closed when written */
    max_align_t bytes[]; /* the part of the frame not yet written */
} write_req;

/* write */
void srv_free_handle(uv_handle_t *h);
void srv_write_done(write_req *wr, int status);
void srv_conn_send(tdd_conn *c, Tensordd__V1__Response *r, const void *payload, uint64_t plen,
                   tdd_storage *hold);
void srv_conn_send_encoded(tdd_conn *c, const uint8_t *msg, size_t mlen, const void *payload,
                           uint64_t plen, tdd_storage *hold);
void srv_conn_send_fd(tdd_conn *c, const uint8_t *msg, size_t mlen, int fd);
/* fds */
int srv_take_fds(tdd_conn *c, uint64_t from, uint64_t to);
void srv_drop_fds(tdd_conn *c, int n);
int srv_check_stray_fds(tdd_conn *c, uint64_t at);
bool srv_fd_is_for(const tdd_conn *c, uint64_t at, uint64_t end);
void srv_claim_fds(tdd_conn *c, uint64_t at);
/* read */
void srv_conn_buffer(tdd_conn *c, uv_buf_t *buf);
void srv_fail_protocol(tdd_conn *c, int code, const char *what);
void srv_start_reading(tdd_conn *c);
void srv_on_read(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf);
void srv_conn_received(tdd_conn *c, const uv_buf_t *buf, size_t n);
void srv_conn_pause(tdd_conn *c);
void srv_conn_resume(tdd_conn *c);
void srv_yield_close(void);
void srv_conn_kick(tdd_conn *c);
/* arena */
void srv_arena_destroy(struct tdd_arena *a);
struct tdd_arena *srv_arena_new(void);
Tensordd__V1__Request *srv_request_unpack(tdd_conn *c, size_t len, const uint8_t *msg);
void srv_request_free(tdd_conn *c, Tensordd__V1__Request *req);
/* tls */
bool srv_shutdown_socket(tdd_conn *c);
void srv_tls_pump_out(tdd_conn *c);
void srv_tls_enqueue(tdd_conn *c, write_req *wr);
void srv_tls_on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf);
void srv_tls_pump_in(tdd_conn *c);
void srv_tls_on_read(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf);
/* conn */
void srv_conn_close(tdd_conn *c);
void srv_after_shutdown(uv_shutdown_t *req, int status);
void srv_conn_shutdown(tdd_conn *c);
bool srv_at_session_limit(void);
int srv_conn_admit(tdd_conn *c, td_error *err);
void srv_on_connection(uv_stream_t *server, int status);
/* watch */
void srv_watch_arm(tdd_conn *c);

#endif
