/* ref_reduce.c -- reference reductions (over any dim set), scans, softmax
 * and the losses. Accumulation is in double (int64 for integer sums). */
#include <math.h>

#include "ref.h"

/* Visits the reduced elements of output element o: storage offsets of the
 * input into offs (caller sized by count). */
typedef struct {
    int nk, nr;
    int64_t kshape[TD_MAX_NDIM], kstr[TD_MAX_NDIM], rshape[TD_MAX_NDIM], rstr[TD_MAX_NDIM];
    int64_t count;
} ref_plan;

static void plan_init(ref_plan *p, const tdd_tensor *a, uint32_t mask)
{
    p->nk = p->nr = 0;
    p->count = 1;
    for (int d = 0; d < a->ndim; d++) {
        if (mask & (1u << d)) {
            p->rshape[p->nr] = a->shape[d];
            p->rstr[p->nr++] = a->strides[d];
            p->count *= a->shape[d];
        } else {
            p->kshape[p->nk] = a->shape[d];
            p->kstr[p->nk++] = a->strides[d];
        }
    }
}

/* Offset of the r-th reduced element of output o. */
static int64_t plan_at(const ref_plan *p, const tdd_tensor *a, int64_t o, int64_t r)
{
    int64_t idx[TD_MAX_NDIM], off = a->offset;
    ref_unravel(o, p->kshape, p->nk, idx);
    for (int d = 0; d < p->nk; d++)
        off += idx[d] * p->kstr[d];
    ref_unravel(r, p->rshape, p->nr, idx);
    for (int d = 0; d < p->nr; d++)
        off += idx[d] * p->rstr[d];
    return off;
}

static int line_op(const tdd_opcall *c)
{
    const tdd_tensor *a = c->in[0];
    tdd_tensor *y = c->out[0];
    int d = (int)c->args->i[0];
    int64_t L = a->ndim ? a->shape[d] : 1, n = tdd_numel(a);
    int64_t lines = L ? n / L : 0;
    bool ints = !tdd_dtype_is_float(y->dtype);
    for (int64_t j = 0; j < lines; j++) {
        int64_t as, ys, ab = ref_line(a, d, j, &as), yb = ref_line(y, d, j, &ys);
        if (c->op == TDD_OP_CUMSUM) {
            double s = 0;
            int64_t si = 0;
            for (int64_t k = 0; k < L; k++) {
                if (ints) {
                    si = (int64_t)((uint64_t)si + (uint64_t)ref_geti(a, ab + k * as));
                    ref_seti(y, yb + k * ys, si);
                } else {
                    s += ref_getf(a, ab + k * as);
                    ref_setf(y, yb + k * ys, s);
                }
            }
            continue;
        }
        double m = -INFINITY, s = 0;
        for (int64_t k = 0; k < L; k++) {
            double v = ref_getf(a, ab + k * as);
            if (v > m || v != v)
                m = v;
        }
        if (isinf(m))
            m = 0; /* all -inf (or an inf): shifting by it would make NaNs */
        for (int64_t k = 0; k < L; k++)
            s += exp(ref_getf(a, ab + k * as) - m);
        for (int64_t k = 0; k < L; k++) {
            double v = ref_getf(a, ab + k * as) - m;
            ref_setf(y, yb + k * ys, c->op == TDD_OP_SOFTMAX ? exp(v) / s : v - log(s));
        }
    }
    return 0;
}

