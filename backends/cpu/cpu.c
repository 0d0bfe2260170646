/* cpu.c -- the fast CPU backend: OpenBLAS GEMM (matmul, conv2d), vectorisable loops for
 * float, integer and bool dtypes threaded on the backend's own teams (cpu_threads.c),
 * f16/bf16 through f32; storage from a caching allocator (pool.h).
 * Calls it has no fast kernel for run on the reference kernels, single-threaded;
 * tdd_cpu_native says which, and docs/ops.md shows it. */
#include <cblas.h>
#include <malloc.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "cpu.h"
#include "cpu_shm.h"
#include "dtype.h"
#include "pool.h"
#include "ref/ref.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#define CPU_POISON(p, n) ASAN_POISON_MEMORY_REGION(p, n)
#define CPU_UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION(p, n)
#define CPU_ASAN 1
#else
#define CPU_POISON(p, n) ((void)(p), (void)(n))
#define CPU_UNPOISON(p, n) ((void)(p), (void)(n))
#endif

/* pthread OpenBLAS: stops its server threads (driver/others/blas_server.c). */
extern int blas_thread_shutdown_(void) __attribute__((weak));

typedef struct {
    int ndev;
    int threads;
    /* One caching allocator for every cpu:N: they share the host's memory, and a block
     * freed on one serves the next request on any. */
    tdd_pool *pool;
    /* Blocks in memfds (cpu_shm.h), for the sessions that take downloads as fds. */
    tdd_pool *shm_pool;
} cpu_ctx;

typedef struct {
    const tdd_iter *it;
    tdd_iter_fn fn;
    void *ctx;
} par_iter_job;

static void par_iter_part(void *arg, int t, int nt)
{
    const par_iter_job *j = arg;
    int64_t lo, hi;
    cpu_split(j->it->numel, t, nt, &lo, &hi);
    tdd_iter_range(j->it, lo, hi, j->fn, j->ctx);
}

void cpu_par_iter_n(const tdd_iter *it, tdd_iter_fn fn, void *ctx, int nt, int64_t work)
{
    int64_t n = it->numel;
    if (work < CPU_PAR_MIN || nt <= 1 || n <= 1) {
        tdd_iter_range(it, 0, n, fn, ctx);
        return;
    }
    if (n < nt)
        nt = (int)n;
    par_iter_job j = {it, fn, ctx};
    cpu_parallel(nt, par_iter_part, &j);
}

void cpu_par_iter(const tdd_iter *it, tdd_iter_fn fn, void *ctx, int nt)
{
    cpu_par_iter_n(it, fn, ctx, nt, it->numel);
}

void cpu_load_strided(const void *data, td_dtype dt, int64_t off, int64_t st, int64_t n,
                      double *dst)
{
    switch (dt) {
    case TD_F32: {
        const float *a = (const float *)data + off;
        if (st == 1) {
#pragma omp simd
            for (int64_t i = 0; i < n; i++)
                dst[i] = a[i];
        } else {
            for (int64_t i = 0; i < n; i++)
                dst[i] = a[i * st];
        }
        return;
    }
    case TD_F64: {
        const double *a = (const double *)data + off;
        if (st == 1)
            memcpy(dst, a, (size_t)n * sizeof *dst);
        else
            for (int64_t i = 0; i < n; i++)
                dst[i] = a[i * st];
        return;
    }
    default:
        for (int64_t i = 0; i < n; i++)
            dst[i] = tdd_load_f(data, dt, off + i * st);
        return;
    }
}

void cpu_store_strided(void *data, td_dtype dt, int64_t off, int64_t st, int64_t n,
                       const double *src)
{
    switch (dt) {
    case TD_F32: {
        float *y = (float *)data + off;
        if (st == 1) {
#pragma omp simd
            for (int64_t i = 0; i < n; i++)
                y[i] = (float)src[i];
        } else {
            for (int64_t i = 0; i < n; i++)
                y[i * st] = (float)src[i];
        }
        return;
    }
    case TD_F64: {
        double *y = (double *)data + off;
        for (int64_t i = 0; i < n; i++)
            y[i * st] = src[i];
        return;
    }
    default:
        for (int64_t i = 0; i < n; i++)
            tdd_store_f(data, dt, off + i * st, src[i]);
        return;
    }
}

typedef struct {
    const tdd_tensor *t;
    double *dst;
} load_ctx;

static void load_run(void *vc, int64_t n, const int64_t *off, const int64_t *st)
{
    load_ctx *l = vc;
    cpu_load_strided(l->t->st->data, l->t->dtype, off[0], st[0], n, l->dst);
    l->dst += n;
}

