/* ops.c -- tdd_op_prepare, the dispatch of an op's shape and attribute rules, with the
 * elementwise and reduction rules (views, indexing, NN and creation rules live in
 * ops_shape.c and ops_nn.c; the op table and attribute schema in ops_schema.c; the helpers
 * the rules share in ops_args.c; the error builders in common/tdd_err.c). */
#include "ops.h"

#include <float.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "dtype.h"
#include "ops_impl.h"
#include "td_error_set.h"

static td_dtype combine(td_dtype higher, td_dtype lower)
{
    if (higher == TD_DTYPE_INVALID)
        return lower;
    if (lower == TD_DTYPE_INVALID || tdd_dtype_is_float(higher))
        return higher;
    if (higher == TD_BOOL || tdd_dtype_is_float(lower))
        return tdd_promote(higher, lower);
    return higher;
}

static td_dtype result_type(const tdd_tensor *const *ts, int n, td_dtype scalar)
{
    td_dtype dim = TD_DTYPE_INVALID, zero = TD_DTYPE_INVALID;
    for (int i = 0; i < n; i++) {
        if (ts[i]->ndim > 0)
            dim = tdd_promote(dim, ts[i]->dtype);
        else
            zero = tdd_promote(zero, ts[i]->dtype);
    }
    return combine(dim, combine(zero, scalar));
}

/* ------------------------------------------------------------------ elementwise */

/* The output dtype of an elementwise op from its compute dtype *ct (the RULE column of
 * elementwise.h); a dtype the rule refuses is UNSUPPORTED_DTYPE. */
static int ew_out_dtype(tdd_prep *p, td_dtype *ct, td_dtype *out)
{
    bool fl = tdd_dtype_is_float(*ct);
    *out = *ct;
    switch (tdd_ew_rule(p->op)) {
    case TDD_EW_SAME:
        return *ct == TD_BOOL ? tdd_p_unsupported(p, *ct) : 0;
    case TDD_EW_SAMEB:
        return 0;
    case TDD_EW_FLOAT:
        if (!fl)
            *ct = *out = TD_F32; /* true division; integers take the default float dtype */
        return 0;
    case TDD_EW_FONLY:
        return fl ? 0 : tdd_p_unsupported(p, *ct);
    case TDD_EW_BOOL:
        *out = TD_BOOL;
        return 0;
    case TDD_EW_NONE:
        break;
    }
    return tdd_err_set(p->err, TD_EINTERNAL, "%s: not an elementwise expression", p->name);
}

static int prep_binary(tdd_prep *p)
{
    tdd_opargs *g = p->args;
    const tdd_tensor *a = p->in[0];
    int64_t shape[TD_MAX_NDIM];
    int ndim, rc;
    td_dtype ct;
    if (p->n_in == 2) {
        rc = tdd_p_bcast(p, a->shape, a->ndim, p->in[1]->shape, p->in[1]->ndim, shape, &ndim);
        if (rc)
            return rc;
        ct = result_type(p->in, 2, TD_DTYPE_INVALID);
    } else {
        const td_attr *o = tdd_p_get(p, "other");
        if (!o)
            return tdd_err_arg(p->err, "other", "%s: needs a second input or the attribute other",
                               p->name);
        td_dtype st;
        if (o->kind == TD_ATTR_FLOAT) {
            st = TD_F32; /* a Python float scalar takes the default dtype */
            g->f[0] = o->f;
            g->n[0] = tdd_sat_i64(o->f);
        } else if (o->kind == TD_ATTR_INT) {
            st = TD_I64;
            g->f[0] = (double)o->i;
            g->n[0] = o->i;
        } else if (o->kind == TD_ATTR_BOOL) {
            st = TD_BOOL;
            g->f[0] = o->b != 0;
            g->n[0] = o->b != 0;
        } else {
            return tdd_err_arg(p->err, "other", "%s: other must be a number, got %s", p->name,
                               tdd_attr_kind_name(o->kind));
        }
        g->scalar_form = true;
        ndim = a->ndim;
        memcpy(shape, a->shape, sizeof shape);
        ct = result_type(p->in, 1, st);
    }
    g->f[1] = 1.0;
    g->n[1] = 1;
    /* only add and sub take alpha (the schema check refuses it elsewhere) */
    const td_attr *al = p->op == TDD_OP_ADD || p->op == TDD_OP_SUB ? tdd_p_get(p, "alpha") : NULL;
    if (al) {
        if (al->kind == TD_ATTR_INT) {
            g->f[1] = (double)al->i;
            g->n[1] = al->i;
        } else if (al->kind == TD_ATTR_FLOAT) {
            if (!tdd_dtype_is_float(ct))
                return tdd_err_arg(p->err, "alpha",
                                   "%s: alpha must be an integer for integral inputs", p->name);
            g->f[1] = al->f;
        } else {
            return tdd_p_wrong_kind(p, al, "a number");
        }
    }
    td_dtype out;
    if ((rc = ew_out_dtype(p, &ct, &out)))
        return rc;
    g->cdtype = ct;
    g->dtype = out;
    tdd_p_out(p, 0, out, shape, ndim);
    return 0;
}

