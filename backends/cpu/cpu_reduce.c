/* cpu_reduce.c -- threaded reductions over any set of dims (float inputs of
 * every width accumulate in double, integer and bool inputs in wrapping int64),
 * and the line ops along one dim (cumsum, softmax, log_softmax; f16/bf16 lines
 * through the f32 kernel). Outputs are split across threads; a reduction with
 * fewer outputs than threads splits each output's elements instead and combines. */
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "cpu.h"
#include "dtype.h"

typedef enum { R_SUM, R_PROD, R_MAX, R_MIN, R_ARGMAX, R_ARGMIN, R_SQDEV, R_SUMEXP } rkind;

/* Partial result of reducing some elements of one output. */
typedef struct {
    double v;
    int64_t iv;  /* integer and bool inputs: exact (wrapping) sum, product or extreme */
    int64_t arg; /* argmax/argmin: reduced-order index of v (iv) */
} racc;

typedef struct {
    const char *a;
    rkind kind;
    double center; /* R_SQDEV: the mean; R_SUMEXP: the max */
    racc acc;
    int64_t pos; /* reduced-order index of the next run's first element */
} rrun;

/* Folds v at position pos into acc; NaN wins, then the first extreme. */
static inline void fold_ext(racc *acc, double v, int64_t pos, bool max)
{
    if (acc->v != acc->v)
        return;
    if (v != v || (max ? v > acc->v : v < acc->v)) {
        acc->v = v;
        acc->arg = pos;
    }
}

/* T is the storage type, LD converts one stored element to a float type and PT is
 * the type of the vectorised partial sums: double for f32, whose float partials
 * lost digits to cancellation (a memory-bound loop pays nothing for the widening),
 * f32 for the 16-bit floats. */
#define RED_RUN(NAME, T, LD, PT)                                                                   \
    static void NAME(void *vc, int64_t n, const int64_t *off, const int64_t *st)                   \
    {                                                                                              \
        rrun *r = vc;                                                                              \
        const T *a = (const T *)(const void *)r->a + off[0];                                       \
        int64_t s = st[0];                                                                         \
        double acc = 0;                                                                            \
        switch (r->kind) {                                                                         \
        case R_SUM:                                                                                \
            if (s == 1) {                                                                          \
                /* T lanes over short blocks vectorise; blocks add up in double */                 \
                for (int64_t b0 = 0; b0 < n; b0 += 256) {                                          \
                    int64_t b1 = b0 + 256 < n ? b0 + 256 : n;                                      \
                    PT part = 0;                                                                   \
                    _Pragma("omp simd reduction(+ : part)") for (int64_t i = b0; i < b1; i++)      \
                        part += LD(a[i]);                                                          \
                    acc += (double)part;                                                           \
                }                                                                                  \
            } else {                                                                               \
                for (int64_t i = 0; i < n; i++)                                                    \
                    acc += LD(a[i * s]);                                                           \
            }                                                                                      \
            r->acc.v += acc;                                                                       \
            break;                                                                                 \
        case R_SQDEV: {                                                                            \
            const double m = r->center;                                                            \
            _Pragma("omp simd reduction(+ : acc)") for (int64_t i = 0; i < n; i++)                 \
            {                                                                                      \
                double d = (double)LD(a[i * s]) - m;                                               \
                acc += d * d;                                                                      \
            }                                                                                      \
            r->acc.v += acc;                                                                       \
            break;                                                                                 \
        }                                                                                          \
        case R_SUMEXP: {                                                                           \
            const double m = r->center;                                                            \
            for (int64_t i = 0; i < n; i++)                                                        \
                acc += exp((double)LD(a[i * s]) - m);                                              \
            r->acc.v += acc;                                                                       \
            break;                                                                                 \
        }                                                                                          \
        case R_PROD:                                                                               \
            for (int64_t i = 0; i < n; i++)                                                        \
                r->acc.v *= (double)LD(a[i * s]);                                                  \
            break;                                                                                 \
        case R_MAX:                                                                                \
        case R_ARGMAX:                                                                             \
            for (int64_t i = 0; i < n; i++)                                                        \
                fold_ext(&r->acc, (double)LD(a[i * s]), r->pos + i, true);                         \
            break;                                                                                 \
        case R_MIN:                                                                                \
        case R_ARGMIN:                                                                             \
            for (int64_t i = 0; i < n; i++)                                                        \
                fold_ext(&r->acc, (double)LD(a[i * s]), r->pos + i, false);                        \
            break;                                                                                 \
        }                                                                                          \
        r->pos += n;                                                                               \
    }
