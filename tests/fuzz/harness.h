/* harness.h -- what the fuzz targets share: an in-process daemon on a loopback port, a
 * client thread per input while the fuzzing thread runs the daemon's loop, the check
 * that nothing outlives the input, and the corpus replayer `make test` runs.
 * Included once by each target (fuzz_frame.c, fuzz_session.c). */
#ifndef TDD_FUZZ_HARNESS_H
#define TDD_FUZZ_HARNESS_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <uv.h>

#include "autograd.h"
#include "config.h"
#include "device.h"
#include "dispatch.h"
#include "exec.h"
#include "log.h"
#include "session.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static uv_loop_t *fz_loop;
static int fz_port;

/* Starts the daemon once: defaults, then tune() (the target's limits), loopback. */
static void fz_start(const char *target, void (*tune)(tdd_config *c))
{
    if (fz_loop)
        return;
    static const char *ep = "tcp://127.0.0.1:0";
    tdd_config_defaults(&tdd_cfg);
    tdd_cfg.listen[0] = ep;
    tdd_cfg.nlisten = 1;
    tune(&tdd_cfg);
    tdd_log_level = getenv("TDD_FUZZ_VERBOSE") ? TDD_LOG_DEBUG : TDD_LOG_ERROR;
    fz_loop = uv_default_loop();
    char note[256];
    tdd_autograd_init(); /* as main() does: Gradients/optimizer handles know how to free */
    if (tdd_exec_init(fz_loop) || tdd_devices_init(&tdd_cfg, note, sizeof note) ||
        tdd_server_start(fz_loop, &tdd_cfg, tdd_dispatch)) {
        fprintf(stderr, "%s: cannot start the in-process daemon\n", target);
        exit(1);
    }
    const char *bound = tdd_server_endpoint(0);
    fz_port = atoi(strrchr(bound, ':') + 1);
}

/* Runs client(arg) on its own thread, and the daemon's loop here until it sets *done;
 * then until the daemon has ended every session and finished every task. Aborts when
 * a session, memory or a tensor outlives the input. */
static void fz_run(const char *target, void *(*client)(void *), void *arg, atomic_int *done)
{
    pthread_t t;
    pthread_create(&t, NULL, client, arg);
    struct timespec nap = {0, 50000};
    while (!atomic_load(done)) {
        uv_run(fz_loop, UV_RUN_NOWAIT);
        nanosleep(&nap, NULL);
    }
    pthread_join(t, NULL);
    for (int i = 0; i < 200000 && (tdd_nsessions > 0 || tdd_exec_pending() > 0); i++) {
        uv_run(fz_loop, UV_RUN_NOWAIT);
        nanosleep(&nap, NULL);
    }
    if (tdd_nsessions > 0 || tdd_memory_in_use() > 0 || tdd_values_alive() > 0) {
        fprintf(stderr, "%s: left behind: %llu sessions, %llu bytes, %llu tensors\n", target,
                (unsigned long long)tdd_nsessions, (unsigned long long)tdd_memory_in_use(),
                (unsigned long long)tdd_values_alive());
        abort();
    }
}

#ifdef TDD_FUZZ_REPLAY
/* Each file named is one input. */
static int fz_replay(int argc, char **argv, const char *target)
{
    int n = 0;
    for (int i = 1; i < argc; i++) {
        FILE *f = fopen(argv[i], "rb");
        if (!f) {
            fprintf(stderr, "%s: cannot open %s\n", target, argv[i]);
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
    printf("%s: replayed %d corpus input(s): every check held, nothing left behind\n", target, n);
    return 0;
}
#endif

#endif
