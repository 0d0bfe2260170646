/* ref_nn.c -- reference matmul/bmm/linear, joins and indexing ops, and the
 * NN ops (layer_norm, dropout, conv2d, pooling) as direct loops. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "iter.h"
#include "ref.h"

int ref_matmul(const tdd_opcall *c)
{
    const tdd_opargs *g = c->args;
    tdd_tensor a, b, y;
    tdd_matmul_views(c, &a, &b, &y);
    int nb = (int)g->i[3];
    int64_t M = g->i[0], K = g->i[1], N = g->i[2], n = tdd_numel(&y);
    int64_t idx[TD_MAX_NDIM];
    bool ints = !tdd_dtype_is_float(y.dtype);
    for (int64_t e = 0; e < n; e++) {
        ref_unravel(e, y.shape, y.ndim, idx);
        int64_t i = idx[nb], j = idx[nb + 1];
        idx[nb + 1] = 0;
        idx[nb] = i;
        int64_t ao = ref_at(&a, idx, nb + 2); /* row i of a */
        idx[nb] = 0;
        idx[nb + 1] = j;
        int64_t bo = ref_at(&b, idx, nb + 2); /* column j of b */
        int64_t as = a.strides[nb + 1], bs = b.strides[nb];
        double s = 0;
        int64_t si = 0;
        for (int64_t k = 0; k < K; k++) {
            if (ints)
                si = (int64_t)((uint64_t)si + (uint64_t)ref_geti(&a, ao + k * as) *
                                                  (uint64_t)ref_geti(&b, bo + k * bs));
            else
                s += ref_getf(&a, ao + k * as) * ref_getf(&b, bo + k * bs);
        }
        if (g->flags & 4u) { /* linear's bias, broadcast over the output */
            const tdd_tensor *bias = c->in[2];
            tdd_tensor *out = c->out[0];
            int64_t oidx[TD_MAX_NDIM];
            ref_unravel(e, out->shape, out->ndim, oidx);
            int64_t bo2 = ref_at(bias, oidx, out->ndim);
            if (ints)
                si += ref_geti(bias, bo2);
            else
                s += ref_getf(bias, bo2);
        }
        (void)M;
        (void)N;
        if (ints)
            ref_seti(&y, ref_index(&y, e), si);
        else
            ref_setf(&y, ref_index(&y, e), s);
    }
    return 0;
}

/* Copies element (src, so) to (dst, doff) exactly (ints stay ints). */
static void move1(tdd_tensor *dst, int64_t doff, const tdd_tensor *src, int64_t so)
{
    if (tdd_dtype_is_float(src->dtype))
        ref_setf(dst, doff, ref_getf(src, so));
    else
        ref_seti(dst, doff, ref_geti(src, so));
}

static int64_t at_idx(const tdd_tensor *t, const int64_t *idx)
{
    int64_t off = t->offset;
    for (int d = 0; d < t->ndim; d++)
        off += idx[d] * t->strides[d];
    return off;
}

