/* server_conn.c -- a connection's life: accepted, admitted at Hello, shut down,
 * closed and freed. */
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>

#include "resume.h"
#include "server_impl.h"

/* A churn of short connections (5,000 junk TLS handshakes) grew the heap from 18 to
 * about 90 MB that glibc kept, free, in the middle of the heap (0.7 MB of it in use;
 * no leak: valgrind finds none, and malloc_trim gives it all back). A second after a
 * connection closed, the heap is trimmed: once per second of churn at most, and never
 * while nothing closes. */
#define TRIM_DELAY_MS 1000

static void on_trim(uv_timer_t *t)
{
    (void)t;
    malloc_trim(0);
}

static void after_close(uv_handle_t *h)
{
    tdd_conn *c = h->data;
    if (c->blocked)
        srv_request_free(c, c->blocked);
    srv_arena_destroy(c->arena);
    td_frame_parser_free(&c->fp);
    free(c->rbuf);
    srv_drop_fds(c, c->nfds);
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
    else if (srv.trim_armed && !uv_is_active((uv_handle_t *)&srv.trim_timer))
        uv_timer_start(&srv.trim_timer, on_trim, TRIM_DELAY_MS, 0);
    if (srv.shutting_down && !srv.conns) {
        for (int i = 0; i < srv.nlisteners; i++)
            if (!uv_is_closing(&srv.listeners[i].h.handle))
                uv_close(&srv.listeners[i].h.handle, NULL);
        srv_yield_close();
    }
}

static void watch_closed(uv_handle_t *h)
{
    tdd_conn *c = h->data;
    uv_close(&c->h.handle, after_close);
}

void srv_conn_close(tdd_conn *c)
{
    if (uv_is_closing(&c->h.handle) || uv_is_closing((uv_handle_t *)&c->watch))
        return;
    /* A connection lost (not one the daemon or a Goodbye is ending) may leave its session
     * held for resume. */
    bool lost = !c->closing && !c->draining && !srv.shutting_down;
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
        srv.n_admitted--;
    else
        srv.n_handshaking--;
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
        srv.conns = c->next;
    if (c->next)
        c->next->prev = c->prev;
    c->watch.data = c;
    /* uv_close waits for queued writes' callbacks (with UV_ECANCELED). A
     * reply-then-close (srv_fail_protocol) has its final error already in the
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
        srv_conn_close(st->data);
}

void srv_after_shutdown(uv_shutdown_t *req, int status)
{
    tdd_conn *c = req->data;
    free(req);
    if (status == 0 && c->tls_failed && !c->tls_dead && c->tls_rbuf &&
        uv_read_start(&c->h.stream, linger_alloc, linger_read) == 0) {
        c->reading = true;
        c->linger_ms = uv_now(srv.loop) + TLS_LINGER_MS;
        srv_watch_arm(c);
        return;
    }
    srv_conn_close(c);
}

/* Close once every queued response is written (reply-then-close). */
void srv_conn_shutdown(tdd_conn *c)
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
        srv_tls_pump_out(c);
        if (tdd_cfg.write_timeout_s && !c->tls_dead && !uv_is_active((uv_handle_t *)&c->watch))
            srv_watch_arm(c);
        return;
    }
    if (!srv_shutdown_socket(c))
        return;
    if (tdd_cfg.write_timeout_s && !uv_is_active((uv_handle_t *)&c->watch))
        srv_watch_arm(c); /* a shutdown behind writes that never drain is bounded too */
}

/* The one admission rule, for Hello (srv_conn_admit), /healthz and
 * tensordd_accepting_sessions alike: sessions past Hello and those held for resume
 * (each keeps its slot for its window) count against --max-sessions. */
bool srv_at_session_limit(void)
{
    return srv.n_admitted + tdd_resume_held() >= tdd_cfg.max_sessions;
}

