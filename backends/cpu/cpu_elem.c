/* cpu_elem.c -- threaded, vectorisable elementwise kernels (f32/f64, integers,
 * bool; f16/bf16 through the f32 ones in blocks), copies and fills. Every kernel
 * is a run function for the strided iterator: it gets one run of the innermost
 * dimension with per-operand strides, and keeps a unit-stride (and a
 * broadcast-scalar) path the compiler vectorises. */
#include <stdint.h>
#include <string.h>
#include <tgmath.h>

#include "cpu.h"
#include "dtype.h"

typedef struct {
    char *y;
    const char *a, *b, *c;
    const tdd_opargs *g;
    double s[2];  /* float unary parameters */
    int64_t n[2]; /* integer kernels: alpha; clamp's bounds */
    uint64_t pat; /* masked_fill's value as the output dtype's bits */
} ew_ctx;

/* Binary: EXPR in x (from a) and z (from b), output type OT. */
#define BIN_FN(NAME, T, OT, EXPR)                                                                  \
    static void NAME(void *vc, int64_t n, const int64_t *off, const int64_t *st)                   \
    {                                                                                              \
        const ew_ctx *c = vc;                                                                      \
        OT *restrict y = (OT *)(void *)c->y + off[0];                                              \
        const T *restrict a = (const T *)(const void *)c->a + off[1];                              \
        const T *restrict b = (const T *)(const void *)c->b + off[2];                              \
        const T alpha = (T)c->g->f[1];                                                             \
        (void)alpha;                                                                               \
        if (st[0] == 1 && st[1] == 1 && st[2] == 1) {                                              \
            _Pragma("omp simd") for (int64_t i = 0; i < n; i++)                                    \
            {                                                                                      \
                const T x = a[i], z = b[i];                                                        \
                y[i] = (OT)(EXPR);                                                                 \
            }                                                                                      \
        } else if (st[0] == 1 && st[1] == 1 && st[2] == 0) {                                       \
            const T z = b[0];                                                                      \
            _Pragma("omp simd") for (int64_t i = 0; i < n; i++)                                    \
            {                                                                                      \
                const T x = a[i];                                                                  \
                y[i] = (OT)(EXPR);                                                                 \
            }                                                                                      \
        } else if (st[0] == 1 && st[1] == 0 && st[2] == 1) {                                       \
            const T x = a[0];                                                                      \
            _Pragma("omp simd") for (int64_t i = 0; i < n; i++)                                    \
            {                                                                                      \
                const T z = b[i];                                                                  \
                y[i] = (OT)(EXPR);                                                                 \
            }                                                                                      \
        } else {                                                                                   \
            for (int64_t i = 0; i < n; i++) {                                                      \
                const T x = a[i * st[1]], z = b[i * st[2]];                                        \
                y[i * st[0]] = (OT)(EXPR);                                                         \
            }                                                                                      \
        }                                                                                          \
    }

/* Unary: EXPR in x, output type OT; p0, p1 are the op's parameters. */
#define UN_FNO(NAME, T, OT, EXPR)                                                                  \
    static void NAME(void *vc, int64_t n, const int64_t *off, const int64_t *st)                   \
    {                                                                                              \
        const ew_ctx *c = vc;                                                                      \
        OT *restrict y = (OT *)(void *)c->y + off[0];                                              \
        const T *restrict a = (const T *)(const void *)c->a + off[1];                              \
        const T p0 = (T)c->s[0], p1 = (T)c->s[1];                                                  \
        (void)p0;                                                                                  \
        (void)p1;                                                                                  \
        if (st[0] == 1 && st[1] == 1) {                                                            \
            _Pragma("omp simd") for (int64_t i = 0; i < n; i++)                                    \
            {                                                                                      \
                const T x = a[i];                                                                  \
                y[i] = (OT)(EXPR);                                                                 \
            }                                                                                      \
        } else {                                                                                   \
            for (int64_t i = 0; i < n; i++) {                                                      \
                const T x = a[i * st[1]];                                                          \
                y[i * st[0]] = (OT)(EXPR);                                                         \
            }                                                                                      \
        }                                                                                          \
    }
#define UN_FN(NAME, T, EXPR) UN_FNO(NAME, T, T, EXPR)

/* PyTorch's clamp, min(max(x, lo), hi): lo > hi gives hi, a NaN input or bound gives NaN
 * (absent bounds are -inf and +inf). */
#define CLAMP_F(v, b, CMP) ((v CMP b || b != b) ? b : v)

