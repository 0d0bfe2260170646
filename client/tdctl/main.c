/* main.c -- tdctl, the operator's command line for a tensordd daemon. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "metrics.h"
#include "npy.h"
#include "progress.h"
#include "tensordd.h"

enum { EXIT_DAEMON = 1, EXIT_USAGE = 2, EXIT_CONNECT = 3 };

#define DEFAULT_ENDPOINT "tcp://127.0.0.1:7070"
#define MAX_INPUTS 16
#define MAX_ATTRS 32

typedef struct {
    const char *endpoint;
    const char *token_file;
    const char *ca_file, *cert, *key; /* tls:// endpoints */
    int no_verify;
    int timeout_ms;
    char token[1024];
    int json;
} global_opts;

/* ---------------------------------------------------------------- help */

static const char main_usage[] =
    "usage: tdctl [--endpoint E] [--token-file F] [--timeout MS] [TLS options]\n"
    "             SUBCOMMAND [ARGS]\n"
    "\n"
    "Subcommands:\n"
    "  devices    list the daemon's devices (backend:ordinal, name, memory)\n"
    "  ping       round-trip time statistics\n"
    "  stats      the daemon's counters (--json for scripts)\n"
    "  sessions   open sessions: peer, client, handles, memory\n"
    "  apply      run one op on .npy inputs and write the result as .npy\n"
    "\n"
    "Options:\n"
    "  --endpoint E     tcp://HOST:PORT, tls://HOST:PORT or unix:///PATH (default\n"
    "                   $TENSORDD_ENDPOINT, else " DEFAULT_ENDPOINT ")\n"
    "  --token-file F   read the daemon's auth token from F\n"
    "  --timeout MS     give up when the daemon is silent this long (default: wait)\n"
    "  --ca-file F      tls://: the CA certificates (PEM) the daemon's certificate\n"
    "                   must chain to (default: the system's)\n"
    "  --cert F         tls://: this client's certificate (PEM), for mutual TLS\n"
    "  --key F          tls://: its private key (PEM; default: in --cert's file)\n"
    "  --no-verify      tls://: do not check the daemon's certificate (testing only)\n"
    "  --help           this text; `tdctl SUBCOMMAND --help` for a subcommand\n"
    "  --version        tdctl's version (the project's, libtensordd's) and protocol\n"
    "\n"
    "Exit status: 0 ok, 1 the daemon answered an error, 2 usage or bad input file,\n"
    "3 cannot connect (or the connection was lost).\n";

static const char devices_usage[] = "usage: tdctl devices\n"
                                    "Lists every device the daemon serves: backend:ordinal, name,\n"
                                    "total and used memory.\n";
static const char ping_usage[] = "usage: tdctl ping [-n N]\n"
                                 "Sends N (default 10) empty round trips (Sync) and prints the\n"
                                 "min/median/max/mean round-trip time in microseconds.\n";
static const char stats_usage[] =
    "usage: tdctl stats [--json] [--metrics URL]\n"
    "Prints the daemon's counters: sessions, handles, tensors alive, bytes in/out,\n"
    "requests, errors by code name, memory per device. --json prints one JSON object.\n"
    "  --metrics URL   also the numbers only its metrics endpoint serves (the\n"
    "                  daemon's --metrics-listen, e.g. http://127.0.0.1:9470):\n"
    "                  requests by type, ops by name with mean latency, queue depth\n"
    "                  per device, sessions opened and failed authentications\n"
    "Per-session detail (peer, client, handles, memory) is `tdctl sessions`.\n";
static const char sessions_usage[] =
    "usage: tdctl sessions [--json]\n"
    "Lists the daemon's sessions (this one included): id, peer, client name,\n"
    "handles, bytes in use, requests.\n";
static const char apply_usage[] =
    "usage: tdctl apply OP IN.npy [IN2.npy ...] -o OUT.npy [--device D]\n"
    "                   [--attr KEY=VALUE ...]\n"
    "Uploads the inputs, runs OP (PyTorch's name: add, matmul, relu, sum, ...) on the\n"
    "daemon and downloads the result into OUT.npy.\n"
    "  --device D          where the inputs live (default cpu:0)\n"
    "  --attr KEY=VALUE    an op attribute: an int (2), a float (0.5), a bool\n"
    "                      (true/false), an int list (1,2) or a float list (0.5,1);\n"
    "                      anything else is sent as a string\n"
    ".npy support: format v1/v2/v3, C order, dtypes <f4 <f8 <f2 <i4 <i8 |b1.\n"
    "A progress bar is drawn on stderr for transfers over 8 MiB when it is a\n"
    "terminal.\n";

static int usage_error(const char *usage, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static int usage_error(const char *usage, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "tdctl: ");
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\n%s", usage);
    return EXIT_USAGE;
}

/* ---------------------------------------------------------------- errors */

static void print_shape(const int64_t *s, int n)
{
    fputc('[', stderr);
    for (int i = 0; i < n && i < TD_MAX_NDIM; i++)
        fprintf(stderr, "%s%" PRId64, i ? ", " : "", s[i]);
    fputc(']', stderr);
}