int ref_index_op(const tdd_opcall *c)
{
    const tdd_opargs *g = c->args;
    const tdd_tensor *a = c->in[0];
    tdd_tensor *y = c->out[0];
    int d = (int)g->i[0];
    int64_t idx[TD_MAX_NDIM], n = tdd_numel(y);
    switch (c->op) {
    case TDD_OP_CAT:
    case TDD_OP_STACK: {
        int64_t pos = 0;
        for (int k = 0; k < c->n_in; k++) {
            const tdd_tensor *t = c->in[k];
            int64_t m = tdd_numel(t);
            for (int64_t i = 0; i < m; i++) {
                int64_t oidx[TD_MAX_NDIM];
                ref_unravel(i, t->shape, t->ndim, idx);
                if (c->op == TDD_OP_CAT) {
                    memcpy(oidx, idx, sizeof oidx);
                    oidx[d] += pos;
                } else {
                    for (int j = 0, s = 0; j < y->ndim; j++)
                        oidx[j] = j == d ? k : idx[s++];
                }
                move1(y, at_idx(y, oidx), t, ref_index(t, i));
            }
            if (c->op == TDD_OP_CAT)
                pos += t->shape[d];
        }
        return 0;
    }
    case TDD_OP_GATHER:
    case TDD_OP_SCATTER_ADD: {
        const tdd_tensor *ix = c->in[1];
        if (c->op == TDD_OP_SCATTER_ADD) {
            for (int64_t i = 0; i < n; i++)
                move1(y, ref_index(y, i), a, ref_index(a, i));
        }
        int64_t m = tdd_numel(ix);
        for (int64_t i = 0; i < m; i++) {
            ref_unravel(i, ix->shape, ix->ndim, idx);
            int64_t k = ref_geti(ix, ref_index(ix, i));
            int64_t size = a->ndim ? a->shape[d] : 1;
            if (k < 0 || k >= size)
                return TD_EINVALID_ARGUMENT; /* index out of range */
            int64_t sidx[TD_MAX_NDIM];
            memcpy(sidx, idx, sizeof sidx);
            if (a->ndim)
                sidx[d] = k;
            if (c->op == TDD_OP_GATHER) {
                move1(y, ref_index(y, i), a, at_idx(a, sidx));
            } else {
                const tdd_tensor *src = c->in[2];
                int64_t yo = at_idx(y, sidx), so = at_idx(src, idx);
                if (tdd_dtype_is_float(y->dtype))
                    ref_setf(y, yo, ref_getf(y, yo) + ref_getf(src, so));
                else
                    ref_seti(y, yo, ref_geti(y, yo) + ref_geti(src, so));
            }
        }
        return 0;
    }
    case TDD_OP_INDEX_SELECT:
    case TDD_OP_EMBEDDING: {
        bool emb = c->op == TDD_OP_EMBEDDING;
        const tdd_tensor *src = emb ? c->in[1] : a, *ix = emb ? a : c->in[1];
        int dd = emb ? 0 : d;
        int64_t size = src->ndim ? src->shape[dd] : 1;
        for (int64_t i = 0; i < n; i++) {
            ref_unravel(i, y->shape, y->ndim, idx);
            int64_t sidx[TD_MAX_NDIM], k;
            if (emb) {
                k = ref_geti(ix, ref_index(ix, i / src->shape[1]));
                sidx[0] = k;
                sidx[1] = idx[y->ndim - 1];
            } else {
                memcpy(sidx, idx, sizeof sidx);
                k = ref_geti(ix, ref_index(ix, src->ndim ? idx[dd] : 0));
                if (src->ndim)
                    sidx[dd] = k;
            }
            if (k < 0 || k >= size)
                return TD_EINVALID_ARGUMENT;
            move1(y, ref_index(y, i), src, at_idx(src, sidx));
        }
        return 0;
    }
    case TDD_OP_ONE_HOT: {
        int64_t C = g->i[0];
        for (int64_t i = 0; i < n; i++) {
            int64_t k = ref_geti(a, ref_index(a, i / C));
            if (k < 0 || k >= C)
                return TD_EINVALID_ARGUMENT;
            ref_seti(y, ref_index(y, i), k == i % C);
        }
        return 0;
    }
    case TDD_OP_TRIL:
    case TDD_OP_TRIU:
        for (int64_t i = 0; i < n; i++) {
            ref_unravel(i, y->shape, y->ndim, idx);
            int64_t off = idx[y->ndim - 1] - idx[y->ndim - 2];
            bool keep = c->op == TDD_OP_TRIL ? off <= g->i[0] : off >= g->i[0];
            if (keep)
                move1(y, ref_index(y, i), a, ref_index(a, i));
            else
                ref_seti(y, ref_index(y, i), 0);
        }
        return 0;
    case TDD_OP_SORT:
    case TDD_OP_ARGSORT:
    case TDD_OP_TOPK: {
        /* each element's rank in its line (stable, NaN as the largest): element j goes to
         * position rank when rank < K */
        bool arg = c->op == TDD_OP_ARGSORT, fl = tdd_dtype_is_float(a->dtype);
        tdd_tensor *ix = arg ? c->out[0] : c->out[1];
        int64_t m = tdd_numel(a), L = a->ndim ? a->shape[d] : 1, st = a->ndim ? a->strides[d] : 0;
        int desc = (int)g->i[1];
        for (int64_t i = 0; i < m; i++) {
            ref_unravel(i, a->shape, a->ndim, idx);
            int64_t j = a->ndim ? idx[d] : 0, ao = at_idx(a, idx), base = ao - j * st, rank = 0;
            for (int64_t q = 0; q < L; q++) {
                int64_t qo = base + q * st;
                rank += fl ? tdd_sort_before(ref_getf(a, qo), q, ref_getf(a, ao), j, desc)
                           : tdd_sort_before_i(ref_geti(a, qo), q, ref_geti(a, ao), j, desc);
            }
            if (rank >= g->i[2])
                continue;
            if (a->ndim)
                idx[d] = rank;
            if (!arg)
                move1(y, at_idx(y, idx), a, ao);
            ref_seti(ix, at_idx(ix, idx), j);
        }
        return 0;
    }
    case TDD_OP_PAD:
        for (int64_t i = 0; i < n && g->i[0]; i++) { /* reflect, replicate, circular */
            ref_unravel(i, y->shape, y->ndim, idx);
            for (int k = 0; k < y->ndim; k++)
                idx[k] = tdd_pad_at((int)g->i[0], idx[k], g->ints[0][k], a->shape[k], g->ints[1][k],
                                    g->ints[2][k]);
            move1(y, ref_index(y, i), a, at_idx(a, idx));
        }
        for (int64_t i = 0; i < n && !g->i[0]; i++) {
            ref_unravel(i, y->shape, y->ndim, idx);
            bool inside = true;
            for (int k = 0; k < y->ndim; k++) {
                idx[k] -= g->ints[0][k];
                inside = inside && idx[k] >= 0 && idx[k] < a->shape[k];
            }
            if (inside)
                move1(y, ref_index(y, i), a, at_idx(a, idx));
            else
                ref_setf(y, ref_index(y, i), g->f[0]);
        }
        return 0;
    default:
        return TD_EINTERNAL;
    }
}

