/* cpu_nn.c -- the cpu backend's NN kernels: conv2d as im2col + OpenBLAS GEMM
 * over blocks of samples, layer_norm and the losses, and the index moves (gather,
 * index_select, embedding, scatter_add). Float kernels handle f32 and f64
 * natively; f16/bf16 reach them through cpu_via_f32 (cpu.c). */
#include <cblas.h>
#include <limits.h>
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "cpu.h"
#include "dtype.h"
#include "ref/ref.h"

/* ---------------------------------------------------------------- conv2d */

typedef struct {
    int64_t C, H, W, O, Ho, Wo, Cg, Og, kh, kw, groups;
    int64_t sh, sw, ph, pw, dh, dw;
    int64_t xs[4]; /* x strides as [N, C, H, W] (N stride 0 when unbatched) */
    bool f64;
} conv_geom;

static void conv_geom_init(const tdd_opcall *c, conv_geom *q)
{
    const tdd_opargs *g = c->args;
    const tdd_tensor *x = c->in[0], *w = c->in[1];
    int b = x->ndim == 4;
    q->C = x->shape[b];
    q->H = x->shape[b + 1];
    q->W = x->shape[b + 2];
    q->O = w->shape[0];
    q->Cg = w->shape[1];
    q->kh = w->shape[2];
    q->kw = w->shape[3];
    q->groups = g->i[0];
    q->Og = q->O / q->groups;
    q->Ho = c->out[0]->shape[b + 1];
    q->Wo = c->out[0]->shape[b + 2];
    q->sh = g->ints[0][0];
    q->sw = g->ints[0][1];
    q->ph = g->ints[1][0];
    q->pw = g->ints[1][1];
    q->dh = g->ints[2][0];
    q->dw = g->ints[2][1];
    q->xs[0] = b ? x->strides[0] : 0;
    for (int k = 0; k < 3; k++)
        q->xs[k + 1] = x->strides[b + k];
    q->f64 = x->dtype == TD_F64;
}

/* The output columns ow in [*lo, *hi) read input columns inside [0, W) for kernel
 * column offset w0 = j*dw - pw; the rest read padding. */
static void conv_valid(int64_t w0, int64_t sw, int64_t W, int64_t Wo, int64_t *lo, int64_t *hi)
{
    int64_t l = w0 >= 0 ? 0 : (-w0 + sw - 1) / sw;
    int64_t h = W - 1 - w0 >= 0 ? (W - 1 - w0) / sw + 1 : 0;
    *lo = l < Wo ? l : Wo;
    *hi = h < Wo ? h : Wo;
    if (*hi < *lo)
        *hi = *lo;
}

/* im2col of samples [n0, n0 + nb) of one group: col[(c*kh + i)*kw + j][n*L + oh*Wo + ow] =
 * x[n, c, h, w] or 0, so that one GEMM covers the block of samples. The rows split over
 * the device's team. */
typedef struct {
    const conv_geom *q;
    const char *x; /* the group's first channel of sample n0 */
    char *col;
    int64_t nb, K, L;
} im2col_job;

/* clang-format off */
#define IM2COL_FN(NAME, T)                                                                         \
    static void NAME(const im2col_job *jb, int64_t r0, int64_t r1)                                 \
    {                                                                                              \
        const conv_geom *q = jb->q;                                                                \
        const int64_t L = jb->L, NL = jb->nb * L, Wo = q->Wo, ws = q->xs[3], sw = q->sw;           \
        for (int64_t r = r0; r < r1; r++) {                                                        \
            int64_t ch = r / (q->kh * q->kw), i = (r / q->kw) % q->kh, j = r % q->kw;              \
            int64_t w0 = j * q->dw - q->pw, lo, hi;                                                \
            conv_valid(w0, sw, q->W, Wo, &lo, &hi);                                                \
            for (int64_t n = 0; n < jb->nb; n++) {                                                 \
                const T *xn = (const T *)(const void *)jb->x + n * q->xs[0] + ch * q->xs[1];       \
                T *restrict dn = (T *)(void *)jb->col + r * NL + n * L;                            \
                for (int64_t oh = 0; oh < q->Ho; oh++) {                                           \
                    T *restrict d = dn + oh * Wo;                                                  \
                    int64_t h = oh * q->sh - q->ph + i * q->dh;                                    \
                    if (h < 0 || h >= q->H) {                                                      \
                        for (int64_t k = 0; k < Wo; k++)                                           \
                            d[k] = 0;                                                              \
                        continue;                                                                  \
                    }                                                                              \
                    const T *s = xn + h * q->xs[2] + w0 * ws;                                      \
                    for (int64_t ow = 0; ow < lo; ow++)                                            \
                        d[ow] = 0;                                                                 \
                    if (ws == 1 && sw == 1)                                                        \
                        for (int64_t k = lo; k < hi; k++) /* short runs: no call */                \
                            d[k] = s[k];                                                           \
                    else if (ws == 1 && sw == 2)                                                   \
                        for (int64_t ow = lo; ow < hi; ow++)                                       \
                            d[ow] = s[2 * ow];                                                     \
                    else                                                                           \
                        for (int64_t ow = lo; ow < hi; ow++)                                       \
                            d[ow] = s[ow * sw * ws];                                               \
                    for (int64_t ow = hi; ow < Wo; ow++)                                           \
                        d[ow] = 0;                                                                 \
                }                                                                                  \
            }                                                                                      \
        }                                                                                          \
    }
