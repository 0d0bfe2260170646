/* ops_iter.c -- the strided-iteration helper (iter.h) and the operand views
 * the fast kernels share (reduction dim split, matmul batch broadcasting). */
#include "iter.h"

#include <string.h>

void tdd_bcast_strides(const tdd_tensor *t, const int64_t *shape, int ndim, int64_t *strides)
{
    int lead = ndim - t->ndim;
    for (int d = 0; d < ndim; d++) {
        int td = d - lead;
        strides[d] = (td < 0 || t->shape[td] == 1) ? 0 : t->strides[td];
    }
    (void)shape;
}

void tdd_iter_init(tdd_iter *it, int nops, const int64_t *shape, int ndim,
                   const int64_t (*strides)[TD_MAX_NDIM], const int64_t *base)
{
    memset(it, 0, sizeof *it);
    it->nops = nops;
    it->numel = 1;
    for (int k = 0; k < nops; k++)
        it->base[k] = base ? base[k] : 0;
    /* Keep dims of size != 1 (size-1 dims never move an offset), merging a dim
     * into the previous kept one when every operand steps through both as one. */
    int n = 0;
    for (int d = 0; d < ndim; d++) {
        it->numel *= shape[d];
        if (shape[d] == 1)
            continue;
        bool merge = n > 0;
        for (int k = 0; merge && k < nops; k++)
            merge = strides[k][d] * shape[d] == it->strides[k][n - 1];
        if (merge) {
            it->shape[n - 1] *= shape[d];
            for (int k = 0; k < nops; k++)
                it->strides[k][n - 1] = strides[k][d];
            continue;
        }
        it->shape[n] = shape[d];
        for (int k = 0; k < nops; k++)
            it->strides[k][n] = strides[k][d];
        n++;
    }
    if (n == 0) { /* a single element (or 0-dim) */
        it->shape[0] = 1;
        n = 1;
    }
    it->ndim = n;
}

void tdd_iter_tensors(tdd_iter *it, const int64_t *shape, int ndim, int nops,
                      const tdd_tensor *const *ts)
{
    int64_t st[TDD_ITER_MAX_OPS][TD_MAX_NDIM];
    int64_t base[TDD_ITER_MAX_OPS];
    for (int k = 0; k < nops; k++) {
        tdd_bcast_strides(ts[k], shape, ndim, st[k]);
        base[k] = ts[k]->offset;
    }
    tdd_iter_init(it, nops, shape, ndim, (const int64_t(*)[TD_MAX_NDIM])st, base);
}

void tdd_iter_range(const tdd_iter *it, int64_t lo, int64_t hi, tdd_iter_fn fn, void *ctx)
{
    if (lo >= hi)
        return;
    int nd = it->ndim, inner = nd - 1;
    int64_t idx[TD_MAX_NDIM] = {0}, off[TDD_ITER_MAX_OPS], st[TDD_ITER_MAX_OPS];
    /* Seek: decompose lo into a multi-index. */
    int64_t rem = lo;
    for (int d = nd - 1; d >= 0; d--) {
        idx[d] = rem % it->shape[d];
        rem /= it->shape[d];
    }
    for (int k = 0; k < it->nops; k++) {
        off[k] = it->base[k];
        for (int d = 0; d < nd; d++)
            off[k] += idx[d] * it->strides[k][d];
        st[k] = it->strides[k][inner];
    }
    int64_t pos = lo;
    while (pos < hi) {
        int64_t n = it->shape[inner] - idx[inner];
        if (n > hi - pos)
            n = hi - pos;
        fn(ctx, n, off, st);
        pos += n;
        if (pos >= hi)
            break;
        /* Advance the multi-index by n (the run ended at the end of the inner dim). */
        idx[inner] += n;
        for (int k = 0; k < it->nops; k++)
            off[k] += n * st[k];
        for (int d = inner; d > 0 && idx[d] == it->shape[d]; d--) {
            idx[d] = 0;
            idx[d - 1]++;
            for (int k = 0; k < it->nops; k++)
                off[k] += it->strides[k][d - 1] - it->shape[d] * it->strides[k][d];
        }
    }
}

void tdd_split_dims(const tdd_tensor *t, uint32_t mask, int *nkept, int64_t *kshape,
                    int64_t *kstrides, int *nred, int64_t *rshape, int64_t *rstrides)
{
    *nkept = *nred = 0;
    for (int d = 0; d < t->ndim; d++) {
        if (mask & (1u << d)) {
            rshape[*nred] = t->shape[d];
            rstrides[(*nred)++] = t->strides[d];
        } else {
            kshape[*nkept] = t->shape[d];
            kstrides[(*nkept)++] = t->strides[d];
        }
    }
}

void tdd_matmul_views(const tdd_opcall *c, tdd_tensor *a, tdd_tensor *b, tdd_tensor *y)
{
    const tdd_opargs *g = c->args;
    const tdd_tensor *x = c->in[0], *w = c->in[1];
    int nb = (int)g->i[3];
    int64_t M = g->i[0], K = g->i[1], N = g->i[2];
    *a = *x;
    *b = *w;
    *y = *c->out[0];
    a->ndim = b->ndim = y->ndim = nb + 2;
    /* batch dims: right-aligned broadcast of each operand's leading dims */
    int xa = x->ndim - ((g->flags & 1u) ? 1 : 2);
    int wb = c->op == TDD_OP_LINEAR ? 0 : w->ndim - ((g->flags & 2u) ? 1 : 2);
    for (int d = 0; d < nb; d++) {
        int ad = d - (nb - xa), bd = d - (nb - wb);
        a->shape[d] = b->shape[d] = y->shape[d] = g->ints[0][d];
        a->strides[d] = (ad < 0 || x->shape[ad] == 1) ? 0 : x->strides[ad];
        b->strides[d] = (bd < 0 || w->shape[bd] == 1) ? 0 : w->strides[bd];
    }
    a->shape[nb] = M;
    a->shape[nb + 1] = K;
    if (g->flags & 1u) {
        a->strides[nb] = 0;
        a->strides[nb + 1] = x->strides[x->ndim - 1];
    } else {
        a->strides[nb] = x->strides[x->ndim - 2];
        a->strides[nb + 1] = x->strides[x->ndim - 1];
    }
    b->shape[nb] = K;
    b->shape[nb + 1] = N;
    if (c->op == TDD_OP_LINEAR) { /* b = W^T; W is [N, K] or [K] */
        if (w->ndim == 1) {
            b->strides[nb] = w->strides[0];
            b->strides[nb + 1] = 0;
        } else {
            b->strides[nb] = w->strides[1];
            b->strides[nb + 1] = w->strides[0];
        }
    } else if (g->flags & 2u) {
        b->strides[nb] = w->strides[0];
        b->strides[nb + 1] = 0;
    } else {
        b->strides[nb] = w->strides[w->ndim - 2];
        b->strides[nb + 1] = w->strides[w->ndim - 1];
    }
    y->shape[nb] = M;
    y->shape[nb + 1] = N;
    tdd_set_contiguous(y); /* outputs of non-view ops are C-contiguous */
}