/* Prints "tdctl: CODE: message (detail)" and picks the exit status. */
static int report(const char *what, int rc, const td_error *e)
{
    fprintf(stderr, "tdctl: %s: %s", td_err_name(rc), e->message[0] ? e->message : td_strerror(rc));
    char a[40], b[40];
    switch (e->detail_kind) {
    case TD_DETAIL_DEVICES:
        td_device_format(&e->detail.devices.target, a, sizeof a);
        td_device_format(&e->detail.devices.grad, b, sizeof b);
        fprintf(stderr, " (%s vs %s)", a, b);
        break;
    case TD_DETAIL_SHAPES:
        fprintf(stderr, " (expected ");
        print_shape(e->detail.shapes.expected, e->detail.shapes.expected_ndim);
        fprintf(stderr, ", got ");
        print_shape(e->detail.shapes.got, e->detail.shapes.got_ndim);
        fputc(')', stderr);
        break;
    case TD_DETAIL_DTYPES:
        fprintf(stderr, " (%s vs %s)", td_dtype_name(e->detail.dtypes.target),
                td_dtype_name(e->detail.dtypes.grad));
        break;
    case TD_DETAIL_HANDLE:
        fprintf(stderr, " (handle %" PRIu64 ")", e->detail.handle.handle);
        break;
    case TD_DETAIL_POISONED:
        fprintf(stderr, " (from request %" PRIu64 ", %s)", e->detail.poisoned.origin_request,
                td_err_name(e->detail.poisoned.origin_code));
        break;
    case TD_DETAIL_ARGUMENT:
        fprintf(stderr, " (argument '%s')", e->detail.argument.argument);
        break;
    case TD_DETAIL_VERSION:
        fprintf(stderr, " (daemon speaks %u..%u)", e->detail.version.server_min,
                e->detail.version.server_max);
        break;
    default:
        break;
    }
    if (what)
        fprintf(stderr, " [%s]", what);
    fputc('\n', stderr);
    if (rc == TD_EIO || rc == TD_ETIMEOUT || rc == TD_ECLOSED)
        return EXIT_CONNECT;
    return EXIT_DAEMON;
}

/* ---------------------------------------------------------------- connecting */

static int read_token(global_opts *g)
{
    if (!g->token_file)
        return 0;
    FILE *f = fopen(g->token_file, "r");
    if (!f) {
        fprintf(stderr, "tdctl: cannot read token file %s: %s\n", g->token_file, strerror(errno));
        return EXIT_USAGE;
    }
    size_t n = fread(g->token, 1, sizeof g->token - 1, f);
    fclose(f);
    while (n && (g->token[n - 1] == '\n' || g->token[n - 1] == '\r' || g->token[n - 1] == ' '))
        n--;
    g->token[n] = 0;
    return 0;
}

static int open_client(global_opts *g, td_client **c)
{
    /* A malformed endpoint is the user's mistake (2), not a failed connect (3). */
    int tls = strncmp(g->endpoint, "tls://", 6) == 0;
    if (strncmp(g->endpoint, "tcp://", 6) != 0 && !tls && strncmp(g->endpoint, "unix://", 7) != 0) {
        fprintf(stderr,
                "tdctl: bad endpoint '%s': expected tcp://HOST:PORT, tls://HOST:PORT or "
                "unix:///PATH (see --help)\n",
                g->endpoint);
        return EXIT_USAGE;
    }
    /* An unreadable certificate file is the user's mistake too (2). */
    const char *files[3] = {g->ca_file, g->cert, g->key},
               *flags[3] = {"--ca-file", "--cert", "--key"};
    for (int i = 0; i < 3; i++)
        if (tls && files[i] && access(files[i], R_OK) != 0) {
            fprintf(stderr, "tdctl: cannot read %s %s: %s\n", flags[i], files[i], strerror(errno));
            return EXIT_USAGE;
        }
    if (!tls && (g->ca_file || g->cert || g->key || g->no_verify)) {
        fprintf(stderr,
                "tdctl: --ca-file, --cert, --key and --no-verify apply to tls:// "
                "endpoints, not '%s'\n",
                g->endpoint);
        return EXIT_USAGE;
    }
    int rc = read_token(g);
    if (rc)
        return rc;
    td_connect_opts o = {.token = g->token_file ? g->token : NULL,
                         .client_name = "tdctl",
                         .timeout_ms = g->timeout_ms};
    td_tls_opts t = {
        .ca_file = g->ca_file, .cert_file = g->cert, .key_file = g->key, .no_verify = g->no_verify};
    td_error e;
    rc = td_connect_tls(g->endpoint, &o, tls ? &t : NULL, c, &e);
    if (rc == 0)
        return 0;
    if (e.request_id) /* the daemon answered: version, token, ... */
        return report("connect", rc, &e);
    fprintf(stderr, "tdctl: cannot connect: %s\n", e.message);
    return EXIT_CONNECT;
}

/* Handles --endpoint/--token-file/--timeout and the TLS options wherever they appear; returns 1
 * if argv[*i] was one of them, -1 on a missing value. */