/* clang-format on */
IM2COL_FN(im2col_f32, float)
IM2COL_FN(im2col_f64, double)

/* The kernel columns j in [*lo, *hi) of output column ow read input columns inside [0, W). */
static void kernel_valid(const conv_geom *q, int64_t ow, int64_t *lo, int64_t *hi)
{
    int64_t w0 = ow * q->sw - q->pw;
    int64_t l = w0 < 0 ? (-w0 + q->dw - 1) / q->dw : 0;
    int64_t h = w0 <= q->W - 1 ? (q->W - 1 - w0) / q->dw + 1 : 0;
    *lo = l < q->kw ? l : q->kw;
    *hi = h < q->kw ? h : q->kw;
    if (*hi < *lo)
        *hi = *lo;
}

/* im2col transposed, for an output narrower than the kernel (a weight gradient's conv, whose
 * "kernel" is an image and whose output is a kernel): colT[n*L + oh*Wo + ow][(c*kh + i)*kw + j],
 * so the runs copied are a kernel row long instead of an output row. Rows split over the
 * team. */
/* clang-format off */
#define IM2COLT_FN(NAME, T)                                                                        \
    static void NAME(const im2col_job *jb, int64_t r0, int64_t r1)                                 \
    {                                                                                              \
        const conv_geom *q = jb->q;                                                                \
        const int64_t K = jb->K, L = jb->L, kw = q->kw, ws = q->xs[3], dw = q->dw;                 \
        for (int64_t r = r0; r < r1; r++) {                                                        \
            const int64_t n = r / L, oh = (r / q->Wo) % q->Ho, ow = r % q->Wo;                     \
            const int64_t w0 = ow * q->sw - q->pw;                                                 \
            int64_t lo, hi;                                                                        \
            kernel_valid(q, ow, &lo, &hi);                                                         \
            T *restrict d = (T *)(void *)jb->col + r * K;                                          \
            const T *xn = (const T *)(const void *)jb->x + n * q->xs[0];                           \
            for (int64_t ch = 0; ch < q->Cg; ch++)                                                 \
                for (int64_t i = 0; i < q->kh; i++, d += kw) {                                     \
                    const int64_t h = oh * q->sh - q->ph + i * q->dh;                              \
                    if (h < 0 || h >= q->H || lo == hi) {                                          \
                        for (int64_t k = 0; k < kw; k++)                                           \
                            d[k] = 0;                                                              \
                        continue;                                                                  \
                    }                                                                              \
                    const T *s = xn + ch * q->xs[1] + h * q->xs[2] + w0 * ws;                      \
                    for (int64_t j = 0; j < lo; j++)                                               \
                        d[j] = 0;                                                                  \
                    if (ws == 1 && dw == 1)                                                        \
                        for (int64_t k = lo; k < hi; k++) /* short runs: no call */                \
                            d[k] = s[k];                                                           \
                    else                                                                           \
                        for (int64_t j = lo; j < hi; j++)                                          \
                            d[j] = s[j * dw * ws];                                                 \
                    for (int64_t j = hi; j < kw; j++)                                              \
                        d[j] = 0;                                                                  \
                }                                                                                  \
        }                                                                                          \
    }
/* clang-format on */
IM2COLT_FN(im2colt_f32, float)
IM2COLT_FN(im2colt_f64, double)

static void im2colt_part(void *arg, int t, int nt)
{
    const im2col_job *jb = arg;
    int64_t lo, hi;
    cpu_split(jb->nb * jb->L, t, nt, &lo, &hi);
    if (lo >= hi)
        return;
    if (jb->q->f64)
        im2colt_f64(jb, lo, hi);
    else
        im2colt_f32(jb, lo, hi);
}

static void im2col_part(void *arg, int t, int nt)
{
    const im2col_job *jb = arg;
    int64_t lo, hi;
    cpu_split(jb->K, t, nt, &lo, &hi);
    if (lo >= hi)
        return;
    if (jb->q->f64)
        im2col_f64(jb, lo, hi);
    else
        im2col_f32(jb, lo, hi);
}

/* Elements below which im2col runs on one thread: it moves memory, ~1 ns an element, so
 * waking the team (microseconds, more on cores shared with the client) only pays for big
 * inputs. */