#define LD_SAME(v) (v)
RED_RUN(red_run_f32, float, LD_SAME, double)
RED_RUN(red_run_f64, double, LD_SAME, double)
RED_RUN(red_run_f16, uint16_t, tdd_f16_to_f32, float)
RED_RUN(red_run_bf16, uint16_t, tdd_bf16_to_f32, float)

/* Integer and bool inputs: sums and products wrap in uint64 as the reference's
 * int64 math does; extremes keep the first occurrence. */
#define RED_RUN_I(NAME, T)                                                                         \
    static void NAME(void *vc, int64_t n, const int64_t *off, const int64_t *st)                   \
    {                                                                                              \
        rrun *r = vc;                                                                              \
        const T *a = (const T *)(const void *)r->a + off[0];                                       \
        int64_t s = st[0];                                                                         \
        uint64_t acc = (uint64_t)r->acc.iv;                                                        \
        switch (r->kind) {                                                                         \
        case R_SUM:                                                                                \
            _Pragma("omp simd reduction(+ : acc)") for (int64_t i = 0; i < n; i++) acc +=          \
                (uint64_t)(int64_t)a[i * s];                                                       \
            r->acc.iv = (int64_t)acc;                                                              \
            break;                                                                                 \
        case R_PROD:                                                                               \
            for (int64_t i = 0; i < n; i++)                                                        \
                acc *= (uint64_t)(int64_t)a[i * s];                                                \
            r->acc.iv = (int64_t)acc;                                                              \
            break;                                                                                 \
        case R_MAX:                                                                                \
        case R_ARGMAX:                                                                             \
        case R_MIN:                                                                                \
        case R_ARGMIN: {                                                                           \
            const bool mx = r->kind == R_MAX || r->kind == R_ARGMAX;                               \
            for (int64_t i = 0; i < n; i++) {                                                      \
                int64_t v = (int64_t)a[i * s];                                                     \
                if (r->acc.arg < 0 || (mx ? v > r->acc.iv : v < r->acc.iv)) {                      \
                    r->acc.iv = v;                                                                 \
                    r->acc.arg = r->pos + i;                                                       \
                }                                                                                  \
            }                                                                                      \
            break;                                                                                 \
        }                                                                                          \
        case R_SQDEV:                                                                              \
        case R_SUMEXP:                                                                             \
            break; /* float-only reductions (tdd_cpu_native) */                                    \
        }                                                                                          \
        r->pos += n;                                                                               \
    }
RED_RUN_I(red_run_i32, int32_t)
RED_RUN_I(red_run_i64, int64_t)
RED_RUN_I(red_run_b8, uint8_t)

static tdd_iter_fn red_fn(td_dtype dt)
{
    switch (dt) {
    case TD_F32:
        return red_run_f32;
    case TD_F64:
        return red_run_f64;
    case TD_F16:
        return red_run_f16;
    case TD_BF16:
        return red_run_bf16;
    case TD_I32:
        return red_run_i32;
    case TD_I64:
        return red_run_i64;
    case TD_BOOL:
    case TD_U8: /* the small integers run on ref (tdd_cpu_native) */
    case TD_I8:
    case TD_I16:
    case TD_DTYPE_INVALID:
    case TD_DTYPE_COUNT:
        break;
    }
    return red_run_b8;
}

static racc acc_init(rkind k)
{
    racc a = {0, 0, 0};
    if (k == R_PROD)
        a.v = 1, a.iv = 1;
    else if (k == R_MAX || k == R_ARGMAX)
        a.v = -INFINITY, a.arg = -1;
    else if (k == R_MIN || k == R_ARGMIN)
        a.v = INFINITY, a.arg = -1;
    return a;
}

