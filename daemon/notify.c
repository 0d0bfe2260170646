/* notify.c -- the systemd side of start-up and shutdown: READY=1 once listening,
 * STATUS= with the session count, STOPPING=1 on drain (Type=notify); and the
 * listening sockets of socket activation. Without $NOTIFY_SOCKET and $LISTEN_FDS
 * every call does nothing. */
#include "notify.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <systemd/sd-daemon.h>

#include "conn.h"
#include "log.h"

static uv_timer_t status_timer;
static bool timer_open;
static uint32_t last_sessions = UINT32_MAX;

int tdd_notify_listen_fds(void)
{
    int n = sd_listen_fds(1); /* unsets LISTEN_FDS: children do not inherit them */
    if (n < 0)
        tdd_warn("socket activation: %s", "LISTEN_FDS is malformed; ignoring it");
    return n > 0 ? n : 0;
}

static void send_status(bool ready)
{
    uint32_t n = tdd_server_admitted();
    if (!ready && n == last_sessions)
        return;
    last_sessions = n;
    sd_notifyf(0, "%sSTATUS=serving %u session%s", ready ? "READY=1\n" : "", n, n == 1 ? "" : "s");
}

static void on_status(uv_timer_t *t)
{
    (void)t;
    send_status(false);
}

void tdd_notify_ready(uv_loop_t *loop)
{
    const char *ns = getenv("NOTIFY_SOCKET");
    if (!ns || !ns[0])
        return;
    send_status(true);
    uv_timer_init(loop, &status_timer);
    uv_timer_start(&status_timer, on_status, 2000, 2000);
    uv_unref((uv_handle_t *)&status_timer);
    timer_open = true;
}

void tdd_notify_stopping(void)
{
    if (timer_open)
        sd_notifyf(0, "STOPPING=1\nSTATUS=draining %u session%s", tdd_server_admitted(),
                   tdd_server_admitted() == 1 ? "" : "s");
}

void tdd_notify_close(void)
{
    if (timer_open && !uv_is_closing((uv_handle_t *)&status_timer))
        uv_close((uv_handle_t *)&status_timer, NULL);
}
