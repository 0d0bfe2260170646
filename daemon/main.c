/* main.c -- tensordd: flags, start-up, the loop, graceful shutdown. */
#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <uv.h>

#include "autograd.h"
#include "config.h"
#include "conn.h"
#include "device.h"
#include "exec.h"
#include "log.h"

#define TDD_VERSION "0.1.0"

void tdd_dispatch_set_note(const char *note);

static void usage(FILE *f)
{
    fprintf(f, "usage: tensordd [options]\n"
               "Remote tensor execution daemon: runs tensor ops and backward passes for clients\n"
               "that hold handles to tensors living here.\n\n"
               "  --listen ENDPOINT      tcp://HOST:PORT or unix:///PATH (repeatable;\n"
               "                         default tcp://127.0.0.1:7070; port 0 picks a free one)\n"
               "  --cpu-devices N        logical CPU devices cpu:0..N-1 (default 1)\n"
               "  --threads N            threads for the cpu backend (default: all cores)\n"
               "  --sim-devices N        simulated discrete devices sim:0..N-1 with device\n"
               "                         memory and reference kernels, for tests (default 0)\n"
               "  --log-level LEVEL      error, warn, info (default), debug\n"
               "  --token-file PATH      clients must send this token in Hello (first line of\n"
               "                         the file); required to listen beyond loopback\n"
               "  --max-frame BYTES      largest protobuf request (default 4M)\n"
               "  --max-payload BYTES    largest tensor payload (default 64G)\n"
               "  --max-handles N        live handles per session (default 1048576)\n"
               "  --max-id-runs N        runs of consecutive handle ids a session may have used\n"
               "                         (ids are never reused; default 65536)\n"
               "  --session-memory BYTES memory quota per session (default: none)\n"
               "  --memory-cap BYTES     memory for the whole daemon (default: physical memory)\n"
               "  --max-inflight N       queued requests per session before reading pauses (4096)\n"
               "  --max-sessions N       concurrent sessions (default 1024)\n"
               "  --idle-timeout SECS    close sessions with no traffic either way and no work\n"
               "                         in flight for this long (default 0: never)\n"
               "  --hello-timeout SECS   close connections that have not completed Hello\n"
               "                         (default 10; 0: never)\n"
               "  --max-handshakes N     connections before Hello; a new one past the limit\n"
               "                         drops the oldest (default 64)\n"
               "  --write-timeout SECS   close connections whose replies make no progress\n"
               "                         (a client that stops reading; default 20; 0: never)\n"
               "  --max-write-queue BYTES  replies queued per connection, with their bookkeeping,\n"
               "                         before it stops reading requests (default 64M)\n"
               "  --help, --version\n"
               "BYTES take K, M, G suffixes (powers of 1024).\n");
}

static int parse_u64(const char *s, uint64_t *out, int allow_suffix)
{
    char *end;
    if (!s[0] || s[0] == '-')
        return -1;
    unsigned long long v = strtoull(s, &end, 10);
    uint64_t mul = 1;
    if (allow_suffix && *end) {
        switch (*end) {
        case 'k':
        case 'K':
            mul = 1ull << 10;
            break;
        case 'm':
        case 'M':
            mul = 1ull << 20;
            break;
        case 'g':
        case 'G':
            mul = 1ull << 30;
            break;
        case 't':
        case 'T':
            mul = 1ull << 40;
            break;
        default:
            return -1;
        }
        end++;
    }
    if (*end || end == s)
        return -1;
    if (v && mul > UINT64_MAX / v)
        return -1;
    *out = (uint64_t)v * mul;
    return 0;
}

/* Reads the first line of path as the token; refuses files others can read. */
static int read_token(const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        fprintf(stderr, "tensordd: cannot read --token-file %s: %s\n", path, strerror(errno));
        return -1;
    }
    struct stat sb;
    if (fstat(fileno(f), &sb) == 0 && (sb.st_mode & 077))
        fprintf(stderr, "tensordd: warning: %s is readable by group or others (chmod 600)\n", path);
    char line[sizeof tdd_cfg.token + 2];
    if (!fgets(line, sizeof line, f))
        line[0] = 0;
    fclose(f);
    size_t n = strcspn(line, "\r\n");
    if (n == 0 || n >= sizeof tdd_cfg.token) {
        fprintf(stderr,
                "tensordd: --token-file %s: the token must be 1..%zu bytes on its first line\n",
                path, sizeof tdd_cfg.token - 1);
        return -1;
    }
    memcpy(tdd_cfg.token, line, n);
    tdd_cfg.token[n] = 0;
    tdd_cfg.token_len = n;
    return 0;
}