void cpu_load_tensor(const tdd_tensor *t, int64_t lo, int64_t hi, double *dst)
{
    if (tdd_is_contiguous(t)) {
        cpu_load_strided(t->st->data, t->dtype, t->offset + lo, 1, hi - lo, dst);
        return;
    }
    tdd_iter it;
    const tdd_tensor *ops[1] = {t};
    tdd_iter_tensors(&it, t->shape, t->ndim, 1, ops);
    load_ctx l = {t, dst};
    tdd_iter_range(&it, lo, hi, load_run, &l);
}

void cpu_store_contig(tdd_tensor *t, int64_t lo, int64_t n, const double *src)
{
    cpu_store_strided(t->st->data, t->dtype, t->offset + lo, 1, n, src);
}

/* ---------------------------------------------------------------- f16/bf16 via f32 */

/* Bit casts the vectoriser sees through. */
static inline float f32_of_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline uint32_t bits_of_f32(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

/* dtype.h's conversions branch per class of value (and call lrintf), which keeps
 * the compiler from vectorising them; these compute every class and blend with
 * masks (GCC leaves ternaries here as branches), with bit-identical results
 * (checked against dtype.h over every f16 and every f32). */
static inline uint32_t pick(bool c, uint32_t a, uint32_t b)
{
    uint32_t m = 0u - (uint32_t)c;
    return (a & m) | (b & ~m);
}

static inline float f16_to_f32_sel(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, em = h & 0x7fffu;
    uint32_t normal = (em << 13) + (112u << 23);               /* exponent bias 15 -> 127 */
    uint32_t special = (em << 13) | 0x7f800000u;               /* infinity, NaN */
    uint32_t sub = bits_of_f32((float)(int32_t)em * 0x1p-24f); /* subnormal, zero: exact */
    uint32_t u = pick(em >= 0x7c00u, special, pick(em >= 0x0400u, normal, sub));
    return f32_of_bits(u | sign);
}

static inline uint16_t f32_to_f16_sel(float f)
{
    uint32_t x = bits_of_f32(f), sign = (x >> 16) & 0x8000u, ax = x & 0x7fffffffu;
    /* normal: the 13 dropped mantissa bits round to nearest even; a carry into the
     * exponent is the correct result, up to infinity from 65520 */
    uint32_t normal = (ax - (112u << 23) + 0xfffu + ((ax >> 13) & 1u)) >> 13;
    /* below 2^-14: in a sum with 0.5 the last mantissa bit weighs 2^-24, an f16
     * subnormal's unit, so the FPU's addition does the rounding to nearest even */
    uint32_t sub = bits_of_f32(f32_of_bits(ax) + 0.5f) - 0x3f000000u;
    uint32_t special = pick(ax > 0x7f800000u, 0x7e00u, 0x7c00u); /* NaN stays a NaN */
    uint32_t h = pick(ax >= 0x47800000u, special, pick(ax >= 0x38800000u, normal, sub));
    return (uint16_t)(h | sign);
}

static inline uint16_t f32_to_bf16_sel(float f)
{
    uint32_t u = bits_of_f32(f);
    uint32_t nan = (u >> 16) | 0x40u, rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    return (uint16_t)pick((u & 0x7fffffffu) > 0x7f800000u, nan, rounded);
}

/* Unit-stride loops, vectorised for the baseline ISA (SSE2 on x86-64). */
static inline void f16_to_f32_unit(const uint16_t *h, float *f, int64_t n)
{
#pragma omp simd
    for (int64_t i = 0; i < n; i++)
        f[i] = f16_to_f32_sel(h[i]);
}

static inline void f32_to_f16_unit(const float *f, uint16_t *h, int64_t n)
{
#pragma omp simd
    for (int64_t i = 0; i < n; i++)
        h[i] = f32_to_f16_sel(f[i]);
}

static inline void bf16_to_f32_unit(const uint16_t *h, float *f, int64_t n)
{
#pragma omp simd
    for (int64_t i = 0; i < n; i++)
        f[i] = f32_of_bits((uint32_t)h[i] << 16);
}

static inline void f32_to_bf16_unit(const float *f, uint16_t *h, int64_t n)
{
#pragma omp simd
    for (int64_t i = 0; i < n; i++)
        h[i] = f32_to_bf16_sel(f[i]);
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>
#include <immintrin.h>

/* Conversions are most of a half-precision elementwise op's time, and SSE2 has
 * neither a 32->16-bit unsigned pack nor blends: where the CPU has them, f16 goes
 * through F16C's conversion instructions (IEEE round to nearest even, exact as
 * dtype.h except for NaN bits, so blocks holding a NaN take the portable path) and
 * bf16's rounding is compiled for AVX2. */
static bool cpu_has_f16c(void)
{
    unsigned a, b, c, d; /* cpuid: clang's __builtin_cpu_supports does not know "f16c" */
    return __builtin_cpu_supports("avx2") && __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
}

__attribute__((target("avx2,f16c"))) static void f16_to_f32_f16c(const uint16_t *h, float *f,
                                                                 int64_t n)
{
    const __m128i mag = _mm_set1_epi16(0x7fff), inf = _mm_set1_epi16(0x7c00);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m128i v = _mm_loadu_si128((const __m128i *)(const void *)(h + i));
        __m128i nan = _mm_cmpgt_epi16(_mm_and_si128(v, mag), inf);
        if (!_mm_testz_si128(nan, nan))
            f16_to_f32_unit(h + i, f + i, 8); /* the hardware quiets signalling NaNs */
        else
            _mm256_storeu_ps(f + i, _mm256_cvtph_ps(v));
    }
    f16_to_f32_unit(h + i, f + i, n - i);
}

__attribute__((target("avx2,f16c"))) static void f32_to_f16_f16c(const float *f, uint16_t *h,
                                                                 int64_t n)
{
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 x = _mm256_loadu_ps(f + i);
        __m256 nan = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);
        if (!_mm256_testz_ps(nan, nan))
            f32_to_f16_unit(f + i, h + i, 8); /* the hardware keeps NaN payload bits */
        else
            _mm_storeu_si128((__m128i *)(void *)(h + i),
                             _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT));
    }
    f32_to_f16_unit(f + i, h + i, n - i);
}