static void acc_combine(racc *into, racc b, rkind k, bool ints)
{
    switch (k) {
    case R_SUM:
    case R_SQDEV:
    case R_SUMEXP:
        into->v += b.v;
        into->iv = (int64_t)((uint64_t)into->iv + (uint64_t)b.iv);
        return;
    case R_PROD:
        into->v *= b.v;
        into->iv = (int64_t)((uint64_t)into->iv * (uint64_t)b.iv);
        return;
    case R_MAX:
    case R_ARGMAX:
    case R_MIN:
    case R_ARGMIN: /* partials come in order, so ties keep the earlier index */
        if (ints) {
            bool mx = k == R_MAX || k == R_ARGMAX;
            if (b.arg >= 0 && (into->arg < 0 || (mx ? b.iv > into->iv : b.iv < into->iv)))
                *into = b;
            return;
        }
        if (b.arg >= 0 && (into->arg < 0 || into->v == into->v))
            if (into->arg < 0 || b.v != b.v ||
                (k == R_MAX || k == R_ARGMAX ? b.v > into->v : b.v < into->v))
                *into = b;
        return;
    }
}

typedef struct {
    const tdd_tensor *a;
    tdd_iter outer; /* operands: output element index (contiguous), input base */
    tdd_iter inner; /* reduced dims of the input */
    int64_t nout, count;
} rplan;

static void plan_init(rplan *p, const tdd_tensor *a, uint32_t mask)
{
    int nk, nr;
    int64_t ks[TD_MAX_NDIM], kst[2][TD_MAX_NDIM], rs[TD_MAX_NDIM], rst[1][TD_MAX_NDIM];
    tdd_split_dims(a, mask, &nk, ks, kst[1], &nr, rs, rst[0]);
    int64_t s = 1;
    for (int d = nk - 1; d >= 0; d--) {
        kst[0][d] = s;
        s *= ks[d];
    }
    int64_t base[2] = {0, a->offset}, zero[1] = {0};
    tdd_iter_init(&p->outer, 2, ks, nk, (const int64_t(*)[TD_MAX_NDIM])kst, base);
    tdd_iter_init(&p->inner, 1, rs, nr, (const int64_t(*)[TD_MAX_NDIM])rst, zero);
    p->a = a;
    p->nout = p->outer.numel;
    p->count = p->inner.numel;
}

/* Reduces elements [lo, hi) (reduced order) of the output whose input base is base. */
static racc reduce_part(const rplan *p, int64_t base, int64_t lo, int64_t hi, rkind k,
                        double center)
{
    rrun r = {.a = p->a->st->data, .kind = k, .center = center, .acc = acc_init(k), .pos = lo};
    tdd_iter in = p->inner;
    in.base[0] = base;
    tdd_iter_range(&in, lo, hi, red_fn(p->a->dtype), &r);
    return r.acc;
}

/* Input base offset of every output (in output order). */
typedef struct {
    int64_t *bases;
} base_ctx;

static void base_run(void *vc, int64_t n, const int64_t *off, const int64_t *st)
{
    base_ctx *b = vc;
    for (int64_t i = 0; i < n; i++)
        b->bases[off[0] + i * st[0]] = off[1] + i * st[1];
}

typedef struct {
    const rplan *p;
    const int64_t *bases;
    rkind k;
    const double *center;
    racc *res;
    int64_t o;   /* rpass_elements: the output whose elements are split */
    racc *parts; /* its partial results, one per thread */
} rpass_job;

/* Outputs whose elements sit next to each other in the input, reduced together: a
 * column sum (a bias's gradient, the sum over a batch) read row by row instead of one
 * strided walk down each column (every load a cache miss, every add waiting on the last).
 * COLS_MAX outputs at a time; each output's sum is the same double sum in the same order
 * as red_run's strided loop, so the bits are those of the walk it replaces. */
#define COLS_MAX 256
#define COLS_RUN(NAME, T)                                                                          \
    static void NAME(const T *a, int64_t n, int64_t s, int64_t k, double *acc)                     \
    {                                                                                              \
        for (int64_t c = 0; c < k; c++)                                                            \
            acc[c] = 0;                                                                            \
        for (int64_t i = 0; i < n; i++) {                                                          \
            const T *row = a + i * s;                                                              \
            _Pragma("omp simd") for (int64_t c = 0; c < k; c++) acc[c] += (double)row[c];          \
        }                                                                                          \
    }
COLS_RUN(cols_f32, float)
COLS_RUN(cols_f64, double)

/* Whether j's sums go column-wise: a float32/float64 sum whose reduced dims are one
 * strided run (red_run's scalar loop; its unit-stride loop sums in another order). */