static int prep_element(tdd_prep *p)
{
    tdd_opargs *g = p->args;
    int64_t shape[TD_MAX_NDIM];
    int ndim, rc;
    switch (p->op) {
    case TDD_OP_WHERE: {
        const tdd_tensor *c = p->in[0];
        if (c->dtype != TD_BOOL)
            return tdd_err_dtypes(p->err, TD_BOOL, c->dtype,
                                  "where: condition must be bool, got %s", td_dtype_name(c->dtype));
        int64_t s2[TD_MAX_NDIM];
        int n2;
        rc = tdd_p_bcast(p, c->shape, c->ndim, p->in[1]->shape, p->in[1]->ndim, s2, &n2);
        if (!rc)
            rc = tdd_p_bcast(p, s2, n2, p->in[2]->shape, p->in[2]->ndim, shape, &ndim);
        if (rc)
            return rc;
        g->dtype = g->cdtype = result_type(p->in + 1, 2, TD_DTYPE_INVALID);
        break;
    }
    case TDD_OP_MASKED_FILL: {
        const tdd_tensor *x = p->in[0], *m = p->in[1];
        if (m->dtype != TD_BOOL)
            return tdd_err_dtypes(p->err, TD_BOOL, m->dtype,
                                  "masked_fill: mask must be bool, got %s",
                                  td_dtype_name(m->dtype));
        /* PyTorch's out-of-place form: input and mask broadcast together */
        rc = tdd_p_bcast(p, x->shape, x->ndim, m->shape, m->ndim, shape, &ndim);
        if (rc)
            return rc;
        const td_attr *v = tdd_p_get(p, "value");
        if (p->n_in == 3) { /* the value as a 0-d tensor, converted to the input's dtype */
            const tdd_tensor *vt = p->in[2];
            if (v)
                return tdd_err_arg(p->err, "value",
                                   "masked_fill: value is given both as an input and an attribute");
            if (vt->ndim != 0)
                return tdd_err_shape(p->err, NULL, 0, vt->shape, vt->ndim,
                                     "masked_fill: a value tensor must be 0-d, got %d-D", vt->ndim);
            g->dtype = g->cdtype = x->dtype;
            break;
        }
        if (!v)
            return tdd_p_missing(p, "value");
        if ((rc = tdd_p_float(p, "value", 0, &g->f[0])) || (rc = tdd_p_fits(p, v, x->dtype)))
            return rc;
        g->n[0] = v->kind == TD_ATTR_INT ? v->i : tdd_sat_i64(g->f[0]);
        if (x->dtype == TD_BOOL)
            g->n[0] = g->f[0] != 0.0; /* nonzero (NaN too) is true */
        g->dtype = g->cdtype = x->dtype;
        break;
    }
    case TDD_OP_RELU_BACKWARD:
        rc = tdd_p_bcast(p, p->in[0]->shape, p->in[0]->ndim, p->in[1]->shape, p->in[1]->ndim, shape,
                         &ndim);
        if (rc)
            return rc;
        g->dtype = g->cdtype = result_type(p->in, 2, TD_DTYPE_INVALID);
        if (g->dtype == TD_BOOL)
            return tdd_p_unsupported(p, g->dtype);
        break;
    default:
        return tdd_err_set(p->err, TD_EINTERNAL, "%s: not an elementwise op", p->name);
    }
    tdd_p_out(p, 0, g->dtype, shape, ndim);
    return 0;
}

