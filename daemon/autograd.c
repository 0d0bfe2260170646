/* autograd.c -- the autodiff engine: graph recording, the backward pass and
 * Gradients objects (the requests that use them are in autograd_req.c).
 *
 * Ownership (all on the loop thread): a value holds a reference on its
 * grad_fn; a node holds references on the input nodes it leads back to, on
 * the tensors its formula needs, and on tracked leaves (the Gradients keys).
 * Saved outputs are aliases (own values sharing the storage, grad_fn NULL),
 * so no value -> node -> value path ever closes a cycle. */
#include "autograd_impl.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dtype.h"
#include "log.h"
#include "td_error_set.h"

static uint64_t node_seq;
/* tdd_node.capture: a bit per output */
_Static_assert(TDD_MAX_OP_OUTPUTS <= 32, "tdd_node.capture holds a bit per output");
static uint64_t visit_stamp;

/* ---------------------------------------------------------------- values, nodes */

tdd_value *tdd_value_alias(const tdd_value *v)
{
    tdd_value *a = tdd_value_new(v->dev);
    if (!a)
        return NULL;
    a->t = v->t;
    if (a->t.st)
        tdd_storage_ref(a->t.st);
    a->fq = v->fq;
    a->fseq = v->fseq;
    a->poison_req = v->poison_req;
    atomic_store(&a->poison, tdd_value_poisoned(v));
    return a;
}

tdd_value *tdd_value_alias_tracked(const tdd_value *v)
{
    tdd_value *a = tdd_value_alias(v);
    if (a && v->grad_fn) {
        a->grad_fn = v->grad_fn;
        a->grad_fn->refs++;
        a->requires_grad = true;
    }
    return a;
}

/* Drops what a node saved for its formula; metadata and edges stay, leaves included (a
 * grad-of pass tells by them whether a freed node leads to what it wants). */
static void node_drop_saved(tdd_node *n)
{
    for (int i = 0; i < n->n_in; i++) {
        tdd_value_unref(n->in[i].v);
        n->in[i].v = NULL;
    }
    for (int k = 0; k < n->n_out; k++) {
        tdd_value_unref(n->out[k].alias);
        n->out[k].alias = NULL;
    }
}

/* Freeing a long chain recursively would use a stack frame per node: nodes
 * whose count drops to zero are queued and freed by one loop instead. */
static tdd_node *free_list;
static bool freeing;

void tdd_node_unref(tdd_node *n)
{
    if (!n || --n->refs > 0)
        return;
    n->free_next = free_list;
    free_list = n;
    if (freeing)
        return;
    freeing = true;
    while (free_list) {
        tdd_node *m = free_list;
        free_list = m->free_next;
        node_drop_saved(m);
        for (int i = 0; i < m->n_in; i++)
            tdd_value_unref(m->in[i].leaf);
        for (int k = 0; k < m->n_out; k++)
            tdd_value_unref(m->out[k].grad);
        for (int i = 0; i < m->n_in; i++)
            tdd_node_unref(m->in[i].fn);
        free(m->attrs);
        tdd_account_credit(m->acct, m->bytes);
        tdd_account_unref(m->acct);
        free(m);
    }
    freeing = false;
}

/* A value with a grad_fn died (session hook). */
static void value_free(tdd_value *v)
{
    tdd_node *n = v->grad_fn;
    v->grad_fn = NULL;
    tdd_node_unref(n);
}

static bool is_float(td_dtype dt)
{
    return tdd_dtype_is_float(dt);
}

static bool same_shape(int an, const int64_t *a, int bn, const int64_t *b)
{
    if (an != bn)
        return false;
    for (int d = 0; d < an; d++)
        if (a[d] != b[d])
            return false;
    return true;
}

/* The in-place update count of v's data (its storage's, shared by every view of it). */
static uint64_t storage_version(const tdd_value *v)
{
    return v->t.st ? v->t.st->version : 0;
}

/* Which output of fn (v's grad_fn) v is: by address, or, for an alias of an output (a
 * gradient read back through Grad, a saved output made tracked by a create_graph pass), by
 * the view it is of that output's storage. */