/* x at (n, c, h, w) of a [N,C,H,W] or [C,H,W] tensor. */
static int64_t at4(const tdd_tensor *x, int64_t n, int64_t ch, int64_t h, int64_t w)
{
    int b = x->ndim == 4;
    return x->offset + (b ? n * x->strides[0] : 0) + ch * x->strides[b] + h * x->strides[b + 1] +
           w * x->strides[b + 2];
}

/* max_pool2d's choice in the window of plane (nn, ch) from (h0, w0): its flat index h * W + w
 * (the first of equal maxima; a NaN wins over any number), -1 when the window holds nothing;
 * its value in *best. The forward and max_pool2d_backward both ask it. */
static int64_t max_window(const tdd_tensor *x, const tdd_opargs *g, int64_t nn, int64_t ch,
                          int64_t h0, int64_t w0, double *best)
{
    int64_t H = x->shape[x->ndim - 2], W = x->shape[x->ndim - 1], arg = -1;
    const int64_t *dl = g->ints[2], *ks = g->ints[3];
    *best = -INFINITY;
    for (int64_t i = 0; i < ks[0]; i++)
        for (int64_t j = 0; j < ks[1]; j++) {
            int64_t h = h0 + i * dl[0], ww = w0 + j * dl[1];
            if (h < 0 || h >= H || ww < 0 || ww >= W)
                continue;
            double v = ref_getf(x, at4(x, nn, ch, h, ww));
            if (arg < 0 || v > *best || (v != v && *best == *best)) {
                *best = v;
                arg = h * W + ww;
            }
        }
    return arg;
}