/* clamp(input, min[, max]) with tensor bounds (PyTorch's Tensor overload): the three
 * broadcast and promote together; the kernels run minimum(maximum(input, min), max)
 * (tdd_clamp_by_tensors). */
static int prep_clamp_tensors(tdd_prep *p)
{
    tdd_opargs *g = p->args;
    int64_t shape[TD_MAX_NDIM], s2[TD_MAX_NDIM];
    int ndim = p->in[0]->ndim, n2, rc;
    const char *both = tdd_p_get(p, "min") ? "min" : tdd_p_get(p, "max") ? "max" : NULL;
    if (both)
        return tdd_err_arg(p->err, both, "clamp: bounds are given both as inputs and attributes");
    memcpy(shape, p->in[0]->shape, sizeof shape);
    for (int k = 1; k < p->n_in; k++) {
        rc = tdd_p_bcast(p, shape, ndim, p->in[k]->shape, p->in[k]->ndim, s2, &n2);
        if (rc)
            return rc;
        memcpy(shape, s2, sizeof shape);
        ndim = n2;
    }
    td_dtype ct = result_type(p->in, p->n_in, TD_DTYPE_INVALID);
    if (ct == TD_BOOL)
        return tdd_p_unsupported(p, ct);
    g->dtype = g->cdtype = ct;
    g->flags = p->n_in == 3 ? 3u : 1u;
    tdd_p_out(p, 0, ct, shape, ndim);
    return 0;
}

int tdd_max_by_parts(const tdd_opcall *c, tdd_run_fn run, void *ctx, int ordinal)
{
    bool mx = c->op == TDD_OP_MAX;
    tdd_opargs a = *c->args;
    tdd_opcall s = *c;
    s.args = &a;
    s.n_out = 1;
    s.op = mx ? TDD_OP_AMAX : TDD_OP_AMIN;
    a.dtype = a.cdtype = c->in[0]->dtype;
    int rc = run(ctx, ordinal, &s);
    if (rc)
        return rc;
    s.op = mx ? TDD_OP_ARGMAX : TDD_OP_ARGMIN;
    s.out[0] = c->out[1];
    a.dtype = TD_I64;
    if (c->in[0]->dtype == TD_BOOL) { /* argmax takes no bool: its uint8 bytes order the same */
        tdd_tensor u = *c->in[0];
        u.dtype = TD_U8;
        s.in[0] = &u;
        a.cdtype = TD_U8;
        return run(ctx, ordinal, &s);
    }
    return run(ctx, ordinal, &s);
}

int tdd_addmm_by_parts(const tdd_opcall *c, tdd_run_fn run, void *ctx, int ordinal)
{
    const tdd_opargs *g = c->args;
    tdd_opcall s = *c;
    s.op = c->op == TDD_OP_ADDMM ? TDD_OP_MATMUL : TDD_OP_BMM;
    s.n_in = 2;
    s.in[0] = c->in[1];
    s.in[1] = c->in[2];
    int rc = run(ctx, ordinal, &s); /* the product, into the output */
    tdd_opargs e;
    memset(&e, 0, sizeof e);
    e.dtype = e.cdtype = g->dtype;
    e.f[1] = 1.0;
    e.n[1] = 1;
    s.args = &e;
    s.in[0] = c->out[0];
    if (!rc && (g->f[3] != 1.0 || g->n[3] != 1)) { /* times alpha, in place */
        e.scalar_form = true;
        e.f[0] = g->f[3];
        e.n[0] = g->n[3];
        s.op = TDD_OP_MUL;
        s.n_in = 1;
        rc = run(ctx, ordinal, &s);
        e.scalar_form = false;
        e.f[0] = 0;
        e.n[0] = 0;
    }
    if (!rc && (g->f[2] != 0.0 || g->n[2] != 0)) { /* + beta * input (beta 0: input unread) */
        e.f[1] = g->f[2];
        e.n[1] = g->n[2];
        s.op = TDD_OP_ADD;
        s.n_in = 2;
        s.in[1] = c->in[0];
        rc = run(ctx, ordinal, &s);
    }
    return rc;
}

