/* ref.c -- the reference backend: plain, single-threaded, readable C. The
 * oracle every other backend is compared with. Kernels compute in double
 * (int64 for integer dtypes) and round once on store. */
#include "ref.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void ref_unravel(int64_t i, const int64_t *shape, int ndim, int64_t *idx)
{
    for (int d = ndim - 1; d >= 0; d--) {
        idx[d] = shape[d] ? i % shape[d] : 0;
        i = shape[d] ? i / shape[d] : 0;
    }
}

int64_t ref_at(const tdd_tensor *t, const int64_t *idx, int ndim)
{
    int64_t off = t->offset;
    for (int d = 0; d < t->ndim; d++) {
        int od = d + ndim - t->ndim;
        if (t->shape[d] != 1)
            off += idx[od] * t->strides[d];
    }
    return off;
}

int64_t ref_index(const tdd_tensor *t, int64_t i)
{
    int64_t idx[TD_MAX_NDIM];
    ref_unravel(i, t->shape, t->ndim, idx);
    return ref_at(t, idx, t->ndim);
}

double ref_round(td_dtype dt, double v)
{
    switch (dt) {
    case TD_F32:
        return (float)v;
    case TD_F16:
        return tdd_f16_to_f32(tdd_f32_to_f16((float)v));
    case TD_BF16:
        return tdd_bf16_to_f32(tdd_f32_to_bf16((float)v));
    case TD_F64:
    case TD_I32:
    case TD_I64:
    case TD_BOOL:
    case TD_DTYPE_INVALID:
    case TD_DTYPE_COUNT:
        break;
    }
    return v;
}

int64_t ref_line(const tdd_tensor *t, int d, int64_t j, int64_t *step)
{
    int64_t off = t->offset;
    for (int k = t->ndim - 1; k >= 0; k--) {
        if (k == d)
            continue;
        off += (j % t->shape[k]) * t->strides[k];
        j /= t->shape[k];
    }
    *step = t->ndim ? t->strides[d] : 0;
    return off;
}

int tdd_ref_run(const tdd_opcall *c)
{
    switch (c->op) {
    case TDD_OP_ADD:
    case TDD_OP_SUB:
    case TDD_OP_MUL:
    case TDD_OP_DIV:
    case TDD_OP_POW:
    case TDD_OP_MAXIMUM:
    case TDD_OP_MINIMUM:
    case TDD_OP_REMAINDER:
    case TDD_OP_EQ:
    case TDD_OP_NE:
    case TDD_OP_LT:
    case TDD_OP_LE:
    case TDD_OP_GT:
    case TDD_OP_GE:
    case TDD_OP_LOGICAL_AND:
    case TDD_OP_LOGICAL_OR:
    case TDD_OP_LOGICAL_XOR:
    case TDD_OP_WHERE:
    case TDD_OP_MASKED_FILL:
    case TDD_OP_RELU_BACKWARD:
    case TDD_OP_NEG:
    case TDD_OP_ABS:
    case TDD_OP_SIGN:
    case TDD_OP_EXP:
    case TDD_OP_LOG:
    case TDD_OP_LOG1P:
    case TDD_OP_EXPM1:
    case TDD_OP_SQRT:
    case TDD_OP_RSQRT:
    case TDD_OP_SIN:
    case TDD_OP_COS:
    case TDD_OP_TANH:
    case TDD_OP_SIGMOID:
    case TDD_OP_RELU:
    case TDD_OP_LEAKY_RELU:
    case TDD_OP_GELU:
    case TDD_OP_SILU:
    case TDD_OP_SOFTPLUS:
    case TDD_OP_CLAMP:
    case TDD_OP_FLOOR:
    case TDD_OP_CEIL:
    case TDD_OP_ROUND:
    case TDD_OP_RECIPROCAL:
    case TDD_OP_SQUARE:
    case TDD_OP_LOGICAL_NOT:
        return ref_elementwise(c);
    case TDD_OP_SUM:
    case TDD_OP_MEAN:
    case TDD_OP_AMAX:
    case TDD_OP_AMIN:
    case TDD_OP_ARGMAX:
    case TDD_OP_ARGMIN:
    case TDD_OP_VAR:
    case TDD_OP_STD:
    case TDD_OP_LOGSUMEXP:
    case TDD_OP_PROD:
    case TDD_OP_SUM_TO:
    case TDD_OP_CUMSUM:
    case TDD_OP_SOFTMAX:
    case TDD_OP_LOG_SOFTMAX:
        return ref_reduce(c);
    case TDD_OP_MATMUL:
    case TDD_OP_BMM:
    case TDD_OP_LINEAR:
        return ref_matmul(c);
    case TDD_OP_TRANSPOSE:
    case TDD_OP_PERMUTE:
    case TDD_OP_RESHAPE:
    case TDD_OP_VIEW:
    case TDD_OP_FLATTEN:
    case TDD_OP_SQUEEZE:
    case TDD_OP_UNSQUEEZE:
    case TDD_OP_EXPAND:
    case TDD_OP_SLICE:
    case TDD_OP_CONTIGUOUS:
    case TDD_OP_DETACH:
    case TDD_OP_SPLIT:
    case TDD_OP_CHUNK:
    case TDD_OP_CLONE:
    case TDD_OP_CAST:
        return ref_copy(c);
    case TDD_OP_CAT:
    case TDD_OP_STACK:
    case TDD_OP_GATHER:
    case TDD_OP_SCATTER_ADD:
    case TDD_OP_INDEX_SELECT:
    case TDD_OP_ONE_HOT:
    case TDD_OP_EMBEDDING:
    case TDD_OP_TRIL:
    case TDD_OP_TRIU:
    case TDD_OP_PAD:
        return ref_index_op(c);
    case TDD_OP_CROSS_ENTROPY:
    case TDD_OP_NLL_LOSS:
    case TDD_OP_MSE_LOSS:
    case TDD_OP_BCE_WITH_LOGITS:
        return ref_loss(c);
    case TDD_OP_LAYER_NORM:
    case TDD_OP_DROPOUT:
    case TDD_OP_CONV2D:
    case TDD_OP_MAX_POOL2D:
    case TDD_OP_AVG_POOL2D:
        return ref_nn(c);
    case TDD_OP_FULL:
    case TDD_OP_ZEROS:
    case TDD_OP_ONES:
    case TDD_OP_ARANGE:
    case TDD_OP_LINSPACE:
    case TDD_OP_EYE:
    case TDD_OP_RAND:
    case TDD_OP_RANDN:
    case TDD_OP_RANDINT:
        return ref_create(c);
    case TDD_OP_COUNT:
        break;
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