static uv_signal_t sigterm, sigint, sigusr1;
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
    tdd_server_shutdown();
    tdd_exec_drain();
    uv_signal_stop(&sigterm);
    uv_signal_stop(&sigint);
    uv_close((uv_handle_t *)&sigterm, NULL);
    uv_close((uv_handle_t *)&sigint, NULL);
    if (test_stall_ms)
        uv_close((uv_handle_t *)&sigusr1, NULL);
    uv_timer_init(uv_default_loop(), &grace);
    uv_timer_start(&grace, on_grace, tdd_cfg.shutdown_grace_s * 1000ull, 0);
    uv_unref((uv_handle_t *)&grace);
}

int main(int argc, char **argv)
{
    enum {
        O_LISTEN = 256,
        O_CPU,
        O_THREADS,
        O_SIM,
        O_LOG,
        O_FRAME,
        O_PAYLOAD,
        O_HANDLES,
        O_IDRUNS,
        O_SMEM,
        O_CAP,
        O_INFLIGHT,
        O_SESSIONS,
        O_IDLE,
        O_HELLO,
        O_HANDSHAKES,
        O_WTIMEOUT,
        O_WQUEUE,
        O_TOKEN,
        O_HELP,
        O_VERSION
    };
    static const struct option opts[] = {
        {"listen", required_argument, 0, O_LISTEN},
        {"cpu-devices", required_argument, 0, O_CPU},
        {"threads", required_argument, 0, O_THREADS},
        {"sim-devices", required_argument, 0, O_SIM},
        {"log-level", required_argument, 0, O_LOG},
        {"max-frame", required_argument, 0, O_FRAME},
        {"max-payload", required_argument, 0, O_PAYLOAD},
        {"max-handles", required_argument, 0, O_HANDLES},
        {"max-id-runs", required_argument, 0, O_IDRUNS},
        {"session-memory", required_argument, 0, O_SMEM},
        {"memory-cap", required_argument, 0, O_CAP},
        {"max-inflight", required_argument, 0, O_INFLIGHT},
        {"max-sessions", required_argument, 0, O_SESSIONS},
        {"idle-timeout", required_argument, 0, O_IDLE},
        {"hello-timeout", required_argument, 0, O_HELLO},
        {"max-handshakes", required_argument, 0, O_HANDSHAKES},
        {"write-timeout", required_argument, 0, O_WTIMEOUT},
        {"max-write-queue", required_argument, 0, O_WQUEUE},
        {"token-file", required_argument, 0, O_TOKEN},
        {"help", no_argument, 0, O_HELP},
        {"version", no_argument, 0, O_VERSION},
        {0, 0, 0, 0},
    };
    tdd_config_defaults(&tdd_cfg);
    int o;
    uint64_t v;
    while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        const char *name = optind > 0 && optind <= argc ? argv[optind - 1] : "?";
        int bad = 0;
        switch (o) {
        case O_LISTEN:
            if (tdd_cfg.nlisten == TDD_MAX_LISTEN) {
                fprintf(stderr, "tensordd: at most %d --listen\n", TDD_MAX_LISTEN);
                return 2;
            }
            tdd_cfg.listen[tdd_cfg.nlisten++] = optarg;
            break;
        case O_CPU:
            bad = parse_u64(optarg, &v, 0) || v < 1 || v > 16;
            tdd_cfg.cpu_devices = (int)v;
            if (bad)
                fprintf(stderr, "tensordd: --cpu-devices takes 1..16, got '%s'\n", optarg);
            break;
        case O_SIM:
            bad = parse_u64(optarg, &v, 0) || v > 16;
            tdd_cfg.sim_devices = (int)v;
            break;
        case O_THREADS:
            bad = parse_u64(optarg, &v, 0) || v > 1024;
            tdd_cfg.threads = (int)v;
            break;
        case O_LOG:
            tdd_log_level = tdd_log_parse_level(optarg);
            if (tdd_log_level < 0) {
                fprintf(stderr, "tensordd: --log-level takes error, warn, info or debug\n");
                return 2;
            }
            break;
        case O_FRAME:
            bad = parse_u64(optarg, &v, 1) || v < 1024 || v > (1u << 30);
            tdd_cfg.max_msg = (uint32_t)v;
            break;
        case O_PAYLOAD:
            bad = parse_u64(optarg, &tdd_cfg.max_payload, 1);
            break;
        case O_HANDLES:
            bad = parse_u64(optarg, &tdd_cfg.max_handles, 0) || !tdd_cfg.max_handles;
            break;
        case O_IDRUNS:
            bad = parse_u64(optarg, &tdd_cfg.max_id_runs, 0) || !tdd_cfg.max_id_runs;
            break;
        case O_SMEM:
            bad = parse_u64(optarg, &tdd_cfg.session_memory, 1);
            break;
        case O_CAP:
            bad = parse_u64(optarg, &tdd_cfg.memory_cap, 1);
            break;
        case O_INFLIGHT:
            bad = parse_u64(optarg, &v, 0) || v < 1 || v > (1u << 24);
            tdd_cfg.max_inflight = (uint32_t)v;
            break;
        case O_SESSIONS:
            bad = parse_u64(optarg, &v, 0) || v < 1 || v > (1u << 20);
            tdd_cfg.max_sessions = (uint32_t)v;
            break;
        case O_IDLE:
            bad = parse_u64(optarg, &v, 0) || v > 86400 * 365;
            tdd_cfg.idle_timeout_s = (uint32_t)v;
            break;
        case O_HELLO:
            bad = parse_u64(optarg, &v, 0) || v > 86400;
            tdd_cfg.hello_timeout_s = (uint32_t)v;
            break;
        case O_HANDSHAKES:
            bad = parse_u64(optarg, &v, 0) || v < 1 || v > (1u << 20);
            tdd_cfg.max_handshakes = (uint32_t)v;
            break;
        case O_WTIMEOUT:
            bad = parse_u64(optarg, &v, 0) || v > 86400;
            tdd_cfg.write_timeout_s = (uint32_t)v;
            break;
        case O_WQUEUE:
            bad = parse_u64(optarg, &tdd_cfg.max_write_queue, 1) || tdd_cfg.max_write_queue < 4096;
            break;
        case O_TOKEN:
            if (read_token(optarg))
                return 2;
            break;
        case O_HELP:
            usage(stdout);
            return 0;
        case O_VERSION:
            printf("tensordd %s (protocol %d)\n", TDD_VERSION, TD_PROTOCOL_VERSION);
            return 0;
        default:
            fprintf(stderr, "tensordd: try --help\n");
            return 2;
        }
        if (bad) {
            fprintf(stderr, "tensordd: bad value '%s' for %s (see --help)\n", optarg, name);
            return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "tensordd: unexpected argument '%s' (see --help)\n", argv[optind]);
        return 2;
    }
    if (tdd_cfg.nlisten == 0)
        tdd_cfg.listen[tdd_cfg.nlisten++] = "tcp://127.0.0.1:7070";

    /* A client that vanishes mid-write must cost a write error, not the daemon. */
    signal(SIGPIPE, SIG_IGN);

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
    tdd_dispatch_set_note(note);
    tdd_autograd_init();
    if (tdd_server_start(loop, &tdd_cfg))
        return 1;

    uv_signal_init(loop, &sigterm);
    uv_signal_init(loop, &sigint);
    uv_signal_start(&sigterm, on_signal, SIGTERM);
    uv_signal_start(&sigint, on_signal, SIGINT);
    const char *stall = getenv("TDD_TEST_STALL_MS");
    if (stall && (test_stall_ms = strtoul(stall, NULL, 10)) > 0) {
        uv_signal_init(loop, &sigusr1);
        uv_signal_start(&sigusr1, on_stall, SIGUSR1);
        uv_unref((uv_handle_t *)&sigusr1);
    }

    uv_run(loop, UV_RUN_DEFAULT);

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