int tdd_clamp_by_tensors(const tdd_opcall *c, tdd_run_fn run, void *ctx, int ordinal)
{
    tdd_opargs a = *c->args;
    a.scalar_form = false;
    a.flags = 0;
    a.f[1] = 1.0;
    a.n[1] = 1;
    tdd_opcall s = *c;
    s.args = &a;
    s.op = TDD_OP_MAXIMUM;
    s.n_in = 2;
    int rc = run(ctx, ordinal, &s);
    if (rc || c->n_in < 3)
        return rc;
    s.op = TDD_OP_MINIMUM; /* in place: each element reads only its own */
    s.in[0] = c->out[0];
    s.in[1] = c->in[2];
    return run(ctx, ordinal, &s);
}

/* The composite column, indexed by op (clamp only in its tensor-bounds form). */
static const tdd_composite_fn composites[TDD_OP_COUNT] = {
    [TDD_OP_CLAMP] = tdd_clamp_by_tensors,     [TDD_OP_ADDMM] = tdd_addmm_by_parts,
    [TDD_OP_BADDBMM] = tdd_addmm_by_parts,     [TDD_OP_MAX] = tdd_max_by_parts,
    [TDD_OP_MIN] = tdd_max_by_parts,           [TDD_OP_CONV1D] = tdd_conv1d_by_parts,
    [TDD_OP_MAX_POOL1D] = tdd_pool1d_by_parts, [TDD_OP_AVG_POOL1D] = tdd_pool1d_by_parts,
};

tdd_composite_fn tdd_op_composite(const tdd_opcall *c)
{
    if ((unsigned)c->op >= TDD_OP_COUNT || (c->op == TDD_OP_CLAMP && c->n_in < 2))
        return NULL;
    return composites[c->op];
}

static int prep_unary(tdd_prep *p)
{
    tdd_opargs *g = p->args;
    const tdd_tensor *a = p->in[0];
    td_dtype dt = a->dtype, ct = dt, out;
    bool fl = tdd_dtype_is_float(dt);
    int rc = ew_out_dtype(p, &ct, &out);
    if (rc)
        return rc;
    switch (p->op) { /* the attributes, for the ops that take any */
    case TDD_OP_LEAKY_RELU:
        rc = tdd_p_float(p, "negative_slope", 0.01, &g->f[0]);
        break;
    case TDD_OP_GELU: {
        const char *s;
        if ((rc = tdd_p_str(p, "approximate", "none", &s)))
            return rc;
        if (strcmp(s, "none") == 0)
            g->i[0] = 0;
        else if (strcmp(s, "tanh") == 0)
            g->i[0] = 1;
        else
            return tdd_err_arg(p->err, "approximate",
                               "gelu: approximate must be \"none\" or \"tanh\", got \"%s\"", s);
        break;
    }
    case TDD_OP_SOFTPLUS:
        if ((rc = tdd_p_float(p, "beta", 1.0, &g->f[0])))
            return rc;
        if ((rc = tdd_p_float(p, "threshold", 20.0, &g->f[1])))
            return rc;
        if (g->f[0] == 0.0)
            return tdd_err_arg(p->err, "beta", "softplus: beta must not be 0");
        break;
    case TDD_OP_CLAMP: {
        const td_attr *mn = tdd_p_get(p, "min");
        const td_attr *mx = tdd_p_get(p, "max");
        if (!mn && !mx)
            return tdd_err_arg(p->err, "min", "clamp: at least one of min and max is required");
        if (mn) {
            if ((rc = tdd_p_float(p, "min", 0, &g->f[0])))
                return rc;
            g->n[0] = mn->kind == TD_ATTR_INT ? mn->i : tdd_sat_i64(g->f[0]);
            g->flags |= 1u;
            if (!fl && mn->kind == TD_ATTR_FLOAT)
                out = TD_F32;
        }
        if (mx) {
            if ((rc = tdd_p_float(p, "max", 0, &g->f[1])))
                return rc;
            g->n[1] = mx->kind == TD_ATTR_INT ? mx->i : tdd_sat_i64(g->f[1]);
            g->flags |= 2u;
            if (!fl && mx->kind == TD_ATTR_FLOAT)
                out = TD_F32;
        }
        /* PyTorch: min(max(x, min), max) -- min > max gives max; a NaN bound gives NaN
         * (the kernels' rule); a bound the output dtype cannot hold is refused */
        if ((rc = tdd_p_fits(p, mn, out)) || (rc = tdd_p_fits(p, mx, out)))
            return rc;
        /* an absent bound is the infinite one: the kernels' expression takes both */
        if (!mn) {
            g->f[0] = -INFINITY;
            g->n[0] = INT64_MIN;
        }
        if (!mx) {
            g->f[1] = INFINITY;
            g->n[1] = INT64_MAX;
        }
        break;
    }
    default:
        break;
    }
    if (rc)
        return rc;
    g->dtype = out;
    g->cdtype = out == TD_BOOL ? dt : out;
    tdd_p_out(p, 0, out, a->shape, a->ndim);
    return 0;
}

