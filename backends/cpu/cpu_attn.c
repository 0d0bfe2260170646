/* cpu_attn.c -- scaled_dot_product_attention on the cpu backend: rows of queries split
 * across the team, each row's scores, softmax, dropout and weighted sum of the values in
 * per-thread double buffers (the reference's arithmetic and draws, without its per-element
 * index walk). Any strides; f16/bf16 arrive as f32 copies (cpu_via_f32). */
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "cpu.h"
#include "dtype.h"

typedef struct {
    const tdd_opcall *c;
    int64_t rows;
    atomic_int rc;
} sdpa_job;

/* Storage offset of t's batch element at multi-index bi over the nb batch dims (t's leading
 * dims right-aligned against them; size-1 and absent dims broadcast). */
static int64_t batch_off(const tdd_tensor *t, const int64_t *bi, int nb)
{
    int64_t off = t->offset;
    int tb = t->ndim - 2; /* t's own batch dims (a mask may have fewer than 2 dims) */
    for (int d = 0; d < tb; d++) {
        int od = d + nb - tb;
        if (od >= 0 && t->shape[d] != 1)
            off += bi[od] * t->strides[d];
    }
    return off;
}

/* The stride of t's dim k from the end (k = 1: the last), 0 where it is absent or 1. */
static int64_t tail_stride(const tdd_tensor *t, int k)
{
    int d = t->ndim - k;
    return d < 0 || t->shape[d] == 1 ? 0 : t->strides[d];
}

static void sdpa_part(void *ctx, int t, int use)
{
    sdpa_job *jb = ctx;
    const tdd_opcall *c = jb->c;
    const tdd_opargs *g = c->args;
    const tdd_tensor *q = c->in[0], *k = c->in[1], *v = c->in[2];
    const tdd_tensor *m = c->n_in > 3 ? c->in[3] : NULL;
    tdd_tensor *y = c->out[0];
    int nb = (int)g->i[6];
    int64_t L = g->i[2], S = g->i[3], E = g->i[4], Ev = g->i[5];
    double p = g->f[0], keep = p < 1.0 ? 1.0 / (1.0 - p) : 0.0;
    int64_t r0, r1;
    cpu_split(jb->rows, t, use, &r0, &r1);
    if (r0 >= r1)
        return;
    double *buf = malloc((size_t)(S + 2 * E + 2 * Ev + 1) * sizeof *buf);
    if (!buf) {
        atomic_store(&jb->rc, TD_ERESOURCE_EXHAUSTED);
        return;
    }
    double *w = buf, *qrow = w + S, *krow = qrow + E, *vrow = krow + E, *acc = vrow + Ev;
    int64_t bi[TD_MAX_NDIM];
    for (int64_t r = r0; r < r1; r++) {
        int64_t i = r % L, rest = r / L;
        for (int d = nb - 1; d >= 0; d--) {
            bi[d] = rest % g->ints[0][d];
            rest /= g->ints[0][d];
        }
        int64_t qo = batch_off(q, bi, nb), ko = batch_off(k, bi, nb), vo = batch_off(v, bi, nb);
        int64_t mo = m ? batch_off(m, bi, nb) + i * tail_stride(m, 2) : 0;
        cpu_load_strided(q->st->data, q->dtype, qo + i * q->strides[q->ndim - 2],
                         q->strides[q->ndim - 1], E, qrow);
        double mx = -INFINITY, z = 0.0;
        for (int64_t j = 0; j < S; j++) {
            double s = 0.0;
            if (g->i[0] && j > i) {
                s = -INFINITY;
            } else if (g->i[1] == 1 &&
                       !tdd_load_i(m->st->data, m->dtype, mo + j * tail_stride(m, 1))) {
                s = -INFINITY;
            } else {
                cpu_load_strided(k->st->data, k->dtype, ko + j * k->strides[k->ndim - 2],
                                 k->strides[k->ndim - 1], E, krow);
                for (int64_t e = 0; e < E; e++)
                    s += qrow[e] * krow[e];
                s *= g->f[1];
                if (g->i[1] == 2)
                    s += tdd_load_f(m->st->data, m->dtype, mo + j * tail_stride(m, 1));
            }
            w[j] = s;
            if (s > mx || s != s)
                mx = s;
        }
        for (int64_t j = 0; j < S; j++) {
            w[j] = exp(w[j] - mx); /* nothing attended: NaN throughout, as ref */
            z += w[j];
        }
        for (int64_t e = 0; e < Ev; e++)
            acc[e] = 0.0;
        for (int64_t j = 0; j < S; j++) {
            double wj = w[j] / z;
            if (p > 0.0)
                wj *= tdd_rng_uniform(g->seed, (uint64_t)(r * S + j)) >= p ? keep : 0.0;
            cpu_load_strided(v->st->data, v->dtype, vo + j * v->strides[v->ndim - 2],
                             v->strides[v->ndim - 1], Ev, vrow);
            for (int64_t e = 0; e < Ev; e++)
                acc[e] += wj * vrow[e];
        }
        cpu_store_contig(y, r * Ev, Ev, acc);
    }
    free(buf);
}

int cpu_sdpa(const tdd_opcall *c, int nt)
{
    const tdd_opargs *g = c->args;
    int64_t Ev = g->i[5], rows = Ev ? tdd_numel(c->out[0]) / Ev : 0;
    int64_t work = rows * g->i[3] * (g->i[4] + Ev);
    if (rows == 0)
        return 0;
    sdpa_job j = {c, rows, 0};
    cpu_parallel(rows > 1 && work >= CPU_PAR_MIN ? nt : 1, sdpa_part, &j);
    return atomic_load(&j.rc);
}
