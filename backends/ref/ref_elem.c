/* ref_elem.c -- reference elementwise ops (binary with broadcasting, unary,
 * where, masked_fill), copies and casts, and creation ops. */
#include <math.h>
#include <string.h>

#include "ref.h"

/* Integer arithmetic wraps like the hardware (and PyTorch); unsigned math
 * keeps C from calling it undefined. */
static int64_t wrap_add(int64_t a, int64_t b)
{
    return (int64_t)((uint64_t)a + (uint64_t)b);
}

static int64_t wrap_mul(int64_t a, int64_t b)
{
    return (int64_t)((uint64_t)a * (uint64_t)b);
}

static int binary_i(tdd_op op, int64_t x, int64_t y, int64_t alpha, int64_t *r)
{
    switch (op) {
    case TDD_OP_ADD:
        *r = wrap_add(x, wrap_mul(alpha, y));
        return 0;
    case TDD_OP_SUB:
        *r = (int64_t)((uint64_t)x - (uint64_t)wrap_mul(alpha, y)); /* no -INT64_MIN */
        return 0;
    case TDD_OP_MUL:
        *r = wrap_mul(x, y);
        return 0;
    case TDD_OP_POW: {
        if (y < 0) {
            if (x == 1 || x == -1)
                *r = (y % 2 == 0) ? 1 : x;
            else
                return TD_EINVALID_ARGUMENT; /* integers to negative powers */
            return 0;
        }
        int64_t acc = 1, base = x;
        for (uint64_t e = (uint64_t)y; e; e >>= 1) {
            if (e & 1)
                acc = wrap_mul(acc, base);
            base = wrap_mul(base, base);
        }
        *r = acc;
        return 0;
    }
    case TDD_OP_MAXIMUM:
        *r = x > y ? x : y;
        return 0;
    case TDD_OP_MINIMUM:
        *r = x < y ? x : y;
        return 0;
    case TDD_OP_REMAINDER:
        if (y == 0)
            return TD_EINVALID_ARGUMENT; /* integer division by zero */
        if (y == -1) {
            *r = 0;
            return 0;
        }
        *r = x % y;
        if (*r != 0 && ((*r < 0) != (y < 0)))
            *r += y;
        return 0;
    case TDD_OP_EQ:
        *r = x == y;
        return 0;
    case TDD_OP_NE:
        *r = x != y;
        return 0;
    case TDD_OP_LT:
        *r = x < y;
        return 0;
    case TDD_OP_LE:
        *r = x <= y;
        return 0;
    case TDD_OP_GT:
        *r = x > y;
        return 0;
    case TDD_OP_GE:
        *r = x >= y;
        return 0;
    case TDD_OP_LOGICAL_AND:
        *r = x && y;
        return 0;
    case TDD_OP_LOGICAL_OR:
        *r = x || y;
        return 0;
    case TDD_OP_LOGICAL_XOR:
        *r = (x != 0) != (y != 0);
        return 0;
    default:
        return TD_EINTERNAL;
    }
}

static double binary_f(tdd_op op, double x, double y, double alpha)
{
    switch (op) {
    case TDD_OP_ADD:
        return x + alpha * y;
    case TDD_OP_SUB:
        return x - alpha * y;
    case TDD_OP_MUL:
        return x * y;
    case TDD_OP_DIV:
        return x / y;
    case TDD_OP_POW:
        return pow(x, y);
    case TDD_OP_MAXIMUM: /* NaN propagates, as torch.maximum */
        return (x != x || y != y) ? NAN : (x > y ? x : y);
    case TDD_OP_MINIMUM:
        return (x != x || y != y) ? NAN : (x < y ? x : y);
    case TDD_OP_REMAINDER: { /* sign of the divisor, as Python and PyTorch */
        double m = fmod(x, y);
        if (m != 0 && ((m < 0) != (y < 0)))
            m += y;
        return m;
    }
    case TDD_OP_EQ:
        return x == y;
    case TDD_OP_NE:
        return x != y;
    case TDD_OP_LT:
        return x < y;
    case TDD_OP_LE:
        return x <= y;
    case TDD_OP_GT:
        return x > y;
    case TDD_OP_GE:
        return x >= y;
    case TDD_OP_LOGICAL_AND:
        return x != 0 && y != 0;
    case TDD_OP_LOGICAL_OR:
        return x != 0 || y != 0;
    case TDD_OP_LOGICAL_XOR:
        return (x != 0) != (y != 0);
    default:
        return NAN;
    }
}

