/* elementwise.h -- each elementwise op's scalar expression, once, for every backend.
 *
 * Compiled by C (ref, cpu) and by nvcc (cuda/kernels.cu) alike, as ggml-common.h is: plain
 * C, no C11-only headers, and TDD_HD qualifies the helpers for both. A backend expands
 * TDD_BINARY_OPS / TDD_UNARY_OPS with a macro of its own for the EW column (and one that
 * ignores the OP column), in the types it computes in; opcodes.h splices the OP columns into
 * the op table (TDD_OPS), so a row here is also the op's row there.
 *
 * Row: OP(ENUM, "name", min_inputs, max_inputs, KIND) EW(ENUM, RULE, fexpr, IMODE, iexpr)
 *   RULE   the output dtype from the compute dtype ct (the inputs promoted, PyTorch's rules;
 *          backends/ops.c reads it):
 *            SAME   ct; bool inputs refused      SAMEB  ct; bool accepted
 *            FLOAT  integral/bool ct -> float32  FONLY  floating inputs only
 *            BOOL   bool (comparisons, logical ops)
 *   fexpr  the value in floating point: operands x (and y) of type R (double on ref, the
 *          dtype's float type on cpu, float on cuda), alpha (add/sub), the parameters p0, p1
 *          (R) and the variant v (int, 0 or 1: gelu's approximate="tanh"), from the op's
 *          arguments (tdd_opargs f[0], f[1], i[0]; n[0], n[1] for lo, hi). Constants are written
 * (R)c so float stays float. IMODE  INT: iexpr is exact on integer and bool inputs (every backend
 * may run it); ICHK: iexpr may fail (it sets int err nonzero: INVALID_ARGUMENT); the reference runs
 * it; NONE: no integer form (RULE sends integer inputs to a float compute dtype). iexpr  the value
 * on integers: x, y of the integer type T, U its unsigned type (wrapping arithmetic), alpha of type
 * U, lo, hi int64 (clamp's bounds). The backend narrows the result to the output dtype (a cast;
 * bool: nonzero is true).
 *
 * Adding an elementwise op: a row here, its attribute schema entry (ops_schema.c, tdd_op_schema)
 * and its backward formula (daemon/autograd_fn.c; a bw_rows row there when the formula reads
 * the output or only the inputs' shapes). The conformance suite generates its cases from the
 * row (tests/unit/test_conformance.c). */
#ifndef TDD_ELEMENTWISE_H
#define TDD_ELEMENTWISE_H

#include <stdint.h>

#ifdef __CUDACC__
#define TDD_HD __host__ __device__ inline
#else
#define TDD_HD static inline
#endif

/* PyTorch's clamp step: b wins when v is past it (CMP) or b is NaN. */
#define TDD_CLAMP_STEP(v, b, CMP) (((v)CMP(b) || (b) != (b)) ? (b) : (v))
/* Python's remainder: fmod, moved to the divisor's sign (fexpr helper, R-generic). */
#define TDD_REMAINDER(x, y)                                                                        \
    (fmod(x, y) + ((fmod(x, y) != 0 && ((fmod(x, y) < 0) != ((y) < 0))) ? (y) : (R)0))

/* Integer pow (exponent >= 0 wraps; a negative one is 0/1/-1 for |x| == 1, else refused). */
TDD_HD int64_t tdd_ipow(int64_t x, int64_t y, int *err)
{
    if (y < 0) {
        if (x == 1 || x == -1)
            return (y % 2 == 0) ? 1 : x;
        *err = 1; /* INVALID_ARGUMENT: integers to negative powers */
        return 0;
    }
    uint64_t acc = 1, base = (uint64_t)x;
    for (uint64_t e = (uint64_t)y; e; e >>= 1) {
        if (e & 1)
            acc *= base;
        base *= base;
    }
    return (int64_t)acc;
}

