/* server.c -- libuv listeners and connections: frames in, payloads straight
 * into tensor storage, responses out, backpressure and graceful shutdown. */
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <malloc.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "log.h"
#include "reply.h"
#include "resume.h"
#include "stats.h"
#include "tls.h"
#include "wire.h"

#define RBUF_SIZE (64 * 1024)
/* Payload slices handed to read(2) at once: large enough for full-speed
 * loopback, small enough that one client cannot monopolise the loop. */
#define PAYLOAD_SLICE (8u << 20)
/* What one queued write costs beyond its frame bytes: the write request (libuv's
 * uv_write_t is most of it) and the allocator's header and rounding. A client that
 * pipelines small requests and never reads is held to --max-write-queue in memory,
 * not in frame bytes (a 22-byte reply costs about 280). */
#define WRITE_COST (sizeof(write_req) + 32)
/* Messages a connection may send before Hello: Hello is small, and nothing before
 * it may make the daemon allocate up to --max-frame. */
#define PREAUTH_MAX_MSG (16u << 10)

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

static uv_loop_t *loop;
static tdd_request_fn on_request; /* from main: the request table */
static listener listeners[TDD_MAX_LISTEN];
static int nlisteners;
static tdd_conn *conns;
static bool shutting_down;
static uint32_t n_handshaking; /* connections before Hello */
static uint32_t n_admitted;    /* connections past Hello: the sessions --max-sessions bounds */
static tdd_tls_ctx *tls_ctx;   /* the tls:// listeners' certificate, key and client CAs */

static void conn_process(tdd_conn *c);

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
static void conn_close(tdd_conn *c);
static void conn_shutdown(tdd_conn *c);
static void watch_arm(tdd_conn *c);
static void conn_resume(tdd_conn *c);
static void conn_kick(tdd_conn *c);
static void yield_turn(tdd_conn *c);
static void yield_close(void);

/* ---------------------------------------------------------------- writes */

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
    uv_pipe_t *fdpipe;   /* a memfd sent with this frame (conn_send_fd), closed when written */
    max_align_t bytes[]; /* the part of the frame not yet written */
} write_req;

static void tls_enqueue(tdd_conn *c, write_req *wr);

/* Frames up to this size are built on the stack: a small reply with nothing
 * queued ahead of it then costs no allocation at all. */
#define SMALL_FRAME 512

static void free_handle(uv_handle_t *h)
{
    free(h);
}

static void write_done(write_req *wr, int status)
{
    tdd_conn *c = wr->c;
    if (wr->fdpipe)
        uv_close((uv_handle_t *)wr->fdpipe, free_handle); /* closes the memfd */
    c->wq_bytes -= wr->total;
    c->active_ms = c->wq_moved_ms = uv_now(loop);
    tdd_storage_unref(wr->hold);
    if (status < 0 && status != UV_ECANCELED)
        conn_debug(c, "connection %llu: write failed: %s",
                   (unsigned long long)(c->s ? c->s->id : 0), uv_strerror(status));
    bool resume = wr->resume;
    free(wr);
    if (resume)
        conn_resume(c);
    else if (!c->closing)
        conn_kick(c);
}

static void after_write(uv_write_t *w, int status)
{
    write_done((write_req *)w, status);
}

static void out_of_memory(tdd_conn *c, bool resume)
{
    if (resume)
        c->paused--;
    tdd_error("out of memory writing a response; closing the connection");
    conn_close(c);
}

/* Starts a frame for a message of mlen bytes and a payload of plen: its header
 * written, the message to be put after it. The frame is small on the caller's
 * stack, else in a write request of its own (*wr). NULL when nothing is to be
 * sent: the connection is closing, or out of memory (the connection is told);
 * either way a pause taken for this reply (resume) is given back. */
static uint8_t *frame_begin(tdd_conn *c, size_t mlen, uint64_t plen, uint8_t *small, write_req **wr,
                            bool resume)
{
    *wr = NULL;
    if (c->closing) {
        if (resume)
            c->paused--;
        return NULL;
    }
    size_t flen = TD_FRAME_HEADER_SIZE + mlen;
    uint8_t *frame = small;
    if (flen > SMALL_FRAME) {
        *wr = malloc(sizeof **wr + flen);
        if (!*wr) {
            out_of_memory(c, resume);
            return NULL;
        }
        frame = (uint8_t *)(*wr)->bytes;
    }
    td_frame_encode(frame, (uint32_t)mlen, plen);
    return frame;
}

/* Sends frame[0..flen) (header and message) then payload[0..plen). frame is
 * the caller's (the stack, usually) unless wr is given, when it lies in
 * wr->bytes. */
static void send_frame(tdd_conn *c, uint8_t *frame, size_t flen, write_req *wr, const void *payload,
                       uint64_t plen, tdd_storage *hold, bool resume)
{
    size_t sent = 0;
    if (plen == 0 && c->wq_bytes == 0 && !c->tls) {
        /* A reply with nothing queued ahead of it goes out with one write(2) now:
         * through uv_write the socket would also be armed and disarmed for
         * writability, two epoll_ctl calls per small reply. */
        uv_buf_t b = uv_buf_init((char *)frame, (unsigned)flen);
        int n = uv_try_write(&c->h.stream, &b, 1);
        sent = n > 0 ? (size_t)n : 0;
        tdd_stats.bytes_sent += sent;
        if (sent == flen) {
            c->active_ms = uv_now(loop); /* as write_done does for a queued one */
            free(wr);
            return;
        }
    }
    uint8_t *rest = frame + sent;
    if (!wr) {
        wr = malloc(sizeof *wr + (flen - sent));
        if (!wr) {
            out_of_memory(c, resume);
            return;
        }
        memcpy(wr->bytes, rest, flen - sent);
        rest = (uint8_t *)wr->bytes;
    }
    wr->c = c;
    wr->total = flen - sent + plen + WRITE_COST;
    wr->hold = hold;
    wr->resume = resume;
    wr->fdpipe = NULL;
    if (hold)
        tdd_storage_ref(hold);
    uv_buf_t bufs[2] = {uv_buf_init((char *)rest, (unsigned)(flen - sent)),
                        uv_buf_init((char *)(uintptr_t)payload, (unsigned)plen)};
    /* uv_buf_t lengths are size_t on unix; one buffer per payload (large payloads are
     * written by libuv in as many write(2) calls as it takes). */
    bufs[1].len = (size_t)plen;
    if (c->wq_bytes == 0) {
        c->wq_moved_ms = uv_now(loop); /* the write timeout counts from here */
        c->wq_seen = 0;
    }
    c->wq_bytes += wr->total;
    if (c->wq_bytes > c->wq_peak)
        c->wq_peak = c->wq_bytes;
    tdd_stats.bytes_sent += flen - sent + plen;
    if (c->tls) {
        wr->next = NULL;
        wr->payload = payload;
        wr->flen = flen - sent;
        wr->plen = plen;
        wr->off = 0;
        if ((uint8_t *)wr->bytes != rest)
            memmove(wr->bytes, rest, flen - sent);
        tls_enqueue(c, wr);
    } else {
        int rc = uv_write(&wr->req, &c->h.stream, bufs, plen ? 2 : 1, after_write);
        if (rc < 0) {
            c->wq_bytes -= wr->total;
            tdd_storage_unref(hold);
            free(wr);
            if (resume)
                c->paused--;
            conn_close(c);
            return;
        }
    }
    if (tdd_cfg.write_timeout_s && !uv_is_active((uv_handle_t *)&c->watch))
        watch_arm(c);
}

static void send_packed(tdd_conn *c, Tensordd__V1__Response *r, const void *payload, uint64_t plen,
                        tdd_storage *hold, bool resume)
{
    size_t mlen = protobuf_c_message_get_packed_size(&r->base);
    uint8_t small[SMALL_FRAME];
    write_req *wr;
    uint8_t *frame = frame_begin(c, mlen, plen, small, &wr, resume);
    if (!frame)
        return;
    protobuf_c_message_pack(&r->base, frame + TD_FRAME_HEADER_SIZE);
    send_frame(c, frame, TD_FRAME_HEADER_SIZE + mlen, wr, payload, plen, hold, resume);
}

/* A payload pointing into tensor memory must not change while it is written:
 * frame processing pauses until the write completes. */
static void conn_send(tdd_conn *c, Tensordd__V1__Response *r, const void *payload, uint64_t plen,
                      tdd_storage *hold)
{
    bool pause = plen > 0;
    if (pause)
        c->paused++;
    send_packed(c, r, payload, plen, hold, pause);
}

static void conn_send_encoded(tdd_conn *c, const uint8_t *msg, size_t mlen, const void *payload,
                              uint64_t plen, tdd_storage *hold)
{
    bool pause = plen > 0;
    if (pause)
        c->paused++;
    uint8_t small[SMALL_FRAME];
    write_req *wr;
    uint8_t *frame = frame_begin(c, mlen, plen, small, &wr, pause);
    if (!frame)
        return;
    memcpy(frame + TD_FRAME_HEADER_SIZE, msg, mlen);
    send_frame(c, frame, TD_FRAME_HEADER_SIZE + mlen, wr, payload, plen, hold, pause);
}

/* A frame with a memfd attached (SCM_RIGHTS on its first byte: libuv's uv_write2 sends
 * a handle's fd, so the memfd is wrapped in a pipe handle for the write). Takes fd. */
