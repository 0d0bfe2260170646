/* optim_req.c -- the optimizer requests: OptimizerCreate (hyperparameters checked
 * against each optimizer's attributes) and OptimizerStep, run by optim.c, and the
 * export and import of an optimizer's state (OptimizerState, OptimizerLoadState). */
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
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

/* The options, as torch.optim names them: each one's field and the optimizers that
 * take it (a bit per opt_kind). betas (two floats) sets beta1 and beta2. */
#define K_SGD (1u << OPT_SGD)
#define K_ADAM ((1u << OPT_ADAM) | (1u << OPT_ADAMW))
#define K_RMS (1u << OPT_RMSPROP)
#define K_ADAGRAD (1u << OPT_ADAGRAD)
#define K_ALL (K_SGD | K_ADAM | K_RMS | K_ADAGRAD)

typedef struct {
    const char *name;
    size_t off;   /* a double, or (is_bool) a bool, in opt_hyper */
    bool is_bool; /* a bool: any non-zero number is true */
    unsigned kinds;
} opt_option;

#define OPT_D(nm, field, k)                                                                        \
    {                                                                                              \
        nm, offsetof(opt_hyper, field), false, k                                                   \
    }
#define OPT_B(nm, field, k)                                                                        \
    {                                                                                              \
        nm, offsetof(opt_hyper, field), true, k                                                    \
    }
static const opt_option opt_options[] = {
    OPT_D("lr", lr, K_ALL),
    OPT_D("betas", beta1, K_ADAM), /* beta1 and beta2 */
    OPT_D("beta1", beta1, K_ADAM),
    OPT_D("beta2", beta2, K_ADAM),
    OPT_D("alpha", alpha, K_RMS),
    OPT_D("lr_decay", lr_decay, K_ADAGRAD),
    OPT_D("eps", eps, K_ADAM | K_RMS | K_ADAGRAD),
    OPT_B("amsgrad", amsgrad, K_ADAM),
    OPT_D("momentum", momentum, K_SGD | K_RMS),
    OPT_D("dampening", dampening, K_SGD),
    OPT_B("nesterov", nesterov, K_SGD),
    OPT_B("centered", centered, K_RMS),
    OPT_D("initial_accumulator_value", init_acc, K_ADAGRAD),
    OPT_D("weight_decay", weight_decay, K_ALL),
    OPT_B("maximize", maximize, K_ALL),
    OPT_B("foreach", foreach, K_ALL),
};
#define N_OPT_OPTIONS (sizeof opt_options / sizeof opt_options[0])

static const char *const kind_names[] = {"sgd", "adam", "adamw", "rmsprop", "adagrad"};

/* Sets h's options from attrs, each one h's optimizer takes, given once (a bit per
 * known name: a request may carry many attributes). have_lr: lr was given. */
static int apply_attrs(Tensordd__V1__Attr *const *attrs, size_t n, opt_hyper *h, bool *have_lr,
                       td_error *err)
{
    const char *kind = kind_names[h->kind];
    uint32_t seen = 0;
    for (size_t i = 0; i < n; i++) {
        const Tensordd__V1__Attr *a = attrs[i];
        const char *nm = a->name ? a->name : "";
        size_t k = 0;
        while (k < N_OPT_OPTIONS &&
               (strcmp(opt_options[k].name, nm) != 0 || !(opt_options[k].kinds & (1u << h->kind))))
            k++;
        if (k == N_OPT_OPTIONS) {
            char list[256];
            size_t o = 0;
            for (size_t j = 0; j < N_OPT_OPTIONS && o < sizeof list; j++)
                if (opt_options[j].kinds & (1u << h->kind))
                    o += (size_t)snprintf(list + o, sizeof list - o, "%s%s", o ? ", " : "",
                                          opt_options[j].name);
            return tdd_err_arg(err, nm, "%s takes no attribute '%.32s' (accepts: %s)", kind, nm,
                               list);
        }
        if (seen & (1u << k))
            return tdd_err_arg(err, nm, "%s: attribute '%s' given twice", kind, nm);
        seen |= 1u << k;
        const opt_option *op = &opt_options[k];
        if (strcmp(nm, "betas") == 0) {
            if (a->value_case != TENSORDD__V1__ATTR__VALUE_FLOATS || a->floats->n_v != 2)
                return tdd_err_arg(err, "betas", "betas must be two floats");
            h->beta1 = a->floats->v[0];
            h->beta2 = a->floats->v[1];
            continue;
        }
        double v = 0.0;
        int rc = attr_num(a, &v, err);
        if (rc)
            return rc;
        if (op->is_bool)
            *(bool *)(void *)((char *)h + op->off) = v != 0.0;
        else
            *(double *)(void *)((char *)h + op->off) = v;
        if (strcmp(nm, "lr") == 0)
            *have_lr = true;
    }
    return 0;
}

