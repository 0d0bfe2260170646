/* server_write.c -- replies out: frames built (small ones on the stack), payloads
 * written from tensor storage, a memfd passed with a frame, the write queue bounded. */
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "server_impl.h"
#include "stats.h"

/* Frames up to this size are built on the stack: a small reply with nothing
 * queued ahead of it then costs no allocation at all. */
#define SMALL_FRAME 512
/* Payloads up to this size are copied into their frame: written from tensor storage,
 * frame processing would pause until the write completed (the storage must not change
 * under it), and the pause stops and restarts reading, two epoll_ctl calls per small
 * download (relu(4).numpy()'s round trip: read, writev, epoll_ctl ADD failing with EEXIST,
 * epoll_ctl MOD, against read and write with the payload copied). */
#define INLINE_PAYLOAD 4096

void srv_free_handle(uv_handle_t *h)
{
    free(h);
}

void srv_write_done(write_req *wr, int status)
{
    tdd_conn *c = wr->c;
    if (wr->fdpipe)
        uv_close((uv_handle_t *)wr->fdpipe, srv_free_handle); /* closes the memfd */
    c->wq_bytes -= wr->total;
    c->active_ms = c->wq_moved_ms = uv_now(srv.loop);
    tdd_storage_unref(wr->hold);
    if (status < 0 && status != UV_ECANCELED)
        conn_debug(c, "connection %llu: write failed: %s",
                   (unsigned long long)(c->s ? c->s->id : 0), uv_strerror(status));
    bool resume = wr->resume;
    free(wr);
    if (resume)
        srv_conn_resume(c);
    else if (!c->closing)
        srv_conn_kick(c);
}

static void after_write(uv_write_t *w, int status)
{
    srv_write_done((write_req *)w, status);
}

static void out_of_memory(tdd_conn *c, bool resume)
{
    if (resume)
        c->paused--;
    tdd_error("out of memory writing a response; closing the connection");
    srv_conn_close(c);
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
    uint8_t joined[SMALL_FRAME + INLINE_PAYLOAD];
    if (plen && plen <= INLINE_PAYLOAD && !wr && flen <= SMALL_FRAME) {
        memcpy(joined, frame, flen);
        memcpy(joined + flen, payload, (size_t)plen);
        frame = joined;
        flen += (size_t)plen;
        plen = 0;
        payload = NULL;
        hold = NULL;
        if (resume) { /* the pause taken for this reply: nothing to wait for now */
            c->paused--;
            resume = false;
        }
    }
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
            c->active_ms = uv_now(srv.loop); /* as srv_write_done does for a queued one */
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
        c->wq_moved_ms = uv_now(srv.loop); /* the write timeout counts from here */
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
        srv_tls_enqueue(c, wr);
    } else {
        int rc = uv_write(&wr->req, &c->h.stream, bufs, plen ? 2 : 1, after_write);
        if (rc < 0) {
            c->wq_bytes -= wr->total;
            tdd_storage_unref(hold);
            free(wr);
            if (resume)
                c->paused--;
            srv_conn_close(c);
            return;
        }
    }
    if (tdd_cfg.write_timeout_s && !uv_is_active((uv_handle_t *)&c->watch))
        srv_watch_arm(c);
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
void srv_conn_send(tdd_conn *c, Tensordd__V1__Response *r, const void *payload, uint64_t plen,
                   tdd_storage *hold)
{
    bool pause = plen > 0;
    if (pause)
        c->paused++;
    send_packed(c, r, payload, plen, hold, pause);
}

void srv_conn_send_encoded(tdd_conn *c, const uint8_t *msg, size_t mlen, const void *payload,
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
void srv_conn_send_fd(tdd_conn *c, const uint8_t *msg, size_t mlen, int fd)
{
    size_t flen = TD_FRAME_HEADER_SIZE + mlen;
    write_req *wr = c->closing || !c->fd_passing ? NULL : calloc(1, sizeof *wr + flen);
    uv_pipe_t *p = wr ? malloc(sizeof *p) : NULL;
    if (!p || uv_pipe_init(srv.loop, p, 0) != 0) {
        free(p);
        free(wr);
        close(fd);
        if (!c->closing)
            out_of_memory(c, false);
        return;
    }
    if (uv_pipe_open(p, fd) != 0) {
        close(fd);
        uv_close((uv_handle_t *)p, srv_free_handle);
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
        c->wq_moved_ms = uv_now(srv.loop);
        c->wq_seen = 0;
    }
    c->wq_bytes += wr->total;
    if (c->wq_bytes > c->wq_peak)
        c->wq_peak = c->wq_bytes;
    tdd_stats.bytes_sent += flen;
    uv_buf_t b = uv_buf_init((char *)frame, (unsigned)flen);
    if (uv_write2(&wr->req, &c->h.stream, &b, 1, (uv_stream_t *)p, after_write) < 0) {
        c->wq_bytes -= wr->total;
        uv_close((uv_handle_t *)p, srv_free_handle);
        free(wr);
        srv_conn_close(c);
        return;
    }
    if (tdd_cfg.write_timeout_s && !uv_is_active((uv_handle_t *)&c->watch))
        srv_watch_arm(c);
}
