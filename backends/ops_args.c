/* ops_args.c -- what the shape and attribute rules (ops.c, ops_*.c) share: reading an op's
 * attributes against its schema (tdd_p_int & co.), broadcasting, the outputs' shapes, and
 * dtype promotion. Below the rules, which call down to it. */
#include "ops.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "dtype.h"
#include "ops_args.h"

const td_attr *tdd_attr_get(const tdd_attrs *as, const char *name)
{
    for (size_t i = 0; i < as->n; i++)
        if (as->a[i].name && strcmp(as->a[i].name, name) == 0)
            return &as->a[i];
    return NULL;
}

const td_attr *tdd_p_get(const tdd_prep *p, const char *name)
{
    if (tdd_attr_read_hook)
        tdd_attr_read_hook(p->op, name);
    return tdd_attr_get(&p->req->attrs, name);
}

/* ------------------------------------------------------------------ attributes */

const char *tdd_attr_kind_name(td_attr_kind k)
{
    switch (k) {
    case TD_ATTR_INT:
        return "int";
    case TD_ATTR_FLOAT:
        return "float";
    case TD_ATTR_BOOL:
        return "bool";
    case TD_ATTR_INTS:
        return "int list";
    case TD_ATTR_FLOATS:
        return "float list";
    case TD_ATTR_STR:
        return "string";
    }
    return "unknown";
}

int tdd_p_wrong_kind(const tdd_prep *p, const td_attr *a, const char *want)
{
    return tdd_err_arg(p->err, a->name, "%s: attribute %s must be %s, got %s", p->name, a->name,
                       want, tdd_attr_kind_name(a->kind));
}

int tdd_p_missing(const tdd_prep *p, const char *name)
{
    return tdd_err_arg(p->err, name, "%s: attribute %s is required", p->name, name);
}

int tdd_p_int(const tdd_prep *p, const char *name, int64_t def, int64_t *v)
{
    const td_attr *a = tdd_p_get(p, name);
    *v = def;
    if (!a)
        return 0;
    if (a->kind == TD_ATTR_INT)
        *v = a->i;
    else if (a->kind == TD_ATTR_BOOL)
        *v = a->b != 0;
    else if (a->kind == TD_ATTR_INTS && a->n == 1 && a->ints)
        *v = a->ints[0];
    else
        return tdd_p_wrong_kind(p, a, "an int");
    return 0;
}

int tdd_p_float(const tdd_prep *p, const char *name, double def, double *v)
{
    const td_attr *a = tdd_p_get(p, name);
    *v = def;
    if (!a)
        return 0;
    if (a->kind == TD_ATTR_FLOAT)
        *v = a->f;
    else if (a->kind == TD_ATTR_INT)
        *v = (double)a->i;
    else if (a->kind == TD_ATTR_BOOL)
        *v = a->b != 0;
    else
        return tdd_p_wrong_kind(p, a, "a number");
    return 0;
}

int tdd_p_bool(const tdd_prep *p, const char *name, bool def, bool *v)
{
    const td_attr *a = tdd_p_get(p, name);
    *v = def;
    if (!a)
        return 0;
    if (a->kind == TD_ATTR_BOOL)
        *v = a->b != 0;
    else if (a->kind == TD_ATTR_INT)
        *v = a->i != 0;
    else
        return tdd_p_wrong_kind(p, a, "a bool");
    return 0;
}

int tdd_p_str(const tdd_prep *p, const char *name, const char *def, const char **v)
{
    const td_attr *a = tdd_p_get(p, name);
    *v = def;
    if (!a)
        return 0;
    if (a->kind != TD_ATTR_STR || !a->s)
        return tdd_p_wrong_kind(p, a, "a string");
    *v = a->s;
    return 0;
}

int tdd_p_ints(const tdd_prep *p, const char *name, int64_t *v, int max, int *n)
{
    const td_attr *a = tdd_p_get(p, name);
    *n = -1;
    if (!a)
        return 0;
    if (a->kind == TD_ATTR_INT) {
        v[0] = a->i;
        *n = 1;
        return 0;
    }
    if (a->kind != TD_ATTR_INTS || (a->n && !a->ints))
        return tdd_p_wrong_kind(p, a, "an int list");
    if (a->n > (size_t)max)
        return tdd_err_arg(p->err, name, "%s: attribute %s has %zu entries, at most %d allowed",
                           p->name, name, a->n, max);
    for (size_t i = 0; i < a->n; i++)
        v[i] = a->ints[i];
    *n = (int)a->n;
    return 0;
}

