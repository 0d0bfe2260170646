/* server.c -- libuv listeners and connections: frames in, payloads straight
 * into tensor storage, responses out, backpressure and graceful shutdown. */
#include <errno.h>
#include <malloc.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "log.h"
#include "reply.h"
#include "stats.h"
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
} listener;

static uv_loop_t *loop;
static tdd_request_fn on_request; /* from main: the request table */
static listener listeners[TDD_MAX_LISTEN];
static int nlisteners;
static tdd_conn *conns;
static bool shutting_down;
static uint32_t n_handshaking; /* connections before Hello */
static uint32_t n_admitted;    /* connections past Hello: the sessions --max-sessions bounds */

static void conn_process(tdd_conn *c);
static void conn_close(tdd_conn *c);
static void conn_shutdown(tdd_conn *c);
static void watch_arm(tdd_conn *c);
static void conn_resume(tdd_conn *c);
static void conn_kick(tdd_conn *c);

/* ---------------------------------------------------------------- writes */

typedef struct {
    uv_write_t req;
    tdd_conn *c;
    size_t total;
    tdd_storage *hold;
    bool resume;         /* the connection was paused for this write */
    max_align_t bytes[]; /* the part of the frame not yet written */
} write_req;

/* Frames up to this size are built on the stack: a small reply with nothing
 * queued ahead of it then costs no allocation at all. */
#define SMALL_FRAME 512