#define IM2COL_PAR_MIN (256 * 1024)

/* Elements of im2col columns a conv keeps at once: several samples' columns go to one GEMM
 * while they fit (small images: one call instead of one per sample), a block of samples at
 * a time past it, one sample at least. */
#define CONV_COL_BLOCK (1 << 20)

/* y[n, o, l] (+)= v[o, n*L + l] (+ bias[o]): a block's GEMM result into y's layout. */
static void conv_spread(const conv_geom *q, const char *v, char *y, int64_t nb, const char *bias,
                        int64_t bs)
{
    const int64_t L = q->Ho * q->Wo, NL = nb * L;
    for (int64_t n = 0; n < nb; n++)
        for (int64_t o = 0; o < q->Og; o++) {
            if (q->f64) {
                const double *s = (const double *)(const void *)v + o * NL + n * L;
                double *d = (double *)(void *)y + (n * q->O + o) * L;
                const double b = bias ? ((const double *)(const void *)bias)[o * bs] : 0.0;
                for (int64_t l = 0; l < L; l++)
                    d[l] = s[l] + b;
            } else {
                const float *s = (const float *)(const void *)v + o * NL + n * L;
                float *d = (float *)(void *)y + (n * q->O + o) * L;
                const float b = bias ? ((const float *)(const void *)bias)[o * bs] : 0.0f;
                for (int64_t l = 0; l < L; l++)
                    d[l] = s[l] + b;
            }
        }
}

/* y[n, o, :] += bias[o] for the block's samples (the GEMM wrote y in place). */
static void conv_bias(const conv_geom *q, char *y, int64_t nb, const char *bias, int64_t bs)
{
    const int64_t L = q->Ho * q->Wo;
    for (int64_t n = 0; n < nb; n++)
        for (int64_t o = 0; o < q->Og; o++) {
            if (q->f64) {
                double *d = (double *)(void *)y + (n * q->O + o) * L;
                const double b = ((const double *)(const void *)bias)[o * bs];
                for (int64_t l = 0; l < L; l++)
                    d[l] += b;
            } else {
                float *d = (float *)(void *)y + (n * q->O + o) * L;
                const float b = ((const float *)(const void *)bias)[o * bs];
                for (int64_t l = 0; l < L; l++)
                    d[l] += b;
            }
        }
}

/* conv2d of f32/f64 operands, per group and block of samples: im2col, one GEMM
 * [Og, K] x [K, nb*L], the result spread into y's [N, O, L] with the bias. A 1x1, stride-1,
 * unpadded conv over planes of unit stride skips im2col and multiplies x's planes as they
 * are, a GEMM per sample. */
static int conv_run(const tdd_opcall *c, const conv_geom *q, int nt)
{
    const tdd_tensor *x = c->in[0], *w = c->in[1];
    const size_t esz = q->f64 ? sizeof(double) : sizeof(float);
    const int64_t N = x->ndim == 4 ? x->shape[0] : 1, K = q->Cg * q->kh * q->kw, L = q->Ho * q->Wo;
    const bool direct = q->kh == 1 && q->kw == 1 && q->sh == 1 && q->sw == 1 && q->ph == 0 &&
                        q->pw == 0 && q->xs[3] == 1 && q->xs[2] == q->W && q->xs[1] >= L;
    /* an output row shorter than a kernel row: im2col transposed (longer runs) */
    const bool tr = !direct && q->kw > q->Wo;
    int64_t nb = K * L > 0 ? CONV_COL_BLOCK / (K * L) : N;
    nb = nb < 1 ? 1 : nb > N ? N : nb;
    if (direct || nb * L > INT_MAX)
        nb = 1;
    char *col = direct ? NULL : malloc((size_t)(K * nb * L) * esz);
    char *yt = !direct && nb > 1 ? malloc((size_t)(q->Og * nb * L) * esz) : NULL;
    char *wp = tdd_is_contiguous(w) ? NULL : malloc((size_t)(q->O * K) * esz);
    if ((!direct && !col) || (!direct && nb > 1 && !yt) || (!tdd_is_contiguous(w) && !wp)) {
        free(col);
        free(yt);
        free(wp);
        return TD_ERESOURCE_EXHAUSTED;
    }
    if (wp)
        tdd_copy_contiguous(w, wp);
    const char *W = wp ? wp : (const char *)tdd_data(w);
    const char *X = (const char *)tdd_data(x);
    char *Y = (char *)tdd_data(c->out[0]);
    const char *bias = (c->args->flags & 4u) ? (const char *)tdd_data(c->in[2]) : NULL;
    const int64_t bs = bias ? c->in[2]->strides[0] : 0;
    for (int64_t n0 = 0; n0 < N; n0 += nb) {
        const int64_t m = N - n0 < nb ? N - n0 : nb;
        for (int64_t gr = 0; gr < q->groups; gr++) {
            const char *xg = X + (size_t)(n0 * q->xs[0] + gr * q->Cg * q->xs[1]) * esz;
            const char *Wg = W + (size_t)(gr * q->Og * K) * esz;
            char *yg = Y + (size_t)((n0 * q->O + gr * q->Og) * L) * esz;
            const char *bg = bias ? bias + (size_t)(gr * q->Og * bs) * esz : NULL;
            if (direct) {
                cpu_gemm(q->f64, false, false, q->Og, L, K, 1.0, Wg, K, xg, q->xs[1], 0.0, yg, L);
                if (bg)
                    conv_bias(q, yg, 1, bg, bs);
                continue;
            }
            im2col_job jb = {q, xg, col, m, K, L};
            const int64_t rows = tr ? m * L : K;
            int use = rows > 1 && K * m * L >= IM2COL_PAR_MIN ? nt : 1;
            cpu_parallel(use > rows ? (int)rows : use, tr ? im2colt_part : im2col_part, &jb);
            /* col is [K, m*L] (ld m*L), or transposed [m*L, K] (ld K) */
            const int64_t ldc = tr ? K : m * L;
            if (m == 1) {
                cpu_gemm(q->f64, false, tr, q->Og, L, K, 1.0, Wg, K, col, ldc, 0.0, yg, L);
                if (bg)
                    conv_bias(q, yg, 1, bg, bs);
                continue;
            }
            cpu_gemm(q->f64, false, tr, q->Og, m * L, K, 1.0, Wg, K, col, ldc, 0.0, yt, m * L);
            conv_spread(q, yt, yg, m, bg, bs);
        }
    }
    free(col);
    free(yt);
    free(wp);
    return 0;
}

