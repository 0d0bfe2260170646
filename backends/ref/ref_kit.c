/* ref_kit.c -- what the reference backend's kernel files share: indexing a strided tensor
 * (unravel, element offsets, a line along one dim) and rounding to a dtype. Below ref.c's
 * dispatch and the kernels (ref_*.c), which all call down to it. */
#include "ref.h"

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
    case TD_U8:
    case TD_I8:
    case TD_I16:
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
