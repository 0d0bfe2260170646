/* sim.c -- "sim", a simulated discrete device for tests on machines without a
 * GPU: its memory is not the socket's to read or write (host_memory = false),
 * so every upload, download and cross-device copy takes the staged paths a
 * CUDA device takes; its kernels are the reference backend's. Off unless the
 * daemon is started with --sim-devices N. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"

static int sim_init(const tdd_backend_config *cfg, void **ctx, char *why, size_t why_len)
{
    (void)why;
    (void)why_len;
    *ctx = NULL;
    return cfg->sim_devices > 0 ? cfg->sim_devices : 0;
}

static void sim_shutdown(void *ctx)
{
    (void)ctx;
}

static void sim_device_name(void *ctx, int ordinal, char *buf, size_t len)
{
    (void)ctx;
    snprintf(buf, len, "simulated discrete device %d (reference kernels)", ordinal);
}

static void *sim_alloc(void *ctx, int ordinal, size_t nbytes)
{
    (void)ctx;
    (void)ordinal;
    return malloc(nbytes ? nbytes : 1);
}

static void sim_free(void *ctx, int ordinal, void *p, size_t nbytes)
{
    (void)ctx;
    (void)ordinal;
    (void)nbytes;
    free(p);
}

static int sim_copy(void *ctx, int ordinal, void *dst, const void *src, size_t n)
{
    (void)ctx;
    (void)ordinal;
    if (n)
        memcpy(dst, src, n);
    return 0;
}

static int sim_execute(void *ctx, int ordinal, const tdd_opcall *call)
{
    (void)ctx;
    (void)ordinal;
    void *rctx = NULL;
    return tdd_backend_ref.execute(rctx, 0, call);
}

const tdd_backend tdd_backend_sim = {
    .name = "sim",
    .host_memory = false,
    .init = sim_init,
    .shutdown = sim_shutdown,
    .device_name = sim_device_name,
    .alloc = sim_alloc,
    .free = sim_free,
    .from_host = sim_copy,
    .to_host = sim_copy,
    .execute = sim_execute,
};
