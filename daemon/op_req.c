/* op_req.c -- the requests that make and drop tensors: Op, ToDevice and Release, and the
 * device a request names (rows of dispatch.c's table). */
#include <string.h>

#include "autograd.h"
#include "dtype.h"
#include "exec_op.h"
#include "handlers.h"

typedef Tensordd__V1__Request Request;

tdd_device *tdd_resolve_device(const Tensordd__V1__Device *d, td_error *err)
{
    if (!d || !d->backend || !d->backend[0])
        return tdd_default_device();
    int known = 0;
    tdd_device *dev = tdd_device_find(d->backend, d->ordinal, &known);
    if (!dev) {
        if (known)
            tdd_err_set(err, TD_EDEVICE_UNAVAILABLE, "device %s:%u is not served here", d->backend,
                        d->ordinal);
        else
            tdd_err_arg(err, "device", "unknown backend '%.32s'", d->backend);
    }
    return dev;
}

/* ---------------------------------------------------------------- ops */

static int convert_attrs(const Tensordd__V1__Op *op, td_attr *out, td_error *err)
{
    for (size_t i = 0; i < op->n_attrs; i++) {
        const Tensordd__V1__Attr *a = op->attrs[i];
        td_attr *t = &out[i];
        memset(t, 0, sizeof *t);
        t->name = a->name;
        switch (a->value_case) {
        case TENSORDD__V1__ATTR__VALUE_I:
            t->kind = TD_ATTR_INT;
            t->i = a->i;
            t->f = (double)a->i;
            break;
        case TENSORDD__V1__ATTR__VALUE_F:
            t->kind = TD_ATTR_FLOAT;
            t->f = a->f;
            break;
        case TENSORDD__V1__ATTR__VALUE_B:
            t->kind = TD_ATTR_BOOL;
            t->b = a->b;
            t->i = a->b;
            break;
        case TENSORDD__V1__ATTR__VALUE_INTS:
            t->kind = TD_ATTR_INTS;
            t->ints = a->ints->v;
            t->n = a->ints->n_v;
            break;
        case TENSORDD__V1__ATTR__VALUE_FLOATS:
            t->kind = TD_ATTR_FLOATS;
            t->floats = a->floats->v;
            t->n = a->floats->n_v;
            break;
        case TENSORDD__V1__ATTR__VALUE_S:
            t->kind = TD_ATTR_STR;
            t->s = a->s;
            break;
        case TENSORDD__V1__ATTR__VALUE__NOT_SET:
        default:
            return tdd_err_arg(err, a->name && a->name[0] ? a->name : "attrs",
                               "attribute '%.64s' has no value", a->name ? a->name : "");
        }
    }
    return 0;
}

#define TDD_MAX_ATTRS 32