/* ------------------------------------------------------------------ reductions */

/* Reads "dim" (absent or empty = all dims) into a mask. */
static int reduce_mask(tdd_prep *p, const tdd_tensor *a, uint32_t *mask)
{
    int64_t dims[TD_MAX_NDIM];
    int n, rc = tdd_p_ints(p, "dim", dims, TD_MAX_NDIM, &n);
    if (rc)
        return rc;
    if (n <= 0) {
        *mask = (uint32_t)((1u << a->ndim) - 1u);
        return 0;
    }
    *mask = 0;
    for (int k = 0; k < n; k++) {
        int d;
        if ((rc = tdd_p_dim(p, "dim", dims[k], a->ndim, &d)))
            return rc;
        if (a->ndim == 0)
            continue; /* a 0-dim tensor reduces over its one element */
        if (*mask & (1u << d))
            return tdd_err_arg(p->err, "dim", "%s: dim %d appears twice", p->name, d);
        *mask |= 1u << d;
    }
    return 0;
}

/* Output shape of reducing a over mask. */
static void reduce_shape(const tdd_tensor *a, uint32_t mask, bool keepdim, int64_t *shape,
                         int *ndim, int64_t *count)
{
    *ndim = 0;
    *count = 1;
    for (int d = 0; d < a->ndim; d++) {
        if (mask & (1u << d)) {
            *count *= a->shape[d];
            if (keepdim)
                shape[(*ndim)++] = 1;
        } else {
            shape[(*ndim)++] = a->shape[d];
        }
    }
}