static int take_global(int argc, char **argv, int *i, global_opts *g)
{
    const char *a = argv[*i];
    const char **dst = NULL;
    const char *val = NULL;
    const char *names[] = {"--endpoint", "--token-file", "--timeout",
                           "--ca-file",  "--cert",       "--key"};
    int which = -1;
    if (strcmp(a, "--no-verify") == 0) {
        g->no_verify = 1;
        return 1;
    }
    for (int k = 0; k < 6; k++) {
        size_t l = strlen(names[k]);
        if (strncmp(a, names[k], l) == 0 && (a[l] == 0 || a[l] == '=')) {
            which = k;
            if (a[l] == '=')
                val = a + l + 1;
            break;
        }
    }
    if (which < 0)
        return 0;
    if (!val) {
        if (*i + 1 >= argc)
            return -1;
        val = argv[++*i];
    }
    if (which == 0)
        dst = &g->endpoint;
    else if (which == 1)
        dst = &g->token_file;
    else if (which >= 3)
        dst = which == 3 ? &g->ca_file : which == 4 ? &g->cert : &g->key;
    if (dst) {
        *dst = val;
    } else {
        char *end;
        long v = strtol(val, &end, 10);
        if (*end || v < 0 || v > 86400000)
            return -1;
        g->timeout_ms = (int)v;
    }
    return 1;
}

/* Common loop for subcommands whose only options are --help, --json and the globals. */
static int simple_args(int argc, char **argv, global_opts *g, const char *usage, int allow_json)
{
    for (int i = 1; i < argc; i++) {
        int t = take_global(argc, argv, &i, g);
        if (t < 0)
            return usage_error(usage, "missing or bad value for %s", argv[i]);
        if (t)
            continue;
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            fputs(usage, stdout);
            return -1;
        }
        if (allow_json && strcmp(argv[i], "--json") == 0) {
            g->json = 1;
            continue;
        }
        return usage_error(usage, "unexpected argument '%s'", argv[i]);
    }
    return 0;
}

/* ---------------------------------------------------------------- devices */

static void human(uint64_t b, char *buf, size_t len)
{
    const char *u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double v = (double)b;
    int k = 0;
    while (v >= 1024 && k < 4) {
        v /= 1024;
        k++;
    }
    snprintf(buf, len, k ? "%.1f %s" : "%.0f %s", v, u[k]);
}

static int cmd_devices(int argc, char **argv, global_opts *g)
{
    int rc = simple_args(argc, argv, g, devices_usage, 0);
    if (rc)
        return rc < 0 ? 0 : rc;
    td_client *c;
    if ((rc = open_client(g, &c)) != 0)
        return rc;
    td_device_info d[64];
    size_t n = 0;
    td_error e;
    rc = td_list_devices(c, d, 64, &n, &e);
    if (rc) {
        rc = report("devices", rc, &e);
        td_close(c);
        return rc;
    }
    printf("%-10s %-32s %12s %12s\n", "DEVICE", "NAME", "MEM_TOTAL", "MEM_USED");
    for (size_t i = 0; i < n && i < 64; i++) {
        char dev[40], tot[32], used[32];
        td_device_format(&d[i].device, dev, sizeof dev);
        human(d[i].memory_total, tot, sizeof tot);
        human(d[i].memory_used, used, sizeof used);
        printf("%-10s %-32s %12s %12s\n", dev, d[i].name, tot, used);
        if (d[i].failed)
            printf("%-10s FAILED: %s\n", "", d[i].status[0] ? d[i].status : "device fault");
    }
    if (td_server_note(c)[0])
        fprintf(stderr, "note: %s\n", td_server_note(c));
    td_close(c);
    return 0;
}

/* ---------------------------------------------------------------- ping */

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec * 1e-3;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static int cmd_ping(int argc, char **argv, global_opts *g)
{
    long n = 10;
    for (int i = 1; i < argc; i++) {
        int t = take_global(argc, argv, &i, g);
        if (t < 0)
            return usage_error(ping_usage, "missing or bad value for %s", argv[i]);
        if (t)
            continue;
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            fputs(ping_usage, stdout);
            return 0;
        }
        if (strcmp(argv[i], "-n") == 0 && i + 1 < argc) {
            char *end;
            n = strtol(argv[++i], &end, 10);
            if (*end || n < 1 || n > 10000000)
                return usage_error(ping_usage, "-n needs a count from 1 to 10000000, got '%s'",
                                   argv[i]);
            continue;
        }
        return usage_error(ping_usage, "unexpected argument '%s'", argv[i]);
    }
    td_client *c;
    int rc = open_client(g, &c);
    if (rc)
        return rc;
    double *t = malloc((size_t)n * sizeof *t);
    if (!t) {
        td_close(c);
        fprintf(stderr, "tdctl: out of memory\n");
        return EXIT_DAEMON;
    }
    td_error e;
    double sum = 0;
    for (long i = 0; i < n; i++) {
        double t0 = now_us();
        rc = td_ping(c, &e);
        t[i] = now_us() - t0;
        if (rc) {
            free(t);
            rc = report("ping", rc, &e);
            td_close(c);
            return rc;
        }
        sum += t[i];
    }
    qsort(t, (size_t)n, sizeof *t, cmp_double);
    double med = n % 2 ? t[n / 2] : (t[n / 2 - 1] + t[n / 2]) / 2;
    printf("%s: %ld round trips: min %.1f us, median %.1f us, max %.1f us, mean %.1f us\n",
           g->endpoint, n, t[0], med, t[n - 1], sum / (double)n);
    free(t);
    td_close(c);
    return 0;
}

/* ---------------------------------------------------------------- stats, sessions */

