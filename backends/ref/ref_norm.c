/* ref_norm.c -- the reference batch_norm: per channel, the batch's statistics (training, and
 * the running ones updated in place) or the running ones (eval), worked in double. */
#include <math.h>

#include "ref.h"

/* x's element (n, ch, s) of [N, C, S] in C order, as a storage offset. */
static int64_t at_ncs(const tdd_tensor *x, int64_t C, int64_t S, int64_t n, int64_t ch, int64_t s)
{
    return ref_index(x, (n * C + ch) * S + s);
}

int ref_batch_norm(const tdd_opcall *c)
{
    const tdd_opargs *g = c->args;
    const tdd_tensor *x = c->in[0];
    tdd_tensor *y = c->out[0];
    bool train = g->i[0] != 0, stats = g->flags & 1u;
    const tdd_tensor *w = (g->flags & 2u) ? c->in[3] : NULL, *b = (g->flags & 4u) ? c->in[4] : NULL;
    int64_t N = x->shape[0], C = x->shape[1], n = tdd_numel(x);
    int64_t S = N != 0 && C != 0 ? n / (N * C) : 0, M = N * S;
    for (int64_t ch = 0; ch < C; ch++) {
        double mean, var;
        if (train) {
            double s = 0, ss = 0;
            for (int64_t i = 0; i < N; i++)
                for (int64_t k = 0; k < S; k++)
                    s += ref_getf(x, at_ncs(x, C, S, i, ch, k));
            mean = M ? s / (double)M : 0.0;
            for (int64_t i = 0; i < N; i++)
                for (int64_t k = 0; k < S; k++) {
                    double d = ref_getf(x, at_ncs(x, C, S, i, ch, k)) - mean;
                    ss += d * d;
                }
            var = M ? ss / (double)M : 0.0;
            if (stats && M > 0) { /* torch's: the running variance is the unbiased one */
                const tdd_tensor *rm = c->in[1], *rv = c->in[2];
                double m = g->f[1], unb = M > 1 ? var * (double)M / (double)(M - 1) : var;
                int64_t om = ref_index(rm, ch), ov = ref_index(rv, ch);
                tdd_store_f(rm->st->data, rm->dtype, om, (1.0 - m) * ref_getf(rm, om) + m * mean);
                tdd_store_f(rv->st->data, rv->dtype, ov, (1.0 - m) * ref_getf(rv, ov) + m * unb);
            }
        } else {
            mean = ref_getf(c->in[1], ref_index(c->in[1], ch));
            var = ref_getf(c->in[2], ref_index(c->in[2], ch));
        }
        double rstd = 1.0 / sqrt(var + g->f[0]);
        double scale = w ? rstd * ref_getf(w, ref_index(w, ch)) : rstd;
        double shift = b ? ref_getf(b, ref_index(b, ch)) : 0.0;
        for (int64_t i = 0; i < N; i++)
            for (int64_t k = 0; k < S; k++) {
                double v = ref_getf(x, at_ncs(x, C, S, i, ch, k));
                ref_setf(y, at_ncs(y, C, S, i, ch, k), (v - mean) * scale + shift);
            }
    }
    return 0;
}
