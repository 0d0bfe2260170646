/* tensor.c -- shape and stride arithmetic, overflow-checked. */
#include "tensor.h"

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
    uint64_t n = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0)
            return -1;
        if (tdd_mul_overflows(n, (uint64_t)shape[i], &n) || n > (uint64_t)max)
            return -1;
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