static void conn_send_fd(tdd_conn *c, const uint8_t *msg, size_t mlen, int fd)
{
    size_t flen = TD_FRAME_HEADER_SIZE + mlen;
    write_req *wr = c->closing || !c->fd_passing ? NULL : calloc(1, sizeof *wr + flen);
    uv_pipe_t *p = wr ? malloc(sizeof *p) : NULL;
    if (!p || uv_pipe_init(loop, p, 0) != 0) {
        free(p);
        free(wr);
        close(fd);
        if (!c->closing)
            out_of_memory(c, false);
        return;
    }
    if (uv_pipe_open(p, fd) != 0) {
        close(fd);
        uv_close((uv_handle_t *)p, free_handle);
        free(wr);
        out_of_memory(c, false);
        return;
    }
    uint8_t *frame = (uint8_t *)wr->bytes;
    td_frame_encode(frame, (uint32_t)mlen, 0);
    memcpy(frame + TD_FRAME_HEADER_SIZE, msg, mlen);
    wr->c = c;
    wr->total = flen + WRITE_COST;
    wr->fdpipe = p;
    if (c->wq_bytes == 0) {
        c->wq_moved_ms = uv_now(loop);
        c->wq_seen = 0;
    }
    c->wq_bytes += wr->total;
    if (c->wq_bytes > c->wq_peak)
        c->wq_peak = c->wq_bytes;
    tdd_stats.bytes_sent += flen;
    uv_buf_t b = uv_buf_init((char *)frame, (unsigned)flen);
    if (uv_write2(&wr->req, &c->h.stream, &b, 1, (uv_stream_t *)p, after_write) < 0) {
        c->wq_bytes -= wr->total;
        uv_close((uv_handle_t *)p, free_handle);
        free(wr);
        conn_close(c);
        return;
    }
    if (tdd_cfg.write_timeout_s && !uv_is_active((uv_handle_t *)&c->watch))
        watch_arm(c);
}

/* ---------------------------------------------------------------- passed fds */

static void fail_protocol(tdd_conn *c, int code, const char *what);

/* Takes the fds libuv received with the bytes [from, to) of the stream into c->fds.
 * libuv hands a received fd out only into a handle (uv_accept): a pipe handle takes it,
 * the daemon keeps a duplicate, and closing the handle closes the original. More than
 * --max-conn-fds waiting is a protocol error. Returns 0, or -1 when c was failed. */
static int take_fds(tdd_conn *c, uint64_t from, uint64_t to)
{
    bool over = false;
    while (uv_pipe_pending_count(&c->h.pipe) > 0) {
        uv_pipe_t *p = malloc(sizeof *p);
        if (!p || uv_pipe_init(loop, p, 0) != 0) {
            free(p);
            fail_protocol(c, TD_ERESOURCE_EXHAUSTED, "out of memory taking a file descriptor");
            return -1;
        }
        int fd = -1;
        uv_os_fd_t ofd = -1;
        if (uv_accept(&c->h.stream, (uv_stream_t *)p) == 0 &&
            uv_fileno((uv_handle_t *)p, &ofd) == 0)
            fd = fcntl(ofd, F_DUPFD_CLOEXEC, 3);
        uv_close((uv_handle_t *)p, free_handle);
        if (ofd >= 0 && ofd <= STDERR_FILENO) /* (libuv leaves fds 0..2 open on close) */
            close(ofd);
        if (fd < 0)
            continue;
        if (c->nfds >= (int)tdd_cfg.max_conn_fds) {
            close(fd);
            over = true;
            continue;
        }
        c->fds[c->nfds++] = (struct tdd_conn_fd){fd, from, to};
    }
    if (over) {
        char why[160];
        snprintf(why, sizeof why,
                 "more than %u file descriptors sent and not yet taken by a request "
                 "(--max-conn-fds)",
                 tdd_cfg.max_conn_fds);
        fail_protocol(c, TD_EPROTOCOL_ERROR, why);
        return -1;
    }
    return 0;
}

static void drop_fds(tdd_conn *c, int n)
{
    if (n <= 0)
        return;
    for (int i = 0; i < n; i++)
        close(c->fds[i].fd);
    memmove(c->fds, c->fds + n, (size_t)(c->nfds - n) * sizeof c->fds[0]);
    c->nfds -= n;
}

/* At a frame boundary at stream byte at: an fd that arrived with bytes before it was
 * taken by no request of its own read (a request that takes none, or an extra one).
 * Returns -1 when the connection was failed for it. */
static int check_stray_fds(tdd_conn *c, uint64_t at)
{
    if (!c->nfds || c->fds[0].to > at)
        return 0;
    int n = 0;
    while (n < c->nfds && c->fds[n].to <= at)
        n++;
    drop_fds(c, n);
    fail_protocol(c, TD_EPROTOCOL_ERROR,
                  "a file descriptor came with a request that takes none (only an Upload "
                  "with payload_fd does, one each); it was closed");
    return -1;
}

/* Whether an fd came with the read holding the first byte of the frame at [at, end)
 * and with no later frame's: that read ended within the frame (the kernel ends a read
 * with the data an fd came with), so this frame is the one it was sent with. */
static bool fd_is_for(const tdd_conn *c, uint64_t at, uint64_t end)
{
    for (int i = 0; i < c->nfds; i++)
        if (c->fds[i].from <= at && at < c->fds[i].to && c->fds[i].to <= end)
            return true;
    return false;
}

/* An Upload with payload_fd starting at stream byte at takes the fds that arrived with
 * the read holding its first byte: c->req_fd, the others closed (the handler refuses
 * the Upload when req_nfds is not 1). */
static void claim_fds(tdd_conn *c, uint64_t at)
{
    int i = 0;
    while (i < c->nfds && !(c->fds[i].from <= at && at < c->fds[i].to))
        i++;
    int n = 0;
    while (i + n < c->nfds && c->fds[i + n].from <= at && at < c->fds[i + n].to)
        n++;
    if (!n)
        return;
    c->req_fd = c->fds[i].fd;
    c->req_nfds = n;
    for (int k = 1; k < n; k++)
        close(c->fds[i + k].fd);
    memmove(c->fds + i, c->fds + i + n, (size_t)(c->nfds - i - n) * sizeof c->fds[0]);
    c->nfds -= n;
}

/* ---------------------------------------------------------------- reads */

static bool over_high_water(const tdd_conn *c)
{
    return (c->s && c->s->inflight >= tdd_cfg.max_inflight) ||
           c->wq_bytes >= tdd_cfg.max_write_queue;
}

static bool can_process(const tdd_conn *c)
{
    return !c->closing && !c->draining && !c->blocked && c->paused == 0 && !over_high_water(c);
}

/* Where the next bytes from the peer go (plaintext, after TLS). */
static void conn_buffer(tdd_conn *c, uv_buf_t *buf)
{
    if (c->closing) {
        /* Nothing is read into a closing connection: its payload's destination may be
         * freed already (uv_read_stop was called; this is belt and braces). */
        *buf = uv_buf_init(NULL, 0);
        return;
    }
    /* The rest of a payload goes straight to its destination. */
    if (c->in_payload && c->pdst && c->rpos == c->rlen) {
        uint64_t left = c->plen - c->pgot;
        buf->base = (char *)c->pdst + c->pgot;
        buf->len = (size_t)(left < PAYLOAD_SLICE ? left : PAYLOAD_SLICE);
        return;
    }
    if (c->rpos == c->rlen) {
        c->rpos = c->rlen = 0;
    } else if (c->rpos > 0 && c->rcap - c->rlen < 4096) {
        memmove(c->rbuf, c->rbuf + c->rpos, c->rlen - c->rpos);
        c->rlen -= c->rpos;
        c->rpos = 0;
    }
    if (c->in_payload && !c->pdst && c->rpos == c->rlen) {
        /* Discarding: read no further than the payload's end. */
        uint64_t left = c->plen - c->pgot;
        buf->base = (char *)c->rbuf;
        buf->len = (size_t)(left < c->rcap ? left : c->rcap);
        return;
    }
    buf->base = (char *)c->rbuf + c->rlen;
    buf->len = c->rcap - c->rlen;
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    (void)suggested;
    conn_buffer(h->data, buf);
}

static void fail_protocol(tdd_conn *c, int code, const char *what)
{
    td_error err;
    tdd_err_set(&err, code, "%s", what);
    tdd_count_error(code);
    tdd_info("session %llu (%s): %s; closing the connection",
             (unsigned long long)(c->s ? c->s->id : 0), c->s ? c->s->peer : "?", what);
    tdd_conn_send_error(c, 0, &err);
    conn_shutdown(c);
}

static void payload_complete(tdd_conn *c)
{
    c->in_payload = false;
    tdd_resume_payload_done(c->s); /* an Upload is applied once its payload landed */
    tdd_payload_cb cb = c->pdone;
    void *arg = c->parg;
    c->pdone = NULL;
    c->pdst = NULL;
    if (cb)
        cb(c, arg, 0);
}

static void on_read(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf);
static void tls_on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf);
static void tls_on_read(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf);
static void tls_pump_in(tdd_conn *c);

static void start_reading(tdd_conn *c)
{
    if (!c->reading && !c->closing)
        c->reading = uv_read_start(&c->h.stream, c->tls ? tls_on_alloc : on_alloc,
                                   c->tls ? tls_on_read : on_read) == 0;
    /* TLS: what was received while reading was off waits in the TLS session */
    if (c->reading && c->tls && !c->tls_busy && tdd_tls_has_input(c->tls))
        tls_pump_in(c);
}

static void reading_policy(tdd_conn *c)
{
    if (c->closing)
        return;
    bool want = c->in_payload || can_process(c);
    if (want)
        start_reading(c);
    else if (c->reading) {
        uv_read_stop(&c->h.stream);
        c->reading = false;
    }
}

static void consume_payload_bytes(tdd_conn *c)
{
    uint64_t left = c->plen - c->pgot;
    size_t avail = c->rlen - c->rpos;
    size_t take = (size_t)(left < avail ? left : avail);
    if (c->pdst)
        memcpy(c->pdst + c->pgot, c->rbuf + c->rpos, take);
    c->pgot += take;
    c->rpos += take;
    if (c->pgot == c->plen)
        payload_complete(c);
}

