/* metrics.c -- Prometheus metrics (/metrics) and a health check (/healthz) over HTTP
 * (libmicrohttpd) on --metrics-listen, an address of their own: beyond loopback only
 * with a token (asked of /metrics as a bearer token) or --insecure, the tensor
 * listeners' rule. Labels are bounded (ops, devices, request types, error codes):
 * per-session detail is in the Stats request (tdctl stats), never a label.
 *
 * Threads: none of its own. MHD runs in external-polling mode on the daemon's loop
 * thread: its epoll descriptor is watched by a uv_poll and its timeouts by a uv_timer,
 * so a scrape reads the loop-owned counters, sessions and devices where they are
 * written, with no lock and nothing shared with another thread. A scrape's page is
 * built in one go (microseconds for a few thousand lines); sockets are non-blocking,
 * so a slow or stalled HTTP client costs a connection slot (--metrics-max-connections,
 * closed after --metrics-timeout idle), never the loop. */
#include "metrics.h"

#include <arpa/inet.h>
#include <inttypes.h>
#include <microhttpd.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "config.h"
#include "conn.h"
#include "device.h"
#include "exec.h"
#include "log.h"
#include "resume.h"
#include "session.h"
#include "stats.h"
#include "tensordd.h"
#include "tensordd.pb-c.h"

static struct MHD_Daemon *mhd;
static uv_poll_t poll_h;
static uv_timer_t timer_h;
static bool draining;
static bool exposed; /* bound beyond loopback */
static char url[96];
static double start_time_s; /* process start, seconds since the epoch */

/* ---- the page, grown as it is written */

typedef struct {
    char *p;
    size_t len, cap;
    bool oom;
} text;

static void put(text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(text *t, const char *fmt, ...)
{
    for (int tries = 0; tries < 2 && !t->oom; tries++) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(t->p ? t->p + t->len : NULL, t->p ? t->cap - t->len : 0, fmt, ap);
        va_end(ap);
        if (n < 0) {
            t->oom = true;
            return;
        }
        if (t->p && (size_t)n < t->cap - t->len) {
            t->len += (size_t)n;
            return;
        }
        size_t cap = t->cap ? t->cap : 16384;
        while (cap - t->len <= (size_t)n)
            cap *= 2;
        char *np = realloc(t->p, cap);
        if (!np) {
            t->oom = true;
            return;
        }
        t->p = np;
        t->cap = cap;
    }
}

/* A label value: backslash, double quote and newline escaped. */
static const char *label(char *buf, size_t n, const char *s)
{
    size_t k = 0;
    for (; *s && k + 3 < n; s++) {
        if (*s == '\\' || *s == '"') {
            buf[k++] = '\\';
            buf[k++] = *s;
        } else if (*s == '\n') {
            buf[k++] = '\\';
            buf[k++] = 'n';
        } else {
            buf[k++] = *s;
        }
    }
    buf[k] = 0;
    return buf;
}

static void head(text *t, const char *name, const char *type, const char *help)
{
    put(t, "# HELP tensordd_%s %s\n# TYPE tensordd_%s %s\n", name, help, name, type);
}

static const char *request_name(int body_case)
{
    const ProtobufCFieldDescriptor *f = protobuf_c_message_descriptor_get_field(
        &tensordd__v1__request__descriptor, (unsigned)body_case);
    return f ? f->name : "other";
}

