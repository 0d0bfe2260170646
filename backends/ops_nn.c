/* ops_nn.c -- tdd_op_prepare rules for linear algebra (PyTorch's matmul
 * broadcasting), NN ops and losses, and creation ops. */
#include <math.h>
#include <string.h>

#include "dtype.h"
#include "ops_impl.h"

static int same_dtype(tdd_prep *p, const tdd_tensor *a, const tdd_tensor *b)
{
    if (a->dtype != b->dtype)
        return tdd_err_dtypes(p->err, a->dtype, b->dtype, "%s: dtypes differ (%s and %s)", p->name,
                              td_dtype_name(a->dtype), td_dtype_name(b->dtype));
    return 0;
}

/* A convolution's optional third input: a bias of x's dtype, [O] (flag 4 says it is there). */
static int conv_bias(tdd_prep *p, const tdd_tensor *x, int64_t O)
{
    if (p->n_in != 3)
        return 0;
    const tdd_tensor *b = p->in[2];
    int rc = same_dtype(p, x, b);
    if (rc)
        return rc;
    if (b->ndim != 1 || b->shape[0] != O)
        return tdd_err_shape(p->err, &O, 1, b->shape, b->ndim, "%s: bias must be [out_channels]",
                             p->name);
    p->args->flags |= 4u;
    return 0;
}

static int need_float(tdd_prep *p, const tdd_tensor *a)
{
    return tdd_dtype_is_float(a->dtype) ? 0 : tdd_p_unsupported(p, a->dtype);
}

static int prep_matmul(tdd_prep *p)
{
    tdd_opargs *g = p->args;
    const tdd_tensor *a = p->in[0], *b = p->in[1];
    int rc;
    if ((rc = same_dtype(p, a, b)))
        return rc;
    if (a->dtype == TD_BOOL)
        return tdd_p_unsupported(p, a->dtype);
    bool lin = p->op == TDD_OP_LINEAR;
    if (p->op == TDD_OP_BMM && (a->ndim != 3 || b->ndim != 3))
        return tdd_err_arg(p->err, "input", "bmm: inputs must be 3-D, got %d-D and %d-D", a->ndim,
                           b->ndim);
    if (a->ndim == 0 || b->ndim == 0)
        return tdd_err_arg(p->err, "input", "%s: inputs must be at least 1-D", p->name);
    if (lin && b->ndim > 2)
        return tdd_err_arg(p->err, "weight", "linear: weight must be 1-D or 2-D");
    bool a1 = a->ndim == 1, b1 = b->ndim == 1;
    int64_t M = a1 ? 1 : a->shape[a->ndim - 2], K = a->shape[a->ndim - 1];
    int64_t Kb, N;
    if (lin) {
        Kb = b->shape[b->ndim - 1];
        N = b1 ? 1 : b->shape[0];
    } else {
        Kb = b1 ? b->shape[0] : b->shape[b->ndim - 2];
        N = b1 ? 1 : b->shape[b->ndim - 1];
    }
    if (K != Kb)
        return tdd_err_shape(p->err, a->shape, a->ndim, b->shape, b->ndim,
                             "%s: inner dimensions differ (%lld and %lld)", p->name, (long long)K,
                             (long long)Kb);
    int64_t batch[TD_MAX_NDIM], shape[TD_MAX_NDIM];
    int nb = 0, nd;
    int an = a->ndim > 2 ? a->ndim - 2 : 0, bn = (!lin && b->ndim > 2) ? b->ndim - 2 : 0;
    if (p->op == TDD_OP_BMM && a->shape[0] != b->shape[0])
        return tdd_err_shape(p->err, a->shape, 3, b->shape, 3, "bmm: batch sizes differ");
    if ((rc = tdd_p_bcast(p, a->shape, an, b->shape, bn, batch, &nb)))
        return rc;
    memcpy(shape, batch, sizeof shape);
    nd = nb;
    if (!a1)
        shape[nd++] = M;
    if (!b1)
        shape[nd++] = N;
    g->i[0] = M;
    g->i[1] = K;
    g->i[2] = N;
    g->i[3] = nb;
    memcpy(g->ints[0], batch, sizeof batch);
    g->flags = (a1 ? 1u : 0u) | (b1 ? 2u : 0u);
    if (lin && p->n_in == 3) {
        const tdd_tensor *bias = p->in[2];
        int64_t bs[TD_MAX_NDIM];
        int bnd;
        if ((rc = same_dtype(p, a, bias)))
            return rc;
        if ((rc = tdd_p_bcast(p, shape, nd, bias->shape, bias->ndim, bs, &bnd)))
            return rc;
        if (bnd != nd || memcmp(bs, shape, (size_t)nd * sizeof *bs) != 0)
            return tdd_err_shape(p->err, shape, nd, bias->shape, bias->ndim,
                                 "linear: bias does not broadcast to the output");
        g->flags |= 4u;
    }
    g->dtype = g->cdtype = a->dtype;
    tdd_p_out(p, 0, a->dtype, shape, nd);
    return 0;
}

/* addmm/baddbmm: the product's rule on inputs 1 and 2, then input 0 broadcast to it */
static int prep_addmm(tdd_prep *p)
{
    tdd_opargs *g = p->args;
    const tdd_tensor *x = p->in[0], *m1 = p->in[1], *m2 = p->in[2];
    int want = p->op == TDD_OP_ADDMM ? 2 : 3, rc;
    if (m1->ndim != want || m2->ndim != want)
        return tdd_err_arg(p->err, "input", "%s: the matrices must be %d-D, got %d-D and %d-D",
                           p->name, want, m1->ndim, m2->ndim);
    tdd_prep q = *p;
    q.op = want == 2 ? TDD_OP_MATMUL : TDD_OP_BMM;
    q.in = p->in + 1;
    q.n_in = 2;
    if ((rc = prep_matmul(&q)) || (rc = same_dtype(p, m1, x)))
        return rc;
    const tdd_outdesc *o = &p->out[0];
    int64_t bs[TD_MAX_NDIM];
    int bn;
    if ((rc = tdd_p_bcast(p, o->shape, o->ndim, x->shape, x->ndim, bs, &bn)))
        return rc;
    if (bn != o->ndim || memcmp(bs, o->shape, (size_t)bn * sizeof *bs) != 0)
        return tdd_err_shape(p->err, o->shape, o->ndim, x->shape, x->ndim,
                             "%s: input does not broadcast to the product's shape", p->name);
    bool fl = tdd_dtype_is_float(x->dtype);
    const char *names[2] = {"beta", "alpha"};
    for (int k = 0; k < 2; k++) {
        const td_attr *a = tdd_p_get(p, names[k]);
        if ((rc = tdd_p_float(p, names[k], 1.0, &g->f[2 + k])))
            return rc;
        if (a && a->kind == TD_ATTR_FLOAT && !fl)
            return tdd_err_arg(p->err, names[k], "%s: %s must be an int for integral inputs",
                               p->name, names[k]);
        g->n[2 + k] = tdd_sat_i64(g->f[2 + k]);
    }
    return 0;
}

