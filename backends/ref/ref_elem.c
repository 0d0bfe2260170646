/* ref_elem.c -- reference elementwise ops (binary with broadcasting, unary,
 * where, masked_fill), copies and casts, and creation ops. */
#include <math.h>
#include <string.h>

#include "ref.h"

/* The expressions of elementwise.h: integers in int64 with wrapping unsigned arithmetic
 * (as the hardware and PyTorch wrap; the store narrows to the dtype), floats in double on
 * operands rounded to the compute dtype. */
#define REF_I_INT(e) (int64_t)(e)
#define REF_I_ICHK(e) (int64_t)(e)
#define REF_I_NONE(e) (err = -1, (int64_t)0) /* prepare sends integers to a float dtype */

static int ew_rc(int err)
{
    return err < 0 ? TD_EINTERNAL : err ? TD_EINVALID_ARGUMENT : 0;
}

static int binary_i(tdd_op op, int64_t x, int64_t y, int64_t alpha_i, int64_t *r)
{
    typedef uint64_t U;
    const U alpha = (U)alpha_i;
    int err = 0;
    switch (op) {
#define REF_BIN_I(e, rule, fexpr, im, iexpr)                                                       \
    case TDD_OP_##e:                                                                               \
        *r = REF_I_##im(iexpr);                                                                    \
        break;
        TDD_BINARY_OPS(TDD_EW_SKIP, REF_BIN_I)
#undef REF_BIN_I
    default:
        return TD_EINTERNAL;
    }
    return ew_rc(err);
}

static double binary_f(tdd_op op, double x, double y, double alpha)
{
    typedef double R;
    switch (op) {
#define REF_BIN_F(e, rule, fexpr, im, iexpr)                                                       \
    case TDD_OP_##e:                                                                               \
        return (R)(fexpr);
        TDD_BINARY_OPS(TDD_EW_SKIP, REF_BIN_F)
#undef REF_BIN_F
    default:
        return NAN;
    }
}

static double unary_f(tdd_op op, double x, double p0, double p1, int v)
{
    typedef double R;
    switch (op) {
#define REF_UN_F(e, rule, fexpr, im, iexpr)                                                        \
    case TDD_OP_##e:                                                                               \
        return (R)(fexpr);
        TDD_UNARY_OPS(TDD_EW_SKIP, REF_UN_F)
#undef REF_UN_F
    default:
        return NAN;
    }
}

static int unary_i(tdd_op op, int64_t x, int64_t lo, int64_t hi, int64_t *r)
{
    typedef uint64_t U;
    int err = 0;
    switch (op) {
#define REF_UN_I(e, rule, fexpr, im, iexpr)                                                        \
    case TDD_OP_##e:                                                                               \
        *r = REF_I_##im(iexpr);                                                                    \
        break;
        TDD_UNARY_OPS(TDD_EW_SKIP, REF_UN_I)
#undef REF_UN_I
    default:
        return TD_EINTERNAL;
    }
    return ew_rc(err);
}

int ref_elementwise(const tdd_opcall *c)
{
    const tdd_opargs *g = c->args;
    tdd_tensor *y = c->out[0];
    int64_t n = tdd_numel(y), idx[TD_MAX_NDIM];
    td_dtype ct = g->cdtype;
    bool ints = !tdd_dtype_is_float(ct);
    int arity = tdd_ew_arity(c->op);
    for (int64_t i = 0; i < n; i++) {
        ref_unravel(i, y->shape, y->ndim, idx);
        int64_t yo = ref_index(y, i);
        const tdd_tensor *a = c->in[0];
        int64_t ao = ref_at(a, idx, y->ndim);
        if (arity == 2) {
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
        if (arity == 1) { /* integer ops stay exact */
            int64_t r;
            if (!tdd_dtype_is_float(g->dtype) && !tdd_dtype_is_float(a->dtype)) {
                int rc = unary_i(c->op, ref_geti(a, ao), g->n[0], g->n[1], &r);
                if (rc)
                    return rc;
                ref_seti(y, yo, r);
            } else {
                ref_setf(y, yo, unary_f(c->op, ref_getf(a, ao), g->f[0], g->f[1], (int)g->i[0]));
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
            if (m && c->n_in == 3) { /* a 0-d value tensor, converted to the output's dtype */
                const tdd_tensor *v = c->in[2];
                if (y->dtype == TD_BOOL)
                    ref_seti(y, yo, ref_getf(v, v->offset) != 0.0); /* nonzero (NaN too) */
                else if (ints)
                    ref_seti(y, yo, ref_geti(v, v->offset));
                else
                    ref_setf(y, yo, ref_getf(v, v->offset));
            } else if (ints)
                ref_seti(y, yo, m ? g->n[0] : ref_geti(a, ao));
            else
                ref_setf(y, yo, m ? g->f[0] : ref_getf(a, ao));
            break;
        }
        default:
            return TD_EINTERNAL;
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
