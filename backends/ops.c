/* ops.c -- the op table, attribute and error helpers, dtype promotion, and
 * tdd_op_prepare with the elementwise and reduction rules (views, indexing,
 * NN and creation rules live in ops_shape.c and ops_nn.c). */
#include "ops.h"

#include <float.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "dtype.h"
#include "ops_impl.h"

const tdd_opdef tdd_opdefs[TDD_OP_COUNT] = {
#define TDD__OP_DEF(e, nm, lo, hi, kind) [TDD_OP_##e] = {TDD_OP_##e, nm, lo, hi, TDD_KIND_##kind},
    TDD_OPS(TDD__OP_DEF)
#undef TDD__OP_DEF
};

#define CMP_ATTRS "other:f"
#define RED_ATTRS "dim:i keepdim:b"
const char *const tdd_op_attr_bounds[TDD_OP_COUNT] = {
    [TDD_OP_ADD] = "other:f alpha:f",
    [TDD_OP_SUB] = "other:f alpha:f",
    [TDD_OP_MUL] = CMP_ATTRS,
    [TDD_OP_DIV] = CMP_ATTRS,
    [TDD_OP_POW] = CMP_ATTRS,
    [TDD_OP_MAXIMUM] = CMP_ATTRS,
    [TDD_OP_MINIMUM] = CMP_ATTRS,
    [TDD_OP_REMAINDER] = CMP_ATTRS,
    [TDD_OP_EQ] = CMP_ATTRS,
    [TDD_OP_NE] = CMP_ATTRS,
    [TDD_OP_LT] = CMP_ATTRS,
    [TDD_OP_LE] = CMP_ATTRS,
    [TDD_OP_GT] = CMP_ATTRS,
    [TDD_OP_GE] = CMP_ATTRS,
    [TDD_OP_LOGICAL_AND] = CMP_ATTRS,
    [TDD_OP_LOGICAL_OR] = CMP_ATTRS,
    [TDD_OP_LOGICAL_XOR] = CMP_ATTRS,
    [TDD_OP_MASKED_FILL] = "value:f",
    [TDD_OP_LEAKY_RELU] = "negative_slope:f",
    [TDD_OP_SOFTPLUS] = "beta:f threshold:f",
    [TDD_OP_CLAMP] = "min:f max:f min<=max",
    [TDD_OP_SUM] = RED_ATTRS,
    [TDD_OP_MEAN] = RED_ATTRS,
    [TDD_OP_AMAX] = RED_ATTRS,
    [TDD_OP_AMIN] = RED_ATTRS,
    [TDD_OP_ARGMAX] = RED_ATTRS,
    [TDD_OP_ARGMIN] = RED_ATTRS,
    [TDD_OP_VAR] = RED_ATTRS " correction:f",
    [TDD_OP_STD] = RED_ATTRS " correction:f",
    [TDD_OP_LOGSUMEXP] = RED_ATTRS,
    [TDD_OP_PROD] = RED_ATTRS,
    [TDD_OP_CUMSUM] = "dim:i",
    [TDD_OP_SOFTMAX] = "dim:i",
    [TDD_OP_LOG_SOFTMAX] = "dim:i",
    [TDD_OP_TRANSPOSE] = "dim0:i dim1:i",
    [TDD_OP_FLATTEN] = "start_dim:i end_dim:i",
    [TDD_OP_SQUEEZE] = "dim:i",
    [TDD_OP_UNSQUEEZE] = "dim:i",
    [TDD_OP_SLICE] = "dim:i start:i stop:i step:i start<=stop",
    [TDD_OP_SPLIT] = "split_size:i dim:i",
    [TDD_OP_CHUNK] = "chunks:i dim:i",
    [TDD_OP_CAT] = "dim:i",
    [TDD_OP_STACK] = "dim:i",
    [TDD_OP_GATHER] = "dim:i",
    [TDD_OP_SCATTER_ADD] = "dim:i",
    [TDD_OP_INDEX_SELECT] = "dim:i",
    [TDD_OP_ONE_HOT] = "num_classes:i",
    [TDD_OP_TRIL] = "diagonal:i",
    [TDD_OP_TRIU] = "diagonal:i",
    [TDD_OP_PAD] = "value:f",
    [TDD_OP_CROSS_ENTROPY] = "ignore_index:i label_smoothing:f",
    [TDD_OP_NLL_LOSS] = "ignore_index:i",
    [TDD_OP_LAYER_NORM] = "eps:f",
    [TDD_OP_DROPOUT] = "p:f train:b",
    [TDD_OP_CONV2D] = "stride:i padding:i dilation:i groups:i",
    [TDD_OP_MAX_POOL2D] = "kernel_size:i stride:i padding:i dilation:i ceil_mode:b",
    [TDD_OP_AVG_POOL2D] = "kernel_size:i stride:i padding:i ceil_mode:b count_include_pad:b",
    [TDD_OP_FULL] = "value:f",
    [TDD_OP_ARANGE] = "start:f end:f step:f",
    [TDD_OP_LINSPACE] = "start:f end:f steps:i",
    [TDD_OP_EYE] = "n:i m:i",
    [TDD_OP_RANDINT] = "low:i high:i low<=high",
};
#undef CMP_ATTRS
#undef RED_ATTRS

