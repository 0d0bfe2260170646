/* config.c -- the daemon's options as data: one row each drives the defaults,
 * getopt, --help and the error text. */
#include "config.h"
#include "cidr.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <ini.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <uv.h>

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
    OPT_LOGFMT,   /* text or json */
    OPT_HOSTPORT, /* HOST:PORT on loopback, into a char[] field ("" = off) */
    OPT_PATH,     /* a string (a path, a group name) into a char[] field ("" = unset) */
    OPT_CIDRS,    /* ADDR[/BITS],... into a char[] field ("" = no address) */
    OPT_MODE,     /* file permission bits, in octal */
    OPT_FLAG,     /* takes no value on the command line; 1/0, true/false in a file */
    OPT_CONFIG,   /* commands and the config file's own path: flags only */
    OPT_CHECK,
    OPT_HELP,
    OPT_VERSION,
} opt_kind;

typedef struct {
    const char *name; /* --name; the config file's key and TENSORDD_NAME are derived from it */
    const char *arg;  /* what --help shows for the value */
    opt_kind kind;
    size_t off, size; /* the tdd_config field (numeric kinds) */
    uint64_t def, min, max;
    /* numeric kinds: what 0 means, when it is allowed and special; the others: their
     * default in words (--help ends each option's text with its default) */
    const char *zero;
    const char *help;
} option_row;

#define FIELD(f) offsetof(tdd_config, f), sizeof(((tdd_config *)0)->f)
#define NOFIELD 0, 0
#define K 1024ull
#define M (1024ull * K)
#define G (1024ull * M)

