/* cpu_nn.c -- the cpu backend's NN kernels: conv2d as im2col + OpenBLAS GEMM,
 * threaded pooling, layer_norm and the losses, and the index moves (gather,
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

/* im2col of one image and group: col[(c*kh + i)*kw + j][oh*Wo + ow] = x[c, h, w] or 0,
 * the rows split across threads. F64 picks dgemm over sgemm in cpu_gemm. */
/* clang-format splits the _Pragma strings below, which must stay whole. */
/* clang-format off */
#define CONV_FN(NAME, T, F64)                                                                     \
    static void NAME##_im2col(const conv_geom *q, const T *x, T *restrict col, int nt)            \
    {                                                                                              \
        int64_t K = q->Cg * q->kh * q->kw, L = q->Ho * q->Wo;                                      \
        _Pragma("omp parallel for num_threads(nt) schedule(static) if (K * L >= CPU_PAR_MIN)")     \
        for (int64_t r = 0; r < K; r++) {                                                          \
            int64_t ch = r / (q->kh * q->kw), i = (r / q->kw) % q->kh, j = r % q->kw;              \
            int64_t w0 = j * q->dw - q->pw, lo, hi;                                                \
            conv_valid(w0, q->sw, q->W, q->Wo, &lo, &hi);                                          \
            const int64_t ws = q->xs[3], sw = q->sw;                                               \
            for (int64_t oh = 0; oh < q->Ho; oh++) {                                               \
                T *restrict d = col + r * L + oh * q->Wo;                                          \
                int64_t h = oh * q->sh - q->ph + i * q->dh;                                        \
                if (h < 0 || h >= q->H) {                                                          \
                    memset(d, 0, (size_t)q->Wo * sizeof(T));                                       \
                    continue;                                                                      \
                }                                                                                  \
                const T *s = x + ch * q->xs[1] + h * q->xs[2] + w0 * ws;                           \
                for (int64_t ow = 0; ow < lo; ow++)                                                \
                    d[ow] = 0;                                                                     \
                if (ws == 1 && sw == 1)                                                            \
                    memcpy(d + lo, s + lo, (size_t)(hi - lo) * sizeof(T));                         \
                else                                                                               \
                    for (int64_t ow = lo; ow < hi; ow++)                                           \
                        d[ow] = s[ow * sw * ws];                                                   \
                for (int64_t ow = hi; ow < q->Wo; ow++)                                            \
                    d[ow] = 0;                                                                     \
            }                                                                                      \
        }                                                                                          \
    }                                                                                              \
    static int NAME(const tdd_opcall *c, const conv_geom *q, int nt)                               \
    {                                                                                              \
        const tdd_tensor *x = c->in[0], *w = c->in[1];                                             \
        tdd_tensor *y = c->out[0];                                                                 \
        int64_t N = x->ndim == 4 ? x->shape[0] : 1, K = q->Cg * q->kh * q->kw,                     \
                L = q->Ho * q->Wo;                                                                 \
        /* a 1x1, stride-1, unpadded conv reads x's planes as they are */                          \
        bool direct = q->kh == 1 && q->kw == 1 && q->sh == 1 && q->sw == 1 && q->ph == 0 &&        \
                      q->pw == 0 && q->xs[3] == 1 && q->xs[2] == q->W &&       \
                      q->xs[1] >= L;                             \
        bool wpacked = tdd_is_contiguous(w);                                                       \
        T *col = direct ? NULL : malloc((size_t)(K * L) * sizeof(T));                              \
        T *wp = wpacked ? NULL : malloc((size_t)(q->O * K) * sizeof(T));                           \
        if ((!direct && !col) || (!wpacked && !wp)) {                                              \
            free(col);                                                                             \
            free(wp);                                                                              \
            return TD_ERESOURCE_EXHAUSTED;                                                         \
        }                                                                                          \
        if (wp)                                                                                    \
            tdd_copy_contiguous(w, wp);                                                            \
        const T *W = wp ? wp : (const T *)tdd_data(w);                                             \
        const T *X = (const T *)tdd_data(x);                                                       \
        T *Y = (T *)tdd_data(y);                                                                   \
        const T *bias = (c->args->flags & 4u) ? (const T *)tdd_data(c->in[2]) : NULL;              \
        int64_t bs = bias ? c->in[2]->strides[0] : 0;                                              \
        for (int64_t n = 0; n < N; n++) {                                                          \
            for (int64_t gr = 0; gr < q->groups; gr++) {                                           \
                const T *xg = X + n * q->xs[0] + gr * q->Cg * q->xs[1];                            \
                const T *B = xg;                                                                   \
                int64_t ldb = q->xs[1];                                                            \
                if (!direct) {                                                                     \
                    NAME##_im2col(q, xg, col, nt);                                                 \
                    B = col;                                                                       \
                    ldb = L;                                                                       \
                }                                                                                  \
                T *yg = Y + (n * q->O + gr * q->Og) * L;                                           \
                cpu_gemm(F64, false, false, q->Og, L, K, 1.0, W + gr * q->Og * K, K, B, ldb, 0.0,  \
                         yg, L);                                                                   \
            }                                                                                      \
            if (!bias)                                                                             \
                continue;                                                                          \
            T *yn = Y + n * q->O * L;                                                              \
            _Pragma("omp parallel for num_threads(nt) schedule(static) if (q->O * L >= CPU_PAR_MIN)") \
            for (int64_t o = 0; o < q->O; o++) {                                                   \
                const T bv = bias[o * bs];                                                         \
                _Pragma("omp simd") for (int64_t l = 0; l < L; l++) yn[o * L + l] += bv;           \
            }                                                                                      \
        }                                                                                          \
        free(col);                                                                                 \
        free(wp);                                                                                  \
        return 0;                                                                                  \
    }
