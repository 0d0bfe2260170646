/* cpu_pool.c -- the cpu backend's max_pool2d and avg_pool2d (f32, f64; f16/bf16 through f32):
 * planes split over the device's team (cpu_threads.c). A window's in-range taps are found once
 * per output row and column, so the inner loops test no bounds; the 2x2 stride-2 window over
 * rows of unit stride (the usual downsampling) has a loop of its own. Results are the
 * reference's: the first maximum wins, a NaN wins and then stays, an empty window gives -inf
 * and index -1, and averages are summed in double in the reference's order. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu.h"

/* Taps below which one thread pools alone: a tap is a load and a compare, so waking the team
 * (microseconds, more when the cores are shared with the client) only pays for big inputs. */
#define POOL_PAR_MIN (256 * 1024)

typedef struct {
    const tdd_opcall *c;
    int64_t C, H, W, Ho, Wo, kh, kw, sh, sw, ph, pw, dh, dw, planes;
    int64_t xs[4];      /* x strides as [N, C, H, W] (N stride 0 when unbatched) */
    int64_t *jlo, *jhi; /* per output column: taps j in [jlo, jhi) fall inside the row */
    bool mx, cip, fast22;
} pool_job;

/* Taps t in [*lo, *hi) of a window starting at s0 with dilation d and k taps land in [0, n). */
static void taps(int64_t s0, int64_t d, int64_t k, int64_t n, int64_t *lo, int64_t *hi)
{
    int64_t l = s0 < 0 ? (-s0 + d - 1) / d : 0;
    int64_t h = s0 <= n - 1 ? (n - 1 - s0) / d + 1 : 0;
    *lo = l < k ? l : k;
    *hi = h < k ? h : k;
    if (*hi < *lo)
        *hi = *lo;
}

/* v replaces best when it is larger, or a NaN over a number: no branch, so that random data
 * costs no mispredictions and the compiler can use selects. */
#define BETTER(v, best) (((v) > (best)) | (((v) != (v)) & ((best) == (best))))
#define TAKE(v, a, best, arg)                                                                      \
    do {                                                                                           \
        const bool t_ = BETTER(v, best);                                                           \
        best = t_ ? (v) : best;                                                                    \
        arg = t_ ? (a) : arg;                                                                      \
    } while (0)

/* One output row of the 2x2 stride-2 max: the maximum as the reference picks it (the first
 * of equals, the first NaN: taken from the last tap back, an earlier tap wins ties); then,
 * when wanted, its index: the first tap with the maximum's bits (the maximum is one of the
 * taps, so its bits are exact). Branch-free loops, integer compares for the index: they
 * vectorise. */
#define POOL22_FN(NAME, T, U)                                                                      \
    static void NAME(const T *restrict r0, const T *restrict r1, T *restrict y,                    \
                     int64_t *restrict ind, int64_t a0, int64_t W, int64_t Wo)                     \
    {                                                                                              \
        for (int64_t ow = 0; ow < Wo; ow++) {                                                      \
            const T a = r0[2 * ow], b = r0[2 * ow + 1], e = r1[2 * ow], d = r1[2 * ow + 1];        \
            T m = d;                                                                               \
            m = (e >= m) | (e != e) ? e : m;                                                       \
            m = (b >= m) | (b != b) ? b : m;                                                       \
            m = (a >= m) | (a != a) ? a : m;                                                       \
            y[ow] = m;                                                                             \
        }                                                                                          \
        if (!ind)                                                                                  \
            return;                                                                                \
        for (int64_t ow = 0; ow < Wo; ow++) {                                                      \
            U ua, ub, ue, um;                                                                      \
            memcpy(&ua, r0 + 2 * ow, sizeof ua);                                                   \
            memcpy(&ub, r0 + 2 * ow + 1, sizeof ub);                                               \
            memcpy(&ue, r1 + 2 * ow, sizeof ue);                                                   \
            memcpy(&um, y + ow, sizeof um);                                                        \
            int64_t off = W + 1;                                                                   \
            off = ue == um ? W : off;                                                              \
            off = ub == um ? 1 : off;                                                              \
            off = ua == um ? 0 : off;                                                              \
            ind[ow] = a0 + 2 * ow + off;                                                           \
        }                                                                                          \
    }
POOL22_FN(pool_planes_f32_22, float, uint32_t)
POOL22_FN(pool_planes_f64_22, double, uint64_t)