static int out_index(const tdd_node *fn, const tdd_value *v)
{
    for (int k = 0; k < fn->n_out; k++)
        if (fn->out[k].id == (uintptr_t)v)
            return k;
    for (int k = 0; k < fn->n_out; k++) {
        const tdd_node_out *o = &fn->out[k];
        if (o->st == (uintptr_t)v->t.st && o->off == v->t.offset &&
            same_shape(o->ndim, o->shape, v->t.ndim, v->t.shape))
            return k;
    }
    return 0;
}

static void note_input(tdd_node *n, int i, tdd_value *v, bool save)
{
    tdd_node_in *ni = &n->in[i];
    ni->dtype = v->t.dtype;
    ni->ndim = v->t.ndim;
    memcpy(ni->shape, v->t.shape, sizeof ni->shape);
    ni->dev = v->dev;
    ni->version = storage_version(v);
    ni->needs_grad = v->requires_grad && is_float(v->t.dtype);
    if (save) {
        tdd_value_ref(v);
        ni->v = v;
    }
    if (!ni->needs_grad)
        return;
    tdd_node *fn = v->grad_fn;
    if (fn) {
        ni->fn_out = out_index(fn, v);
        fn->refs++;
        ni->fn = fn;
    } else {
        tdd_value_ref(v);
        ni->leaf = v;
    }
}

static void note_output(tdd_node *n, int k, tdd_value *v, bool save)
{
    tdd_node_out *no = &n->out[k];
    no->id = (uintptr_t)v;
    no->st = (uintptr_t)v->t.st;
    no->off = v->t.offset;
    no->dtype = v->t.dtype;
    no->ndim = v->t.ndim;
    memcpy(no->shape, v->t.shape, sizeof no->shape);
    no->version = storage_version(v);
    if (save && is_float(v->t.dtype))
        no->alias = tdd_value_alias(v); /* NULL (out of memory) fails the backward later */
}

tdd_node *tdd_autograd_reserve(tdd_session *s, int n_in, int n_out, td_error *err)
{
    if (n_in < 0 || n_in > TDD_MAX_OP_INPUTS || n_out < 1 || n_out > TDD_MAX_OP_OUTPUTS) {
        tdd_err_set(err, TD_EINTERNAL, "autograd: a node of %d inputs and %d outputs", n_in, n_out);
        return NULL;
    }
    uint64_t bytes = sizeof(tdd_node) + (size_t)n_in * sizeof(tdd_node_in) +
                     (size_t)n_out * sizeof(tdd_node_out);
    if (tdd_account_charge(s->acct, bytes, err))
        return NULL;
    tdd_node *n = calloc(1, bytes);
    if (!n) {
        tdd_account_credit(s->acct, bytes);
        tdd_err_set(err, TD_ERESOURCE_EXHAUSTED, "out of host memory");
        return NULL;
    }
    n->in = (tdd_node_in *)(n + 1);
    n->out = (tdd_node_out *)(n->in + n_in);
    n->cap_in = n_in;
    n->cap_out = n_out;
    n->acct = s->acct;
    n->acct->refs++; /* a graph may outlive its session (values held by queued tasks) */
    n->bytes = bytes;
    n->refs = 1;
    n->seq = ++node_seq;
    return n;
}

void tdd_autograd_unreserve(tdd_node *n)
{
    tdd_node_unref(n);
}

/* Hands the outputs to the node; drops the creator's reference. */
static void node_attach(tdd_node *n, tdd_value *const *out, int n_out)
{
    for (int k = 0; k < n_out; k++) {
        if (!is_float(out[k]->t.dtype))
            continue; /* indices, masks: never differentiable */
        out[k]->requires_grad = true;
        out[k]->grad_fn = n;
        n->refs++;
    }
    tdd_node_unref(n);
}

static bool tracks_any(tdd_op op, tdd_value *const *in, int n_in)
{
    /* detach's output is the same bytes outside the graph (PyTorch's detach) */
    if (op == TDD_OP_DETACH)
        return false;
    for (int i = 0; i < n_in; i++)
        if (in[i]->requires_grad && is_float(in[i]->t.dtype))
            return true;
    return false;
}

bool tdd_autograd_tracks(const tdd_session *s, tdd_op op, tdd_value *const *in, int n_in)
{
    return s->grad_enabled && tracks_any(op, in, n_in);
}