static int get_reduction(tdd_prep *p)
{
    const char *s;
    int rc = tdd_p_str(p, "reduction", "mean", &s);
    if (rc)
        return rc;
    if (strcmp(s, "mean") == 0)
        p->args->i[0] = TDD_RED_MEAN;
    else if (strcmp(s, "sum") == 0)
        p->args->i[0] = TDD_RED_SUM;
    else if (strcmp(s, "none") == 0)
        p->args->i[0] = TDD_RED_NONE;
    else
        return tdd_err_arg(p->err, "reduction",
                           "%s: reduction must be \"mean\", \"sum\" or \"none\", got \"%s\"",
                           p->name, s);
    return 0;
}

/* Output of a loss: the per-element shape for "none", else a scalar. */
static void loss_out(tdd_prep *p, td_dtype dt, const int64_t *shape, int nd)
{
    if (p->args->i[0] == TDD_RED_NONE)
        tdd_p_out(p, 0, dt, shape, nd);
    else
        tdd_p_out(p, 0, dt, NULL, 0);
}

static int prep_class_loss(tdd_prep *p)
{
    tdd_opargs *g = p->args;
    const tdd_tensor *x = p->in[0], *t = p->in[1];
    int rc;
    if ((rc = need_float(p, x)) || (rc = get_reduction(p)) ||
        (rc = tdd_p_int(p, "ignore_index", -100, &g->i[1])))
        return rc;
    if (p->op == TDD_OP_CROSS_ENTROPY) {
        if ((rc = tdd_p_float(p, "label_smoothing", 0.0, &g->f[0])))
            return rc;
        if (!(g->f[0] >= 0.0 && g->f[0] <= 1.0))
            return tdd_err_arg(p->err, "label_smoothing",
                               "cross_entropy: label_smoothing must be in [0, 1]");
    }
    if (x->ndim < 1)
        return tdd_err_arg(p->err, "input", "%s: input must be [N, C, d...] or [C], got 0-D",
                           p->name);
    /* the class dim is 1 ([C]: 0); a row is every other coordinate */
    int cd = x->ndim == 1 ? 0 : 1;
    int64_t rows[TD_MAX_NDIM], C = x->shape[cd], S = 1;
    int nr = 0;
    for (int d = 0; d < x->ndim; d++)
        if (d != cd)
            rows[nr++] = x->shape[d];
    for (int d = 2; d < x->ndim; d++)
        S *= x->shape[d];
    g->i[2] = S;
    if (p->op == TDD_OP_CROSS_ENTROPY && tdd_dtype_is_float(t->dtype)) {
        /* class probabilities, shaped as the input (PyTorch's soft targets) */
        if ((rc = same_dtype(p, x, t)))
            return rc;
        if (!tdd_same_shape(x, t))
            return tdd_err_shape(p->err, x->shape, x->ndim, t->shape, t->ndim,
                                 "cross_entropy: class-probability targets must have the input's "
                                 "shape");
        g->flags |= 2u;
    } else {
        if (t->dtype != TD_I64)
            return tdd_err_dtypes(p->err, TD_I64, t->dtype,
                                  "%s: target must hold int64 class indices%s, got %s", p->name,
                                  p->op == TDD_OP_CROSS_ENTROPY ? " (or float probabilities)" : "",
                                  td_dtype_name(t->dtype));
        if (t->ndim != nr || memcmp(t->shape, rows, (size_t)nr * sizeof *rows) != 0)
            return tdd_err_shape(p->err, rows, nr, t->shape, t->ndim,
                                 "%s: target shape must be the input's without the class dim",
                                 p->name);
    }
    if (p->n_in == 3) {
        const tdd_tensor *w = p->in[2];
        if ((rc = same_dtype(p, x, w)))
            return rc;
        if (w->ndim != 1 || w->shape[0] != C)
            return tdd_err_shape(p->err, &C, 1, w->shape, w->ndim,
                                 "%s: weight must be [C], one per class", p->name);
        g->flags |= 1u;
    }
    if (C == 0)
        return tdd_err_arg(p->err, "input", "%s: input has no classes", p->name);
    g->dtype = g->cdtype = x->dtype;
    loss_out(p, x->dtype, rows, nr);
    return 0;
}

/* One or two ints (an int applies to both spatial dims). */
static int pair(tdd_prep *p, const char *name, int64_t def, int64_t lo, int64_t *v)
{
    int64_t t[2];
    int n, rc = tdd_p_ints(p, name, t, 2, &n);
    if (rc)
        return rc;
    if (n < 0 || n == 0) {
        v[0] = v[1] = def;
    } else {
        v[0] = t[0];
        v[1] = n == 2 ? t[1] : t[0];
    }
    if (v[0] < lo || v[1] < lo || v[0] > INT32_MAX || v[1] > INT32_MAX)
        return tdd_err_arg(p->err, name, "%s: %s must be >= %lld", p->name, name, (long long)lo);
    return 0;
}

