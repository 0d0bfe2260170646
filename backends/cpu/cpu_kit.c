/* cpu_kit.c -- what the cpu backend's kernel files share: iterators split across the
 * backend's threads, strided loads and stores through double, and f16/bf16 <-> f32
 * conversions (F16C/AVX2 where the CPU has them). Below cpu.c's dispatch and the kernels
 * (cpu_*.c), which all call down to it. */
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "cpu.h"
#include "dtype.h"

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