static void json_str(const char *s)
{
    putchar('"');
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\')
            printf("\\%c", ch);
        else if (ch < 0x20)
            printf("\\u%04x", ch);
        else
            putchar(ch);
    }
    putchar('"');
}

static int get_stats(global_opts *g, td_stats *s)
{
    td_client *c;
    int rc = open_client(g, &c);
    if (rc)
        return rc;
    td_error e;
    rc = td_stats_get(c, s, &e);
    if (rc)
        rc = report("stats", rc, &e);
    td_close(c);
    return rc;
}

/* Every session (td_stats_sessions: no limit on their number). */
typedef struct {
    td_session_info *v;
    size_t n;
} session_list;

static int get_sessions(global_opts *g, session_list *out)
{
    td_client *c;
    int rc = open_client(g, &c);
    if (rc)
        return rc;
    td_error e;
    size_t n = 0, cap = 0;
    out->v = NULL;
    /* sessions may open between the count and the list: a few tries, then what fits */
    for (int tries = 0; tries < 4; tries++) {
        if ((rc = td_stats_sessions(c, out->v, cap, sizeof *out->v, &n, &e)) != 0) {
            rc = report("stats", rc, &e);
            break;
        }
        if (n <= cap)
            break;
        free(out->v);
        cap = n + 16;
        if (!(out->v = calloc(cap, sizeof *out->v))) {
            fprintf(stderr, "tdctl: out of memory\n");
            rc = EXIT_DAEMON;
            break;
        }
    }
    out->n = n < cap ? n : cap;
    td_close(c);
    return rc;
}

static void print_sessions_json(const session_list *s)
{
    putchar('[');
    for (size_t i = 0; i < s->n; i++) {
        const td_session_info *x = &s->v[i];
        printf("%s{\"session_id\":%" PRIu64 ",\"peer\":", i ? "," : "", x->session_id);
        json_str(x->peer);
        printf(",\"client_name\":");
        json_str(x->client_name);
        printf(",\"handles\":%" PRIu64 ",\"bytes_in_use\":%" PRIu64 ",\"memory_limit\":%" PRIu64
               ",\"requests\":%" PRIu64 "}",
               x->handles, x->bytes_in_use, x->memory_limit, x->requests);
    }
    putchar(']');
}

/* The /metrics samples tdctl stats --metrics prints, in page order. */
#define MAX_SAMPLES 65536
typedef struct {
    char *page;
    tdctl_sample *v;
    size_t n;
} metrics_page;

static int fetch_metrics(const char *url, const global_opts *g, metrics_page *m)
{
    char err[300];
    size_t len;
    if (tdctl_http_get(url, g->timeout_ms ? g->timeout_ms : 10000, g->token_file ? g->token : NULL,
                       &m->page, &len, err, sizeof err)) {
        fprintf(stderr, "tdctl: stats --metrics: %s\n", err);
        return EXIT_CONNECT;
    }
    m->v = calloc(MAX_SAMPLES, sizeof *m->v);
    if (!m->v) {
        free(m->page);
        fprintf(stderr, "tdctl: out of memory\n");
        return EXIT_DAEMON;
    }
    char *cur = m->page;
    while (m->n < MAX_SAMPLES && tdctl_metric_next(&cur, &m->v[m->n]))
        m->n++;
    return 0;
}

static double metric(const metrics_page *m, const char *name)
{
    for (size_t i = 0; i < m->n; i++)
        if (strcmp(m->v[i].name, name) == 0)
            return m->v[i].value;
    return 0;
}

/* count and sum of op's latency histogram */
static void op_latency(const metrics_page *m, const char *op, double *count, double *sum)
{
    *count = *sum = 0;
    for (size_t i = 0; i < m->n; i++) {
        if (strcmp(tdctl_label(&m->v[i], "op"), op) != 0)
            continue;
        if (strcmp(m->v[i].name, "tensordd_op_duration_seconds_count") == 0)
            *count = m->v[i].value;
        else if (strcmp(m->v[i].name, "tensordd_op_duration_seconds_sum") == 0)
            *sum = m->v[i].value;
    }
}