static int prep_conv_pool(tdd_prep *p)
{
    tdd_opargs *g = p->args;
    const tdd_tensor *x = p->in[0];
    int rc;
    if ((rc = need_float(p, x)))
        return rc;
    if (x->ndim != 3 && x->ndim != 4)
        return tdd_err_arg(p->err, "input", "%s: input must be [N, C, H, W] or [C, H, W]", p->name);
    bool batched = x->ndim == 4;
    int64_t N = batched ? x->shape[0] : 1, C = x->shape[x->ndim - 3];
    int64_t H = x->shape[x->ndim - 2], W = x->shape[x->ndim - 1];
    int64_t *st = g->ints[0], *pd = g->ints[1], *dl = g->ints[2], *ks = g->ints[3];
    int64_t O = C;
    if (p->op == TDD_OP_CONV2D) {
        const tdd_tensor *w = p->in[1];
        if ((rc = same_dtype(p, x, w)))
            return rc;
        if ((rc = tdd_p_int(p, "groups", 1, &g->i[0])))
            return rc;
        if (g->i[0] < 1 || C % g->i[0] != 0)
            return tdd_err_arg(p->err, "groups", "conv2d: groups must divide the channels");
        if (w->ndim != 4 || w->shape[1] * g->i[0] != C || w->shape[0] % g->i[0] != 0)
            return tdd_err_shape(p->err, x->shape, x->ndim, w->shape, w->ndim,
                                 "conv2d: weight must be [O, C/groups, kh, kw] with O %% groups "
                                 "== 0");
        O = w->shape[0];
        ks[0] = w->shape[2];
        ks[1] = w->shape[3];
        if (ks[0] > INT32_MAX || ks[1] > INT32_MAX) /* keeps dilation * kernel in range */
            return tdd_err_shape(p->err, x->shape, x->ndim, w->shape, w->ndim,
                                 "conv2d: kernel too large");
        if ((rc = conv_bias(p, x, O)))
            return rc;
        const td_attr *pa = tdd_p_get(p, "padding");
        bool named = pa && pa->kind == TD_ATTR_STR;
        if ((rc = pair(p, "stride", 1, 1, st)) || (!named && (rc = pair(p, "padding", 0, 0, pd))) ||
            (rc = pair(p, "dilation", 1, 1, dl)))
            return rc;
        if (named && strcmp(pa->s, "same") == 0) {
            /* PyTorch's: the input's size kept, the span's odd row/column at the end */
            if (st[0] != 1 || st[1] != 1)
                return tdd_err_arg(p->err, "padding", "conv2d: padding=\"same\" needs stride 1");
            for (int k = 0; k < 2; k++) {
                int64_t total = dl[k] * (ks[k] - 1);
                pd[k] = total / 2;
                pd[2 + k] = total - 2 * pd[k];
            }
        } else if (named && strcmp(pa->s, "valid") != 0) {
            return tdd_err_arg(p->err, "padding",
                               "conv2d: padding must be an int, (h, w), \"same\" or \"valid\", "
                               "got \"%.32s\"",
                               pa->s);
        }
    } else {
        if (!tdd_p_get(p, "kernel_size"))
            return tdd_p_missing(p, "kernel_size");
        bool ceil_mode;
        dl[0] = dl[1] = 1; /* avg_pool2d takes no dilation (as PyTorch) */
        if ((rc = pair(p, "kernel_size", 1, 1, ks)) || (rc = pair(p, "stride", 0, 0, st)) ||
            (rc = pair(p, "padding", 0, 0, pd)) ||
            (p->op != TDD_OP_AVG_POOL2D && (rc = pair(p, "dilation", 1, 1, dl))) ||
            (rc = tdd_p_bool(p, "ceil_mode", false, &ceil_mode)))
            return rc;
        g->i[1] = ceil_mode;
        if (st[0] == 0 || st[1] == 0) {
            const td_attr *sa = tdd_p_get(p, "stride");
            if (sa && !(sa->kind == TD_ATTR_INTS && sa->n == 0))
                return tdd_err_arg(p->err, "stride", "%s: stride must be positive", p->name);
            st[0] = ks[0];
            st[1] = ks[1];
        }
        if (pd[0] > ks[0] / 2 || pd[1] > ks[1] / 2)
            return tdd_err_arg(p->err, "padding",
                               "%s: padding must be at most half the kernel size", p->name);
        bool cip = true; /* max_pool2d takes no count_include_pad */
        if (p->op == TDD_OP_AVG_POOL2D && (rc = tdd_p_bool(p, "count_include_pad", true, &cip)))
            return rc;
        g->i[2] = cip;
    }
    int64_t out[2], in[2] = {H, W};
    for (int k = 0; k < 2; k++) {
        int64_t span = dl[k] * (ks[k] - 1) + 1, room = in[k] + 2 * pd[k] + pd[2 + k] - span;
        if (room < 0)
            return tdd_err_shape(p->err, ks, 2, in, 2,
                                 "%s: kernel (dilated) is larger than the padded input", p->name);
        int64_t o = room / st[k] + 1;
        if (g->i[1] && room % st[k] != 0) {
            o++;
            if ((o - 1) * st[k] >= in[k] + pd[k])
                o--; /* the last window must start inside the input or left padding */
        }
        out[k] = o;
    }
    int64_t shape[4];
    int nd = 0;
    if (batched)
        shape[nd++] = N;
    shape[nd++] = O;
    shape[nd++] = out[0];
    shape[nd++] = out[1];
    g->dtype = g->cdtype = x->dtype;
    tdd_p_out(p, 0, x->dtype, shape, nd);
    if (p->op == TDD_OP_MAX_POOL2D || p->op == TDD_OP_MAX_POOL2D_BACKWARD) {
        bool ri;
        if ((rc = tdd_p_bool(p, "return_indices", false, &ri)))
            return rc;
        if (ri)
            tdd_p_out(p, 1, TD_I64, shape, nd);
    }
    return 0;
}

/* max_pool2d_backward(grad_output, input): max_pool2d's input gradient in one kernel, each
 * window's gradient added at the position the forward chose (the first of equal maxima, a NaN
 * over any number). Its attributes are max_pool2d's; grad_output has its output's shape. */
static int prep_max_pool2d_backward(tdd_prep *p)
{
    const tdd_tensor *go = p->in[0], *x = p->in[1];
    tdd_outdesc fwd[TDD_MAX_OP_OUTPUTS];
    int nf = 0, rc;
    tdd_prep q = *p;
    q.in = p->in + 1;
    q.n_in = 1;
    q.out = fwd;
    q.n_out = &nf;
    if ((rc = prep_conv_pool(&q)) || (rc = same_dtype(p, go, x)))
        return rc;
    if (go->ndim != fwd[0].ndim ||
        memcmp(go->shape, fwd[0].shape, (size_t)go->ndim * sizeof *go->shape) != 0)
        return tdd_err_shape(p->err, go->shape, go->ndim, fwd[0].shape, fwd[0].ndim,
                             "max_pool2d_backward: grad_output must have max_pool2d's output "
                             "shape");
    tdd_p_out(p, 0, x->dtype, x->shape, x->ndim);
    return 0;
}

/* t with a dim of size 1 inserted before its last (conv1d's [N, C, L] as [N, C, 1, L]). */
static tdd_tensor with_unit_row(const tdd_tensor *t)
{
    tdd_tensor u = *t;
    int nd = t->ndim;
    if (nd < 1 || nd >= TD_MAX_NDIM)
        return u;
    u.shape[nd] = t->shape[nd - 1];
    u.strides[nd] = t->strides[nd - 1];
    u.shape[nd - 1] = 1;
    u.strides[nd - 1] = t->shape[nd - 1] * t->strides[nd - 1];
    u.ndim = nd + 1;
    return u;
}

/* A 1-D op's attributes as its 2-D twin's (conv1d's and the 1-D pools'): each of names[0..n)
 * present as an int or (l,) becomes the pair (lead[k], l); a string (conv1d's padding) and an
 * empty list (the pools' stride: the kernel's) pass as they are; keep[] (bools, groups) pass
 * as they are. as (room for n + n_keep) holds them, pairs the pairs. */
static int widen_1d(tdd_prep *p, const char *const *names, const int64_t *lead, int n,
                    const char *const *keep, int n_keep, td_attr *as, int64_t (*pairs)[2],
                    tdd_opreq *req)
{
    size_t m = 0;
    for (int k = 0; k < n; k++) {
        const td_attr *a = tdd_p_get(p, names[k]);
        if (!a)
            continue;
        as[m] = *a;
        if (a->kind == TD_ATTR_INT || a->kind == TD_ATTR_BOOL ||
            (a->kind == TD_ATTR_INTS && a->n == 1)) {
            pairs[k][0] = lead[k];
            pairs[k][1] = a->kind == TD_ATTR_INTS ? a->ints[0] : a->i;
            as[m].kind = TD_ATTR_INTS;
            as[m].ints = pairs[k];
            as[m].n = 2;
        } else if (a->kind == TD_ATTR_INTS && a->n == 0 && p->op != TDD_OP_CONV1D) {
            /* the pools' stride=[]: the default */
        } else if (a->kind != TD_ATTR_STR || p->op != TDD_OP_CONV1D ||
                   strcmp(names[k], "padding")) {
            return tdd_err_arg(
                p->err, names[k], "%s: %s must be an int or (l,)%s", p->name, names[k],
                p->op == TDD_OP_CONV1D && !strcmp(names[k], "padding") ? ", \"same\" or \"valid\""
                                                                       : "");
        }
        m++;
    }
    for (int k = 0; k < n_keep; k++) {
        const td_attr *a = tdd_p_get(p, keep[k]);
        if (a)
            as[m++] = *a;
    }
    *req = *p->req;
    req->attrs.a = as;
    req->attrs.n = m;
    return 0;
}