static bool cols_ok(const rpass_job *j)
{
    const tdd_iter *in = &j->p->inner;
    td_dtype dt = j->p->a->dtype;
    return j->k == R_SUM && (dt == TD_F32 || dt == TD_F64) && in->ndim == 1 &&
           in->strides[0][0] != 1 && in->shape[0] == j->p->count;
}

static void rpass_cols(const rpass_job *j, int64_t lo, int64_t hi)
{
    const rplan *p = j->p;
    bool f64 = p->a->dtype == TD_F64;
    int64_t n = p->count, s = p->inner.strides[0][0];
    double acc[COLS_MAX];
    for (int64_t o = lo; o < hi;) {
        int64_t k = 1;
        while (o + k < hi && k < COLS_MAX && j->bases[o + k] == j->bases[o] + k)
            k++;
        if (f64)
            cols_f64((const double *)p->a->st->data + j->bases[o], n, s, k, acc);
        else
            cols_f32((const float *)p->a->st->data + j->bases[o], n, s, k, acc);
        for (int64_t c = 0; c < k; c++) {
            racc r = acc_init(R_SUM);
            r.v += acc[c];
            j->res[o + c] = r;
        }
        o += k;
    }
}

static void rpass_outputs(void *arg, int t, int nt)
{
    const rpass_job *j = arg;
    int64_t lo, hi;
    cpu_split(j->p->nout, t, nt, &lo, &hi);
    if (cols_ok(j)) {
        rpass_cols(j, lo, hi);
        return;
    }
    for (int64_t o = lo; o < hi; o++)
        j->res[o] =
            reduce_part(j->p, j->bases[o], 0, j->p->count, j->k, j->center ? j->center[o] : 0);
}

static void rpass_elements(void *arg, int t, int nt)
{
    const rpass_job *j = arg;
    int64_t lo, hi;
    cpu_split(j->p->count, t, nt, &lo, &hi);
    j->parts[t] = reduce_part(j->p, j->bases[j->o], lo, hi, j->k, j->center ? j->center[j->o] : 0);
}

/* One pass of kind k over every output: res[o] (center[o] per output if given). */
static void reduce_pass(const rplan *p, const int64_t *bases, rkind k, const double *center,
                        racc *res, int nt)
{
    int64_t nout = p->nout, N = p->count;
    if (nout >= nt || N * nout < CPU_PAR_MIN || nt <= 1) {
        bool par = nout > 1 && N * nout >= CPU_PAR_MIN && nt > 1;
        rpass_job jb = {p, bases, k, center, res, -1, NULL};
        cpu_parallel(par ? nt : 1, rpass_outputs, &jb);
        return;
    }
    /* Few outputs, many elements each: split every output's elements. */
    for (int64_t o = 0; o < nout; o++) {
        racc part[CPU_MAX_PARTS];
        int T = nt < CPU_MAX_PARTS ? nt : CPU_MAX_PARTS;
        rpass_job jb = {p, bases, k, center, res, o, part};
        cpu_parallel(T, rpass_elements, &jb);
        racc acc = acc_init(k);
        for (int t = 0; t < T; t++)
            acc_combine(&acc, part[t], k, !tdd_dtype_is_float(p->a->dtype));
        res[o] = acc;
    }
}