static void print_metrics(const metrics_page *m, const session_list *ss, int json)
{
    const char *sep = "";
    if (json) {
        printf(",\"sessions_opened\":%.0f,\"auth_failures\":%.0f,\"requests_by_type\":{",
               metric(m, "tensordd_sessions_opened_total"),
               metric(m, "tensordd_auth_failures_total"));
        for (size_t i = 0; i < m->n; i++)
            if (strcmp(m->v[i].name, "tensordd_requests_total") == 0) {
                printf("%s", sep);
                json_str(tdctl_label(&m->v[i], "request"));
                printf(":%.0f", m->v[i].value);
                sep = ",";
            }
        printf("},\"ops\":{");
        sep = "";
        for (size_t i = 0; i < m->n; i++) {
            const tdctl_sample *s = &m->v[i];
            if (strcmp(s->name, "tensordd_ops_total") || strcmp(tdctl_label(s, "result"), "ok"))
                continue;
            const char *op = tdctl_label(s, "op");
            double errors = 0, count, sum;
            if (i + 1 < m->n && strcmp(m->v[i + 1].name, "tensordd_ops_total") == 0)
                errors = m->v[i + 1].value;
            op_latency(m, op, &count, &sum);
            printf("%s", sep);
            json_str(op);
            printf(":{\"ok\":%.0f,\"errors\":%.0f,\"latency_seconds_sum\":%.9f}", s->value, errors,
                   sum);
            sep = ",";
        }
        printf("},\"queue_depth\":{");
        sep = "";
        for (size_t i = 0; i < m->n; i++)
            if (strcmp(m->v[i].name, "tensordd_device_queue_depth") == 0) {
                printf("%s", sep);
                json_str(tdctl_label(&m->v[i], "device"));
                printf(":%.0f", m->v[i].value);
                sep = ",";
            }
        printf("},\"session_memory\":[");
        for (size_t i = 0; i < ss->n; i++) {
            printf("%s{\"session_id\":%" PRIu64 ",\"client_name\":", i ? "," : "",
                   ss->v[i].session_id);
            json_str(ss->v[i].client_name);
            printf(",\"bytes_in_use\":%" PRIu64 ",\"limit\":%" PRIu64 "}", ss->v[i].bytes_in_use,
                   ss->v[i].memory_limit);
        }
        printf("]");
        return;
    }
    printf("sessions_opened %.0f\n", metric(m, "tensordd_sessions_opened_total"));
    printf("auth_failures   %.0f\n", metric(m, "tensordd_auth_failures_total"));
    printf("requests by type:\n");
    for (size_t i = 0; i < m->n; i++)
        if (strcmp(m->v[i].name, "tensordd_requests_total") == 0)
            printf("  %-22s %.0f\n", tdctl_label(&m->v[i], "request"), m->v[i].value);
    printf("ops:%28s %10s %14s\n", "ok", "errors", "mean latency");
    for (size_t i = 0; i < m->n; i++) {
        const tdctl_sample *s = &m->v[i];
        if (strcmp(s->name, "tensordd_ops_total") || strcmp(tdctl_label(s, "result"), "ok"))
            continue;
        double errors = 0, count, sum;
        if (i + 1 < m->n && strcmp(m->v[i + 1].name, "tensordd_ops_total") == 0)
            errors = m->v[i + 1].value;
        op_latency(m, tdctl_label(s, "op"), &count, &sum);
        printf("  %-22s %10.0f %10.0f %11.1f us\n", tdctl_label(s, "op"), s->value, errors,
               count > 0 ? sum / count * 1e6 : 0.0);
    }
    printf("queue depth:\n");
    for (size_t i = 0; i < m->n; i++)
        if (strcmp(m->v[i].name, "tensordd_device_queue_depth") == 0)
            printf("  %-10s %.0f\n", tdctl_label(&m->v[i], "device"), m->v[i].value);
    printf("session memory:\n");
    for (size_t i = 0; i < ss->n; i++) {
        char a[32], l[32] = "no quota";
        human(ss->v[i].bytes_in_use, a, sizeof a);
        if (ss->v[i].memory_limit)
            human(ss->v[i].memory_limit, l, sizeof l);
        printf("  session %-8" PRIu64 " %-20s %12s of %s\n", ss->v[i].session_id,
               ss->v[i].client_name, a, l);
    }
}

static int cmd_stats(int argc, char **argv, global_opts *g)
{
    const char *metrics_url = NULL;
    for (int i = 1; i < argc; i++) {
        int t = take_global(argc, argv, &i, g);
        if (t < 0)
            return usage_error(stats_usage, "missing or bad value for %s", argv[i]);
        if (t)
            continue;
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            fputs(stats_usage, stdout);
            return 0;
        }
        if (strcmp(argv[i], "--json") == 0)
            g->json = 1;
        else if (strcmp(argv[i], "--metrics") == 0 && i + 1 < argc)
            metrics_url = argv[++i];
        else
            return usage_error(stats_usage, "unexpected argument '%s'", argv[i]);
    }
    static td_stats s;
    int rc;
    if ((rc = get_stats(g, &s)) != 0)
        return rc;
    metrics_page mp = {0};
    session_list ss = {0};
    if (metrics_url && (rc = fetch_metrics(metrics_url, g, &mp)) != 0)
        return rc;
    if ((rc = get_sessions(g, &ss)) != 0)
        return rc;
    char dev[40];
    if (g->json) {
        printf("{\"sessions\":%" PRIu64 ",\"handles\":%" PRIu64 ",\"tensors_alive\":%" PRIu64
               ",\"bytes_received\":%" PRIu64 ",\"bytes_sent\":%" PRIu64 ",\"requests\":%" PRIu64
               ",\"uptime_ms\":%" PRIu64 ",\"errors\":{",
               s.sessions, s.handles, s.tensors_alive, s.bytes_received, s.bytes_sent, s.requests,
               s.uptime_ms);
        int first = 1;
        for (int k = 1; k < TD_STATS_ERRORS; k++) {
            if (!s.errors[k])
                continue;
            printf("%s\"%s\":%" PRIu64, first ? "" : ",", td_err_name(-k), s.errors[k]);
            first = 0;
        }
        printf("},\"memory\":[");
        for (size_t i = 0; i < s.ndevices; i++) {
            td_device_format(&s.memory[i].device, dev, sizeof dev);
            printf("%s{\"device\":\"%s\",\"bytes_in_use\":%" PRIu64 ",\"peak_bytes\":%" PRIu64 "}",
                   i ? "," : "", dev, s.memory[i].bytes_in_use, s.memory[i].peak_bytes);
        }
        printf("],\"session_list\":");
        print_sessions_json(&ss);
        if (metrics_url)
            print_metrics(&mp, &ss, 1);
        printf("}\n");
        free(mp.page);
        free(mp.v);
        free(ss.v);
        return 0;
    }
    char a[32], b[32];
    printf("sessions        %" PRIu64 "\n", s.sessions);
    printf("handles         %" PRIu64 "\n", s.handles);
    printf("tensors_alive   %" PRIu64 "\n", s.tensors_alive);
    human(s.bytes_received, a, sizeof a);
    printf("bytes_received  %" PRIu64 " (%s)\n", s.bytes_received, a);
    human(s.bytes_sent, a, sizeof a);
    printf("bytes_sent      %" PRIu64 " (%s)\n", s.bytes_sent, a);
    printf("requests        %" PRIu64 "\n", s.requests);
    printf("uptime          %.1f s\n", (double)s.uptime_ms / 1000.0);
    printf("errors:\n");
    int any = 0;
    for (int k = 1; k < TD_STATS_ERRORS; k++) {
        if (!s.errors[k])
            continue;
        printf("  %-20s %" PRIu64 "\n", td_err_name(-k), s.errors[k]);
        any = 1;
    }
    if (!any)
        printf("  (none)\n");
    printf("memory:\n");
    for (size_t i = 0; i < s.ndevices; i++) {
        td_device_format(&s.memory[i].device, dev, sizeof dev);
        human(s.memory[i].bytes_in_use, a, sizeof a);
        human(s.memory[i].peak_bytes, b, sizeof b);
        printf("  %-10s in use %12s   peak %12s\n", dev, a, b);
    }
    if (metrics_url)
        print_metrics(&mp, &ss, 0);
    free(mp.page);
    free(mp.v);
    free(ss.v);
    return 0;
}