/* The outputs of a 1-D op prepared as its 2-D twin: the unit row dropped. */
static void drop_unit_row(tdd_prep *p)
{
    for (int i = 0; i < *p->n_out; i++) {
        tdd_outdesc *o = &p->out[i];
        o->shape[o->ndim - 2] = o->shape[o->ndim - 1];
        o->ndim--;
    }
}

/* conv1d: conv2d's rule on [N, C, 1, L] and [O, C/groups, 1, k] (the backends run it as that
 * conv2d: tdd_conv1d_by_parts), its attributes widened to (1, s), (0, p), (1, d); the output
 * [N, O, Lo] or [O, Lo]. */
static int prep_conv1d(tdd_prep *p)
{
    const tdd_tensor *x = p->in[0], *w = p->in[1];
    if (x->ndim != 2 && x->ndim != 3)
        return tdd_err_arg(p->err, "input", "conv1d: input must be [N, C, L] or [C, L], got %d-D",
                           x->ndim);
    if (w->ndim != 3)
        return tdd_err_shape(p->err, x->shape, x->ndim, w->shape, w->ndim,
                             "conv1d: weight must be [O, C/groups, k]");
    static const char *const names[3] = {"stride", "padding", "dilation"};
    static const char *const keep[1] = {"groups"};
    static const int64_t lead[3] = {1, 0, 1};
    int64_t pairs[3][2];
    td_attr as[4];
    tdd_opreq req;
    int rc = widen_1d(p, names, lead, 3, keep, 1, as, pairs, &req);
    if (rc)
        return rc;
    tdd_tensor t[2] = {with_unit_row(x), with_unit_row(w)};
    const tdd_tensor *in[3] = {&t[0], &t[1], p->n_in > 2 ? p->in[2] : NULL};
    tdd_prep q = *p;
    q.op = TDD_OP_CONV2D;
    q.in = in;
    q.req = &req;
    if ((rc = prep_conv_pool(&q)))
        return rc;
    drop_unit_row(p);
    return 0;
}

/* max_pool1d/avg_pool1d: max_pool2d's/avg_pool2d's rule on [N, C, 1, L] (the backends run it as
 * that pool: tdd_pool1d_by_parts), kernel_size, stride, dilation widened to (1, k), padding to
 * (0, p); the outputs [N, C, Lo] or [C, Lo] (max_pool1d's indices: positions in L). */
static int prep_pool1d(tdd_prep *p)
{
    const tdd_tensor *x = p->in[0];
    if (x->ndim != 2 && x->ndim != 3)
        return tdd_err_arg(p->err, "input", "%s: input must be [N, C, L] or [C, L], got %d-D",
                           p->name, x->ndim);
    bool mx = p->op == TDD_OP_MAX_POOL1D;
    static const char *const names[4] = {"kernel_size", "stride", "padding", "dilation"};
    static const char *const keep_max[2] = {"ceil_mode", "return_indices"},
                             *const keep_avg[2] = {"ceil_mode", "count_include_pad"};
    static const int64_t lead[4] = {1, 1, 0, 1};
    int64_t pairs[4][2];
    td_attr as[6];
    tdd_opreq req;
    int rc = widen_1d(p, names, lead, mx ? 4 : 3, mx ? keep_max : keep_avg, 2, as, pairs, &req);
    if (rc)
        return rc;
    tdd_tensor t = with_unit_row(x);
    const tdd_tensor *in[1] = {&t};
    tdd_prep q = *p;
    q.op = mx ? TDD_OP_MAX_POOL2D : TDD_OP_AVG_POOL2D;
    q.in = in;
    q.req = &req;
    if ((rc = prep_conv_pool(&q)))
        return rc;
    drop_unit_row(p);
    return 0;
}

/* conv_transpose2d(input [N, Ci, H, W] or [Ci, H, W], weight [Ci, Co/groups, kh, kw], bias
 * [Co]): the adjoint of conv2d; out = (in - 1) s - 2 p + d (k - 1) + output_padding + 1. */
static int prep_conv_transpose2d(tdd_prep *p)
{
    tdd_opargs *g = p->args;
    const tdd_tensor *x = p->in[0], *w = p->in[1];
    int64_t *st = g->ints[0], *pd = g->ints[1], *dl = g->ints[2], *op = g->ints[3];
    int rc;
    if ((rc = need_float(p, x)) || (rc = same_dtype(p, x, w)) ||
        (rc = tdd_p_int(p, "groups", 1, &g->i[0])) || (rc = pair(p, "stride", 1, 1, st)) ||
        (rc = pair(p, "padding", 0, 0, pd)) || (rc = pair(p, "output_padding", 0, 0, op)) ||
        (rc = pair(p, "dilation", 1, 1, dl)))
        return rc;
    if (x->ndim != 3 && x->ndim != 4)
        return tdd_err_arg(p->err, "input",
                           "conv_transpose2d: input must be [N, C, H, W] or [C, H, W], got %d-D",
                           x->ndim);
    bool batched = x->ndim == 4;
    int64_t G = g->i[0], C = x->shape[x->ndim - 3];
    if (G < 1 || C % G != 0)
        return tdd_err_arg(p->err, "groups", "conv_transpose2d: groups must divide the channels");
    if (w->ndim != 4 || w->shape[0] != C || w->shape[2] > INT32_MAX || w->shape[3] > INT32_MAX)
        return tdd_err_shape(p->err, x->shape, x->ndim, w->shape, w->ndim,
                             "conv_transpose2d: weight must be [C, O/groups, kh, kw]");
    int64_t O = w->shape[1] * G, out[2];
    for (int k = 0; k < 2; k++) {
        if (op[k] >= st[k] && op[k] >= dl[k])
            return tdd_err_arg(p->err, "output_padding",
                               "conv_transpose2d: output_padding must be smaller than either "
                               "stride or dilation");
        int64_t in = x->shape[x->ndim - 2 + k];
        out[k] = (in - 1) * st[k] - 2 * pd[k] + dl[k] * (w->shape[2 + k] - 1) + op[k] + 1;
        if (in == 0 || out[k] < 1)
            return tdd_err_arg(p->err, "padding",
                               "conv_transpose2d: the output would have size %lld in dim %d",
                               (long long)out[k], x->ndim - 2 + k);
    }
    if ((rc = conv_bias(p, x, O)))
        return rc;
    int64_t shape[4];
    int nd = 0;
    if (batched)
        shape[nd++] = x->shape[0];
    shape[nd++] = O;
    shape[nd++] = out[0];
    shape[nd++] = out[1];
    g->dtype = g->cdtype = x->dtype;
    tdd_p_out(p, 0, x->dtype, shape, nd);
    return 0;
}