int tdd_p_dim(const tdd_prep *p, const char *attr, int64_t d, int ndim, int *out)
{
    int64_t n = ndim > 0 ? ndim : 1;
    if (d < -n || d >= n)
        return tdd_err_arg(p->err, attr, "%s: %s %lld out of range for a %d-D tensor", p->name,
                           attr, (long long)d, ndim);
    *out = (int)(d < 0 ? d + n : d);
    return 0;
}

int tdd_p_bcast(const tdd_prep *p, const int64_t *a, int an, const int64_t *b, int bn, int64_t *o,
                int *on)
{
    int n = an > bn ? an : bn;
    for (int d = 0; d < n; d++) {
        int ad = d - (n - an), bd = d - (n - bn);
        int64_t x = ad < 0 ? 1 : a[ad], y = bd < 0 ? 1 : b[bd];
        if (x != y && x != 1 && y != 1)
            return tdd_err_shape(p->err, a, an, b, bn,
                                 "%s: shapes cannot broadcast (dim %d: %lld vs %lld)", p->name, d,
                                 (long long)x, (long long)y);
        o[d] = x == 1 ? y : x;
    }
    *on = n;
    return 0;
}

void tdd_p_out(tdd_prep *p, int k, td_dtype dt, const int64_t *shape, int ndim)
{
    tdd_outdesc *o = &p->out[k];
    memset(o, 0, sizeof *o);
    o->dtype = dt;
    o->ndim = ndim;
    if (ndim > 0)
        memcpy(o->shape, shape, (size_t)ndim * sizeof *shape);
    if (k + 1 > *p->n_out)
        *p->n_out = k + 1;
}

void tdd_p_view(tdd_prep *p, int k, int src, const int64_t *shape, const int64_t *strides, int ndim,
                int64_t offset)
{
    tdd_p_out(p, k, p->in[src]->dtype, shape, ndim);
    tdd_outdesc *o = &p->out[k];
    o->view = true;
    o->view_of = src;
    if (ndim > 0)
        memcpy(o->strides, strides, (size_t)ndim * sizeof *strides);
    o->offset = offset;
    p->args->out_view = true;
}

int tdd_p_unsupported(const tdd_prep *p, td_dtype dt)
{
    return tdd_err_set(p->err, TD_EUNSUPPORTED_DTYPE, "%s: dtype %s is not supported", p->name,
                       td_dtype_name(dt));
}

static td_dtype dtype_by_name(const char *s)
{
    static const struct {
        const char *name;
        td_dtype dt;
    } names[] = {{"float32", TD_F32}, {"float", TD_F32}, {"float64", TD_F64},   {"double", TD_F64},
                 {"float16", TD_F16}, {"half", TD_F16},  {"bfloat16", TD_BF16}, {"int32", TD_I32},
                 {"int", TD_I32},     {"int64", TD_I64}, {"long", TD_I64},      {"bool", TD_BOOL},
                 {"uint8", TD_U8},    {"int8", TD_I8},   {"int16", TD_I16},     {"short", TD_I16}};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (strcmp(names[i].name, s) == 0)
            return names[i].dt;
    return TD_DTYPE_INVALID;
}

int tdd_p_dtype(const tdd_prep *p, td_dtype def, td_dtype *out)
{
    *out = def;
    if (p->req->dtype != TD_DTYPE_INVALID) {
        if ((unsigned)p->req->dtype >= TD_DTYPE_COUNT)
            return tdd_err_arg(p->err, "dtype", "%s: unknown dtype %d", p->name,
                               (int)p->req->dtype);
        *out = p->req->dtype;
        return 0;
    }
    const char *s;
    int rc = tdd_p_str(p, "dtype", NULL, &s);
    if (rc || !s)
        return rc;
    *out = dtype_by_name(s);
    if (*out == TD_DTYPE_INVALID)
        return tdd_err_arg(p->err, "dtype", "%s: unknown dtype \"%s\"", p->name, s);
    return 0;
}