/* max_pool2d_backward(grad_output, input): each window's gradient added at its maximum. */
static int ref_max_pool2d_backward(const tdd_opcall *c)
{
    const tdd_opargs *g = c->args;
    const tdd_tensor *go = c->in[0], *x = c->in[1];
    tdd_tensor *y = c->out[0];
    int b4 = go->ndim == 4;
    int64_t C = go->shape[b4], Ho = go->shape[b4 + 1], Wo = go->shape[b4 + 2];
    int64_t W = x->shape[x->ndim - 1], n = tdd_numel(go), ny = tdd_numel(y);
    const int64_t *st = g->ints[0], *pd = g->ints[1];
    for (int64_t e = 0; e < ny; e++)
        ref_setf(y, ref_index(y, e), 0.0);
    for (int64_t e = 0; e < n; e++) {
        int64_t ow = e % Wo, oh = (e / Wo) % Ho, ch = (e / (Wo * Ho)) % C, nn = e / (Wo * Ho * C);
        double best;
        int64_t arg = max_window(x, g, nn, ch, oh * st[0] - pd[0], ow * st[1] - pd[1], &best);
        if (arg < 0)
            continue;
        int64_t at = at4(y, nn, ch, arg / W, arg % W);
        ref_setf(y, at, ref_getf(y, at) + ref_getf(go, ref_index(go, e)));
    }
    return 0;
}

/* scaled_dot_product_attention, row by row in double: the scores, their softmax over the
 * attended positions (none attended: NaN, as softmax over -inf), dropout, then the weighted
 * sum of the values. */
static int ref_sdpa(const tdd_opcall *c)
{
    const tdd_opargs *g = c->args;
    const tdd_tensor *q = c->in[0], *k = c->in[1], *v = c->in[2];
    const tdd_tensor *m = c->n_in > 3 ? c->in[3] : NULL;
    tdd_tensor *y = c->out[0];
    int nd = y->ndim, nb = (int)g->i[6];
    int64_t S = g->i[3], E = g->i[4], Ev = g->i[5];
    int64_t rows = Ev ? tdd_numel(y) / Ev : 0, idx[TD_MAX_NDIM];
    double p = g->f[0], keep = p < 1.0 ? 1.0 / (1.0 - p) : 0.0;
    double *w = malloc((size_t)(S ? S : 1) * sizeof *w);
    if (!w)
        return TD_ERESOURCE_EXHAUSTED;
    for (int64_t r = 0; r < rows; r++) {
        ref_unravel(r * Ev, y->shape, nd, idx);
        int64_t i = idx[nb];
        double mx = -INFINITY, z = 0.0;
        for (int64_t j = 0; j < S; j++) {
            double s = 0.0;
            for (int64_t e = 0; e < E; e++) {
                idx[nb] = i;
                idx[nb + 1] = e;
                double qv = ref_getf(q, ref_at(q, idx, nd));
                idx[nb] = j;
                s += qv * ref_getf(k, ref_at(k, idx, nd));
            }
            s *= g->f[1];
            idx[nb] = i;
            idx[nb + 1] = j;
            if (g->i[0] && j > i)
                s = -INFINITY;
            else if (g->i[1] == 1 && !ref_geti(m, ref_at(m, idx, nd)))
                s = -INFINITY;
            else if (g->i[1] == 2)
                s += ref_getf(m, ref_at(m, idx, nd));
            w[j] = s;
            if (s > mx || s != s)
                mx = s;
        }
        for (int64_t j = 0; j < S; j++) {
            w[j] = exp(w[j] - mx); /* mx = -inf (nothing attended): NaN throughout */
            z += w[j];
        }
        for (int64_t j = 0; j < S; j++) {
            w[j] /= z;
            if (p > 0.0)
                w[j] *= tdd_rng_uniform(g->seed, (uint64_t)(r * S + j)) >= p ? keep : 0.0;
        }
        for (int64_t e = 0; e < Ev; e++) {
            double acc = 0.0;
            idx[nb + 1] = e;
            for (int64_t j = 0; j < S; j++) {
                idx[nb] = j;
                acc += w[j] * ref_getf(v, ref_at(v, idx, nd));
            }
            ref_setf(y, ref_index(y, r * Ev + e), acc);
        }
    }
    free(w);
    return 0;
}