static int prep_reduce(tdd_prep *p)
{
    tdd_opargs *g = p->args;
    const tdd_tensor *a = p->in[0];
    td_dtype dt = a->dtype, out = dt;
    bool fl = tdd_dtype_is_float(dt);
    int64_t shape[TD_MAX_NDIM], count;
    int ndim, rc;
    bool keepdim = false;
    /* cumsum, softmax, log_softmax and sum_to take no keepdim */
    if (p->op != TDD_OP_CUMSUM && p->op != TDD_OP_SOFTMAX && p->op != TDD_OP_LOG_SOFTMAX &&
        p->op != TDD_OP_SUM_TO && (rc = tdd_p_bool(p, "keepdim", false, &keepdim)))
        return rc;
    g->keepdim = keepdim;
    switch (p->op) {
    case TDD_OP_CUMSUM:
    case TDD_OP_SOFTMAX:
    case TDD_OP_LOG_SOFTMAX: {
        int64_t dv;
        int d;
        if (!tdd_p_get(p, "dim"))
            return tdd_p_missing(p, "dim");
        if ((rc = tdd_p_int(p, "dim", 0, &dv)) || (rc = tdd_p_dim(p, "dim", dv, a->ndim, &d)))
            return rc;
        g->i[0] = d;
        if (p->op == TDD_OP_CUMSUM) {
            if (!fl)
                out = TD_I64;
        } else if (!fl) {
            return tdd_p_unsupported(p, dt);
        }
        g->dtype = out;
        tdd_p_out(p, 0, out, a->shape, a->ndim);
        return 0;
    }
    case TDD_OP_SUM_TO: {
        int64_t ts[TD_MAX_NDIM];
        int tn;
        if ((rc = tdd_p_shape(p, "shape", ts, &tn)))
            return rc;
        if (tn > a->ndim)
            return tdd_err_shape(p->err, ts, tn, a->shape, a->ndim,
                                 "sum_to: target has more dims than the input");
        uint32_t mask = 0;
        int lead = a->ndim - tn;
        for (int d = 0; d < a->ndim; d++) {
            if (d < lead) {
                mask |= 1u << d;
                continue;
            }
            int64_t t = ts[d - lead];
            if (t == a->shape[d])
                continue;
            if (t != 1)
                return tdd_err_shape(p->err, ts, tn, a->shape, a->ndim,
                                     "sum_to: input does not broadcast from the target shape");
            mask |= 1u << d;
        }
        g->dims_mask = mask;
        g->dtype = g->cdtype = dt;
        tdd_p_out(p, 0, dt, ts, tn);
        return 0;
    }
    case TDD_OP_MAX: /* max/min(dim): amax/amin and argmax/argmin together */
    case TDD_OP_MIN:
        if (!tdd_p_get(p, "dim"))
            return tdd_p_missing(p, "dim");
        /* fall through */
    case TDD_OP_ARGMAX:
    case TDD_OP_ARGMIN: {
        bool two = p->op == TDD_OP_MAX || p->op == TDD_OP_MIN;
        if (dt == TD_BOOL && !two)
            return tdd_p_unsupported(p, dt);
        const td_attr *da = tdd_p_get(p, "dim");
        if (!da) {
            g->dims_mask = (uint32_t)((1u << a->ndim) - 1u);
            g->i[0] = -1;
        } else {
            int64_t dv;
            int d;
            if ((rc = tdd_p_int(p, "dim", 0, &dv)) || (rc = tdd_p_dim(p, "dim", dv, a->ndim, &d)))
                return rc;
            g->dims_mask = a->ndim ? 1u << d : 0;
            g->i[0] = d;
        }
        reduce_shape(a, g->dims_mask, keepdim, shape, &ndim, &count);
        if (count == 0)
            return tdd_err_arg(p->err, "dim", "%s: cannot reduce over a zero-size dimension",
                               p->name);
        g->i[1] = count;
        g->dtype = two ? dt : TD_I64;
        g->cdtype = dt;
        tdd_p_out(p, 0, g->dtype, shape, ndim);
        if (two)
            tdd_p_out(p, 1, TD_I64, shape, ndim);
        return 0;
    }
    case TDD_OP_SUM:
    case TDD_OP_PROD:
        if (!fl)
            out = TD_I64;
        break;
    case TDD_OP_MEAN:
    case TDD_OP_VAR:
    case TDD_OP_STD:
        if (!fl)
            return tdd_p_unsupported(p, dt);
        break;
    case TDD_OP_LOGSUMEXP:
        if (!fl)
            out = TD_F32;
        break;
    case TDD_OP_AMAX:
    case TDD_OP_AMIN:
        break;
    default:
        return tdd_err_set(p->err, TD_EINTERNAL, "%s: not a reduction", p->name);
    }
    if ((rc = reduce_mask(p, a, &g->dims_mask)))
        return rc;
    reduce_shape(a, g->dims_mask, keepdim, shape, &ndim, &count);
    if ((p->op == TDD_OP_AMAX || p->op == TDD_OP_AMIN) && count == 0)
        return tdd_err_arg(p->err, "dim", "%s: cannot reduce over a zero-size dimension", p->name);
    if (p->op == TDD_OP_VAR || p->op == TDD_OP_STD) {
        bool unbiased;
        if ((rc = tdd_p_bool(p, "unbiased", true, &unbiased)) ||
            (rc = tdd_p_float(p, "correction", unbiased ? 1.0 : 0.0, &g->f[0])))
            return rc;
    }
    g->i[1] = count;
    g->dtype = out;
    g->cdtype = out;
    tdd_p_out(p, 0, out, shape, ndim);
    return 0;
}