int cpu_conv2d(const tdd_opcall *c, int nt)
{
    conv_geom q;
    conv_geom_init(c, &q);
    int64_t K = q.Cg * q.kh * q.kw, L = q.Ho * q.Wo;
    if (tdd_numel(c->out[0]) == 0)
        return 0;
    /* beyond OpenBLAS's 32-bit sizes, or nothing to multiply: the reference loops */
    if (K == 0 || q.Og > INT_MAX || L > INT_MAX || K > INT_MAX || q.xs[1] > INT_MAX)
        return tdd_ref_run(c);
    return conv_run(c, &q, nt);
}

/* ---------------------------------------------------------------- layer_norm */

typedef struct {
    const tdd_opcall *c;
    const tdd_tensor *x;
    tdd_tensor *y;
    int64_t D, rows;
    const double *wb;
    _Atomic int rc;
} ln_job;

static void ln_part(void *arg, int t, int use)
{
    ln_job *jb = arg;
    const tdd_opargs *g = jb->c->args;
    const tdd_tensor *x = jb->x;
    tdd_tensor *y = jb->y;
    int64_t D = jb->D;
    const double *wb = jb->wb;
    int64_t r0, r1;
    cpu_split(jb->rows, t, use, &r0, &r1);
    if (r0 >= r1)
        return;
    double *row = malloc((size_t)D * sizeof *row);
    if (!row) {
        atomic_store(&jb->rc, TD_ERESOURCE_EXHAUSTED);
        return;
    }
    for (int64_t r = r0; r < r1; r++) {
        cpu_load_tensor(x, r * D, (r + 1) * D, row);
        double s = 0, ss = 0;
#pragma omp simd reduction(+ : s)
        for (int64_t j = 0; j < D; j++)
            s += row[j];
        const double mean = s / (double)D;
#pragma omp simd reduction(+ : ss)
        for (int64_t j = 0; j < D; j++)
            ss += (row[j] - mean) * (row[j] - mean);
        const double rstd = 1.0 / sqrt(ss / (double)D + g->f[0]);
        for (int64_t j = 0; j < D; j++) {
            double v = (row[j] - mean) * rstd;
            if (g->flags & 1u)
                v *= wb[j];
            if (g->flags & 2u)
                v += wb[D + j];
            row[j] = v;
        }
        cpu_store_contig(y, r * D, D, row);
    }
    free(row);
}

/* Rows of D elements (the normalised trailing dims), one thread per block of rows;
 * each row is loaded into a per-thread double buffer, so any layout and float dtype
 * takes the same path. */