/* One instance per compute type. */
#define ELEM_FNS(T, S)                                                                             \
    BIN_FN(add_##S, T, T, x + alpha * z)                                                           \
    BIN_FN(sub_##S, T, T, x - alpha * z)                                                           \
    BIN_FN(mul_##S, T, T, x *z)                                                                    \
    BIN_FN(div_##S, T, T, x / z)                                                                   \
    BIN_FN(pow_##S, T, T, pow(x, z))                                                               \
    BIN_FN(max_##S, T, T, (x != x || z != z) ? (T)NAN : (x > z ? x : z))                           \
    BIN_FN(min_##S, T, T, (x != x || z != z) ? (T)NAN : (x < z ? x : z))                           \
    BIN_FN(rem_##S, T, T,                                                                          \
           fmod(x, z) + ((fmod(x, z) != 0 && ((fmod(x, z) < 0) != (z < 0))) ? z : 0))              \
    BIN_FN(eq_##S, T, uint8_t, x == z)                                                             \
    BIN_FN(ne_##S, T, uint8_t, x != z)                                                             \
    BIN_FN(lt_##S, T, uint8_t, x < z)                                                              \
    BIN_FN(le_##S, T, uint8_t, x <= z)                                                             \
    BIN_FN(gt_##S, T, uint8_t, x > z)                                                              \
    BIN_FN(ge_##S, T, uint8_t, x >= z)                                                             \
    BIN_FN(relub_##S, T, T, z > 0 ? x : (T)0)                                                      \
    BIN_FN(land_##S, T, uint8_t, x != 0 && z != 0)                                                 \
    BIN_FN(lor_##S, T, uint8_t, x != 0 || z != 0)                                                  \
    BIN_FN(lxor_##S, T, uint8_t, (x != 0) != (z != 0))                                             \
    UN_FNO(lnot_##S, T, uint8_t, x == 0)                                                           \
    UN_FN(neg_##S, T, -x)                                                                          \
    UN_FN(abs_##S, T, fabs(x))                                                                     \
    UN_FN(sign_##S, T, x > 0 ? (T)1 : x < 0 ? (T)-1 : x * (T)0)                                    \
    UN_FN(exp_##S, T, exp(x))                                                                      \
    UN_FN(log_##S, T, log(x))                                                                      \
    UN_FN(log1p_##S, T, log1p(x))                                                                  \
    UN_FN(expm1_##S, T, expm1(x))                                                                  \
    UN_FN(sqrt_##S, T, sqrt(x))                                                                    \
    UN_FN(rsqrt_##S, T, (T)1 / sqrt(x))                                                            \
    UN_FN(sin_##S, T, sin(x))                                                                      \
    UN_FN(cos_##S, T, cos(x))                                                                      \
    UN_FN(tanh_##S, T, tanh(x))                                                                    \
    UN_FN(sigmoid_##S, T, (T)1 / ((T)1 + exp(-x)))                                                 \
    UN_FN(relu_##S, T, x < 0 ? (T)0 : x)                                                           \
    UN_FN(lrelu_##S, T, x > 0 ? x : x * p0)                                                        \
    UN_FN(gelu_##S, T, (T)0.5 * x * ((T)1 + erf(x * (T)0.7071067811865476)))                       \
    UN_FN(gelut_##S, T,                                                                            \
          (T)0.5 * x * ((T)1 + tanh((T)0.7978845608028654 * (x + (T)0.044715 * x * x * x))))       \
    UN_FN(silu_##S, T, x / ((T)1 + exp(-x)))                                                       \
    UN_FN(softplus_##S, T, x *p0 > p1 ? x : log1p(exp(x * p0)) / p0)                               \
    UN_FN(clamp_##S, T, CLAMP_F(CLAMP_F(x, p0, <), p1, >))                                         \
    UN_FN(floor_##S, T, floor(x))                                                                  \
    UN_FN(ceil_##S, T, ceil(x))                                                                    \
    UN_FN(round_##S, T, nearbyint(x))                                                              \
    UN_FN(recip_##S, T, (T)1 / x)                                                                  \
    UN_FN(square_##S, T, x *x)                                                                     \
    static tdd_iter_fn elem_fn_##S(const tdd_opcall *c)                                            \
    {                                                                                              \
        switch (c->op) {                                                                           \
        case TDD_OP_ADD:                                                                           \
            return add_##S;                                                                        \
        case TDD_OP_SUB:                                                                           \
            return sub_##S;                                                                        \
        case TDD_OP_MUL:                                                                           \
            return mul_##S;                                                                        \
        case TDD_OP_DIV:                                                                           \
            return div_##S;                                                                        \
        case TDD_OP_POW:                                                                           \
            return pow_##S;                                                                        \
        case TDD_OP_MAXIMUM:                                                                       \
            return max_##S;                                                                        \
        case TDD_OP_MINIMUM:                                                                       \
            return min_##S;                                                                        \
        case TDD_OP_REMAINDER:                                                                     \
            return rem_##S;                                                                        \
        case TDD_OP_EQ:                                                                            \
            return eq_##S;                                                                         \
        case TDD_OP_NE:                                                                            \
            return ne_##S;                                                                         \
        case TDD_OP_LT:                                                                            \
            return lt_##S;                                                                         \
        case TDD_OP_LE:                                                                            \
            return le_##S;                                                                         \
        case TDD_OP_GT:                                                                            \
            return gt_##S;                                                                         \
        case TDD_OP_GE:                                                                            \
            return ge_##S;                                                                         \
        case TDD_OP_RELU_BACKWARD:                                                                 \
            return relub_##S;                                                                      \
        case TDD_OP_LOGICAL_AND:                                                                   \
            return land_##S;                                                                       \
        case TDD_OP_LOGICAL_OR:                                                                    \
            return lor_##S;                                                                        \
        case TDD_OP_LOGICAL_XOR:                                                                   \
            return lxor_##S;                                                                       \
        case TDD_OP_LOGICAL_NOT:                                                                   \
            return lnot_##S;                                                                       \
        case TDD_OP_NEG:                                                                           \
            return neg_##S;                                                                        \
        case TDD_OP_ABS:                                                                           \
            return abs_##S;                                                                        \
        case TDD_OP_SIGN:                                                                          \
            return sign_##S;                                                                       \
        case TDD_OP_EXP:                                                                           \
            return exp_##S;                                                                        \
        case TDD_OP_LOG:                                                                           \
            return log_##S;                                                                        \
        case TDD_OP_LOG1P:                                                                         \
            return log1p_##S;                                                                      \
        case TDD_OP_EXPM1:                                                                         \
            return expm1_##S;                                                                      \
        case TDD_OP_SQRT:                                                                          \
            return sqrt_##S;                                                                       \
        case TDD_OP_RSQRT:                                                                         \
            return rsqrt_##S;                                                                      \
        case TDD_OP_SIN:                                                                           \
            return sin_##S;                                                                        \
        case TDD_OP_COS:                                                                           \
            return cos_##S;                                                                        \
        case TDD_OP_TANH:                                                                          \
            return tanh_##S;                                                                       \
        case TDD_OP_SIGMOID:                                                                       \
            return sigmoid_##S;                                                                    \
        case TDD_OP_RELU:                                                                          \
            return relu_##S;                                                                       \
        case TDD_OP_LEAKY_RELU:                                                                    \
            return lrelu_##S;                                                                      \
        case TDD_OP_GELU:                                                                          \
            return c->args->i[0] ? gelut_##S : gelu_##S;                                           \
        case TDD_OP_SILU:                                                                          \
            return silu_##S;                                                                       \
        case TDD_OP_SOFTPLUS:                                                                      \
            return softplus_##S;                                                                   \
        case TDD_OP_CLAMP:                                                                         \
            return clamp_##S;                                                                      \
        case TDD_OP_FLOOR:                                                                         \
            return floor_##S;                                                                      \
        case TDD_OP_CEIL:                                                                          \
            return ceil_##S;                                                                       \
        case TDD_OP_ROUND:                                                                         \
            return round_##S;                                                                      \
        case TDD_OP_RECIPROCAL:                                                                    \
            return recip_##S;                                                                      \
        case TDD_OP_SQUARE:                                                                        \
            return square_##S;                                                                     \
        default:                                                                                   \
            return NULL; /* tdd_cpu_native keeps other ops away */                                 \
        }                                                                                          \
    }

ELEM_FNS(float, f32)
ELEM_FNS(double, f64)

/* Integer and bool kernels: arithmetic in the unsigned type U wraps like the
 * hardware (and the reference's int64 math truncated to the dtype) without C's
 * signed-overflow UB; comparisons stay signed. CVT narrows a U result to T
 * (bool: nonzero is true). */
#define IBIN_FN(NAME, T, U, OT, EXPR)                                                              \
    static void NAME(void *vc, int64_t n, const int64_t *off, const int64_t *st)                   \
    {                                                                                              \
        const ew_ctx *c = vc;                                                                      \
        OT *restrict y = (OT *)(void *)c->y + off[0];                                              \
        const T *restrict a = (const T *)(const void *)c->a + off[1];                              \
        const T *restrict b = (const T *)(const void *)c->b + off[2];                              \
        const U alpha = (U)(uint64_t)c->n[0];                                                      \
        (void)alpha;                                                                               \
        if (st[0] == 1 && st[1] == 1 && st[2] == 1) {                                              \
            _Pragma("omp simd") for (int64_t i = 0; i < n; i++)                                    \
            {                                                                                      \
                const T x = a[i], z = b[i];                                                        \
                y[i] = EXPR;                                                                       \
            }                                                                                      \
        } else if (st[0] == 1 && st[1] == 1 && st[2] == 0) {                                       \
            const T z = b[0];                                                                      \
            _Pragma("omp simd") for (int64_t i = 0; i < n; i++)                                    \
            {                                                                                      \
                const T x = a[i];                                                                  \
                y[i] = EXPR;                                                                       \
            }                                                                                      \
        } else {                                                                                   \
            for (int64_t i = 0; i < n; i++) {                                                      \
                const T x = a[i * st[1]], z = b[i * st[2]];                                        \
                y[i * st[0]] = EXPR;                                                               \
            }                                                                                      \
        }                                                                                          \
    }

#define IUN_FN(NAME, T, U, OT, EXPR)                                                               \
    static void NAME(void *vc, int64_t n, const int64_t *off, const int64_t *st)                   \
    {                                                                                              \
        const ew_ctx *c = vc;                                                                      \
        OT *restrict y = (OT *)(void *)c->y + off[0];                                              \
        const T *restrict a = (const T *)(const void *)c->a + off[1];                              \
        const int64_t lo = c->n[0], hi = c->n[1];                                                  \
        (void)lo;                                                                                  \
        (void)hi;                                                                                  \
        if (st[0] == 1 && st[1] == 1) {                                                            \
            _Pragma("omp simd") for (int64_t i = 0; i < n; i++)                                    \
            {                                                                                      \
                const T x = a[i];                                                                  \
                y[i] = EXPR;                                                                       \
            }                                                                                      \
        } else {                                                                                   \
            for (int64_t i = 0; i < n; i++) {                                                      \
                const T x = a[i * st[1]];                                                          \
                y[i * st[0]] = EXPR;                                                               \
            }                                                                                      \
        }                                                                                          \
    }

#define INT_FNS(T, U, S, CVT)                                                                      \
    IBIN_FN(add_##S, T, U, T, CVT((U)x + alpha * (U)z))                                            \
    IBIN_FN(sub_##S, T, U, T, CVT((U)x - alpha * (U)z))                                            \
    IBIN_FN(mul_##S, T, U, T, CVT((U)x *(U)z))                                                     \
    IBIN_FN(max_##S, T, U, T, x > z ? x : z)                                                       \
    IBIN_FN(min_##S, T, U, T, x < z ? x : z)                                                       \
    IBIN_FN(eq_##S, T, U, uint8_t, (uint8_t)(x == z))                                              \
    IBIN_FN(ne_##S, T, U, uint8_t, (uint8_t)(x != z))                                              \
    IBIN_FN(lt_##S, T, U, uint8_t, (uint8_t)(x < z))                                               \
    IBIN_FN(le_##S, T, U, uint8_t, (uint8_t)(x <= z))                                              \
    IBIN_FN(gt_##S, T, U, uint8_t, (uint8_t)(x > z))                                               \
    IBIN_FN(ge_##S, T, U, uint8_t, (uint8_t)(x >= z))                                              \
    IBIN_FN(land_##S, T, U, uint8_t, (uint8_t)(x != 0 && z != 0))                                  \
    IBIN_FN(lor_##S, T, U, uint8_t, (uint8_t)(x != 0 || z != 0))                                   \
    IBIN_FN(lxor_##S, T, U, uint8_t, (uint8_t)((x != 0) != (z != 0)))                              \
    IBIN_FN(relub_##S, T, U, T, z > 0 ? x : (T)0)                                                  \
    IUN_FN(lnot_##S, T, U, uint8_t, (uint8_t)(x == 0))                                             \
    static tdd_iter_fn int_fn_##S(tdd_op op)                                                       \
    {                                                                                              \
        switch (op) {                                                                              \
        case TDD_OP_ADD:                                                                           \
            return add_##S;                                                                        \
        case TDD_OP_SUB:                                                                           \
            return sub_##S;                                                                        \
        case TDD_OP_MUL:                                                                           \
            return mul_##S;                                                                        \
        case TDD_OP_MAXIMUM:                                                                       \
            return max_##S;                                                                        \
        case TDD_OP_MINIMUM:                                                                       \
            return min_##S;                                                                        \
        case TDD_OP_EQ:                                                                            \
            return eq_##S;                                                                         \
        case TDD_OP_NE:                                                                            \
            return ne_##S;                                                                         \
        case TDD_OP_LT:                                                                            \
            return lt_##S;                                                                         \
        case TDD_OP_LE:                                                                            \
            return le_##S;                                                                         \
        case TDD_OP_GT:                                                                            \
            return gt_##S;                                                                         \
        case TDD_OP_GE:                                                                            \
            return ge_##S;                                                                         \
        case TDD_OP_LOGICAL_AND:                                                                   \
            return land_##S;                                                                       \
        case TDD_OP_LOGICAL_OR:                                                                    \
            return lor_##S;                                                                        \
        case TDD_OP_LOGICAL_XOR:                                                                   \
            return lxor_##S;                                                                       \
        case TDD_OP_RELU_BACKWARD:                                                                 \
            return relub_##S;                                                                      \
        case TDD_OP_LOGICAL_NOT:                                                                   \
            return lnot_##S;                                                                       \
        default:                                                                                   \
            return NULL;                                                                           \
        }                                                                                          \
    }

/* Unary ops of signed integers (bool rejects them). */
#define SINT_FNS(T, U, S, CVT)                                                                     \
    IUN_FN(neg_##S, T, U, T, CVT((U)0 - (U)x))                                                     \
    IUN_FN(abs_##S, T, U, T, x < 0 ? CVT((U)0 - (U)x) : x)                                         \
    IUN_FN(sign_##S, T, U, T, (T)((x > 0) - (x < 0)))                                              \
    IUN_FN(relu_##S, T, U, T, x < 0 ? (T)0 : x)                                                    \
    IUN_FN(square_##S, T, U, T, CVT((U)x *(U)x))                                                   \
    IUN_FN(clamp_##S, T, U, T,                                                                     \
           CVT((U)(uint64_t)((int64_t)x < lo   ? (lo > hi ? hi : lo)                               \
                             : (int64_t)x > hi ? hi                                                \
                                               : x)))                                              \
    IUN_FN(ident_##S, T, U, T, x)                                                                  \
    static tdd_iter_fn sint_fn_##S(tdd_op op)                                                      \
    {                                                                                              \
        switch (op) {                                                                              \
        case TDD_OP_NEG:                                                                           \
            return neg_##S;                                                                        \
        case TDD_OP_ABS:                                                                           \
            return abs_##S;                                                                        \
        case TDD_OP_SIGN:                                                                          \
            return sign_##S;                                                                       \
        case TDD_OP_RELU:                                                                          \
            return relu_##S;                                                                       \
        case TDD_OP_SQUARE:                                                                        \
            return square_##S;                                                                     \
        case TDD_OP_CLAMP:                                                                         \
            return clamp_##S;                                                                      \
        case TDD_OP_FLOOR:                                                                         \
        case TDD_OP_CEIL:                                                                          \
        case TDD_OP_ROUND:                                                                         \
            return ident_##S;                                                                      \
        default:                                                                                   \
            return int_fn_##S(op);                                                                 \
        }                                                                                          \
    }

#define CVT_I32(v) ((int32_t)(v))
#define CVT_I64(v) ((int64_t)(v))
#define CVT_BOOL(v) ((uint8_t)((v) != 0))
INT_FNS(int32_t, uint32_t, i32, CVT_I32)
INT_FNS(int64_t, uint64_t, i64, CVT_I64)
INT_FNS(uint8_t, uint64_t, b8, CVT_BOOL)
SINT_FNS(int32_t, uint32_t, i32, CVT_I32)
SINT_FNS(int64_t, uint64_t, i64, CVT_I64)

/* where and masked_fill select elements without arithmetic, so one kernel per
 * element size serves every dtype. */
#define WHERE_FN(NAME, T)                                                                          \
    static void NAME(void *vc, int64_t n, const int64_t *off, const int64_t *st)                   \
    {                                                                                              \
        const ew_ctx *c = vc;                                                                      \
        T *restrict y = (T *)(void *)c->y + off[0];                                                \
        const uint8_t *restrict m = (const uint8_t *)c->a + off[1];                                \
        const T *restrict a = (const T *)(const void *)c->b + off[2];                              \
        const T *restrict b = (const T *)(const void *)c->c + off[3];                              \
        if (st[0] == 1 && st[1] == 1 && st[2] == 1 && st[3] == 1) {                                \
            _Pragma("omp simd") for (int64_t i = 0; i < n; i++) y[i] = m[i] ? a[i] : b[i];         \
        } else {                                                                                   \
            for (int64_t i = 0; i < n; i++)                                                        \
                y[i * st[0]] = m[i * st[1]] ? a[i * st[2]] : b[i * st[3]];                         \
        }                                                                                          \
    }
WHERE_FN(where_u8, uint8_t)
WHERE_FN(where_u16, uint16_t)
WHERE_FN(where_u32, uint32_t)
WHERE_FN(where_u64, uint64_t)

/* masked_fill: y = mask ? value : x (operands y, x, mask); value is the fill's bits. */
#define FILL_FN(NAME, T)                                                                           \
    static void NAME(void *vc, int64_t n, const int64_t *off, const int64_t *st)                   \
    {                                                                                              \
        const ew_ctx *c = vc;                                                                      \
        T *restrict y = (T *)(void *)c->y + off[0];                                                \
        const T *restrict a = (const T *)(const void *)c->a + off[1];                              \
        const uint8_t *restrict m = (const uint8_t *)c->b + off[2];                                \
        T v;                                                                                       \
        memcpy(&v, &c->pat, sizeof v);                                                             \
        if (st[0] == 1 && st[1] == 1 && st[2] == 1) {                                              \
            _Pragma("omp simd") for (int64_t i = 0; i < n; i++) y[i] = m[i] ? v : a[i];            \
        } else {                                                                                   \
            for (int64_t i = 0; i < n; i++)                                                        \
                y[i * st[0]] = m[i * st[2]] ? v : a[i * st[1]];                                    \
        }                                                                                          \
    }
FILL_FN(mfill_u8, uint8_t)
FILL_FN(mfill_u16, uint16_t)
FILL_FN(mfill_u32, uint32_t)
FILL_FN(mfill_u64, uint64_t)

/* The kernel for c's op in compute dtype ct (NULL: none). */
static tdd_iter_fn elem_fn(const tdd_opcall *c, td_dtype ct)
{
    size_t esz = td_dtype_size(c->out[0]->dtype);
    if (c->op == TDD_OP_WHERE)
        return esz == 1 ? where_u8 : esz == 2 ? where_u16 : esz == 4 ? where_u32 : where_u64;
    if (c->op == TDD_OP_MASKED_FILL)
        return esz == 1 ? mfill_u8 : esz == 2 ? mfill_u16 : esz == 4 ? mfill_u32 : mfill_u64;
    switch (ct) {
    case TD_F32:
        return elem_fn_f32(c);
    case TD_F64:
        return elem_fn_f64(c);
    case TD_I32:
        return sint_fn_i32(c->op);
    case TD_I64:
        return sint_fn_i64(c->op);
    case TD_BOOL:
        return int_fn_b8(c->op);
    default:
        return NULL;
    }
}

/* f16/bf16 operands run the f32 kernels a block at a time: half inputs are
 * widened into this thread's f32 buffers, the kernel sees them at unit stride (a
 * broadcast operand keeps stride 0 and is widened once), and a half output is
 * rounded back once from f32. f32 inputs and a bool output pass through. Binary
 * ops, relu_backward and unary ops have at most three operands. */
#define HALF_OPS 3

typedef struct {
    tdd_iter_fn f32fn;
    ew_ctx x; /* the f32 kernel's context; operand pointers are set per block */
    int nops;
    td_dtype dt[HALF_OPS];    /* operand k's storage dtype (0 is the output) */
    char *y;                  /* the output's data */
    const char *in[HALF_OPS]; /* inputs' data (in[0] unused) */
} half_ew;

static _Thread_local float half_buf[HALF_OPS][CPU_HALF_BLOCK];

static void ew_input(ew_ctx *x, int k, const char *p)
{
    if (k == 1)
        x->a = p;
    else
        x->b = p;
}

static void half_run(void *vc, int64_t n, const int64_t *off, const int64_t *st)
{
    const half_ew *h = vc;
    float(*buf)[CPU_HALF_BLOCK] = half_buf;
    for (int64_t i0 = 0; i0 < n; i0 += CPU_HALF_BLOCK) {
        int64_t m = n - i0 < CPU_HALF_BLOCK ? n - i0 : CPU_HALF_BLOCK;
        ew_ctx x = h->x;
        int64_t boff[HALF_OPS], bst[HALF_OPS];
        bool yh = cpu_is_half(h->dt[0]);
        x.y = yh ? (char *)buf[0] : h->y;
        boff[0] = yh ? 0 : off[0] + i0 * st[0];
        bst[0] = yh ? 1 : st[0];
        for (int k = 1; k < h->nops; k++) {
            int64_t o = off[k] + i0 * st[k];
            if (!cpu_is_half(h->dt[k])) {
                ew_input(&x, k, h->in[k]);
                boff[k] = o;
                bst[k] = st[k];
                continue;
            }
            ew_input(&x, k, (const char *)buf[k]);
            boff[k] = 0;
            bst[k] = st[k] != 0;
            cpu_half_to_f32((const uint16_t *)(const void *)h->in[k] + o, st[k], buf[k], 1,
                            st[k] ? m : 1, h->dt[k]);
        }
        h->f32fn(&x, m, boff, bst);
        if (yh)
            cpu_f32_to_half(buf[0], 1, (uint16_t *)(void *)h->y + off[0] + i0 * st[0], st[0], m,
                            h->dt[0]);
    }
}

int cpu_elementwise(const tdd_opcall *c, int nt)
{
    const tdd_opargs *g = c->args;
    tdd_tensor *y = c->out[0];
    td_dtype ct = g->cdtype;
    bool fl = tdd_dtype_is_float(ct);
    ew_ctx x = {.y = y->st->data, .g = g};
    const tdd_tensor *ops[4] = {y};
    int nops = 1 + c->n_in;
    tdd_iter it;
    tdd_tensor scalar; /* the scalar form's "other" as a 0-dim operand */
    uint64_t spat = 0; /* its value in the compute dtype */
    bool half = false; /* some operand is f16/bf16: the f32 kernel on converted blocks */
    for (int i = 0; i < c->n_in; i++)
        ops[1 + i] = c->in[i];
    if (c->op != TDD_OP_WHERE && c->op != TDD_OP_MASKED_FILL) /* these only move bits */
        for (int k = 0; k < nops; k++)
            half = half || cpu_is_half(ops[k]->dtype);
    tdd_iter_fn fn = elem_fn(c, half ? TD_F32 : ct);
    x.n[0] = g->n[1]; /* alpha */
    if (c->op == TDD_OP_MASKED_FILL) {
        if (tdd_dtype_is_float(y->dtype))
            tdd_store_f(&x.pat, y->dtype, 0, g->f[0]);
        else
            tdd_store_i(&x.pat, y->dtype, 0, g->n[0]);
    } else if (tdd_opdefs[c->op].kind == TDD_KIND_UNARY) {
        x.s[0] = g->f[0];
        x.s[1] = g->f[1];
        if (c->op == TDD_OP_CLAMP) {
            x.s[0] = (g->flags & 1u) ? g->f[0] : -INFINITY;
            x.s[1] = (g->flags & 2u) ? g->f[1] : INFINITY;
            x.n[0] = (g->flags & 1u) ? g->n[0] : INT64_MIN;
            x.n[1] = (g->flags & 2u) ? g->n[1] : INT64_MAX;
        }
    } else if (g->scalar_form) {
        if (fl)
            tdd_store_f(&spat, ct, 0, g->f[0]);
        else
            tdd_store_i(&spat, ct, 0, g->n[0]);
        memset(&scalar, 0, sizeof scalar);
        scalar.dtype = ct;
        ops[nops++] = &scalar;
    }
    if (!fn)
        return TD_EINTERNAL;
    tdd_iter_tensors(&it, y->shape, y->ndim, nops, ops);
    x.a = nops > 1 ? ops[1]->st ? ops[1]->st->data : NULL : NULL;
    x.b = nops > 2 ? (ops[2] == &scalar ? (const char *)&spat : ops[2]->st->data) : NULL;
    x.c = nops > 3 ? ops[3]->st->data : NULL;
    if (!half) {
        cpu_par_iter(&it, fn, &x, nt);
        return 0;
    }
    if (nops > HALF_OPS)
        return TD_EINTERNAL; /* tdd_cpu_native sends no such call */
    /* The reference rounds alpha to the compute dtype, as it does the operands. */
    tdd_opargs ga = *g;
    if (cpu_is_half(ct)) {
        uint16_t a16;
        tdd_store_f(&a16, ct, 0, g->f[1]);
        ga.f[1] = tdd_load_f(&a16, ct, 0);
    }
    x.g = &ga;
    half_ew h = {.f32fn = fn, .x = x, .nops = nops, .y = x.y, .in = {NULL, x.a, x.b}};
    for (int k = 0; k < nops; k++)
        h.dt[k] = ops[k]->dtype;
    cpu_par_iter(&it, half_run, &h, nt);
    return 0;
}

/* ---------------------------------------------------------------- copies */

typedef struct {
    char *y;
    const char *a;
    size_t esz;
    td_dtype from, to;
} cp_ctx;

static void copy_run(void *vc, int64_t n, const int64_t *off, const int64_t *st)
{
    const cp_ctx *c = vc;
    char *y = c->y + (size_t)off[0] * c->esz;
    const char *a = c->a + (size_t)off[1] * c->esz;
    if (st[0] == 1 && st[1] == 1) {
        memcpy(y, a, (size_t)n * c->esz);
        return;
    }
    for (int64_t i = 0; i < n; i++)
        memcpy(y + (size_t)(i * st[0]) * c->esz, a + (size_t)(i * st[1]) * c->esz, c->esz);
}

static void f32_to_f64_run(void *vc, int64_t n, const int64_t *off, const int64_t *st)
{
    const cp_ctx *c = vc;
    double *y = (double *)(void *)c->y + off[0];
    const float *a = (const float *)(const void *)c->a + off[1];
    for (int64_t i = 0; i < n; i++)
        y[i * st[0]] = a[i * st[1]];
}

static void f64_to_f32_run(void *vc, int64_t n, const int64_t *off, const int64_t *st)
{
    const cp_ctx *c = vc;
    float *y = (float *)(void *)c->y + off[0];
    const double *a = (const double *)(const void *)c->a + off[1];
    for (int64_t i = 0; i < n; i++)
        y[i * st[0]] = (float)a[i * st[1]];
}

int cpu_copy(const tdd_opcall *c, int nt)
{
    if (c->args->out_view)
        return 0; /* the daemon made the output a view: nothing to compute */
    const tdd_tensor *a = c->in[0];
    tdd_tensor *y = c->out[0];
    /* Reshape copies keep C order, so walk both as flat sequences of their own shapes:
     * iterate y's shape with a viewed through a's own C-order index. When shapes differ
     * (reshape), make the input contiguous-order-compatible by iterating a's shape. */
    cp_ctx x = {.y = y->st->data,
                .a = a->st->data,
                .esz = td_dtype_size(a->dtype),
                .from = a->dtype,
                .to = y->dtype};
    tdd_iter it;
    tdd_tensor yv = *y;
    /* y is contiguous: view it with a's shape (same numel, same C order). */
    yv.ndim = a->ndim;
    memcpy(yv.shape, a->shape, sizeof yv.shape);
    tdd_set_contiguous(&yv);
    const tdd_tensor *ops[2] = {&yv, a};
    tdd_iter_tensors(&it, a->shape, a->ndim, 2, ops);
    tdd_iter_fn fn = copy_run;
    if (a->dtype == TD_F32 && y->dtype == TD_F64)
        fn = f32_to_f64_run;
    else if (a->dtype == TD_F64 && y->dtype == TD_F32)
        fn = f64_to_f32_run;
    cpu_par_iter(&it, fn, &x, nt);
    return 0;
}

/* ---------------------------------------------------------------- creation */

typedef struct {
    char *y;
    const tdd_opargs *g;
    tdd_op op;
    bool f64;
} cr_ctx;

static void create_run(void *vc, int64_t n, const int64_t *off, const int64_t *st)
{
    const cr_ctx *c = vc;
    (void)st; /* outputs of creation ops are contiguous: one run covers them */
    int64_t i0 = off[0] - 0;
    if (c->f64) {
        double *y = (double *)(void *)c->y + off[0];
        for (int64_t i = 0; i < n; i++) {
            uint64_t k = (uint64_t)(i0 + i);
            y[i] = c->op == TDD_OP_RAND    ? tdd_rng_uniform(c->g->seed, k)
                   : c->op == TDD_OP_RANDN ? tdd_rng_normal(c->g->seed, k)
                                           : c->g->f[0];
        }
    } else {
        float *y = (float *)(void *)c->y + off[0];
        for (int64_t i = 0; i < n; i++) {
            uint64_t k = (uint64_t)(i0 + i);
            y[i] = (float)(c->op == TDD_OP_RAND    ? tdd_rng_uniform24(c->g->seed, k)
                           : c->op == TDD_OP_RANDN ? tdd_rng_normal(c->g->seed, k)
                                                   : c->g->f[0]);
        }
    }
}

int cpu_create(const tdd_opcall *c, int nt)
{
    tdd_tensor *y = c->out[0];
    cr_ctx x = {.y = y->st->data, .g = c->args, .op = c->op, .f64 = y->dtype == TD_F64};
    /* Iterate element indices 0..n of a contiguous output whose offset is y->offset;
     * the random draw is keyed by the element index, so offset it back. */
    tdd_tensor flat = *y;
    flat.offset = 0;
    tdd_iter it;
    const tdd_tensor *ops[1] = {&flat};
    tdd_iter_tensors(&it, y->shape, y->ndim, 1, ops);
    x.y = (char *)y->st->data + (size_t)y->offset * td_dtype_size(y->dtype);
    cpu_par_iter(&it, create_run, &x, nt);
    return 0;
}