/* ---------------------------------------------------------------- request arena */

/* protobuf-c allocates every submessage, string and repeated field of a
 * request separately and frees them one by one: on pipelined small ops that
 * was a sixth of the daemon's time (malloc, free, free_unpacked), and it
 * interleaved short-lived blocks with long-lived values, fragmenting the
 * heap. A request's pieces are instead carved from one per-connection
 * region; what does not fit is malloc'ed and chained, and the region grows
 * to hold it next time (up to ARENA_MAX). */
#define ARENA_MIN 4096
#define ARENA_MAX (64 * 1024)

typedef struct arena_blk {
    struct arena_blk *next;
    max_align_t data[];
} arena_blk;

struct tdd_arena {
    unsigned char *base;
    size_t cap, used;
    size_t spilled; /* bytes that did not fit since the last reset */
    arena_blk *big;
};

static void *arena_alloc(void *ctx, size_t size)
{
    struct tdd_arena *a = ctx;
    size_t al = _Alignof(max_align_t);
    size = (size + al - 1) & ~(al - 1);
    if (size <= a->cap - a->used) {
        void *p = a->base + a->used;
        a->used += size;
        return p;
    }
    arena_blk *b = malloc(sizeof *b + size);
    if (!b)
        return NULL;
    b->next = a->big;
    a->big = b;
    a->spilled += size;
    return b->data;
}

static void arena_free(void *ctx, void *p)
{
    (void)ctx; /* everything goes at the next reset */
    (void)p;
}

static void arena_reset(struct tdd_arena *a)
{
    while (a->big) {
        arena_blk *b = a->big;
        a->big = b->next;
        free(b);
    }
    size_t want = a->used + a->spilled;
    if (a->spilled && want <= ARENA_MAX) {
        unsigned char *nb = malloc(want);
        if (nb) {
            free(a->base);
            a->base = nb;
            a->cap = want;
        }
    }
    a->used = a->spilled = 0;
}

static void arena_destroy(struct tdd_arena *a)
{
    if (!a)
        return;
    arena_reset(a);
    free(a->base);
    free(a);
}

static struct tdd_arena *arena_new(void)
{
    struct tdd_arena *a = calloc(1, sizeof *a);
    if (a && !(a->base = malloc(ARENA_MIN))) {
        free(a);
        return NULL;
    }
    if (a)
        a->cap = ARENA_MIN;
    return a;
}

static Tensordd__V1__Request *request_unpack(tdd_conn *c, size_t len, const uint8_t *msg)
{
    if (c->arena_req || !c->arena)
        return tensordd__v1__request__unpack(NULL, len, msg);
    arena_reset(c->arena);
    ProtobufCAllocator al = {.alloc = arena_alloc, .free = arena_free, .allocator_data = c->arena};
    /* Small ops' requests first by hand (protobuf-c's generic walk was a third of
     * the daemon's instructions per small op); anything else as before. */
    c->arena_req = tdd_wire_request_fast(msg, len, &al);
    if (!c->arena_req) {
        arena_reset(c->arena);
        c->arena_req = tensordd__v1__request__unpack(&al, len, msg);
    }
    return c->arena_req;
}

static void request_free(tdd_conn *c, Tensordd__V1__Request *req)
{
    if (req && req == c->arena_req)
        c->arena_req = NULL;
    else
        tensordd__v1__request__free_unpacked(req, NULL);
}

static void handle_frame(tdd_conn *c)
{
    td_frame_header hdr = c->fp.hdr;
    Tensordd__V1__Request *req = request_unpack(c, hdr.msg_len, c->fp.msg);
    if (!req) {
        fail_protocol(c, TD_EPROTOCOL_ERROR, "request is not a valid protobuf Request");
        return;
    }
    tdd_stats.requests++;
    tdd_count_request((int)req->body_case);
    if (c->s)
        c->s->requests++;
    /* log lines written while dispatching carry the connection and session */
    uint64_t sid = c->s ? c->s->id : 0;
    tdd_log_ctx prev;
    tdd_log_set_ctx((tdd_log_ctx){sid, c->hello_done ? sid : 0}, &prev);
    bool takes_fd = req->body_case == TENSORDD__V1__REQUEST__BODY_UPLOAD && req->upload &&
                    req->upload->payload_fd;
    uint64_t frame_end = c->rx_total - (c->rlen - c->rpos);
    if (c->nfds && takes_fd)
        claim_fds(c, c->frame_at);
    else if (c->nfds && fd_is_for(c, c->frame_at, frame_end)) {
        /* refused before it runs: neither answered Ok nor applied, then the close */
        request_free(c, req);
        tdd_log_set_ctx(prev, NULL);
        check_stray_fds(c, frame_end);
        return;
    }
    int rc = on_request(c, req, hdr.payload_len);
    if (c->req_nfds) { /* the handler did not take it */
        close(c->req_fd);
        c->req_nfds = 0;
    }
    tdd_log_set_ctx(prev, NULL);
    /* resume: the requests this session has applied (a resumed Hello's is not its own) */
    if (req->body_case != TENSORDD__V1__REQUEST__BODY_HELLO && rc != TDD_DISPATCH_PAYLOAD)
        tdd_resume_applied(c->s, req->id);
    switch (rc) {
    case TDD_DISPATCH_DONE:
        request_free(c, req);
        if (c->blocked) /* a resume handed over the request the old connection waited on */
            conn_kick(c);
        break;
    case TDD_DISPATCH_BLOCK:
        c->blocked = req;
        watch_arm(c); /* the client's end is looked for while it waits */
        break;
    case TDD_DISPATCH_YIELD:
        c->blocked = req;
        yield_turn(c);
        break;
    case TDD_DISPATCH_PAYLOAD:
        tdd_resume_payload_begin(c->s, req->id);
        request_free(c, req);
        c->in_payload = true;
        c->pgot = 0;
        c->plen = hdr.payload_len;
        if (c->plen == 0)
            payload_complete(c);
        break;
    case TDD_DISPATCH_CLOSE:
    default:
        request_free(c, req);
        conn_shutdown(c);
        break;
    }
}

static void conn_process(tdd_conn *c)
{
    /* At most one read buffer (RBUF_SIZE) of frames is handled per wake-up, which
     * keeps one busy client from starving the others. */
    while (c->rpos < c->rlen && !c->closing) {
        if (c->in_payload) {
            consume_payload_bytes(c);
            continue;
        }
        if (!can_process(c))
            break;
        if (c->fp.hgot == 0 && !c->fp.in_msg) { /* a frame begins here */
            c->frame_at = c->rx_total - (c->rlen - c->rpos);
            if (check_stray_fds(c, c->frame_at))
                return;
        }
        size_t used;
        int rc = td_frame_feed(&c->fp, c->rbuf + c->rpos, c->rlen - c->rpos, &used);
        c->rpos += used;
        if (rc < 0) {
            fail_protocol(c, rc,
                          rc != TD_EFRAME_TOO_LARGE ? "bad frame header (magic/version)"
                          : c->hello_done           ? "frame exceeds the configured limits"
                                                    : "frame exceeds what is accepted before Hello "
                                                      "(16 KiB, no payload)");
            return;
        }
        if (rc == TD_FRAME_READY)
            handle_frame(c);
    }
    /* Every byte taken and no frame begun: an fd that came with them is a stray. */
    if (c->nfds && !c->closing && c->rpos == c->rlen && !c->in_payload && c->fp.hgot == 0 &&
        !c->fp.in_msg && check_stray_fds(c, c->rx_total))
        return;
    reading_policy(c);
}

static void conn_received(tdd_conn *c, const uv_buf_t *buf, size_t n);

static void on_read(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf)
{
    tdd_conn *c = st->data;
    if (c->closing)
        return;
    if (nread < 0) {
        if (nread != UV_EOF)
            conn_debug(c, "connection %llu: read: %s", (unsigned long long)(c->s ? c->s->id : 0),
                       uv_strerror((int)nread));
        conn_close(c);
        return;
    }
    if (nread == 0)
        return;
    if (c->fd_passing && take_fds(c, c->rx_total, c->rx_total + (uint64_t)nread))
        return;
    conn_received(c, buf, (size_t)nread);
}

/* A byte stream that is not ours, at its first bytes: a TLS ClientHello on a plaintext
 * listener. Nothing is answered (the client expects TLS); the log says what happened. */
static bool sniff_tls(tdd_conn *c, const uv_buf_t *buf, size_t n)
{
    c->sniffed = true;
    if (n == 0 || (uint8_t)buf->base[0] != 0x16)
        return false;
    tdd_info("connection from %s sent a TLS ClientHello to a plaintext listener; closing it "
             "(connect with tcp:// here, or start a tls:// listener)",
             c->s ? c->s->peer : "?");
    conn_close(c);
    return true;
}

static void conn_received(tdd_conn *c, const uv_buf_t *buf, size_t n)
{
    ssize_t nread = (ssize_t)n;
    if (!c->sniffed && !c->tls && sniff_tls(c, buf, n))
        return;
    tdd_stats.bytes_received += (uint64_t)nread;
    c->rx_total += (uint64_t)nread;
    c->active_ms = uv_now(loop);
    if (c->in_payload && c->pdst && buf->base == (char *)c->pdst + c->pgot) {
        c->pgot += (uint64_t)nread;
        if (c->pgot == c->plen)
            payload_complete(c);
        conn_process(c);
        return;
    }
    c->rlen += (size_t)nread;
    conn_process(c);
}

static void conn_pause(tdd_conn *c)
{
    c->paused++;
}

static void conn_resume(tdd_conn *c)
{
    if (c->paused > 0)
        c->paused--;
    conn_kick(c);
}

/* ---------------------------------------------------------------- yields */