static const option_row rows[] = {
    {"listen", "ENDPOINT", OPT_LISTEN, NOFIELD, 0, 0, 0, "tcp://127.0.0.1:7070",
     "tcp://HOST:PORT, tls://HOST:PORT or unix:///PATH (repeatable; port 0 picks a free one)"},
    {"cpu-devices", "N", OPT_COUNT, FIELD(cpu_devices), 1, 1, 16, NULL,
     "logical CPU devices cpu:0..N-1"},
    {"threads", "N", OPT_COUNT, FIELD(threads), 0, 0, 1024, "all cores",
     "threads for the cpu backend"},
    {"device-lanes", "N", OPT_COUNT, FIELD(device_lanes), 4, 1, 64, NULL,
     "worker threads per cpu/ref/cuda device: sessions are spread over them, and each lane "
     "serves its sessions' queues in turn, so one session's work does not hold up another's"},
    {"worker-nice", "N", OPT_COUNT, FIELD(worker_nice), 10, 0, 19, "same as the loop",
     "nice value of the device workers and their compute threads, above the loop thread's: "
     "when every core is busy with kernels, the small requests the loop thread runs itself "
     "(and the clients on this host) get a core first"},
    {"chunk-elems", "N", OPT_COUNT, FIELD(chunk_elems), 512 * K, 0, 1u << 30, "never",
     "a cpu/ref kernel (matmul, bmm, linear, conv2d, elementwise) with a larger output "
     "runs in pieces of about this many elements (GEMMs: whole 64-row blocks), other "
     "sessions' work between them; the pieces depend on the shape and this value only"},
    {"chunk-growth", "N", OPT_COUNT, FIELD(chunk_growth), 8, 1, 1024, NULL,
     "ignored, kept so that older configurations start (pieces no longer grow while no "
     "session waits: that made results depend on other sessions)"},
    {"sim-devices", "N", OPT_COUNT, FIELD(sim_devices), 0, 0, 16, NULL,
     "simulated discrete devices sim:0..N-1 with device memory and reference kernels, for "
     "tests"},
    {"emu-gpus", "N", OPT_COUNT, FIELD(emu_gpus), 0, 0, 64, "none",
     "emulated CUDA devices cuda:0..N-1 running the cuda backend's kernels on the CPU (only "
     "in the `make emu` build, build/emu/tensordd; other builds ignore it with a warning)"},
    {"emu-gpu-memory", "BYTES", OPT_BYTES, FIELD(emu_gpu_memory), 1 * G, 1 * M, 1024 * G, NULL,
     "memory of each emulated CUDA device"},
    {"emu-sms", "N", OPT_COUNT, FIELD(emu_sms), 2, 1, 1024, NULL,
     "multiprocessors each emulated CUDA device reports, which sizes the cuda backend's grids "
     "(132 as an H200)"},
    {"cuda-streams", "N", OPT_COUNT, FIELD(cuda_streams), 8, 1, 64, NULL,
     "CUDA streams per GPU for sessions' work: each session issues on a stream of its own "
     "(made at its first use of the GPU, destroyed when it ends), so sessions' kernels may "
     "overlap; sessions beyond N share them round robin"},
    {"cuda-tf32", NULL, OPT_FLAG, FIELD(cuda_tf32), 0, 0, 1, "off",
     "float32 GEMMs on cuda (matmul, bmm, linear, conv2d) in TF32 on the tensor cores "
     "(inputs rounded to 10 mantissa bits, sums in float32), as PyTorch's "
     "torch.backends.cuda.matmul.allow_tf32; off: full float32. float16 and bfloat16 GEMMs "
     "always sum in float32"},
    {"log-level", "LEVEL", OPT_LOG, NOFIELD, 0, 0, 0, "info", "error, warn, info or debug"},
    {"log-format", "FORMAT", OPT_LOGFMT, NOFIELD, 0, 0, 0, "text",
     "text or json (one object per line: ts, level, msg, conn, session); with "
     "stderr on the journal each line starts with its syslog priority <N>"},
    {"metrics-listen", "HOST:PORT", OPT_HOSTPORT, FIELD(metrics_listen), 0, 0, 0, "off",
     "serve Prometheus metrics (/metrics) and /healthz over HTTP on this address, e.g. "
     "127.0.0.1:9470 or 0.0.0.0:9470; as for --listen, an address beyond loopback needs a "
     "token (--token-file; scrapers then send it as `Authorization: Bearer TOKEN` for "
     "/metrics, /healthz stays open to probes) or --insecure"},
    {"metrics-max-connections", "N", OPT_COUNT, FIELD(metrics_max_conns), 16, 1, 1024, NULL,
     "HTTP connections --metrics-listen serves at once; more wait in the listen queue"},
    {"metrics-timeout", "SECS", OPT_SECONDS, FIELD(metrics_timeout_s), 10, 1, 3600, NULL,
     "close a metrics connection idle this long (a client that sent half a request)"},
    {"unix-mode", "MODE", OPT_MODE, FIELD(unix_mode), 0600, 0, 0777, NULL,
     "permission bits of unix:// sockets, in octal (0660: the group may connect too)"},
    {"unix-group", "GROUP", OPT_PATH, FIELD(unix_group), 0, 0, 0, "the daemon's own group",
     "group of unix:// sockets, a name or a number"},
    {"tls-cert", "PATH", OPT_PATH, FIELD(tls_cert), 0, 0, 0, "none",
     "certificate chain (PEM) of tls:// listeners (TLS 1.2 and 1.3 only)"},
    {"tls-key", "PATH", OPT_PATH, FIELD(tls_key), 0, 0, 0, "none", "its private key (PEM)"},
    {"tls-client-ca", "PATH", OPT_PATH, FIELD(tls_client_ca), 0, 0, 0,
     "no client certificate asked for",
     "CA certificates (PEM): tls:// clients must present a certificate one of them signed "
     "(mutual TLS)"},
    {"insecure", NULL, OPT_FLAG, FIELD(insecure), 0, 0, 1, "off",
     "allow a listener beyond loopback with neither TLS nor a token (logged as a warning)"},
    {"token-file", "PATH", OPT_TOKEN, NOFIELD, 0, 0, 0, "none: sessions need no token",
     "clients must send this token in Hello (the file's one line of text; a file others may "
     "read, a symbolic link, a NUL or line break inside are refused); required to listen "
     "beyond loopback"},
    {"max-frame", "BYTES", OPT_BYTES, FIELD(max_msg), 4 * M, K, G, NULL,
     "largest protobuf request"},
    {"max-payload", "BYTES", OPT_BYTES, FIELD(max_payload), 64 * G, 0, UINT64_MAX, NULL,
     "largest tensor payload"},
    {"max-handles", "N", OPT_COUNT, FIELD(max_handles), 1u << 20, 1, UINT64_MAX, NULL,
     "live handles per session"},
    {"max-id-runs", "N", OPT_COUNT, FIELD(max_id_runs), 1u << 16, 1, UINT64_MAX, NULL,
     "runs of consecutive handle ids a session may have used (ids are never reused)"},
    {"max-graph-bytes", "BYTES", OPT_BYTES, FIELD(max_graph_bytes), 16 * M, K, G, NULL,
     "requests one recorded graph (GraphBegin .. GraphEnd) may hold, packed"},
    {"replay-slice", "BYTES", OPT_BYTES, FIELD(replay_slice), 64 * K, 1, 16 * M, NULL,
     "recorded requests (packed) a Replay runs per turn of the daemon's loop before the "
     "other connections are served; a replay also waits, as reading does, while its "
     "session has --max-inflight requests queued"},
    {"session-memory", "BYTES", OPT_BYTES, FIELD(session_memory), 0, 0, UINT64_MAX, "none",
     "memory quota per session (tensors, graph and bookkeeping)"},
    {"memory-cap", "BYTES", OPT_BYTES, FIELD(memory_cap), 0, 0, UINT64_MAX, "physical memory",
     "memory for the whole daemon"},
    {"pool-cap", "BYTES", OPT_BYTES, FIELD(pool_cap), 1 * G, 0, UINT64_MAX, "no caching",
     "freed tensor memory each device keeps for reuse (not charged to sessions; released "
     "first when the daemon nears --memory-cap)"},
    {"pool-trim", "SECS", OPT_SECONDS, FIELD(pool_trim_s), 2, 0, 86400, "never",
     "release the kept memory after this long without allocations"},
    {"trim-released", "BYTES", OPT_BYTES, FIELD(trim_released), 32 * M, 0, UINT64_MAX, "never",
     "when the handles and sessions released since the last peak held this much bookkeeping "
     "(about 500 bytes a handle, 16 KiB a session), every device's kept memory and the "
     "heap's free pages go back to the system, on the pools' own threads"},
    {"max-inflight", "N", OPT_COUNT, FIELD(max_inflight), 4096, 1, 1u << 24, NULL,
     "queued requests per session before reading pauses"},
    {"max-sessions", "N", OPT_COUNT, FIELD(max_sessions), 1024, 1, 1u << 20, NULL,
     "concurrent sessions (connections past Hello)"},
    {"idle-timeout", "SECS", OPT_SECONDS, FIELD(idle_timeout_s), 0, 0, 86400 * 365, "never",
     "close sessions with no traffic either way and no work in flight this long"},
    {"hello-timeout", "SECS", OPT_SECONDS, FIELD(hello_timeout_s), 10, 0, 86400, "never",
     "close connections that have not completed Hello"},
    {"max-resume-window", "SECS", OPT_SECONDS, FIELD(max_resume_window_s), 60, 0, 86400, "off",
     "hold a session whose connection dropped for the window its client asked for in Hello, "
     "at most this long, so that a new connection can resume it (still charged to quotas)"},
    {"max-handshakes", "N", OPT_COUNT, FIELD(max_handshakes), 64, 1, 1u << 20, NULL,
     "connections before Hello; a new one past the limit drops the oldest"},
    {"poll-us", "USECS", OPT_COUNT, FIELD(poll_us), 100, 0, 1000000, "never",
     "after a request, keep polling the sockets this long before sleeping, so a client's "
     "next request finds the daemon awake (a sleeping vCPU took 50-80 us to wake on a "
     "shared VM); not while device work is in flight (its workers need the cores) nor for "
     "20 ms after the loop thread was preempted (the cores are all busy: polling would take "
     "one from the client)"},
    {"poll-min-cpus", "N", OPT_COUNT, FIELD(poll_min_cpus), 1, 0, 4096, NULL,
     "--poll-us only on machines with at least this many online CPUs (on an idle 2-vCPU VM "
     "polling cut a small round trip from ~95 to ~30 us, where a sleeping vCPU is slow to "
     "wake; under load the preemption rule already stops it: bench/archive/latency.md)"},
    {"inline-work", "N", OPT_COUNT, FIELD(inline_work), 65536, 0, 1u << 24, "never",
     "an op on a host-memory device whose lane is idle runs on the loop thread, not its "
     "worker, when its work is at most this many element passes (a matmul's multiply-adds "
     "count 1/32, an nn op's elements 16): two thread wake-ups cost more than that"},
    {"write-timeout", "SECS", OPT_SECONDS, FIELD(write_timeout_s), 20, 0, 86400, "never",
     "close connections whose replies make no progress (a client that stopped reading)"},
    {"max-write-queue", "BYTES", OPT_BYTES, FIELD(max_write_queue), 64 * M, 4 * K, UINT64_MAX, NULL,
     "replies queued per connection, with their bookkeeping, before it stops reading"},
    {"max-conn-fds", "N", OPT_COUNT, FIELD(max_conn_fds), 8, 0, 253, "no fd passing",
     "file descriptors (memfd uploads) a Unix-socket connection may have sent and the daemon "
     "not yet taken; more is a protocol error that closes the connection"},
    {"max-memfd-keep", "N", OPT_COUNT, FIELD(max_memfd_keep), 256, 0, 1u << 20, "none",
     "memfds of uploaded tensors kept open daemon-wide, so that a download hands the same "
     "memfd back without a copy; past it a memfd is closed once mapped and its tensor's "
     "downloads are copied"},
    {"memfd-storage-min", "BYTES", OPT_BYTES, FIELD(memfd_storage_min), 0, 0, UINT64_MAX, "never",
     "once a Unix-socket session has sent or asked for a memfd, its cpu tensors of this many "
     "bytes and more (4 MiB at least) are made in memfds of the daemon's own, which a download "
     "as an fd then seals and hands over without a copy (a later in-place update of the "
     "tensor copies the pages it writes); off by default: where shmem has no huge pages, a "
     "kernel writing fresh 4 KiB shmem pages costs more than the copy saved "
     "(bench/archive/transfers.md)"},
    {"max-memfd-storage", "N", OPT_COUNT, FIELD(max_memfd_storage), 256, 0, 1u << 20, "none",
     "memfds holding tensors (memfd-storage-min) daemon-wide, each an open file; past it "
     "tensors are made in anonymous memory and their downloads copied"},
    {"group-store-dir", "PATH", OPT_PATH, FIELD(group_store_dir), 0, 0, 0, "groups off",
     "process groups meet in directories under it (Gloo's FileStore; shared by the "
     "ranks' daemons: one host, or a shared filesystem)"},
    {"group-address", "ADDR", OPT_PATH, FIELD(group_address), 0, 0, 0, "127.0.0.1",
     "the address this daemon's process-group peers connect to (unauthenticated Gloo "
     "TCP: a private network only)"},
    {"group-timeout", "SECS", OPT_SECONDS, FIELD(group_timeout_s), 60, 1, 86400, NULL,
     "a process group's rendezvous, and each collective, fail with TIMEOUT after this"},
    {"group-max-ranks", "N", OPT_COUNT, FIELD(group_max_ranks), 256, 1, 65536, NULL,
     "largest world size of a process group (each rank keeps a connection to every other)"},
    {"group-max-inflight", "N", OPT_COUNT, FIELD(group_max_inflight), 64, 1, 65536, NULL,
     "process-group requests (GroupCreate, GroupConnect, collectives) in flight at once, "
     "daemon-wide: each waits for its peers on a thread of its own, never on a device's "
     "worker, and past this many is RESOURCE_EXHAUSTED"},
    {"group-bucket-bytes", "BYTES", OPT_BYTES, FIELD(group_bucket_bytes), 32 * M, 4 * K, 4 * G,
     NULL, "an all-reduce packs tensors into buckets of at most this size"},
    {"transfer-window", "SECS", OPT_SECONDS, FIELD(transfer_window_s), 10, 1, 600, NULL,
     "a daemon-to-daemon transfer capability (TransferAccept) expires this long after it was "
     "issued"},
    {"transfer-timeout", "SECS", OPT_SECONDS, FIELD(transfer_timeout_s), 30, 1, 86400, NULL,
     "a push to another daemon (TransferSend) fails with TIMEOUT when its connection makes "
     "no progress this long"},
    {"max-transfers", "N", OPT_COUNT, FIELD(max_transfers), 256, 1, 65536, NULL,
     "transfer capabilities outstanding at once, daemon-wide"},
    {"max-session-transfers", "N", OPT_COUNT, FIELD(max_session_transfers), 16, 1, 65536, NULL,
     "transfer capabilities one session may hold outstanding (issued, neither spent nor "
     "expired); a session's are forgotten when it ends"},
    {"transfer-ca", "PATH", OPT_PATH, FIELD(transfer_ca), 0, 0, 0, "the system's",
     "CA certificates (PEM) a push to a tls:// daemon checks its certificate against"},
    {"transfer-peers", "ADDR[/BITS],...", OPT_CIDRS, FIELD(transfer_peers), 0, 0, 0,
     "none: pushes are off",
     "the addresses a push to another daemon (TransferSend) may connect to, e.g. "
     "10.0.0.0/8,fd00::/8 (0.0.0.0/0,::/0: any), so that a client holding the token cannot "
     "make the daemon reach other hosts"},
    {"config", "PATH", OPT_CONFIG, NOFIELD, 0, 0, 0, TDD_CONFIG_DEFAULT " when it exists",
     "read options from this INI file (a missing PATH is an error): one `key = value` line "
     "per option, keys named as the long options here; flags override the environment, "
     "which overrides the file; SIGHUP reads it again (the options marked [reload] change, "
     "the others need a restart)"},
    {"check-config", NULL, OPT_CHECK, NOFIELD, 0, 0, 0, NULL,
     "validate the configuration, print the effective one and exit (0 valid, 1 not)"},
    {"help", NULL, OPT_HELP, NOFIELD, 0, 0, 0, NULL, "this text"},
    {"version", NULL, OPT_VERSION, NOFIELD, 0, 0, 0, NULL, "the daemon's and protocol's versions"},
};
#define NROWS (sizeof rows / sizeof rows[0])