static double unary_f(tdd_op op, double x, const tdd_opargs *g)
{
    switch (op) {
    case TDD_OP_NEG:
        return -x;
    case TDD_OP_ABS:
        return fabs(x);
    case TDD_OP_SIGN:
        return x > 0 ? 1.0 : x < 0 ? -1.0 : x * 0.0;
    case TDD_OP_EXP:
        return exp(x);
    case TDD_OP_LOG:
        return log(x);
    case TDD_OP_LOG1P:
        return log1p(x);
    case TDD_OP_EXPM1:
        return expm1(x);
    case TDD_OP_SQRT:
        return sqrt(x);
    case TDD_OP_RSQRT:
        return 1.0 / sqrt(x);
    case TDD_OP_SIN:
        return sin(x);
    case TDD_OP_COS:
        return cos(x);
    case TDD_OP_TANH:
        return tanh(x);
    case TDD_OP_SIGMOID:
        return 1.0 / (1.0 + exp(-x));
    case TDD_OP_RELU:
        return x < 0 ? 0.0 : x;
    case TDD_OP_LEAKY_RELU:
        return x > 0 ? x : x * g->f[0];
    case TDD_OP_GELU:
        if (g->i[0])
            return 0.5 * x * (1.0 + tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)));
        return 0.5 * x * (1.0 + erf(x * 0.7071067811865476));
    case TDD_OP_SILU:
        return x / (1.0 + exp(-x));
    case TDD_OP_SOFTPLUS:
        return x * g->f[0] > g->f[1] ? x : log1p(exp(x * g->f[0])) / g->f[0];
    case TDD_OP_CLAMP: /* min(max(x, min), max): min > max gives max; NaN anywhere gives NaN */
        if ((g->flags & 1u) && (x < g->f[0] || isnan(g->f[0])))
            x = g->f[0];
        if ((g->flags & 2u) && (x > g->f[1] || isnan(g->f[1])))
            x = g->f[1];
        return x;
    case TDD_OP_FLOOR:
        return floor(x);
    case TDD_OP_CEIL:
        return ceil(x);
    case TDD_OP_ROUND:
        return nearbyint(x); /* half to even */
    case TDD_OP_RECIPROCAL:
        return 1.0 / x;
    case TDD_OP_SQUARE:
        return x * x;
    case TDD_OP_LOGICAL_NOT:
        return x == 0;
    default:
        return NAN;
    }
}

static int64_t unary_i(tdd_op op, int64_t x, const tdd_opargs *g)
{
    switch (op) {
    case TDD_OP_NEG:
        return (int64_t)(0 - (uint64_t)x);
    case TDD_OP_ABS:
        return x < 0 ? (int64_t)(0 - (uint64_t)x) : x;
    case TDD_OP_SIGN:
        return (x > 0) - (x < 0);
    case TDD_OP_RELU:
        return x < 0 ? 0 : x;
    case TDD_OP_SQUARE:
        return wrap_mul(x, x);
    case TDD_OP_CLAMP:
        if ((g->flags & 1u) && x < g->n[0])
            x = g->n[0];
        if ((g->flags & 2u) && x > g->n[1])
            x = g->n[1];
        return x;
    case TDD_OP_LOGICAL_NOT:
        return x == 0;
    default: /* floor, ceil, round of an integer */
        return x;
    }
}

int ref_elementwise(const tdd_opcall *c)
{
    const tdd_opargs *g = c->args;
    tdd_tensor *y = c->out[0];
    int64_t n = tdd_numel(y), idx[TD_MAX_NDIM];
    td_dtype ct = g->cdtype;
    bool ints = !tdd_dtype_is_float(ct);
    tdd_opkind kind = tdd_opdefs[c->op].kind;
    for (int64_t i = 0; i < n; i++) {
        ref_unravel(i, y->shape, y->ndim, idx);
        int64_t yo = ref_index(y, i);
        const tdd_tensor *a = c->in[0];
        int64_t ao = ref_at(a, idx, y->ndim);
        if (kind == TDD_KIND_BINARY) {
            const tdd_tensor *b = c->n_in > 1 ? c->in[1] : NULL;
            int64_t bo = b ? ref_at(b, idx, y->ndim) : 0;
            if (ints) {
                int64_t r, xv = ref_geti(a, ao), yv = b ? ref_geti(b, bo) : g->n[0];
                int rc = binary_i(c->op, xv, yv, g->n[1], &r);
                if (rc)
                    return rc;
                ref_seti(y, yo, r);
            } else {
                double xv = ref_round(ct, ref_getf(a, ao));
                double yv = ref_round(ct, b ? ref_getf(b, bo) : g->f[0]);
                ref_setf(y, yo, binary_f(c->op, xv, yv, ref_round(ct, g->f[1])));
            }
            continue;
        }
        switch (c->op) {
        case TDD_OP_WHERE: {
            const tdd_tensor *s = ref_geti(a, ao) ? c->in[1] : c->in[2];
            int64_t so = ref_at(s, idx, y->ndim);
            if (ints)
                ref_seti(y, yo, ref_geti(s, so));
            else
                ref_setf(y, yo, ref_getf(s, so));
            break;
        }
        case TDD_OP_MASKED_FILL: {
            bool m = ref_geti(c->in[1], ref_at(c->in[1], idx, y->ndim)) != 0;
            if (ints)
                ref_seti(y, yo, m ? g->n[0] : ref_geti(a, ao));
            else
                ref_setf(y, yo, m ? g->f[0] : ref_getf(a, ao));
            break;
        }
        case TDD_OP_RELU_BACKWARD: {
            const tdd_tensor *x = c->in[1];
            int64_t xo = ref_at(x, idx, y->ndim);
            if (ints)
                ref_seti(y, yo, ref_geti(x, xo) > 0 ? ref_geti(a, ao) : 0);
            else
                ref_setf(y, yo, ref_getf(x, xo) > 0 ? ref_getf(a, ao) : 0.0);
            break;
        }
        default: /* unary: integer ops stay exact */
            if (!tdd_dtype_is_float(g->dtype) && !tdd_dtype_is_float(a->dtype))
                ref_seti(y, yo, unary_i(c->op, ref_geti(a, ao), g));
            else
                ref_setf(y, yo, unary_f(c->op, ref_getf(a, ao), g));
            break;
        }
    }
    return 0;
}

