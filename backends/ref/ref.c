/* ref.c -- the reference backend: plain, single-threaded, readable C. The oracle. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"

/* Storage offset (in elements) of the i-th element in C order of view t. */
static int64_t ref_index(const tdd_tensor *t, int64_t i)
{
    int64_t off = t->offset;
    for (int d = t->ndim - 1; d >= 0; d--) {
        int64_t n = t->shape[d];
        off += (i % n) * t->strides[d];
        i /= n;
    }
    return off;
}

static float ref_get(const tdd_tensor *t, int64_t i)
{
    return ((const float *)t->st->data)[ref_index(t, i)];
}

static int ref_init(const tdd_backend_config *cfg, void **ctx, char *why, size_t why_len)
{
    (void)cfg;
    (void)why;
    (void)why_len;
    *ctx = NULL;
    return 1;
}

static void ref_shutdown(void *ctx)
{
    (void)ctx;
}

static void ref_device_name(void *ctx, int ordinal, char *buf, size_t len)
{
    (void)ctx;
    (void)ordinal;
    snprintf(buf, len, "reference CPU (single-threaded)");
}

static void *ref_alloc(void *ctx, int ordinal, size_t nbytes)
{
    (void)ctx;
    (void)ordinal;
    return malloc(nbytes ? nbytes : 1);
}

static void ref_free(void *ctx, int ordinal, void *p, size_t nbytes)
{
    (void)ctx;
    (void)ordinal;
    (void)nbytes;
    free(p);
}

static int ref_execute(void *ctx, int ordinal, const tdd_opcall *c)
{
    (void)ctx;
    (void)ordinal;
    const tdd_tensor *a = c->in[0], *b = c->n_in > 1 ? c->in[1] : NULL;
    tdd_tensor *o = c->out[0];
    float *y = tdd_data(o);
    int64_t n = tdd_numel(o);
    switch (c->op) {
    case TDD_OP_ADD:
        for (int64_t i = 0; i < n; i++)
            y[i] = ref_get(a, i) + ref_get(b, i);
        return 0;
    case TDD_OP_SUB:
        for (int64_t i = 0; i < n; i++)
            y[i] = ref_get(a, i) - ref_get(b, i);
        return 0;
    case TDD_OP_MUL:
        for (int64_t i = 0; i < n; i++)
            y[i] = ref_get(a, i) * ref_get(b, i);
        return 0;
    case TDD_OP_DIV:
        for (int64_t i = 0; i < n; i++)
            y[i] = ref_get(a, i) / ref_get(b, i);
        return 0;
    case TDD_OP_RELU:
        for (int64_t i = 0; i < n; i++) {
            float v = ref_get(a, i);
            y[i] = v > 0.0f ? v : 0.0f;
        }
        return 0;
    case TDD_OP_SUM: {
        double s = 0.0; /* double accumulation: the oracle should be the more exact side */
        int64_t m = tdd_numel(a);
        for (int64_t i = 0; i < m; i++)
            s += ref_get(a, i);
        y[0] = (float)s;
        return 0;
    }
    case TDD_OP_MATMUL: {
        int64_t M = a->shape[0], K = a->shape[1], N = b->shape[1];
        for (int64_t i = 0; i < M; i++)
            for (int64_t j = 0; j < N; j++) {
                double s = 0.0;
                for (int64_t k = 0; k < K; k++)
                    s += (double)ref_get(a, i * K + k) * ref_get(b, k * N + j);
                y[i * N + j] = (float)s;
            }
        return 0;
    }
    case TDD_OP_COUNT:
        break;
    }
    return TD_EUNSUPPORTED_OP;
}

const tdd_backend tdd_backend_ref = {
    .name = "ref",
    .host_memory = true,
    .init = ref_init,
    .shutdown = ref_shutdown,
    .device_name = ref_device_name,
    .alloc = ref_alloc,
    .free = ref_free,
    .execute = ref_execute,
};