/* interpolate: each output element from its (up to) four sources (tdd_interp_src). */
static int ref_interp(const tdd_opcall *c)
{
    const tdd_opargs *g = c->args;
    const tdd_tensor *x = c->in[0];
    tdd_tensor *y = c->out[0];
    int nd = (int)g->i[2], mode = (int)g->i[0], dbl = x->dtype == TD_F64;
    int64_t n = tdd_numel(y), idx[4], src[4];
    int64_t H = nd == 2 ? x->shape[2] : 1, W = x->shape[x->ndim - 1];
    int64_t Ho = nd == 2 ? y->shape[2] : 1, Wo = y->shape[y->ndim - 1];
    for (int64_t e = 0; e < n; e++) {
        ref_unravel(e, y->shape, y->ndim, idx);
        int64_t h0 = 0, h1 = 0, w0, w1;
        double lh = 0.0, lw;
        if (nd == 2)
            tdd_interp_src(mode, (int)g->i[1], dbl, g->f[0], idx[2], H, Ho, &h0, &h1, &lh);
        tdd_interp_src(mode, (int)g->i[1], dbl, g->f[nd - 1], idx[y->ndim - 1], W, Wo, &w0, &w1,
                       &lw);
        memcpy(src, idx, sizeof src);
        if (nd == 2)
            src[2] = h0;
        src[y->ndim - 1] = w0;
        double v = ref_getf(x, ref_at(x, src, x->ndim));
        if (mode == 1) {
            src[y->ndim - 1] = w1;
            double top = (1.0 - lw) * v + lw * ref_getf(x, ref_at(x, src, x->ndim));
            v = top;
            if (nd == 2) {
                src[2] = h1;
                src[3] = w0;
                double b0 = ref_getf(x, ref_at(x, src, x->ndim));
                src[3] = w1;
                double bot = (1.0 - lw) * b0 + lw * ref_getf(x, ref_at(x, src, x->ndim));
                v = (1.0 - lh) * top + lh * bot;
            }
        }
        ref_setf(y, ref_index(y, e), v);
    }
    return 0;
}