/* Connections whose blocked request yielded (a Replay's slice ran) are called again from
 * an idle handle, once per turn of the loop: the poll between two turns serves every
 * other connection, and a replay's requests are bounded per turn as a connection's
 * reads are (conn_process). */
static uv_idle_t yield_idle;
static bool yield_idle_init;

static void on_yield_turn(uv_idle_t *h)
{
    bool any = false;
    for (tdd_conn *c = conns, *next; c; c = next) {
        next = c->next;
        if (!c->yielded || c->closing)
            continue;
        c->yielded = false;
        c->wait_room = true; /* now as soon as the session has room */
        any = true;
        conn_kick(c);
    }
    if (!any)
        uv_idle_stop(h);
}

/* The last connection is gone at shutdown: nothing yields any more. */
static void yield_close(void)
{
    if (yield_idle_init && !uv_is_closing((uv_handle_t *)&yield_idle))
        uv_close((uv_handle_t *)&yield_idle, NULL);
}

static void yield_turn(tdd_conn *c)
{
    c->yielded = true;
    c->wait_room = false;
    if (!yield_idle_init) {
        uv_idle_init(loop, &yield_idle);
        uv_unref((uv_handle_t *)&yield_idle); /* it keeps no loop alive by itself */
        yield_idle_init = true;
    }
    if (!uv_is_active((uv_handle_t *)&yield_idle))
        uv_idle_start(&yield_idle, on_yield_turn);
}

/* Whether c's blocked request is to be called again now. */
static bool blocked_ready(const tdd_conn *c)
{
    if (!c->blocked || c->paused || !c->s || c->yielded)
        return false;
    if (c->wait_room)
        return c->s->inflight < tdd_cfg.max_inflight;
    return c->s->inflight == 0;
}

static void conn_kick(tdd_conn *c)
{
    if (!c || c->closing)
        return;
    if (blocked_ready(c)) {
        Tensordd__V1__Request *req = c->blocked;
        c->blocked = NULL;
        c->wait_room = false;
        int rc = on_request(c, req, 0);
        if (rc == TDD_DISPATCH_BLOCK) {
            c->blocked = req;
            return;
        }
        if (rc == TDD_DISPATCH_YIELD) {
            c->blocked = req;
            yield_turn(c);
            return;
        }
        request_free(c, req);
        if (rc == TDD_DISPATCH_CLOSE) {
            conn_shutdown(c);
            return;
        }
    }
    if (c->draining && !c->blocked && c->paused == 0 && !c->in_payload && c->s &&
        c->s->inflight == 0) {
        /* Shutdown: the session's work is done; say Goodbye and close. */
        tdd_conn_send_ok(c, 0);
        conn_shutdown(c);
        return;
    }
    if (can_process(c) && c->rpos < c->rlen)
        conn_process(c);
    else
        reading_policy(c);
}

/* ---------------------------------------------------------------- TLS */

/* On a tls:// listener the socket carries ciphertext: reads are fed to the TLS session
 * (tls.c) and decrypted straight into where conn_buffer says plaintext goes (a payload
 * lands in tensor memory as on plain TCP); replies are encrypted TLS_CHUNK at a time
 * as earlier ciphertext drains, so a download streams without a copy of the tensor.
 * Plain TCP and Unix sockets never come here. */
#define TLS_RBUF (64u * 1024u)
#define TLS_CHUNK (256u * 1024u)     /* plaintext encrypted per write */
#define TLS_INFLIGHT (1024u * 1024u) /* ciphertext queued on the socket before waiting */

typedef struct tls_chunk {
    uv_write_t req;
    tdd_conn *c;
    write_req *done; /* plaintext writes whose last byte is in this chunk */
    size_t len;
    max_align_t bytes[];
} tls_chunk;

static void tls_pump_out(tdd_conn *c);
static void after_shutdown(uv_shutdown_t *req, int status);

/* The socket's shutdown, once the queued writes are out; where it cannot be started the
 * connection is closed. Returns whether it was started. */
static bool shutdown_socket(tdd_conn *c)
{
    uv_shutdown_t *req = malloc(sizeof *req);
    if (!req || uv_shutdown(req, &c->h.stream, after_shutdown) < 0) {
        free(req);
        conn_close(c);
        return false;
    }
    req->data = c;
    return true;
}

static void tls_fail(tdd_conn *c, const char *what)
{
    tdd_info("connection from %s: TLS %s: %s; closing", c->s ? c->s->peer : "?", what,
             tdd_tls_why(c->tls));
    c->tls_failed = true;
    tls_pump_out(c); /* the alert, if OpenSSL wrote one */
    conn_shutdown(c);
}

static void finish_writes(write_req *done, int status)
{
    while (done) {
        write_req *next = done->next;
        write_done(done, status);
        done = next;
    }
}

static void tls_after_write(uv_write_t *w, int status)
{
    tls_chunk *ch = (tls_chunk *)w;
    tdd_conn *c = ch->c;
    c->tls_inflight -= ch->len;
    write_req *done = ch->done;
    free(ch);
    if (status < 0 && status != UV_ECANCELED)
        conn_debug(c, "connection %llu from %s: write failed: %s",
                   (unsigned long long)(c->s ? c->s->id : 0), c->s ? c->s->peer : "?",
                   uv_strerror(status));
    finish_writes(done, status);
    if (!c->tls_dead)
        tls_pump_out(c);
}

/* Sends the ciphertext the TLS session holds, with the plaintext writes it completes.
 * 0, or -1 when the connection had to be closed. */
static int tls_send_out(tdd_conn *c, write_req *done)
{
    size_t n = tdd_tls_out_pending(c->tls);
    if (n == 0) {
        finish_writes(done, 0); /* (a zero-length write: nothing to wait for) */
        return 0;
    }
    tls_chunk *ch = malloc(sizeof *ch + n);
    if (!ch) {
        finish_writes(done, UV_ENOMEM);
        tdd_error("out of memory writing a response; closing the connection");
        conn_close(c);
        return -1;
    }
    ch->c = c;
    ch->done = done;
    ch->len = tdd_tls_out_take(c->tls, ch->bytes, n);
    uv_buf_t b = uv_buf_init((char *)ch->bytes, (unsigned)ch->len);
    c->tls_inflight += ch->len;
    int rc = uv_write(&ch->req, &c->h.stream, &b, 1, tls_after_write);
    if (rc < 0) {
        c->tls_inflight -= ch->len;
        free(ch);
        finish_writes(done, rc);
        conn_close(c);
        return -1;
    }
    return 0;
}

/* Encrypts queued replies while little ciphertext waits on the socket; once the queue
 * is empty, a pending shutdown says close_notify and shuts the socket down. */
static void tls_pump_out(tdd_conn *c)
{
    if (c->tls_dead || c->tls_pumping)
        return;
    c->tls_pumping = true;
    while (c->tls_q && !c->tls_failed && !c->tls_dead && c->tls_inflight < TLS_INFLIGHT) {
        write_req *done = NULL, **dtail = &done;
        size_t in = 0;
        while (c->tls_q && in < TLS_CHUNK) {
            write_req *wr = c->tls_q;
            const uint8_t *p;
            uint64_t left;
            if (wr->off < wr->flen) {
                p = (const uint8_t *)wr->bytes + wr->off;
                left = wr->flen - wr->off;
            } else {
                p = wr->payload + (wr->off - wr->flen);
                left = wr->flen + wr->plen - wr->off;
            }
            size_t k = left < TLS_CHUNK - in ? (size_t)left : TLS_CHUNK - in;
            if (k && tdd_tls_write(c->tls, p, k)) {
                finish_writes(done, UV_EIO);
                c->tls_pumping = false;
                tls_fail(c, "write");
                return;
            }
            wr->off += k;
            in += k;
            if (wr->off == wr->flen + wr->plen) {
                c->tls_q = wr->next;
                if (!c->tls_q)
                    c->tls_qtail = &c->tls_q;
                wr->next = NULL;
                *dtail = wr;
                dtail = &wr->next;
            }
        }
        if (tls_send_out(c, done)) {
            c->tls_pumping = false;
            return;
        }
    }
    if (!c->tls_dead && tdd_tls_out_pending(c->tls) && tls_send_out(c, NULL)) {
        c->tls_pumping = false;
        return;
    }
    c->tls_pumping = false;
    if (c->tls_fin && !c->tls_fin_sent && !c->tls_dead && (!c->tls_q || c->tls_failed)) {
        c->tls_fin_sent = true;
        if (!c->tls_failed) {
            tdd_tls_close_notify(c->tls);
            if (tls_send_out(c, NULL))
                return;
        }
        shutdown_socket(c);
    }
}

static void tls_enqueue(tdd_conn *c, write_req *wr)
{
    *c->tls_qtail = wr;
    c->tls_qtail = &wr->next;
    tls_pump_out(c);
}

static void tls_on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    (void)suggested;
    tdd_conn *c = h->data;
    *buf = uv_buf_init(c->closing ? NULL : (char *)c->tls_rbuf, c->closing ? 0 : TLS_RBUF);
}

/* Decrypts what the TLS session holds while the connection wants to read. */
static void tls_pump_in(tdd_conn *c)
{
    if (c->tls_busy)
        return;
    c->tls_busy = true;
    while (!c->closing && c->reading) {
        uv_buf_t b;
        conn_buffer(c, &b);
        if (!b.len)
            break;
        bool was_done = tdd_tls_handshake_done(c->tls);
        ssize_t n = tdd_tls_read(c->tls, b.base, b.len);
        if (!was_done && tdd_tls_handshake_done(c->tls)) {
            const char *who = tdd_tls_peer(c->tls);
            conn_debug(c, "connection %llu from %s: %s%s%s",
                       (unsigned long long)(c->s ? c->s->id : 0), c->s ? c->s->peer : "?",
                       tdd_tls_version(c->tls), who[0] ? ", client " : "", who);
        }
        if (n > 0) {
            conn_received(c, &b, (size_t)n);
            continue;
        }
        if (n == TDD_TLS_WANT)
            break;
        c->tls_busy = false;
        if (n == TDD_TLS_EOF)
            conn_shutdown(c); /* answered with our own close_notify */
        else
            tls_fail(c, tdd_tls_handshake_done(c->tls) ? "read" : "handshake");
        return;
    }
    c->tls_busy = false;
    tls_pump_out(c); /* the handshake's answers */
}