void tdd_autograd_record(tdd_node *n, tdd_op op, const tdd_opargs *args, const tdd_attrs *attrs,
                         tdd_value *const *in, int n_in, tdd_value *const *out, int n_out)
{
    bool any_float_out = false;
    for (int k = 0; k < n_out; k++)
        any_float_out |= is_float(out[k]->t.dtype);
    /* nothing differentiable came out (argmax, comparisons), or more than was reserved */
    if (!any_float_out || n_in > n->cap_in || n_out > n->cap_out) {
        tdd_node_unref(n);
        return;
    }
    n->op = op;
    n->args = *args;
    n->n_in = n_in;
    n->n_out = n_out;
    bool save_in = tdd_formula_saves_inputs(op), save_out = tdd_formula_saves_output(op);
    for (int i = 0; i < n_in; i++)
        note_input(n, i, in[i], save_in && !tdd_formula_skips_input(op, args, i));
    for (int k = 0; k < n_out; k++)
        note_output(n, k, out[k], save_out);
    static const tdd_attrs none;
    tdd_formula_note_attrs(n, attrs ? attrs : &none);
    node_attach(n, out, n_out);
}

void tdd_autograd_record_to_device(tdd_node *n, tdd_value *in, tdd_value *out)
{
    if (!is_float(in->t.dtype) || n->cap_in < 1 || n->cap_out < 1) {
        tdd_node_unref(n);
        return;
    }
    n->to_device = true;
    n->op = TDD_OP_COUNT;
    n->n_in = 1;
    n->n_out = 1;
    note_input(n, 0, in, false);
    note_output(n, 0, out, false);
    node_attach(n, &out, 1);
}

/* ---------------------------------------------------------------- session state */

tdd_ag_session *tdd_ag_state(tdd_session *s)
{
    if (!s->autograd)
        s->autograd = calloc(1, sizeof(tdd_ag_session));
    return s->autograd;
}

/* A session died (session hook). */
static void session_free(tdd_session *s)
{
    free(s->autograd);
    s->autograd = NULL;
}

/* ---------------------------------------------------------------- gradients map */

tdd_grad_entry *tdd_grads_find(tdd_grads *g, const tdd_value *leaf)
{
    tdd_grad_entry *e = NULL;
    HASH_FIND_PTR(g->map, &leaf, e);
    return e;
}

static tdd_grads *grads_new(tdd_session *s)
{
    tdd_grads *g = calloc(1, sizeof *g);
    if (g) {
        g->acct = s->acct;
        g->acct->refs++; /* a Gradients object may outlive its session's table */
    }
    return g;
}

void tdd_grads_drop(tdd_grads *g, tdd_grad_entry *e)
{
    HASH_DEL(g->map, e);
    tdd_value_unref(e->leaf);
    tdd_value_unref(e->grad);
    tdd_account_credit(g->acct, sizeof *e);
    free(e);
}

static void grads_free(void *obj)
{
    tdd_grads *g = obj;
    tdd_grad_entry *e, *tmp;
    HASH_ITER(hh, g->map, e, tmp)
    {
        /* HASH_ITER sets e; cppcheck does not see through the macro */
        /* cppcheck-suppress uninitvar */
        tdd_grads_drop(g, e);
    }
    tdd_account_unref(g->acct);
    free(g);
}

int tdd_grads_set(tdd_grads *g, tdd_value *leaf, tdd_value *grad, td_error *err)
{
    tdd_grad_entry *e = tdd_grads_find(g, leaf);
    if (!e) {
        int rc = tdd_account_charge(g->acct, sizeof *e, err);
        if (rc)
            return rc;
        e = calloc(1, sizeof *e);
        if (!e) {
            tdd_account_credit(g->acct, sizeof *e);
            return tdd_err_set(err, TD_ERESOURCE_EXHAUSTED, "out of host memory");
        }
        tdd_value_ref(leaf);
        e->leaf = leaf;
        HASH_ADD_PTR(g->map, leaf, e);
    }
    tdd_value_ref(grad);
    tdd_value_unref(e->grad);
    e->grad = grad;
    return 0;
}

/* ---------------------------------------------------------------- op builder */