/* The standard process_* series (client_golang's process collector), from /proc. */
static void render_process(text *t)
{
    unsigned long utime = 0, stime = 0;
    long rss_pages = 0;
    FILE *f = fopen("/proc/self/stat", "r");
    if (f) {
        char buf[1024];
        size_t n = fread(buf, 1, sizeof buf - 1, f);
        buf[n] = 0;
        fclose(f);
        const char *p = strrchr(buf, ')'); /* after the command name, which may hold spaces */
        if (p && sscanf(p + 2,
                        "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu %*d %*d %*d %*d "
                        "%*d %*d %*u %*u %ld",
                        &utime, &stime, &rss_pages) != 3)
            utime = stime = 0;
    }
    long hz = sysconf(_SC_CLK_TCK), page = sysconf(_SC_PAGESIZE);
    uint64_t fds = 0;
    uv_fs_t req;
    if (uv_fs_scandir(NULL, &req, "/proc/self/fd", 0, NULL) >= 0) {
        uv_dirent_t ent;
        while (uv_fs_scandir_next(&req, &ent) != UV_EOF)
            fds++;
    }
    uv_fs_req_cleanup(&req);
    struct rlimit rl;
    put(t,
        "# HELP process_cpu_seconds_total Total user and system CPU time spent in seconds.\n"
        "# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total %.2f\n",
        hz > 0 ? (double)(utime + stime) / (double)hz : 0.0);
    put(t,
        "# HELP process_resident_memory_bytes Resident memory size in bytes.\n"
        "# TYPE process_resident_memory_bytes gauge\nprocess_resident_memory_bytes %.0f\n",
        (double)rss_pages * (double)(page > 0 ? page : 4096));
    put(t,
        "# HELP process_open_fds Number of open file descriptors.\n"
        "# TYPE process_open_fds gauge\nprocess_open_fds %" PRIu64 "\n",
        fds > 0 ? fds - 1 : 0); /* less the one scandir read through */
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0)
        put(t,
            "# HELP process_max_fds Maximum number of open file descriptors.\n"
            "# TYPE process_max_fds gauge\nprocess_max_fds %.0f\n",
            rl.rlim_cur == RLIM_INFINITY ? 1e18 : (double)rl.rlim_cur);
    put(t,
        "# HELP process_start_time_seconds Start time of the process since unix epoch in "
        "seconds.\n# TYPE process_start_time_seconds gauge\nprocess_start_time_seconds %.3f\n",
        start_time_s);
}