static void tls_on_read(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf)
{
    tdd_conn *c = st->data;
    if (c->closing)
        return;
    if (nread <= 0) {
        on_read(st, nread, buf);
        return;
    }
    if (!c->sniffed) {
        c->sniffed = true;
        if ((uint8_t)buf->base[0] != 0x16) {
            /* Not a ClientHello: a plaintext client (or anything else). A plaintext
             * tensordd client is answered in plaintext, so it can say why. */
            tdd_tls_free(c->tls);
            c->tls = NULL;
            fail_protocol(c, TD_EPROTOCOL_ERROR,
                          "this listener speaks TLS: connect with tls://HOST:PORT");
            return;
        }
    }
    if (tdd_tls_feed(c->tls, buf->base, (size_t)nread)) {
        tls_fail(c, "read");
        return;
    }
    tls_pump_in(c);
}

/* ---------------------------------------------------------------- lifecycle */

/* A churn of short connections (5,000 junk TLS handshakes) grew the heap from 18 to
 * about 90 MB that glibc kept, free, in the middle of the heap (0.7 MB of it in use;
 * no leak: valgrind finds none, and malloc_trim gives it all back). A second after a
 * connection closed, the heap is trimmed: once per second of churn at most, and never
 * while nothing closes. */
#define TRIM_DELAY_MS 1000
static uv_timer_t trim_timer;
static bool trim_armed; /* trim_timer is open (from start to shutdown) */

static void on_trim(uv_timer_t *t)
{
    (void)t;
    malloc_trim(0);
}

static void after_close(uv_handle_t *h)
{
    tdd_conn *c = h->data;
    if (c->blocked)
        request_free(c, c->blocked);
    arena_destroy(c->arena);
    td_frame_parser_free(&c->fp);
    free(c->rbuf);
    drop_fds(c, c->nfds);
    free(c->fds);
    /* TLS: replies never encrypted (their ciphertext chunks were cancelled already) */
    while (c->tls_q) {
        write_req *wr = c->tls_q;
        c->tls_q = wr->next;
        tdd_storage_unref(wr->hold);
        free(wr);
    }
    tdd_tls_free(c->tls);
    free(c->tls_rbuf);
    /* A client that queued many replies and left: give the heap's free pages back
     * (they are small blocks, which the allocator keeps otherwise). */
    bool trim = c->wq_peak > (1u << 20);
    free(c);
    if (trim)
        malloc_trim(0);
    else if (trim_armed && !uv_is_active((uv_handle_t *)&trim_timer))
        uv_timer_start(&trim_timer, on_trim, TRIM_DELAY_MS, 0);
    if (shutting_down && !conns) {
        for (int i = 0; i < nlisteners; i++)
            if (!uv_is_closing(&listeners[i].h.handle))
                uv_close(&listeners[i].h.handle, NULL);
        yield_close();
    }
}

static void watch_closed(uv_handle_t *h)
{
    tdd_conn *c = h->data;
    uv_close(&c->h.handle, after_close);
}

static void conn_close(tdd_conn *c)
{
    if (uv_is_closing(&c->h.handle) || uv_is_closing((uv_handle_t *)&c->watch))
        return;
    /* A connection lost (not one the daemon or a Goodbye is ending) may leave its session
     * held for resume. */
    bool lost = !c->closing && !c->draining && !shutting_down;
    c->closing = true;
    c->tls_dead = true;
    /* Stop reading now: the stream is closed only after the timer below, a loop
     * iteration later, and a read in between must not land in a payload
     * destination the session's close is about to free. */
    if (c->reading)
        uv_read_stop(&c->h.stream);
    c->reading = false;
    if (c->in_payload && c->pdone) {
        tdd_payload_cb cb = c->pdone;
        c->pdone = NULL;
        cb(c, c->parg, TD_ECLOSED);
    }
    c->in_payload = false;
    c->pdst = NULL;
    if (c->hello_done)
        n_admitted--;
    else
        n_handshaking--;
    if (c->s) {
        tdd_log_ctx prev;
        tdd_log_set_ctx((tdd_log_ctx){c->s->id, c->hello_done ? c->s->id : 0}, &prev);
        bool held = c->hello_done && lost && tdd_resume_hold(c);
        if (held)
            tdd_info("session %llu: connection lost (peer %s); held %us for resume",
                     (unsigned long long)c->s->id, c->s->peer, c->s->resume->window_s);
        else if (c->hello_done)
            tdd_info("session %llu closed: peer %s, client '%s', %llu requests",
                     (unsigned long long)c->s->id, c->s->peer, c->s->client_name,
                     (unsigned long long)c->s->requests);
        if (!c->hello_done)
            tdd_debug("connection %llu closed before Hello", (unsigned long long)c->s->id);
        tdd_log_set_ctx(prev, NULL);
        if (!held) {
            tdd_resume_release(c->s);
            tdd_session_close(c->s);
        }
        c->s = NULL;
    }
    if (c->prev)
        c->prev->next = c->next;
    else
        conns = c->next;
    if (c->next)
        c->next->prev = c->prev;
    c->watch.data = c;
    /* uv_close waits for queued writes' callbacks (with UV_ECANCELED). A
     * reply-then-close (fail_protocol) has its final error already in the
     * kernel's buffer for small messages, which is what we need. */
    uv_close((uv_handle_t *)&c->watch, watch_closed);
}

/* After a TLS failure the peer may still be sending (TLS 1.3: a client finishes its side
 * of the handshake and sends its Hello before it learns that its certificate was
 * refused). Closing with its bytes unread would reset the connection, and the reset can
 * overtake the alert that says why: its bytes are read and dropped until it closes, for
 * at most TLS_LINGER_MS. */
#define TLS_LINGER_MS 2000

static void linger_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    (void)suggested;
    tdd_conn *c = h->data;
    *buf = uv_buf_init((char *)c->tls_rbuf, TLS_RBUF);
}

static void linger_read(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf)
{
    (void)buf;
    if (nread < 0)
        conn_close(st->data);
}

static void after_shutdown(uv_shutdown_t *req, int status)
{
    tdd_conn *c = req->data;
    free(req);
    if (status == 0 && c->tls_failed && !c->tls_dead && c->tls_rbuf &&
        uv_read_start(&c->h.stream, linger_alloc, linger_read) == 0) {
        c->reading = true;
        c->linger_ms = uv_now(loop) + TLS_LINGER_MS;
        watch_arm(c);
        return;
    }
    conn_close(c);
}

/* Close once every queued response is written (reply-then-close). */
static void conn_shutdown(tdd_conn *c)
{
    if (uv_is_closing(&c->h.handle))
        return;
    bool was_closing = c->closing;
    c->closing = true;
    if (c->reading)
        uv_read_stop(&c->h.stream);
    c->reading = false;
    if (was_closing)
        return; /* a shutdown is already under way */
    if (c->tls) {
        /* after the queued replies: close_notify, then the socket's shutdown */
        c->tls_fin = true;
        tls_pump_out(c);
        if (tdd_cfg.write_timeout_s && !c->tls_dead && !uv_is_active((uv_handle_t *)&c->watch))
            watch_arm(c);
        return;
    }
    if (!shutdown_socket(c))
        return;
    if (tdd_cfg.write_timeout_s && !uv_is_active((uv_handle_t *)&c->watch))
        watch_arm(c); /* a shutdown behind writes that never drain is bounded too */
}

/* ---------------------------------------------------------------- watchdog */

/* One timer per connection enforces three bounds, each judged at the moment it
 * could expire (traffic only stamps a time; it never touches the timer):
 *  - Hello within --hello-timeout of the connect;
 *  - idle: no traffic either way and no work in flight for --idle-timeout (a
 *    session reading a long download, or waiting on its own Sync, is busy);
 *  - queued replies that make no progress for --write-timeout (a client that
 *    stopped reading), which also bounds a shutdown's wait for it;
 *  - a client gone while its connection waits on a synchronising request (a process
 *    group's rendezvous, a push to another daemon: the daemon reads nothing then, so an
 *    end of stream would only be seen at the answer): looked at every PEER_CHECK_MS. */
#define PEER_CHECK_MS 1000

/* Whether the peer of a connection that is not being read has closed it (or reset it):
 * its socket reads end of stream with nothing before it. Bytes waiting hide the end
 * behind them; those are the client's next requests. */