CONV_FN(conv_f32, float, false)
CONV_FN(conv_f64, double, true)

static int cpu_conv2d(const tdd_opcall *c, int nt)
{
    conv_geom q;
    conv_geom_init(c, &q);
    int64_t K = q.Cg * q.kh * q.kw, L = q.Ho * q.Wo;
    if (tdd_numel(c->out[0]) == 0)
        return 0;
    /* beyond OpenBLAS's 32-bit sizes, or nothing to multiply: the reference loops */
    if (K == 0 || q.Og > INT_MAX || L > INT_MAX || K > INT_MAX || q.xs[1] > INT_MAX)
        return tdd_ref_run(c);
    return c->in[0]->dtype == TD_F64 ? conv_f64(c, &q, nt) : conv_f32(c, &q, nt);
}

/* ---------------------------------------------------------------- pooling */

/* One [Ho, Wo] plane per (n, c); planes split across threads. Max pooling keeps the
 * first maximum and lets a NaN win, as the reference does. */
#define POOL_FN(NAME, T)                                                                           \
    static void NAME(const tdd_opcall *c, const conv_geom *q, int64_t planes, int nt)              \
    {                                                                                              \
        const tdd_opargs *g = c->args;                                                             \
        const T *X = (const T *)tdd_data(c->in[0]);                                                \
        T *Y = (T *)tdd_data(c->out[0]);                                                           \
        int64_t *ind = c->n_out > 1 ? (int64_t *)tdd_data(c->out[1]) : NULL;                         \
        const int64_t kh = g->ints[3][0], kw = g->ints[3][1], L = q->Ho * q->Wo;                   \
        const bool mx = c->op == TDD_OP_MAX_POOL2D, cip = g->i[2] != 0;                            \
        _Pragma("omp parallel for num_threads(nt) schedule(static) if (planes * L * kh * kw >= CPU_PAR_MIN)") \
        for (int64_t p = 0; p < planes; p++) {                                                     \
            const T *xp = X + (p / q->C) * q->xs[0] + (p % q->C) * q->xs[1];                       \
            for (int64_t oh = 0; oh < q->Ho; oh++)                                                 \
                for (int64_t ow = 0; ow < q->Wo; ow++) {                                           \
                    int64_t h0 = oh * q->sh - q->ph, w0 = ow * q->sw - q->pw, e = p * L +          \
                                                                            oh * q->Wo + ow;       \
                    if (mx) {                                                                      \
                        T best = -(T)INFINITY;                                                     \
                        int64_t arg = -1;                                                          \
                        for (int64_t i = 0; i < kh; i++) {                                         \
                            int64_t h = h0 + i * q->dh;                                            \
                            if (h < 0 || h >= q->H)                                                \
                                continue;                                                          \
                            for (int64_t j = 0; j < kw; j++) {                                     \
                                int64_t w = w0 + j * q->dw;                                        \
                                if (w < 0 || w >= q->W)                                            \
                                    continue;                                                      \
                                T v = xp[h * q->xs[2] + w * q->xs[3]];                             \
                                if (arg < 0 || v > best || (v != v && best == best)) {             \
                                    best = v;                                                      \
                                    arg = h * q->W + w;                                            \
                                }                                                                  \
                            }                                                                      \
                        }                                                                          \
                        Y[e] = best;                                                               \
                        if (ind)                                                                   \
                            ind[e] = arg;                                                            \
                    } else {                                                                       \
                        int64_t hs = h0 + kh < q->H + q->ph ? h0 + kh : q->H + q->ph;              \
                        int64_t ws = w0 + kw < q->W + q->pw ? w0 + kw : q->W + q->pw;              \
                        int64_t ha = h0 < 0 ? 0 : h0, wa = w0 < 0 ? 0 : w0;                        \
                        int64_t hb = hs < q->H ? hs : q->H, wb = ws < q->W ? ws : q->W;            \
                        double s = 0;                                                              \
                        for (int64_t h = ha; h < hb; h++)                                          \
                            for (int64_t w = wa; w < wb; w++)                                      \
                                s += xp[h * q->xs[2] + w * q->xs[3]];                              \
                        int64_t div = cip ? (hs - h0) * (ws - w0) : (hb - ha) * (wb - wa);         \
                        Y[e] = (T)(s / (double)div);                                               \
                    }                                                                              \
                }                                                                                  \
        }                                                                                          \
    }
