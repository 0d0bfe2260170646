/* tensor.c -- shape and stride arithmetic, overflow-checked. */
#include "tensor.h"

#include <string.h>

int64_t tdd_numel(const tdd_tensor *t)
{
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++)
        n *= t->shape[i];
    return n;
}

bool tdd_is_contiguous(const tdd_tensor *t)
{
    int64_t expect = 1;
    for (int i = t->ndim - 1; i >= 0; i--) {
        if (t->shape[i] != 1 && t->strides[i] != expect)
            return false;
        expect *= t->shape[i];
    }
    return true;
}

void tdd_set_contiguous(tdd_tensor *t)
{
    int64_t s = 1;
    for (int i = t->ndim - 1; i >= 0; i--) {
        t->strides[i] = s;
        s *= t->shape[i] ? t->shape[i] : 1;
    }
}

bool tdd_mul_overflows(uint64_t a, uint64_t b, uint64_t *out)
{
    return __builtin_mul_overflow(a, b, out);
}

int64_t tdd_shape_numel(const int64_t *shape, int ndim, int64_t max)
{
    /* The extent (the product with 0-size dims counted as 1) is bounded too: strides and
     * offsets are computed from it, and a shape like [0, 2^40, 2^40] holds no element but
     * would overflow them (found by the fuzzer). */
    uint64_t n = 1, extent = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0)
            return -1;
        uint64_t d = (uint64_t)shape[i];
        if (tdd_mul_overflows(extent, d ? d : 1, &extent) || extent > (uint64_t)max)
            return -1;
        n *= d;
    }
    return (int64_t)n;
}

bool tdd_same_shape(const tdd_tensor *a, const tdd_tensor *b)
{
    if (a->ndim != b->ndim)
        return false;
    for (int i = 0; i < a->ndim; i++)
        if (a->shape[i] != b->shape[i])
            return false;
    return true;
}

void tdd_copy_contiguous(const tdd_tensor *src, void *dst)
{
    size_t isz = td_dtype_size(src->dtype);
    int64_t n = tdd_numel(src);
    if (n == 0)
        return;
    if (tdd_is_contiguous(src)) {
        memcpy(dst, tdd_data(src), (size_t)n * isz);
        return;
    }
    /* Walk the index like an odometer; copy the innermost dim as one run when it is dense. */
    int nd = src->ndim;
    int64_t idx[TD_MAX_NDIM] = {0};
    int64_t inner = nd ? src->shape[nd - 1] : 1, istride = nd ? src->strides[nd - 1] : 1;
    const char *base = (const char *)src->st->data;
    char *out = dst;
    for (int64_t done = 0; done < n; done += inner) {
        int64_t off = src->offset;
        for (int d = 0; d < nd - 1; d++)
            off += idx[d] * src->strides[d];
        if (istride == 1) {
            memcpy(out, base + (size_t)off * isz, (size_t)inner * isz);
            out += (size_t)inner * isz;
        } else {
            for (int64_t i = 0; i < inner; i++, out += isz)
                memcpy(out, base + (size_t)(off + i * istride) * isz, isz);
        }
        for (int d = nd - 2; d >= 0; d--) {
            if (++idx[d] < src->shape[d])
                break;
            idx[d] = 0;
        }
    }
}