int cpu_layer_norm(const tdd_opcall *c, int nt)
{
    const tdd_opargs *g = c->args;
    const tdd_tensor *x = c->in[0];
    tdd_tensor *y = c->out[0];
    int64_t D = 1, n = tdd_numel(y);
    for (int k = 0; k < g->i[0]; k++)
        D *= x->shape[x->ndim - 1 - k];
    int64_t rows = D ? n / D : 0;
    if (rows == 0)
        return 0;
    double *wb = malloc((size_t)D * 2 * sizeof *wb);
    if (!wb)
        return TD_ERESOURCE_EXHAUSTED;
    if (g->flags & 1u)
        cpu_load_tensor(c->in[1], 0, D, wb);
    if (g->flags & 2u)
        cpu_load_tensor(c->in[2], 0, D, wb + D);
    ln_job j = {c, x, y, D, rows, wb, 0};
    cpu_parallel(rows > 1 && n >= CPU_PAR_MIN ? nt : 1, ln_part, &j);
    int rc = atomic_load(&j.rc);
    free(wb);
    return rc;
}

/* ---------------------------------------------------------------- losses */

typedef struct {
    const tdd_opcall *c;
    int64_t N, C, cs, rs, ts;
    const int64_t *tg;
    bool ce, none;
    double eps;
    _Atomic int bad;
    double total[CPU_MAX_PARTS], count[CPU_MAX_PARTS];
} cl_job;

static void cl_part(void *arg, int part, int use)
{
    cl_job *jb = arg;
    const tdd_opcall *c = jb->c;
    const tdd_opargs *g = c->args;
    const tdd_tensor *x = c->in[0];
    tdd_tensor *y = c->out[0];
    const int64_t C = jb->C, cs = jb->cs, rs = jb->rs, ts = jb->ts, *tg = jb->tg;
    const bool ce = jb->ce, none = jb->none;
    const double eps = jb->eps;
    double total = 0, count = 0;
    int64_t i0, i1;
    cpu_split(jb->N, part, use, &i0, &i1);
    double *row = ce && i0 < i1 ? malloc((size_t)C * sizeof *row) : NULL;
    if (ce && i0 < i1 && !row)
        atomic_store_explicit(&jb->bad, TD_ERESOURCE_EXHAUSTED, memory_order_relaxed);
    for (int64_t i = i0; i < i1; i++) {
        int64_t cls = tg[i * ts];
        double v = 0;
        if (cls != g->i[1]) {
            if (cls < 0 || cls >= C) {
                atomic_store_explicit(&jb->bad, TD_EINVALID_ARGUMENT, memory_order_relaxed);
                continue;
            }
            if (!ce) {
                double z;
                cpu_load_strided(x->st->data, x->dtype, x->offset + i * rs + cls * cs, 0, 1, &z);
                v = -z;
            } else if (row) {
                cpu_load_strided(x->st->data, x->dtype, x->offset + i * rs, cs, C, row);
                double m = -INFINITY, s = 0;
                for (int64_t k = 0; k < C; k++)
                    if (row[k] > m || row[k] != row[k])
                        m = row[k];
                const double sh = isinf(m) ? 0.0 : m;
                for (int64_t k = 0; k < C; k++)
                    s += exp(row[k] - sh);
                /* a row of -inf has s == 0: log gives -inf, the answer */
                /* cppcheck-suppress invalidFunctionArg */
                const double lse = log(s) + sh;
                v = lse - row[cls];
                if (eps > 0) {
                    double smooth = 0;
                    for (int64_t k = 0; k < C; k++)
                        smooth += lse - row[k];
                    v = (1 - eps) * v + eps * smooth / (double)C;
                }
            }
            count += 1;
        }
        if (none)
            tdd_store_f(y->st->data, y->dtype, y->offset + i, v);
        else
            total += v;
    }
    free(row);
    jb->total[part] = total;
    jb->count[part] = count;
}

/* cross_entropy / nll_loss over rows of [N, C] (or one row [C]); rows split across
 * threads, the total summed per thread and combined. */
int cpu_class_loss(const tdd_opcall *c, int nt)
{
    const tdd_opargs *g = c->args;
    const tdd_tensor *x = c->in[0], *t = c->in[1];
    tdd_tensor *y = c->out[0];
    int64_t C = x->shape[x->ndim - 1], N = x->ndim == 2 ? x->shape[0] : 1;
    int64_t cs = x->strides[x->ndim - 1], rs = x->ndim == 2 ? x->strides[0] : 0;
    int64_t ts = t->ndim ? t->strides[0] : 0;
    const int64_t *tg = (const int64_t *)tdd_data(t);
    const bool ce = c->op == TDD_OP_CROSS_ENTROPY, none = g->i[0] == TDD_RED_NONE;
    const double eps = ce ? g->f[0] : 0.0;
    int use = N > 1 && N * C >= CPU_PAR_MIN ? nt : 1;
    if (use > CPU_MAX_PARTS)
        use = CPU_MAX_PARTS;
    cl_job jb = {.c = c,
                 .N = N,
                 .C = C,
                 .cs = cs,
                 .rs = rs,
                 .ts = ts,
                 .tg = tg,
                 .ce = ce,
                 .none = none,
                 .eps = eps};
    cpu_parallel(use, cl_part, &jb);
    double total = 0, count = 0;
    for (int k = 0; k < use; k++) {
        total += jb.total[k];
        count += jb.count[k];
    }
    int rc = atomic_load(&jb.bad);
    if (rc)
        return rc;
    if (g->i[0] == TDD_RED_SUM)
        tdd_store_f(y->st->data, y->dtype, y->offset, total);
    else if (g->i[0] == TDD_RED_MEAN)
        tdd_store_f(y->st->data, y->dtype, y->offset, total / count);
    return 0;
}

