/* dtype.h -- element access in any dtype (f16/bf16 conversion, saturating
 * float->int stores) and the counter-based RNG that ref and cpu share, so a
 * seed gives the same numbers on both (and the conformance suite can compare
 * random ops). Host-memory backends only. */
#ifndef TDD_DTYPE_H
#define TDD_DTYPE_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "tensordd.h"

static inline float tdd_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
    float f;
    if (exp == 0) {
        f = (float)mant * 5.9604644775390625e-8f; /* subnormal: mant * 2^-24 */
        return sign ? -f : f;
    }
    uint32_t u = exp == 31 ? (sign | 0x7f800000u | (mant << 13))
                           : (sign | ((exp + 112u) << 23) | (mant << 13));
    memcpy(&f, &u, sizeof f);
    return f;
}

/* Round to nearest even, as every hardware conversion does. */
static inline uint16_t tdd_f32_to_f16(float f)
{
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    uint32_t sign = (x >> 16) & 0x8000u, ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u)
        return (uint16_t)(sign | 0x7c00u | (ax > 0x7f800000u ? 0x200u : 0u));
    if (ax >= 0x477ff000u) /* >= 65520 rounds to infinity */
        return (uint16_t)(sign | 0x7c00u);
    if (ax < 0x38800000u) { /* below 2^-14: subnormal; scaling by 2^24 is exact */
        float a;
        memcpy(&a, &ax, sizeof a);
        return (uint16_t)(sign | (uint32_t)lrintf(a * 16777216.0f));
    }
    uint32_t mant = ax & 0x7fffffu;
    uint32_t h = ((ax >> 23) - 112u) << 10 | (mant >> 13);
    uint32_t rem = mant & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u)))
        h++; /* a carry into the exponent is the correct result */
    return (uint16_t)(sign | h);
}

static inline float tdd_bf16_to_f32(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline uint16_t tdd_f32_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x40u); /* keep NaN a NaN */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static inline bool tdd_dtype_is_float(td_dtype dt)
{
    return dt == TD_F32 || dt == TD_F64 || dt == TD_F16 || dt == TD_BF16;
}

static inline bool tdd_dtype_is_int(td_dtype dt)
{
    return dt == TD_I32 || dt == TD_I64 || dt == TD_U8 || dt == TD_I8 || dt == TD_I16;
}

/* uint8, int8, int16: the small integers (most kernels take them through the reference). */
static inline bool tdd_dtype_is_small_int(td_dtype dt)
{
    return dt == TD_U8 || dt == TD_I8 || dt == TD_I16;
}

/* C leaves out-of-range float->int conversion undefined; we saturate (NaN -> 0). */
static inline int64_t tdd_sat_i64(double v)
{
    if (v != v)
        return 0;
    if (v >= 9223372036854775807.0)
        return INT64_MAX;
    if (v <= -9223372036854775808.0)
        return INT64_MIN;
    return (int64_t)v;
}

/* Element i (in elements from base) as double. */
static inline double tdd_load_f(const void *base, td_dtype dt, int64_t i)
{
    switch (dt) {
    case TD_F32:
        return ((const float *)base)[i];
    case TD_F64:
        return ((const double *)base)[i];
    case TD_F16:
        return tdd_f16_to_f32(((const uint16_t *)base)[i]);
    case TD_BF16:
        return tdd_bf16_to_f32(((const uint16_t *)base)[i]);
    case TD_I32:
        return ((const int32_t *)base)[i];
    case TD_I64:
        return (double)((const int64_t *)base)[i];
    case TD_BOOL:
        return ((const uint8_t *)base)[i] ? 1.0 : 0.0;
    case TD_U8:
        return ((const uint8_t *)base)[i];
    case TD_I8:
        return ((const int8_t *)base)[i];
    case TD_I16:
        return ((const int16_t *)base)[i];
    case TD_DTYPE_INVALID:
    case TD_DTYPE_COUNT:
        break;
    }
    return 0.0;
}

