/* cpu.c -- the fast CPU backend: OpenBLAS GEMM, OpenMP-threaded vectorisable loops. */
#include <cblas.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend.h"

/* Below this many elements a loop runs on one thread: waking the team costs more. */
#define CPU_PAR_MIN 32768

typedef struct {
    int ndev;
    int threads;
} cpu_ctx;

static int cpu_init(const tdd_backend_config *cfg, void **ctx, char *why, size_t why_len)
{
    (void)why;
    (void)why_len;
    cpu_ctx *c = calloc(1, sizeof *c);
    if (!c)
        return TD_ERESOURCE_EXHAUSTED;
    c->ndev = cfg->cpu_devices > 0 ? cfg->cpu_devices : 1;
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    c->threads = cfg->threads > 0 ? cfg->threads : (cores > 0 ? (int)cores : 1);
    *ctx = c;
    return c->ndev;
}

static void cpu_shutdown(void *ctx)
{
    free(ctx);
}

static void cpu_device_name(void *ctx, int ordinal, char *buf, size_t len)
{
    cpu_ctx *c = ctx;
    (void)ordinal;
    snprintf(buf, len, "CPU (OpenBLAS, %d threads)", c->threads);
}

static uint64_t cpu_memory_total(void *ctx, int ordinal)
{
    (void)ctx;
    (void)ordinal;
    long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
    return pages > 0 && psz > 0 ? (uint64_t)pages * (uint64_t)psz : 0;
}

static void *cpu_alloc(void *ctx, int ordinal, size_t nbytes)
{
    (void)ctx;
    (void)ordinal;
    void *p = NULL;
    /* 64-byte alignment for vector loads; large blocks come from mmap anyway. */
    size_t n = (nbytes + 63) & ~(size_t)63;
    if (posix_memalign(&p, 64, n ? n : 64))
        return NULL;
    return p;
}

static void cpu_free(void *ctx, int ordinal, void *p, size_t nbytes)
{
    (void)ctx;
    (void)ordinal;
    (void)nbytes;
    free(p);
}

#define CPU_BINARY(NAME, EXPR)                                                                     \
    static void NAME(float *restrict y, const float *restrict a, const float *restrict b,          \
                     int64_t n, int nt)                                                            \
    {                                                                                              \
        _Pragma("omp parallel for simd schedule(static) if(n > CPU_PAR_MIN) num_threads(nt)")      \
        for (int64_t i = 0; i < n; i++)                                                            \
            y[i] = (EXPR);                                                                         \
    }

CPU_BINARY(cpu_add, a[i] + b[i])
CPU_BINARY(cpu_sub, a[i] - b[i])
CPU_BINARY(cpu_mul, a[i] * b[i])
CPU_BINARY(cpu_div, a[i] / b[i])

static void cpu_relu(float *restrict y, const float *restrict a, int64_t n, int nt)
{
#pragma omp parallel for simd schedule(static) if (n > CPU_PAR_MIN) num_threads(nt)
    for (int64_t i = 0; i < n; i++)
        y[i] = a[i] > 0.0f ? a[i] : 0.0f;
}

static float cpu_sum(const float *restrict a, int64_t n, int nt)
{
    double total = 0.0;
#pragma omp parallel for reduction(+ : total) schedule(static) if (n > CPU_PAR_MIN) num_threads(nt)
    for (int64_t blk = 0; blk < (n + 4095) / 4096; blk++) {
        /* float lanes inside a block vectorise; blocks add up in double. */
        float s = 0.0f;
        int64_t lo = blk * 4096, hi = lo + 4096 < n ? lo + 4096 : n;
#pragma omp simd reduction(+ : s)
        for (int64_t i = lo; i < hi; i++)
            s += a[i];
        total += s;
    }
    return (float)total;
}

static int cpu_execute(void *ctx, int ordinal, const tdd_opcall *c)
{
    cpu_ctx *cc = ctx;
    (void)ordinal;
    for (int i = 0; i < c->n_in; i++)
        if (!tdd_is_contiguous(c->in[i]))
            return TD_EUNSUPPORTED_OP; /* strided kernels arrive with the view ops */
    const float *a = tdd_data(c->in[0]);
    const float *b = c->n_in > 1 ? tdd_data(c->in[1]) : NULL;
    float *y = tdd_data(c->out[0]);
    int64_t n = tdd_numel(c->out[0]);
    int nt = cc->threads;
    switch (c->op) {
    case TDD_OP_ADD:
        cpu_add(y, a, b, n, nt);
        return 0;
    case TDD_OP_SUB:
        cpu_sub(y, a, b, n, nt);
        return 0;
    case TDD_OP_MUL:
        cpu_mul(y, a, b, n, nt);
        return 0;
    case TDD_OP_DIV:
        cpu_div(y, a, b, n, nt);
        return 0;
    case TDD_OP_RELU:
        cpu_relu(y, a, n, nt);
        return 0;
    case TDD_OP_SUM:
        y[0] = cpu_sum(a, tdd_numel(c->in[0]), nt);
        return 0;
    case TDD_OP_MATMUL: {
        int64_t M = c->in[0]->shape[0], K = c->in[0]->shape[1], N = c->in[1]->shape[1];
        if (M == 0 || N == 0)
            return 0;
        if (K == 0) {
            memset(y, 0, (size_t)(M * N) * sizeof *y);
            return 0;
        }
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (blasint)M, (blasint)N,
                    (blasint)K, 1.0f, a, (blasint)K, b, (blasint)N, 0.0f, y, (blasint)N);
        return 0;
    }
    case TDD_OP_COUNT:
        break;
    }
    return TD_EUNSUPPORTED_OP;
}

const tdd_backend tdd_backend_cpu = {
    .name = "cpu",
    .host_memory = true,
    .init = cpu_init,
    .shutdown = cpu_shutdown,
    .device_name = cpu_device_name,
    .memory_total = cpu_memory_total,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .execute = cpu_execute,
};