/* Name lookup is on every op request: a hash of the name into a table built
 * once (a linear strcmp scan over ~100 names showed in profiles). */
#define OP_SLOTS 512 /* a power of two, > 2x TDD_OP_COUNT */
_Static_assert(OP_SLOTS > 2 * TDD_OP_COUNT, "op name table too small");

static uint32_t name_hash(const char *s)
{
    uint32_t h = 2166136261u; /* FNV-1a */
    while (*s)
        h = (h ^ (uint8_t)*s++) * 16777619u;
    return h;
}

static const tdd_opdef *op_slots[OP_SLOTS];
static pthread_once_t op_slots_once = PTHREAD_ONCE_INIT;

static void op_slots_build(void)
{
    for (int i = 0; i < TDD_OP_COUNT; i++) {
        uint32_t j = name_hash(tdd_opdefs[i].name) & (OP_SLOTS - 1);
        while (op_slots[j])
            j = (j + 1) & (OP_SLOTS - 1);
        op_slots[j] = &tdd_opdefs[i];
    }
}

const tdd_opdef *tdd_op_find(const char *name)
{
    if (!name)
        return NULL;
    pthread_once(&op_slots_once, op_slots_build);
    for (uint32_t j = name_hash(name) & (OP_SLOTS - 1); op_slots[j]; j = (j + 1) & (OP_SLOTS - 1))
        if (strcmp(op_slots[j]->name, name) == 0)
            return op_slots[j];
    return NULL;
}

const td_attr *tdd_attr_get(const tdd_attrs *as, const char *name)
{
    for (size_t i = 0; i < as->n; i++)
        if (as->a[i].name && strcmp(as->a[i].name, name) == 0)
            return &as->a[i];
    return NULL;
}

/* ------------------------------------------------------------------ errors */

__attribute__((format(printf, 3, 0))) static void err_start(td_error *err, int code,
                                                            const char *fmt, va_list ap)
{
    memset(err, 0, sizeof *err);
    err->code = code;
    vsnprintf(err->message, sizeof err->message, fmt, ap);
}

int tdd_err_set(td_error *err, int code, const char *fmt, ...)
{
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        err_start(err, code, fmt, ap);
        va_end(ap);
    }
    return code;
}

int tdd_err_shape(td_error *err, const int64_t *expected, int en, const int64_t *got, int gn,
                  const char *fmt, ...)
{
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        err_start(err, TD_ESHAPE_MISMATCH, fmt, ap);
        va_end(ap);
        err->detail_kind = TD_DETAIL_SHAPES;
        err->detail.shapes.expected_ndim = en;
        err->detail.shapes.got_ndim = gn;
        if (en > 0)
            memcpy(err->detail.shapes.expected, expected, (size_t)en * sizeof *expected);
        if (gn > 0)
            memcpy(err->detail.shapes.got, got, (size_t)gn * sizeof *got);
    }
    return TD_ESHAPE_MISMATCH;
}

