/* ref_bag.c -- reference kernels of embedding_bag, its backward and multinomial: plain
 * loops in double, the oracle for cpu (which runs these) and cuda. */
#include <math.h>
#include <stdbool.h>

#include "ref.h"

/* Bag b's entries [*lo, *hi) of n: offsets start at 0, never decrease and stay within n
 * (PyTorch's rules); TD_EINVALID_ARGUMENT otherwise. */
static int bag_range(const tdd_tensor *off, int64_t b, int64_t B, bool last, int64_t n, int64_t *lo,
                     int64_t *hi)
{
    *lo = ref_geti(off, ref_index(off, b));
    *hi = b + 1 < B || last ? ref_geti(off, ref_index(off, b + 1)) : n;
    if ((b == 0 && *lo != 0) || *lo < 0 || *hi < *lo || *hi > n)
        return TD_EINVALID_ARGUMENT;
    return 0;
}

/* embedding_bag (bw false: output [B, D]) or its backward (bw: grad [B, D] in, the
 * weight's gradient [num, D] out), bag by bag, column by column. */
static int ref_embedding_bag(const tdd_opcall *c, bool bw)
{
    const tdd_opargs *g = c->args;
    int o = bw ? 1 : 0;
    const tdd_tensor *ix = c->in[o], *off = c->in[o + (bw ? 1 : 2)], *w = c->in[o + (bw ? 2 : 1)];
    const tdd_tensor *psw = g->flags & 1u ? c->in[o + 3] : NULL, *gy = bw ? c->in[0] : NULL;
    tdd_tensor *y = c->out[0];
    int64_t mode = g->i[0], pad = g->i[1], B = g->i[3], n = tdd_numel(ix);
    int64_t num = w->shape[0], D = w->shape[1];
    bool last = g->i[2] != 0;
    if (bw)
        for (int64_t i = 0; i < num * D; i++)
            ref_setf(y, ref_index(y, i), 0.0);
    for (int64_t j = 0; j < n; j++) { /* every index in range, used or not (as PyTorch) */
        int64_t k = ref_geti(ix, ref_index(ix, j));
        if (k < 0 || k >= num)
            return TD_EINVALID_ARGUMENT;
    }
    for (int64_t b = 0; b < B; b++) {
        int64_t lo, hi;
        if (bag_range(off, b, B, last, n, &lo, &hi))
            return TD_EINVALID_ARGUMENT;
        for (int64_t d = 0; d < D; d++) {
            double acc = mode == 2 ? -INFINITY : 0.0;
            int64_t cnt = 0, arg = -1;
            for (int64_t j = lo; j < hi; j++) {
                int64_t k = ref_geti(ix, ref_index(ix, j));
                if (k == pad)
                    continue;
                double v = ref_getf(w, ref_index(w, k * D + d));
                if (psw)
                    v *= ref_getf(psw, ref_index(psw, j));
                if (mode == 2) {
                    if (arg < 0 || v > acc ||
                        (v != v && acc == acc)) { /* the first max; NaN wins */
                        acc = v;
                        arg = k;
                    }
                } else {
                    acc += v;
                }
                cnt++;
            }
            if (!bw) {
                ref_setf(y, ref_index(y, b * D + d),
                         cnt == 0    ? 0.0
                         : mode == 1 ? acc / (double)cnt
                                     : acc);
                continue;
            }
            double gv = ref_getf(gy, ref_index(gy, b * D + d));
            if (mode == 2) {
                if (arg >= 0) {
                    int64_t yo = ref_index(y, arg * D + d);
                    ref_setf(y, yo, ref_getf(y, yo) + gv);
                }
                continue;
            }
            double scale = mode == 1 && cnt > 0 ? 1.0 / (double)cnt : 1.0;
            for (int64_t j = lo; j < hi; j++) {
                int64_t k = ref_geti(ix, ref_index(ix, j));
                if (k == pad)
                    continue;
                double s = gv * scale * (psw ? ref_getf(psw, ref_index(psw, j)) : 1.0);
                int64_t yo = ref_index(y, k * D + d);
                ref_setf(y, yo, ref_getf(y, yo) + s);
            }
        }
    }
    return 0;
}

/* multinomial, row by row. With replacement: sample s of row r inverts the row's running
 * sum at tdd_rng_uniform(seed, r * k + s) * total. Without: category i's key is
 * log(1 - u_i) / p_i (u_i = tdd_rng_uniform(seed, r * C + i)), and the samples are the k
 * largest keys, largest first (ties: the lower index) -- the same law as drawing one at a
 * time and removing it. Negative, infinite or NaN probabilities, a row summing to 0, and
 * fewer than k non-zero categories without replacement are TD_EINVALID_ARGUMENT. */
static int ref_multinomial(const tdd_opcall *c)
{
    const tdd_opargs *g = c->args;
    const tdd_tensor *x = c->in[0];
    tdd_tensor *y = c->out[0];
    int64_t k = g->i[0], R = g->i[2], C = g->i[3];
    bool repl = g->i[1] != 0;
    for (int64_t r = 0; r < R; r++) {
        double total = 0.0;
        int64_t nz = 0;
        for (int64_t i = 0; i < C; i++) {
            double p = ref_getf(x, ref_index(x, r * C + i));
            if (!(p >= 0.0) || isinf(p))
                return TD_EINVALID_ARGUMENT;
            total += p;
            nz += p > 0.0;
        }
        if (!(total > 0.0) || isinf(total) || (!repl && nz < k))
            return TD_EINVALID_ARGUMENT;
        double prev = INFINITY;
        int64_t prev_i = -1;
        for (int64_t s = 0; s < k; s++) {
            int64_t pick = -1;
            if (repl) {
                double u = tdd_rng_uniform(g->seed, (uint64_t)(r * k + s)) * total, acc = 0.0;
                for (int64_t i = 0; i < C && pick < 0; i++) {
                    double p = ref_getf(x, ref_index(x, r * C + i));
                    if (p <= 0.0)
                        continue;
                    acc += p;
                    if (u < acc)
                        pick = i;
                    prev_i = i; /* the last non-zero category, should rounding leave u past acc */
                }
                if (pick < 0)
                    pick = prev_i;
            } else {
                double best = -INFINITY;
                for (int64_t i = 0; i < C; i++) {
                    double p = ref_getf(x, ref_index(x, r * C + i));
                    if (p <= 0.0)
                        continue;
                    double key = log(1.0 - tdd_rng_uniform(g->seed, (uint64_t)(r * C + i))) / p;
                    bool after = key < prev || (key == prev && i > prev_i);
                    if (after && (pick < 0 || key > best)) {
                        best = key;
                        pick = i;
                    }
                }
                prev = best;
                prev_i = pick;
            }
            ref_seti(y, ref_index(y, r * k + s), pick);
        }
    }
    return 0;
}

int ref_bag_op(const tdd_opcall *c)
{
    switch (c->op) {
    case TDD_OP_EMBEDDING_BAG:
        return ref_embedding_bag(c, false);
    case TDD_OP_EMBEDDING_BAG_BACKWARD:
        return ref_embedding_bag(c, true);
    case TDD_OP_MULTINOMIAL:
        return ref_multinomial(c);
    default:
        return TD_EUNSUPPORTED_OP;
    }
}