static bool peer_gone(const tdd_conn *c)
{
    uv_os_fd_t fd;
    if (c->reading || uv_fileno((const uv_handle_t *)&c->h.stream, &fd))
        return false;
    char b;
    ssize_t n = recv(fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
    return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}
static bool session_busy(const tdd_conn *c)
{
    return c->blocked || (c->s && c->s->inflight > 0);
}

static uint64_t deadline_min(uint64_t a, uint64_t b)
{
    return a < b ? a : b;
}

static void on_watch(uv_timer_t *t);

static void watch_arm(tdd_conn *c)
{
    if (c->closing && uv_is_closing((uv_handle_t *)&c->watch))
        return;
    uint64_t now = uv_now(loop), next = UINT64_MAX;
    if (c->linger_ms)
        next = deadline_min(next, c->linger_ms);
    if (!c->hello_done && tdd_cfg.hello_timeout_s)
        next = deadline_min(next, c->opened_ms + tdd_cfg.hello_timeout_s * 1000ull);
    if (c->hello_done && tdd_cfg.idle_timeout_s)
        next = deadline_min(next, c->active_ms + tdd_cfg.idle_timeout_s * 1000ull);
    if (c->wq_bytes && tdd_cfg.write_timeout_s) {
        /* Partial progress of a large write has no callback: look at least every second. */
        next = deadline_min(next, c->wq_moved_ms + tdd_cfg.write_timeout_s * 1000ull);
        next = deadline_min(next, now + 1000);
    }
    if (c->blocked && !c->closing)
        next = deadline_min(next, now + PEER_CHECK_MS);
    if (next == UINT64_MAX) {
        uv_timer_stop(&c->watch);
        return;
    }
    uv_timer_start(&c->watch, on_watch, next > now ? next - now : 0, 0);
}

static void on_watch(uv_timer_t *t)
{
    tdd_conn *c = t->data;
    uint64_t now = uv_now(loop);
    unsigned long long sid = c->s ? (unsigned long long)c->s->id : 0;
    if (c->linger_ms && now >= c->linger_ms) {
        conn_close(c);
        return;
    }
    if (!c->hello_done && tdd_cfg.hello_timeout_s &&
        now - c->opened_ms >= tdd_cfg.hello_timeout_s * 1000ull) {
        tdd_info("connection %llu sent no Hello within %us; closing", sid, tdd_cfg.hello_timeout_s);
        conn_close(c);
        return;
    }
    if (c->wq_bytes) {
        size_t q = uv_stream_get_write_queue_size(&c->h.stream);
        if (q != c->wq_seen) {
            c->wq_seen = q;
            c->active_ms = c->wq_moved_ms = now;
        }
        if (tdd_cfg.write_timeout_s && now - c->wq_moved_ms >= tdd_cfg.write_timeout_s * 1000ull) {
            tdd_info("session %llu: replies made no progress for %us (%llu bytes queued); closing",
                     sid, tdd_cfg.write_timeout_s, (unsigned long long)c->wq_bytes);
            conn_close(c);
            return;
        }
    }
    if (c->blocked && !c->closing && peer_gone(c)) {
        tdd_info("session %llu: the client went away while its request waited; closing", sid);
        conn_close(c);
        return;
    }
    if (session_busy(c) || c->wq_bytes)
        c->active_ms = now;
    if (c->hello_done && tdd_cfg.idle_timeout_s &&
        now - c->active_ms >= tdd_cfg.idle_timeout_s * 1000ull) {
        tdd_info("session %llu idle for %us; closing", sid, tdd_cfg.idle_timeout_s);
        conn_close(c);
        return;
    }
    watch_arm(c);
}

/* The one admission rule, for Hello (conn_admit), /healthz and
 * tensordd_accepting_sessions alike: sessions past Hello and those held for resume
 * (each keeps its slot for its window) count against --max-sessions. */
static bool at_session_limit(void)
{
    return n_admitted + tdd_resume_held() >= tdd_cfg.max_sessions;
}

static int conn_admit(tdd_conn *c, td_error *err)
{
    if (at_session_limit()) {
        tdd_err_set(err, TD_ERESOURCE_EXHAUSTED, "the daemon serves %u sessions, its limit",
                    tdd_cfg.max_sessions);
        err->detail_kind = TD_DETAIL_RESOURCE;
        snprintf(err->detail.resource.resource, sizeof err->detail.resource.resource, "sessions");
        return err->code;
    }
    c->hello_done = true;
    n_handshaking--;
    n_admitted++;
    c->fp.lim.max_msg = tdd_cfg.max_msg;
    c->fp.lim.max_payload = tdd_cfg.max_payload;
    c->active_ms = uv_now(loop);
    watch_arm(c);
    return 0;
}

/* Connections before Hello are bounded: past --max-handshakes the oldest one is
 * dropped, so silent connects can neither exhaust the daemon nor keep a client
 * with the token out (it sends Hello at once and is never the oldest for long). */
static void drop_oldest_handshake(void)
{
    tdd_conn *oldest = NULL;
    for (tdd_conn *c = conns; c; c = c->next)
        if (!c->hello_done && !c->closing)
            oldest = c; /* the list is newest first */
    if (oldest) {
        tdd_info("%u connections without Hello; dropping the oldest (%s)", n_handshaking,
                 oldest->s ? oldest->s->peer : "?");
        conn_close(oldest);
    }
}

static void peer_name(tdd_conn *c, bool is_tcp, char *out, size_t len)
{
    if (!is_tcp) {
        snprintf(out, len, "unix");
        return;
    }
    struct sockaddr_storage ss;
    int n = sizeof ss;
    char ip[64] = "?";
    if (uv_tcp_getpeername(&c->h.tcp, (struct sockaddr *)&ss, &n) == 0) {
        if (ss.ss_family == AF_INET6) {
            uv_ip6_name((struct sockaddr_in6 *)&ss, ip, sizeof ip);
            snprintf(out, len, "[%s]:%d", ip, ntohs(((struct sockaddr_in6 *)&ss)->sin6_port));
            return;
        }
        uv_ip4_name((struct sockaddr_in *)&ss, ip, sizeof ip);
        snprintf(out, len, "%s:%d", ip, ntohs(((struct sockaddr_in *)&ss)->sin_port));
        return;
    }
    snprintf(out, len, "?");
}

static void on_connection(uv_stream_t *server, int status)
{
    listener *l = server->data;
    if (status < 0) {
        tdd_warn("accept on %s: %s", l->endpoint, uv_strerror(status));
        return;
    }
    bool is_tcp = server->type == UV_TCP;
    tdd_conn *c = calloc(1, sizeof *c);
    if (!c)
        return;
    c->rcap = RBUF_SIZE;
    c->rbuf = malloc(c->rcap);
    c->tls_qtail = &c->tls_q;
    if (l->tls) {
        c->tls = tdd_tls_new(tls_ctx);
        c->tls_rbuf = malloc(TLS_RBUF);
    }
    c->arena = arena_new(); /* NULL: requests are unpacked with malloc */
    /* A Unix socket passes fds (memfd uploads, downloads as_fd) when --max-conn-fds allows:
     * libuv's IPC mode reads with recvmsg and keeps what came. */
    c->fd_passing = !is_tcp && !l->tls && tdd_cfg.max_conn_fds > 0;
    if (c->fd_passing && !(c->fds = calloc(tdd_cfg.max_conn_fds, sizeof *c->fds)))
        c->fd_passing = false;
    c->send_fd = conn_send_fd;
    if (is_tcp)
        uv_tcp_init(loop, &c->h.tcp);
    else
        uv_pipe_init(loop, &c->h.pipe, c->fd_passing);
    c->h.handle.data = c;
    uv_timer_init(loop, &c->watch);
    c->watch.data = c;
    c->opened_ms = c->active_ms = uv_now(loop);
    if (n_handshaking >= tdd_cfg.max_handshakes)
        drop_oldest_handshake();
    n_handshaking++;
    c->next = conns;
    if (conns)
        conns->prev = c;
    conns = c;
    if (!c->rbuf || (l->tls && (!c->tls || !c->tls_rbuf)) || uv_accept(server, &c->h.stream) < 0) {
        conn_close(c);
        return;
    }
    if (is_tcp)
        uv_tcp_nodelay(&c->h.tcp, 1);
    /* Before Hello: small messages and no payload (conn_admit lifts both). */
    td_frame_limits lim = {.max_msg = tdd_cfg.max_msg < PREAUTH_MAX_MSG ? tdd_cfg.max_msg
                                                                        : PREAUTH_MAX_MSG,
                           .max_payload = 0};
    td_frame_parser_init(&c->fp, &lim);
    c->s = tdd_session_new(c);
    if (!c->s) {
        conn_close(c);
        return;
    }
    peer_name(c, is_tcp, c->s->peer, sizeof c->s->peer);
    /* not a session yet: that is Hello's, once the token checks out */
    tdd_log_ctx prev;
    tdd_log_set_ctx((tdd_log_ctx){c->s->id, 0}, &prev);
    tdd_debug("connection %llu accepted from %s", (unsigned long long)c->s->id, c->s->peer);
    tdd_log_set_ctx(prev, NULL);
    watch_arm(c);
    start_reading(c);
}

static bool is_loopback(const struct sockaddr_storage *ss)
{
    if (ss->ss_family == AF_INET)
        return (ntohl(((const struct sockaddr_in *)ss)->sin_addr.s_addr) >> 24) == 127;
    const struct in6_addr *a = &((const struct sockaddr_in6 *)ss)->sin6_addr;
    return IN6_IS_ADDR_LOOPBACK(a);
}

/* HOST:PORT of a tcp:// or tls:// endpoint into ss: 0, or a libuv error code with why[]
 * filled when the code alone would not say it. */
static int parse_hostport(const char *hostport, struct sockaddr_storage *ss, long *portp, char *why,
                          size_t wn)
{
    char host[128];
    const char *colon = strrchr(hostport, ':');
    if (!colon || colon == hostport || !colon[1])
        return UV_EINVAL;
    size_t hl = (size_t)(colon - hostport);
    if (hl >= sizeof host)
        return UV_EINVAL;
    memcpy(host, hostport, hl);
    host[hl] = 0;
    char *end;
    long port = strtol(colon + 1, &end, 10);
    if (*end || port < 0 || port > 65535)
        return UV_EINVAL;
    *portp = port;
    if (host[0] == '[') {
        if (hl < 2 || host[hl - 1] != ']')
            return UV_EINVAL;
        host[hl - 1] = 0;
        return uv_ip6_addr(host + 1, (int)port, (struct sockaddr_in6 *)ss);
    }
    int rc = uv_ip4_addr(strcmp(host, "localhost") == 0 ? "127.0.0.1" : host, (int)port,
                         (struct sockaddr_in *)ss);
    if (rc)
        snprintf(why, wn, "'%s' is not an IP address (nor localhost)", host);
    return rc;
}

/* A listener beyond loopback needs TLS or a token, unless --insecure. */
static int check_exposure(const struct sockaddr_storage *ss, bool tls, char *why, size_t wn)
{
    if (is_loopback(ss) || tdd_cfg.token_len || tls || tdd_cfg.insecure)
        return 0;
    snprintf(why, wn,
             "a listener beyond loopback needs TLS (tls://, --tls-cert, --tls-key) or "
             "a token (--token-file): anyone who can reach it could read the tensors "
             "and run code on this machine's devices (--insecure overrides)");
    return UV_EACCES;
}

/* --unix-group as a gid ((gid_t)-1 when unset): 0, or UV_EINVAL with why[]. */
static int unix_group_gid(gid_t *gid, char *why, size_t wn)
{
    *gid = (gid_t)-1;
    if (!tdd_cfg.unix_group[0])
        return 0;
    struct group *g = getgrnam(tdd_cfg.unix_group);
    char *end;
    unsigned long n = strtoul(tdd_cfg.unix_group, &end, 10);
    if (g)
        *gid = g->gr_gid;
    else if (!*end && end != tdd_cfg.unix_group)
        *gid = (gid_t)n;
    else {
        snprintf(why, wn, "--unix-group %s: no such group", tdd_cfg.unix_group);
        return UV_EINVAL;
    }
    return 0;
}

/* Each listen_* returns 0 or a libuv error code, with why[] saying what went wrong
 * in words when the code alone would not (tdd_server_start prints both). */
static int listen_tcp(listener *l, const char *hostport, char *why, size_t wn)
{
    struct sockaddr_storage ss;
    long port = 0;
    int prc = parse_hostport(hostport, &ss, &port, why, wn);
    if (prc)
        return prc;
    bool v6 = ss.ss_family == AF_INET6;
    if ((prc = check_exposure(&ss, l->tls, why, wn)))
        return prc;
    l->bare = !is_loopback(&ss) && !l->tls; /* SIGHUP may not take its token away */
    if (l->bare && !tdd_cfg.token_len)
        tdd_warn("INSECURE: listening on %s without TLS or a token (--insecure): anyone who "
                 "can reach it can read every tensor and run code on this machine's devices",
                 hostport);
    uv_tcp_init(loop, &l->h.tcp);
    l->h.handle.data = l;
    int rc = uv_tcp_bind(&l->h.tcp, (struct sockaddr *)&ss, 0);
    if (!rc)
        rc = uv_listen(&l->h.stream, 511, on_connection);
    if (rc) {
        if (rc == UV_EACCES && port < 1024)
            snprintf(why, wn, "%s (ports below 1024 need root or CAP_NET_BIND_SERVICE)",
                     uv_strerror(rc));
        l->open = true; /* initialised: closed by close_listeners */
        return rc;
    }
    l->open = true;
    int n = sizeof ss;
    uv_tcp_getsockname(&l->h.tcp, (struct sockaddr *)&ss, &n);
    char ip[64];
    const char *scheme = l->tls ? "tls" : "tcp";
    if (v6) {
        uv_ip6_name((struct sockaddr_in6 *)&ss, ip, sizeof ip);
        snprintf(l->endpoint, sizeof l->endpoint, "%s://[%s]:%d", scheme, ip,
                 ntohs(((struct sockaddr_in6 *)&ss)->sin6_port));
    } else {
        uv_ip4_name((struct sockaddr_in *)&ss, ip, sizeof ip);
        snprintf(l->endpoint, sizeof l->endpoint, "%s://%s:%d", scheme, ip,
                 ntohs(((struct sockaddr_in *)&ss)->sin_port));
    }
    return 0;
}

/* What is at a Unix socket's path: 0 nothing (or a stale socket, removed), else an
 * error with why[] filled: a live daemon answers there, or it is not a socket. */
static int unix_path_free(const char *path, char *why, size_t wn)
{
    struct stat sb;
    if (lstat(path, &sb) != 0)
        return errno == ENOENT ? 0 : uv_translate_sys_error(errno);
    if (!S_ISSOCK(sb.st_mode)) {
        snprintf(why, wn, "the path exists and is not a socket (not removing it)");
        return UV_EEXIST;
    }
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0)
        return uv_translate_sys_error(errno);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    memcpy(sa.sun_path, path, strlen(path) + 1);
    int rc = connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0 ? 0 : errno;
    close(fd);
    if (rc == ECONNREFUSED) {
        /* Nobody listens: a stale socket from an earlier run. */
        if (unlink(path) != 0 && errno != ENOENT)
            return uv_translate_sys_error(errno);
        tdd_info("removed stale socket %s (nothing was listening on it)", path);
        return 0;
    }
    if (rc == 0 || rc == EAGAIN || rc == EINPROGRESS) {
        snprintf(why, wn,
                 "another process is listening on it (a running tensordd?); stop it, or "
                 "choose another path");
        return UV_EADDRINUSE;
    }
    return uv_translate_sys_error(rc);
}