/* The options SIGHUP changes while sessions stay open (main.c's on_reload): logging, the
 * token, the TLS files (new connections), the quotas of sessions opened after it. The
 * others take a restart. */
static const char *const reloadable[] = {
    "log-level",     "log-format",  "token-file",     "tls-cert",    "tls-key",
    "tls-client-ca", "max-handles", "session-memory", "max-id-runs", "max-sessions",
};

static bool is_reloadable(const option_row *r)
{
    for (size_t i = 0; i < sizeof reloadable / sizeof reloadable[0]; i++)
        if (strcmp(reloadable[i], r->name) == 0)
            return true;
    return false;
}

/* The command line, kept for SIGHUP (tdd_config_reread reads the same sources again). */
static int saved_argc;
static char **saved_argv;
static bool rereading;
#define OPT_VAL0 256 /* getopt_long's values for the rows, clear of its '?' */

static bool is_number(const option_row *r)
{
    return r->kind == OPT_COUNT || r->kind == OPT_BYTES || r->kind == OPT_SECONDS;
}

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
        if (is_number(&rows[i]) || rows[i].kind == OPT_MODE || rows[i].kind == OPT_FLAG)
            store(c, &rows[i], rows[i].def);
    c->max_numel = (int64_t)1 << 36; /* 256 GiB of f32 */
    c->log_level = TDD_LOG_INFO;
    c->shutdown_grace_s = 30; /* above --write-timeout: a stuck reader cannot hold it */
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
    if (r->kind == OPT_MODE) {
        snprintf(buf, n, "%04" PRIo64, v);
        return buf;
    }
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