int tdd_pool1d_by_parts(const tdd_opcall *c, tdd_run_fn run, void *ctx, int ordinal)
{
    tdd_tensor x = with_unit_row(c->in[0]), y[2];
    tdd_opcall s = *c;
    s.op = c->op == TDD_OP_MAX_POOL1D ? TDD_OP_MAX_POOL2D : TDD_OP_AVG_POOL2D;
    s.in[0] = &x;
    for (int i = 0; i < c->n_out && i < 2; i++) {
        y[i] = with_unit_row(c->out[i]);
        s.out[i] = &y[i];
    }
    return run(ctx, ordinal, &s);
}

int tdd_conv1d_by_parts(const tdd_opcall *c, tdd_run_fn run, void *ctx, int ordinal)
{
    tdd_tensor x = with_unit_row(c->in[0]), w = with_unit_row(c->in[1]);
    tdd_tensor y = with_unit_row(c->out[0]);
    tdd_opcall s = *c;
    s.op = TDD_OP_CONV2D;
    s.in[0] = &x;
    s.in[1] = &w;
    s.out[0] = &y;
    return run(ctx, ordinal, &s);
}

/* scaled_dot_product_attention: q [..., L, E], k [..., S, E], v [..., S, Ev], mask (bool or
 * q's dtype) broadcasting to [..., L, S]; the batch dims of all four broadcast together. */
static int prep_sdpa(tdd_prep *p)
{
    tdd_opargs *g = p->args;
    const tdd_tensor *q = p->in[0], *k = p->in[1], *v = p->in[2];
    const tdd_tensor *m = p->n_in > 3 ? p->in[3] : NULL;
    bool causal;
    int rc;
    if ((rc = need_float(p, q)) || (rc = same_dtype(p, q, k)) || (rc = same_dtype(p, q, v)) ||
        (rc = tdd_p_float(p, "dropout_p", 0.0, &g->f[0])) ||
        (rc = tdd_p_bool(p, "is_causal", false, &causal)))
        return rc;
    static const char *const names[3] = {"query", "key", "value"};
    for (int t = 0; t < 3; t++)
        if (p->in[t]->ndim < 2)
            return tdd_err_arg(p->err, names[t],
                               "%s: query, key and value must be at least 2-D, got %d-D", p->name,
                               p->in[t]->ndim);
    int64_t L = q->shape[q->ndim - 2], E = q->shape[q->ndim - 1];
    int64_t S = k->shape[k->ndim - 2], Ev = v->shape[v->ndim - 1];
    if (k->shape[k->ndim - 1] != E)
        return tdd_err_shape(p->err, q->shape, q->ndim, k->shape, k->ndim,
                             "%s: key's last dim %lld must match query's %lld", p->name,
                             (long long)k->shape[k->ndim - 1], (long long)E);
    if (v->shape[v->ndim - 2] != S)
        return tdd_err_shape(p->err, k->shape, k->ndim, v->shape, v->ndim,
                             "%s: value has %lld positions, key %lld", p->name,
                             (long long)v->shape[v->ndim - 2], (long long)S);
    if (!(g->f[0] >= 0.0 && g->f[0] <= 1.0))
        return tdd_err_arg(p->err, "dropout_p", "%s: dropout_p must be in [0, 1]", p->name);
    g->f[1] = E > 0 ? 1.0 / sqrt((double)E) : 1.0; /* torch's default; E = 0 sums nothing */
    if (tdd_p_get(p, "scale") && (rc = tdd_p_float(p, "scale", 0.0, &g->f[1])))
        return rc;
    if (!isfinite(g->f[1]))
        return tdd_err_arg(p->err, "scale", "%s: scale must be finite", p->name);
    if (causal && m)
        return tdd_err_arg(p->err, "is_causal", "%s: is_causal and attn_mask exclude each other",
                           p->name);
    int64_t bs[TD_MAX_NDIM], tmp[TD_MAX_NDIM];
    int nb = q->ndim - 2, nt;
    memcpy(bs, q->shape, (size_t)nb * sizeof *bs);
    for (int t = 1; t < p->n_in; t++) {
        const tdd_tensor *x = p->in[t];
        int xn = x->ndim > 2 ? x->ndim - 2 : 0;
        if ((rc = tdd_p_bcast(p, bs, nb, x->shape, xn, tmp, &nt)))
            return rc;
        memcpy(bs, tmp, (size_t)nt * sizeof *bs);
        nb = nt;
    }
    if (m) {
        if (m->dtype != TD_BOOL && (rc = same_dtype(p, q, m)))
            return rc;
        int64_t ls[2] = {L, S};
        int mn = m->ndim < 2 ? m->ndim : 2;
        if ((rc = tdd_p_bcast(p, ls, 2, m->shape + (m->ndim - mn), mn, tmp, &nt)))
            return rc;
        if (tmp[0] != L || tmp[1] != S)
            return tdd_err_shape(p->err, ls, 2, m->shape, m->ndim,
                                 "%s: attn_mask must broadcast to [..., L, S]", p->name);
    }
    if (nb + 2 > TD_MAX_NDIM)
        return tdd_err_arg(p->err, "query", "%s: more than %d dims", p->name, TD_MAX_NDIM);
    g->i[0] = causal;
    g->i[1] = !m ? 0 : m->dtype == TD_BOOL ? 1 : 2;
    g->i[2] = L;
    g->i[3] = S;
    g->i[4] = E;
    g->i[5] = Ev;
    g->i[6] = nb;
    memcpy(g->ints[0], bs, (size_t)nb * sizeof *bs);
    g->dtype = g->cdtype = q->dtype;
    bs[nb] = L;
    bs[nb + 1] = Ev;
    tdd_p_out(p, 0, q->dtype, bs, nb + 2);
    return 0;
}

/* batch_norm(input [N, C, *], running_mean, running_var, weight, bias): the four [C] inputs
 * optional in that order; training with running stats writes them in place (inplace_in). */
