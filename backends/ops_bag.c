/* ops_bag.c -- prepare rules of embedding_bag (and its backward) and multinomial: the
 * attributes, shapes and dtypes the kernels (ref_bag.c, cuda's bag kernels) rely on.
 * Data-dependent checks (indices and offsets in range, probabilities) are the kernels'. */
#include <string.h>

#include "dtype.h"
#include "ops_impl.h"

static int need_float(tdd_prep *p, const tdd_tensor *t, const char *what)
{
    if (tdd_dtype_is_float(t->dtype))
        return 0;
    return tdd_err_dtypes(p->err, TD_F32, t->dtype, "%s: %s must be floating point, got %s",
                          p->name, what, td_dtype_name(t->dtype));
}

static int need_index(tdd_prep *p, const tdd_tensor *t, const char *what)
{
    if (t->dtype == TD_I64 || t->dtype == TD_I32)
        return 0;
    return tdd_err_dtypes(p->err, TD_I64, t->dtype, "%s: %s must be int64 or int32, got %s",
                          p->name, what, td_dtype_name(t->dtype));
}

/* embedding_bag(input [n], weight [num, D], offsets [B] (or [B + 1] with include_last_offset),
 * per_sample_weights [n] (optional, mode sum)) -> [B, D]; the backward takes the output's
 * gradient first: embedding_bag_backward(grad [B, D], input, offsets, weight[,
 * per_sample_weights]) -> [num, D]. args: i[0] mode (0 sum, 1 mean, 2 max), i[1] padding_idx
 * (-1: none), i[2] include_last_offset, i[3] B, flags bit 0 per_sample_weights. */
static int prep_bag(tdd_prep *p)
{
    tdd_opargs *g = p->args;
    bool bw = p->op == TDD_OP_EMBEDDING_BAG_BACKWARD;
    int o = bw ? 1 : 0; /* the forward's inputs start here */
    const tdd_tensor *ix = p->in[o], *w = p->in[o + (bw ? 2 : 1)], *off = p->in[o + (bw ? 1 : 2)];
    const tdd_tensor *psw = p->n_in > o + 3 ? p->in[o + 3] : NULL;
    const char *mode;
    bool last;
    int64_t pad;
    int rc;
    if ((rc = tdd_p_str(p, "mode", "mean", &mode)) ||
        (rc = tdd_p_bool(p, "include_last_offset", false, &last)) ||
        (rc = tdd_p_int(p, "padding_idx", -1, &pad)) || (rc = need_index(p, ix, "input")) ||
        (rc = need_index(p, off, "offsets")) || (rc = need_float(p, w, "weight")))
        return rc;
    static const char *const modes[] = {"sum", "mean", "max"};
    int m = 0;
    while (m < 3 && strcmp(mode, modes[m]) != 0)
        m++;
    if (m == 3)
        return tdd_err_arg(p->err, "mode", "%s: mode must be sum, mean or max, got \"%.32s\"",
                           p->name, mode);
    if (ix->ndim != 1)
        return tdd_err_arg(p->err, "input", "%s: input must be 1-D (with offsets), got %d-D",
                           p->name, ix->ndim);
    if (off->ndim != 1)
        return tdd_err_arg(p->err, "offsets", "%s: offsets must be 1-D, got %d-D", p->name,
                           off->ndim);
    if (w->ndim != 2)
        return tdd_err_arg(p->err, "weight", "%s: weight must be 2-D, got %d-D", p->name, w->ndim);
    int64_t num = w->shape[0], B = off->shape[0] - (last ? 1 : 0);
    if (B < 0)
        return tdd_err_arg(p->err, "offsets", "%s: include_last_offset needs at least one offset",
                           p->name);
    if (tdd_p_get(p, "padding_idx")) {
        if (pad < -num || pad >= num)
            return tdd_err_arg(p->err, "padding_idx",
                               "%s: padding_idx must be within [-%lld, %lld)", p->name,
                               (long long)num, (long long)num);
        if (pad < 0)
            pad += num;
    } else {
        pad = -1;
    }
    if (psw) {
        if (m != 0)
            return tdd_err_arg(p->err, "per_sample_weights",
                               "%s: per_sample_weights only with mode \"sum\", not \"%s\"", p->name,
                               mode);
        if (psw->dtype != w->dtype)
            return tdd_err_dtypes(p->err, w->dtype, psw->dtype,
                                  "%s: per_sample_weights must have weight's dtype", p->name);
        if (psw->ndim != 1 || psw->shape[0] != ix->shape[0])
            return tdd_err_shape(p->err, ix->shape, 1, psw->shape, psw->ndim,
                                 "%s: per_sample_weights must have input's shape", p->name);
        g->flags |= 1u;
    }
    int64_t out[2] = {B, w->shape[1]};
    if (bw) {
        const tdd_tensor *gy = p->in[0];
        if (gy->dtype != w->dtype)
            return tdd_err_dtypes(p->err, w->dtype, gy->dtype, "%s: grad must have weight's dtype",
                                  p->name);
        if (gy->ndim != 2 || gy->shape[0] != out[0] || gy->shape[1] != out[1])
            return tdd_err_shape(p->err, out, 2, gy->shape, gy->ndim,
                                 "%s: grad must be [bags, embedding_dim]", p->name);
        out[0] = num;
    }
    g->i[0] = m;
    g->i[1] = pad;
    g->i[2] = last;
    g->i[3] = B;
    g->dtype = g->cdtype = w->dtype;
    tdd_p_out(p, 0, w->dtype, out, 2);
    return 0;
}

/* multinomial(probs [C] or [R, C], num_samples, replacement) -> int64 [k] or [R, k], drawn
 * from the session's stream (tdd_opargs.seed). args: i[0] k, i[1] replacement, i[2] R,
 * i[3] C. */
static int prep_multinomial(tdd_prep *p)
{
    tdd_opargs *g = p->args;
    const tdd_tensor *x = p->in[0];
    int64_t k;
    bool repl;
    int rc;
    if ((rc = need_float(p, x, "input")) || (rc = tdd_p_int(p, "num_samples", 0, &k)) ||
        (rc = tdd_p_bool(p, "replacement", false, &repl)))
        return rc;
    if (!tdd_p_get(p, "num_samples"))
        return tdd_p_missing(p, "num_samples");
    if (x->ndim != 1 && x->ndim != 2)
        return tdd_err_arg(p->err, "input", "multinomial: input must be 1-D or 2-D, got %d-D",
                           x->ndim);
    int64_t C = x->shape[x->ndim - 1], R = x->ndim == 2 ? x->shape[0] : 1;
    if (k < 1)
        return tdd_err_arg(p->err, "num_samples", "multinomial: num_samples must be >= 1, got %lld",
                           (long long)k);
    if (C < 1)
        return tdd_err_arg(p->err, "input", "multinomial: input has no categories");
    if (!repl && k > C)
        return tdd_err_arg(p->err, "num_samples",
                           "multinomial: cannot draw %lld samples from %lld categories without "
                           "replacement",
                           (long long)k, (long long)C);
    int64_t out[2] = {R, k};
    g->i[0] = k;
    g->i[1] = repl;
    g->i[2] = R;
    g->i[3] = C;
    g->dtype = TD_I64;
    g->cdtype = x->dtype;
    if (x->ndim == 2)
        tdd_p_out(p, 0, TD_I64, out, 2);
    else
        tdd_p_out(p, 0, TD_I64, &out[1], 1);
    return 0;
}

int tdd_prep_bag(tdd_prep *p)
{
    if (p->op == TDD_OP_MULTINOMIAL)
        return prep_multinomial(p);
    return prep_bag(p);
}