static void render(text *t)
{
    char a[160];
    head(t, "up", "gauge", "1 while the daemon runs");
    put(t, "tensordd_up 1\n");
    head(t, "build_info", "gauge", "always 1; the labels say what runs");
    put(t, "tensordd_build_info{version=\"%s\",protocol=\"%d\"} 1\n", TDD_VERSION,
        TD_PROTOCOL_VERSION);
    head(t, "uptime_seconds", "gauge", "seconds since the daemon started");
    put(t, "tensordd_uptime_seconds %.3f\n",
        (double)(uv_now(uv_default_loop()) - tdd_stats.start_ms) / 1000.0);
    head(t, "accepting_sessions", "gauge",
         "1 while a new session would be served (listening, not draining, under "
         "--max-sessions counting sessions held for resume)");
    put(t, "tensordd_accepting_sessions %d\n", !draining && tdd_server_accepting());
    head(t, "sessions", "gauge", "sessions open (past Hello)");
    put(t, "tensordd_sessions %" PRIu32 "\n", tdd_server_admitted());
    head(t, "connections", "gauge", "connections open, sessions and those before Hello");
    put(t, "tensordd_connections %" PRIu64 "\n", tdd_nsessions);
    head(t, "sessions_max", "gauge", "--max-sessions");
    put(t, "tensordd_sessions_max %" PRIu32 "\n", tdd_cfg.max_sessions);
    head(t, "sessions_opened_total", "counter", "Hellos accepted");
    put(t, "tensordd_sessions_opened_total %" PRIu64 "\n", tdd_stats.sessions_opened);
    head(t, "auth_failures_total", "counter", "Hellos refused for a bad or missing token");
    put(t, "tensordd_auth_failures_total %" PRIu64 "\n", tdd_stats.auth_failures);

    uint64_t handles = 0;
    for (tdd_session *s = tdd_sessions; s; s = s->next)
        handles += s->nhandles;
    head(t, "resume_windows_held", "gauge",
         "sessions held without a connection, waiting to be resumed (they count against "
         "--max-sessions)");
    put(t, "tensordd_resume_windows_held %" PRIu32 "\n", tdd_resume_held());
    head(t, "handles", "gauge", "live handles, all sessions");
    put(t, "tensordd_handles %" PRIu64 "\n", handles);
    head(t, "tensors_alive", "gauge", "tensors alive, including those kept by autodiff graphs");
    put(t, "tensordd_tensors_alive %" PRIu64 "\n", tdd_values_alive());
    head(t, "bytes_received_total", "counter", "bytes read from clients");
    put(t, "tensordd_bytes_received_total %" PRIu64 "\n", tdd_stats.bytes_received);
    head(t, "bytes_sent_total", "counter", "bytes written to clients");
    put(t, "tensordd_bytes_sent_total %" PRIu64 "\n", tdd_stats.bytes_sent);

    head(t, "requests_total", "counter", "requests received, by type");
    for (int i = 0; i < TDD_REQ_KINDS; i++)
        if (tdd_stats.by_request[i])
            put(t, "tensordd_requests_total{request=\"%s\"} %" PRIu64 "\n", request_name(i),
                tdd_stats.by_request[i]);
    head(t, "errors_total", "counter", "requests that failed, by error code");
    for (int i = 1; i < TD_ERRNO_COUNT; i++)
        put(t, "tensordd_errors_total{code=\"%s\"} %" PRIu64 "\n", td_err_name(-i),
            tdd_stats.errors[i]);

    head(t, "ops_total", "counter", "tensor ops completed, by op and result");
    for (int op = 0; op < TDD_OP_COUNT; op++) {
        const tdd_op_counters *o = &tdd_stats.ops[op];
        if (!o->ok && !o->failed)
            continue;
        label(a, sizeof a, tdd_opdefs[op].name);
        put(t, "tensordd_ops_total{op=\"%s\",result=\"ok\"} %" PRIu64 "\n", a, o->ok);
        put(t, "tensordd_ops_total{op=\"%s\",result=\"error\"} %" PRIu64 "\n", a, o->failed);
    }
    head(t, "op_duration_seconds", "histogram",
         "tensor op latency, from submission to completion on the loop, by op");
    for (int op = 0; op < TDD_OP_COUNT; op++) {
        const tdd_op_counters *o = &tdd_stats.ops[op];
        uint64_t n = o->ok + o->failed, cum = 0;
        if (!n)
            continue;
        label(a, sizeof a, tdd_opdefs[op].name);
        for (int k = 0; k < TDD_LAT_BUCKETS; k++) {
            cum += o->buckets[k];
            put(t, "tensordd_op_duration_seconds_bucket{op=\"%s\",le=\"%g\"} %" PRIu64 "\n", a,
                (double)tdd_lat_bounds_ns[k] / 1e9, cum);
        }
        put(t, "tensordd_op_duration_seconds_bucket{op=\"%s\",le=\"+Inf\"} %" PRIu64 "\n", a, n);
        put(t, "tensordd_op_duration_seconds_sum{op=\"%s\"} %.9f\n", a, (double)o->sum_ns / 1e9);
        put(t, "tensordd_op_duration_seconds_count{op=\"%s\"} %" PRIu64 "\n", a, n);
    }

    int nd = tdd_device_count();
    head(t, "device_memory_bytes", "gauge", "tensor memory in use, by device");
    for (int i = 0; i < nd; i++) {
        const tdd_device *d = tdd_device_get(i);
        put(t, "tensordd_device_memory_bytes{device=\"%s\"} %" PRIu64 "\n",
            label(a, sizeof a, d->label), d->in_use);
    }
    head(t, "device_memory_peak_bytes", "gauge", "the most tensor memory in use, by device");
    for (int i = 0; i < nd; i++) {
        const tdd_device *d = tdd_device_get(i);
        put(t, "tensordd_device_memory_peak_bytes{device=\"%s\"} %" PRIu64 "\n",
            label(a, sizeof a, d->label), d->peak);
    }
    head(t, "device_queue_depth", "gauge", "tasks queued on the device's workers, not yet run");
    for (int i = 0; i < nd; i++) {
        const tdd_device *d = tdd_device_get(i);
        uint64_t depth = 0;
        for (int k = 0; k < d->nlanes; k++)
            depth += d->lanes[k] ? tdd_lane_depth(d->lanes[k]) : 0;
        put(t, "tensordd_device_queue_depth{device=\"%s\"} %" PRIu64 "\n",
            label(a, sizeof a, d->label), depth);
    }
    head(t, "memory_bytes", "gauge", "memory charged to sessions, whole daemon");
    put(t, "tensordd_memory_bytes %" PRIu64 "\n", tdd_memory_in_use());
    head(t, "memory_cap_bytes", "gauge", "--memory-cap (0: physical memory)");
    put(t, "tensordd_memory_cap_bytes %" PRIu64 "\n", tdd_cfg.memory_cap);

    uint64_t most_mem = 0, most_handles = 0;
    for (tdd_session *s = tdd_sessions; s; s = s->next) {
        uint64_t m = s->acct ? s->acct->in_use : 0;
        most_mem = m > most_mem ? m : most_mem;
        most_handles = s->nhandles > most_handles ? s->nhandles : most_handles;
    }
    head(t, "session_memory_max_bytes", "gauge",
         "the most memory one session has charged to its quota now (per session: tdctl stats)");
    put(t, "tensordd_session_memory_max_bytes %" PRIu64 "\n", most_mem);
    head(t, "session_memory_limit_bytes", "gauge",
         "--session-memory, the quota of sessions opened now (0: none)");
    put(t, "tensordd_session_memory_limit_bytes %" PRIu64 "\n", tdd_cfg.session_memory);
    head(t, "session_handles_max", "gauge", "the most live handles one session holds now");
    put(t, "tensordd_session_handles_max %" PRIu64 "\n", most_handles);
    render_process(t);
}

