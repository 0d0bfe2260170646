/* main.c -- tensordd: flags, start-up, the loop, graceful shutdown. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>
#include <uv.h>

#include "autograd.h"
#include "config.h"
#include "conn.h"
#include "device.h"
#include "dispatch.h"
#include "exec.h"
#include "handlers.h"
#include "log.h"
#include "metrics.h"
#include "notify.h"
#include "stats.h"

static uv_signal_t sigterm, sigint, sigusr1, sighup;
static uv_timer_t grace;
static bool stopping;

/* Test hook, off unless TDD_TEST_STALL_MS is set: SIGUSR1 then holds the loop thread
 * that long, as a slow request would. Tests use it to put work between two loop
 * phases deterministically (a timer that fires with a read already waiting). */
static unsigned long test_stall_ms;

static void on_stall(uv_signal_t *h, int signum)
{
    (void)h;
    (void)signum;
    tdd_info("test hook: stalling the loop for %lu ms", test_stall_ms);
    struct timespec ts = {(time_t)(test_stall_ms / 1000), (long)(test_stall_ms % 1000) * 1000000};
    while (nanosleep(&ts, &ts) == -1 && errno == EINTR)
        ;
}

static void on_grace(uv_timer_t *t)
{
    (void)t;
    tdd_warn("shutdown grace period over; exiting with work still queued");
    exit(1);
}

static void on_signal(uv_signal_t *h, int signum)
{
    (void)h;
    if (stopping) {
        tdd_warn("second signal: exiting now");
        exit(1);
    }
    stopping = true;
    tdd_info("signal %d: finishing in-flight work", signum);
    tdd_metrics_draining();
    tdd_notify_stopping();
    tdd_server_shutdown();
    tdd_exec_drain();
    uv_signal_stop(&sigterm);
    uv_signal_stop(&sigint);
    uv_close((uv_handle_t *)&sigterm, NULL);
    uv_close((uv_handle_t *)&sigint, NULL);
    uv_close((uv_handle_t *)&sighup, NULL);
    if (test_stall_ms)
        uv_close((uv_handle_t *)&sigusr1, NULL);
    uv_timer_init(uv_default_loop(), &grace);
    uv_timer_start(&grace, on_grace, tdd_cfg.shutdown_grace_s * 1000ull, 0);
    uv_unref((uv_handle_t *)&grace);
}

/* SIGHUP: the configuration read again from the same file, environment and flags; what
 * may change while sessions run changes (the option table's [reload] column), the rest
 * is named as needing a restart. Sessions stay open: a new token or quota applies to
 * the Hellos and sessions that come after. */
static void on_reload(uv_signal_t *h, int signum)
{
    (void)h;
    (void)signum;
    static tdd_config next;
    if (tdd_config_reread(&next)) {
        tdd_error("SIGHUP: configuration not reloaded: it does not parse (the messages above); "
                  "the running one stays");
        return;
    }
    char why[700] = "", done[1024], restart[1024];
    if (next.token_len == 0 && tdd_cfg.token_len && !next.insecure &&
        (tdd_server_needs_token() || tdd_metrics_needs_token())) {
        tdd_error("SIGHUP: configuration not reloaded: the new one has no token, and a "
                  "listener beyond loopback without TLS needs one (--token-file, or "
                  "--insecure); the running one stays");
        return;
    }
    int tls = tdd_server_reload_tls(&next, why, sizeof why);
    if (tls < 0) {
        tdd_error("SIGHUP: configuration not reloaded: TLS: %s; the running one stays", why);
        return;
    }
    if (tls == 1) { /* no tls:// listener: its paths take a restart like the listeners */
        memcpy(next.tls_cert, tdd_cfg.tls_cert, sizeof next.tls_cert);
        memcpy(next.tls_key, tdd_cfg.tls_key, sizeof next.tls_key);
        memcpy(next.tls_client_ca, tdd_cfg.tls_client_ca, sizeof next.tls_client_ca);
    }
    tdd_config_update(&tdd_cfg, &next, done, sizeof done, restart, sizeof restart);
    tdd_info("SIGHUP: configuration reloaded from %s: %s%s; %llu session(s) kept open",
             tdd_cfg.config_file[0] ? tdd_cfg.config_file : "flags and environment",
             done[0] ? "changed " : "nothing changed", done,
             (unsigned long long)tdd_server_admitted());
    if (tls == 0)
        tdd_info("SIGHUP: TLS certificate and key read again for new connections");
    if (restart[0])
        tdd_warn("SIGHUP: changed but not applied, these need a restart: %s", restart);
}

/* After the loop thread was preempted (another thread wanted its CPU), it polls no
 * more for this long: on a machine whose cores are all busy, polling takes the core
 * the client or a device worker needs. */
#define POLL_BACKOFF_NS (20 * 1000 * 1000ull)

/* Whether polling now would take a core from someone: device work is in flight (its
 * workers need the cores, and its completion wakes the loop anyway), or the loop
 * thread was preempted less than POLL_BACKOFF_NS ago (getrusage's involuntary context
 * switches of this thread). */
static bool poll_would_steal(uint64_t now)
{
    static long nivcsw = -1;
    static uint64_t quiet_from;
    if (tdd_exec_pending())
        return true;
    struct rusage ru;
    if (getrusage(RUSAGE_THREAD, &ru) == 0 && ru.ru_nivcsw != nivcsw) {
        if (nivcsw >= 0)
            quiet_from = now + POLL_BACKOFF_NS;
        nivcsw = ru.ru_nivcsw;
    }
    return now < quiet_from;
}