static const option_row *find_row(const char *name)
{
    for (size_t i = 0; i < NROWS; i++)
        if (strcmp(rows[i].name, name) == 0)
            return &rows[i];
    return NULL;
}

/* ---- the environment: the few settings containers pass that way */

static const char *const env_options[] = {"listen", "token-file", "metrics-listen", "log-format"};
#define NENV (sizeof env_options / sizeof env_options[0])

/* "token-file" -> "TENSORDD_TOKEN_FILE" */
static void env_name(char *buf, size_t n, const char *opt)
{
    int k = snprintf(buf, n, "TENSORDD_");
    for (const char *p = opt; *p && (size_t)k + 1 < n; p++)
        buf[k++] = *p == '-' ? '_' : (char)(*p >= 'a' && *p <= 'z' ? *p - 'a' + 'A' : *p);
    buf[k] = 0;
}

static bool is_command(const option_row *r)
{
    return r->kind == OPT_CHECK || r->kind == OPT_HELP || r->kind == OPT_VERSION;
}

/* An option's --help text: its help, "[reload]" when SIGHUP changes it, and its default,
 * last (the man page is made from this text). */
static const char *help_text(const option_row *r)
{
    static char text[2048];
    char d[64];
    const char *def =
        is_number(r) || r->kind == OPT_MODE ? fmt_value(d, sizeof d, r, r->def) : r->zero;
    int n = snprintf(text, sizeof text, "%s%s", r->help, is_reloadable(r) ? " [reload]" : "");
    if (def && !is_command(r))
        snprintf(text + n, sizeof text - (size_t)n, " (default %s)", def);
    return text;
}

