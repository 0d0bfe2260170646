/* ops.c -- the op table and the shape/attribute rules (tdd_op_prepare). */
#include "ops.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

const tdd_opdef tdd_opdefs[TDD_OP_COUNT] = {
#define TDD__OP_DEF(e, nm, lo, hi) [TDD_OP_##e] = {TDD_OP_##e, nm, lo, hi},
    TDD_OPS(TDD__OP_DEF)
#undef TDD__OP_DEF
};

const tdd_opdef *tdd_op_find(const char *name)
{
    for (int i = 0; i < TDD_OP_COUNT; i++)
        if (strcmp(tdd_opdefs[i].name, name) == 0)
            return &tdd_opdefs[i];
    return NULL;
}

const td_attr *tdd_attr_get(const tdd_attrs *as, const char *name)
{
    for (size_t i = 0; i < as->n; i++)
        if (as->a[i].name && strcmp(as->a[i].name, name) == 0)
            return &as->a[i];
    return NULL;
}

int tdd_err_set(td_error *err, int code, const char *fmt, ...)
{
    if (err) {
        memset(err, 0, sizeof *err);
        err->code = code;
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->message, sizeof err->message, fmt, ap);
        va_end(ap);
    }
    return code;
}

int tdd_err_shape(td_error *err, const int64_t *expected, int en, const int64_t *got, int gn,
                  const char *fmt, ...)
{
    if (err) {
        memset(err, 0, sizeof *err);
        err->code = TD_ESHAPE_MISMATCH;
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->message, sizeof err->message, fmt, ap);
        va_end(ap);
        err->detail_kind = TD_DETAIL_SHAPES;
        err->detail.shapes.expected_ndim = en;
        err->detail.shapes.got_ndim = gn;
        memcpy(err->detail.shapes.expected, expected, (size_t)en * sizeof *expected);
        memcpy(err->detail.shapes.got, got, (size_t)gn * sizeof *got);
    }
    return TD_ESHAPE_MISMATCH;
}

int tdd_err_arg(td_error *err, const char *argument, const char *fmt, ...)
{
    if (err) {
        memset(err, 0, sizeof *err);
        err->code = TD_EINVALID_ARGUMENT;
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->message, sizeof err->message, fmt, ap);
        va_end(ap);
        err->detail_kind = TD_DETAIL_ARGUMENT;
        snprintf(err->detail.argument.argument, sizeof err->detail.argument.argument, "%s",
                 argument);
    }
    return TD_EINVALID_ARGUMENT;
}

static void out_like(tdd_outdesc *o, td_dtype dt, const int64_t *shape, int ndim)
{
    memset(o, 0, sizeof *o);
    o->dtype = dt;
    o->ndim = ndim;
    memcpy(o->shape, shape, (size_t)ndim * sizeof *shape);
}

static int need_dtype(const tdd_tensor *t, td_dtype want, const char *op, td_error *err)
{
    if (t->dtype != want)
        return tdd_err_set(err, TD_EUNSUPPORTED_DTYPE, "%s: dtype %s is not supported", op,
                           td_dtype_name(t->dtype));
    return 0;
}

int tdd_op_prepare(tdd_op op, const tdd_tensor *const *in, int n_in, const tdd_opreq *req,
                   int64_t max_numel, tdd_opargs *args, tdd_outdesc *out, int *n_out,
                   td_error *err)
{
    const tdd_opdef *d = &tdd_opdefs[op];
    (void)req;
    memset(args, 0, sizeof *args);
    if (n_in < d->min_inputs || n_in > d->max_inputs)
        return tdd_err_set(err, TD_EINVALID_ARGUMENT, "%s takes %d input(s), got %d", d->name,
                           d->min_inputs, n_in);
    for (int i = 0; i < n_in; i++) {
        int rc = need_dtype(in[i], TD_F32, d->name, err);
        if (rc)
            return rc;
    }
    *n_out = 1;
    args->dtype = TD_F32;
    switch (op) {
    case TDD_OP_ADD:
    case TDD_OP_SUB:
    case TDD_OP_MUL:
    case TDD_OP_DIV:
        if (!tdd_same_shape(in[0], in[1]))
            return tdd_err_shape(err, in[0]->shape, in[0]->ndim, in[1]->shape, in[1]->ndim,
                                 "%s: operand shapes differ", d->name);
        out_like(out, TD_F32, in[0]->shape, in[0]->ndim);
        break;
    case TDD_OP_RELU:
        out_like(out, TD_F32, in[0]->shape, in[0]->ndim);
        break;
    case TDD_OP_SUM:
        out_like(out, TD_F32, NULL, 0);
        break;
    case TDD_OP_MATMUL: {
        if (in[0]->ndim != 2 || in[1]->ndim != 2)
            return tdd_err_arg(err, "input", "matmul: inputs must be 2-D, got %d-D and %d-D",
                               in[0]->ndim, in[1]->ndim);
        if (in[0]->shape[1] != in[1]->shape[0]) {
            int64_t want[2] = {in[0]->shape[1], in[1]->shape[1]};
            return tdd_err_shape(err, want, 2, in[1]->shape, 2,
                                 "matmul: (%lld x %lld) @ (%lld x %lld): inner dims differ",
                                 (long long)in[0]->shape[0], (long long)in[0]->shape[1],
                                 (long long)in[1]->shape[0], (long long)in[1]->shape[1]);
        }
        int64_t s[2] = {in[0]->shape[0], in[1]->shape[1]};
        out_like(out, TD_F32, s, 2);
        break;
    }
    case TDD_OP_COUNT:
        return tdd_err_set(err, TD_EUNSUPPORTED_OP, "no such op");
    }
    for (int i = 0; i < *n_out; i++)
        if (tdd_shape_numel(out[i].shape, out[i].ndim, max_numel) < 0)
            return tdd_err_set(err, TD_ERESOURCE_EXHAUSTED, "%s: output too large", d->name);
    return 0;
}