int tdd_err_arg(td_error *err, const char *argument, const char *fmt, ...)
{
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        err_start(err, TD_EINVALID_ARGUMENT, fmt, ap);
        va_end(ap);
        err->detail_kind = TD_DETAIL_ARGUMENT;
        snprintf(err->detail.argument.argument, sizeof err->detail.argument.argument, "%s",
                 argument);
    }
    return TD_EINVALID_ARGUMENT;
}

int tdd_err_resource(td_error *err, const char *resource, uint64_t requested, uint64_t available,
                     const char *fmt, ...)
{
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        err_start(err, TD_ERESOURCE_EXHAUSTED, fmt, ap);
        va_end(ap);
        err->detail_kind = TD_DETAIL_RESOURCE;
        snprintf(err->detail.resource.resource, sizeof err->detail.resource.resource, "%s",
                 resource);
        err->detail.resource.requested = requested;
        err->detail.resource.available = available;
    }
    return TD_ERESOURCE_EXHAUSTED;
}

int tdd_err_dtypes(td_error *err, td_dtype expected, td_dtype got, const char *fmt, ...)
{
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        err_start(err, TD_EDTYPE_MISMATCH, fmt, ap);
        va_end(ap);
        err->detail_kind = TD_DETAIL_DTYPES;
        err->detail.dtypes.target = expected;
        err->detail.dtypes.grad = got;
    }
    return TD_EDTYPE_MISMATCH;
}

/* ------------------------------------------------------------------ attributes */

static const char *kind_name(td_attr_kind k)
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

static int wrong_kind(const tdd_prep *p, const td_attr *a, const char *want)
{
    return tdd_err_arg(p->err, a->name, "%s: attribute %s must be %s, got %s", p->name, a->name,
                       want, kind_name(a->kind));
}

int tdd_p_missing(const tdd_prep *p, const char *name)
{
    return tdd_err_arg(p->err, name, "%s: attribute %s is required", p->name, name);
}

int tdd_p_int(const tdd_prep *p, const char *name, int64_t def, int64_t *v)
{
    const td_attr *a = tdd_attr_get(&p->req->attrs, name);
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
        return wrong_kind(p, a, "an int");
    return 0;
}

int tdd_p_float(const tdd_prep *p, const char *name, double def, double *v)
{
    const td_attr *a = tdd_attr_get(&p->req->attrs, name);
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
        return wrong_kind(p, a, "a number");
    return 0;
}

int tdd_p_bool(const tdd_prep *p, const char *name, bool def, bool *v)
{
    const td_attr *a = tdd_attr_get(&p->req->attrs, name);
    *v = def;
    if (!a)
        return 0;
    if (a->kind == TD_ATTR_BOOL)
        *v = a->b != 0;
    else if (a->kind == TD_ATTR_INT)
        *v = a->i != 0;
    else
        return wrong_kind(p, a, "a bool");
    return 0;
}

int tdd_p_str(const tdd_prep *p, const char *name, const char *def, const char **v)
{
    const td_attr *a = tdd_attr_get(&p->req->attrs, name);
    *v = def;
    if (!a)
        return 0;
    if (a->kind != TD_ATTR_STR || !a->s)
        return wrong_kind(p, a, "a string");
    *v = a->s;
    return 0;
}

