/* server_tls.c -- a tls:// connection: ciphertext in and decrypted into the read
 * path, replies encrypted in chunks and queued on the socket. */
#include <stdlib.h>

#include "server_impl.h"

/* On a tls:// listener the socket carries ciphertext: reads are fed to the TLS session
 * (tls.c) and decrypted straight into where srv_conn_buffer says plaintext goes (a payload
 * lands in tensor memory as on plain TCP); replies are encrypted TLS_CHUNK at a time
 * as earlier ciphertext drains, so a download streams without a copy of the tensor.
 * Plain TCP and Unix sockets never come here. */
#define TLS_CHUNK (256u * 1024u)     /* plaintext encrypted per write */
#define TLS_INFLIGHT (1024u * 1024u) /* ciphertext queued on the socket before waiting */

typedef struct tls_chunk {
    uv_write_t req;
    tdd_conn *c;
    write_req *done; /* plaintext writes whose last byte is in this chunk */
    size_t len;
    max_align_t bytes[];
} tls_chunk;

/* The socket's shutdown, once the queued writes are out; where it cannot be started the
 * connection is closed. Returns whether it was started. */
bool srv_shutdown_socket(tdd_conn *c)
{
    uv_shutdown_t *req = malloc(sizeof *req);
    if (!req || uv_shutdown(req, &c->h.stream, srv_after_shutdown) < 0) {
        free(req);
        srv_conn_close(c);
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
    srv_tls_pump_out(c); /* the alert, if OpenSSL wrote one */
    srv_conn_shutdown(c);
}

static void finish_writes(write_req *done, int status)
{
    while (done) {
        write_req *next = done->next;
        srv_write_done(done, status);
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
        srv_tls_pump_out(c);
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
        srv_conn_close(c);
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
        srv_conn_close(c);
        return -1;
    }
    return 0;
}

/* Encrypts queued replies while little ciphertext waits on the socket; once the queue
 * is empty, a pending shutdown says close_notify and shuts the socket down. */
void srv_tls_pump_out(tdd_conn *c)
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
        srv_shutdown_socket(c);
    }
}

void srv_tls_enqueue(tdd_conn *c, write_req *wr)
{
    *c->tls_qtail = wr;
    c->tls_qtail = &wr->next;
    srv_tls_pump_out(c);
}

void srv_tls_on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    (void)suggested;
    tdd_conn *c = h->data;
    *buf = uv_buf_init(c->closing ? NULL : (char *)c->tls_rbuf, c->closing ? 0 : TLS_RBUF);
}

/* Decrypts what the TLS session holds while the connection wants to read. */
void srv_tls_pump_in(tdd_conn *c)
{
    if (c->tls_busy)
        return;
    c->tls_busy = true;
    while (!c->closing && c->reading) {
        uv_buf_t b;
        srv_conn_buffer(c, &b);
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
            srv_conn_received(c, &b, (size_t)n);
            continue;
        }
        if (n == TDD_TLS_WANT)
            break;
        c->tls_busy = false;
        if (n == TDD_TLS_EOF)
            srv_conn_shutdown(c); /* answered with our own close_notify */
        else
            tls_fail(c, tdd_tls_handshake_done(c->tls) ? "read" : "handshake");
        return;
    }
    c->tls_busy = false;
    srv_tls_pump_out(c); /* the handshake's answers */
}

void srv_tls_on_read(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf)
{
    tdd_conn *c = st->data;
    if (c->closing)
        return;
    if (nread <= 0) {
        srv_on_read(st, nread, buf);
        return;
    }
    if (!c->sniffed) {
        c->sniffed = true;
        if ((uint8_t)buf->base[0] != 0x16) {
            /* Not a ClientHello: a plaintext client (or anything else). A plaintext
             * tensordd client is answered in plaintext, so it can say why. */
            tdd_tls_free(c->tls);
            c->tls = NULL;
            srv_fail_protocol(c, TD_EPROTOCOL_ERROR,
                              "this listener speaks TLS: connect with tls://HOST:PORT");
            return;
        }
    }
    if (tdd_tls_feed(c->tls, buf->base, (size_t)nread)) {
        tls_fail(c, "read");
        return;
    }
    srv_tls_pump_in(c);
}
