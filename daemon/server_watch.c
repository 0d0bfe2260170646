/* server_watch.c -- the per-connection watchdog: Hello, idle and write timeouts, and
 * a peer gone while its request waits. */
#include <errno.h>
#include <sys/socket.h>

#include "server_impl.h"

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

void srv_watch_arm(tdd_conn *c)
{
    if (c->closing && uv_is_closing((uv_handle_t *)&c->watch))
        return;
    uint64_t now = uv_now(srv.loop), next = UINT64_MAX;
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
    uint64_t now = uv_now(srv.loop);
    unsigned long long sid = c->s ? (unsigned long long)c->s->id : 0;
    if (c->linger_ms && now >= c->linger_ms) {
        srv_conn_close(c);
        return;
    }
    if (!c->hello_done && tdd_cfg.hello_timeout_s &&
        now - c->opened_ms >= tdd_cfg.hello_timeout_s * 1000ull) {
        tdd_info("connection %llu sent no Hello within %us; closing", sid, tdd_cfg.hello_timeout_s);
        srv_conn_close(c);
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
            srv_conn_close(c);
            return;
        }
    }
    if (c->blocked && !c->closing && peer_gone(c)) {
        tdd_info("session %llu: the client went away while its request waited; closing", sid);
        srv_conn_close(c);
        return;
    }
    if (session_busy(c) || c->wq_bytes)
        c->active_ms = now;
    if (c->hello_done && tdd_cfg.idle_timeout_s &&
        now - c->active_ms >= tdd_cfg.idle_timeout_s * 1000ull) {
        tdd_info("session %llu idle for %us; closing", sid, tdd_cfg.idle_timeout_s);
        srv_conn_close(c);
        return;
    }
    srv_watch_arm(c);
}