/* Element i as int64 (floats truncate toward zero, saturating). */
static inline int64_t tdd_load_i(const void *base, td_dtype dt, int64_t i)
{
    switch (dt) {
    case TD_I32:
        return ((const int32_t *)base)[i];
    case TD_I64:
        return ((const int64_t *)base)[i];
    case TD_BOOL:
        return ((const uint8_t *)base)[i] ? 1 : 0;
    case TD_U8:
        return ((const uint8_t *)base)[i];
    case TD_I8:
        return ((const int8_t *)base)[i];
    case TD_I16:
        return ((const int16_t *)base)[i];
    case TD_F32:
    case TD_F64:
    case TD_F16:
    case TD_BF16:
        return tdd_sat_i64(tdd_load_f(base, dt, i));
    case TD_DTYPE_INVALID:
    case TD_DTYPE_COUNT:
        break;
    }
    return 0;
}

static inline void tdd_store_i(void *base, td_dtype dt, int64_t i, int64_t v);

static inline void tdd_store_f(void *base, td_dtype dt, int64_t i, double v)
{
    switch (dt) {
    case TD_F32:
        ((float *)base)[i] = (float)v;
        return;
    case TD_F64:
        ((double *)base)[i] = v;
        return;
    case TD_F16:
        ((uint16_t *)base)[i] = tdd_f32_to_f16((float)v);
        return;
    case TD_BF16:
        ((uint16_t *)base)[i] = tdd_f32_to_bf16((float)v);
        return;
    case TD_BOOL:
        ((uint8_t *)base)[i] = v != 0.0;
        return;
    case TD_I32:
    case TD_I64:
    case TD_U8:
    case TD_I8:
    case TD_I16:
        tdd_store_i(base, dt, i, tdd_sat_i64(v));
        return;
    case TD_DTYPE_INVALID:
    case TD_DTYPE_COUNT:
        break;
    }
}

static inline void tdd_store_i(void *base, td_dtype dt, int64_t i, int64_t v)
{
    switch (dt) {
    case TD_I32:
        ((int32_t *)base)[i] = (int32_t)(uint32_t)(uint64_t)v; /* wraps, like a C cast */
        return;
    case TD_I64:
        ((int64_t *)base)[i] = v;
        return;
    case TD_BOOL:
        ((uint8_t *)base)[i] = v != 0;
        return;
    case TD_U8: /* the narrow integers wrap, like a C cast of the int64 */
        ((uint8_t *)base)[i] = (uint8_t)(uint64_t)v;
        return;
    case TD_I8:
        ((int8_t *)base)[i] = (int8_t)(uint8_t)(uint64_t)v;
        return;
    case TD_I16:
        ((int16_t *)base)[i] = (int16_t)(uint16_t)(uint64_t)v;
        return;
    case TD_F32:
    case TD_F64:
    case TD_F16:
    case TD_BF16:
        tdd_store_f(base, dt, i, (double)v);
        return;
    case TD_DTYPE_INVALID:
    case TD_DTYPE_COUNT:
        break;
    }
}

/* Counter-based RNG: value i of stream seed depends on nothing else, so any
 * thread split (and either backend) produces the same tensor. splitmix64's
 * finaliser over a Weyl sequence. */
static inline uint64_t tdd_rng_u64(uint64_t seed, uint64_t i)
{
    uint64_t z = seed * 0xd1342543de82ef95u + (i + 1) * 0x9e3779b97f4a7c15u;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9u;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebu;
    z ^= z >> 31;
    /* a second round, so seeds differing in one bit decorrelate */
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9u;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebu;
    return z ^ (z >> 31);
}

/* Uniform in [0, 1) with 53 bits; tdd_rng_uniform24 has 24 bits, so a float cast
 * never rounds up to 1. */
static inline double tdd_rng_uniform(uint64_t seed, uint64_t i)
{
    return (double)(tdd_rng_u64(seed, i) >> 11) * 0x1.0p-53;
}

static inline double tdd_rng_uniform24(uint64_t seed, uint64_t i)
{
    return (double)(tdd_rng_u64(seed, i) >> 40) * 0x1.0p-24;
}

/* Standard normal (Box-Muller over draws 2i and 2i+1). */
static inline double tdd_rng_normal(uint64_t seed, uint64_t i)
{
    double u1 = tdd_rng_uniform(seed, 2 * i), u2 = tdd_rng_uniform(seed, 2 * i + 1);
    return sqrt(-2.0 * log(1.0 - u1)) * cos(6.283185307179586 * u2);
}

#endif
