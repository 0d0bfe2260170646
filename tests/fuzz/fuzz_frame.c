/* fuzz_frame.c -- fuzz target for the daemon's whole request path: bytes from
 * a client go through framing, protobuf decoding, dispatch, validation and
 * the device workers of an in-process daemon. Built as a corpus replayer for
 * `make test` (TDD_FUZZ_REPLAY) and as a libFuzzer target for `make fuzz`.
 * The daemon must answer or close, never crash, and end every session. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#include <uv.h>

#include "autograd.h"
#include "config.h"
#include "device.h"
#include "dispatch.h"
#include "exec.h"
#include "log.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static uv_loop_t *loop;
static int port;

static void start_daemon(void)
{
    static const char *ep = "tcp://127.0.0.1:0";
    tdd_config_defaults(&tdd_cfg);
    tdd_cfg.listen[0] = ep;
    tdd_cfg.nlisten = 1;
    tdd_cfg.cpu_devices = 2;
    tdd_cfg.max_msg = 1u << 20;
    tdd_cfg.max_payload = 64u << 20; /* keep a fuzzed upload from eating the machine */
    tdd_cfg.memory_cap = 512u << 20;
    tdd_log_level = getenv("TDD_FUZZ_VERBOSE") ? TDD_LOG_DEBUG : TDD_LOG_ERROR;
    loop = uv_default_loop();
    char note[256];
    tdd_autograd_init(); /* as main() does: Gradients/optimizer handles know how to free */
    if (tdd_exec_init(loop) || tdd_devices_init(&tdd_cfg, note, sizeof note) ||
        tdd_server_start(loop, &tdd_cfg, tdd_dispatch)) {
        fprintf(stderr, "fuzz: cannot start the in-process daemon\n");
        exit(1);
    }
    const char *bound = tdd_server_endpoint(0);
    port = atoi(strrchr(bound, ':') + 1);
}

typedef struct {
    const uint8_t *data;
    size_t size;
    atomic_int done; /* set by the client thread, polled by the loop's */
} client_job;

/* The client side: send everything, half-close, read until the daemon closes. */
static void *client(void *arg)
{
    client_job *j = arg;
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd >= 0 && connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0) {
        size_t off = 0;
        while (off < j->size) {
            ssize_t n = send(fd, j->data + off, j->size - off, MSG_NOSIGNAL);
            if (n <= 0)
                break;
            off += (size_t)n;
        }
        shutdown(fd, SHUT_WR);
        char buf[65536];
        struct timeval tv = {.tv_sec = 10};
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
        while (recv(fd, buf, sizeof buf, 0) > 0)
            ;
    }
    if (fd >= 0)
        close(fd);
    atomic_store(&j->done, 1);
    return NULL;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!loop)
        start_daemon();
    client_job j = {.data = data, .size = size};
    pthread_t t;
    pthread_create(&t, NULL, client, &j);
    struct timespec nap = {0, 100000};
    while (!atomic_load(&j.done)) {
        uv_run(loop, UV_RUN_NOWAIT);
        nanosleep(&nap, NULL);
    }
    pthread_join(t, NULL);
    /* The daemon has seen EOF or closed: run until its session is gone. */
    for (int i = 0; i < 100000 && (tdd_nsessions > 0 || tdd_exec_pending() > 0); i++) {
        uv_run(loop, UV_RUN_NOWAIT);
        nanosleep(&nap, NULL);
    }
    if (tdd_nsessions > 0 || tdd_memory_in_use() > 0) {
        fprintf(stderr, "fuzz: session or memory left behind (%llu sessions, %llu bytes)\n",
                (unsigned long long)tdd_nsessions, (unsigned long long)tdd_memory_in_use());
        abort();
    }
    return 0;
}

#ifdef TDD_FUZZ_REPLAY
int main(int argc, char **argv)
{
    int n = 0;
    for (int i = 1; i < argc; i++) {
        FILE *f = fopen(argv[i], "rb");
        if (!f) {
            fprintf(stderr, "fuzz: cannot open %s\n", argv[i]);
            return 1;
        }
        fseek(f, 0, SEEK_END);
        long len = ftell(f);
        fseek(f, 0, SEEK_SET);
        uint8_t *buf = malloc(len > 0 ? (size_t)len : 1);
        size_t got = fread(buf, 1, (size_t)(len > 0 ? len : 0), f);
        fclose(f);
        LLVMFuzzerTestOneInput(buf, got);
        free(buf);
        n++;
    }
    printf("fuzz: replayed %d corpus input(s): no crash, no session or memory left behind\n", n);
    return 0;
}
#endif