/* PyTorch's constructor checks (its ValueErrors), on the options in force. */
static int check_hyper(const opt_hyper *h, td_error *err)
{
    static const struct {
        const char *name;
        size_t off;
    } nonneg[] = {
        {"lr", offsetof(opt_hyper, lr)},
        {"weight_decay", offsetof(opt_hyper, weight_decay)},
        {"momentum", offsetof(opt_hyper, momentum)},
        {"eps", offsetof(opt_hyper, eps)},
        {"alpha", offsetof(opt_hyper, alpha)},
        {"lr_decay", offsetof(opt_hyper, lr_decay)},
        {"initial_accumulator_value", offsetof(opt_hyper, init_acc)},
    };
    for (size_t i = 0; i < sizeof nonneg / sizeof nonneg[0]; i++) {
        double v = *(const double *)(const void *)((const char *)h + nonneg[i].off);
        if (!(v >= 0.0)) /* NaN too */
            return tdd_err_arg(err, nonneg[i].name, "invalid %s %g (must be >= 0)", nonneg[i].name,
                               v);
    }
    if (h->nesterov && (h->momentum <= 0.0 || h->dampening != 0.0))
        return tdd_err_arg(err, "nesterov",
                           "nesterov momentum requires a momentum and zero "
                           "dampening");
    if (!(h->beta1 >= 0.0 && h->beta1 < 1.0))
        return tdd_err_arg(err, "beta1", "invalid beta1 %g (0 <= beta1 < 1)", h->beta1);
    if (!(h->beta2 >= 0.0 && h->beta2 < 1.0))
        return tdd_err_arg(err, "beta2", "invalid beta2 %g (0 <= beta2 < 1)", h->beta2);
    return 0;
}

static int parse_hyper(const Tensordd__V1__OptimizerCreate *oc, opt_hyper *h, td_error *err)
{
    memset(h, 0, sizeof *h);
    const char *k = oc->kind ? oc->kind : "";
    size_t kind = 0;
    while (kind < sizeof kind_names / sizeof kind_names[0] && strcmp(kind_names[kind], k) != 0)
        kind++;
    if (kind == sizeof kind_names / sizeof kind_names[0])
        return tdd_err_arg(err, "kind",
                           "unknown optimizer '%.32s' (sgd, adam, adamw, rmsprop, adagrad)", k);
    h->kind = (opt_kind)kind;
    /* torch.optim's defaults (SGD has no lr default) */
    bool have_lr = false;
    h->lr = h->kind == OPT_RMSPROP || h->kind == OPT_ADAGRAD ? 1e-2 : 1e-3;
    h->beta1 = 0.9;
    h->beta2 = 0.999;
    h->eps = h->kind == OPT_ADAGRAD ? 1e-10 : 1e-8;
    h->alpha = 0.99;
    h->weight_decay = h->kind == OPT_ADAMW ? 1e-2 : 0.0;
    int rc = apply_attrs(oc->attrs, oc->n_attrs, h, &have_lr, err);
    if (rc)
        return rc;
    if (h->kind == OPT_SGD && !have_lr)
        return tdd_err_arg(err, "lr", "sgd needs lr");
    return check_hyper(h, err);
}

/* OptimizerStep's attrs: options changed from this step on (a param group's dict edited
 * in torch), checked as at creation; nothing changes on an error. */
static int step_options(tdd_optim *o, const Tensordd__V1__OptimizerStep *st, td_error *err)
{
    if (st->n_attrs == 0)
        return 0;
    opt_hyper h = o->h;
    bool have_lr = false;
    int rc = apply_attrs(st->attrs, st->n_attrs, &h, &have_lr, err);
    if (!rc)
        rc = check_hyper(&h, err);
    if (!rc)
        o->h = h;
    return rc;
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
    opt_hyper before = o ? o->h : (opt_hyper){0};
    if (!rc)
        rc = step_options(o, st, &err);
    if (!rc)
        rc = tdd_optim_step_run(s, ag, req->id, o, grads, &err);
    if (rc < 0) {
        if (o) /* a refused step changes no option either */
            o->h = before;
        return tdd_answer_error(r, &err);
    }
    if (rc == 0) {
        if (!tdd_report_pending(r)) /* else an update that ran inline failed */
            tdd_conn_send_ok(c, req->id);
        return TDD_DISPATCH_DONE;
    }
    ag->step_active = true;
    ag->step_req = req->id;
    return TDD_DISPATCH_BLOCK;
}