int ref_reduce(const tdd_opcall *c)
{
    const tdd_opargs *g = c->args;
    const tdd_tensor *a = c->in[0];
    tdd_tensor *y = c->out[0];
    if (c->op == TDD_OP_CUMSUM || c->op == TDD_OP_SOFTMAX || c->op == TDD_OP_LOG_SOFTMAX)
        return line_op(c);
    ref_plan p;
    plan_init(&p, a, g->dims_mask);
    int64_t nout = tdd_numel(y), N = p.count;
    bool ints = !tdd_dtype_is_float(a->dtype);
    for (int64_t o = 0; o < nout; o++) {
        int64_t yo = ref_index(y, o);
        switch (c->op) {
        case TDD_OP_SUM:
        case TDD_OP_SUM_TO:
        case TDD_OP_PROD: {
            bool prod = c->op == TDD_OP_PROD;
            if (ints) {
                int64_t s = prod;
                for (int64_t r = 0; r < N; r++) {
                    uint64_t v = (uint64_t)ref_geti(a, plan_at(&p, a, o, r));
                    s = (int64_t)(prod ? (uint64_t)s * v : (uint64_t)s + v);
                }
                ref_seti(y, yo, s);
            } else {
                double s = prod;
                for (int64_t r = 0; r < N; r++) {
                    double v = ref_getf(a, plan_at(&p, a, o, r));
                    s = prod ? s * v : s + v;
                }
                ref_setf(y, yo, s);
            }
            break;
        }
        case TDD_OP_MEAN:
        case TDD_OP_VAR:
        case TDD_OP_STD: {
            double s = 0;
            for (int64_t r = 0; r < N; r++)
                s += ref_getf(a, plan_at(&p, a, o, r));
            double mean = s / (double)N;
            if (c->op == TDD_OP_MEAN) {
                ref_setf(y, yo, mean);
                break;
            }
            double ss = 0;
            for (int64_t r = 0; r < N; r++) {
                double dv = ref_getf(a, plan_at(&p, a, o, r)) - mean;
                ss += dv * dv;
            }
            double den = (double)N - g->f[0];
            double var = ss / (den > 0 ? den : 0.0);
            ref_setf(y, yo, c->op == TDD_OP_STD ? sqrt(var) : var);
            break;
        }
        case TDD_OP_AMAX:
        case TDD_OP_AMIN:
        case TDD_OP_ARGMAX:
        case TDD_OP_ARGMIN: {
            bool mx = c->op == TDD_OP_AMAX || c->op == TDD_OP_ARGMAX;
            int64_t best = 0;
            if (ints) {
                int64_t bv = ref_geti(a, plan_at(&p, a, o, 0));
                for (int64_t r = 1; r < N; r++) {
                    int64_t v = ref_geti(a, plan_at(&p, a, o, r));
                    if (mx ? v > bv : v < bv) {
                        bv = v;
                        best = r;
                    }
                }
                if (c->op == TDD_OP_AMAX || c->op == TDD_OP_AMIN)
                    ref_seti(y, yo, bv);
                else
                    ref_seti(y, yo, best);
            } else {
                /* NaN wins (propagates), the first occurrence of the extreme counts */
                double bv = ref_getf(a, plan_at(&p, a, o, 0));
                for (int64_t r = 1; r < N && bv == bv; r++) {
                    double v = ref_getf(a, plan_at(&p, a, o, r));
                    if (v != v || (mx ? v > bv : v < bv)) {
                        bv = v;
                        best = r;
                    }
                }
                if (c->op == TDD_OP_AMAX || c->op == TDD_OP_AMIN)
                    ref_setf(y, yo, bv);
                else
                    ref_seti(y, yo, best);
            }
            break;
        }
        case TDD_OP_LOGSUMEXP: {
            double m = -INFINITY, s = 0;
            for (int64_t r = 0; r < N; r++) {
                double v = ref_getf(a, plan_at(&p, a, o, r));
                if (v > m || v != v)
                    m = v;
            }
            double sh = isinf(m) ? 0.0 : m;
            for (int64_t r = 0; r < N; r++)
                s += exp(ref_getf(a, plan_at(&p, a, o, r)) - sh);
            ref_setf(y, yo, m != m ? m : log(s) + sh);
            break;
        }
        default:
            return TD_EINTERNAL;
        }
    }
    return 0;
}

/* Writes a loss: per element for "none", else the sum or the mean over count. */
/* log(sum_k exp(x[base + k * cs])) over a row of C classes, shifted by its maximum (a NaN
 * wins it); a row of -inf sums to 0, and the log of that, -inf, is the answer. */
static double row_lse(const tdd_tensor *x, int64_t base, int64_t cs, int64_t C)
{
    double m = -INFINITY, s = 0;
    for (int64_t k = 0; k < C; k++) {
        double z = ref_getf(x, base + k * cs);
        if (z > m || z != z)
            m = z;
    }
    double sh = isinf(m) ? 0.0 : m;
    for (int64_t k = 0; k < C; k++)
        s += exp(ref_getf(x, base + k * cs) - sh);
    /* cppcheck-suppress invalidFunctionArg */
    return log(s) + sh;
}

static void loss_store(const tdd_opcall *c, int64_t i, double v, double *total)
{
    if (c->args->i[0] == TDD_RED_NONE)
        ref_setf(c->out[0], ref_index(c->out[0], i), v);
    else
        *total += v;
}