/* ---- HTTP */

static enum MHD_Result reply(struct MHD_Connection *conn, unsigned status, char *body, size_t len,
                             const char *type)
{
    struct MHD_Response *r = MHD_create_response_from_buffer(len, body, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, type);
    enum MHD_Result rc = MHD_queue_response(conn, status, r);
    MHD_destroy_response(r);
    return rc;
}

static enum MHD_Result reply_str(struct MHD_Connection *conn, unsigned status, const char *s)
{
    char *body = strdup(s);
    return body ? reply(conn, status, body, strlen(s), "text/plain; charset=utf-8") : MHD_NO;
}

/* The request carries "Authorization: Bearer <the token>" (compared in time that depends
 * only on the token's length), or no token is configured (--insecure). */
static bool bearer_ok(struct MHD_Connection *conn)
{
    if (!tdd_cfg.token_len)
        return true;
    const char *h =
        MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
    if (!h || strncmp(h, "Bearer ", 7))
        return false;
    h += 7;
    size_t n = strlen(h);
    unsigned diff = (unsigned)(n ^ tdd_cfg.token_len);
    for (size_t i = 0; i < tdd_cfg.token_len; i++)
        diff |= (unsigned)(uint8_t)(i < n ? h[i] : 0) ^ (uint8_t)tdd_cfg.token[i];
    return diff == 0;
}

static enum MHD_Result on_http(void *cls, struct MHD_Connection *conn, const char *path,
                               const char *method, const char *version, const char *upload,
                               size_t *upload_len, void **req_cls)
{
    (void)cls;
    (void)version;
    (void)upload;
    (void)req_cls;
    if (strcmp(method, "GET") && strcmp(method, "HEAD")) {
        *upload_len = 0;
        return reply_str(conn, MHD_HTTP_METHOD_NOT_ALLOWED, "only GET\n");
    }
    if (strcmp(path, "/metrics") == 0) {
        if (exposed && !bearer_ok(conn))
            return reply_str(conn, MHD_HTTP_UNAUTHORIZED,
                             "this endpoint is beyond loopback: send the daemon's token as "
                             "`Authorization: Bearer TOKEN`\n");
        text t = {0};
        render(&t);
        if (t.oom) {
            free(t.p);
            return reply_str(conn, MHD_HTTP_INTERNAL_SERVER_ERROR, "out of memory\n");
        }
        return reply(conn, MHD_HTTP_OK, t.p, t.len, "text/plain; version=0.0.4; charset=utf-8");
    }
    if (strcmp(path, "/healthz") == 0) {
        const char *why = draining ? "shutting down" : tdd_server_refusal();
        if (why) {
            char msg[160];
            snprintf(msg, sizeof msg, "not accepting sessions: %s\n", why);
            return reply_str(conn, MHD_HTTP_SERVICE_UNAVAILABLE, msg);
        }
        return reply_str(conn, MHD_HTTP_OK, "ok\n");
    }
    if (strcmp(path, "/livez") == 0) /* the loop answers: alive, whether or not it admits */
        return reply_str(conn, MHD_HTTP_OK, "alive\n");
    return reply_str(conn, MHD_HTTP_NOT_FOUND, "not found: try /metrics, /healthz or /livez\n");
}

static void on_timer(uv_timer_t *h);

/* Runs MHD on what is ready, then arms the timer for its next deadline, or for a
 * second from now when MHD names none: at its connection limit MHD takes its listening
 * socket out of its epoll set and puts it back only inside a later MHD_run, so once
 * its timeout closed those connections (leaving no deadline) nothing would make its
 * epoll descriptor readable again, and the endpoint would never answer again. */
static void run_mhd(void)
{
    MHD_run(mhd);
    MHD_UNSIGNED_LONG_LONG to;
    if (MHD_get_timeout(mhd, &to) != MHD_YES || to > 1000)
        to = 1000;
    uv_timer_start(&timer_h, on_timer, to, 0);
}