__attribute__((target("avx2"))) static void f32_to_bf16_avx2(const float *f, uint16_t *h, int64_t n)
{
    f32_to_bf16_unit(f, h, n);
}
#else
static bool cpu_has_f16c(void)
{
    return false;
}
#define f16_to_f32_f16c f16_to_f32_unit
#define f32_to_f16_f16c f32_to_f16_unit
#define f32_to_bf16_avx2 f32_to_bf16_unit
#endif

void cpu_half_to_f32(const uint16_t *h, int64_t hs, float *f, int64_t fs, int64_t n, td_dtype dt)
{
    if (hs == 1 && fs == 1) {
        if (dt == TD_F16)
            (cpu_has_f16c() ? f16_to_f32_f16c : f16_to_f32_unit)(h, f, n);
        else
            bf16_to_f32_unit(h, f, n);
    } else if (dt == TD_F16) {
        for (int64_t i = 0; i < n; i++)
            f[i * fs] = f16_to_f32_sel(h[i * hs]);
    } else {
        for (int64_t i = 0; i < n; i++)
            f[i * fs] = f32_of_bits((uint32_t)h[i * hs] << 16);
    }
}

void cpu_f32_to_half(const float *f, int64_t fs, uint16_t *h, int64_t hs, int64_t n, td_dtype dt)
{
    if (hs == 1 && fs == 1) {
        if (dt == TD_F16)
            (cpu_has_f16c() ? f32_to_f16_f16c : f32_to_f16_unit)(f, h, n);
        else
            (cpu_has_f16c() ? f32_to_bf16_avx2 : f32_to_bf16_unit)(f, h, n);
    } else if (dt == TD_F16) {
        for (int64_t i = 0; i < n; i++)
            h[i * hs] = f32_to_f16_sel(f[i * fs]);
    } else {
        for (int64_t i = 0; i < n; i++)
            h[i * hs] = f32_to_bf16_sel(f[i * fs]);
    }
}

typedef struct {
    float *f;
    void *h;
    td_dtype dt;
} half_ctx;

static void half_to_f32_run(void *vc, int64_t n, const int64_t *off, const int64_t *st)
{
    const half_ctx *x = vc;
    cpu_half_to_f32((const uint16_t *)x->h + off[1], st[1], x->f + off[0], st[0], n, x->dt);
}

static void f32_to_half_run(void *vc, int64_t n, const int64_t *off, const int64_t *st)
{
    const half_ctx *x = vc;
    cpu_f32_to_half(x->f + off[1], st[1], (uint16_t *)x->h + off[0], st[0], n, x->dt);
}

/* Runs an f32 kernel on a call with f16/bf16 operands: every 16-bit float input is
 * converted into a contiguous f32 copy, outputs are computed in f32 and rounded
 * back once (the reference computes in double and rounds once too). */