int cpu_reduce(const tdd_opcall *c, int nt)
{
    const tdd_opargs *g = c->args;
    const tdd_tensor *a = c->in[0];
    tdd_tensor *y = c->out[0];
    rplan p;
    plan_init(&p, a, g->dims_mask);
    int64_t nout = p.nout, N = p.count;
    if (nout == 0)
        return 0;
    int64_t *bases = malloc((size_t)nout * sizeof *bases);
    racc *res = malloc((size_t)nout * sizeof *res);
    double *center = malloc((size_t)nout * sizeof *center);
    if (!bases || !res || !center) {
        free(bases);
        free(res);
        free(center);
        return TD_ERESOURCE_EXHAUSTED;
    }
    base_ctx bc = {bases};
    tdd_iter_range(&p.outer, 0, nout, base_run, &bc);
    double scale = 1.0;
    switch (c->op) {
    case TDD_OP_SUM:
    case TDD_OP_SUM_TO:
        reduce_pass(&p, bases, R_SUM, NULL, res, nt);
        break;
    case TDD_OP_MEAN:
        reduce_pass(&p, bases, R_SUM, NULL, res, nt);
        scale = 1.0 / (double)N;
        break;
    case TDD_OP_PROD:
        reduce_pass(&p, bases, R_PROD, NULL, res, nt);
        break;
    case TDD_OP_AMAX:
    case TDD_OP_ARGMAX:
        reduce_pass(&p, bases, c->op == TDD_OP_AMAX ? R_MAX : R_ARGMAX, NULL, res, nt);
        break;
    case TDD_OP_AMIN:
    case TDD_OP_ARGMIN:
        reduce_pass(&p, bases, c->op == TDD_OP_AMIN ? R_MIN : R_ARGMIN, NULL, res, nt);
        break;
    case TDD_OP_VAR:
    case TDD_OP_STD: {
        reduce_pass(&p, bases, R_SUM, NULL, res, nt);
        for (int64_t o = 0; o < nout; o++)
            center[o] = res[o].v / (double)N;
        reduce_pass(&p, bases, R_SQDEV, center, res, nt);
        double den = (double)N - g->f[0];
        scale = 1.0 / (den > 0 ? den : 0.0);
        break;
    }
    case TDD_OP_LOGSUMEXP:
        reduce_pass(&p, bases, R_MAX, NULL, res, nt);
        for (int64_t o = 0; o < nout; o++)
            center[o] = isinf(res[o].v) || N == 0 ? 0.0 : res[o].v;
        for (int64_t o = 0; o < nout; o++)
            if (res[o].v != res[o].v)
                center[o] = NAN; /* keeps the NaN through the second pass */
        reduce_pass(&p, bases, R_SUMEXP, center, res, nt);
        break;
    default:
        break;
    }
    char *yd = (char *)y->st->data;
    for (int64_t o = 0; o < nout; o++) {
        double v = res[o].v;
        if (c->op == TDD_OP_ARGMAX || c->op == TDD_OP_ARGMIN) {
            ((int64_t *)(void *)yd)[y->offset + o] = res[o].arg < 0 ? 0 : res[o].arg;
            continue;
        }
        if (c->op == TDD_OP_MEAN || c->op == TDD_OP_VAR || c->op == TDD_OP_STD)
            v *= scale;
        if (c->op == TDD_OP_STD)
            v = sqrt(v);
        if (c->op == TDD_OP_LOGSUMEXP)
            v = log(v) + center[o];
        if (!tdd_dtype_is_float(a->dtype))
            tdd_store_i(yd, y->dtype, y->offset + o, res[o].iv);
        else
            tdd_store_f(yd, y->dtype, y->offset + o, v);
    }
    free(bases);
    free(res);
    free(center);
    return 0;
}

/* ---------------------------------------------------------------- line ops */

/* One line of L elements: a (stride as) to y (stride ys), computed in double. */
#define LINE_FN(NAME, T)                                                                           \
    static void NAME(tdd_op op, const T *a, int64_t as, T *y, int64_t ys, int64_t L)               \
    {                                                                                              \
        if (op == TDD_OP_CUMSUM) {                                                                 \
            double s = 0;                                                                          \
            for (int64_t k = 0; k < L; k++) {                                                      \
                s += a[k * as];                                                                    \
                y[k * ys] = (T)s;                                                                  \
            }                                                                                      \
            return;                                                                                \
        }                                                                                          \
        double m = -INFINITY, s = 0;                                                               \
        for (int64_t k = 0; k < L; k++) {                                                          \
            double v = a[k * as];                                                                  \
            if (v > m || v != v)                                                                   \
                m = v;                                                                             \
        }                                                                                          \
        if (isinf(m))                                                                              \
            m = 0;                                                                                 \
        for (int64_t k = 0; k < L; k++) {                                                          \
            double e = exp((double)a[k * as] - m);                                                 \
            if (op == TDD_OP_SOFTMAX)                                                              \
                y[k * ys] = (T)e;                                                                  \
            s += e;                                                                                \
        }                                                                                          \
        if (op == TDD_OP_SOFTMAX) {                                                                \
            const double inv = 1.0 / s;                                                            \
            for (int64_t k = 0; k < L; k++)                                                        \
                y[k * ys] = (T)(y[k * ys] * inv);                                                  \
        } else {                                                                                   \
            const double sh = m + log(s);                                                          \
            for (int64_t k = 0; k < L; k++)                                                        \
                y[k * ys] = (T)((double)a[k * as] - sh);                                           \
        }                                                                                          \
    }