static void usage(FILE *f)
{
    fprintf(f, "usage: tensordd [options]\n"
               "Remote tensor execution daemon: runs tensor ops and backward passes for clients\n"
               "that hold handles to tensors living here.\n\n");
    for (size_t i = 0; i < NROWS; i++) {
        const option_row *r = &rows[i];
        char left[40];
        snprintf(left, sizeof left, "--%s%s%s", r->name, r->arg ? " " : "", r->arg ? r->arg : "");
        if (strlen(left) > 24)
            fprintf(f, "  %s\n%27s", left, "");
        else
            fprintf(f, "  %-24s ", left);
        print_wrapped(f, help_text(r));
    }
    fprintf(f, "Options marked [reload] take a new value on SIGHUP (sessions stay open;\n"
               "quotas apply to sessions opened after it); the others need a restart.\n");
    fprintf(f, "BYTES take K, M, G, T suffixes (powers of 1024).\n\n"
               "Environment (flags override it; it overrides the config file):\n");
    for (size_t i = 0; i < NENV; i++) {
        char name[64], text[96];
        env_name(name, sizeof name, env_options[i]);
        snprintf(text, sizeof text, "as --%s%s", env_options[i],
                 find_row(env_options[i])->kind == OPT_LISTEN
                     ? "; several endpoints separated by spaces or commas"
                     : "");
        fprintf(f, "  %-24s ", name);
        print_wrapped(f, text);
    }
    fprintf(f, "  %-24s ", "CREDENTIALS_DIRECTORY");
    print_wrapped(f, "systemd's LoadCredential=: its file `token` is the token when no token "
                     "file is set");
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

/* Where a value came from, for its error message: "--max-frame", "TENSORDD_LISTEN" or
 * "/etc/tensordd/tensordd.conf:12: key 'max-frame'". */
typedef struct {
    const char *file; /* NULL: a flag or the environment */
    const char *env;  /* the variable's name, or NULL */
    int line;
} origin;

static void say_where(char *buf, size_t n, const origin *o, const option_row *r)
{
    if (o->file)
        snprintf(buf, n, "%s:%d: key '%s'", o->file, o->line, r->name);
    else if (o->env)
        snprintf(buf, n, "%s", o->env);
    else
        snprintf(buf, n, "--%s", r->name);
}

/* Reads the token: the whole file, less its final line break (\n or \r\n). Refuses,
 * with the fix in words, what would silently make another token or expose it: a
 * symbolic link (another file than the one named could be read), anything but a
 * regular file, a file others may read or write, a control byte (NUL, a line break)
 * inside, an empty token and one too long. */
static int read_token(tdd_config *c, const char *path, const char *where)
{
    int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) {
        if (errno == ELOOP)
            fprintf(stderr,
                    "tensordd: %s: token file %s is a symbolic link: name the file itself "
                    "(in Kubernetes, mount the secret's key with subPath)\n",
                    where, path);
        else
            fprintf(stderr, "tensordd: %s: cannot read token file %s: %s\n", where, path,
                    strerror(errno));
        return -1;
    }
    struct stat sb;
    char buf[sizeof c->token + 2];
    ssize_t n = -1;
    const char *bad = NULL;
    if (fstat(fd, &sb))
        bad = strerror(errno);
    else if (!S_ISREG(sb.st_mode))
        bad = "not a regular file: write the token into a file of its own";
    else if (sb.st_mode & 007)
        bad = "others may read or write it: chmod 600 it (or 640 with a group of the "
              "daemon's)";
    else if ((n = read(fd, buf, sizeof buf)) < 0)
        bad = strerror(errno);
    close(fd);
    if (!bad && (sb.st_mode & 070))
        fprintf(stderr, "tensordd: warning: token file %s is readable by its group (chmod 600)\n",
                path);
    size_t len = n > 0 ? (size_t)n : 0;
    if (!bad && len == sizeof buf)
        bad = "too long";
    if (!bad && len && buf[len - 1] == '\n')
        len -= len >= 2 && buf[len - 2] == '\r' ? 2 : 1;
    size_t at = 0;
    while (!bad && at < len && (unsigned char)buf[at] >= 0x20 && buf[at] != 0x7f)
        at++;
    char why[160];
    if (!bad && at < len) {
        snprintf(why, sizeof why,
                 "byte %zu is %s (0x%02x): a token is one line of text, e.g. made by "
                 "`head -c 32 /dev/urandom | base64`",
                 at,
                 buf[at] == 0      ? "a NUL"
                 : buf[at] == '\n' ? "a line break"
                                   : "a control byte",
                 (unsigned char)buf[at]);
        bad = why;
    }
    if (!bad && (len == 0 || len >= sizeof c->token)) {
        snprintf(why, sizeof why, "the token must be 1..%zu bytes on one line",
                 sizeof c->token - 1);
        bad = why;
    }
    if (bad) {
        fprintf(stderr, "tensordd: %s: token file %s: %s\n", where, path, bad);
        return -1;
    }
    if (strlen(path) >= sizeof c->token_file) {
        fprintf(stderr, "tensordd: %s: token file path too long\n", where);
        return -1;
    }
    memcpy(c->token, buf, len);
    c->token[len] = 0;
    c->token_len = len;
    snprintf(c->token_file, sizeof c->token_file, "%s", path);
    return 0;
}

/* HOST:PORT or [V6]:PORT, an IP address or localhost, port 0..65535 (0 picks one). */
static int check_hostport(const char *v, char *why, size_t n)
{
    const char *colon = strrchr(v, ':');
    char host[64];
    if (!colon || colon == v || (size_t)(colon - v) >= sizeof host) {
        snprintf(why, n, "takes HOST:PORT, e.g. 127.0.0.1:9470");
        return -1;
    }
    memcpy(host, v, (size_t)(colon - v));
    host[colon - v] = 0;
    if (host[0] == '[') {
        size_t hl = strlen(host);
        if (hl < 3 || host[hl - 1] != ']') {
            snprintf(why, n, "takes HOST:PORT, e.g. 127.0.0.1:9470 or [::1]:9470");
            return -1;
        }
        memmove(host, host + 1, hl - 2);
        host[hl - 2] = 0;
    }
    uint64_t port;
    if (parse_number(colon + 1, false, &port) || port > 65535) {
        snprintf(why, n, "the port must be 0..65535");
        return -1;
    }
    struct sockaddr_in a4;
    struct sockaddr_in6 a6;
    if (strcmp(host, "localhost") && uv_ip4_addr(host, 0, &a4) && uv_ip6_addr(host, 0, &a6)) {
        snprintf(why, n, "'%s' is not an IP address (nor localhost)", host);
        return -1;
    }
    return 0; /* beyond loopback: metrics.c asks for a token or --insecure */
}

/* Keeps listen values from the file and the environment alive for the process. */
static char *keep(const char *s)
{
    char *d = strdup(s);
    if (!d)
        fprintf(stderr, "tensordd: out of memory\n");
    return d;
}

/* Sets one option from a flag, the environment or the file; prints the error and
 * returns -1 on a bad value. src orders the sources of a repeatable option: the first
 * --listen of a higher source replaces what a lower one set. */
