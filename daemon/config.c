/* config.c -- the daemon's options as data: one row each drives the defaults,
 * getopt, --help and the error text. */
#include "config.h"

#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "log.h"
#include "tensordd.h"

tdd_config tdd_cfg;

typedef enum {
    OPT_COUNT,   /* a plain integer */
    OPT_BYTES,   /* an integer with an optional K, M, G or T suffix (powers of 1024) */
    OPT_SECONDS, /* whole seconds */
    OPT_LISTEN,  /* repeatable endpoint */
    OPT_LOG,
    OPT_TOKEN,
    OPT_HELP,
    OPT_VERSION,
} opt_kind;

typedef struct {
    const char *name; /* --name; the config key is the same */
    const char *arg;  /* what --help shows for the value */
    opt_kind kind;
    size_t off, size; /* the tdd_config field (numeric kinds) */
    uint64_t def, min, max;
    const char *zero; /* what 0 means, when it is allowed and special */
    const char *help;
} option_row;

#define FIELD(f) offsetof(tdd_config, f), sizeof(((tdd_config *)0)->f)
#define NOFIELD 0, 0
#define K 1024ull
#define M (1024ull * K)
#define G (1024ull * M)

static const option_row rows[] = {
    {"listen", "ENDPOINT", OPT_LISTEN, NOFIELD, 0, 0, 0, NULL,
     "tcp://HOST:PORT or unix:///PATH (repeatable; default tcp://127.0.0.1:7070; port 0 "
     "picks a free one)"},
    {"cpu-devices", "N", OPT_COUNT, FIELD(cpu_devices), 1, 1, 16, NULL,
     "logical CPU devices cpu:0..N-1"},
    {"threads", "N", OPT_COUNT, FIELD(threads), 0, 0, 1024, "all cores",
     "threads for the cpu backend"},
    {"device-lanes", "N", OPT_COUNT, FIELD(device_lanes), 4, 1, 64, NULL,
     "worker queues per cpu/ref device: sessions are spread over them, so one session's big "
     "kernel does not hold up another's small ops (1: one queue, strict device order)"},
    {"sim-devices", "N", OPT_COUNT, FIELD(sim_devices), 0, 0, 16, NULL,
     "simulated discrete devices sim:0..N-1 with device memory and reference kernels, for "
     "tests"},
    {"emu-gpus", "N", OPT_COUNT, FIELD(emu_gpus), 0, 0, 64, "none",
     "emulated CUDA devices cuda:0..N-1 running the cuda backend's kernels on the CPU (only "
     "in the `make emu` build, build/emu/tensordd; other builds ignore it with a warning)"},
    {"emu-gpu-memory", "BYTES", OPT_BYTES, FIELD(emu_gpu_memory), 1 * G, 1 * M, 1024 * G, NULL,
     "memory of each emulated CUDA device"},
    {"log-level", "LEVEL", OPT_LOG, NOFIELD, 0, 0, 0, NULL, "error, warn, info (default), debug"},
    {"token-file", "PATH", OPT_TOKEN, NOFIELD, 0, 0, 0, NULL,
     "clients must send this token in Hello (first line of the file); required to listen "
     "beyond loopback"},
    {"max-frame", "BYTES", OPT_BYTES, FIELD(max_msg), 4 * M, K, G, NULL,
     "largest protobuf request"},
    {"max-payload", "BYTES", OPT_BYTES, FIELD(max_payload), 64 * G, 0, UINT64_MAX, NULL,
     "largest tensor payload"},
    {"max-handles", "N", OPT_COUNT, FIELD(max_handles), 1u << 20, 1, UINT64_MAX, NULL,
     "live handles per session"},
    {"max-id-runs", "N", OPT_COUNT, FIELD(max_id_runs), 1u << 16, 1, UINT64_MAX, NULL,
     "runs of consecutive handle ids a session may have used (ids are never reused)"},
    {"session-memory", "BYTES", OPT_BYTES, FIELD(session_memory), 0, 0, UINT64_MAX, "none",
     "memory quota per session (tensors, graph and bookkeeping)"},
    {"memory-cap", "BYTES", OPT_BYTES, FIELD(memory_cap), 0, 0, UINT64_MAX, "physical memory",
     "memory for the whole daemon"},
    {"pool-cap", "BYTES", OPT_BYTES, FIELD(pool_cap), 1 * G, 0, UINT64_MAX, "no caching",
     "freed tensor memory each device keeps for reuse (not charged to sessions; released "
     "first when the daemon nears --memory-cap)"},
    {"pool-trim", "SECS", OPT_SECONDS, FIELD(pool_trim_s), 2, 0, 86400, "never",
     "release the kept memory after this long without allocations"},
    {"max-inflight", "N", OPT_COUNT, FIELD(max_inflight), 4096, 1, 1u << 24, NULL,
     "queued requests per session before reading pauses"},
    {"max-sessions", "N", OPT_COUNT, FIELD(max_sessions), 1024, 1, 1u << 20, NULL,
     "concurrent sessions (connections past Hello)"},
    {"idle-timeout", "SECS", OPT_SECONDS, FIELD(idle_timeout_s), 0, 0, 86400 * 365, "never",
     "close sessions with no traffic either way and no work in flight this long"},
    {"hello-timeout", "SECS", OPT_SECONDS, FIELD(hello_timeout_s), 10, 0, 86400, "never",
     "close connections that have not completed Hello"},
    {"max-handshakes", "N", OPT_COUNT, FIELD(max_handshakes), 64, 1, 1u << 20, NULL,
     "connections before Hello; a new one past the limit drops the oldest"},
    {"poll-us", "USECS", OPT_COUNT, FIELD(poll_us), 100, 0, 1000000, "never",
     "after a request, keep polling the sockets this long before sleeping, so a client's "
     "next request finds the daemon awake (a sleeping vCPU took 50-80 us to wake on a "
     "shared VM)"},
    {"write-timeout", "SECS", OPT_SECONDS, FIELD(write_timeout_s), 20, 0, 86400, "never",
     "close connections whose replies make no progress (a client that stopped reading)"},
    {"max-write-queue", "BYTES", OPT_BYTES, FIELD(max_write_queue), 64 * M, 4 * K, UINT64_MAX, NULL,
     "replies queued per connection, with their bookkeeping, before it stops reading"},
    {"help", NULL, OPT_HELP, NOFIELD, 0, 0, 0, NULL, "this text"},
    {"version", NULL, OPT_VERSION, NOFIELD, 0, 0, 0, NULL, "the daemon's and protocol's versions"},
};
#define NROWS (sizeof rows / sizeof rows[0])
#define OPT_VAL0 256 /* getopt_long's values for the rows, clear of its '?' */