int tdd_h_op(tdd_req *r)
{
    tdd_conn *c = r->c;
    Request *req = r->req;
    Tensordd__V1__Op *op = req->op;
    tdd_session *s = c->s;
    td_error err;
    int rc = 0;
    tdd_value *in[TDD_MAX_OP_INPUTS];
    tdd_value *out[TDD_MAX_OP_OUTPUTS];
    td_attr attrs[TDD_MAX_ATTRS];
    tdd_opargs args;
    int n_out = (int)op->n_outputs;

    if (op->n_outputs == 0 || op->n_outputs > TDD_MAX_OP_OUTPUTS)
        rc = tdd_err_arg(&err, "outputs", "%zu output handles; 1..%d expected", op->n_outputs,
                         TDD_MAX_OP_OUTPUTS);
    for (size_t i = 0; !rc && i < op->n_outputs; i++) {
        rc = tdd_handle_check_new(s, op->outputs[i], &err);
        for (size_t j = 0; !rc && j < i; j++)
            if (op->outputs[j] == op->outputs[i])
                rc = tdd_err_arg(&err, "outputs", "output handle %llu named twice",
                                 (unsigned long long)op->outputs[i]);
    }
    const tdd_opdef *def = NULL;
    if (!rc && !(def = tdd_op_find(op->op)))
        rc = tdd_err_set(&err, TD_EUNSUPPORTED_OP, "unknown op '%.64s'", op->op);
    if (!rc && op->n_inputs > TDD_MAX_OP_INPUTS)
        rc = tdd_err_arg(&err, "inputs", "%zu inputs; at most %d", op->n_inputs, TDD_MAX_OP_INPUTS);
    for (size_t i = 0; !rc && i < op->n_inputs; i++)
        rc = tdd_value_get(s, op->inputs[i], &in[i], &err);
    if (!rc && op->n_attrs > TDD_MAX_ATTRS)
        rc = tdd_err_arg(&err, "attrs", "%zu attributes; at most %d", op->n_attrs, TDD_MAX_ATTRS);
    if (!rc)
        rc = convert_attrs(op, attrs, &err);
    tdd_device *dev = NULL;
    if (!rc && op->n_inputs == 0 && !(dev = tdd_resolve_device(op->device, &err)))
        rc = err.code;
    if (!rc && (op->dtype < 0 || op->dtype >= (int)TD_DTYPE_COUNT))
        rc = tdd_err_arg(&err, "dtype", "unknown dtype %d", (int)op->dtype);
    tdd_opreq oreq = {
        .attrs = {.a = attrs, .n = op->n_attrs}, .dtype = (td_dtype)op->dtype, .seed = s->rng};
    if (!rc && op->requires_grad && op->n_inputs == 0) {
        /* As Upload: only floating-point tensors can require grad. Told before anything
         * is queued; the output dtypes come from prepare (cheap: there are no inputs). */
        tdd_opargs pa;
        tdd_outdesc pod[TDD_MAX_OP_OUTPUTS];
        int pn = 0;
        rc = tdd_op_prepare(def->op, NULL, 0, &oreq, tdd_cfg.max_numel, &pa, pod, &pn, &err);
        for (int i = 0; !rc && i < pn; i++) {
            td_dtype odt = pod[i].dtype;
            if (!tdd_dtype_is_float(odt))
                rc = tdd_err_arg(&err, "requires_grad",
                                 "%s: only floating-point tensors can require grad, not %s",
                                 def->name, td_dtype_name(odt));
        }
    }
    struct tdd_node *node = NULL; /* the autodiff record, reserved before anything runs */
    if (!rc && tdd_autograd_tracks(s, def->op, in, (int)op->n_inputs) &&
        !(node = tdd_autograd_reserve(s, (int)op->n_inputs, n_out, &err)))
        rc = err.code;
    if (!rc) {
        s->rng = s->rng * 6364136223846793005ull + 1442695040888963407ull;
        rc = tdd_submit_op_named(s, req->id, req->want_reply, def->op, &oreq, in, (int)op->n_inputs,
                                 dev, op->outputs, out, &n_out, &args, &err);
    }
    if (rc) {
        tdd_autograd_unreserve(node);
        return tdd_answer_error(r, &err); /* binds the outputs to placeholders */
    }
    for (int i = 0; i < n_out; i++) {
        if (op->requires_grad && op->n_inputs == 0)
            out[i]->requires_grad = true;
        tdd_handle_add(s, op->outputs[i], TD_HANDLE_TENSOR, out[i]);
    }
    if (node)
        tdd_autograd_record(node, def->op, &args, &oreq.attrs, in, (int)op->n_inputs, out, n_out);
    return TDD_DISPATCH_DONE;
}

int tdd_h_to_device(tdd_req *r)
{
    tdd_conn *c = r->c;
    Request *req = r->req;
    Tensordd__V1__ToDevice *td = req->to_device;
    tdd_session *s = c->s;
    td_error err;
    tdd_value *v = NULL, *out = NULL;
    tdd_device *dev = NULL;
    struct tdd_node *node = NULL;
    int rc = tdd_handle_check_new(s, td->output, &err);
    if (!rc)
        rc = tdd_value_get(s, td->input, &v, &err);
    if (!rc && !(dev = tdd_resolve_device(td->device, &err)))
        rc = err.code;
    if (!rc && s->grad_enabled && v->requires_grad && !(node = tdd_autograd_reserve(s, 1, 1, &err)))
        rc = err.code;
    if (!rc)
        rc = tdd_submit_copy(s, req->id, v, dev, &out, &err);
    if (rc) {
        tdd_autograd_unreserve(node);
        return tdd_answer_error(r, &err); /* binds the output to a placeholder */
    }
    tdd_handle_add(s, td->output, TD_HANDLE_TENSOR, out);
    if (node)
        tdd_autograd_record_to_device(node, v, out);
    tdd_answer_ok(r); /* queued; errors of the copy surface at the next sync */
    return TDD_DISPATCH_DONE;
}

int tdd_h_release(tdd_req *r)
{
    tdd_conn *c = r->c;
    Request *req = r->req;
    Tensordd__V1__Release *rl = req->release;
    td_error err, first;
    bool failed = false;
    for (size_t i = 0; i < rl->n_handles; i++) {
        if (tdd_handle_release(c->s, rl->handles[i], &err) && !failed) {
            first = err;
            failed = true;
        }
    }
    if (failed)
        return tdd_answer_error(r, &first);
    tdd_answer_ok(r);
    return TDD_DISPATCH_DONE;
}