int tdd_bw_fail(tdd_bw *b, int code, const char *fmt, ...)
{
    if (b->rc)
        return b->rc;
    va_list ap;
    va_start(ap, fmt);
    td_error_vset(&b->err, code, fmt, ap);
    va_end(ap);
    b->rc = code;
    return code;
}

void tdd_bw_keep(tdd_bw *b, tdd_value *v)
{
    if (b->ntmp == b->captmp) {
        size_t cap = b->captmp ? 2 * b->captmp : 64;
        tdd_value **t = realloc(b->tmp, cap * sizeof *t);
        if (!t) {
            tdd_value_unref(v);
            tdd_bw_fail(b, TD_ERESOURCE_EXHAUSTED, "out of host memory");
            return;
        }
        b->tmp = t;
        b->captmp = cap;
    }
    b->tmp[b->ntmp++] = v;
}

void tdd_bw_release(tdd_bw *b, size_t keep)
{
    while (b->ntmp > keep)
        tdd_value_unref(b->tmp[--b->ntmp]);
}

static int bw_submit(tdd_bw *b, tdd_op op, tdd_value *const *in, int n_in, const td_attr *attrs,
                     size_t nattrs, td_dtype dtype, tdd_device *dev, tdd_value **out, int n_out)
{
    if (b->rc)
        return b->rc;
    for (int i = 0; i < n_in; i++)
        if (!in[i])
            return tdd_bw_fail(b, TD_EINTERNAL, "backward: %s lacks input %d", tdd_opdefs[op].name,
                               i);
    tdd_opreq req = {.attrs = {.a = attrs, .n = nattrs}, .dtype = dtype, .seed = 0};
    tdd_value *o[TDD_MAX_OP_OUTPUTS];
    int got = n_out;
    td_error err;
    /* create_graph: the formula's ops are recorded as a client's would be, grad mode or not */
    tdd_node *node = NULL;
    tdd_opargs args;
    int rc = 0;
    if (b->create_graph && tracks_any(op, in, n_in) &&
        !(node = tdd_autograd_reserve(b->s, n_in, n_out, &err)))
        rc = err.code;
    if (!rc)
        rc = tdd_submit_op(b->s, b->req_id, false, op, &req, in, n_in, dev, o, &got,
                           node ? &args : NULL, &err);
    if (rc) {
        tdd_autograd_unreserve(node);
        b->err = err;
        b->rc = rc;
        /* The message says where it came from: a backward formula, not the client's op. */
        char m[sizeof err.message];
        snprintf(m, sizeof m, "backward (%.24s): %.200s", tdd_opdefs[op].name, err.message);
        memcpy(b->err.message, m, sizeof m);
        return rc;
    }
    if (node)
        tdd_autograd_record(node, op, &args, &req.attrs, in, n_in, o, got);
    for (int k = 0; k < got; k++) {
        tdd_bw_keep(b, o[k]);
        out[k] = o[k];
    }
    return b->rc;
}

tdd_value *tdd_bw_op(tdd_bw *b, tdd_op op, tdd_value *const *in, int n_in, const td_attr *attrs,
                     size_t nattrs, td_dtype dtype, tdd_device *dev)
{
    tdd_value *out = NULL;
    return bw_submit(b, op, in, n_in, attrs, nattrs, dtype, dev, &out, 1) ? NULL : out;
}

int tdd_bw_op_n(tdd_bw *b, tdd_op op, tdd_value *const *in, int n_in, const td_attr *attrs,
                size_t nattrs, tdd_value **out, int n_out)
{
    return bw_submit(b, op, in, n_in, attrs, nattrs, 0, NULL, out, n_out);
}

/* ---------------------------------------------------------------- backward */

typedef struct {
    tdd_node **v;
    size_t n, cap;
} node_list;

static int list_push(node_list *l, tdd_node *n)
{
    if (l->n == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 32;
        tdd_node **t = realloc(l->v, cap * sizeof *t);
        if (!t)
            return TD_ERESOURCE_EXHAUSTED;
        l->v = t;
        l->cap = cap;
    }
    l->v[l->n++] = n;
    return 0;
}

static int by_seq_desc(const void *a, const void *b)
{
    const tdd_node *x = *(tdd_node *const *)a, *y = *(tdd_node *const *)b;
    return x->seq < y->seq ? 1 : x->seq > y->seq ? -1 : 0;
}