int cpu_via_f32(const tdd_opcall *c, int nt, int (*run)(const tdd_opcall *, int))
{
    tdd_opcall fc = *c;
    tdd_opargs fa = *c->args;
    tdd_tensor tin[TDD_MAX_OP_INPUTS], tout[TDD_MAX_OP_OUTPUTS];
    tdd_storage sin[TDD_MAX_OP_INPUTS], sout[TDD_MAX_OP_OUTPUTS];
    float *bufs[TDD_MAX_OP_INPUTS + TDD_MAX_OP_OUTPUTS] = {0};
    int nb = 0, rc = 0;
    fc.args = &fa;
    if (cpu_is_half(fa.dtype))
        fa.dtype = TD_F32;
    if (cpu_is_half(fa.cdtype))
        fa.cdtype = TD_F32;
    for (int k = 0; k < c->n_in + c->n_out && !rc; k++) {
        bool out = k >= c->n_in;
        const tdd_tensor *t = out ? c->out[k - c->n_in] : c->in[k];
        if (!cpu_is_half(t->dtype))
            continue;
        tdd_tensor *f = out ? &tout[k - c->n_in] : &tin[k];
        tdd_storage *st = out ? &sout[k - c->n_in] : &sin[k];
        *f = *t;
        f->dtype = TD_F32;
        f->offset = 0;
        tdd_set_contiguous(f);
        int64_t n = tdd_numel(t);
        memset(st, 0, sizeof *st);
        st->data = bufs[nb++] = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
        st->nbytes = (size_t)n * sizeof(float);
        f->st = st;
        if (!st->data) {
            rc = TD_ERESOURCE_EXHAUSTED;
            break;
        }
        if (out) {
            fc.out[k - c->n_in] = f;
            continue;
        }
        half_ctx x = {st->data, t->st->data, t->dtype};
        const tdd_tensor *ops[2] = {f, t};
        tdd_iter it;
        tdd_iter_tensors(&it, t->shape, t->ndim, 2, ops);
        cpu_par_iter(&it, half_to_f32_run, &x, nt);
        fc.in[k] = f;
    }
    if (!rc)
        rc = run(&fc, nt);
    for (int k = 0; k < c->n_out && !rc; k++) {
        tdd_tensor *t = c->out[k];
        if (!cpu_is_half(t->dtype))
            continue;
        half_ctx x = {tout[k].st->data, t->st->data, t->dtype};
        const tdd_tensor *ops[2] = {t, &tout[k]};
        tdd_iter it;
        tdd_iter_tensors(&it, t->shape, t->ndim, 2, ops);
        cpu_par_iter(&it, f32_to_half_run, &x, nt);
    }
    for (int k = 0; k < nb; k++)
        free(bufs[k]);
    return rc;
}

static int matmul_nt(const tdd_opcall *c, int nt)
{
    (void)nt; /* OpenBLAS runs its own threads */
    return cpu_matmul(c);
}

static bool is_f(td_dtype dt)
{
    return dt == TD_F32 || dt == TD_F64;
}

/* All inputs of dtype dt? */
static bool inputs_are(const tdd_opcall *c, int from, int to, td_dtype dt)
{
    for (int i = from; i < to && i < c->n_in; i++)
        if (c->in[i]->dtype != dt)
            return false;
    return true;
}

static bool is_i(td_dtype dt)
{
    return dt == TD_I32 || dt == TD_I64;
}

/* The scalar form's integer "other" fits the compute dtype, so truncating it to the
 * integer kernels' width changes nothing (the reference computes in int64). */
static bool scalar_fits(const tdd_opargs *g)
{
    if (!g->scalar_form || g->cdtype == TD_I64)
        return true;
    if (g->cdtype == TD_I32)
        return g->n[0] >= INT32_MIN && g->n[0] <= INT32_MAX;
    return g->cdtype != TD_BOOL || g->n[0] == 0 || g->n[0] == 1;
}

/* Inputs [from, to) the f32 kernels take through conversion (cpu_elem.c): compute
 * dtype f16/bf16 with every input of it, or f32 with f32 and f16/bf16 inputs
 * (widening is exact, as the reference's is). */
static bool via_f32(const tdd_opcall *c, int from, int to)
{
    td_dtype ct = c->args->cdtype;
    if (cpu_is_half(ct))
        return inputs_are(c, from, to, ct);
    if (ct != TD_F32)
        return false;
    for (int i = from; i < to && i < c->n_in; i++)
        if (c->in[i]->dtype != TD_F32 && !cpu_is_half(c->in[i]->dtype))
            return false;
    return true;
}

/* An op of elementwise.h's tables: the float kernels for f32/f64 (f16/bf16 through them), the
 * integer ones for rows with an exact integer form (IMODE INT), integer inputs of a float
 * compute dtype converted first. */