/* Integer remainder, the divisor's sign (division by zero refused). */
TDD_HD int64_t tdd_iremainder(int64_t x, int64_t y, int *err)
{
    if (y == 0) {
        *err = 1; /* INVALID_ARGUMENT: integer division by zero */
        return 0;
    }
    if (y == -1)
        return 0;
    int64_t r = x % y;
    if (r != 0 && ((r < 0) != (y < 0)))
        r += y;
    return r;
}

/* Two operands, broadcasting (relu_backward's own prepare makes it ELEMENT). */
/* clang-format off: one row per op reads best; the formatter folds the rows into a stair. */
// clang-format off
#define TDD_BINARY_OPS(OP, EW)                                                                     \
    OP(ADD, "add", 1, 2, BINARY) EW(ADD, SAMEB, x + alpha * y, INT, (U)x + alpha * (U)y)           \
    OP(SUB, "sub", 1, 2, BINARY) EW(SUB, SAME, x - alpha * y, INT, (U)x - alpha * (U)y)            \
    OP(MUL, "mul", 1, 2, BINARY) EW(MUL, SAMEB, x * y, INT, (U)x * (U)y)                           \
    OP(DIV, "div", 1, 2, BINARY) EW(DIV, FLOAT, x / y, NONE, 0)                                    \
    OP(POW, "pow", 1, 2, BINARY) EW(POW, SAME, pow(x, y), ICHK, tdd_ipow(x, y, &err))              \
    OP(MAXIMUM, "maximum", 1, 2, BINARY) EW(MAXIMUM, SAMEB, (x != x || y != y) ? (R)NAN : (x > y ? x : y), INT, x > y ? x : y) \
    OP(MINIMUM, "minimum", 1, 2, BINARY) EW(MINIMUM, SAMEB, (x != x || y != y) ? (R)NAN : (x < y ? x : y), INT, x < y ? x : y) \
    OP(REMAINDER, "remainder", 1, 2, BINARY) EW(REMAINDER, SAME, TDD_REMAINDER(x, y), ICHK, tdd_iremainder(x, y, &err)) \
    OP(EQ, "eq", 1, 2, BINARY) EW(EQ, BOOL, x == y, INT, x == y)                                   \
    OP(NE, "ne", 1, 2, BINARY) EW(NE, BOOL, x != y, INT, x != y)                                   \
    OP(LT, "lt", 1, 2, BINARY) EW(LT, BOOL, x < y, INT, x < y)                                     \
    OP(LE, "le", 1, 2, BINARY) EW(LE, BOOL, x <= y, INT, x <= y)                                   \
    OP(GT, "gt", 1, 2, BINARY) EW(GT, BOOL, x > y, INT, x > y)                                     \
    OP(GE, "ge", 1, 2, BINARY) EW(GE, BOOL, x >= y, INT, x >= y)                                   \
    OP(LOGICAL_AND, "logical_and", 1, 2, BINARY) EW(LOGICAL_AND, BOOL, x != 0 && y != 0, INT, x != 0 && y != 0) \
    OP(LOGICAL_OR, "logical_or", 1, 2, BINARY) EW(LOGICAL_OR, BOOL, x != 0 || y != 0, INT, x != 0 || y != 0) \
    OP(LOGICAL_XOR, "logical_xor", 1, 2, BINARY) EW(LOGICAL_XOR, BOOL, (x != 0) != (y != 0), INT, (x != 0) != (y != 0)) \
    OP(ATAN2, "atan2", 1, 2, BINARY) EW(ATAN2, FLOAT, atan2(x, y), NONE, 0)                        \
    OP(RELU_BACKWARD, "relu_backward", 2, 2, ELEMENT) EW(RELU_BACKWARD, SAME, y > 0 ? x : (R)0, INT, y > 0 ? x : 0)