static int apply(tdd_config *c, const option_row *r, const char *val, const origin *o, int src)
{
    static int listen_src;
    char where[512], range[320];
    if (r->kind == OPT_LISTEN && rereading)
        return 0; /* the listeners keep running: tdd_config_reread leaves them out */
    say_where(where, sizeof where, o, r);
    uint64_t v;
    switch (r->kind) {
    case OPT_LISTEN: {
        static char *kept[TDD_MAX_LISTEN]; /* the copies made here (flags are argv's) */
        if (src != listen_src) {
            for (int k = 0; k < c->nlisten; k++) {
                free(kept[k]);
                kept[k] = NULL;
            }
            c->nlisten = 0;
            listen_src = src;
        }
        if (c->nlisten == TDD_MAX_LISTEN) {
            fprintf(stderr, "tensordd: %s: at most %d listen endpoints\n", where, TDD_MAX_LISTEN);
            return -1;
        }
        if (src != 3 && !(val = kept[c->nlisten] = keep(val)))
            return -1;
        c->listen[c->nlisten++] = val;
        return 0;
    }
    case OPT_LOG:
        if ((c->log_level = tdd_log_parse_level(val)) >= 0)
            return 0;
        c->log_level = TDD_LOG_INFO;
        fprintf(stderr, "tensordd: %s: bad value '%s': takes error, warn, info or debug\n", where,
                val);
        return -1;
    case OPT_LOGFMT:
        if (!strcmp(val, "text") || !strcmp(val, "json")) {
            c->log_json = !strcmp(val, "json");
            return 0;
        }
        fprintf(stderr, "tensordd: %s: bad value '%s': takes text or json\n", where, val);
        return -1;
    case OPT_TOKEN:
        return read_token(c, val, where);
    case OPT_HOSTPORT:
        if (val[0] && check_hostport(val, range, sizeof range)) {
            fprintf(stderr, "tensordd: %s: bad value '%s': %s\n", where, val, range);
            return -1;
        }
        if (strlen(val) >= r->size) {
            fprintf(stderr, "tensordd: %s: bad value: longer than %zu bytes\n", where, r->size - 1);
            return -1;
        }
        memcpy((char *)c + r->off, val, strlen(val) + 1);
        return 0;
    case OPT_CIDRS:
        if (tdd_cidr_check(val, range, sizeof range)) {
            fprintf(stderr, "tensordd: %s: bad value: %s\n", where, range);
            return -1;
        }
        /* fall through */
    case OPT_PATH:
        if (strlen(val) >= r->size) {
            fprintf(stderr, "tensordd: %s: bad value: longer than %zu bytes\n", where, r->size - 1);
            return -1;
        }
        memcpy((char *)c + r->off, val, strlen(val) + 1);
        return 0;
    case OPT_MODE: {
        char *end;
        errno = 0;
        unsigned long m = strtoul(val, &end, 8);
        if (!val[0] || *end || errno || m > r->max) {
            fprintf(stderr,
                    "tensordd: %s: bad value '%s': takes octal permission bits "
                    "from 0 to 0777 (e.g. 0660)\n",
                    where, val);
            return -1;
        }
        store(c, r, m);
        return 0;
    }
    case OPT_FLAG:
        if (!val || !strcmp(val, "1") || !strcmp(val, "true") || !strcmp(val, "yes"))
            v = 1;
        else if (!strcmp(val, "0") || !strcmp(val, "false") || !strcmp(val, "no"))
            v = 0;
        else {
            fprintf(stderr, "tensordd: %s: bad value '%s': takes true or false\n", where, val);
            return -1;
        }
        store(c, r, v);
        return 0;
    case OPT_COUNT:
    case OPT_BYTES:
    case OPT_SECONDS:
        if (parse_number(val, r->kind == OPT_BYTES, &v) || v < r->min || v > r->max) {
            describe_range(range, sizeof range, r);
            fprintf(stderr, "tensordd: %s: bad value '%s': takes %s\n", where, val, range);
            return -1;
        }
        store(c, r, v);
        return 0;
    case OPT_CONFIG:
    case OPT_CHECK:
    case OPT_HELP:
    case OPT_VERSION:
        break;
    }
    fprintf(stderr, "tensordd: %s: not a setting\n", where);
    return -1;
}

/* ---- the config file (INI, no sections): one `key = value` per line */

typedef struct {
    FILE *f;
    const char *path;
    tdd_config *c;
    int first_line[NROWS]; /* where each key was set (0: not yet), for a second setting */
    int lines;             /* lines read to their end */
    bool midline;          /* the last chunk read did not end a line */
    int errors;            /* reported so far */
    int cut_line;          /* the last line too long for inih's buffer (reported) */
} ini_ctx;

/* inih reads through this so that the handler knows the line it is called for; lines
 * that are not `key = value`, a comment or blank are reported here, each with its
 * number (inih itself returns only the first bad line). */
static char *ini_read(char *str, int num, void *stream)
{
    ini_ctx *x = stream;
    bool starts_line = !x->midline;
    char *r = fgets(str, num, x->f);
    if (!r)
        return r;
    size_t n = strlen(r);
    x->midline = !(n && r[n - 1] == '\n');
    if (!x->midline)
        x->lines++;
    if (!starts_line)
        return r;
    int line = x->lines + (x->midline ? 1 : 0);
    if (x->midline && !feof(x->f)) {
        /* inih's line buffer: a longer line would be cut, its value silently shortened */
        fprintf(stderr, "tensordd: %s:%d: line longer than %d characters\n", x->path, line,
                num - 3);
        x->errors++;
        x->cut_line = line;
        return r;
    }
    const char *p = r + strspn(r, " \t\r\n");
    if (!*p || *p == ';' || *p == '#')
        return r;
    if (*p == '[') {
        fprintf(stderr, "tensordd: %s:%d: sections are not used: every key is at the top\n",
                x->path, line);
        x->errors++;
    } else if (!strpbrk(p, "=:")) {
        fprintf(stderr, "tensordd: %s:%d: expected `key = value`\n", x->path, line);
        x->errors++;
    }
    return r;
}