static bool ew_native(const tdd_opcall *c, int arity)
{
    const tdd_opargs *g = c->args;
    td_dtype ct = g->cdtype;
    bool ints = tdd_ew_imode(c->op) == TDD_EWI_INT && (is_i(ct) || ct == TD_BOOL);
    if (arity == 1)
        return ((tdd_dtype_is_float(ct) || ints) && c->in[0]->dtype == ct) ||
               cpu_ints_to_float(c); /* exp of an integer tensor: f32 */
    return ((is_f(ct) || ints) && inputs_are(c, 0, 2, ct) && scalar_fits(g)) || via_f32(c, 0, 2) ||
           cpu_ints_to_float(c); /* integer inputs, float compute: converted first */
}

bool tdd_cpu_native(const tdd_opcall *c)
{
    const tdd_opargs *g = c->args;
    td_dtype ct = g->cdtype;
    int arity = (unsigned)c->op < TDD_OP_COUNT ? tdd_ew_arity(c->op) : 0;
    /* uint8, int8, int16 anywhere: the reference's kernels (documented in docs/ops.md) */
    for (int k = 0; k < c->n_in; k++)
        if (tdd_dtype_is_small_int(c->in[k]->dtype))
            return false;
    for (int k = 0; k < c->n_out; k++)
        if (tdd_dtype_is_small_int(c->out[k]->dtype))
            return false;
    if (tdd_dtype_is_small_int(g->cdtype))
        return false;
    if (c->op == TDD_OP_CLAMP && c->n_in > 1)
        return false; /* tensor bounds: the reference's maximum then minimum */
    if (arity)
        return ew_native(c, arity);
    switch (c->op) {
    case TDD_OP_WHERE:
        return inputs_are(c, 1, 3, ct); /* a select: any dtype */
    case TDD_OP_MASKED_FILL:            /* the value as a tensor: the reference */
        return c->in[0]->dtype == ct && c->n_in == 2;
    case TDD_OP_SUM:
    case TDD_OP_AMAX:
    case TDD_OP_AMIN:
    case TDD_OP_ARGMAX:
    case TDD_OP_ARGMIN:
    case TDD_OP_PROD:
    case TDD_OP_SUM_TO:
        return true; /* every dtype the op accepts: float, integer or bool runs */
    case TDD_OP_MEAN:
    case TDD_OP_VAR:
    case TDD_OP_STD:
    case TDD_OP_LOGSUMEXP:
        return tdd_dtype_is_float(c->in[0]->dtype) || cpu_ints_to_float(c);
    case TDD_OP_CUMSUM:
    case TDD_OP_SOFTMAX:
    case TDD_OP_LOG_SOFTMAX: /* f16/bf16 lines widened to f32 (cpu_reduce.c) */
        return tdd_dtype_is_float(c->in[0]->dtype);
    case TDD_OP_MATMUL:
    case TDD_OP_BMM:
    case TDD_OP_LINEAR: /* f16/bf16 convert to f32 for sgemm */
        return tdd_dtype_is_float(c->in[0]->dtype);
    case TDD_OP_TRANSPOSE:
    case TDD_OP_PERMUTE:
    case TDD_OP_RESHAPE:
    case TDD_OP_VIEW:
    case TDD_OP_FLATTEN:
    case TDD_OP_SQUEEZE:
    case TDD_OP_UNSQUEEZE:
    case TDD_OP_EXPAND:
    case TDD_OP_SLICE:
    case TDD_OP_CONTIGUOUS:
    case TDD_OP_DETACH:
    case TDD_OP_SPLIT:
    case TDD_OP_CHUNK:
    case TDD_OP_CLONE:
        return true; /* views do nothing; copies move bytes of any dtype */
    case TDD_OP_CAST:
        return true;     /* every pair converts as ref does (cpu_cast.c) */
    case TDD_OP_ONE_HOT: /* output i64 (ops_shape.c); cpu_one_hot fills it row by row */
        return tdd_is_contiguous(c->out[0]) && c->out[0]->dtype == TD_I64 &&
               (c->in[0]->dtype == TD_I64 || c->in[0]->dtype == TD_I32);
    case TDD_OP_FULL:
    case TDD_OP_ZEROS:
    case TDD_OP_ONES:
    case TDD_OP_RAND:
    case TDD_OP_RANDN:
        return is_f(g->dtype);
    case TDD_OP_GATHER:
    case TDD_OP_SCATTER_ADD: /* a 0-d input with a 1-D index: the reference */
        return c->in[0]->ndim > 0 || c->in[1]->ndim == 0;
    case TDD_OP_INDEX_SELECT:
    case TDD_OP_EMBEDDING:
        return true; /* index moves copy elements of any dtype */
    case TDD_OP_CROSS_ENTROPY:
    case TDD_OP_NLL_LOSS: /* [N, C] or [C] rows; weights, soft targets, [N, C, d...]: ref */
        return tdd_dtype_is_float(c->in[0]->dtype) && c->in[0]->ndim <= 2 && !c->args->flags;
    case TDD_OP_MSE_LOSS:
    case TDD_OP_BCE_WITH_LOGITS:
    case TDD_OP_LAYER_NORM:
        return tdd_dtype_is_float(c->in[0]->dtype); /* rows worked in double */
    case TDD_OP_BATCH_NORM:                         /* a dense input (cpu_norm.c) */
        return tdd_dtype_is_float(c->in[0]->dtype) && tdd_is_contiguous(c->in[0]);
    case TDD_OP_CONV_TRANSPOSE2D: /* dense input and weight (cpu_convt.c; f16/bf16 via f32) */
        return tdd_dtype_is_float(c->in[0]->dtype) && tdd_is_contiguous(c->in[0]) &&
               tdd_is_contiguous(c->in[1]);
    case TDD_OP_CONV2D:
    case TDD_OP_CONV1D: /* conv2d's kernel (tdd_conv1d_by_parts) */
    case TDD_OP_MAX_POOL2D:
    case TDD_OP_AVG_POOL2D: /* f16/bf16 through f32 copies */
        return tdd_dtype_is_float(c->in[0]->dtype);
    case TDD_OP_CAT:
    case TDD_OP_STACK: /* raw element moves; mixed dtypes convert (the reference does) */
        return inputs_are(c, 0, c->n_in, c->out[0]->dtype);
    case TDD_OP_TRIL:
    case TDD_OP_TRIU: /* rows of a C-contiguous output (cpu_index.c) */
        return tdd_is_contiguous(c->out[0]);
    case TDD_OP_PAD: /* the same, mode constant; reflect, replicate, circular: the reference */
        return tdd_is_contiguous(c->out[0]) && c->args->i[0] == 0;
    case TDD_OP_SDPA: /* rows in double as the reference's (cpu_attn.c); f16/bf16 via f32 */
        return tdd_dtype_is_float(c->in[0]->dtype);
    case TDD_OP_DROPOUT: /* the reference's draws and rounding: bit-identical */
        return tdd_dtype_is_float(c->in[0]->dtype) && tdd_is_contiguous(c->out[0]);
    case TDD_OP_ARANGE:
    case TDD_OP_LINSPACE:
    case TDD_OP_EYE:
    case TDD_OP_RANDINT:
        return false;
    default: /* the elementwise expression ops: ew_native, above */
        break;
    }
    return false;
}

