/* autograd_req.c -- the autodiff requests: Backward, Grad, GradRemove, GradReplace and
 * SetGradMode, checked here and run by the autodiff engine (autograd.c). */
#include "autograd_impl.h"
#include "handlers.h"

#include <stdlib.h>

static int check_grad_output(const tdd_value *loss, const tdd_value *go, td_error *err)
{
    if (tdd_value_poisoned(go))
        return tdd_err_poisoned(err, go);
    if (go->dev->be != loss->dev->be)
        return tdd_err_devices(err, TD_EBACKEND_MISMATCH, loss->dev, go->dev, 0, 1,
                               "grad_output is on %s but the loss is on %s", go->dev->label,
                               loss->dev->label);
    if (go->dev != loss->dev)
        return tdd_err_devices(err, TD_EDEVICE_MISMATCH, loss->dev, go->dev, 0, 1,
                               "grad_output is on %s but the loss is on %s", go->dev->label,
                               loss->dev->label);
    if (go->t.dtype != loss->t.dtype)
        return tdd_err_dtypes(err, loss->t.dtype, go->t.dtype,
                              "grad_output is %s but the loss is %s", td_dtype_name(go->t.dtype),
                              td_dtype_name(loss->t.dtype));
    if (!tdd_same_shape(&go->t, &loss->t))
        return tdd_err_shape(err, loss->t.shape, loss->t.ndim, go->t.shape, go->t.ndim,
                             "grad_output's shape differs from the loss's");
    return 0;
}

int tdd_h_backward(tdd_req *r)
{
    tdd_session *s = r->c->s;
    Tensordd__V1__Backward *bw = r->req->backward;
    td_error err;
    tdd_value *loss = NULL, *go = NULL;
    int rc = tdd_handle_check_new(s, bw->grads, &err);
    if (!rc)
        rc = tdd_value_get(s, bw->loss, &loss, &err);
    if (!rc && tdd_value_poisoned(loss))
        rc = tdd_err_poisoned(&err, loss);
    if (!rc && !loss->requires_grad)
        rc = tdd_err_set(&err, TD_ENOT_TRACKED,
                         "handle %llu does not require grad and has no grad_fn: nothing to "
                         "differentiate",
                         (unsigned long long)bw->loss);
    if (!rc && bw->grad_output) {
        rc = tdd_value_get(s, bw->grad_output, &go, &err);
        if (!rc)
            rc = check_grad_output(loss, go, &err);
    } else if (!rc && tdd_numel(&loss->t) != 1) {
        rc = tdd_err_arg(&err, "grad_output",
                         "grad_output can be omitted only for a loss with one element (this "
                         "one has %lld)",
                         (long long)tdd_numel(&loss->t));
    }
    /* grad-of: the wanted tensors, each tracked (torch: "does not require grad") */
    tdd_value **inputs = NULL;
    if (!rc && bw->n_inputs && !(inputs = calloc(bw->n_inputs, sizeof *inputs)))
        rc = tdd_err_set(&err, TD_ERESOURCE_EXHAUSTED, "out of host memory");
    for (size_t j = 0; !rc && j < bw->n_inputs; j++) {
        rc = tdd_value_get(s, bw->inputs[j], &inputs[j], &err);
        if (!rc && tdd_value_poisoned(inputs[j]))
            rc = tdd_err_poisoned(&err, inputs[j]);
        if (!rc && !inputs[j]->requires_grad)
            rc = tdd_err_set(&err, TD_ENOT_TRACKED,
                             "inputs[%zu] (handle %llu) does not require grad: it has no "
                             "gradient to ask for",
                             j, (unsigned long long)bw->inputs[j]);
    }
    tdd_backward_opts opts = {.retain_graph = bw->retain_graph,
                              .create_graph = bw->create_graph,
                              .inputs = inputs,
                              .n_inputs = inputs ? bw->n_inputs : 0};
    tdd_grads *grads = NULL;
    if (!rc)
        rc = tdd_autograd_backward(s, r->req->id, loss, go, &opts, &grads, &err);
    free(inputs);
    if (rc) {
        tdd_handle_unreserve(s, bw->grads); /* the id's charge, if checked */
        return tdd_answer_error(r, &err);
    }
    tdd_handle_add(s, bw->grads, TD_HANDLE_GRADIENTS, grads);
    /* Queued, not run: errors of the queued ops surface at the next
     * synchronising request, as for any op. */
    tdd_conn_send_ok(r->c, r->req->id);
    return TDD_DISPATCH_DONE;
}

/* ---------------------------------------------------------------- Grad, GradRemove, GradReplace */

static int tracked(tdd_value *t, uint64_t id, td_error *err)
{
    if (t->requires_grad)
        return 0;
    return tdd_err_set(err, TD_ENOT_TRACKED,
                       "handle %llu is not tracked by autodiff (it does not require grad)",
                       (unsigned long long)id);
}