/* Whether node n can run its formula: its saved tensors kept, not updated in place since,
 * not poisoned. Checked for every node a pass runs before anything is queued, so a failing
 * backward queues nothing. */
static int check_node(const tdd_node *n, td_error *err)
{
    if (n->freed)
        return tdd_err_arg(err, "retain_graph",
                           "trying to backward through the graph a second time (%s's saved "
                           "tensors were freed by an earlier backward without retain_graph)",
                           n->to_device ? "to_device" : tdd_opdefs[n->op].name);
    if (!n->to_device && !tdd_formula_exists(n->op))
        return tdd_err_set(err, TD_EUNSUPPORTED_OP, "backward of %s is not implemented",
                           tdd_opdefs[n->op].name);
    for (int i = 0; i < n->n_in; i++) {
        const tdd_node_in *ni = &n->in[i];
        /* The storage's count, not the value's: a view saved for backward (unsqueeze(w),
         * transpose(w), detach(w)) sees an update made through w, as in torch. */
        if (ni->v && storage_version(ni->v) != ni->version)
            return tdd_err_arg(err, "tensor",
                               "one of the variables needed for gradient computation has been "
                               "modified by an inplace operation: input %d of %s (handle %llu) "
                               "shares storage updated in place (an optimizer step, a "
                               "batch_norm's running stats) after it was saved for backward",
                               i, tdd_opdefs[n->op].name, (unsigned long long)ni->v->handle);
        if (ni->v && tdd_value_poisoned(ni->v))
            return tdd_err_poisoned(err, ni->v);
    }
    for (int k = 0; k < n->n_out; k++) {
        const tdd_value *al = n->out[k].alias;
        if (al && storage_version(al) != n->out[k].version)
            return tdd_err_arg(err, "tensor",
                               "one of the variables needed for gradient computation has been "
                               "modified by an inplace operation: output %d of %s shares "
                               "storage updated in place (by an optimizer step) after it was "
                               "saved for backward",
                               k, tdd_opdefs[n->op].name);
        if (tdd_formula_saves_output(n->op) && is_float(n->out[k].dtype) && !al)
            return tdd_err_set(err, TD_ERESOURCE_EXHAUSTED,
                               "a saved output of %s was lost (out of memory)",
                               tdd_opdefs[n->op].name);
    }
    return 0;
}

/* Every node the loss leads back to through inputs that need grad, latest first (the
 * edges stay when a pass frees the saved tensors: a grad-of pass may not run them). */
static int collect(tdd_node *root, node_list *order, td_error *err)
{
    uint64_t stamp = ++visit_stamp;
    node_list stack = {0};
    int rc = list_push(&stack, root);
    root->visit = stamp;
    while (!rc && stack.n) {
        tdd_node *n = stack.v[--stack.n];
        rc = list_push(order, n);
        for (int i = 0; i < n->n_in && !rc; i++) {
            tdd_node_in *ni = &n->in[i];
            if (ni->needs_grad && ni->fn && ni->fn->visit != stamp) {
                ni->fn->visit = stamp;
                rc = list_push(&stack, ni->fn);
            }
        }
    }
    if (rc)
        tdd_err_set(err, rc, "out of host memory");
    free(stack.v);
    if (!rc)
        qsort(order->v, order->n, sizeof *order->v, by_seq_desc);
    return rc;
}

/* *slot += g (a reference is taken). */
static void accumulate(tdd_bw *b, tdd_value **slot, tdd_value *g)
{
    if (!g || b->rc)
        return;
    if (*slot) {
        tdd_value *in[2] = {*slot, g};
        g = tdd_bw_op(b, TDD_OP_ADD, in, 2, NULL, 0, 0, NULL);
        if (!g)
            return;
        tdd_value_unref(*slot);
    }
    tdd_value_ref(g);
    *slot = g;
}

static int accumulate_leaf(tdd_bw *b, tdd_grads *grads, tdd_value *leaf, tdd_value *g)
{
    tdd_grad_entry *e = tdd_grads_find(grads, leaf);
    tdd_value *cur = e ? e->grad : NULL;
    if (cur) {
        tdd_value_ref(cur);
        accumulate(b, &cur, g);
        if (!b->rc)
            b->rc = tdd_grads_set(grads, leaf, cur, &b->err);
        tdd_value_unref(cur);
    } else if (!b->rc) {
        b->rc = tdd_grads_set(grads, leaf, g, &b->err);
    }
    return b->rc;
}