static void on_timer(uv_timer_t *h)
{
    (void)h;
    run_mhd();
}

static void on_poll(uv_poll_t *h, int status, int events)
{
    (void)h;
    (void)status;
    (void)events;
    run_mhd();
}

int tdd_metrics_start(uv_loop_t *loop, const char *hostport)
{
    char host[64];
    const char *colon = strrchr(hostport, ':');
    if (!colon || (size_t)(colon - hostport) >= sizeof host)
        return -1; /* config.c checked the form */
    memcpy(host, hostport, (size_t)(colon - hostport));
    host[colon - hostport] = 0;
    int port = atoi(colon + 1);
    struct sockaddr_storage ss;
    memset(&ss, 0, sizeof ss);
    bool v6 = host[0] == '[';
    if (v6) {
        host[strlen(host) - 1] = 0;
        if (uv_ip6_addr(host + 1, port, (struct sockaddr_in6 *)&ss))
            return -1;
    } else if (uv_ip4_addr(strcmp(host, "localhost") == 0 ? "127.0.0.1" : host, port,
                           (struct sockaddr_in *)&ss)) {
        return -1;
    }
    exposed = ss.ss_family == AF_INET
                  ? (ntohl(((struct sockaddr_in *)&ss)->sin_addr.s_addr) >> 24) != 127
                  : !IN6_IS_ADDR_LOOPBACK(&((struct sockaddr_in6 *)&ss)->sin6_addr);
    if (exposed && !tdd_cfg.token_len && !tdd_cfg.insecure) {
        tdd_error("cannot serve metrics on %s: an address beyond loopback needs a token "
                  "(--token-file; scrapers send it as a bearer token) or --insecure",
                  hostport);
        return -1;
    }
    if (exposed && !tdd_cfg.token_len)
        tdd_warn("INSECURE: metrics on %s without a token (--insecure): anyone who can reach "
                 "it reads them",
                 hostport);
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    start_time_s = (double)now.tv_sec + (double)now.tv_nsec / 1e9 -
                   (double)(uv_now(loop) - tdd_stats.start_ms) / 1000.0;
    mhd = MHD_start_daemon(MHD_USE_EPOLL | (v6 ? MHD_USE_IPv6 : 0), (uint16_t)port, NULL, NULL,
                           on_http, NULL, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&ss,
                           MHD_OPTION_CONNECTION_LIMIT, (unsigned)tdd_cfg.metrics_max_conns,
                           MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)tdd_cfg.metrics_timeout_s,
                           MHD_OPTION_END);
    if (!mhd) {
        tdd_error("cannot serve metrics on %s (in use, or not an address of this machine)",
                  hostport);
        return -1;
    }
    const union MHD_DaemonInfo *pi = MHD_get_daemon_info(mhd, MHD_DAEMON_INFO_BIND_PORT);
    const union MHD_DaemonInfo *ei = MHD_get_daemon_info(mhd, MHD_DAEMON_INFO_EPOLL_FD);
    if (!pi || !ei) {
        MHD_stop_daemon(mhd);
        mhd = NULL;
        tdd_error("metrics: libmicrohttpd gave no port or epoll descriptor");
        return -1;
    }
    uv_poll_init(loop, &poll_h, ei->epoll_fd);
    uv_poll_start(&poll_h, UV_READABLE, on_poll);
    uv_timer_init(loop, &timer_h);
    /* neither keeps the daemon running: they go with the loop's last session */
    uv_unref((uv_handle_t *)&poll_h);
    uv_unref((uv_handle_t *)&timer_h);
    snprintf(url, sizeof url, "http://%s%s%s:%u", v6 ? "[" : "", v6 ? host + 1 : host,
             v6 ? "]" : "", (unsigned)pi->port);
    tdd_info("metrics on %s/metrics, health on %s/healthz", url, url);
    if (!tdd_log_is_journal(STDOUT_FILENO)) {
        printf("metrics on %s/metrics\n", url);
        fflush(stdout);
    }
    return 0;
}

bool tdd_metrics_needs_token(void)
{
    return mhd && exposed;
}

void tdd_metrics_draining(void)
{
    draining = true;
}

void tdd_metrics_stop(void)
{
    if (!mhd)
        return;
    uv_close((uv_handle_t *)&poll_h, NULL);
    uv_close((uv_handle_t *)&timer_h, NULL);
    MHD_stop_daemon(mhd);
    mhd = NULL;
}