static void store(tdd_config *c, const option_row *r, uint64_t v)
{
    unsigned char *p = (unsigned char *)c + r->off;
    if (r->size == sizeof(uint64_t)) {
        memcpy(p, &v, sizeof v);
    } else { /* uint32_t and int fields: every row's max fits in 31 bits */
        uint32_t v32 = (uint32_t)v;
        memcpy(p, &v32, sizeof v32);
    }
}

void tdd_config_defaults(tdd_config *c)
{
    memset(c, 0, sizeof *c);
    for (size_t i = 0; i < NROWS; i++)
        if (rows[i].size)
            store(c, &rows[i], rows[i].def);
    c->max_numel = (int64_t)1 << 36; /* 256 GiB of f32 */
    c->shutdown_grace_s = 30;        /* above --write-timeout: a stuck reader cannot hold it */
}

/* 4194304 -> "4M" when it is a whole multiple. */
static const char *fmt_bytes(char *buf, size_t n, uint64_t v)
{
    static const char sfx[] = "TGMK";
    for (int i = 0; i < 4; i++) {
        uint64_t unit = 1ull << (10 * (4 - i));
        if (v && v % unit == 0) {
            snprintf(buf, n, "%" PRIu64 "%c", v / unit, sfx[i]);
            return buf;
        }
    }
    snprintf(buf, n, "%" PRIu64, v);
    return buf;
}

static const char *fmt_value(char *buf, size_t n, const option_row *r, uint64_t v)
{
    if (v == 0 && r->zero)
        return r->zero;
    if (r->kind == OPT_BYTES)
        return fmt_bytes(buf, n, v);
    snprintf(buf, n, "%" PRIu64, v);
    return buf;
}

/* Prints text from column 27, wrapped at word boundaries before column 80. */
static void print_wrapped(FILE *f, const char *text)
{
    const int width = 80 - 27;
    int col = 0;
    while (*text) {
        int w = (int)strcspn(text, " ");
        if (col && col + 1 + w > width) {
            fprintf(f, "\n%27s", "");
            col = 0;
        } else if (col) {
            fputc(' ', f);
            col++;
        }
        fprintf(f, "%.*s", w, text);
        col += w;
        text += w;
        while (*text == ' ')
            text++;
    }
    fputc('\n', f);
}

static void usage(FILE *f)
{
    fprintf(f, "usage: tensordd [options]\n"
               "Remote tensor execution daemon: runs tensor ops and backward passes for clients\n"
               "that hold handles to tensors living here.\n\n");
    for (size_t i = 0; i < NROWS; i++) {
        const option_row *r = &rows[i];
        char left[40], d[32], text[320];
        snprintf(left, sizeof left, "--%s%s%s", r->name, r->arg ? " " : "", r->arg ? r->arg : "");
        if (r->size)
            snprintf(text, sizeof text, "%s (default %s)", r->help,
                     fmt_value(d, sizeof d, r, r->def));
        else
            snprintf(text, sizeof text, "%s", r->help);
        fprintf(f, "  %-24s ", left);
        if (strlen(left) > 24)
            fprintf(f, "\n%27s", "");
        print_wrapped(f, text);
    }
    fprintf(f, "BYTES take K, M, G, T suffixes (powers of 1024).\n");
}