int ref_nn(const tdd_opcall *c)
{
    const tdd_opargs *g = c->args;
    const tdd_tensor *x = c->in[0];
    tdd_tensor *y = c->out[0];
    int64_t n = tdd_numel(y);
    switch (c->op) {
    case TDD_OP_BATCH_NORM:
        return ref_batch_norm(c);
    case TDD_OP_CONV_TRANSPOSE2D:
        return ref_conv_transpose2d(c);
    case TDD_OP_SDPA:
        return ref_sdpa(c);
    case TDD_OP_MAX_POOL2D_BACKWARD:
        return ref_max_pool2d_backward(c);
    case TDD_OP_PIXEL_SHUFFLE: /* element moves of any dtype (tdd_pixel_src) */
    case TDD_OP_PIXEL_UNSHUFFLE: {
        int nd = y->ndim;
        int64_t C = y->shape[nd - 3], H = y->shape[nd - 2], W = y->shape[nd - 1];
        size_t es = td_dtype_size(y->dtype);
        for (int64_t e = 0; e < n; e++) {
            int64_t rest = e / (C * H * W), ic, ih, iw, src = x->offset, dst = y->offset;
            for (int d = nd - 4; d >= 0; d--) {
                int64_t k = rest % y->shape[d];
                rest /= y->shape[d];
                src += k * x->strides[d];
                dst += k * y->strides[d];
            }
            int64_t w = e % W, h = e / W % H, ch = e / (W * H) % C;
            tdd_pixel_src(c->op == TDD_OP_PIXEL_UNSHUFFLE, g->i[0], ch, h, w, &ic, &ih, &iw);
            src += ic * x->strides[nd - 3] + ih * x->strides[nd - 2] + iw * x->strides[nd - 1];
            dst += ch * y->strides[nd - 3] + h * y->strides[nd - 2] + w * y->strides[nd - 1];
            memcpy((char *)y->st->data + (size_t)dst * es,
                   (const char *)x->st->data + (size_t)src * es, es);
        }
        return 0;
    }
    case TDD_OP_INTERPOLATE:
        return ref_interp(c);
    case TDD_OP_GROUP_NORM: { /* groups of C/G channels x the rest, per sample */
        int64_t N = x->shape[0], C = x->shape[1], G = g->i[0], Cg = C / G;
        int64_t S = N != 0 && C != 0 ? n / (N * C) : 0, M = Cg * S;
        for (int64_t r = 0; r < N * G; r++) {
            int64_t first = r * M; /* C-order: sample r / G, channels from (r % G) * Cg */
            double s = 0, ss = 0;
            for (int64_t j = 0; j < M; j++)
                s += ref_getf(x, ref_index(x, first + j));
            double mean = M ? s / (double)M : 0.0;
            for (int64_t j = 0; j < M; j++) {
                double dv = ref_getf(x, ref_index(x, first + j)) - mean;
                ss += dv * dv;
            }
            double rstd = 1.0 / sqrt((M ? ss / (double)M : 0.0) + g->f[0]);
            for (int64_t j = 0; j < M; j++) {
                int64_t ch = (r % G) * Cg + j / S;
                double v = (ref_getf(x, ref_index(x, first + j)) - mean) * rstd;
                if (g->flags & 1u)
                    v *= ref_getf(c->in[1], ref_index(c->in[1], ch));
                if (g->flags & 2u)
                    v += ref_getf(c->in[2], ref_index(c->in[2], ch));
                ref_setf(y, ref_index(y, first + j), v);
            }
        }
        return 0;
    }
    case TDD_OP_LAYER_NORM: {
        int64_t D = 1;
        for (int k = 0; k < g->i[0]; k++)
            D *= x->shape[x->ndim - 1 - k];
        int64_t rows = D ? n / D : 0;
        for (int64_t r = 0; r < rows; r++) {
            double s = 0, ss = 0;
            for (int64_t j = 0; j < D; j++)
                s += ref_getf(x, ref_index(x, r * D + j));
            double mean = s / (double)D;
            for (int64_t j = 0; j < D; j++) {
                double dv = ref_getf(x, ref_index(x, r * D + j)) - mean;
                ss += dv * dv;
            }
            double rstd = 1.0 / sqrt(ss / (double)D + g->f[0]);
            for (int64_t j = 0; j < D; j++) {
                double v = (ref_getf(x, ref_index(x, r * D + j)) - mean) * rstd;
                if (g->flags & 1u)
                    v *= ref_getf(c->in[1], ref_index(c->in[1], j));
                if (g->flags & 2u)
                    v += ref_getf(c->in[2], ref_index(c->in[2], j));
                ref_setf(y, ref_index(y, r * D + j), v);
            }
        }
        return 0;
    }
    case TDD_OP_DROPOUT: {
        double p = g->f[0];
        for (int64_t i = 0; i < n; i++) {
            double v = ref_getf(x, ref_index(x, i));
            if (g->i[0]) /* train: keep with probability 1-p, scaled */
                v = (p < 1.0 && tdd_rng_uniform(g->seed, (uint64_t)i) >= p) ? v / (1.0 - p) : 0.0;
            ref_setf(y, ref_index(y, i), v);
        }
        return 0;
    }
    case TDD_OP_CONV2D: {
        const tdd_tensor *w = c->in[1];
        int b4 = y->ndim == 4;
        int64_t O = y->shape[b4], Ho = y->shape[b4 + 1], Wo = y->shape[b4 + 2];
        int64_t Cg = w->shape[1], Og = O / g->i[0], kh = w->shape[2], kw = w->shape[3];
        int64_t H = x->shape[x->ndim - 2], W = x->shape[x->ndim - 1];
        const int64_t *st = g->ints[0], *pd = g->ints[1], *dl = g->ints[2];
        for (int64_t e = 0; e < n; e++) {
            int64_t ow = e % Wo, oh = (e / Wo) % Ho, oc = (e / (Wo * Ho)) % O,
                    nn = e / (Wo * Ho * O);
            int64_t grp = oc / Og;
            double s = (g->flags & 4u) ? ref_getf(c->in[2], ref_index(c->in[2], oc)) : 0.0;
            for (int64_t ic = 0; ic < Cg; ic++)
                for (int64_t i = 0; i < kh; i++)
                    for (int64_t j = 0; j < kw; j++) {
                        int64_t h = oh * st[0] - pd[0] + i * dl[0];
                        int64_t ww = ow * st[1] - pd[1] + j * dl[1];
                        if (h < 0 || h >= H || ww < 0 || ww >= W)
                            continue;
                        s += ref_getf(x, at4(x, nn, grp * Cg + ic, h, ww)) *
                             ref_getf(w, at4(w, oc, ic, i, j));
                    }
            ref_setf(y, ref_index(y, e), s);
        }
        return 0;
    }
    case TDD_OP_ADAPTIVE_AVG_POOL2D: {
        int b4 = y->ndim == 4;
        int64_t C = y->shape[b4], Ho = y->shape[b4 + 1], Wo = y->shape[b4 + 2];
        int64_t H = x->shape[x->ndim - 2], W = x->shape[x->ndim - 1];
        for (int64_t e = 0; e < n; e++) {
            int64_t ow = e % Wo, oh = (e / Wo) % Ho, ch = (e / (Wo * Ho)) % C,
                    nn = e / (Wo * Ho * C), h0, h1, w0, w1;
            tdd_adaptive_window(oh, Ho, H, &h0, &h1);
            tdd_adaptive_window(ow, Wo, W, &w0, &w1);
            double s = 0;
            for (int64_t h = h0; h < h1; h++)
                for (int64_t w = w0; w < w1; w++)
                    s += ref_getf(x, at4(x, nn, ch, h, w));
            ref_setf(y, ref_index(y, e), s / (double)((h1 - h0) * (w1 - w0)));
        }
        return 0;
    }
    case TDD_OP_MAX_POOL2D:
    case TDD_OP_AVG_POOL2D: {
        int b4 = y->ndim == 4;
        int64_t C = y->shape[b4], Ho = y->shape[b4 + 1], Wo = y->shape[b4 + 2];
        int64_t H = x->shape[x->ndim - 2], W = x->shape[x->ndim - 1];
        const int64_t *st = g->ints[0], *pd = g->ints[1], *ks = g->ints[3];
        for (int64_t e = 0; e < n; e++) {
            int64_t ow = e % Wo, oh = (e / Wo) % Ho, ch = (e / (Wo * Ho)) % C,
                    nn = e / (Wo * Ho * C);
            int64_t h0 = oh * st[0] - pd[0], w0 = ow * st[1] - pd[1];
            if (c->op == TDD_OP_MAX_POOL2D) {
                double best;
                int64_t arg = max_window(x, g, nn, ch, h0, w0, &best);
                ref_setf(y, ref_index(y, e), best);
                if (c->n_out > 1)
                    ref_seti(c->out[1], ref_index(c->out[1], e), arg);
            } else {
                /* the window is clipped to the padded input; the divisor counts padding
                 * unless count_include_pad is off */
                int64_t hs = h0 + ks[0] < H + pd[0] ? h0 + ks[0] : H + pd[0];
                int64_t ws = w0 + ks[1] < W + pd[1] ? w0 + ks[1] : W + pd[1];
                int64_t pool = (hs - h0) * (ws - w0);
                int64_t ha = h0 < 0 ? 0 : h0, wa = w0 < 0 ? 0 : w0;
                int64_t hb = hs < H ? hs : H, wb = ws < W ? ws : W;
                double s = 0;
                for (int64_t h = ha; h < hb; h++)
                    for (int64_t ww = wa; ww < wb; ww++)
                        s += ref_getf(x, at4(x, nn, ch, h, ww));
                int64_t div = g->i[2] ? pool : (hb - ha) * (wb - wa);
                ref_setf(y, ref_index(y, e), s / (double)div);
            }
        }
        return 0;
    }
    default:
        return TD_EINTERNAL;
    }
}