/* mse_loss / binary_cross_entropy_with_logits: elementwise over input and target in
 * blocks of doubles; "none" writes each value, otherwise threads sum partials. */
typedef struct {
    const tdd_opcall *c;
    double total;
} pw_ctx;

static void pointwise_run(void *vc, int64_t n, const int64_t *off, const int64_t *st)
{
    pw_ctx *p = vc;
    const tdd_opcall *c = p->c;
    const tdd_tensor *x = c->in[0], *t = c->in[1];
    tdd_tensor *y = c->out[0];
    const bool mse = c->op == TDD_OP_MSE_LOSS, none = c->args->i[0] == TDD_RED_NONE;
    double a[256], b[256];
    for (int64_t i0 = 0; i0 < n; i0 += 256) {
        int64_t m = n - i0 < 256 ? n - i0 : 256;
        cpu_load_strided(x->st->data, x->dtype, off[1] + i0 * st[1], st[1], m, a);
        cpu_load_strided(t->st->data, t->dtype, off[2] + i0 * st[2], st[2], m, b);
        double s = 0;
        for (int64_t i = 0; i < m; i++) {
            double v = mse ? (a[i] - b[i]) * (a[i] - b[i])
                           : (a[i] > 0 ? a[i] : 0) - a[i] * b[i] + log1p(exp(-fabs(a[i])));
            a[i] = v;
            s += v;
        }
        if (none)
            cpu_store_strided(y->st->data, y->dtype, off[0] + i0 * st[0], st[0], m, a);
        p->total += s;
    }
}

typedef struct {
    const tdd_opcall *c;
    const tdd_iter *it;
    int64_t n;
    double total[CPU_MAX_PARTS];
} pw_job;

static void pw_part(void *arg, int k, int use)
{
    pw_job *jb = arg;
    pw_ctx p = {jb->c, 0};
    int64_t lo, hi;
    cpu_split(jb->n, k, use, &lo, &hi);
    tdd_iter_range(jb->it, lo, hi, pointwise_run, &p);
    jb->total[k] = p.total;
}

int cpu_pointwise_loss(const tdd_opcall *c, int nt)
{
    const tdd_tensor *x = c->in[0];
    tdd_tensor *y = c->out[0];
    int64_t n = tdd_numel(x);
    /* operand 0 is the "none" output (x's shape), else a dummy that never moves */
    tdd_tensor yv = *x;
    if (c->args->i[0] == TDD_RED_NONE)
        yv = *y;
    else
        memset(yv.strides, 0, sizeof yv.strides);
    const tdd_tensor *ops[3] = {&yv, x, c->in[1]};
    tdd_iter it;
    tdd_iter_tensors(&it, x->shape, x->ndim, 3, ops);
    int use = n >= CPU_PAR_MIN ? nt : 1;
    if (use > CPU_MAX_PARTS)
        use = CPU_MAX_PARTS;
    pw_job jb = {c, &it, n, {0}};
    cpu_parallel(use, pw_part, &jb);
    double total = 0;
    for (int k = 0; k < use; k++)
        total += jb.total[k];
    if (c->args->i[0] == TDD_RED_SUM)
        tdd_store_f(y->st->data, y->dtype, y->offset, total);
    else if (c->args->i[0] == TDD_RED_MEAN)
        tdd_store_f(y->st->data, y->dtype, y->offset, total / (double)n);
    return 0;
}

/* ---------------------------------------------------------------- index moves */

/* gather, index_select and embedding are one kernel: operands (y, x, index) iterate
 * y's shape, x seen with stride 0 along the indexed dim and the index broadcast to y;
 * each element reads x[off + k * xd] for its index k. Elements are moved as raw
 * bytes of the dtype's size, so every dtype shares the code. */
typedef struct {
    char *y;
    const char *x;
    const void *ix;
    bool ix64;
    int64_t xd, size;
    _Atomic int bad;
} gx_ctx;

static inline int64_t load_index(const gx_ctx *g, int64_t i)
{
    return g->ix64 ? ((const int64_t *)g->ix)[i] : ((const int32_t *)g->ix)[i];
}

