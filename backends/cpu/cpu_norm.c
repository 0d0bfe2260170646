/* cpu_norm.c -- batch_norm on the cpu backend: the channels split over the threads, each
 * channel's [S] planes worked in double (its mean, then the centred variance), any float
 * dtype as it is (the running stats are written in place, so never through a copy). */
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "cpu.h"

typedef struct {
    const tdd_opcall *c;
    int64_t N, C, S;
    _Atomic int rc;
} bn_job;

static double at_channel(const tdd_tensor *t, int64_t ch)
{
    double v;
    cpu_load_tensor(t, ch, ch + 1, &v);
    return v;
}

static void store_channel(const tdd_tensor *t, int64_t ch, double v)
{
    cpu_store_strided(t->st->data, t->dtype, t->offset + ch * t->strides[0], 1, 1, &v);
}

static void bn_part(void *arg, int t, int use)
{
    bn_job *jb = arg;
    const tdd_opcall *c = jb->c;
    const tdd_opargs *g = c->args;
    const tdd_tensor *x = c->in[0];
    tdd_tensor *y = c->out[0];
    const int64_t N = jb->N, C = jb->C, S = jb->S, M = N * S;
    int64_t c0, c1;
    cpu_split(C, t, use, &c0, &c1);
    if (c0 >= c1)
        return;
    double *buf = malloc((size_t)(S ? S : 1) * sizeof *buf);
    if (!buf) {
        atomic_store(&jb->rc, TD_ERESOURCE_EXHAUSTED);
        return;
    }
    for (int64_t ch = c0; ch < c1; ch++) {
        double mean, var;
        if (g->i[0]) {
            double s = 0, ss = 0;
            for (int64_t n = 0; n < N; n++) {
                cpu_load_strided(x->st->data, x->dtype, x->offset + (n * C + ch) * S, 1, S, buf);
#pragma omp simd reduction(+ : s)
                for (int64_t k = 0; k < S; k++)
                    s += buf[k];
            }
            mean = M ? s / (double)M : 0.0;
            for (int64_t n = 0; n < N; n++) {
                cpu_load_strided(x->st->data, x->dtype, x->offset + (n * C + ch) * S, 1, S, buf);
#pragma omp simd reduction(+ : ss)
                for (int64_t k = 0; k < S; k++)
                    ss += (buf[k] - mean) * (buf[k] - mean);
            }
            var = M ? ss / (double)M : 0.0;
            if ((g->flags & 1u) && M > 0) { /* torch's: the running variance is unbiased */
                double m = g->f[1], unb = M > 1 ? var * (double)M / (double)(M - 1) : var;
                store_channel(c->in[1], ch, (1.0 - m) * at_channel(c->in[1], ch) + m * mean);
                store_channel(c->in[2], ch, (1.0 - m) * at_channel(c->in[2], ch) + m * unb);
            }
        } else {
            mean = at_channel(c->in[1], ch);
            var = at_channel(c->in[2], ch);
        }
        double rstd = 1.0 / sqrt(var + g->f[0]);
        double scale = (g->flags & 2u) ? rstd * at_channel(c->in[3], ch) : rstd;
        double shift = (g->flags & 4u) ? at_channel(c->in[4], ch) : 0.0;
        for (int64_t n = 0; n < N; n++) {
            cpu_load_strided(x->st->data, x->dtype, x->offset + (n * C + ch) * S, 1, S, buf);
#pragma omp simd
            for (int64_t k = 0; k < S; k++)
                buf[k] = (buf[k] - mean) * scale + shift;
            cpu_store_contig(y, (n * C + ch) * S, S, buf);
        }
    }
    free(buf);
}

int cpu_batch_norm(const tdd_opcall *c, int nt)
{
    const tdd_tensor *x = c->in[0];
    int64_t n = tdd_numel(x), N = x->shape[0], C = x->shape[1];
    bn_job j = {c, N, C, N != 0 && C != 0 ? n / (N * C) : 0, 0};
    if (C == 0)
        return 0;
    cpu_parallel(C > 1 && n >= CPU_PAR_MIN ? nt : 1, bn_part, &j);
    return atomic_load(&j.rc);
}