static void after_write(uv_write_t *w, int status)
{
    write_req *wr = (write_req *)w;
    tdd_conn *c = wr->c;
    c->wq_bytes -= wr->total;
    c->active_ms = c->wq_moved_ms = uv_now(loop);
    tdd_storage_unref(wr->hold);
    if (status < 0 && status != UV_ECANCELED)
        tdd_debug("session %llu: write failed: %s", (unsigned long long)(c->s ? c->s->id : 0),
                  uv_strerror(status));
    bool resume = wr->resume;
    free(wr);
    if (resume)
        conn_resume(c);
    else if (!c->closing)
        conn_kick(c);
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
    if (plen == 0 && c->wq_bytes == 0) {
        /* A reply with nothing queued ahead of it goes out with one write(2) now:
         * through uv_write the socket would also be armed and disarmed for
         * writability, two epoll_ctl calls per small reply. */
        uv_buf_t b = uv_buf_init((char *)frame, (unsigned)flen);
        int n = uv_try_write(&c->h.stream, &b, 1);
        sent = n > 0 ? (size_t)n : 0;
        tdd_stats.bytes_sent += sent;
        if (sent == flen) {
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

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    (void)suggested;
    tdd_conn *c = h->data;
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
    tdd_payload_cb cb = c->pdone;
    void *arg = c->parg;
    c->pdone = NULL;
    c->pdst = NULL;
    if (cb)
        cb(c, arg, 0);
}

static void on_read(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf);

static void start_reading(tdd_conn *c)
{
    if (!c->reading && !c->closing)
        c->reading = uv_read_start(&c->h.stream, on_alloc, on_read) == 0;
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
    if (c->s)
        c->s->requests++;
    int rc = on_request(c, req, hdr.payload_len);
    switch (rc) {
    case TDD_DISPATCH_DONE:
        request_free(c, req);
        break;
    case TDD_DISPATCH_BLOCK:
        c->blocked = req;
        break;
    case TDD_DISPATCH_PAYLOAD:
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
    reading_policy(c);
}

static void on_read(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf)
{
    tdd_conn *c = st->data;
    if (c->closing)
        return;
    if (nread < 0) {
        if (nread != UV_EOF)
            tdd_debug("session %llu: read: %s", (unsigned long long)(c->s ? c->s->id : 0),
                      uv_strerror((int)nread));
        conn_close(c);
        return;
    }
    if (nread == 0)
        return;
    tdd_stats.bytes_received += (uint64_t)nread;
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

static void conn_kick(tdd_conn *c)
{
    if (!c || c->closing)
        return;
    if (c->blocked && c->paused == 0 && c->s && c->s->inflight == 0) {
        Tensordd__V1__Request *req = c->blocked;
        c->blocked = NULL;
        int rc = on_request(c, req, 0);
        if (rc == TDD_DISPATCH_BLOCK) {
            c->blocked = req;
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

/* ---------------------------------------------------------------- lifecycle */

static void after_close(uv_handle_t *h)
{
    tdd_conn *c = h->data;
    if (c->blocked)
        request_free(c, c->blocked);
    arena_destroy(c->arena);
    td_frame_parser_free(&c->fp);
    free(c->rbuf);
    /* A client that queued many replies and left: give the heap's free pages back
     * (they are small blocks, which the allocator keeps otherwise). */
    bool trim = c->wq_peak > (1u << 20);
    free(c);
    if (trim)
        malloc_trim(0);
    if (shutting_down && !conns) {
        for (int i = 0; i < nlisteners; i++)
            if (!uv_is_closing(&listeners[i].h.handle))
                uv_close(&listeners[i].h.handle, NULL);
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
    c->closing = true;
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
        tdd_debug("session %llu closed", (unsigned long long)c->s->id);
        tdd_session_close(c->s);
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

static void after_shutdown(uv_shutdown_t *req, int status)
{
    (void)status;
    tdd_conn *c = req->data;
    free(req);
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
    uv_shutdown_t *req = malloc(sizeof *req);
    if (!req || uv_shutdown(req, &c->h.stream, after_shutdown) < 0) {
        free(req);
        conn_close(c);
        return;
    }
    req->data = c;
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
 *    stopped reading), which also bounds a shutdown's wait for it. */
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
    if (!c->hello_done && tdd_cfg.hello_timeout_s)
        next = deadline_min(next, c->opened_ms + tdd_cfg.hello_timeout_s * 1000ull);
    if (c->hello_done && tdd_cfg.idle_timeout_s)
        next = deadline_min(next, c->active_ms + tdd_cfg.idle_timeout_s * 1000ull);
    if (c->wq_bytes && tdd_cfg.write_timeout_s) {
        /* Partial progress of a large write has no callback: look at least every second. */
        next = deadline_min(next, c->wq_moved_ms + tdd_cfg.write_timeout_s * 1000ull);
        next = deadline_min(next, now + 1000);
    }
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

static int conn_admit(tdd_conn *c, td_error *err)
{
    if (n_admitted >= tdd_cfg.max_sessions) {
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
    c->arena = arena_new(); /* NULL: requests are unpacked with malloc */
    if (is_tcp)
        uv_tcp_init(loop, &c->h.tcp);
    else
        uv_pipe_init(loop, &c->h.pipe, 0);
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
    if (!c->rbuf || uv_accept(server, &c->h.stream) < 0) {
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
    tdd_debug("session %llu opened from %s", (unsigned long long)c->s->id, c->s->peer);
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

static int listen_tcp(listener *l, const char *hostport)
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
    struct sockaddr_storage ss;
    bool v6 = host[0] == '[';
    if (v6) {
        if (hl < 2 || host[hl - 1] != ']')
            return UV_EINVAL;
        host[hl - 1] = 0;
        int rc = uv_ip6_addr(host + 1, (int)port, (struct sockaddr_in6 *)&ss);
        if (rc)
            return rc;
    } else {
        int rc = uv_ip4_addr(strcmp(host, "localhost") == 0 ? "127.0.0.1" : host, (int)port,
                             (struct sockaddr_in *)&ss);
        if (rc)
            return rc;
    }
    if (!is_loopback(&ss) && !tdd_cfg.token_len) {
        tdd_error("refusing to listen on tcp://%s without --token-file: anyone who can reach "
                  "it could run code on this machine's devices",
                  hostport);
        return UV_EACCES;
    }
    uv_tcp_init(loop, &l->h.tcp);
    int rc = uv_tcp_bind(&l->h.tcp, (struct sockaddr *)&ss, 0);
    if (!rc)
        rc = uv_listen(&l->h.stream, 511, on_connection);
    if (rc)
        return rc;
    int n = sizeof ss;
    uv_tcp_getsockname(&l->h.tcp, (struct sockaddr *)&ss, &n);
    char ip[64];
    if (v6) {
        uv_ip6_name((struct sockaddr_in6 *)&ss, ip, sizeof ip);
        snprintf(l->endpoint, sizeof l->endpoint, "tcp://[%s]:%d", ip,
                 ntohs(((struct sockaddr_in6 *)&ss)->sin6_port));
    } else {
        uv_ip4_name((struct sockaddr_in *)&ss, ip, sizeof ip);
        snprintf(l->endpoint, sizeof l->endpoint, "tcp://%s:%d", ip,
                 ntohs(((struct sockaddr_in *)&ss)->sin_port));
    }
    return 0;
}

static int listen_unix(listener *l, const char *path)
{
    if (!path[0] || strlen(path) >= sizeof l->unix_path)
        return UV_EINVAL;
    struct stat sb;
    /* A stale socket from an earlier run would make bind fail; remove only sockets. */
    if (stat(path, &sb) == 0 && S_ISSOCK(sb.st_mode))
        unlink(path);
    uv_pipe_init(loop, &l->h.pipe, 0);
    int rc = uv_pipe_bind(&l->h.pipe, path);
    if (!rc)
        rc = chmod(path, 0600) ? uv_translate_sys_error(errno) : 0;
    if (!rc)
        rc = uv_listen(&l->h.stream, 511, on_connection);
    if (rc)
        return rc;
    snprintf(l->unix_path, sizeof l->unix_path, "%s", path);
    snprintf(l->endpoint, sizeof l->endpoint, "unix://%s", path);
    return 0;
}

int tdd_server_start(uv_loop_t *lp, const tdd_config *cfg, tdd_request_fn on_req)
{
    static const tdd_transport transport = {.send = conn_send,
                                            .send_encoded = conn_send_encoded,
                                            .pause = conn_pause,
                                            .resume = conn_resume,
                                            .kick = conn_kick,
                                            .admit = conn_admit};
    loop = lp;
    on_request = on_req;
    tdd_reply_init(&transport);
    for (int i = 0; i < cfg->nlisten; i++) {
        listener *l = &listeners[nlisteners];
        const char *ep = cfg->listen[i];
        int rc;
        if (strncmp(ep, "tcp://", 6) == 0)
            rc = listen_tcp(l, ep + 6);
        else if (strncmp(ep, "unix://", 7) == 0)
            rc = listen_unix(l, ep + 7);
        else
            rc = UV_EINVAL;
        if (rc) {
            if (rc != UV_EACCES)
                tdd_error("cannot listen on %s: %s", ep,
                          rc == UV_EINVAL ? "expected tcp://HOST:PORT or unix:///PATH"
                                          : uv_strerror(rc));
            return rc;
        }
        l->h.handle.data = l;
        nlisteners++;
        printf("listening on %s\n", l->endpoint);
        fflush(stdout);
    }
    return 0;
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
    tdd_info("shutting down: %llu session(s) open", (unsigned long long)tdd_nsessions);
    for (int i = 0; i < nlisteners; i++) {
        if (listeners[i].unix_path[0])
            unlink(listeners[i].unix_path);
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
