/* optim_req.c -- the optimizer requests: OptimizerCreate (hyperparameters checked
 * against each optimizer's attributes) and OptimizerStep, run by optim.c. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "handlers.h"
#include "optim.h"

/* ---------------------------------------------------------------- create */

static int attr_num(const Tensordd__V1__Attr *a, double *v, td_error *err)
{
    switch (a->value_case) {
    case TENSORDD__V1__ATTR__VALUE_F:
        *v = a->f;
        return 0;
    case TENSORDD__V1__ATTR__VALUE_I:
        *v = (double)a->i;
        return 0;
    case TENSORDD__V1__ATTR__VALUE_B:
        *v = a->b ? 1.0 : 0.0;
        return 0;
    default:
        return tdd_err_arg(err, a->name ? a->name : "attrs", "attribute %.32s must be a number",
                           a->name ? a->name : "");
    }
}

/* The attributes each optimizer takes, as torch.optim names them. */
static const char *const sgd_attrs[] = {"lr",           "momentum", "dampening", "nesterov",
                                        "weight_decay", "maximize", "foreach",   NULL};
static const char *const adam_attrs[] = {"lr",      "betas",    "beta1",   "beta2",        "eps",
                                         "amsgrad", "maximize", "foreach", "weight_decay", NULL};

/* Every attribute is one the optimizer takes, given once: checked before any value
 * is read, with a bit per known name (a request may carry many attributes). */
static int check_attr_names(const Tensordd__V1__OptimizerCreate *oc, const char *kind,
                            const char *const *names, td_error *err)
{
    unsigned seen = 0;
    for (size_t i = 0; i < oc->n_attrs; i++) {
        const char *nm = oc->attrs[i]->name ? oc->attrs[i]->name : "";
        int k = 0;
        while (names[k] && strcmp(names[k], nm) != 0)
            k++;
        if (!names[k]) {
            char list[160];
            size_t o = 0;
            for (int j = 0; names[j] && o < sizeof list; j++)
                o += (size_t)snprintf(list + o, sizeof list - o, "%s%s", j ? ", " : "", names[j]);
            return tdd_err_arg(err, nm, "%s takes no attribute '%.32s' (accepts: %s)", kind, nm,
                               list);
        }
        if (seen & (1u << k))
            return tdd_err_arg(err, nm, "%s: attribute '%s' given twice", kind, nm);
        seen |= 1u << k;
    }
    return 0;
}

static int parse_hyper(const Tensordd__V1__OptimizerCreate *oc, opt_hyper *h, td_error *err)
{
    memset(h, 0, sizeof *h);
    const char *k = oc->kind ? oc->kind : "";
    if (strcmp(k, "sgd") == 0)
        h->kind = OPT_SGD;
    else if (strcmp(k, "adam") == 0)
        h->kind = OPT_ADAM;
    else if (strcmp(k, "adamw") == 0)
        h->kind = OPT_ADAMW;
    else
        return tdd_err_arg(err, "kind", "unknown optimizer '%.32s' (sgd, adam, adamw)", k);
    bool adam = h->kind != OPT_SGD, have_lr = false;
    int crc = check_attr_names(oc, k, adam ? adam_attrs : sgd_attrs, err);
    if (crc)
        return crc;
    h->lr = 1e-3; /* Adam's and AdamW's default; SGD has none */
    h->beta1 = 0.9;
    h->beta2 = 0.999;
    h->eps = 1e-8;
    h->weight_decay = h->kind == OPT_ADAMW ? 1e-2 : 0.0;
    for (size_t i = 0; i < oc->n_attrs; i++) {
        const Tensordd__V1__Attr *a = oc->attrs[i];
        const char *nm = a->name ? a->name : "";
        double v = 0.0;
        if (strcmp(nm, "betas") == 0 && adam) {
            if (a->value_case != TENSORDD__V1__ATTR__VALUE_FLOATS || a->floats->n_v != 2)
                return tdd_err_arg(err, "betas", "betas must be two floats");
            h->beta1 = a->floats->v[0];
            h->beta2 = a->floats->v[1];
            continue;
        }
        int rc = attr_num(a, &v, err);
        if (rc)
            return rc;
        if (strcmp(nm, "lr") == 0) {
            h->lr = v;
            have_lr = true;
        } else if (strcmp(nm, "weight_decay") == 0) {
            h->weight_decay = v;
        } else if (strcmp(nm, "maximize") == 0) {
            h->maximize = v != 0.0;
        } else if (strcmp(nm, "foreach") == 0) {
            h->foreach = v != 0.0;
        } else if (!adam && strcmp(nm, "momentum") == 0) {
            h->momentum = v;
        } else if (!adam && strcmp(nm, "dampening") == 0) {
            h->dampening = v;
        } else if (!adam && strcmp(nm, "nesterov") == 0) {
            h->nesterov = v != 0.0;
        } else if (adam && strcmp(nm, "beta1") == 0) {
            h->beta1 = v;
        } else if (adam && strcmp(nm, "beta2") == 0) {
            h->beta2 = v;
        } else if (adam && strcmp(nm, "eps") == 0) {
            h->eps = v;
        } else if (adam && strcmp(nm, "amsgrad") == 0) {
            h->amsgrad = v != 0.0;
        } else {
            return tdd_err_arg(err, nm, "%s takes no attribute '%.32s'", k, nm);
        }
    }
    /* PyTorch's constructor checks. */
    if (h->kind == OPT_SGD && !have_lr)
        return tdd_err_arg(err, "lr", "sgd needs lr");
    if (!(h->lr >= 0.0))
        return tdd_err_arg(err, "lr", "invalid learning rate %g", h->lr);
    if (!(h->weight_decay >= 0.0))
        return tdd_err_arg(err, "weight_decay", "invalid weight_decay %g", h->weight_decay);
    if (!(h->momentum >= 0.0))
        return tdd_err_arg(err, "momentum", "invalid momentum %g", h->momentum);
    if (h->nesterov && (h->momentum <= 0.0 || h->dampening != 0.0))
        return tdd_err_arg(err, "nesterov",
                           "nesterov momentum requires a momentum and zero "
                           "dampening");
    if (!(h->eps >= 0.0))
        return tdd_err_arg(err, "eps", "invalid epsilon %g", h->eps);
    if (!(h->beta1 >= 0.0 && h->beta1 < 1.0))
        return tdd_err_arg(err, "beta1", "invalid beta1 %g (0 <= beta1 < 1)", h->beta1);
    if (!(h->beta2 >= 0.0 && h->beta2 < 1.0))
        return tdd_err_arg(err, "beta2", "invalid beta2 %g (0 <= beta2 < 1)", h->beta2);
    return 0;
}