#define GATHER_FN(NAME, U)                                                                         \
    static void NAME(void *vc, int64_t n, const int64_t *off, const int64_t *st)                   \
    {                                                                                              \
        gx_ctx *g = vc;                                                                            \
        U *restrict y = (U *)(void *)g->y + off[0];                                                \
        const U *restrict x = (const U *)(const void *)g->x + off[1];                              \
        if (st[2] == 0) { /* one index for the whole run (embedding rows) */                       \
            int64_t k = load_index(g, off[2]);                                                     \
            if (k < 0 || k >= g->size) {                                                           \
                atomic_store_explicit(&g->bad, 1, memory_order_relaxed);                           \
                return;                                                                            \
            }                                                                                      \
            x += k * g->xd;                                                                        \
            if (st[0] == 1 && st[1] == 1)                                                          \
                memcpy(y, x, (size_t)n * sizeof(U));                                               \
            else                                                                                   \
                for (int64_t i = 0; i < n; i++)                                                    \
                    y[i * st[0]] = x[i * st[1]];                                                   \
            return;                                                                                \
        }                                                                                          \
        for (int64_t i = 0; i < n; i++) {                                                          \
            int64_t k = load_index(g, off[2] + i * st[2]);                                         \
            if (k < 0 || k >= g->size) {                                                           \
                atomic_store_explicit(&g->bad, 1, memory_order_relaxed);                           \
                return;                                                                            \
            }                                                                                      \
            y[i * st[0]] = x[i * st[1] + k * g->xd];                                               \
        }                                                                                          \
    }
GATHER_FN(gather_u8, uint8_t)
GATHER_FN(gather_u16, uint16_t)
GATHER_FN(gather_u32, uint32_t)
GATHER_FN(gather_u64, uint64_t)

int cpu_gather(const tdd_opcall *c, int nt)
{
    tdd_tensor *y = c->out[0];
    const bool emb = c->op == TDD_OP_EMBEDDING;
    const tdd_tensor *x = emb ? c->in[1] : c->in[0], *ix = emb ? c->in[0] : c->in[1];
    int nd = y->ndim, d = emb ? 0 : (int)c->args->i[0];
    tdd_tensor xv = *x, iv = *ix;
    xv.ndim = iv.ndim = nd;
    gx_ctx g = {.y = y->st->data,
                .x = x->st->data,
                .ix = ix->st->data,
                .ix64 = ix->dtype == TD_I64,
                .xd = x->ndim ? x->strides[d] : 0,
                .size = x->ndim ? x->shape[d] : 1};
    atomic_init(&g.bad, 0);
    if (emb) { /* y = [*ix, D]: x rows picked by ix, ix constant along D */
        for (int k = 0; k < nd; k++) {
            xv.shape[k] = iv.shape[k] = y->shape[k];
            xv.strides[k] = k == nd - 1 ? x->strides[1] : 0;
            iv.strides[k] = k == nd - 1 ? 0 : ix->strides[k];
        }
    } else if (c->op == TDD_OP_INDEX_SELECT) {
        for (int k = 0; k < nd; k++) {
            xv.shape[k] = iv.shape[k] = y->shape[k];
            xv.strides[k] = k == d ? 0 : x->strides[k];
            iv.strides[k] = k == d && ix->ndim ? ix->strides[0] : 0;
        }
    } else { /* gather: y has the index's shape */
        for (int k = 0; k < nd; k++) {
            xv.shape[k] = y->shape[k];
            xv.strides[k] = k == d ? 0 : x->strides[k];
        }
    }
    if (nd == 0) { /* 0-dim index_select/gather: one element */
        xv = *x;
        iv = *ix;
    }
    const tdd_tensor *ops[3] = {y, &xv, &iv};
    tdd_iter it;
    tdd_iter_tensors(&it, y->shape, nd, 3, ops);
    size_t esz = td_dtype_size(y->dtype);
    tdd_iter_fn fn = esz == 1   ? gather_u8
                     : esz == 2 ? gather_u16
                     : esz == 4 ? gather_u32
                                : gather_u64;
    cpu_par_iter(&it, fn, &g, nt);
    return atomic_load(&g.bad) ? TD_EINVALID_ARGUMENT : 0;
}

/* scatter_add: y = x, then y[.., index, ..] += src along dim d. Every line along d
 * (fixed other coordinates) writes only its own line of y, so lines run in parallel
 * without races; within a line the adds keep the reference's order. */
typedef struct {
    const tdd_opcall *c;
    int64_t L, is, ss, yd, size;
    _Atomic int bad;
} sc_ctx;

/* f32/f64 with src of y's dtype (a max_pool2d gradient, an embedding's): typed lines, the
 * pointers and strides held in locals. */