/* Brings a formula's gradient to the input's shape (broadcasting reduced
 * away) and dtype (promotion undone). */
static tdd_value *fit_to_input(tdd_bw *b, tdd_value *g, const tdd_node_in *ni)
{
    if (!g)
        return NULL;
    if (!same_shape(g->t.ndim, g->t.shape, ni->ndim, ni->shape)) {
        td_attr a = {
            .name = "shape", .kind = TD_ATTR_INTS, .ints = ni->shape, .n = (size_t)ni->ndim};
        g = tdd_bw_op(b, TDD_OP_SUM_TO, &g, 1, &a, 1, 0, NULL);
    }
    if (g && g->t.dtype != ni->dtype)
        g = tdd_bw_op(b, TDD_OP_CAST, &g, 1, NULL, 0, ni->dtype, NULL);
    return g;
}

static tdd_value *zeros_like_out(tdd_bw *b, const tdd_node_out *o, tdd_device *dev)
{
    td_attr a = {.name = "shape", .kind = TD_ATTR_INTS, .ints = o->shape, .n = (size_t)o->ndim};
    return tdd_bw_op(b, TDD_OP_ZEROS, NULL, 0, &a, 1, o->dtype, dev);
}

/* What one pass does beyond the formulas: where leaf gradients go, and, for a grad-of
 * pass, which values are wanted (their stamp in tdd_value.mark). */
typedef struct {
    tdd_grads *grads;
    uint64_t want; /* 0: every tracked leaf; else the stamp of the wanted values */
    uint64_t need; /* with want: the stamp (tdd_node.visit) of the nodes to run */
} pass;

static bool wanted(const pass *p, const tdd_value *v)
{
    return !p->want || v->mark == p->want;
}

/* A saved output's stand-in for a create_graph formula: the output again, as a value whose
 * grad_fn is n, so the formula's result depends on n's inputs through it (d tanh(x)/dx is
 * written with tanh(x)). n holds none of these (no cycle); they die with the new graph. */
static void track_saved_outputs(tdd_bw *b, tdd_node *n, tdd_value **keep)
{
    for (int k = 0; k < n->n_out && !b->rc; k++) {
        tdd_value *al = n->out[k].alias;
        if (!al)
            continue;
        tdd_value *t = tdd_value_alias(al);
        if (!t) {
            tdd_bw_fail(b, TD_ERESOURCE_EXHAUSTED, "out of host memory");
            return;
        }
        t->grad_fn = n;
        n->refs++;
        t->requires_grad = true;
        tdd_bw_keep(b, t);
        keep[k] = al;
        n->out[k].alias = t;
    }
}

static void untrack_saved_outputs(tdd_node *n, tdd_value **keep)
{
    for (int k = 0; k < n->n_out; k++)
        if (keep[k])
            n->out[k].alias = keep[k];
}

/* A grad-of pass: the finished gradients of n's outputs that are wanted non-leaves (every
 * user of them was made after n, so has run). */
static void capture_outputs(tdd_bw *b, tdd_node *n, const pass *p, tdd_value *const *inputs,
                            size_t n_inputs)
{
    for (size_t j = 0; j < n_inputs && !b->rc; j++) {
        tdd_value *v = inputs[j];
        if (v->grad_fn != n)
            continue;
        tdd_value *g = n->out[out_index(n, v)].grad; /* v's shape and dtype already */
        if (g && !tdd_grads_find(p->grads, v))
            b->rc = tdd_grads_set(p->grads, v, g, &b->err);
    }
}

/* A ToDevice's gradient: the output's copied back to the source device (recorded as a
 * ToDevice itself in a create_graph pass). */
static tdd_value *copy_back(tdd_bw *b, tdd_value *g, tdd_device *dev)
{
    tdd_node *node = NULL;
    tdd_value *c = NULL;
    td_error err;
    int rc = 0;
    if (b->create_graph && g->requires_grad && !(node = tdd_autograd_reserve(b->s, 1, 1, &err)))
        rc = err.code;
    if (!rc)
        rc = tdd_submit_copy(b->s, b->req_id, g, dev, &c, &err);
    if (rc) {
        tdd_autograd_unreserve(node);
        b->err = err;
        b->rc = rc;
        return NULL;
    }
    if (node)
        tdd_autograd_record_to_device(node, g, c);
    tdd_bw_keep(b, c);
    return b->rc ? NULL : c;
}