static int ini_on_value(void *user, const char *section, const char *name, const char *value)
{
    ini_ctx *x = user;
    origin o = {.file = x->path, .line = x->lines + (x->midline ? 1 : 0)};
    const option_row *r = find_row(name);
    int rc = -1;
    (void)section; /* a section's header was reported where it stands */
    if (o.line == x->cut_line) {
        x->errors++;
        return 0; /* its value was cut: reported already */
    }
    if (!r || r->kind == OPT_CONFIG || r->kind == OPT_CHECK || r->kind == OPT_HELP ||
        r->kind == OPT_VERSION)
        fprintf(stderr,
                "tensordd: %s:%d: unknown key '%s' (the keys are the long options of "
                "--help)\n",
                x->path, o.line, name);
    else if (r->kind != OPT_LISTEN && x->first_line[r - rows])
        fprintf(stderr,
                "tensordd: %s:%d: key '%s' set again (first at line %d): one line per key "
                "(only listen repeats)\n",
                x->path, o.line, name, x->first_line[r - rows]);
    else {
        x->first_line[r - rows] = o.line;
        rc = apply(x->c, r, value, &o, 1);
    }
    if (rc) {
        x->errors++;
        return 0;
    }
    return 1;
}

static int read_file(tdd_config *c, const char *path, bool must_exist)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        if (!must_exist && errno == ENOENT)
            return 0;
        fprintf(stderr, "tensordd: cannot read config file %s: %s\n", path, strerror(errno));
        return -1;
    }
    ini_allow_multiline = false; /* an indented line is its own key, not a continuation */
    ini_ctx x = {.f = f, .path = path, .c = c};
    int rc = ini_parse_stream(ini_read, &x, ini_on_value, &x);
    fclose(f);
    if (rc > 0 && !x.errors) /* a line inih refused that ini_read let through */
        fprintf(stderr, "tensordd: %s:%d: expected `key = value`\n", path, rc);
    if (rc < 0)
        fprintf(stderr, "tensordd: %s: out of memory reading it\n", path);
    if (rc || x.errors)
        return -1;
    snprintf(c->config_file, sizeof c->config_file, "%s", path);
    return 0;
}

static int read_env(tdd_config *c)
{
    for (size_t i = 0; i < NENV; i++) {
        const option_row *r = find_row(env_options[i]);
        char name[64];
        env_name(name, sizeof name, env_options[i]);
        const char *v = getenv(name);
        if (!r || !v || !v[0])
            continue;
        origin o = {.env = name};
        if (r->kind != OPT_LISTEN) {
            if (apply(c, r, v, &o, 2))
                return -1;
            continue;
        }
        /* TENSORDD_LISTEN: endpoints separated by spaces or commas */
        char buf[2048];
        snprintf(buf, sizeof buf, "%s", v);
        for (char *save = NULL, *t = strtok_r(buf, " ,\t", &save); t;
             t = strtok_r(NULL, " ,\t", &save))
            if (apply(c, r, t, &o, 2))
                return -1;
    }
    return 0;
}

/* systemd's LoadCredential=token:PATH: $CREDENTIALS_DIRECTORY/token when no token file
 * was named. */
static int read_credential(tdd_config *c)
{
    const char *dir = getenv("CREDENTIALS_DIRECTORY");
    if (c->token_len || !dir || !dir[0])
        return 0;
    char path[512];
    snprintf(path, sizeof path, "%s/token", dir);
    if (access(path, F_OK))
        return 0;
    return read_token(c, path, "CREDENTIALS_DIRECTORY");
}

/* ---- --check-config: the effective configuration, itself a valid config file */

void tdd_config_print(const tdd_config *c)
{
    printf("# tensordd %s: effective configuration (defaults < %s < environment < flags)\n",
           TDD_VERSION, c->config_file[0] ? c->config_file : "no config file");
    for (size_t i = 0; i < NROWS; i++) {
        const option_row *r = &rows[i];
        char d[64];
        switch (r->kind) {
        case OPT_LISTEN:
            for (int k = 0; k < c->nlisten; k++)
                printf("%s = %s\n", r->name, c->listen[k]);
            break;
        case OPT_LOG:
            printf("%s = %s\n", r->name, tdd_log_level_name(c->log_level));
            break;
        case OPT_LOGFMT:
            printf("%s = %s\n", r->name, c->log_json ? "json" : "text");
            break;
        case OPT_TOKEN:
            if (c->token_len)
                printf("%s = %s\n", r->name, c->token_file);
            else
                printf("; %s: none (sessions need no token)\n", r->name);
            break;
        case OPT_HOSTPORT:
            if (((const char *)c + r->off)[0])
                printf("%s = %s\n", r->name, (const char *)c + r->off);
            else
                printf("; %s: off\n", r->name);
            break;
        case OPT_CIDRS:
            if (((const char *)c + r->off)[0])
                printf("%s = %s\n", r->name, (const char *)c + r->off);
            else
                printf("; %s: none\n", r->name);
            break;
        case OPT_PATH:
            if (((const char *)c + r->off)[0])
                printf("%s = %s\n", r->name, (const char *)c + r->off);
            else
                printf("; %s: unset\n", r->name);
            break;
        case OPT_MODE:
        case OPT_FLAG: {
            uint32_t v32;
            memcpy(&v32, (const char *)c + r->off, sizeof v32);
            if (r->kind == OPT_MODE)
                printf("%s = %04o\n", r->name, v32);
            else
                printf("%s = %s\n", r->name, v32 ? "true" : "false");
            break;
        }
        case OPT_COUNT:
        case OPT_BYTES:
        case OPT_SECONDS: {
            uint64_t v = 0;
            if (r->size == sizeof(uint64_t))
                memcpy(&v, (const char *)c + r->off, sizeof v);
            else {
                uint32_t v32;
                memcpy(&v32, (const char *)c + r->off, sizeof v32);
                v = v32;
            }
            printf("%s = %s", r->name,
                   r->kind == OPT_BYTES ? fmt_bytes(d, sizeof d, v)
                                        : (snprintf(d, sizeof d, "%" PRIu64, v), d));
            if (v == 0 && r->zero)
                printf("  ; %s", r->zero);
            printf("\n");
            break;
        }
        case OPT_CONFIG:
        case OPT_CHECK:
        case OPT_HELP:
        case OPT_VERSION:
            break;
        }
    }
}

