/* ref.c -- the reference backend: plain, single-threaded, readable C. The
 * oracle every other backend is compared with. Kernels compute in double
 * (int64 for integer dtypes) and round once on store. This file is its
 * dispatch and backend table; the kernels are ref_*.c, their shared helpers
 * ref_kit.c. */
#include "ref.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int ref_run_sub(void *ctx, int ordinal, const tdd_opcall *c)
{
    (void)ctx;
    (void)ordinal;
    return tdd_ref_run(c);
}

int tdd_ref_run(const tdd_opcall *c)
{
    if ((unsigned)c->op >= TDD_OP_COUNT)
        return TD_EUNSUPPORTED_OP;
    tdd_composite_fn parts = tdd_op_composite(c); /* run as other ops (ops.h) */
    if (parts)
        return parts(c, ref_run_sub, NULL, 0);
    switch (tdd_opdefs[c->op].kind) {
    case TDD_KIND_BINARY:
    case TDD_KIND_UNARY:
    case TDD_KIND_ELEMENT:
        return ref_elementwise(c);
    case TDD_KIND_REDUCE:
        return ref_reduce(c);
    case TDD_KIND_LINALG:
        return ref_matmul(c);
    case TDD_KIND_VIEW:
        return ref_copy(c);
    case TDD_KIND_CREATE:
        return ref_create(c);
    case TDD_KIND_INDEX:
        /* copies of any dtype; the other index ops are ref_index_op's */
        return c->op == TDD_OP_CLONE || c->op == TDD_OP_CAST ? ref_copy(c) : ref_index_op(c);
    case TDD_KIND_NN:
        switch (c->op) {
        case TDD_OP_EMBEDDING_BAG:
        case TDD_OP_EMBEDDING_BAG_BACKWARD:
        case TDD_OP_MULTINOMIAL:
            return ref_bag_op(c);
        case TDD_OP_CROSS_ENTROPY:
        case TDD_OP_NLL_LOSS:
        case TDD_OP_MSE_LOSS:
        case TDD_OP_BCE_WITH_LOGITS:
            return ref_loss(c);
        default:
            return ref_nn(c);
        }
    }
    return TD_EUNSUPPORTED_OP;
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
    return tdd_ref_run(c);
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