/* A formula's refusal names its op: in a second pass the op is one the first pass recorded
 * (conv2d for conv2d's own gradient), not one the client wrote. */
static void name_the_op(tdd_bw *b, const tdd_node *n)
{
    const char *name = tdd_opdefs[n->op].name;
    if (strstr(b->err.message, name))
        return;
    char m[sizeof b->err.message];
    snprintf(m, sizeof m, "backward of %.24s: %.200s", name, b->err.message);
    memcpy(b->err.message, m, sizeof m);
}

/* Runs one node's formula and hands the input gradients on. */
static void backward_node(tdd_bw *b, tdd_node *n, const pass *p)
{
    bool any = false;
    for (int k = 0; k < n->n_out; k++)
        any |= n->out[k].grad != NULL;
    if (!any)
        return;
    size_t mark = b->ntmp;
    tdd_device *dev = n->in[0].dev;
    for (int k = 0; k < n->n_out && !b->rc; k++)
        if (!n->out[k].grad && is_float(n->out[k].dtype))
            accumulate(b, &n->out[k].grad, zeros_like_out(b, &n->out[k], dev));
    tdd_value *gin[TDD_MAX_OP_INPUTS] = {0};
    if (b->rc)
        return;
    if (n->to_device) {
        gin[0] = copy_back(b, n->out[0].grad, n->in[0].dev);
    } else {
        tdd_value *keep[TDD_MAX_OP_OUTPUTS] = {0};
        if (b->create_graph)
            track_saved_outputs(b, n, keep);
        if (!b->rc && tdd_backward_formula(b, n, gin))
            name_the_op(b, n);
        untrack_saved_outputs(n, keep);
    }
    for (int i = 0; i < n->n_in && !b->rc; i++) {
        tdd_node_in *ni = &n->in[i];
        if (!ni->needs_grad || (ni->leaf && !wanted(p, ni->leaf)) ||
            (ni->fn && p->want && ni->fn->visit != p->need &&
             !(ni->fn->capture & (1u << ni->fn_out))))
            continue; /* leads to nothing wanted */
        if (!gin[i]) {
            tdd_bw_fail(b, TD_EINTERNAL, "backward of %s gave no gradient for input %d",
                        tdd_opdefs[n->op].name, i);
            break;
        }
        tdd_value *g = fit_to_input(b, gin[i], ni);
        if (ni->fn)
            accumulate(b, &ni->fn->out[ni->fn_out].grad, g);
        else if (ni->leaf)
            accumulate_leaf(b, p->grads, ni->leaf, g);
    }
    for (int k = 0; k < n->n_out; k++) {
        tdd_value_unref(n->out[k].grad);
        n->out[k].grad = NULL;
    }
    tdd_bw_release(b, mark);
}

static tdd_value *ones_like(tdd_bw *b, const tdd_value *v)
{
    td_attr a[2] = {
        {.name = "shape", .kind = TD_ATTR_INTS, .ints = v->t.shape, .n = (size_t)v->t.ndim},
        {.name = "value", .kind = TD_ATTR_FLOAT, .f = 1.0}};
    return tdd_bw_op(b, TDD_OP_FULL, NULL, 0, a, 2, v->t.dtype, v->dev);
}

/* A grad-of pass runs only the nodes that lead to a wanted value: those stamped p->need
 * here (in creation order, so a node's inputs' nodes are decided first). A node with a
 * wanted output (capture) is kept to read that output's gradient, run or not. */