/* The accepted range in words, for the error text. */
static void describe_range(char *buf, size_t n, const option_row *r)
{
    char lo[32], hi[32];
    const char *what = r->kind == OPT_BYTES     ? "a size in bytes (K, M, G, T suffixes)"
                       : r->kind == OPT_SECONDS ? "whole seconds"
                                                : "an integer";
    fmt_value(lo, sizeof lo, r, r->min);
    if (r->min == 0 && r->zero)
        snprintf(lo, sizeof lo, "0 (%s)", r->zero);
    if (r->max == UINT64_MAX)
        snprintf(buf, n, "%s, at least %s", what, lo);
    else
        snprintf(buf, n, "%s from %s to %s", what, lo,
                 r->kind == OPT_BYTES ? fmt_bytes(hi, sizeof hi, r->max)
                                      : (snprintf(hi, sizeof hi, "%" PRIu64, r->max), hi));
}

static int parse_number(const char *s, bool suffix, uint64_t *out)
{
    if (!s[0] || s[0] < '0' || s[0] > '9')
        return -1;
    errno = 0;
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno)
        return -1;
    uint64_t mul = 1;
    if (suffix && *end) {
        const char *sfx = "KMGT", *p = strchr(sfx, *end == 'k' ? 'K' : *end);
        if (!p || !*p)
            return -1;
        mul = 1ull << (10 * (p - sfx + 1));
        end++;
    }
    if (*end || (v && mul > UINT64_MAX / v))
        return -1;
    *out = (uint64_t)v * mul;
    return 0;
}

/* Reads the first line of path as the token; refuses files others can read. */
static int read_token(tdd_config *c, const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        fprintf(stderr, "tensordd: cannot read --token-file %s: %s\n", path, strerror(errno));
        return -1;
    }
    struct stat sb;
    if (fstat(fileno(f), &sb) == 0 && (sb.st_mode & 077))
        fprintf(stderr, "tensordd: warning: %s is readable by group or others (chmod 600)\n", path);
    char line[sizeof c->token + 2];
    if (!fgets(line, sizeof line, f))
        line[0] = 0;
    fclose(f);
    size_t n = strcspn(line, "\r\n");
    if (n == 0 || n >= sizeof c->token) {
        fprintf(stderr,
                "tensordd: --token-file %s: the token must be 1..%zu bytes on its first line\n",
                path, sizeof c->token - 1);
        return -1;
    }
    memcpy(c->token, line, n);
    c->token[n] = 0;
    c->token_len = n;
    return 0;
}

int tdd_config_from_args(tdd_config *c, int argc, char **argv)
{
    struct option opts[NROWS + 1];
    for (size_t i = 0; i < NROWS; i++)
        opts[i] = (struct option){rows[i].name, rows[i].arg ? required_argument : no_argument, NULL,
                                  OPT_VAL0 + (int)i};
    opts[NROWS] = (struct option){0, 0, 0, 0};
    tdd_config_defaults(c);
    opterr = 0; /* our own messages, one per mistake */
    int o;
    while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        if (o < OPT_VAL0 || o >= OPT_VAL0 + (int)NROWS) {
            const char *bad = optind > 0 && optind <= argc ? argv[optind - 1] : "?";
            fprintf(stderr, "tensordd: unknown option or missing value: '%s' (see --help)\n", bad);
            return 2;
        }
        const option_row *r = &rows[o - OPT_VAL0];
        uint64_t v;
        switch (r->kind) {
        case OPT_LISTEN:
            if (c->nlisten == TDD_MAX_LISTEN) {
                fprintf(stderr, "tensordd: at most %d --listen\n", TDD_MAX_LISTEN);
                return 2;
            }
            c->listen[c->nlisten++] = optarg;
            break;
        case OPT_LOG:
            tdd_log_level = tdd_log_parse_level(optarg);
            if (tdd_log_level < 0) {
                fprintf(stderr,
                        "tensordd: bad value '%s' for --log-level: takes error, warn, "
                        "info or debug\n",
                        optarg);
                return 2;
            }
            break;
        case OPT_TOKEN:
            if (read_token(c, optarg))
                return 2;
            break;
        case OPT_HELP:
            usage(stdout);
            return 1;
        case OPT_VERSION:
            printf("tensordd %s (protocol %d)\n", TDD_VERSION, TD_PROTOCOL_VERSION);
            return 1;
        case OPT_COUNT:
        case OPT_BYTES:
        case OPT_SECONDS:
            if (parse_number(optarg, r->kind == OPT_BYTES, &v) || v < r->min || v > r->max) {
                char range[96];
                describe_range(range, sizeof range, r);
                fprintf(stderr, "tensordd: bad value '%s' for --%s: takes %s\n", optarg, r->name,
                        range);
                return 2;
            }
            store(c, r, v);
            break;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "tensordd: unexpected argument '%s' (see --help)\n", argv[optind]);
        return 2;
    }
    if (c->nlisten == 0)
        c->listen[c->nlisten++] = "tcp://127.0.0.1:7070";
    return 0;
}