int tdd_p_ints(const tdd_prep *p, const char *name, int64_t *v, int max, int *n)
{
    const td_attr *a = tdd_attr_get(&p->req->attrs, name);
    *n = -1;
    if (!a)
        return 0;
    if (a->kind == TD_ATTR_INT) {
        v[0] = a->i;
        *n = 1;
        return 0;
    }
    if (a->kind != TD_ATTR_INTS || (a->n && !a->ints))
        return wrong_kind(p, a, "an int list");
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
                 {"int", TD_I32},     {"int64", TD_I64}, {"long", TD_I64},      {"bool", TD_BOOL}};
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
    int64_t lo = dt == TD_I32 ? INT32_MIN : INT64_MIN, hi = dt == TD_I32 ? INT32_MAX : INT64_MAX;
    if (a->kind == TD_ATTR_INT) {
        if (a->i < lo || a->i > hi)
            return tdd_err_arg(p->err, a->name, "%s: %s = %lld does not fit in %s", p->name,
                               a->name, (long long)a->i, td_dtype_name(dt));
        return 0;
    }
    /* [lo, hi] as doubles: lo is exact; hi + 1 is a power of two, exact too */
    if (!(a->f >= (double)lo && (dt == TD_I32 ? a->f <= (double)hi : a->f < -(double)lo)))
        return tdd_err_arg(p->err, a->name, "%s: %s = %g does not fit in %s", p->name, a->name,
                           a->f, td_dtype_name(dt));
    return 0;
}

/* ------------------------------------------------------------------ promotion */

static int fl_rank(td_dtype d)
{
    return d == TD_F64 ? 3 : d == TD_F32 ? 2 : 1; /* f16 and bf16 */
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
    if (a == TD_I64 || b == TD_I64)
        return TD_I64;
    return TD_I32; /* i32 with bool */
}

/* PyTorch's combine_categories: the lower-priority group (0-dim tensors,
 * then scalars) only matters when it is of a higher category. */
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

static bool is_compare(tdd_op op)
{
    return op == TDD_OP_EQ || op == TDD_OP_NE || op == TDD_OP_LT || op == TDD_OP_LE ||
           op == TDD_OP_GT || op == TDD_OP_GE;
}

static bool is_logical(tdd_op op)
{
    return op == TDD_OP_LOGICAL_AND || op == TDD_OP_LOGICAL_OR || op == TDD_OP_LOGICAL_XOR;
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
        const td_attr *o = tdd_attr_get(&p->req->attrs, "other");
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
                               kind_name(o->kind));
        }
        g->scalar_form = true;
        ndim = a->ndim;
        memcpy(shape, a->shape, sizeof shape);
        ct = result_type(p->in, 1, st);
    }
    g->f[1] = 1.0;
    g->n[1] = 1;
    const td_attr *al = tdd_attr_get(&p->req->attrs, "alpha");
    if (al) {
        if (p->op != TDD_OP_ADD && p->op != TDD_OP_SUB)
            return tdd_err_arg(p->err, "alpha", "%s: takes no alpha", p->name);
        if (al->kind == TD_ATTR_INT) {
            g->f[1] = (double)al->i;
            g->n[1] = al->i;
        } else if (al->kind == TD_ATTR_FLOAT) {
            if (!tdd_dtype_is_float(ct))
                return tdd_err_arg(p->err, "alpha",
                                   "%s: alpha must be an integer for integral inputs", p->name);
            g->f[1] = al->f;
        } else {
            return wrong_kind(p, al, "a number");
        }
    }
    td_dtype out = ct;
    if (is_compare(p->op) || is_logical(p->op)) {
        out = TD_BOOL;
    } else if (p->op == TDD_OP_DIV) {
        if (!tdd_dtype_is_float(ct))
            ct = out = TD_F32; /* true division */
    } else if (ct == TD_BOOL && p->op != TDD_OP_ADD && p->op != TDD_OP_MUL &&
               p->op != TDD_OP_MAXIMUM && p->op != TDD_OP_MINIMUM) {
        return tdd_p_unsupported(p, ct);
    }
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
        rc = tdd_p_bcast(p, x->shape, x->ndim, m->shape, m->ndim, shape, &ndim);
        if (rc)
            return rc;
        if (ndim != x->ndim || memcmp(shape, x->shape, (size_t)ndim * sizeof *shape) != 0)
            return tdd_err_shape(p->err, x->shape, x->ndim, m->shape, m->ndim,
                                 "masked_fill: mask must broadcast to the input's shape");
        const td_attr *v = tdd_attr_get(&p->req->attrs, "value");
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