static int cmd_sessions(int argc, char **argv, global_opts *g)
{
    int rc = simple_args(argc, argv, g, sessions_usage, 1);
    if (rc)
        return rc < 0 ? 0 : rc;
    session_list s = {0};
    if ((rc = get_sessions(g, &s)) != 0)
        return rc;
    if (g->json) {
        print_sessions_json(&s);
        putchar('\n');
        free(s.v);
        return 0;
    }
    printf("%-8s %-28s %-20s %8s %12s %10s\n", "SESSION", "PEER", "CLIENT", "HANDLES", "BYTES",
           "REQUESTS");
    for (size_t i = 0; i < s.n; i++) {
        char b[32];
        human(s.v[i].bytes_in_use, b, sizeof b);
        printf("%-8" PRIu64 " %-28s %-20s %8" PRIu64 " %12s %10" PRIu64 "\n", s.v[i].session_id,
               s.v[i].peer, s.v[i].client_name, s.v[i].handles, b, s.v[i].requests);
    }
    free(s.v);
    return 0;
}

/* ---------------------------------------------------------------- apply */

typedef struct {
    td_attr attrs[MAX_ATTRS];
    size_t n;
    void *owned[MAX_ATTRS]; /* list storage */
} attr_set;

/* "k=v": bool, int, float, int list, float list, else string. */
static int parse_attr(char *kv, attr_set *as)
{
    char *eq = strchr(kv, '=');
    if (!eq || eq == kv || as->n == MAX_ATTRS)
        return -1;
    *eq = 0;
    const char *name = kv;
    char *v = eq + 1;
    td_attr *a = &as->attrs[as->n];
    if (strcmp(v, "true") == 0 || strcmp(v, "false") == 0) {
        *a = td_attr_bool(name, v[0] == 't');
    } else if (strchr(v, ',')) {
        /* a list: "1,2" (brackets tolerated: "[1,2]") */
        size_t len = strlen(v);
        if (v[0] == '[' && len >= 2 && v[len - 1] == ']') {
            v[len - 1] = 0;
            v++;
        }
        size_t cnt = 1;
        for (const char *p = v; *p; p++)
            cnt += *p == ',';
        int64_t *iv = calloc(cnt, sizeof *iv);
        double *fv = calloc(cnt, sizeof *fv);
        if (!iv || !fv) {
            free(iv);
            free(fv);
            return -1;
        }
        int all_int = 1;
        size_t k = 0;
        char *save = NULL;
        for (char *tok = strtok_r(v, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
            char *end;
            errno = 0;
            long long x = strtoll(tok, &end, 10);
            if (*end || errno) {
                all_int = 0;
                fv[k] = strtod(tok, &end);
                if (*end) {
                    free(iv);
                    free(fv);
                    return -1;
                }
            } else {
                iv[k] = x;
                fv[k] = (double)x;
            }
            k++;
        }
        if (all_int) {
            free(fv);
            as->owned[as->n] = iv;
            *a = td_attr_ints(name, iv, k);
        } else {
            free(iv);
            as->owned[as->n] = fv;
            *a = (td_attr){.name = name, .kind = TD_ATTR_FLOATS, .floats = fv, .n = k};
        }
    } else {
        char *end;
        errno = 0;
        long long x = strtoll(v, &end, 10);
        if (*v && !*end && !errno) {
            *a = td_attr_int(name, x);
        } else {
            double f = strtod(v, &end);
            if (*v && !*end)
                *a = td_attr_float(name, f);
            else
                *a = (td_attr){.name = name, .kind = TD_ATTR_STR, .s = v};
        }
    }
    as->n++;
    return 0;
}

static void attrs_free(attr_set *as)
{
    for (size_t i = 0; i < as->n; i++)
        free(as->owned[i]);
}

/* A write that could not complete: ENOSPC and EDQUOT are the machine's state, not the
 * user's input (exit 1, said plainly); anything else about the output path is exit 2. */
static int output_failed(const char *path, const char *what, int err)
{
    if (err == ENOSPC || err == EDQUOT) {
        fprintf(stderr, "tdctl: no space left to write %s (%s); nothing was written\n", path, what);
        return EXIT_DAEMON;
    }
    fprintf(stderr, "tdctl: cannot %s %s: %s\n", what, path, strerror(err));
    return EXIT_USAGE;
}

static int write_all(int fd, const uint8_t *p, size_t n)
{
    while (n) {
        ssize_t k = write(fd, p, n);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return k < 0 ? errno : EIO;
        p += k;
        n -= (size_t)k;
    }
    return 0;
}

/* Downloads h into path as a .npy. The bytes go to a temporary file beside path, renamed
 * over it only once everything is written, so a failure never leaves a partial output.
 * When the filesystem reserves the space up front (posix_fallocate), the daemon's bytes
 * land straight in the mapped file; otherwise, or if reserving fails for want of space,
 * nothing is mapped (a write to a mapping past the disk's end is a SIGBUS): the tensor is
 * downloaded to memory and written with write(2), whose ENOSPC is an error like any other. */
static int write_output(td_client *c, td_handle h, const char *path, progress_bar *pb)
{
    td_error e;
    td_tensor_info info;
    int rc = td_describe(c, h, &info, &e);
    if (rc)
        return report("apply", rc, &e);
    char hdr[1024], why[256];
    size_t hl =
        npy_make_header(info.dtype, info.ndim, info.shape, hdr, sizeof hdr, why, sizeof why);
    if (!hl) {
        fprintf(stderr, "tdctl: cannot write %s: %s\n", path, why);
        return EXIT_USAGE;
    }
    uint64_t bytes = td_dtype_size(info.dtype);
    for (int i = 0; i < info.ndim; i++)
        bytes *= (uint64_t)info.shape[i];
    char tmp[4096];
    const char *slash = strrchr(path, '/');
    int dl = slash ? (int)(slash - path + 1) : 0;
    if (snprintf(tmp, sizeof tmp, "%.*s.%s.tdctl-XXXXXX", dl, path, slash ? slash + 1 : path) >=
        (int)sizeof tmp) {
        fprintf(stderr, "tdctl: output path too long: %s\n", path);
        return EXIT_USAGE;
    }
    int fd = mkstemp(tmp);
    if (fd < 0)
        return output_failed(path, "create", errno);
    fchmod(fd, 0644);
    size_t total = hl + (size_t)bytes;
    int fa = total ? posix_fallocate(fd, 0, (off_t)total) : 0;
    uint8_t *m = MAP_FAILED, *buf = NULL;
    int werr = 0, frc = 0;
    if (fa == ENOSPC || fa == EDQUOT) {
        werr = fa;
    } else if (fa == 0 && total) {
        m = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    }
    if (!werr && m == MAP_FAILED && !(buf = malloc(total ? total : 1)))
        werr = ENOMEM;
    if (werr) {
        close(fd);
        unlink(tmp);
        return output_failed(path, "reserve space for", werr);
    }
    uint8_t *dst = m != MAP_FAILED ? m : buf;
    memcpy(dst, hdr, hl);
    progress_begin(pb, "download");
    rc = td_download(c, h, dst + hl, (size_t)bytes, NULL, &e);
    progress_end(pb);
    if (rc == 0) {
        if (m != MAP_FAILED)
            werr = msync(m, total, MS_SYNC) ? errno : 0;
        else
            werr = write_all(fd, buf, total);
        if (!werr && fsync(fd) != 0)
            werr = errno;
    }
    if (m != MAP_FAILED)
        munmap(m, total);
    free(buf);
    if (close(fd) != 0 && !werr && rc == 0)
        werr = errno;
    if (rc == 0 && werr)
        frc = output_failed(path, "write", werr);
    if (rc == 0 && !frc && rename(tmp, path) != 0)
        frc = output_failed(path, "rename the output to", errno);
    if (rc || frc)
        unlink(tmp);
    if (rc)
        return report("apply", rc, &e);
    return frc;
}

static int cmd_apply(int argc, char **argv, global_opts *g)
{
    const char *op = NULL, *out = NULL;
    const char *inputs[MAX_INPUTS];
    size_t nin = 0;
    td_device dev = {.backend = "cpu", .ordinal = 0};
    attr_set as = {.n = 0};
    int rc = 0;
    for (int i = 1; i < argc; i++) {
        int t = take_global(argc, argv, &i, g);
        if (t < 0) {
            rc = usage_error(apply_usage, "missing or bad value for %s", argv[i]);
            goto done;
        }
        if (t)
            continue;
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            fputs(apply_usage, stdout);
            goto done;
        } else if (strcmp(a, "-o") == 0 || strcmp(a, "--output") == 0) {
            if (i + 1 >= argc) {
                rc = usage_error(apply_usage, "%s needs a file name", a);
                goto done;
            }
            out = argv[++i];
        } else if (strcmp(a, "--device") == 0) {
            if (i + 1 >= argc || td_device_parse(argv[i + 1], &dev) != 0) {
                rc = usage_error(apply_usage, "--device needs BACKEND:ORDINAL, e.g. cpu:0");
                goto done;
            }
            i++;
        } else if (strcmp(a, "--attr") == 0) {
            if (i + 1 >= argc || parse_attr(argv[i + 1], &as) != 0) {
                rc = usage_error(apply_usage, "--attr needs KEY=VALUE, got '%s'",
                                 i + 1 < argc ? argv[i + 1] : "");
                goto done;
            }
            i++;
        } else if (a[0] == '-' && a[1]) {
            rc = usage_error(apply_usage, "unknown option '%s'", a);
            goto done;
        } else if (!op) {
            op = a;
        } else if (nin < MAX_INPUTS) {
            inputs[nin++] = a;
        } else {
            rc = usage_error(apply_usage, "at most 16 inputs");
            goto done;
        }
    }
    if (!op || !out) {
        rc = usage_error(apply_usage, "apply needs OP and -o OUT.npy");
        goto done;
    }

    /* Check every input before touching the daemon: a bad file is a usage error. */
    npy_array arr[MAX_INPUTS];
    size_t opened = 0;
    for (; opened < nin; opened++) {
        char why[256];
        if (npy_open(inputs[opened], &arr[opened], why, sizeof why) != 0) {
            fprintf(stderr, "tdctl: %s: %s\n", inputs[opened], why);
            rc = EXIT_USAGE;
            break;
        }
    }
    td_client *c = NULL;
    if (rc == 0)
        rc = open_client(g, &c);
    if (rc == 0) {
        progress_bar pb;
        progress_init(&pb);
        td_set_progress(c, progress_cb, &pb);
        td_handle hin[MAX_INPUTS], hout = 0;
        td_error e;
        for (size_t i = 0; i < nin && rc == 0; i++) {
            char label[64];
            snprintf(label, sizeof label, "upload %s", inputs[i]);
            progress_begin(&pb, label);
            int r = td_upload(c, &dev, arr[i].dtype, arr[i].ndim, arr[i].shape, arr[i].data, 0,
                              &hin[i], &e);
            progress_end(&pb);
            /* Sent: the pages can go. */
            npy_close(&arr[i]);
            if (r)
                rc = report("upload", r, &e);
        }
        if (rc == 0) {
            td_op_opts oo = {.device = &dev, .attrs = as.attrs, .nattrs = as.n};
            hout = td_op1(c, op, hin, nin, &oo, &e);
            if (!hout)
                rc = report(op, e.code, &e);
            /* The op's own verdict (e.g. SHAPE_MISMATCH), not a consumer's POISONED. */
            int r = rc ? 0 : td_sync(c, &e);
            if (r)
                rc = report(op, r, &e);
        }
        if (rc == 0)
            rc = write_output(c, hout, out, &pb);
        if (rc != EXIT_CONNECT) {
            td_release(c, hin, nin, NULL);
            if (hout)
                td_release(c, &hout, 1, NULL);
        }
        td_close(c);
    }
    for (size_t i = 0; i < opened; i++)
        npy_close(&arr[i]);
done:
    attrs_free(&as);
    return rc;
}