#define POOL_PLANES(NAME, T)                                                                       \
    static void NAME(const pool_job *jb, int64_t p0, int64_t p1)                                   \
    {                                                                                              \
        const tdd_opcall *c = jb->c;                                                               \
        const T *X = (const T *)tdd_data(c->in[0]);                                                \
        T *Y = (T *)tdd_data(c->out[0]);                                                           \
        int64_t *ind = c->n_out > 1 ? (int64_t *)tdd_data(c->out[1]) : NULL;                       \
        const int64_t L = jb->Ho * jb->Wo, Wo = jb->Wo, W = jb->W, hs = jb->xs[2], ws = jb->xs[3]; \
        int64_t n = p0 / jb->C, ch = p0 % jb->C;                                                   \
        for (int64_t p = p0; p < p1; p++) {                                                        \
            const T *xp = X + n * jb->xs[0] + ch * jb->xs[1];                                      \
            if (++ch == jb->C) {                                                                   \
                ch = 0;                                                                            \
                n++;                                                                               \
            }                                                                                      \
            T *yp = Y + p * L;                                                                     \
            int64_t *ip = ind ? ind + p * L : NULL;                                                \
            if (jb->fast22) { /* 2x2, stride 2, no padding, whole windows, ws == 1: max or avg */  \
                for (int64_t oh = 0; oh < jb->Ho; oh++) {                                          \
                    const T *r0 = xp + 2 * oh * hs, *r1 = r0 + hs;                                 \
                    const int64_t a0 = 2 * oh * W;                                                 \
                    T *yr = yp + oh * Wo;                                                          \
                    int64_t *ir = ip ? ip + oh * Wo : NULL;                                        \
                    if (jb->mx)                                                                    \
                        NAME##_22(r0, r1, yr, ir, a0, W, Wo);                                      \
                    else                                                                           \
                        for (int64_t ow = 0; ow < Wo; ow++) { /* the reference's sum order */      \
                            double sum = 0;                                                        \
                            sum += (double)r0[2 * ow];                                             \
                            sum += (double)r0[2 * ow + 1];                                         \
                            sum += (double)r1[2 * ow];                                             \
                            sum += (double)r1[2 * ow + 1];                                         \
                            yr[ow] = (T)(sum / 4.0);                                               \
                        }                                                                          \
                }                                                                                  \
                continue;                                                                          \
            }                                                                                      \
            for (int64_t oh = 0; oh < jb->Ho; oh++) {                                              \
                const int64_t h0 = oh * jb->sh - jb->ph;                                           \
                if (jb->mx) {                                                                      \
                    int64_t ilo, ihi;                                                              \
                    taps(h0, jb->dh, jb->kh, jb->H, &ilo, &ihi);                                   \
                    for (int64_t ow = 0; ow < Wo; ow++) {                                          \
                        const int64_t w0 = ow * jb->sw - jb->pw, jlo = jb->jlo[ow],                \
                                      jhi = jb->jhi[ow];                                           \
                        T best = -(T)INFINITY;                                                     \
                        int64_t arg = -1;                                                          \
                        if (ilo < ihi && jlo < jhi) { /* the first tap in range starts it */       \
                            const int64_t h = h0 + ilo * jb->dh, w = w0 + jlo * jb->dw;            \
                            best = xp[h * hs + w * ws];                                            \
                            arg = h * W + w;                                                       \
                        }                                                                          \
                        for (int64_t i = ilo; i < ihi; i++) {                                      \
                            const int64_t h = h0 + i * jb->dh;                                     \
                            const T *row = xp + h * hs;                                            \
                            for (int64_t j = jlo; j < jhi; j++) {                                  \
                                const int64_t w = w0 + j * jb->dw;                                 \
                                const T v = row[w * ws];                                           \
                                TAKE(v, h *W + w, best, arg);                                      \
                            }                                                                      \
                        }                                                                          \
                        yp[oh * Wo + ow] = best;                                                   \
                        if (ip)                                                                    \
                            ip[oh * Wo + ow] = arg;                                                \
                    }                                                                              \
                    continue;                                                                      \
                }                                                                                  \
                /* average: the window clipped to the padded input, then to the input */           \
                const int64_t he = h0 + jb->kh < jb->H + jb->ph ? h0 + jb->kh : jb->H + jb->ph;    \
                const int64_t ha = h0 < 0 ? 0 : h0, hb = he < jb->H ? he : jb->H;                  \
                for (int64_t ow = 0; ow < Wo; ow++) {                                              \
                    const int64_t w0 = ow * jb->sw - jb->pw;                                       \
                    const int64_t we = w0 + jb->kw < W + jb->pw ? w0 + jb->kw : W + jb->pw;        \
                    const int64_t wa = w0 < 0 ? 0 : w0, wb = we < W ? we : W;                      \
                    double s = 0;                                                                  \
                    for (int64_t h = ha; h < hb; h++) {                                            \
                        const T *row = xp + h * hs;                                                \
                        for (int64_t w = wa; w < wb; w++)                                          \
                            s += (double)row[w * ws];                                              \
                    }                                                                              \
                    const int64_t div = jb->cip ? (he - h0) * (we - w0) : (hb - ha) * (wb - wa);   \
                    yp[oh * Wo + ow] = (T)(s / (double)div);                                       \
                }                                                                                  \
            }                                                                                      \
        }                                                                                          \
    }