int tdd_p_shape(const tdd_prep *p, const char *name, int64_t *shape, int *ndim)
{
    int rc = tdd_p_ints(p, name, shape, TD_MAX_NDIM, ndim);
    if (rc)
        return rc;
    if (*ndim < 0)
        return tdd_p_missing(p, name);
    for (int d = 0; d < *ndim; d++)
        if (shape[d] < 0)
            return tdd_err_arg(p->err, name, "%s: %s[%d] = %lld is negative", p->name, name, d,
                               (long long)shape[d]);
    return 0;
}

int tdd_p_fits(const tdd_prep *p, const td_attr *a, td_dtype dt)
{
    if (!a || dt == TD_BOOL || (a->kind != TD_ATTR_INT && a->kind != TD_ATTR_FLOAT))
        return 0; /* bool holds anything (nonzero is true), as PyTorch's fill */
    if (tdd_dtype_is_float(dt)) {
        double lim = dt == TD_F16    ? 65504.0
                     : dt == TD_BF16 ? 0x1.fep127
                     : dt == TD_F32  ? FLT_MAX
                                     : DBL_MAX;
        if (a->kind == TD_ATTR_FLOAT && isfinite(a->f) && fabs(a->f) > lim)
            return tdd_err_arg(p->err, a->name, "%s: %s = %g does not fit in %s", p->name, a->name,
                               a->f, td_dtype_name(dt));
        return 0;
    }
    int64_t lo, hi;
    tdd_int_range(dt, &lo, &hi);
    if (a->kind == TD_ATTR_INT) {
        if (a->i < lo || a->i > hi)
            return tdd_err_arg(p->err, a->name, "%s: %s = %lld does not fit in %s", p->name,
                               a->name, (long long)a->i, td_dtype_name(dt));
        return 0;
    }
    /* [lo, hi] as doubles: lo is exact; hi + 1 is a power of two, exact too */
    if (!(a->f >= (double)lo && (dt != TD_I64 ? a->f <= (double)hi : a->f < -(double)lo)))
        return tdd_err_arg(p->err, a->name, "%s: %s = %g does not fit in %s", p->name, a->name,
                           a->f, td_dtype_name(dt));
    return 0;
}

/* ------------------------------------------------------------------ promotion */

static int fl_rank(td_dtype d)
{
    return d == TD_F64 ? 3 : d == TD_F32 ? 2 : 1; /* f16 and bf16 */
}

static int int_rank(td_dtype d)
{
    return d == TD_I64 ? 4 : d == TD_I32 ? 3 : d == TD_I16 ? 2 : 1; /* int8 */
}

void tdd_int_range(td_dtype dt, int64_t *lo, int64_t *hi)
{
    switch (dt) {
    case TD_U8:
        *lo = 0, *hi = UINT8_MAX;
        return;
    case TD_I8:
        *lo = INT8_MIN, *hi = INT8_MAX;
        return;
    case TD_I16:
        *lo = INT16_MIN, *hi = INT16_MAX;
        return;
    case TD_I32:
        *lo = INT32_MIN, *hi = INT32_MAX;
        return;
    case TD_BOOL:
        *lo = 0, *hi = 1;
        return;
    default:
        *lo = INT64_MIN, *hi = INT64_MAX;
        return;
    }
}

td_dtype tdd_promote(td_dtype a, td_dtype b)
{
    if (a == b || b == TD_DTYPE_INVALID)
        return a;
    if (a == TD_DTYPE_INVALID)
        return b;
    bool fa = tdd_dtype_is_float(a), fb = tdd_dtype_is_float(b);
    if (fa && fb) {
        if (fl_rank(a) == 1 && fl_rank(b) == 1)
            return TD_F32; /* f16 with bf16: neither holds the other */
        return fl_rank(a) >= fl_rank(b) ? a : b;
    }
    if (fa)
        return a;
    if (fb)
        return b;
    if (a == TD_BOOL || b == TD_BOOL)
        return a == TD_BOOL ? b : a;
    if (a == TD_U8 || b == TD_U8) { /* uint8 with int8 needs int16; the wider signed hold it */
        td_dtype o = a == TD_U8 ? b : a;
        return o == TD_I8 ? TD_I16 : o;
    }
    return int_rank(a) >= int_rank(b) ? a : b;
}

/* PyTorch's combine_categories: the lower-priority group (0-dim tensors,
 * then scalars) only matters when it is of a higher category. */