static int prep_batch_norm(tdd_prep *p)
{
    tdd_opargs *g = p->args;
    const tdd_tensor *x = p->in[0];
    bool train;
    int rc;
    if ((rc = need_float(p, x)) || (rc = tdd_p_bool(p, "training", false, &train)) ||
        (rc = tdd_p_float(p, "momentum", 0.1, &g->f[1])) ||
        (rc = tdd_p_float(p, "eps", 1e-5, &g->f[0])))
        return rc;
    if (x->ndim < 2)
        return tdd_err_arg(p->err, "input", "batch_norm: input must be [N, C, *], got %d-D",
                           x->ndim);
    if (p->n_in == 2)
        return tdd_err_arg(p->err, "running_var",
                           "batch_norm: running_mean given without running_var");
    int64_t C = x->shape[1];
    static const char *const role[5] = {"input", "running_mean", "running_var", "weight", "bias"};
    for (int k = 1; k < p->n_in; k++) {
        const tdd_tensor *w = p->in[k];
        if ((rc = same_dtype(p, x, w)))
            return rc;
        if (w->ndim != 1 || w->shape[0] != C)
            return tdd_err_shape(p->err, &C, 1, w->shape, w->ndim, "batch_norm: %s must be [C]",
                                 role[k]);
    }
    bool stats = p->n_in >= 3;
    if (!train && !stats)
        return tdd_err_arg(p->err, "training",
                           "batch_norm: running_mean and running_var are required in eval mode "
                           "(training=false)");
    int64_t n = tdd_numel(x), M = C ? n / C : 0;
    if (train && M == 1)
        return tdd_err_arg(p->err, "input",
                           "batch_norm: expected more than 1 value per channel when training, "
                           "got input of shape [%lld, %lld, ...]",
                           (long long)x->shape[0], (long long)C);
    if (train && stats) {
        for (int k = 1; k < 3; k++)
            if (!tdd_is_contiguous(p->in[k]))
                return tdd_err_arg(p->err, role[k],
                                   "batch_norm: %s is updated in place and must be contiguous",
                                   role[k]);
        g->inplace_in = 6u;
    }
    g->i[0] = train;
    g->flags = (stats ? 1u : 0u) | (p->n_in >= 4 ? 2u : 0u) | (p->n_in >= 5 ? 4u : 0u);
    g->dtype = g->cdtype = x->dtype;
    tdd_p_out(p, 0, x->dtype, x->shape, x->ndim);
    return 0;
}

/* interpolate (F.interpolate): [N, C, W] or [N, C, H, W], nearest or (bi)linear, the output
 * from size or scale_factor (floor(in * factor), which then also sets the scale, as
 * PyTorch's does when it is not recomputed). */
static int prep_interp(tdd_prep *p)
{
    tdd_opargs *g = p->args;
    const tdd_tensor *x = p->in[0];
    const char *mode;
    bool align;
    int rc, nd = x->ndim - 2, n;
    if ((rc = need_float(p, x)) || (rc = tdd_p_str(p, "mode", "nearest", &mode)) ||
        (rc = tdd_p_bool(p, "align_corners", false, &align)))
        return rc;
    if (nd != 1 && nd != 2)
        return tdd_err_arg(p->err, "input", "%s: input must be [N, C, W] or [N, C, H, W], got %d-D",
                           p->name, x->ndim);
    if (strcmp(mode, "nearest") == 0)
        g->i[0] = 0;
    else if (strcmp(mode, nd == 1 ? "linear" : "bilinear") == 0)
        g->i[0] = 1;
    else
        return tdd_err_arg(p->err, "mode", "%s: mode '%.32s' on a %d-D input; nearest or %s",
                           p->name, mode, x->ndim, nd == 1 ? "linear" : "bilinear");
    if (g->i[0] == 0 && tdd_p_get(p, "align_corners"))
        return tdd_err_arg(p->err, "align_corners", "%s: align_corners is for the linear modes",
                           p->name);
    const td_attr *sf = tdd_p_get(p, "scale_factor");
    int64_t size[2];
    if ((rc = tdd_p_ints(p, "size", size, 2, &n)))
        return rc;
    if ((n < 0) == !sf)
        return tdd_err_arg(p->err, n < 0 ? "size" : "scale_factor",
                           "%s: exactly one of size and scale_factor", p->name);
    if (sf && sf->n != (size_t)nd && sf->n != 1)
        return tdd_err_arg(p->err, "scale_factor", "%s: %zu scale factors for %d spatial dims",
                           p->name, sf->n, nd);
    if (n >= 0 && n != nd && n != 1)
        return tdd_err_arg(p->err, "size", "%s: %d sizes for %d spatial dims", p->name, n, nd);
    int64_t shape[4];
    memcpy(shape, x->shape, (size_t)x->ndim * sizeof *shape);
    for (int d = 0; d < nd; d++) {
        int64_t in = x->shape[2 + d], out;
        double f = sf ? sf->floats[sf->n == 1 ? 0 : d] : 0.0;
        if (sf) {
            if (!(f > 0.0) || !(f * (double)(in ? in : 1) < 1e15))
                return tdd_err_arg(p->err, "scale_factor",
                                   "%s: scale factors must be > 0 and finite", p->name);
            out = (int64_t)floor((double)in * f);
        } else {
            out = size[n == 1 ? 0 : d];
        }
        if (in < 1 || out < 1)
            return tdd_err_arg(p->err, sf ? "scale_factor" : "size",
                               "%s: input and output sizes must be > 0 (dim %d: %lld -> %lld)",
                               p->name, 2 + d, (long long)in, (long long)out);
        if (g->i[0] == 1 && align)
            g->f[d] = out > 1 ? (double)(in - 1) / (double)(out - 1) : 0.0;
        else
            g->f[d] = sf ? 1.0 / f : (double)in / (double)out;
        g->ints[0][d] = shape[2 + d] = out;
    }
    g->i[1] = align;
    g->i[2] = nd;
    g->dtype = g->cdtype = x->dtype;
    tdd_p_out(p, 0, x->dtype, shape, x->ndim);
    return 0;
}