static int prep_unary(tdd_prep *p)
{
    tdd_opargs *g = p->args;
    const tdd_tensor *a = p->in[0];
    td_dtype dt = a->dtype, out = dt;
    bool fl = tdd_dtype_is_float(dt);
    int rc = 0;
    switch (p->op) {
    case TDD_OP_EXP:
    case TDD_OP_LOG:
    case TDD_OP_LOG1P:
    case TDD_OP_EXPM1:
    case TDD_OP_SQRT:
    case TDD_OP_RSQRT:
    case TDD_OP_SIN:
    case TDD_OP_COS:
    case TDD_OP_TANH:
    case TDD_OP_SIGMOID:
    case TDD_OP_RECIPROCAL:
        if (!fl)
            out = TD_F32; /* integers promote to the default float dtype */
        break;
    case TDD_OP_LEAKY_RELU:
        if (!fl)
            return tdd_p_unsupported(p, dt);
        rc = tdd_p_float(p, "negative_slope", 0.01, &g->f[0]);
        break;
    case TDD_OP_GELU: {
        if (!fl)
            return tdd_p_unsupported(p, dt);
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
    case TDD_OP_SILU:
        if (!fl)
            return tdd_p_unsupported(p, dt);
        break;
    case TDD_OP_SOFTPLUS:
        if (!fl)
            return tdd_p_unsupported(p, dt);
        if ((rc = tdd_p_float(p, "beta", 1.0, &g->f[0])))
            return rc;
        if ((rc = tdd_p_float(p, "threshold", 20.0, &g->f[1])))
            return rc;
        if (g->f[0] == 0.0)
            return tdd_err_arg(p->err, "beta", "softplus: beta must not be 0");
        break;
    case TDD_OP_CLAMP: {
        if (dt == TD_BOOL)
            return tdd_p_unsupported(p, dt);
        const td_attr *mn = tdd_attr_get(&p->req->attrs, "min");
        const td_attr *mx = tdd_attr_get(&p->req->attrs, "max");
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
        break;
    }
    case TDD_OP_NEG:
    case TDD_OP_ABS:
    case TDD_OP_SIGN:
    case TDD_OP_RELU:
    case TDD_OP_FLOOR:
    case TDD_OP_CEIL:
    case TDD_OP_ROUND:
    case TDD_OP_SQUARE:
        if (dt == TD_BOOL)
            return tdd_p_unsupported(p, dt);
        break;
    case TDD_OP_LOGICAL_NOT:
        out = TD_BOOL;
        break;
    default:
        return tdd_err_set(p->err, TD_EINTERNAL, "%s: not a unary op", p->name);
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
    bool keepdim;
    if ((rc = tdd_p_bool(p, "keepdim", false, &keepdim)))
        return rc;
    g->keepdim = keepdim;
    switch (p->op) {
    case TDD_OP_CUMSUM:
    case TDD_OP_SOFTMAX:
    case TDD_OP_LOG_SOFTMAX: {
        int64_t dv;
        int d;
        if (!tdd_attr_get(&p->req->attrs, "dim"))
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
    case TDD_OP_ARGMAX:
    case TDD_OP_ARGMIN: {
        if (dt == TD_BOOL)
            return tdd_p_unsupported(p, dt);
        const td_attr *da = tdd_attr_get(&p->req->attrs, "dim");
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
        g->dtype = TD_I64;
        g->cdtype = dt;
        tdd_p_out(p, 0, TD_I64, shape, ndim);
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
    int rc = 0;
    switch (d->kind) {
    case TDD_KIND_BINARY:
        rc = prep_binary(&p);
        break;
    case TDD_KIND_UNARY:
        rc = prep_unary(&p);
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