int srv_conn_admit(tdd_conn *c, td_error *err)
{
    if (srv_at_session_limit()) {
        tdd_err_set(err, TD_ERESOURCE_EXHAUSTED, "the daemon serves %u sessions, its limit",
                    tdd_cfg.max_sessions);
        err->detail_kind = TD_DETAIL_RESOURCE;
        snprintf(err->detail.resource.resource, sizeof err->detail.resource.resource, "sessions");
        return err->code;
    }
    c->hello_done = true;
    srv.n_handshaking--;
    srv.n_admitted++;
    c->fp.lim.max_msg = tdd_cfg.max_msg;
    c->fp.lim.max_payload = tdd_cfg.max_payload;
    c->active_ms = uv_now(srv.loop);
    srv_watch_arm(c);
    return 0;
}

/* Connections before Hello are bounded: past --max-handshakes the oldest one is
 * dropped, so silent connects can neither exhaust the daemon nor keep a client
 * with the token out (it sends Hello at once and is never the oldest for long). */
static void drop_oldest_handshake(void)
{
    tdd_conn *oldest = NULL;
    for (tdd_conn *c = srv.conns; c; c = c->next)
        if (!c->hello_done && !c->closing)
            oldest = c; /* the list is newest first */
    if (oldest) {
        tdd_info("%u connections without Hello; dropping the oldest (%s)", srv.n_handshaking,
                 oldest->s ? oldest->s->peer : "?");
        srv_conn_close(oldest);
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

void srv_on_connection(uv_stream_t *server, int status)
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
        c->tls = tdd_tls_new(srv.tls_ctx);
        c->tls_rbuf = malloc(TLS_RBUF);
    }
    c->arena = srv_arena_new(); /* NULL: requests are unpacked with malloc */
    /* A Unix socket passes fds (memfd uploads, downloads as_fd) when --max-conn-fds allows:
     * libuv's IPC mode reads with recvmsg and keeps what came. */
    c->fd_passing = !is_tcp && !l->tls && tdd_cfg.max_conn_fds > 0;
    if (c->fd_passing && !(c->fds = calloc(tdd_cfg.max_conn_fds, sizeof *c->fds)))
        c->fd_passing = false;
    c->send_fd = srv_conn_send_fd;
    if (is_tcp)
        uv_tcp_init(srv.loop, &c->h.tcp);
    else
        uv_pipe_init(srv.loop, &c->h.pipe, c->fd_passing);
    c->h.handle.data = c;
    uv_timer_init(srv.loop, &c->watch);
    c->watch.data = c;
    c->opened_ms = c->active_ms = uv_now(srv.loop);
    if (srv.n_handshaking >= tdd_cfg.max_handshakes)
        drop_oldest_handshake();
    srv.n_handshaking++;
    c->next = srv.conns;
    if (srv.conns)
        srv.conns->prev = c;
    srv.conns = c;
    if (!c->rbuf || (l->tls && (!c->tls || !c->tls_rbuf)) || uv_accept(server, &c->h.stream) < 0) {
        srv_conn_close(c);
        return;
    }
    if (is_tcp)
        uv_tcp_nodelay(&c->h.tcp, 1);
    /* Before Hello: small messages and no payload (srv_conn_admit lifts both). */
    td_frame_limits lim = {.max_msg = tdd_cfg.max_msg < PREAUTH_MAX_MSG ? tdd_cfg.max_msg
                                                                        : PREAUTH_MAX_MSG,
                           .max_payload = 0};
    td_frame_parser_init(&c->fp, &lim);
    c->s = tdd_session_new(c);
    if (!c->s) {
        srv_conn_close(c);
        return;
    }
    peer_name(c, is_tcp, c->s->peer, sizeof c->s->peer);
    /* not a session yet: that is Hello's, once the token checks out */
    tdd_log_ctx prev;
    tdd_log_set_ctx((tdd_log_ctx){c->s->id, 0}, &prev);
    tdd_debug("connection %llu accepted from %s", (unsigned long long)c->s->id, c->s->peer);
    tdd_log_set_ctx(prev, NULL);
    srv_watch_arm(c);
    srv_start_reading(c);
}