/* The pool's raw allocator. Blocks of 4 MiB and more are mappings of their own on 2 MiB
 * pages (an upload into fresh memory otherwise spends as long taking 4 KiB page faults as
 * it does copying: bench/transfer), unmapped when the pool releases them, so the memory
 * goes back to the system at once; smaller ones come from malloc, 64-byte aligned for
 * vector loads. The pool reuses both, so a steady loop maps nothing and faults nothing. */
static void *cpu_raw_alloc(void *ctx, size_t n)
{
    (void)ctx;
    void *p = NULL;
    if (n >= TDD_POOL_LARGE) { /* n is a multiple of 2 MiB (the pool's size classes) */
        size_t map = n + TDD_POOL_HUGE;
        char *m = mmap(NULL, map, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (m == MAP_FAILED)
            return NULL;
        uintptr_t a = ((uintptr_t)m + TDD_POOL_HUGE - 1) & ~(uintptr_t)(TDD_POOL_HUGE - 1);
        size_t head = (size_t)(a - (uintptr_t)m), tail = map - head - n;
        if (head)
            munmap(m, head);
        if (tail)
            munmap((char *)a + n, tail);
        (void)madvise((void *)a, n, MADV_HUGEPAGE); /* a hint: without THP it changes nothing */
        return (void *)a;
    }
    if (posix_memalign(&p, 64, n))
        return NULL;
    return p;
}

/* Unpoisons a block before it goes back to the system. A mapping's shadow is released
 * rather than written (zero pages read as addressable): writing it would keep n/8
 * bytes resident per block after the block itself is gone. */
static void cpu_release_poison(void *p, size_t n)
{
#ifdef CPU_ASAN
    if (n >= TDD_POOL_LARGE) {
        size_t scale, off;
        __asan_get_shadow_mapping(&scale, &off);
        uintptr_t sh = ((uintptr_t)p >> scale) + off;
        size_t len = n >> scale, pg = (size_t)sysconf(_SC_PAGESIZE);
        if (sh % pg == 0 && len % pg == 0 && madvise((void *)sh, len, MADV_DONTNEED) == 0)
            return;
    }
#endif
    CPU_UNPOISON(p, n);
}

static void cpu_raw_free(void *ctx, void *p, size_t n)
{
    (void)ctx;
    cpu_release_poison(p, n);
    if (n >= TDD_POOL_LARGE)
        munmap(p, n);
    else
        free(p);
}

static void cpu_raw_trimmed(void *ctx)
{
    (void)ctx;
#ifdef __GLIBC__
    malloc_trim(0); /* the small blocks' pages back to the system too */
#endif
}

static void *shm_raw_alloc(void *ctx, size_t n)
{
    (void)ctx;
    return tdd_shm_alloc(n);
}

static void shm_raw_free(void *ctx, void *p, size_t n)
{
    (void)ctx;
    cpu_release_poison(p, n);
    tdd_shm_free(p, n);
}

static uint64_t cpu_memory_total(void *ctx, int ordinal)
{
    (void)ctx;
    (void)ordinal;
    long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
    return pages > 0 && psz > 0 ? (uint64_t)pages * (uint64_t)psz : 0;
}

static int cpu_init(const tdd_backend_config *cfg, void **ctx, char *why, size_t why_len)
{
    (void)why;
    (void)why_len;
    cpu_ctx *c = calloc(1, sizeof *c);
    if (!c)
        return TD_ERESOURCE_EXHAUSTED;
    c->ndev = cfg && cfg->cpu_devices > 0 ? cfg->cpu_devices : 1;
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    c->threads = cfg && cfg->threads > 0 ? cfg->threads : (cores > 0 ? (int)cores : 1);
    /* OpenBLAS single-threaded; cpu_gemm splits large GEMMs itself (see cpu_blas.c). Its
     * thread pool, started when the library loaded, is then never given work, but was seen
     * spinning after kernels (3-4 ms of CPU per op in some runs): stopped, where the
     * library exports the call (a pthread OpenBLAS; weak, so any OpenBLAS links). */
    openblas_set_num_threads(1);
    if (blas_thread_shutdown_)
        blas_thread_shutdown_();
    tdd_cpu_gemm_threads = c->threads;
    tdd_shm_max_blocks = cfg ? cfg->shm_blocks : 0;
    tdd_pool_config pc = tdd_pool_defaults;
    if (!pc.limit)
        pc.limit = cpu_memory_total(c, 0);
    tdd_pool_raw raw = {.alloc = cpu_raw_alloc, .free = cpu_raw_free, .trimmed = cpu_raw_trimmed};
    c->pool = tdd_pool_new(&raw, &pc);
    tdd_pool_raw shm_raw = {.alloc = shm_raw_alloc, .free = shm_raw_free};
    c->shm_pool = c->pool ? tdd_pool_new(&shm_raw, &pc) : NULL;
    if (!c->shm_pool) {
        tdd_pool_destroy(c->pool);
        free(c);
        return TD_ERESOURCE_EXHAUSTED;
    }
    *ctx = c;
    return c->ndev;
}

static void cpu_shutdown(void *ctx)
{
    cpu_ctx *c = ctx;
    tdd_pool_stats st;
    tdd_pool_stats shm;
    tdd_pool_get_stats(c->pool, &st);
    tdd_pool_get_stats(c->shm_pool, &shm);
    if (st.live || shm.live) { /* tensors outlive the devices (freed on the way out) */
        tdd_pool_trim(c->pool, 0);
        tdd_pool_trim(c->shm_pool, 0);
        return;
    }
    tdd_pool_destroy(c->pool);
    tdd_pool_destroy(c->shm_pool);
    free(ctx);
}

static void cpu_device_name(void *ctx, int ordinal, char *buf, size_t len)
{
    cpu_ctx *c = ctx;
    (void)ordinal;
    snprintf(buf, len, "CPU (OpenBLAS, %d threads)", c->threads);
}

/* Under AddressSanitizer a block in the pool is poisoned, and a block handed out is
 * poisoned past the bytes asked for: reuse does not hide a use after free or an overrun. */
static void *cpu_alloc(void *ctx, int ordinal, size_t nbytes)
{
    (void)ordinal;
    void *p = tdd_pool_alloc(((cpu_ctx *)ctx)->pool, nbytes);
    if (p) {
        CPU_UNPOISON(p, tdd_pool_block_size(nbytes));
        CPU_POISON((char *)p + nbytes, tdd_pool_block_size(nbytes) - nbytes);
    }
    return p;
}

/* Storage in a memfd (cpu_shm.h): a download as an fd then seals it instead of copying. */
static void *cpu_alloc_shared(void *ctx, int ordinal, size_t nbytes)
{
    (void)ordinal;
    if (nbytes < TDD_POOL_LARGE)
        return NULL;
    void *p = tdd_pool_alloc(((cpu_ctx *)ctx)->shm_pool, nbytes);
    if (p) {
        CPU_UNPOISON(p, tdd_pool_block_size(nbytes));
        CPU_POISON((char *)p + nbytes, tdd_pool_block_size(nbytes) - nbytes);
    }
    return p;
}

static void cpu_free(void *ctx, int ordinal, void *p, size_t nbytes)
{
    (void)ordinal;
    cpu_ctx *c = ctx;
    if (p)
        CPU_POISON(p, tdd_pool_block_size(nbytes));
    bool sealed = false;
    if (p && nbytes >= TDD_POOL_LARGE && tdd_shm_is_block(p, &sealed)) {
        if (sealed) /* its file is a client's now: never written again, never reused */
            tdd_pool_release(c->shm_pool, p, nbytes);
        else
            tdd_pool_free(c->shm_pool, p, nbytes);
        return;
    }
    tdd_pool_free(c->pool, p, nbytes);
}

static int cpu_execute(void *ctx, int ordinal, const tdd_opcall *c)
{
    cpu_ctx *cc = ctx;
    int nt = cc ? cc->threads : 1;
    if (c->op == TDD_OP_ADDMM || c->op == TDD_OP_BADDBMM) /* sgemm, then elementwise */
        return tdd_addmm_by_parts(c, cpu_execute, ctx, ordinal);
    if (c->op == TDD_OP_MAX || c->op == TDD_OP_MIN) /* amax/amin, then argmax/argmin */
        return tdd_max_by_parts(c, cpu_execute, ctx, ordinal);
    if (c->op == TDD_OP_CONV1D) /* conv2d's kernel on [N, C, 1, L] views */
        return tdd_conv1d_by_parts(c, cpu_execute, ctx, ordinal);
    (void)ordinal;
    if (!tdd_cpu_native(c))
        return tdd_ref_run(c);
    switch (tdd_opdefs[c->op].kind) {
    case TDD_KIND_BINARY:
    case TDD_KIND_UNARY:
    case TDD_KIND_ELEMENT:
        return cpu_ints_to_float(c) ? cpu_via_cast(c, nt, cpu_elementwise) : cpu_elementwise(c, nt);
    case TDD_KIND_REDUCE:
        if (c->op == TDD_OP_CUMSUM || c->op == TDD_OP_SOFTMAX || c->op == TDD_OP_LOG_SOFTMAX)
            return cpu_lines(c, nt);
        return cpu_ints_to_float(c) ? cpu_via_cast(c, nt, cpu_reduce) : cpu_reduce(c, nt);
    case TDD_KIND_LINALG:
        return cpu_is_half(c->in[0]->dtype) ? cpu_via_f32(c, nt, matmul_nt) : cpu_matmul(c);
    case TDD_KIND_VIEW:
        return cpu_copy(c, nt);
    case TDD_KIND_CREATE: /* arange, linspace, eye, randint: no fast kernel (not native) */
        return cpu_create(c, nt);
    case TDD_KIND_INDEX:
    case TDD_KIND_NN:
        break;
    }
    switch (c->op) {
    case TDD_OP_CLONE:
        return cpu_copy(c, nt);
    case TDD_OP_CAST:
        /* same-dtype casts too: ref round-trips floats through double/f32, which
         * rewrites NaN payloads (f16/bf16) that a byte copy would keep */
        return cpu_cast(c, nt);
    case TDD_OP_ONE_HOT:
        return cpu_one_hot(c, nt);
    case TDD_OP_CAT:
    case TDD_OP_STACK:
    case TDD_OP_TRIL:
    case TDD_OP_TRIU:
    case TDD_OP_PAD:
    case TDD_OP_DROPOUT:
        return cpu_index(c, nt);
    case TDD_OP_BATCH_NORM: /* in double from any float dtype: never via f32 copies */
        return cpu_batch_norm(c, nt);
    default: /* gather, scatter_add, index_select, embedding and the nn ops */
        return cpu_is_half(c->in[0]->dtype) ? cpu_via_f32(c, nt, cpu_nn) : cpu_nn(c, nt);
    }
}

const tdd_backend tdd_backend_cpu = {
    .name = "cpu",
    .host_memory = true,
    .init = cpu_init,
    .shutdown = cpu_shutdown,
    .device_name = cpu_device_name,
    .memory_total = cpu_memory_total,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .alloc_shared = cpu_alloc_shared,
    .execute = cpu_execute,
};