static void loss_finish(const tdd_opcall *c, double total, double count)
{
    if (c->args->i[0] == TDD_RED_SUM)
        ref_setf(c->out[0], c->out[0]->offset, total);
    else if (c->args->i[0] == TDD_RED_MEAN)
        ref_setf(c->out[0], c->out[0]->offset, total / count);
}

int ref_loss(const tdd_opcall *c)
{
    const tdd_opargs *g = c->args;
    const tdd_tensor *x = c->in[0], *t = c->in[1];
    double total = 0, count = 0;
    if (c->op == TDD_OP_MSE_LOSS || c->op == TDD_OP_BCE_WITH_LOGITS) {
        int64_t n = tdd_numel(x);
        for (int64_t i = 0; i < n; i++) {
            double a = ref_getf(x, ref_index(x, i)), b = ref_getf(t, ref_index(t, i));
            double v = c->op == TDD_OP_MSE_LOSS ? (a - b) * (a - b)
                                                : (a > 0 ? a : 0) - a * b + log1p(exp(-fabs(a)));
            loss_store(c, i, v, &total);
        }
        loss_finish(c, total, (double)n);
        return 0;
    }
    /* cross_entropy / nll_loss over the rows of [N, C, d...] (the class dim 1; [C]: one row),
     * row i at C-order position i of the other dims; PyTorch's weights and soft targets */
    int cd = x->ndim == 1 ? 0 : 1;
    int64_t C = x->shape[cd], N = C ? tdd_numel(x) / C : 0, cs = x->strides[cd];
    int64_t rshape[TD_MAX_NDIM], rstr[TD_MAX_NDIM], tstr[TD_MAX_NDIM], ridx[TD_MAX_NDIM];
    int nr = 0;
    for (int d = 0; d < x->ndim; d++)
        if (d != cd) {
            rshape[nr] = x->shape[d];
            rstr[nr] = x->strides[d];
            tstr[nr++] = t->ndim == x->ndim ? t->strides[d] : 0;
        }
    const tdd_tensor *w = (g->flags & 1u) ? c->in[2] : NULL;
    bool probs = (g->flags & 2u) != 0;
    double eps = c->op == TDD_OP_CROSS_ENTROPY ? g->f[0] : 0.0;
    for (int64_t i = 0; i < N; i++) {
        ref_unravel(i, rshape, nr, ridx);
        int64_t base = x->offset, tbase = t->offset;
        for (int k = 0; k < nr; k++) {
            base += ridx[k] * rstr[k];
            tbase += ridx[k] * tstr[k];
        }
        if (probs) { /* sum_k w_k q_k (lse - x_k), q smoothed; the mean is over rows */
            double v = 0, lse = row_lse(x, base, cs, C);
            for (int64_t k = 0; k < C; k++) {
                double q = (1 - eps) * ref_getf(t, tbase + k * cs) + eps / (double)C;
                double wk = w ? ref_getf(w, ref_index(w, k)) : 1.0;
                v += wk * q * (lse - ref_getf(x, base + k * cs));
            }
            loss_store(c, i, v, &total);
            count += 1;
            continue;
        }
        int64_t cls = ref_geti(t, ref_index(t, i));
        if (cls == g->i[1]) {
            loss_store(c, i, 0.0, &total);
            continue;
        }
        if (cls < 0 || cls >= C)
            return TD_EINVALID_ARGUMENT; /* target class out of range */
        double wt = w ? ref_getf(w, ref_index(w, cls)) : 1.0;
        double lse = 0, v;
        if (c->op == TDD_OP_CROSS_ENTROPY) {
            lse = row_lse(x, base, cs, C);
            v = wt * (lse - ref_getf(x, base + cls * cs));
            if (eps > 0) {
                double smooth = 0;
                for (int64_t k = 0; k < C; k++)
                    smooth += (w ? ref_getf(w, ref_index(w, k)) : 1.0) *
                              (lse - ref_getf(x, base + k * cs));
                v = (1 - eps) * v + eps * smooth / (double)C;
            }
        } else {
            v = -wt * ref_getf(x, base + cls * cs);
        }
        loss_store(c, i, v, &total);
        count += wt;
    }
    loss_finish(c, total, count);
    return 0;
}