void tdd_config_apply_log(const tdd_config *c)
{
    tdd_log_level = c->log_level;
    tdd_log_set_format(c->log_json ? "json" : "text");
}

static int parse(tdd_config *c, int argc, char **argv);

int tdd_config_from_args(tdd_config *c, int argc, char **argv)
{
    saved_argc = argc;
    saved_argv = argv;
    int rc = parse(c, argc, argv);
    tdd_config_apply_log(c);
    return rc;
}

int tdd_config_reread(tdd_config *next)
{
    if (!saved_argv)
        return -1;
    rereading = true;
    int rc = parse(next, saved_argc, saved_argv);
    rereading = false;
    return rc ? -1 : 0;
}

/* Appends ", name" (or "name") to buf. */
static void add_name(char *buf, size_t n, const char *name)
{
    size_t k = strlen(buf);
    if (k + 1 < n)
        snprintf(buf + k, n - k, "%s%s", k ? ", " : "", name);
}

void tdd_config_update(tdd_config *cur, const tdd_config *next, char *done, size_t dn,
                       char *restart, size_t rn)
{
    done[0] = restart[0] = 0;
    for (size_t i = 0; i < NROWS; i++) {
        const option_row *r = &rows[i];
        bool differs = false, reload = is_reloadable(r);
        switch (r->kind) {
        case OPT_LOG:
            if ((differs = cur->log_level != next->log_level) && reload)
                cur->log_level = next->log_level;
            break;
        case OPT_LOGFMT:
            if ((differs = cur->log_json != next->log_json) && reload)
                cur->log_json = next->log_json;
            break;
        case OPT_TOKEN:
            differs = cur->token_len != next->token_len ||
                      memcmp(cur->token, next->token, sizeof cur->token) ||
                      strcmp(cur->token_file, next->token_file);
            if (differs && reload) {
                memcpy(cur->token, next->token, sizeof cur->token);
                cur->token_len = next->token_len;
                memcpy(cur->token_file, next->token_file, sizeof cur->token_file);
            }
            break;
        case OPT_LISTEN: /* not reread */
        case OPT_CONFIG:
        case OPT_CHECK:
        case OPT_HELP:
        case OPT_VERSION:
            break;
        case OPT_COUNT:
        case OPT_BYTES:
        case OPT_SECONDS:
        case OPT_HOSTPORT:
        case OPT_PATH:
        case OPT_CIDRS:
        case OPT_MODE:
        case OPT_FLAG:
            differs = memcmp((const char *)cur + r->off, (const char *)next + r->off, r->size);
            if (differs && reload)
                memcpy((char *)cur + r->off, (const char *)next + r->off, r->size);
            break;
        }
        if (differs)
            add_name(reload ? done : restart, reload ? dn : rn, r->name);
    }
    memcpy(cur->config_file, next->config_file, sizeof cur->config_file);
    tdd_config_apply_log(cur);
}

static int parse(tdd_config *c, int argc, char **argv)
{
    struct option opts[NROWS + 1];
    for (size_t i = 0; i < NROWS; i++)
        opts[i] = (struct option){rows[i].name, rows[i].arg ? required_argument : no_argument, NULL,
                                  OPT_VAL0 + (int)i};
    opts[NROWS] = (struct option){0, 0, 0, 0};
    tdd_config_defaults(c);
    opterr = 0; /* our own messages, one per mistake */

    /* First pass: bad flags, the commands, and which file to read. */
    const char *config = NULL;
    bool check = false;
    for (int i = 1; i < argc; i++) /* --check-config answers every mistake with 1 */
        check |= strcmp(argv[i], "--check-config") == 0;
    int bad = check ? 3 : 2;
    int o;
    optind = 0; /* GNU getopt: from the start (SIGHUP parses the same argv again) */
    while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        if (o < OPT_VAL0 || o >= OPT_VAL0 + (int)NROWS) {
            const char *what = optind > 0 && optind <= argc ? argv[optind - 1] : "?";
            fprintf(stderr, "tensordd: unknown option or missing value: '%s' (see --help)\n", what);
            return bad;
        }
        const option_row *r = &rows[o - OPT_VAL0];
        if (r->kind == OPT_HELP) {
            usage(stdout);
            return 1;
        }
        if (r->kind == OPT_VERSION) {
            printf("tensordd %s (protocol %d)\n", TDD_VERSION, TD_PROTOCOL_VERSION);
            return 1;
        }
        if (r->kind == OPT_CONFIG)
            config = optarg;
        if (r->kind == OPT_CHECK)
            check = true;
    }
    if (optind < argc) {
        fprintf(stderr, "tensordd: unexpected argument '%s' (see --help)\n", argv[optind]);
        return bad;
    }

    /* The file, then the environment, then the flags: each overrides the one before. */
    if (read_file(c, config ? config : TDD_CONFIG_DEFAULT, config != NULL) || read_env(c))
        return 3;
    optind = 0; /* GNU getopt: start over */
    while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        const option_row *r = &rows[o - OPT_VAL0];
        if (r->kind == OPT_CONFIG || r->kind == OPT_CHECK)
            continue;
        origin og = {0};
        if (apply(c, r, optarg, &og, 3))
            return bad;
    }
    if (read_credential(c))
        return 3;
    if (c->nlisten == 0 && !rereading) {
        c->listen[c->nlisten++] = "tcp://127.0.0.1:7070";
        c->listen_default = true;
    }
    return check ? 4 : 0;
}