POOL_PLANES(pool_planes_f32, float)
POOL_PLANES(pool_planes_f64, double)

static void pool_part(void *arg, int t, int nt)
{
    const pool_job *jb = arg;
    int64_t lo, hi;
    cpu_split(jb->planes, t, nt, &lo, &hi);
    if (lo >= hi)
        return;
    if (jb->c->in[0]->dtype == TD_F64)
        pool_planes_f64(jb, lo, hi);
    else
        pool_planes_f32(jb, lo, hi);
}

int cpu_pool2d(const tdd_opcall *c, int nt)
{
    const tdd_tensor *x = c->in[0];
    const tdd_opargs *g = c->args;
    const int b = x->ndim == 4;
    pool_job jb = {.c = c,
                   .C = x->shape[b],
                   .H = x->shape[b + 1],
                   .W = x->shape[b + 2],
                   .Ho = c->out[0]->shape[b + 1],
                   .Wo = c->out[0]->shape[b + 2],
                   .kh = g->ints[3][0],
                   .kw = g->ints[3][1],
                   .sh = g->ints[0][0],
                   .sw = g->ints[0][1],
                   .ph = g->ints[1][0],
                   .pw = g->ints[1][1],
                   .dh = g->ints[2][0],
                   .dw = g->ints[2][1],
                   .mx = c->op == TDD_OP_MAX_POOL2D,
                   .cip = g->i[2] != 0};
    jb.xs[0] = b ? x->strides[0] : 0;
    for (int k = 0; k < 3; k++)
        jb.xs[k + 1] = x->strides[b + k];
    jb.planes = (b ? x->shape[0] : 1) * jb.C;
    const int64_t L = jb.Ho * jb.Wo;
    if (jb.planes == 0 || L == 0)
        return 0;
    jb.fast22 = jb.kh == 2 && jb.kw == 2 && jb.sh == 2 && jb.sw == 2 && jb.ph == 0 && jb.pw == 0 &&
                jb.dh == 1 && jb.dw == 1 && jb.xs[3] == 1 && 2 * jb.Ho <= jb.H && 2 * jb.Wo <= jb.W;
    if (jb.mx && !jb.fast22) {
        jb.jlo = malloc((size_t)jb.Wo * 2 * sizeof *jb.jlo);
        if (!jb.jlo)
            return TD_ERESOURCE_EXHAUSTED;
        jb.jhi = jb.jlo + jb.Wo;
        for (int64_t ow = 0; ow < jb.Wo; ow++)
            taps(ow * jb.sw - jb.pw, jb.dw, jb.kw, jb.W, &jb.jlo[ow], &jb.jhi[ow]);
    }
    const int64_t work = jb.planes * L * jb.kh * jb.kw;
    int use = jb.planes > 1 && work >= POOL_PAR_MIN ? nt : 1;
    if (use > jb.planes)
        use = (int)jb.planes;
    cpu_parallel(use, pool_part, &jb);
    free(jb.jlo);
    return 0;
}

/* max_pool2d_backward: each plane zeroed, then each window's gradient added at the position
 * max_pool2d picks (its rule: the first maximum, a NaN wins and stays), in the reference's
 * order, so the sums are its sums. Planes split over the team. */
typedef struct {
    const tdd_opcall *c;
    int64_t C, H, W, Ho, Wo, planes;
    int64_t xs[4], gs[4], ys[4]; /* strides as [N, C, H, W] (N stride 0 when unbatched) */
} pool_bw_job;

