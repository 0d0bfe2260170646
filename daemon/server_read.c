/* server_read.c -- frames in: buffering, payloads straight into tensor storage, the
 * request handed to the request table, backpressure, and yielding the loop. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "reply.h"
#include "resume.h"
#include "server_impl.h"
#include "stats.h"

/* Payload slices handed to read(2) at once: large enough for full-speed
 * loopback, small enough that one client cannot monopolise the loop. */
#define PAYLOAD_SLICE (8u << 20)

static void conn_process(tdd_conn *c);
static void yield_turn(tdd_conn *c);

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
void srv_conn_buffer(tdd_conn *c, uv_buf_t *buf)
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
    srv_conn_buffer(h->data, buf);
}

void srv_fail_protocol(tdd_conn *c, int code, const char *what)
{
    td_error err;
    tdd_err_set(&err, code, "%s", what);
    tdd_count_error(code);
    tdd_info("session %llu (%s): %s; closing the connection",
             (unsigned long long)(c->s ? c->s->id : 0), c->s ? c->s->peer : "?", what);
    tdd_conn_send_error(c, 0, &err);
    srv_conn_shutdown(c);
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

void srv_start_reading(tdd_conn *c)
{
    if (!c->reading && !c->closing)
        c->reading = uv_read_start(&c->h.stream, c->tls ? srv_tls_on_alloc : on_alloc,
                                   c->tls ? srv_tls_on_read : srv_on_read) == 0;
    /* TLS: what was received while reading was off waits in the TLS session */
    if (c->reading && c->tls && !c->tls_busy && tdd_tls_has_input(c->tls))
        srv_tls_pump_in(c);
}

static void reading_policy(tdd_conn *c)
{
    if (c->closing)
        return;
    bool want = c->in_payload || can_process(c);
    if (want)
        srv_start_reading(c);
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

static void handle_frame(tdd_conn *c)
{
    td_frame_header hdr = c->fp.hdr;
    Tensordd__V1__Request *req = srv_request_unpack(c, hdr.msg_len, c->fp.msg);
    if (!req) {
        srv_fail_protocol(c, TD_EPROTOCOL_ERROR, "request is not a valid protobuf Request");
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
        srv_claim_fds(c, c->frame_at);
    else if (c->nfds && srv_fd_is_for(c, c->frame_at, frame_end)) {
        /* refused before it runs: neither answered Ok nor applied, then the close */
        srv_request_free(c, req);
        tdd_log_set_ctx(prev, NULL);
        srv_check_stray_fds(c, frame_end);
        return;
    }
    int rc = srv.on_request(c, req, hdr.payload_len);
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
        srv_request_free(c, req);
        if (c->blocked) /* a resume handed over the request the old connection waited on */
            srv_conn_kick(c);
        break;
    case TDD_DISPATCH_BLOCK:
        c->blocked = req;
        srv_watch_arm(c); /* the client's end is looked for while it waits */
        break;
    case TDD_DISPATCH_YIELD:
        c->blocked = req;
        yield_turn(c);
        break;
    case TDD_DISPATCH_PAYLOAD:
        tdd_resume_payload_begin(c->s, req->id);
        srv_request_free(c, req);
        c->in_payload = true;
        c->pgot = 0;
        c->plen = hdr.payload_len;
        if (c->plen == 0)
            payload_complete(c);
        break;
    case TDD_DISPATCH_CLOSE:
    default:
        srv_request_free(c, req);
        srv_conn_shutdown(c);
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
            if (srv_check_stray_fds(c, c->frame_at))
                return;
        }
        size_t used;
        int rc = td_frame_feed(&c->fp, c->rbuf + c->rpos, c->rlen - c->rpos, &used);
        c->rpos += used;
        if (rc < 0) {
            srv_fail_protocol(c, rc,
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
        !c->fp.in_msg && srv_check_stray_fds(c, c->rx_total))
        return;
    reading_policy(c);
}

void srv_on_read(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf)
{
    tdd_conn *c = st->data;
    if (c->closing)
        return;
    if (nread < 0) {
        if (nread != UV_EOF)
            conn_debug(c, "connection %llu: read: %s", (unsigned long long)(c->s ? c->s->id : 0),
                       uv_strerror((int)nread));
        srv_conn_close(c);
        return;
    }
    if (nread == 0)
        return;
    if (c->fd_passing && srv_take_fds(c, c->rx_total, c->rx_total + (uint64_t)nread))
        return;
    srv_conn_received(c, buf, (size_t)nread);
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
    srv_conn_close(c);
    return true;
}

void srv_conn_received(tdd_conn *c, const uv_buf_t *buf, size_t n)
{
    ssize_t nread = (ssize_t)n;
    if (!c->sniffed && !c->tls && sniff_tls(c, buf, n))
        return;
    tdd_stats.bytes_received += (uint64_t)nread;
    c->rx_total += (uint64_t)nread;
    c->active_ms = uv_now(srv.loop);
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

void srv_conn_pause(tdd_conn *c)
{
    c->paused++;
}

void srv_conn_resume(tdd_conn *c)
{
    if (c->paused > 0)
        c->paused--;
    srv_conn_kick(c);
}

/* Connections whose blocked request yielded (a Replay's slice ran) are called again from
 * an idle handle, once per turn of the loop: the poll between two turns serves every
 * other connection, and a replay's requests are bounded per turn as a connection's
 * reads are (conn_process). */
static uv_idle_t yield_idle;
static bool yield_idle_init;

static void on_yield_turn(uv_idle_t *h)
{
    bool any = false;
    for (tdd_conn *c = srv.conns, *next; c; c = next) {
        next = c->next;
        if (!c->yielded || c->closing)
            continue;
        c->yielded = false;
        c->wait_room = true; /* now as soon as the session has room */
        any = true;
        srv_conn_kick(c);
    }
    if (!any)
        uv_idle_stop(h);
}

/* The last connection is gone at shutdown: nothing yields any more. */
void srv_yield_close(void)
{
    if (yield_idle_init && !uv_is_closing((uv_handle_t *)&yield_idle))
        uv_close((uv_handle_t *)&yield_idle, NULL);
}

static void yield_turn(tdd_conn *c)
{
    c->yielded = true;
    c->wait_room = false;
    if (!yield_idle_init) {
        uv_idle_init(srv.loop, &yield_idle);
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

void srv_conn_kick(tdd_conn *c)
{
    if (!c || c->closing)
        return;
    if (blocked_ready(c)) {
        Tensordd__V1__Request *req = c->blocked;
        c->blocked = NULL;
        c->wait_room = false;
        int rc = srv.on_request(c, req, 0);
        if (rc == TDD_DISPATCH_BLOCK) {
            c->blocked = req;
            return;
        }
        if (rc == TDD_DISPATCH_YIELD) {
            c->blocked = req;
            yield_turn(c);
            return;
        }
        srv_request_free(c, req);
        if (rc == TDD_DISPATCH_CLOSE) {
            srv_conn_shutdown(c);
            return;
        }
    }
    if (c->draining && !c->blocked && c->paused == 0 && !c->in_payload && c->s &&
        c->s->inflight == 0) {
        /* Shutdown: the session's work is done; say Goodbye and close. */
        tdd_conn_send_ok(c, 0);
        srv_conn_shutdown(c);
        return;
    }
    if (can_process(c) && c->rpos < c->rlen)
        conn_process(c);
    else
        reading_policy(c);
}