/* ---------------------------------------------------------------- state export and import */

/* Steps above this are refused by OptimizerLoadState: Adam's bias correction takes
 * step + 1 as a double, exact up to 2^53. */
#define OPTIM_MAX_STEPS (INT64_C(1) << 53)

static const char *slot_name(const opt_hyper *h, int k)
{
    static const char *const names[][3] = {
        [OPT_SGD] = {"momentum_buffer", "", ""},
        [OPT_ADAM] = {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"},
        [OPT_ADAMW] = {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"},
        [OPT_RMSPROP] = {"square_avg", "momentum_buffer", "grad_avg"},
        [OPT_ADAGRAD] = {"sum", "", ""},
    };
    return names[h->kind][k];
}

/* OptimizerState: every buffer bound to a new handle (a view of the buffer, which later
 * steps update in place), the step counts in the reply. Either every buffer is bound or
 * none (ids bound before a failure are released again). */
int tdd_h_optimizer_state(tdd_req *r)
{
    tdd_session *s = r->c->s;
    Tensordd__V1__OptimizerState *os = r->req->optimizer_state;
    td_error err;
    tdd_optim *o = NULL;
    int rc = tdd_handle_get(s, os->optimizer, TD_HANDLE_OPTIMIZER, (void **)&o, &err);
    if (!rc && (os->first_output == 0 || o->n > (UINT64_MAX - os->first_output) / 3))
        rc = tdd_err_arg(&err, "first_output", "first_output must leave room for %zu handles",
                         o->n * 3);
    int64_t *steps = NULL;
    uint32_t *mask = NULL;
    if (!rc && (!(steps = calloc(o->n ? o->n : 1, sizeof *steps)) ||
                !(mask = calloc(o->n ? o->n : 1, sizeof *mask))))
        rc = tdd_err_set(&err, TD_ERESOURCE_EXHAUSTED, "out of host memory");
    for (size_t i = 0; !rc && i < o->n; i++) {
        const opt_param *op = &o->ps[i];
        steps[i] = op->step;
        for (int k = 0; !rc && op->step > 0 && k < 3; k++) {
            if (!(tdd_optim_kept(&o->h) & (1u << k)) || !op->buf[k] || (op->fresh & (1u << k)))
                continue;
            uint64_t id = os->first_output + 3 * i + (uint64_t)k;
            tdd_value *a = NULL;
            rc = tdd_handle_check_new(s, id, &err);
            if (!rc && !(a = tdd_value_alias(op->buf[k]))) {
                tdd_handle_unreserve(s, id);
                rc = tdd_err_set(&err, TD_ERESOURCE_EXHAUSTED, "out of host memory");
            }
            if (!rc) {
                tdd_handle_add(s, id, TD_HANDLE_TENSOR, a);
                mask[i] |= 1u << k;
            }
        }
    }
    if (rc) {
        for (size_t i = 0; mask && o && i < o->n; i++)
            for (int k = 0; k < 3; k++)
                if (mask[i] & (1u << k))
                    tdd_handle_release(s, os->first_output + 3 * i + (uint64_t)k, NULL);
        free(steps);
        free(mask);
        return tdd_answer_error(r, &err);
    }
    Tensordd__V1__OptimizerStateReply sr = TENSORDD__V1__OPTIMIZER_STATE_REPLY__INIT;
    sr.n_steps = o->n;
    sr.steps = steps;
    sr.n_buffers = o->n;
    sr.buffers = mask;
    Tensordd__V1__Response resp = TENSORDD__V1__RESPONSE__INIT;
    resp.id = r->req->id;
    resp.body_case = TENSORDD__V1__RESPONSE__BODY_OPTIMIZER_STATE;
    resp.optimizer_state = &sr;
    tdd_conn_send(r->c, &resp, NULL, 0, NULL);
    free(steps);
    free(mask);
    return TDD_DISPATCH_DONE;
}

/* A buffer given for parameter p: on its device, of its dtype and shape, not poisoned. */
static int check_buffer(const tdd_value *p, const tdd_value *b, size_t i, const char *name,
                        td_error *err)
{
    if (b->dev->be != p->dev->be)
        return tdd_err_devices(err, TD_EBACKEND_MISMATCH, p->dev, b->dev, 0, 0,
                               "%s of parameter %zu is on %s, the parameter on %s", name, i,
                               b->dev->label, p->dev->label);
    if (b->dev != p->dev)
        return tdd_err_devices(err, TD_EDEVICE_MISMATCH, p->dev, b->dev, 0, 0,
                               "%s of parameter %zu is on %s, the parameter on %s", name, i,
                               b->dev->label, p->dev->label);
    if (b->t.dtype != p->t.dtype)
        return tdd_err_dtypes(err, p->t.dtype, b->t.dtype,
                              "%s of parameter %zu is %s, the "
                              "parameter %s",
                              name, i, td_dtype_name(b->t.dtype), td_dtype_name(p->t.dtype));
    if (!tdd_same_shape(&b->t, &p->t))
        return tdd_err_shape(err, p->t.shape, p->t.ndim, b->t.shape, b->t.ndim,
                             "%s of parameter %zu has another shape than the parameter", name, i);
    if (tdd_value_poisoned(b))
        return tdd_err_poisoned(err, b);
    return 0;
}

/* OptimizerLoadState: every check first, then fresh buffers and a queued copy into
 * each (the tensors named stay the client's), then the state is swapped in. */
int tdd_h_optimizer_load_state(tdd_req *r)
{
    tdd_session *s = r->c->s;
    Tensordd__V1__OptimizerLoadState *ls = r->req->optimizer_load_state;
    td_error err;
    tdd_optim *o = NULL;
    int rc = tdd_handle_get(s, ls->optimizer, TD_HANDLE_OPTIMIZER, (void **)&o, &err);
    if (!rc && ls->n_steps != o->n)
        rc = tdd_err_arg(&err, "steps", "%zu steps for an optimizer of %zu parameters", ls->n_steps,
                         o->n);
    if (!rc && (ls->n_buffers / 3 != o->n || ls->n_buffers % 3))
        rc = tdd_err_arg(&err, "buffers",
                         "%zu buffers for an optimizer of %zu parameters (3 per parameter)",
                         ls->n_buffers, o->n);
    unsigned keep = rc ? 0 : tdd_optim_kept(&o->h);
    tdd_value **src = NULL, **nv = NULL;
    size_t nslots = rc ? 0 : 3 * o->n;
    if (!rc && (!(src = calloc(nslots ? nslots : 1, sizeof *src)) ||
                !(nv = calloc(nslots ? nslots : 1, sizeof *nv))))
        rc = tdd_err_set(&err, TD_ERESOURCE_EXHAUSTED, "out of host memory");
    for (size_t i = 0; !rc && i < o->n; i++) {
        int64_t step = ls->steps[i];
        if (step < 0 || step > OPTIM_MAX_STEPS) {
            rc = tdd_err_arg(&err, "steps", "parameter %zu: step %lld out of range [0, 2^53]", i,
                             (long long)step);
            break;
        }
        for (int k = 0; !rc && k < 3; k++) {
            uint64_t id = ls->buffers[3 * i + (size_t)k];
            bool want = step > 0 && (keep & (1u << k));
            if (id && !want)
                rc = tdd_err_arg(&err, "buffers",
                                 step > 0 ? "parameter %zu: this optimizer keeps no buffer %d"
                                          : "parameter %zu: buffer %d given with step 0",
                                 i, k);
            else if (!id && want)
                rc = tdd_err_arg(&err, "buffers", "parameter %zu: %s missing (step %lld)", i,
                                 slot_name(&o->h, k), (long long)step);
            else if (id && !(rc = tdd_value_get(s, id, &src[3 * i + (size_t)k], &err)))
                rc = check_buffer(o->ps[i].p, src[3 * i + (size_t)k], i, slot_name(&o->h, k), &err);
        }
    }
    for (size_t j = 0; !rc && j < nslots; j++)
        if (src[j] &&
            !(nv[j] = tdd_value_alloc(s, o->ps[j / 3].p->dev, o->ps[j / 3].p->t.dtype,
                                      o->ps[j / 3].p->t.ndim, o->ps[j / 3].p->t.shape, &err)))
            rc = err.code;
    for (size_t j = 0; !rc && j < nslots; j++)
        if (src[j])
            rc = tdd_submit_assign(s, r->req->id, nv[j], src[j], &err);
    if (rc) {
        for (size_t j = 0; nv && j < nslots; j++)
            tdd_value_unref(nv[j]);
        free(src);
        free(nv);
        return tdd_answer_error(r, &err);
    }
    for (size_t i = 0; i < o->n; i++) {
        o->ps[i].step = ls->steps[i];
        o->ps[i].fresh = 0;
        for (int k = 0; k < 3; k++) {
            tdd_value_unref(o->ps[i].buf[k]);
            o->ps[i].buf[k] = nv[3 * i + (size_t)k];
        }
    }
    free(src);
    free(nv);
    tdd_answer_ok(r);
    return TDD_DISPATCH_DONE;
}