/* ------------------------------------------------------------------ schema check */

/* Whether an attribute of kind k is read by the reader of type t (ops_args.h's readers). */
static bool type_accepts(tdd_attrtype t, const td_attr *a)
{
    switch (t) {
    case TDD_AT_INT:
        return a->kind == TD_ATTR_INT || a->kind == TD_ATTR_BOOL ||
               (a->kind == TD_ATTR_INTS && a->n == 1 && a->ints);
    case TDD_AT_NUM:
        return a->kind == TD_ATTR_FLOAT || a->kind == TD_ATTR_INT || a->kind == TD_ATTR_BOOL;
    case TDD_AT_BOOL:
        return a->kind == TD_ATTR_BOOL || a->kind == TD_ATTR_INT;
    case TDD_AT_INT_OR_INTS:
    case TDD_AT_INTS:
        return a->kind == TD_ATTR_INT || (a->kind == TD_ATTR_INTS && (a->n == 0 || a->ints));
    case TDD_AT_FLOATS:
        return a->kind == TD_ATTR_FLOATS && (a->n == 0 || a->floats);
    case TDD_AT_STR:
        return a->kind == TD_ATTR_STR && a->s;
    case TDD_AT_INTS_OR_STR:
        return a->kind == TD_ATTR_INT || (a->kind == TD_ATTR_INTS && (a->n == 0 || a->ints)) ||
               (a->kind == TD_ATTR_STR && a->s);
    }
    return false;
}

/* "a, b, c" (or "none") into buf. */
static void accepted_names(tdd_op op, char *buf, size_t len)
{
    const tdd_opschema *s = &tdd_op_schema[op];
    size_t at = 0;
    buf[0] = 0;
    if (s->n_attrs == 0)
        snprintf(buf, len, "none");
    for (int i = 0; i < s->n_attrs && at < len; i++) {
        int w = snprintf(buf + at, len - at, "%s%s", i ? ", " : "", s->attrs[i].name);
        if (w < 0)
            break;
        at += (size_t)w;
    }
}

/* Every attribute of the request against the op's schema, before any op rule runs: an
 * attribute the op does not take, one of a type its reader would refuse, or one named
 * twice is INVALID_ARGUMENT naming it. */
static int check_attrs(const tdd_prep *p)
{
    const tdd_attrs *as = &p->req->attrs;
    if (as->n && !as->a)
        return tdd_err_arg(p->err, "attrs", "%s: malformed attribute list", p->name);
    for (size_t i = 0; i < as->n; i++) {
        const td_attr *a = &as->a[i];
        if (!a->name || !a->name[0])
            return tdd_err_arg(p->err, "attrs", "%s: attribute %zu has no name", p->name, i);
        const tdd_attrdef *d = tdd_op_attr(p->op, a->name);
        if (!d) {
            char acc[200];
            accepted_names(p->op, acc, sizeof acc);
            return tdd_err_arg(p->err, a->name, "%s takes no attribute '%.64s' (accepts: %s)",
                               p->name, a->name, acc);
        }
        for (size_t j = 0; j < i; j++)
            if (strcmp(as->a[j].name, a->name) == 0)
                return tdd_err_arg(p->err, a->name, "%s: attribute '%.64s' is given twice", p->name,
                                   a->name);
        if (!type_accepts(d->type, a))
            return tdd_err_arg(p->err, a->name, "%s: attribute '%s' must be %s, got %s", p->name,
                               d->name, tdd_attrtype_name(d->type), tdd_attr_kind_name(a->kind));
    }
    return 0;
}