int tdd_prep_nn(tdd_prep *p)
{
    tdd_opargs *g = p->args;
    const tdd_tensor *x = p->in[0];
    int rc;
    switch (p->op) {
    case TDD_OP_EMBEDDING_BAG:
    case TDD_OP_EMBEDDING_BAG_BACKWARD:
    case TDD_OP_MULTINOMIAL:
        return tdd_prep_bag(p);
    case TDD_OP_MATMUL:
    case TDD_OP_BMM:
    case TDD_OP_LINEAR:
        return prep_matmul(p);
    case TDD_OP_ADDMM:
    case TDD_OP_BADDBMM:
        return prep_addmm(p);
    case TDD_OP_CROSS_ENTROPY:
    case TDD_OP_NLL_LOSS:
        return prep_class_loss(p);
    case TDD_OP_MSE_LOSS:
    case TDD_OP_BCE_WITH_LOGITS: {
        const tdd_tensor *y = p->in[1];
        if ((rc = need_float(p, x)) || (rc = same_dtype(p, x, y)) || (rc = get_reduction(p)))
            return rc;
        if (!tdd_same_shape(x, y))
            return tdd_err_shape(p->err, x->shape, x->ndim, y->shape, y->ndim,
                                 "%s: input and target shapes differ", p->name);
        g->dtype = g->cdtype = x->dtype;
        loss_out(p, x->dtype, x->shape, x->ndim);
        return 0;
    }
    case TDD_OP_LAYER_NORM: {
        int64_t ns[TD_MAX_NDIM];
        int n;
        if ((rc = need_float(p, x)) ||
            (rc = tdd_p_ints(p, "normalized_shape", ns, TD_MAX_NDIM, &n)) ||
            (rc = tdd_p_float(p, "eps", 1e-5, &g->f[0])))
            return rc;
        if (n < 0)
            return tdd_p_missing(p, "normalized_shape");
        bool ok = n <= x->ndim && n > 0;
        for (int d = 0; ok && d < n; d++)
            ok = x->shape[x->ndim - n + d] == ns[d];
        if (!ok)
            return tdd_err_shape(p->err, ns, n, x->shape, x->ndim,
                                 "layer_norm: input's trailing dims differ from normalized_shape");
        for (int k = 1; k < p->n_in; k++) {
            const tdd_tensor *w = p->in[k];
            if ((rc = same_dtype(p, x, w)))
                return rc;
            if (w->ndim != n || memcmp(w->shape, ns, (size_t)n * sizeof *ns) != 0)
                return tdd_err_shape(p->err, ns, n, w->shape, w->ndim,
                                     "layer_norm: %s must have normalized_shape",
                                     k == 1 ? "weight" : "bias");
            g->flags |= 1u << (k - 1);
        }
        g->i[0] = n;
        g->dtype = g->cdtype = x->dtype;
        tdd_p_out(p, 0, x->dtype, x->shape, x->ndim);
        return 0;
    }
    case TDD_OP_BATCH_NORM:
        return prep_batch_norm(p);
    case TDD_OP_GROUP_NORM: {
        if ((rc = need_float(p, x)) || (rc = tdd_p_int(p, "num_groups", 0, &g->i[0])) ||
            (rc = tdd_p_float(p, "eps", 1e-5, &g->f[0])))
            return rc;
        if (!tdd_p_get(p, "num_groups"))
            return tdd_p_missing(p, "num_groups");
        if (x->ndim < 2)
            return tdd_err_arg(p->err, "input", "group_norm: input must be [N, C, *], got %d-D",
                               x->ndim);
        int64_t C = x->shape[1];
        if (g->i[0] < 1 || C % g->i[0] != 0)
            return tdd_err_arg(p->err, "num_groups",
                               "group_norm: num_groups = %lld must divide the %lld channels",
                               (long long)g->i[0], (long long)C);
        for (int k = 1; k < p->n_in; k++) {
            const tdd_tensor *w = p->in[k];
            if ((rc = same_dtype(p, x, w)))
                return rc;
            if (w->ndim != 1 || w->shape[0] != C)
                return tdd_err_shape(p->err, &C, 1, w->shape, w->ndim, "group_norm: %s must be [C]",
                                     k == 1 ? "weight" : "bias");
            g->flags |= 1u << (k - 1);
        }
        g->dtype = g->cdtype = x->dtype;
        tdd_p_out(p, 0, x->dtype, x->shape, x->ndim);
        return 0;
    }
    case TDD_OP_DROPOUT: {
        bool train;
        if ((rc = need_float(p, x)) || (rc = tdd_p_float(p, "p", 0.5, &g->f[0])) ||
            (rc = tdd_p_bool(p, "train", true, &train)))
            return rc;
        if (!(g->f[0] >= 0.0 && g->f[0] <= 1.0))
            return tdd_err_arg(p->err, "p", "dropout: p must be in [0, 1]");
        g->i[0] = train;
        g->dtype = g->cdtype = x->dtype;
        tdd_p_out(p, 0, x->dtype, x->shape, x->ndim);
        return 0;
    }
    case TDD_OP_SDPA:
        return prep_sdpa(p);
    case TDD_OP_INTERPOLATE:
        return prep_interp(p);
    case TDD_OP_CONV1D:
        return prep_conv1d(p);
    case TDD_OP_MAX_POOL1D:
    case TDD_OP_AVG_POOL1D:
        return prep_pool1d(p);
    case TDD_OP_CONV_TRANSPOSE2D:
        return prep_conv_transpose2d(p);
    case TDD_OP_CONV2D:
    case TDD_OP_MAX_POOL2D:
    case TDD_OP_AVG_POOL2D:
        return prep_conv_pool(p);
    case TDD_OP_MAX_POOL2D_BACKWARD:
        return prep_max_pool2d_backward(p);
    case TDD_OP_PIXEL_SHUFFLE: /* [*, C r^2, H, W] <-> [*, C, H r, W r], any dtype */
    case TDD_OP_PIXEL_UNSHUFFLE: {
        bool up = p->op == TDD_OP_PIXEL_SHUFFLE;
        const char *an = up ? "upscale_factor" : "downscale_factor";
        int64_t r, shape[TD_MAX_NDIM], rr, hr, wr, cr;
        int nd = x->ndim;
        if (!tdd_p_get(p, an))
            return tdd_p_missing(p, an);
        if ((rc = tdd_p_int(p, an, 1, &r)))
            return rc;
        if (r < 1 || r > INT32_MAX)
            return tdd_err_arg(p->err, an, "%s: %s must be >= 1", p->name, an);
        if (nd < 3)
            return tdd_err_arg(p->err, "input", "%s: input must have at least 3 dims, got %d-D",
                               p->name, nd);
        memcpy(shape, x->shape, (size_t)nd * sizeof *shape);
        int64_t C = shape[nd - 3], H = shape[nd - 2], W = shape[nd - 1];
        rr = r * r;
        if (up && C % rr != 0)
            return tdd_err_arg(p->err, "input",
                               "pixel_shuffle: the channels (%lld) must be divisible by "
                               "upscale_factor^2 (%lld)",
                               (long long)C, (long long)rr);
        if (!up && (H % r != 0 || W % r != 0))
            return tdd_err_arg(p->err, "input",
                               "pixel_unshuffle: height and width (%lld, %lld) must be divisible "
                               "by downscale_factor (%lld)",
                               (long long)H, (long long)W, (long long)r);
        if (__builtin_mul_overflow(H, r, &hr) || __builtin_mul_overflow(W, r, &wr) ||
            __builtin_mul_overflow(C, rr, &cr))
            return tdd_err_arg(p->err, an, "%s: the output is too large", p->name);
        shape[nd - 3] = up ? C / rr : cr;
        shape[nd - 2] = up ? hr : H / r;
        shape[nd - 1] = up ? wr : W / r;
        g->i[0] = r;
        g->dtype = g->cdtype = x->dtype;
        tdd_p_out(p, 0, x->dtype, shape, nd);
        return 0;
    }
    case TDD_OP_ADAPTIVE_AVG_POOL2D: {
        int64_t *os = g->ints[3], shape[4];
        if ((rc = need_float(p, x)))
            return rc;
        if (x->ndim != 3 && x->ndim != 4)
            return tdd_err_arg(p->err, "input", "%s: input must be [N, C, H, W] or [C, H, W]",
                               p->name);
        if (!tdd_p_get(p, "output_size"))
            return tdd_p_missing(p, "output_size");
        if ((rc = pair(p, "output_size", 1, 1, os)))
            return rc;
        memcpy(shape, x->shape, sizeof shape);
        shape[x->ndim - 2] = os[0];
        shape[x->ndim - 1] = os[1];
        g->dtype = g->cdtype = x->dtype;
        tdd_p_out(p, 0, x->dtype, shape, x->ndim);
        return 0;
    }
    default:
        return tdd_err_set(p->err, TD_EINTERNAL, "%s: not an NN op", p->name);
    }
}