static int check_param(tdd_session *s, uint64_t id, tdd_value **out, td_error *err)
{
    tdd_value *p;
    int rc = tdd_value_get(s, id, &p, err);
    if (rc)
        return rc;
    if (!p->requires_grad)
        return tdd_err_set(err, TD_ENOT_TRACKED,
                           "parameter %llu does not require grad: nothing to optimize",
                           (unsigned long long)id);
    if (p->grad_fn)
        return tdd_err_arg(err, "params", "can't optimize a non-leaf tensor (handle %llu)",
                           (unsigned long long)id);
    if (p->t.dtype != TD_F32 && p->t.dtype != TD_F64)
        return tdd_err_set(err, TD_EUNSUPPORTED_DTYPE,
                           "optimizers update float32 and float64 parameters, %llu is %s",
                           (unsigned long long)id, td_dtype_name(p->t.dtype));
    *out = p;
    return 0;
}

int tdd_h_optimizer_create(tdd_req *r)
{
    tdd_session *s = r->c->s;
    Tensordd__V1__OptimizerCreate *oc = r->req->optimizer_create;
    td_error err;
    opt_hyper h;
    int rc = tdd_handle_check_new(s, oc->handle, &err);
    if (!rc)
        rc = parse_hyper(oc, &h, &err);
    if (!rc && oc->n_params == 0)
        rc = tdd_err_arg(&err, "params", "optimizer got an empty parameter list");
    tdd_optim *o = NULL;
    if (!rc && !(o = tdd_optim_new(s, oc->n_params, &err)))
        rc = err.code;
    /* Duplicates are found by a stamp on the value, O(1) each: this runs on the loop
     * thread, and comparing with every earlier parameter (O(N^2)) stalled every session
     * for 13.8 s at 200k parameters (--max-handles allows 1M). */
    static uint64_t create_stamp;
    uint64_t stamp = ++create_stamp;
    for (size_t i = 0; !rc && i < oc->n_params; i++) {
        tdd_value *p = NULL;
        rc = check_param(s, oc->params[i], &p, &err);
        if (!rc && p->mark == stamp)
            rc = tdd_err_arg(&err, "params", "parameter %llu appears twice",
                             (unsigned long long)oc->params[i]);
        if (!rc) {
            p->mark = stamp;
            tdd_optim_add_param(o, p);
        }
    }
    if (rc) {
        if (o)
            tdd_optim_free(o);
        tdd_handle_unreserve(s, oc->handle); /* the id's charge, if checked */
        return tdd_answer_error(r, &err);
    }
    o->h = h;
    tdd_handle_add(s, oc->handle, TD_HANDLE_OPTIMIZER, o);
    tdd_answer_ok(r);
    return TDD_DISPATCH_DONE;
}

/* OptimizerStep is synchronising and answers after the updates have run: the generic
 * path waited for the session's queued work and reported its pending error; the step
 * queues one update per parameter that has a gradient and stays blocked (the connection
 * processes nothing else) until they are done, so its reply carries their verdict. */
int tdd_h_optimizer_step(tdd_req *r)
{
    tdd_conn *c = r->c;
    Tensordd__V1__Request *req = r->req;
    tdd_session *s = c->s;
    tdd_ag_session *ag = tdd_ag_state(s);
    td_error err;
    if (ag && ag->step_active && ag->step_req == req->id) {
        /* The retry after the updates ran: answer with their verdict. */
        ag->step_active = false;
        if (ag->step_failed) {
            ag->step_failed = false;
            return tdd_answer_error(r, &ag->step_err);
        }
        if (!tdd_report_pending(r)) /* else a queued update op failed */
            tdd_conn_send_ok(c, req->id);
        return TDD_DISPATCH_DONE;
    }
    if (!ag) {
        tdd_err_set(&err, TD_ERESOURCE_EXHAUSTED, "out of host memory");
        return tdd_answer_error(r, &err);
    }
    Tensordd__V1__OptimizerStep *st = req->optimizer_step;
    tdd_optim *o = NULL;
    tdd_grads *grads = NULL;
    int rc = tdd_handle_get(s, st->optimizer, TD_HANDLE_OPTIMIZER, (void **)&o, &err);
    if (!rc)
        rc = tdd_handle_get(s, st->grads, TD_HANDLE_GRADIENTS, (void **)&grads, &err);
    if (!rc)
        rc = tdd_optim_step_run(s, ag, req->id, o, grads, &err);
    if (rc < 0)
        return tdd_answer_error(r, &err);
    if (rc == 0) {
        if (!tdd_report_pending(r)) /* else an update that ran inline failed */
            tdd_conn_send_ok(c, req->id);
        return TDD_DISPATCH_DONE;
    }
    ag->step_active = true;
    ag->step_req = req->id;
    return TDD_DISPATCH_BLOCK;
}