POOL_FN(pool_f32, float)
POOL_FN(pool_f64, double)
/* clang-format on */

static int cpu_pool2d(const tdd_opcall *c, int nt)
{
    conv_geom q;
    memset(&q, 0, sizeof q);
    const tdd_tensor *x = c->in[0];
    const tdd_opargs *g = c->args;
    int b = x->ndim == 4;
    q.C = x->shape[b];
    q.H = x->shape[b + 1];
    q.W = x->shape[b + 2];
    q.Ho = c->out[0]->shape[b + 1];
    q.Wo = c->out[0]->shape[b + 2];
    q.sh = g->ints[0][0];
    q.sw = g->ints[0][1];
    q.ph = g->ints[1][0];
    q.pw = g->ints[1][1];
    q.dh = g->ints[2][0];
    q.dw = g->ints[2][1];
    q.xs[0] = b ? x->strides[0] : 0;
    for (int k = 0; k < 3; k++)
        q.xs[k + 1] = x->strides[b + k];
    int64_t planes = (b ? x->shape[0] : 1) * q.C;
    if (x->dtype == TD_F64)
        pool_f64(c, &q, planes, nt);
    else
        pool_f32(c, &q, planes, nt);
    return 0;
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
static int cpu_layer_norm(const tdd_opcall *c, int nt)
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
static int cpu_class_loss(const tdd_opcall *c, int nt)
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

static int cpu_pointwise_loss(const tdd_opcall *c, int nt)
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

static int cpu_gather(const tdd_opcall *c, int nt)
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

static void scatter_run(void *vc, int64_t n, const int64_t *off, const int64_t *st)
{
    sc_ctx *s = vc;
    const tdd_tensor *ix = s->c->in[1], *src = s->c->in[2];
    tdd_tensor *y = s->c->out[0];
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

static int cpu_scatter_add(const tdd_opcall *c, int nt)
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

int cpu_nn(const tdd_opcall *c, int nt)
{
    switch (c->op) {
    case TDD_OP_CONV2D:
        return cpu_conv2d(c, nt);
    case TDD_OP_MAX_POOL2D:
    case TDD_OP_AVG_POOL2D:
        return cpu_pool2d(c, nt);
    case TDD_OP_LAYER_NORM:
        return cpu_layer_norm(c, nt);
    case TDD_OP_CONV_TRANSPOSE2D:
        return cpu_conv_transpose2d(c, nt);
    case TDD_OP_CROSS_ENTROPY:
    case TDD_OP_NLL_LOSS:
        return cpu_class_loss(c, nt);
    case TDD_OP_MSE_LOSS:
    case TDD_OP_BCE_WITH_LOGITS:
        return cpu_pointwise_loss(c, nt);
    case TDD_OP_GATHER:
    case TDD_OP_INDEX_SELECT:
    case TDD_OP_EMBEDDING:
        return cpu_gather(c, nt);
    case TDD_OP_SCATTER_ADD:
        return cpu_scatter_add(c, nt);
    case TDD_OP_SDPA:
        return cpu_sdpa(c, nt);
    default:
        return TD_EINTERNAL;
    }
}