/* Copies in[0] into out[0] element by element in C order, converting dtype. */
static void copy_convert(const tdd_tensor *a, tdd_tensor *y)
{
    int64_t n = tdd_numel(y);
    bool exact_int = !tdd_dtype_is_float(a->dtype);
    for (int64_t i = 0; i < n; i++) {
        int64_t ao = ref_index(a, i), yo = ref_index(y, i);
        if (exact_int)
            ref_seti(y, yo, ref_geti(a, ao));
        else
            ref_setf(y, yo, ref_getf(a, ao));
    }
}

int ref_copy(const tdd_opcall *c)
{
    if (c->args->out_view)
        return 0; /* the daemon made the output a view: nothing to compute */
    copy_convert(c->in[0], c->out[0]);
    return 0;
}

int ref_create(const tdd_opcall *c)
{
    const tdd_opargs *g = c->args;
    tdd_tensor *y = c->out[0];
    int64_t n = tdd_numel(y);
    bool ints = !tdd_dtype_is_float(y->dtype);
    /* random draws for a float dtype keep only the bits it holds, so none rounds up to 1 */
    int bits = y->dtype == TD_F64 ? 53 : y->dtype == TD_F32 ? 24 : y->dtype == TD_F16 ? 11 : 8;
    for (int64_t i = 0; i < n; i++) {
        int64_t o = ref_index(y, i);
        uint64_t u;
        switch (c->op) {
        case TDD_OP_FULL:
        case TDD_OP_ZEROS:
        case TDD_OP_ONES:
            if (ints)
                ref_seti(y, o, g->n[0]);
            else
                ref_setf(y, o, g->f[0]);
            break;
        case TDD_OP_ARANGE:
            if (ints)
                ref_seti(y, o, g->n[0] + i * g->n[2]);
            else
                ref_setf(y, o, g->f[0] + (double)i * g->f[2]);
            break;
        case TDD_OP_LINSPACE: {
            /* from both ends, as PyTorch, so the last value is exactly end */
            double step = n > 1 ? (g->f[1] - g->f[0]) / (double)(n - 1) : 0.0;
            /* one step is the start (n / 2 == 0 would pick the end) */
            ref_setf(y, o,
                     i < n / 2 || n == 1 ? g->f[0] + step * (double)i
                                         : g->f[1] - step * (double)(n - 1 - i));
            break;
        }
        case TDD_OP_EYE:
            ref_seti(y, o, i / g->i[1] == i % g->i[1]);
            break;
        case TDD_OP_RAND:
            u = tdd_rng_u64(g->seed, (uint64_t)i);
            ref_setf(y, o, (double)(u >> (64 - bits)) * ldexp(1.0, -bits));
            break;
        case TDD_OP_RANDN:
            ref_setf(y, o, tdd_rng_normal(g->seed, (uint64_t)i));
            break;
        case TDD_OP_RANDINT: {
            uint64_t range = (uint64_t)g->n[1] - (uint64_t)g->n[0];
            u = tdd_rng_u64(g->seed, (uint64_t)i);
            ref_seti(y, o, (int64_t)((uint64_t)g->n[0] + u % range));
            break;
        }
        default:
            return TD_EINTERNAL;
        }
    }
    return 0;
}