static int listen_unix(listener *l, const char *path, char *why, size_t wn)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    if (!path[0] || strlen(path) >= sizeof l->unix_path || strlen(path) >= sizeof sa.sun_path) {
        snprintf(why, wn, "expected unix:///PATH with a path of 1 to %zu bytes",
                 sizeof sa.sun_path - 1);
        return UV_EINVAL;
    }
    gid_t gid;
    int rc = unix_group_gid(&gid, why, wn);
    if (rc)
        return rc;
    rc = unix_path_free(path, why, wn);
    if (rc)
        return rc;
    memcpy(sa.sun_path, path, strlen(path) + 1);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0)
        return uv_translate_sys_error(errno);
    /* Created 0600 (never wider, even for a moment), then given its mode and group. */
    mode_t old = umask(0177);
    rc = bind(fd, (struct sockaddr *)&sa, sizeof sa) == 0 ? 0 : errno;
    umask(old);
    if (rc) {
        close(fd);
        if (rc == ENOENT || rc == ENOTDIR)
            snprintf(why, wn, "%s (the directory does not exist)", strerror(rc));
        return uv_translate_sys_error(rc);
    }
    struct stat sb;
    if ((gid != (gid_t)-1 && chown(path, (uid_t)-1, gid) != 0) ||
        chmod(path, (mode_t)tdd_cfg.unix_mode) != 0 || stat(path, &sb) != 0) {
        rc = errno;
        if (gid != (gid_t)-1)
            snprintf(why, wn, "setting group %s and mode %04o: %s", tdd_cfg.unix_group,
                     tdd_cfg.unix_mode, strerror(rc));
        close(fd);
        unlink(path);
        return uv_translate_sys_error(rc);
    }
    uv_pipe_init(loop, &l->h.pipe, 0);
    l->h.handle.data = l;
    l->open = true;
    rc = uv_pipe_open(&l->h.pipe, fd);
    if (rc)
        close(fd);
    else
        rc = uv_listen(&l->h.stream, 511, on_connection);
    if (rc) {
        unlink(path);
        return rc;
    }
    /* Removed at exit only while it is still ours (not another daemon's since). */
    l->unix_dev = sb.st_dev;
    l->unix_ino = sb.st_ino;
    snprintf(l->unix_path, sizeof l->unix_path, "%s", path);
    snprintf(l->endpoint, sizeof l->endpoint, "unix://%s", path);
    return 0;
}

/* Removes a Unix socket this daemon created, if the path still names it. */
static void unlink_own(listener *l)
{
    struct stat sb;
    if (l->unix_path[0] && lstat(l->unix_path, &sb) == 0 && sb.st_dev == l->unix_dev &&
        sb.st_ino == l->unix_ino)
        unlink(l->unix_path);
    l->unix_path[0] = 0;
}

/* fd://N: a listening socket systemd passed (socket activation). Its endpoint names
 * what it is; the socket file belongs to systemd and is never removed here. A TCP one
 * beyond loopback needs a token, as --listen's. */
static int listen_fd(listener *l, const char *num, char *why, size_t wn)
{
    char *end;
    long fd = strtol(num, &end, 10);
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    int type = 0, acc = 0;
    socklen_t tl = sizeof type, al = sizeof acc;
    if (*end || end == num || fd < 3 || fd > 1024 ||
        getsockname((int)fd, (struct sockaddr *)&ss, &sl) != 0 ||
        getsockopt((int)fd, SOL_SOCKET, SO_TYPE, &type, &tl) != 0 ||
        getsockopt((int)fd, SOL_SOCKET, SO_ACCEPTCONN, &acc, &al) != 0 || type != SOCK_STREAM ||
        !acc) {
        snprintf(why, wn, "not a listening stream socket");
        return UV_EINVAL;
    }
    int rc;
    if (ss.ss_family == AF_UNIX) {
        uv_pipe_init(loop, &l->h.pipe, 0);
        l->open = true;
        rc = uv_pipe_open(&l->h.pipe, (int)fd);
        snprintf(l->endpoint, sizeof l->endpoint, "unix://%s",
                 ((struct sockaddr_un *)&ss)->sun_path);
    } else if (ss.ss_family == AF_INET || ss.ss_family == AF_INET6) {
        l->bare = !is_loopback(&ss);
        if (l->bare && !tdd_cfg.token_len) {
            snprintf(why, wn, "a listener beyond loopback needs a token (--token-file)");
            return UV_EACCES;
        }
        uv_tcp_init(loop, &l->h.tcp);
        l->open = true;
        rc = uv_tcp_open(&l->h.tcp, (uv_os_sock_t)fd);
        char ip[64];
        int port;
        if (ss.ss_family == AF_INET6) {
            uv_ip6_name((struct sockaddr_in6 *)&ss, ip, sizeof ip);
            port = ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
            snprintf(l->endpoint, sizeof l->endpoint, "tcp://[%s]:%d", ip, port);
        } else {
            uv_ip4_name((struct sockaddr_in *)&ss, ip, sizeof ip);
            port = ntohs(((struct sockaddr_in *)&ss)->sin_port);
            snprintf(l->endpoint, sizeof l->endpoint, "tcp://%s:%d", ip, port);
        }
    } else {
        snprintf(why, wn, "socket family %d is neither unix nor tcp", ss.ss_family);
        return UV_EINVAL;
    }
    l->h.handle.data = l;
    if (!rc)
        rc = uv_listen(&l->h.stream, 511, on_connection);
    return rc;
}