/* ------------------------------------------------------------------ dispatch */

int tdd_op_prepare(tdd_op op, const tdd_tensor *const *in, int n_in, const tdd_opreq *req,
                   int64_t max_numel, tdd_opargs *args, tdd_outdesc *out, int *n_out, td_error *err)
{
    memset(args, 0, sizeof *args);
    *n_out = 0;
    if ((unsigned)op >= TDD_OP_COUNT)
        return tdd_err_set(err, TD_EUNSUPPORTED_OP, "no such op (%d)", (int)op);
    const tdd_opdef *d = &tdd_opdefs[op];
    if (n_in < d->min_inputs || n_in > d->max_inputs) {
        if (d->min_inputs == d->max_inputs)
            return tdd_err_set(err, TD_EINVALID_ARGUMENT, "%s takes %d input(s), got %d", d->name,
                               d->min_inputs, n_in);
        return tdd_err_set(err, TD_EINVALID_ARGUMENT, "%s takes %d to %d inputs, got %d", d->name,
                           d->min_inputs, d->max_inputs, n_in);
    }
    for (int i = 0; i < n_in; i++) {
        const tdd_tensor *t = in[i];
        if (!t || t->dtype <= TD_DTYPE_INVALID || t->dtype >= TD_DTYPE_COUNT || t->ndim < 0 ||
            t->ndim > TD_MAX_NDIM)
            return tdd_err_set(err, TD_EINVALID_ARGUMENT, "%s: input %d is malformed", d->name, i);
    }
    static const tdd_opreq noreq;
    tdd_prep p = {.op = op,
                  .name = d->name,
                  .in = in,
                  .n_in = n_in,
                  .req = req ? req : &noreq,
                  .args = args,
                  .out = out,
                  .n_out = n_out,
                  .max_numel = max_numel,
                  .err = err};
    args->seed = p.req->seed;
    args->dtype = n_in > 0 ? in[0]->dtype : TD_F32;
    args->cdtype = args->dtype;
    int rc = check_attrs(&p);
    if (rc)
        return rc;
    switch (d->kind) {
    case TDD_KIND_BINARY:
        rc = prep_binary(&p);
        break;
    case TDD_KIND_UNARY:
        rc = op == TDD_OP_CLAMP && n_in > 1 ? prep_clamp_tensors(&p) : prep_unary(&p);
        break;
    case TDD_KIND_ELEMENT:
        rc = prep_element(&p);
        break;
    case TDD_KIND_REDUCE:
        rc = prep_reduce(&p);
        break;
    case TDD_KIND_VIEW:
    case TDD_KIND_INDEX:
        rc = tdd_prep_shape(&p);
        break;
    case TDD_KIND_LINALG:
    case TDD_KIND_NN:
        rc = tdd_prep_nn(&p);
        break;
    case TDD_KIND_CREATE:
        rc = tdd_prep_create(&p);
        break;
    }
    if (rc)
        return rc;
    for (int i = 0; i < *n_out; i++)
        if (tdd_shape_numel(out[i].shape, out[i].ndim, max_numel) < 0)
            return tdd_err_set(err, TD_ERESOURCE_EXHAUSTED,
                               "%s: output %d has more than %lld elements", d->name, i,
                               (long long)max_numel);
    return 0;
}

const char *tdd_opkind_name(tdd_opkind k)
{
    switch (k) {
    case TDD_KIND_BINARY:
        return "binary";
    case TDD_KIND_UNARY:
        return "unary";
    case TDD_KIND_ELEMENT:
        return "elementwise";
    case TDD_KIND_REDUCE:
        return "reduction";
    case TDD_KIND_LINALG:
        return "linalg";
    case TDD_KIND_VIEW:
        return "view";
    case TDD_KIND_INDEX:
        return "indexing";
    case TDD_KIND_NN:
        return "nn";
    case TDD_KIND_CREATE:
        return "creation";
    }
    return "?";
}