static int grad(tdd_req *r, bool remove)
{
    tdd_conn *c = r->c;
    Tensordd__V1__Request *req = r->req;
    tdd_session *s = c->s;
    Tensordd__V1__Grad *g = remove ? req->grad_remove : req->grad;
    td_error err;
    tdd_grads *grads = NULL;
    tdd_value *t = NULL;
    int rc = tdd_handle_get(s, g->grads, TD_HANDLE_GRADIENTS, (void **)&grads, &err);
    if (!rc)
        rc = tdd_value_get(s, g->tensor, &t, &err);
    if (!rc)
        rc = tracked(t, g->tensor, &err);
    tdd_grad_entry *e = NULL;
    if (!rc && !(e = tdd_grads_find(grads, t)))
        rc = tdd_err_arg(&err, "tensor",
                         "gradients %llu hold no gradient for handle %llu (not a leaf reached "
                         "by the backward pass, or removed)",
                         (unsigned long long)g->grads, (unsigned long long)g->tensor);
    if (!rc)
        rc = tdd_handle_check_new(s, g->output, &err);
    tdd_value *out = NULL;
    /* with its history: a create_graph pass's gradient is differentiable */
    if (!rc && !(out = tdd_value_alias_tracked(e->grad)))
        rc = tdd_err_set(&err, TD_ERESOURCE_EXHAUSTED, "out of host memory");
    if (rc) {
        tdd_handle_unreserve(s, g->output); /* the id's charge, if checked */
        return tdd_answer_error(r, &err);
    }
    tdd_handle_add(s, g->output, TD_HANDLE_TENSOR, out);
    if (remove)
        tdd_grads_drop(grads, e);
    tdd_send_tensor(c, req->id, out, NULL, 0, NULL);
    return TDD_DISPATCH_DONE;
}

int tdd_h_grad_replace(tdd_req *r)
{
    tdd_conn *c = r->c;
    Tensordd__V1__Request *req = r->req;
    tdd_session *s = c->s;
    Tensordd__V1__GradReplace *gr = req->grad_replace;
    td_error err;
    tdd_grads *grads = NULL;
    tdd_value *t = NULL, *g = NULL;
    /* The order is the contract (docs/protocol.md, GradReplace): gradients, tracking, backend,
     * device, dtype, shape. Nothing is installed unless every check passes. */
    int rc = tdd_handle_get(s, gr->grads, TD_HANDLE_GRADIENTS, (void **)&grads, &err);
    if (!rc)
        rc = tdd_value_get(s, gr->tensor, &t, &err);
    if (!rc)
        rc = tracked(t, gr->tensor, &err);
    if (!rc)
        rc = tdd_value_get(s, gr->grad, &g, &err);
    if (!rc && g->dev->be != t->dev->be)
        rc = tdd_err_devices(&err, TD_EBACKEND_MISMATCH, t->dev, g->dev, 0, 0,
                             "gradient is on backend %s (%s) but tensor %llu is on backend %s "
                             "(%s)",
                             g->dev->be->name, g->dev->label, (unsigned long long)gr->tensor,
                             t->dev->be->name, t->dev->label);
    if (!rc && g->dev != t->dev)
        rc = tdd_err_devices(&err, TD_EDEVICE_MISMATCH, t->dev, g->dev, 0, 0,
                             "gradient is on %s but tensor %llu is on %s", g->dev->label,
                             (unsigned long long)gr->tensor, t->dev->label);
    if (!rc && g->t.dtype != t->t.dtype)
        rc = tdd_err_dtypes(&err, t->t.dtype, g->t.dtype, "gradient is %s but tensor %llu is %s",
                            td_dtype_name(g->t.dtype), (unsigned long long)gr->tensor,
                            td_dtype_name(t->t.dtype));
    if (!rc && !tdd_same_shape(&g->t, &t->t))
        rc = tdd_err_shape(&err, t->t.shape, t->t.ndim, g->t.shape, g->t.ndim,
                           "gradient's shape differs from tensor %llu's",
                           (unsigned long long)gr->tensor);
    if (!rc && tdd_value_poisoned(g))
        rc = tdd_err_poisoned(&err, g);
    if (!rc)
        rc = tdd_grads_set(grads, t, g, &err);
    if (rc)
        return tdd_answer_error(r, &err);
    tdd_conn_send_ok(c, req->id);
    return TDD_DISPATCH_DONE;
}

int tdd_h_grad(tdd_req *r)
{
    return grad(r, false);
}

int tdd_h_grad_remove(tdd_req *r)
{
    return grad(r, true);
}

int tdd_h_set_grad_mode(tdd_req *r)
{
    r->c->s->grad_enabled = r->req->set_grad_mode->enabled;
    tdd_answer_ok(r);
    return TDD_DISPATCH_DONE;
}