/* ---------------------------------------------------------------- main */

static const struct {
    const char *name;
    int (*fn)(int, char **, global_opts *);
} commands[] = {
    {"devices", cmd_devices},   {"ping", cmd_ping},   {"stats", cmd_stats},
    {"sessions", cmd_sessions}, {"apply", cmd_apply},
};

int main(int argc, char **argv)
{
    global_opts g = {.endpoint = getenv("TENSORDD_ENDPOINT")};
    if (!g.endpoint || !g.endpoint[0])
        g.endpoint = DEFAULT_ENDPOINT;
    int i = 1;
    for (; i < argc; i++) {
        int t = take_global(argc, argv, &i, &g);
        if (t < 0)
            return usage_error(main_usage, "missing or bad value for %s", argv[i]);
        if (t)
            continue;
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0 ||
            strcmp(argv[i], "help") == 0) {
            fputs(main_usage, stdout);
            return 0;
        }
        if (strcmp(argv[i], "--version") == 0 || strcmp(argv[i], "-V") == 0) {
            printf("tdctl %s (protocol %d)\n", td_version_string(), TD_PROTOCOL_VERSION);
            return 0;
        }
        if (argv[i][0] == '-')
            return usage_error(main_usage, "unknown option '%s'", argv[i]);
        break;
    }
    if (i >= argc)
        return usage_error(main_usage, "no subcommand");
    for (size_t k = 0; k < sizeof commands / sizeof commands[0]; k++)
        if (strcmp(argv[i], commands[k].name) == 0)
            return commands[k].fn(argc - i, argv + i, &g);
    return usage_error(main_usage, "unknown subcommand '%s'", argv[i]);
}