#define SCATTER_LINES(NAME, T)                                                                     \
    static void NAME(sc_ctx *s, int64_t n, const int64_t *off, const int64_t *st)                  \
    {                                                                                              \
        const int64_t *idx = (const int64_t *)s->c->in[1]->st->data;                               \
        const T *src = (const T *)s->c->in[2]->st->data;                                           \
        T *y = (T *)s->c->out[0]->st->data;                                                        \
        const int64_t L = s->L, is = s->is, ss = s->ss, yd = s->yd, size = s->size;                \
        for (int64_t i = 0; i < n; i++) {                                                          \
            const int64_t *ip = idx + off[0] + i * st[0];                                          \
            const T *sp = src + off[1] + i * st[1];                                                \
            T *yp = y + off[2] + i * st[2];                                                        \
            for (int64_t j = 0; j < L; j++) {                                                      \
                const int64_t k = ip[j * is];                                                      \
                if (k < 0 || k >= size) {                                                          \
                    atomic_store_explicit(&s->bad, 1, memory_order_relaxed);                       \
                    return;                                                                        \
                }                                                                                  \
                yp[k * yd] += sp[j * ss];                                                          \
            }                                                                                      \
        }                                                                                          \
    }
SCATTER_LINES(scatter_f32, float)
SCATTER_LINES(scatter_f64, double)

static void scatter_run(void *vc, int64_t n, const int64_t *off, const int64_t *st)
{
    sc_ctx *s = vc;
    const tdd_tensor *ix = s->c->in[1], *src = s->c->in[2];
    tdd_tensor *y = s->c->out[0];
    if (src->dtype == y->dtype && (y->dtype == TD_F32 || y->dtype == TD_F64)) {
        if (y->dtype == TD_F32)
            scatter_f32(s, n, off, st);
        else
            scatter_f64(s, n, off, st);
        return;
    }
    const int64_t *idx = (const int64_t *)ix->st->data;
    const bool fl = tdd_dtype_is_float(y->dtype);
    for (int64_t i = 0; i < n; i++) {
        int64_t io = off[0] + i * st[0], so = off[1] + i * st[1], yo = off[2] + i * st[2];
        for (int64_t j = 0; j < s->L; j++) {
            int64_t k = idx[io + j * s->is];
            if (k < 0 || k >= s->size) {
                atomic_store_explicit(&s->bad, 1, memory_order_relaxed);
                return;
            }
            int64_t at = yo + k * s->yd, from = so + j * s->ss;
            if (y->dtype == TD_F32)
                ((float *)y->st->data)[at] += ((const float *)src->st->data)[from];
            else if (y->dtype == TD_F64)
                ((double *)y->st->data)[at] += ((const double *)src->st->data)[from];
            else if (fl)
                tdd_store_f(y->st->data, y->dtype, at,
                            tdd_load_f(y->st->data, y->dtype, at) +
                                tdd_load_f(src->st->data, src->dtype, from));
            else
                tdd_store_i(y->st->data, y->dtype, at,
                            (int64_t)((uint64_t)tdd_load_i(y->st->data, y->dtype, at) +
                                      (uint64_t)tdd_load_i(src->st->data, src->dtype, from)));
        }
    }
}

int cpu_scatter_add(const tdd_opcall *c, int nt)
{
    const tdd_tensor *x = c->in[0], *ix = c->in[1], *src = c->in[2];
    tdd_tensor *y = c->out[0];
    int d = (int)c->args->i[0], nd = ix->ndim;
    /* y = x first (same shapes; y contiguous) */
    tdd_opcall cp = {
        .op = TDD_OP_CLONE, .args = c->args, .n_in = 1, .n_out = 1, .in = {x}, .out = {y}};
    tdd_opargs ca = *c->args;
    ca.out_view = false;
    cp.args = &ca;
    int rc = cpu_copy(&cp, nt);
    if (rc || tdd_numel(ix) == 0)
        return rc;
    sc_ctx s = {.c = c,
                .L = nd ? ix->shape[d] : 1,
                .is = nd ? ix->strides[d] : 0,
                .ss = nd ? src->strides[d] : 0,
                .yd = nd ? y->strides[d] : 0,
                .size = nd ? x->shape[d] : 1};
    atomic_init(&s.bad, 0);
    /* lines: the index's shape with dim d collapsed; src and y follow the same coords */
    int64_t shape[TD_MAX_NDIM], st[3][TD_MAX_NDIM], base[3] = {ix->offset, src->offset, y->offset};
    for (int k = 0; k < nd; k++) {
        shape[k] = k == d ? 1 : ix->shape[k];
        st[0][k] = ix->strides[k];
        st[1][k] = src->strides[k];
        st[2][k] = y->strides[k];
    }
    tdd_iter it;
    tdd_iter_init(&it, 3, shape, nd, (const int64_t(*)[TD_MAX_NDIM])st, base);
    /* each line costs L elements: scale the threshold */
    int use = it.numel * s.L >= CPU_PAR_MIN ? nt : 1;
    cpu_par_iter_n(&it, scatter_run, &s, use, it.numel * s.L);
    return atomic_load(&s.bad) ? TD_EINVALID_ARGUMENT : 0;
}