static void mark_needed(node_list *order, pass *p, tdd_value *const *inputs, size_t n_inputs,
                        uint64_t collected)
{
    p->need = ++visit_stamp;
    for (size_t j = 0; j < n_inputs; j++) {
        tdd_node *fn = inputs[j]->grad_fn;
        if (fn && fn->visit == collected)
            fn->capture |= 1u << out_index(fn, inputs[j]);
    }
    for (size_t i = order->n; i-- > 0;) {
        tdd_node *n = order->v[i];
        for (int k = 0; k < n->n_in && n->visit != p->need; k++) {
            const tdd_node_in *ni = &n->in[k];
            if (ni->needs_grad &&
                ((ni->fn && (ni->fn->visit == p->need || (ni->fn->capture & (1u << ni->fn_out)))) ||
                 (ni->leaf && wanted(p, ni->leaf))))
                n->visit = p->need;
        }
    }
    size_t kept = 0;
    for (size_t i = 0; i < order->n; i++)
        if (order->v[i]->visit == p->need || order->v[i]->capture)
            order->v[kept++] = order->v[i];
    order->n = kept;
}

int tdd_autograd_backward(tdd_session *s, uint64_t req_id, tdd_value *loss, tdd_value *go,
                          const tdd_backward_opts *o, tdd_grads **out, td_error *err)
{
    node_list order = {0};
    int rc = 0;
    uint64_t collected = 0;
    if (loss->grad_fn) {
        rc = collect(loss->grad_fn, &order, err);
        collected = visit_stamp;
    }
    pass p = {0};
    if (!rc && !(p.grads = grads_new(s)))
        rc = tdd_err_set(err, TD_ERESOURCE_EXHAUSTED, "out of host memory");
    if (rc) {
        free(order.v);
        return rc;
    }
    if (o->n_inputs) {
        static uint64_t want_stamp;
        p.want = (UINT64_C(1) << 62) | ++want_stamp; /* a range of its own (group.c's) */
        for (size_t j = 0; j < o->n_inputs; j++)
            o->inputs[j]->mark = p.want;
        mark_needed(&order, &p, o->inputs, o->n_inputs, collected);
    }

    for (size_t i = 0; i < order.n && !rc; i++)
        if (!p.want || order.v[i]->visit == p.need)
            rc = check_node(order.v[i], err);
    if (rc) {
        for (size_t i = 0; i < order.n; i++)
            order.v[i]->capture = 0;
        free(order.v);
        grads_free(p.grads);
        return rc;
    }

    tdd_bw b = {.s = s, .req_id = req_id, .create_graph = o->create_graph};
    tdd_value *root = go ? go : ones_like(&b, loss);
    tdd_node *top = loss->grad_fn;
    if (!top) {
        /* The loss is itself a leaf: its gradient is grad_output. */
        if (root && wanted(&p, loss))
            accumulate_leaf(&b, p.grads, loss, root);
    } else if (root) {
        accumulate(&b, &top->out[out_index(top, loss)].grad, root);
    }
    for (size_t i = 0; i < order.n && !b.rc; i++) {
        if (order.v[i]->capture)
            capture_outputs(&b, order.v[i], &p, o->inputs, o->n_inputs);
        if (!p.want || order.v[i]->visit == p.need)
            backward_node(&b, order.v[i], &p);
    }
    for (size_t i = 0; i < order.n; i++) {
        order.v[i]->capture = 0;
        for (int k = 0; k < order.v[i]->n_out; k++) {
            tdd_value_unref(order.v[i]->out[k].grad);
            order.v[i]->out[k].grad = NULL;
        }
    }
    for (size_t j = 0; j < o->n_inputs; j++)
        if (o->inputs[j]->grad_fn)
            o->inputs[j]->grad_fn->capture = 0;
    tdd_bw_release(&b, 0);
    free(b.tmp);
    if (b.rc) {
        free(order.v);
        grads_free(p.grads);
        *err = b.err;
        return b.rc;
    }
    if (!o->retain_graph)
        for (size_t i = 0; i < order.n; i++) {
            if (p.want && order.v[i]->visit != p.need)
                continue; /* read, not run (a wanted output's node): its graph stays */
            node_drop_saved(order.v[i]);
            order.v[i]->freed = true;
        }
    free(order.v);
    *out = p.grads;
    return 0;
}

/* ---------------------------------------------------------------- entry */

void tdd_autograd_init(void)
{
    static const tdd_session_hooks hooks = {.value_free = value_free, .session_free = session_free};
    tdd_session_set_hooks(&hooks);
    tdd_handle_set_free_fn(TD_HANDLE_GRADIENTS, grads_free);
    tdd_optim_init();
}