#define POOL_BW_PLANES(NAME, T)                                                                    \
    static void NAME(const pool_bw_job *jb, int64_t lo, int64_t hi)                                \
    {                                                                                              \
        const tdd_opargs *g = jb->c->args;                                                         \
        const int64_t *st = g->ints[0], *pd = g->ints[1], *dl = g->ints[2], *ks = g->ints[3];      \
        const T *go = tdd_data(jb->c->in[0]), *x = tdd_data(jb->c->in[1]);                         \
        T *y = tdd_data(jb->c->out[0]);                                                            \
        for (int64_t pl = lo; pl < hi; pl++) {                                                     \
            int64_t nn = pl / jb->C, ch = pl % jb->C;                                              \
            const T *xp = x + nn * jb->xs[0] + ch * jb->xs[1];                                     \
            const T *gp = go + nn * jb->gs[0] + ch * jb->gs[1];                                    \
            T *yp = y + nn * jb->ys[0] + ch * jb->ys[1];                                           \
            for (int64_t h = 0; h < jb->H; h++)                                                    \
                for (int64_t w = 0; w < jb->W; w++)                                                \
                    yp[h * jb->ys[2] + w * jb->ys[3]] = 0;                                         \
            for (int64_t oh = 0; oh < jb->Ho; oh++)                                                \
                for (int64_t ow = 0; ow < jb->Wo; ow++) {                                          \
                    int64_t h0 = oh * st[0] - pd[0], w0 = ow * st[1] - pd[1], ah = -1, aw = -1;    \
                    T best = (T)-INFINITY;                                                         \
                    for (int64_t i = 0; i < ks[0]; i++)                                            \
                        for (int64_t j = 0; j < ks[1]; j++) {                                      \
                            int64_t h = h0 + i * dl[0], w = w0 + j * dl[1];                        \
                            if (h < 0 || h >= jb->H || w < 0 || w >= jb->W)                        \
                                continue;                                                          \
                            T v = xp[h * jb->xs[2] + w * jb->xs[3]];                               \
                            if (ah < 0 || BETTER(v, best)) {                                       \
                                best = v;                                                          \
                                ah = h;                                                            \
                                aw = w;                                                            \
                            }                                                                      \
                        }                                                                          \
                    if (ah >= 0)                                                                   \
                        yp[ah * jb->ys[2] + aw * jb->ys[3]] +=                                     \
                            gp[oh * jb->gs[2] + ow * jb->gs[3]];                                   \
                }                                                                                  \
        }                                                                                          \
    }
POOL_BW_PLANES(pool_bw_planes_f32, float)
POOL_BW_PLANES(pool_bw_planes_f64, double)

static void pool_bw_part(void *arg, int t, int nt)
{
    const pool_bw_job *jb = arg;
    int64_t lo, hi;
    cpu_split(jb->planes, t, nt, &lo, &hi);
    if (lo >= hi)
        return;
    if (jb->c->in[1]->dtype == TD_F64)
        pool_bw_planes_f64(jb, lo, hi);
    else
        pool_bw_planes_f32(jb, lo, hi);
}

int cpu_max_pool2d_backward(const tdd_opcall *c, int nt)
{
    const tdd_tensor *go = c->in[0], *x = c->in[1], *y = c->out[0];
    const int b = x->ndim == 4;
    pool_bw_job jb = {.c = c,
                      .C = x->shape[b],
                      .H = x->shape[b + 1],
                      .W = x->shape[b + 2],
                      .Ho = go->shape[b + 1],
                      .Wo = go->shape[b + 2]};
    const tdd_tensor *ts[3] = {x, go, y};
    int64_t *ss[3] = {jb.xs, jb.gs, jb.ys};
    for (int k = 0; k < 3; k++) {
        ss[k][0] = b ? ts[k]->strides[0] : 0;
        for (int d = 0; d < 3; d++)
            ss[k][d + 1] = ts[k]->strides[b + d];
    }
    jb.planes = (b ? x->shape[0] : 1) * jb.C;
    if (jb.planes == 0 || jb.H * jb.W == 0)
        return 0;
    const int64_t work = jb.planes * jb.Ho * jb.Wo * c->args->ints[3][0] * c->args->ints[3][1];
    int use = jb.planes > 1 && work >= POOL_PAR_MIN ? nt : 1;
    if (use > jb.planes)
        use = (int)jb.planes;
    cpu_parallel(use, pool_bw_part, &jb);
    return 0;
}