/* A failed start: the listeners opened so far are closed and their sockets removed. */
static void close_listeners(void)
{
    for (int i = 0; i <= nlisteners && i < TDD_MAX_LISTEN; i++) {
        listener *l = &listeners[i];
        unlink_own(l);
        if (l->open && !uv_is_closing(&l->h.handle))
            uv_close(&l->h.handle, NULL);
    }
    uv_run(loop, UV_RUN_NOWAIT);
}

/* What would stop tdd_server_start before it binds anything, checked without binding:
 * the TLS files (loaded, the key matched to the certificate), each endpoint's form,
 * the rule that a listener beyond loopback needs TLS or a token, a Unix socket's path
 * and --unix-group. 0, or -1 with why[] naming the setting and what is wrong; *ctx (when
 * not NULL) gets the TLS context, NULL without tls:// listeners. */
static int validate(const tdd_config *cfg, tdd_tls_ctx **ctx, char *why, size_t wn)
{
    bool want_tls = false;
    for (int i = 0; i < cfg->nlisten; i++)
        want_tls |= strncmp(cfg->listen[i], "tls://", 6) == 0;
    bool have_cert = cfg->tls_cert[0] || cfg->tls_key[0] || cfg->tls_client_ca[0];
    tdd_tls_ctx *x = NULL;
    if (want_tls || have_cert) {
        char w[700] = "";
        if (!want_tls)
            snprintf(w, sizeof w,
                     "--tls-cert, --tls-key and --tls-client-ca apply to "
                     "tls:// listeners, and none is configured");
        else if (!cfg->tls_cert[0] || !cfg->tls_key[0])
            snprintf(w, sizeof w, "a tls:// listener needs --tls-cert and --tls-key");
        else
            x = tdd_tls_ctx_new(cfg->tls_cert, cfg->tls_key, cfg->tls_client_ca, w, sizeof w);
        if (!x) {
            snprintf(why, wn, "cannot start TLS: %s", w);
            return -1;
        }
    }
    for (int i = 0; i < cfg->nlisten; i++) {
        const char *ep = cfg->listen[i];
        char w[400] = "";
        int rc = 0;
        if (strncmp(ep, "tcp://", 6) == 0 || strncmp(ep, "tls://", 6) == 0) {
            struct sockaddr_storage ss;
            long port;
            rc = parse_hostport(ep + 6, &ss, &port, w, sizeof w);
            if (!rc)
                rc = check_exposure(&ss, ep[1] == 'l', w, sizeof w);
        } else if (strncmp(ep, "unix://", 7) == 0) {
            gid_t gid;
            if (!ep[7] || strlen(ep + 7) >= sizeof(((struct sockaddr_un *)0)->sun_path))
                rc = UV_EINVAL; /* listen_unix says how long it may be */
            else
                rc = unix_group_gid(&gid, w, sizeof w);
        } else if (strncmp(ep, "fd://", 5) != 0) { /* fd:// is checked when systemd passes it */
            rc = UV_EINVAL;
        }
        if (rc) {
            if (rc == UV_EINVAL && !w[0] && strncmp(ep, "unix://", 7) == 0)
                snprintf(w, sizeof w, "expected unix:///PATH with a path of 1 to %zu bytes",
                         sizeof(((struct sockaddr_un *)0)->sun_path) - 1);
            snprintf(why, wn, "cannot listen on %s: %s", ep,
                     w[0]              ? w
                     : rc == UV_EINVAL ? "expected tcp://HOST:PORT, tls://HOST:PORT or unix:///PATH"
                                       : uv_strerror(rc));
            tdd_tls_ctx_free(x);
            return -1;
        }
    }
    if (ctx)
        *ctx = x;
    else
        tdd_tls_ctx_free(x);
    return 0;
}

int tdd_server_check(const tdd_config *cfg, char *why, size_t wn)
{
    return validate(cfg, NULL, why, wn);
}

int tdd_server_start(uv_loop_t *lp, const tdd_config *cfg, tdd_request_fn on_req)
{
    static const tdd_transport transport = {.send = conn_send,
                                            .send_encoded = conn_send_encoded,
                                            .pause = conn_pause,
                                            .resume = conn_resume,
                                            .kick = conn_kick,
                                            .admit = conn_admit,
                                            .drop = conn_close};
    loop = lp;
    tdd_resume_init(lp);
    on_request = on_req;
    tdd_reply_init(&transport);
    char bad[1200];
    if (validate(cfg, &tls_ctx, bad, sizeof bad)) { /* the same as --check-config's */
        tdd_error("%s", bad);
        return UV_EINVAL;
    }
    uv_timer_init(loop, &trim_timer);
    uv_unref((uv_handle_t *)&trim_timer); /* keeps nothing running */
    trim_armed = true;
    for (int i = 0; i < cfg->nlisten; i++) {
        listener *l = &listeners[nlisteners];
        const char *ep = cfg->listen[i];
        char why[400] = "";
        int rc;
        l->tls = strncmp(ep, "tls://", 6) == 0;
        if (strncmp(ep, "tcp://", 6) == 0 || l->tls)
            rc = listen_tcp(l, ep + 6, why, sizeof why);
        else if (strncmp(ep, "unix://", 7) == 0)
            rc = listen_unix(l, ep + 7, why, sizeof why);
        else if (strncmp(ep, "fd://", 5) == 0)
            rc = listen_fd(l, ep + 5, why, sizeof why);
        else
            rc = UV_EINVAL;
        if (rc) {
            tdd_error("cannot listen on %s: %s", ep,
                      why[0] ? why
                      : rc == UV_EINVAL
                          ? "expected tcp://HOST:PORT, tls://HOST:PORT or unix:///PATH"
                          : uv_strerror(rc));
            close_listeners();
            return rc;
        }
        nlisteners++;
    }
    /* Announced once every listener is up, so a script that saw the first line may use
     * any of them. stdout's line is for scripts (port 0); the log's has a time and a
     * level (and is the only one when stdout is the journal too). */
    for (int i = 0; i < nlisteners; i++) {
        const char *ep = cfg->listen[i];
        if (!tdd_log_is_journal(STDOUT_FILENO))
            printf("listening on %s\n", listeners[i].endpoint);
        if (strncmp(ep, "fd://", 5))
            tdd_info("listening on %s", listeners[i].endpoint);
        else
            tdd_info("listening on %s (%s from systemd)", listeners[i].endpoint, ep);
    }
    fflush(stdout);
    return 0;
}

int tdd_server_reload_tls(const tdd_config *cfg, char *why, size_t wn)
{
    if (!tls_ctx)
        return 1;
    if (!cfg->tls_cert[0] || !cfg->tls_key[0]) {
        snprintf(why, wn, "a tls:// listener needs --tls-cert and --tls-key");
        return -1;
    }
    tdd_tls_ctx *x = tdd_tls_ctx_new(cfg->tls_cert, cfg->tls_key, cfg->tls_client_ca, why, wn);
    if (!x)
        return -1;
    tdd_tls_ctx_free(tls_ctx); /* open connections hold a reference to its SSL_CTX */
    tls_ctx = x;
    return 0;
}

bool tdd_server_needs_token(void)
{
    for (int i = 0; i < nlisteners; i++)
        if (listeners[i].bare)
            return true;
    return false;
}

uint32_t tdd_server_admitted(void)
{
    return n_admitted;
}

const char *tdd_server_refusal(void)
{
    if (shutting_down)
        return "shutting down";
    if (nlisteners == 0)
        return "not listening";
    if (at_session_limit())
        return tdd_resume_held() ? "at --max-sessions (counting sessions held for resume)"
                                 : "at --max-sessions";
    return NULL;
}

bool tdd_server_accepting(void)
{
    return tdd_server_refusal() == NULL;
}

const char *tdd_server_endpoint(int i)
{
    return i >= 0 && i < nlisteners ? listeners[i].endpoint : NULL;
}

void tdd_server_shutdown(void)
{
    if (shutting_down)
        return;
    shutting_down = true;
    if (trim_armed) {
        trim_armed = false;
        uv_close((uv_handle_t *)&trim_timer, NULL);
    }
    if (!conns)
        yield_close();
    tdd_info("shutting down: %llu session(s) open", (unsigned long long)tdd_nsessions);
    tdd_resume_drop_all(); /* held sessions have no connection to say goodbye on */
    for (int i = 0; i < nlisteners; i++) {
        if (listeners[i].unix_path[0])
            unlink_own(&listeners[i]);
        if (!conns && !uv_is_closing(&listeners[i].h.handle))
            uv_close(&listeners[i].h.handle, NULL);
        else if (!uv_is_closing(&listeners[i].h.handle))
            uv_read_stop(&listeners[i].h.stream); /* no-op for listeners; closed below */
    }
    for (int i = 0; i < nlisteners; i++)
        if (!uv_is_closing(&listeners[i].h.handle))
            uv_close(&listeners[i].h.handle, NULL);
    tdd_conn *c = conns;
    while (c) {
        tdd_conn *next = c->next;
        c->draining = true;
        if (!c->in_payload) {
            if (c->reading)
                uv_read_stop(&c->h.stream);
            c->reading = false;
        }
        conn_kick(c);
        c = next;
    }
}