/* One operand. */
#define TDD_UNARY_OPS(OP, EW)                                                                      \
    OP(NEG, "neg", 1, 1, UNARY) EW(NEG, SAME, -x, INT, (U)0 - (U)x)                                \
    OP(ABS, "abs", 1, 1, UNARY) EW(ABS, SAME, fabs(x), INT, x < 0 ? (U)0 - (U)x : (U)x)            \
    OP(SIGN, "sign", 1, 1, UNARY) EW(SIGN, SAME, x > 0 ? (R)1 : x < 0 ? (R)-1 : x * (R)0, INT, (x > 0) - (x < 0)) \
    OP(EXP, "exp", 1, 1, UNARY) EW(EXP, FLOAT, exp(x), NONE, 0)                                    \
    OP(LOG, "log", 1, 1, UNARY) EW(LOG, FLOAT, log(x), NONE, 0)                                    \
    OP(LOG1P, "log1p", 1, 1, UNARY) EW(LOG1P, FLOAT, log1p(x), NONE, 0)                            \
    OP(EXPM1, "expm1", 1, 1, UNARY) EW(EXPM1, FLOAT, expm1(x), NONE, 0)                            \
    OP(SQRT, "sqrt", 1, 1, UNARY) EW(SQRT, FLOAT, sqrt(x), NONE, 0)                                \
    OP(RSQRT, "rsqrt", 1, 1, UNARY) EW(RSQRT, FLOAT, (R)1 / sqrt(x), NONE, 0)                      \
    OP(SIN, "sin", 1, 1, UNARY) EW(SIN, FLOAT, sin(x), NONE, 0)                                    \
    OP(COS, "cos", 1, 1, UNARY) EW(COS, FLOAT, cos(x), NONE, 0)                                    \
    OP(TANH, "tanh", 1, 1, UNARY) EW(TANH, FLOAT, tanh(x), NONE, 0)                                \
    OP(SIGMOID, "sigmoid", 1, 1, UNARY) EW(SIGMOID, FLOAT, (R)1 / ((R)1 + exp(-x)), NONE, 0)       \
    OP(RELU, "relu", 1, 1, UNARY) EW(RELU, SAME, x < 0 ? (R)0 : x, INT, x < 0 ? 0 : x)             \
    OP(LEAKY_RELU, "leaky_relu", 1, 1, UNARY) EW(LEAKY_RELU, FONLY, x > 0 ? x : x * p0, NONE, 0)   \
    OP(GELU, "gelu", 1, 1, UNARY) EW(GELU, FONLY, v ? (R)0.5 * x *((R)1 + tanh((R)0.7978845608028654 * (x + (R)0.044715 * x * x * x))) : (R)0.5 * x * ((R)1 + erf(x * (R)0.7071067811865476)), NONE, 0) \
    OP(SILU, "silu", 1, 1, UNARY) EW(SILU, FONLY, x / ((R)1 + exp(-x)), NONE, 0)                   \
    OP(SOFTPLUS, "softplus", 1, 1, UNARY) EW(SOFTPLUS, FONLY, x *p0 > p1 ? x : log1p(exp(x * p0)) / p0, NONE, 0) \
    OP(CLAMP, "clamp", 1, 3, UNARY) EW(CLAMP, SAME, TDD_CLAMP_STEP(TDD_CLAMP_STEP(x, p0, <), p1, >), INT, x<lo ? (lo > hi ? hi : lo) : x> hi ? hi : x) \
    OP(FLOOR, "floor", 1, 1, UNARY) EW(FLOOR, SAME, floor(x), INT, x)                              \
    OP(CEIL, "ceil", 1, 1, UNARY) EW(CEIL, SAME, ceil(x), INT, x)                                  \
    OP(ROUND, "round", 1, 1, UNARY) EW(ROUND, SAME, nearbyint(x), INT, x)                          \
    OP(RECIPROCAL, "reciprocal", 1, 1, UNARY) EW(RECIPROCAL, FLOAT, (R)1 / x, NONE, 0)             \
    OP(SQUARE, "square", 1, 1, UNARY) EW(SQUARE, SAME, x * x, INT, (U)x * (U)x)                    \
    OP(LOGICAL_NOT, "logical_not", 1, 1, UNARY) EW(LOGICAL_NOT, BOOL, x == 0, INT, x == 0)

/* An EW (or OP) argument that expands to nothing. */
#define TDD_EW_SKIP(...)

#endif