int tdd_prep_create(tdd_prep *p)
{
    tdd_opargs *g = p->args;
    int64_t shape[TD_MAX_NDIM];
    int nd = 0, rc;
    td_dtype def = TD_F32, dt;
    switch (p->op) {
    case TDD_OP_FULL: {
        const td_attr *v = tdd_p_get(p, "value");
        if (!v)
            return tdd_p_missing(p, "value");
        if ((rc = tdd_p_float(p, "value", 0, &g->f[0])))
            return rc;
        g->n[0] = v->kind == TD_ATTR_INT ? v->i : tdd_sat_i64(g->f[0]);
        def = v->kind == TD_ATTR_INT ? TD_I64 : v->kind == TD_ATTR_BOOL ? TD_BOOL : TD_F32;
        if ((rc = tdd_p_shape(p, "shape", shape, &nd)))
            return rc;
        break;
    }
    case TDD_OP_ZEROS:
    case TDD_OP_ONES:
    case TDD_OP_RAND:
    case TDD_OP_RANDN:
        if ((rc = tdd_p_shape(p, "shape", shape, &nd)))
            return rc;
        g->f[0] = p->op == TDD_OP_ONES;
        g->n[0] = p->op == TDD_OP_ONES;
        break;
    case TDD_OP_RANDINT: {
        if (!tdd_p_get(p, "high"))
            return tdd_p_missing(p, "high");
        if ((rc = tdd_p_int(p, "low", 0, &g->n[0])) || (rc = tdd_p_int(p, "high", 0, &g->n[1])) ||
            (rc = tdd_p_shape(p, "shape", shape, &nd)))
            return rc;
        if (g->n[1] <= g->n[0] || (g->n[0] < 0 && g->n[1] > INT64_MAX + g->n[0]))
            return tdd_err_arg(p->err, "high", "randint: high must be above low");
        def = TD_I64;
        break;
    }
    case TDD_OP_ARANGE: {
        const char *names[3] = {"start", "end", "step"};
        double defs[3] = {0, 0, 1};
        bool all_int = true;
        if (!tdd_p_get(p, "end"))
            return tdd_p_missing(p, "end");
        for (int k = 0; k < 3; k++) {
            const td_attr *a = tdd_p_get(p, names[k]);
            if ((rc = tdd_p_float(p, names[k], defs[k], &g->f[k])))
                return rc;
            g->n[k] = a && a->kind == TD_ATTR_INT ? a->i : (int64_t)defs[k];
            if (a && a->kind != TD_ATTR_INT)
                all_int = false;
            if (!isfinite(g->f[k]))
                return tdd_err_arg(p->err, names[k], "arange: %s must be finite", names[k]);
        }
        if (g->f[2] == 0.0)
            return tdd_err_arg(p->err, "step", "arange: step must not be 0");
        double cnt = ceil((g->f[1] - g->f[0]) / g->f[2]);
        if (all_int) {
            int64_t span, st = g->n[2];
            if (__builtin_sub_overflow(g->n[1], g->n[0], &span) || span == INT64_MIN ||
                st == INT64_MIN)
                return tdd_err_arg(p->err, "end", "arange: range too large");
            cnt = (double)(span / st + (span % st != 0 && (span > 0) == (st > 0)));
        }
        if (cnt < 0)
            return tdd_err_arg(p->err, "end", "arange: end is on the wrong side of start");
        if (cnt > (double)p->max_numel)
            return tdd_err_set(p->err, TD_ERESOURCE_EXHAUSTED, "arange: too many elements");
        shape[nd++] = (int64_t)cnt;
        def = all_int ? TD_I64 : TD_F32;
        break;
    }
    case TDD_OP_LINSPACE: {
        int64_t steps;
        if (!tdd_p_get(p, "steps"))
            return tdd_p_missing(p, "steps");
        if ((rc = tdd_p_float(p, "start", 0, &g->f[0])) ||
            (rc = tdd_p_float(p, "end", 0, &g->f[1])) || (rc = tdd_p_int(p, "steps", 0, &steps)))
            return rc;
        if (steps < 0)
            return tdd_err_arg(p->err, "steps", "linspace: steps must be >= 0");
        shape[nd++] = steps;
        break;
    }
    case TDD_OP_EYE: {
        if (!tdd_p_get(p, "n"))
            return tdd_p_missing(p, "n");
        if ((rc = tdd_p_int(p, "n", 0, &g->i[0])) || (rc = tdd_p_int(p, "m", g->i[0], &g->i[1])))
            return rc;
        if (g->i[0] < 0 || g->i[1] < 0)
            return tdd_err_arg(p->err, g->i[0] < 0 ? "n" : "m", "eye: sizes must be >= 0");
        shape[nd++] = g->i[0];
        shape[nd++] = g->i[1];
        break;
    }
    default:
        return tdd_err_set(p->err, TD_EINTERNAL, "%s: not a creation op", p->name);
    }
    if ((rc = tdd_p_dtype(p, def, &dt)))
        return rc;
    if ((p->op == TDD_OP_RAND || p->op == TDD_OP_RANDN || p->op == TDD_OP_LINSPACE) &&
        !tdd_dtype_is_float(dt))
        return tdd_p_unsupported(p, dt);
    if (p->op == TDD_OP_RANDINT && dt == TD_BOOL)
        return tdd_p_unsupported(p, dt);
    if (p->op == TDD_OP_FULL && (rc = tdd_p_fits(p, tdd_p_get(p, "value"), dt)))
        return rc;
    if (p->op == TDD_OP_FULL && dt == TD_BOOL)
        g->n[0] = g->f[0] != 0.0; /* nonzero (NaN too) is true: 0.5 is not truncated to 0 */
    if (p->op == TDD_OP_RANDINT && dt != TD_F32 && dt != TD_F64) {
        /* every draw in [low, high) must fit the dtype, as PyTorch's check */
        int64_t lo = -65504, hi = 65504; /* float16 */
        if (tdd_dtype_is_int(dt))
            tdd_int_range(dt, &lo, &hi);
        if (dt == TD_BF16)
            lo = INT64_MIN, hi = INT64_MAX; /* bfloat16 holds the int64 range */
        if (g->n[0] < lo)
            return tdd_err_arg(p->err, "low", "randint: low = %lld does not fit in %s",
                               (long long)g->n[0], td_dtype_name(dt));
        if (g->n[1] - 1 > hi)
            return tdd_err_arg(p->err, "high", "randint: high - 1 = %lld does not fit in %s",
                               (long long)(g->n[1] - 1), td_dtype_name(dt));
    }
    g->dtype = g->cdtype = dt;
    tdd_p_out(p, 0, dt, shape, nd);
    return 0;
}