LINE_FN(line_f32, float)
LINE_FN(line_f64, double)

typedef struct {
    tdd_op op;
    td_dtype dt;
    const char *a;
    char *y;
    int64_t L, as, ys;
} line_ctx;

/* One thread's share of the lines: f16/bf16 lines are widened into buf (2*L
 * floats: the line, then its result), run through line_f32 and rounded back once. */
typedef struct {
    const line_ctx *l;
    float *buf;
} lines_ctx;

static void lines_run(void *vc, int64_t n, const int64_t *off, const int64_t *st)
{
    const lines_ctx *x = vc;
    const line_ctx *l = x->l;
    for (int64_t i = 0; i < n; i++) {
        int64_t ao = off[1] + i * st[1], yo = off[0] + i * st[0];
        if (l->dt == TD_F64) {
            line_f64(l->op, (const double *)(const void *)l->a + ao, l->as,
                     (double *)(void *)l->y + yo, l->ys, l->L);
        } else if (l->dt == TD_F32) {
            line_f32(l->op, (const float *)(const void *)l->a + ao, l->as,
                     (float *)(void *)l->y + yo, l->ys, l->L);
        } else {
            float *fa = x->buf, *fy = x->buf + l->L;
            cpu_half_to_f32((const uint16_t *)(const void *)l->a + ao, l->as, fa, 1, l->L, l->dt);
            line_f32(l->op, fa, 1, fy, 1, l->L);
            cpu_f32_to_half(fy, 1, (uint16_t *)(void *)l->y + yo, l->ys, l->L, l->dt);
        }
    }
}

/* Lines [lo, hi) of the iteration; false when a half line's buffer is not to be had. */
static bool lines_part(const line_ctx *l, const tdd_iter *it, int64_t lo, int64_t hi)
{
    lines_ctx x = {l, NULL};
    if (cpu_is_half(l->dt) && lo < hi) {
        x.buf = malloc((size_t)l->L * 2 * sizeof *x.buf);
        if (!x.buf)
            return false;
    }
    tdd_iter_range(it, lo, hi, lines_run, &x);
    free(x.buf);
    return true;
}

typedef struct {
    const line_ctx *l;
    const tdd_iter *it;
    _Atomic int failed;
} lines_job;

static void lines_split(void *arg, int t, int use)
{
    lines_job *j = arg;
    int64_t lo, hi;
    cpu_split(j->it->numel, t, use, &lo, &hi);
    if (!lines_part(j->l, j->it, lo, hi))
        atomic_store(&j->failed, 1);
}

int cpu_lines(const tdd_opcall *c, int nt)
{
    const tdd_tensor *a = c->in[0];
    tdd_tensor *y = c->out[0];
    int d = (int)c->args->i[0];
    line_ctx l = {.op = c->op,
                  .dt = a->dtype,
                  .a = a->st->data,
                  .y = y->st->data,
                  .L = a->ndim ? a->shape[d] : 1,
                  .as = a->ndim ? a->strides[d] : 0,
                  .ys = y->ndim ? y->strides[d] : 0};
    if (l.L == 0)
        return 0;
    /* Iterate the line starts: the shape with dim d collapsed to 1. */
    int64_t shape[TD_MAX_NDIM];
    memcpy(shape, a->shape, sizeof shape);
    if (a->ndim)
        shape[d] = 1;
    const tdd_tensor *ops[2] = {y, a};
    tdd_iter it;
    tdd_iter_tensors(&it, shape, a->ndim, 2, ops);
    /* each line costs L elements of work: scale the parallel threshold */
    int use = it.numel * l.L >= CPU_PAR_MIN && it.numel > 1 ? nt : 1;
    if (use > 1 && it.numel < use)
        use = (int)it.numel;
    if (use <= 1)
        return lines_part(&l, &it, 0, it.numel) ? 0 : TD_ERESOURCE_EXHAUSTED;
    lines_job jb = {&l, &it, 0};
    cpu_parallel(use, lines_split, &jb);
    return atomic_load(&jb.failed) ? TD_ERESOURCE_EXHAUSTED : 0;
}