/* Runs the loop until no handle is left. For --poll-us after each request the loop
 * polls (non-blocking) instead of sleeping in epoll_wait: a client's next request
 * then finds it awake. On a shared 2-vCPU VM a sleeping daemon took 50-80 us to wake,
 * 4x a raw TCP ping-pong (bench/archive/runs.md); an idle daemon still sleeps, and so does
 * one whose polling would take a core from someone (poll_would_steal). */
static void run_loop(uv_loop_t *loop)
{
    uint64_t poll_ns = tdd_cfg.poll_us * 1000ull, last = uv_hrtime();
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    if (poll_ns && cpus > 0 && (unsigned long)cpus < tdd_cfg.poll_min_cpus) {
        tdd_info("no polling after requests: %ld CPUs online, --poll-min-cpus is %u", cpus,
                 tdd_cfg.poll_min_cpus);
        poll_ns = 0;
    }
    for (;;) {
        uint64_t seen = tdd_stats.requests;
        if (!uv_run(loop, poll_ns ? UV_RUN_NOWAIT : UV_RUN_ONCE))
            break;
        if (!poll_ns)
            continue;
        uint64_t now = uv_hrtime();
        if (tdd_stats.requests != seen) {
            last = now;
            continue;
        }
        if (now - last < poll_ns && !poll_would_steal(now))
            continue;
        if (!uv_run(loop, UV_RUN_ONCE))
            break;
        last = uv_hrtime();
    }
}

int main(int argc, char **argv)
{
    int prc = tdd_config_from_args(&tdd_cfg, argc, argv);
    if (prc == 4) { /* --check-config: what a start would refuse, then the settings */
        char why[1200];
        if (tdd_server_check(&tdd_cfg, why, sizeof why)) {
            fprintf(stderr, "tensordd: %s\n", why);
            return 1;
        }
        tdd_config_print(&tdd_cfg);
        return 0;
    }
    if (prc)
        return prc == 1 ? 0 : prc == 3 ? 1 : 2;

    /* Socket activation (deploy/tensordd.socket): systemd's listening sockets replace
     * the configured ones, so one unit and config file serve both ways of starting. */
    static char inherited[TDD_MAX_LISTEN][16];
    int nfds = tdd_notify_listen_fds();
    if (nfds && !tdd_cfg.listen_default)
        tdd_info("socket activation: %d socket(s) from systemd replace the %d configured "
                 "listen endpoint(s)",
                 nfds, tdd_cfg.nlisten);
    if (nfds)
        tdd_cfg.nlisten = 0;
    for (int i = 0; i < nfds && tdd_cfg.nlisten < TDD_MAX_LISTEN; i++) {
        snprintf(inherited[i], sizeof inherited[i], "fd://%d", 3 + i);
        tdd_cfg.listen[tdd_cfg.nlisten++] = inherited[i];
    }

    if (tdd_cfg.chunk_growth != 8)
        tdd_warn("--chunk-growth is ignored: a kernel's pieces no longer grow while no other "
                 "session waits, so that results do not depend on the load (their size is "
                 "--chunk-elems)");

    /* A client that vanishes mid-write must cost a write error, not the daemon. */
    signal(SIGPIPE, SIG_IGN);

    if (tdd_dispatch_check_table())
        return 1;

    uv_loop_t *loop = uv_default_loop();
    tdd_stats.start_ms = uv_now(loop);
    if (tdd_exec_init(loop)) {
        tdd_error("cannot start the completion handle");
        return 1;
    }
    char note[256];
    if (tdd_devices_init(&tdd_cfg, note, sizeof note)) {
        tdd_error("cannot start the device workers");
        return 1;
    }
    tdd_hello_set_note(note);
    tdd_autograd_init();
    /* Signals before the listeners: a SIGTERM sent as soon as "listening on" is printed
     * must drain and stop the daemon, not kill it (libuv runs the handlers in the loop). */
    uv_signal_init(loop, &sigterm);
    uv_signal_init(loop, &sigint);
    uv_signal_start(&sigterm, on_signal, SIGTERM);
    uv_signal_start(&sigint, on_signal, SIGINT);
    uv_signal_init(loop, &sighup);
    uv_signal_start(&sighup, on_reload, SIGHUP);
    uv_unref((uv_handle_t *)&sighup); /* keeps no loop alive */
    const char *stall = getenv("TDD_TEST_STALL_MS");
    if (stall && (test_stall_ms = strtoul(stall, NULL, 10)) > 0) {
        uv_signal_init(loop, &sigusr1);
        uv_signal_start(&sigusr1, on_stall, SIGUSR1);
        uv_unref((uv_handle_t *)&sigusr1);
    }
    /* metrics first: a port in use stops the daemon before any socket file is made */
    if (tdd_cfg.metrics_listen[0] && tdd_metrics_start(loop, tdd_cfg.metrics_listen))
        return 1;
    if (tdd_server_start(loop, &tdd_cfg, tdd_dispatch))
        return 1;
    tdd_notify_ready(loop);

    run_loop(loop);

    tdd_metrics_stop();
    tdd_notify_close();
    tdd_devices_shutdown();
    tdd_exec_close();
    uv_run(loop, UV_RUN_DEFAULT);
    if (stopping && !uv_is_closing((uv_handle_t *)&grace))
        uv_close((uv_handle_t *)&grace, NULL);
    uv_run(loop, UV_RUN_DEFAULT);
    int rc = uv_loop_close(loop);
    if (rc)
        tdd_warn("loop closed with handles open: %s", uv_strerror(rc));
    tdd_info("stopped");
    return 0;
}
