/* cuda_exec.c -- the cuda backend's execution: the kernel table (cuda_kernels), supports(),
 * and the dispatch that turns validated op calls into kernels.cu launches and cuBLAS GEMMs on
 * the calling session's slot (the devices, slots and memory: cuda.c).
 *
 * Coverage is the op table's, every dtype the cpu backend runs: supports() names exactly what
 * runs here. Elementwise ops compute in float, double or int64 from elementwise.h; the other
 * kernels are f32, f64 and int64, and via_copies runs them on f16/bf16 (widened to f32, rounded
 * back once), narrower integers and bool (widened), and strided operands of the kernels that
 * want dense ones. Kernels that check values (index and class ranges, integer powers) set a
 * flag of their slot's ring (cuda_checks.h), read at the next download or synchronize:
 * INVALID_ARGUMENT naming the op, then. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_impl.h"

/* ------------------------------------------------------------------ op tables */

static bool inputs_are(const tdd_opcall *c, int from, td_dtype dt)
{
    for (int i = from; i < c->n_in; i++)
        if (c->in[i]->dtype != dt)
            return false;
    return true;
}

static bool is_half(td_dtype dt)
{
    return dt == TD_F16 || dt == TD_BF16;
}

/* The kernel table (cuda_kernels, below the kernels' dispatch functions), indexed by op: */
typedef struct {
    int (*run)(cuda_dev *dv, const tdd_opcall *c); /* NULL: not on cuda */
    uint32_t dtypes;                       /* bit dt set: output dtype dt runs (0: every one) */
    bool (*accepts)(const tdd_opcall *c);  /* a rule beyond the output dtype, or NULL */
    bool as_is;                            /* operands of every dtype as they are: no widening */
    bool dense;                            /* operands dense (others through a dense copy) */
    bool (*dense_if)(const tdd_opcall *c); /* dense only when this holds */
} cuda_kernel;

static const cuda_kernel cuda_kernels[TDD_OP_COUNT];

/* Exactly what execute runs; the daemon asks before every call. Elementwise ops: their
 * expressions (elementwise.h); composites (ops.h): their parts are asked as they run; views: a
 * view, or a C-order copy of any dtype (the op table's kind); the rest: the kernel table. */
int cuda_supports(void *ctx, const tdd_opcall *c)
{
    (void)ctx;
    const tdd_opargs *g = c->args;
    const int dtype = TD_EUNSUPPORTED_DTYPE;
    if ((unsigned)c->op >= TDD_OP_COUNT)
        return TD_EUNSUPPORTED_OP;
    if (tdd_ew_arity(c->op)) /* float, double or int64 */
        return tdd_dtype_is_float(g->cdtype) || tdd_ew_imode(c->op) != TDD_EWI_NONE ? 0 : dtype;
    if (tdd_op_composite(c) || tdd_opdefs[c->op].kind == TDD_KIND_VIEW)
        return 0;
    const cuda_kernel *k = &cuda_kernels[c->op];
    if (!k->run)
        return TD_EUNSUPPORTED_OP;
    if (k->dtypes && !(k->dtypes & (1u << g->dtype)))
        return dtype;
    return k->accepts && !k->accepts(c) ? dtype : 0;
}

/* ------------------------------------------------------------------ layouts */

/* Operands ts[0..nops) (ts[0] the output) walked over shape, broadcast and coalesced. */
static void layout_of(tdc_layout *l, const int64_t *shape, int ndim, int nops,
                      const tdd_tensor *const *ts)
{
    tdd_iter it;
    tdd_iter_tensors(&it, shape, ndim, nops, ts);
    memset(l, 0, sizeof *l);
    l->ndim = it.ndim;
    l->numel = it.numel;
    l->contig = 1;
    for (int d = 0; d < it.ndim; d++)
        l->shape[d] = it.shape[d];
    for (int k = 0; k < nops; k++) {
        for (int d = 0; d < it.ndim; d++)
            l->strides[k][d] = it.strides[k][d];
        if (it.ndim != 1 || it.strides[k][0] != 1)
            l->contig = 0;
    }
    if (it.numel <= 1)
        l->contig = 1;
}

/* A C-order copy of view src (any shape) into dense dst of the same element count. */
static int copy_dense(cuda_dev *dv, void *dst, const tdd_tensor *src)
{
    tdd_tensor d = *src;
    tdd_set_contiguous(&d);
    const tdd_tensor *ts[2] = {&d, src};
    tdc_layout l;
    layout_of(&l, src->shape, src->ndim, 2, ts);
    return cuda_rc(
        dv,
        tdc_copy(&cuda_slot_now(dv)->kd, &l, dst, tdd_data(src), (int)td_dtype_size(src->dtype)),
        "copy");
}

/* Splits x into kept and reduced dims (mask bits), each group coalesced. */
static void reduce_layout_of(tdc_reduce_layout *r, const tdd_tensor *x, uint32_t mask)
{
    int nk, nr;
    int64_t ks[TD_MAX_NDIM], kst[1][TD_MAX_NDIM], rs[TD_MAX_NDIM], rst[1][TD_MAX_NDIM];
    tdd_split_dims(x, mask, &nk, ks, kst[0], &nr, rs, rst[0]);
    tdd_iter ki, ri;
    tdd_iter_init(&ki, 1, ks, nk, (const int64_t(*)[TD_MAX_NDIM])kst, NULL);
    tdd_iter_init(&ri, 1, rs, nr, (const int64_t(*)[TD_MAX_NDIM])rst, NULL);
    memset(r, 0, sizeof *r);
    r->nk = ki.ndim;
    r->nr = ri.ndim;
    r->nout = ki.numel;
    r->nred = ri.numel;
    for (int d = 0; d < ki.ndim; d++) {
        r->kshape[d] = ki.shape[d];
        r->kstride[d] = ki.strides[0][d];
    }
    for (int d = 0; d < ri.ndim; d++) {
        r->rshape[d] = ri.shape[d];
        r->rstride[d] = ri.strides[0][d];
    }
}

/* ------------------------------------------------------------------ ops */

static int exec_binary(cuda_dev *dv, const tdd_opcall *c)
{
    const tdd_tensor *y = c->out[0];
    const tdd_tensor *ts[3] = {y, c->in[0], c->n_in > 1 ? c->in[1] : NULL};
    tdc_layout l;
    layout_of(&l, y->shape, y->ndim, c->n_in + 1, ts);
    const float *b = c->n_in > 1 ? tdd_data(c->in[1]) : NULL;
    return cuda_rc(dv,
                   tdc_binary(&cuda_slot_now(dv)->kd, c->op, &l, tdd_data(y), tdd_data(c->in[0]), b,
                              (float)c->args->f[0], (float)c->args->f[1]),
                   tdd_opdefs[c->op].name);
}

static int exec_unary(cuda_dev *dv, const tdd_opcall *c)
{
    const tdd_opargs *g = c->args;
    const tdd_tensor *y = c->out[0];
    const tdd_tensor *ts[2] = {y, c->in[0]};
    tdc_layout l;
    layout_of(&l, y->shape, y->ndim, 2, ts);
    return cuda_rc(dv,
                   tdc_unary(&cuda_slot_now(dv)->kd, c->op, &l, tdd_data(y), tdd_data(c->in[0]),
                             (float)g->f[0], (float)g->f[1], g->i[0] != 0),
                   tdd_opdefs[c->op].name);
}

static int exec_reduce(cuda_dev *dv, const tdd_opcall *c)
{
    const tdd_opargs *g = c->args;
    const tdd_tensor *x = c->in[0];
    tdc_reduce_layout r;
    reduce_layout_of(&r, x, g->dims_mask);
    void *y = tdd_data(c->out[0]);
    const void *xp = tdd_data(x);
    const tdc_dev *kd = &cuda_slot_now(dv)->kd;
    int dt = (int)x->dtype; /* f32, f64, or int64 (runs_via_copies widens the rest) */
    double inv_n = 1.0 / (double)r.nred;
    cudaError_t e;
    switch (c->op) {
    case TDD_OP_SUM:
    case TDD_OP_SUM_TO:
        e = tdc_reduce(kd, &r, dt, y, xp, TDC_R_SUM, TDC_M_ID, TDC_F_SCALE, NULL, 1.0);
        break;
    case TDD_OP_MEAN:
        e = tdc_reduce(kd, &r, dt, y, xp, TDC_R_SUM, TDC_M_ID, TDC_F_SCALE, NULL, inv_n);
        break;
    case TDD_OP_PROD:
        e = tdc_reduce(kd, &r, dt, y, xp, TDC_R_PROD, TDC_M_ID, TDC_F_SCALE, NULL, 1.0);
        break;
    case TDD_OP_AMAX:
    case TDD_OP_AMIN:
        e = tdc_reduce(kd, &r, dt, y, xp, c->op == TDD_OP_AMAX ? TDC_R_MAX : TDC_R_MIN, TDC_M_ID,
                       TDC_F_SCALE, NULL, 1.0);
        break;
    case TDD_OP_LOGSUMEXP:
        /* The max goes into y first and serves as the second pass's per-output shift: each
         * output's shift is read before that same output is written. */
        e = tdc_reduce(kd, &r, dt, y, xp, TDC_R_MAX, TDC_M_ID, TDC_F_SCALE, NULL, 1.0);
        if (!e)
            e = tdc_reduce(kd, &r, dt, y, xp, TDC_R_SUM, TDC_M_EXP_SUB_AUX, TDC_F_LOG_ADD_AUX, y,
                           1.0);
        break;
    case TDD_OP_VAR:
    case TDD_OP_STD: {
        /* Two passes (mean, then squared deviations) rather than one-pass sums of squares,
         * which cancel catastrophically in f32. Divisor max(0, n - correction), as PyTorch. */
        double div = (double)r.nred - g->f[0];
        double scale = 1.0 / (div > 0.0 ? div : 0.0);
        e = tdc_reduce(kd, &r, dt, y, xp, TDC_R_SUM, TDC_M_ID, TDC_F_SCALE, NULL, inv_n);
        if (!e)
            e = tdc_reduce(kd, &r, dt, y, xp, TDC_R_SUM, TDC_M_SQDEV_AUX,
                           c->op == TDD_OP_STD ? TDC_F_SQRT_SCALE : TDC_F_SCALE, y, scale);
        break;
    }
    case TDD_OP_ARGMAX:
    case TDD_OP_ARGMIN:
        e = tdc_argreduce(kd, &r, dt, tdd_data(c->out[0]), xp, c->op == TDD_OP_ARGMAX);
        break;
    default:
        return TD_EUNSUPPORTED_OP;
    }
    return cuda_rc(dv, e, tdd_opdefs[c->op].name);
}

static int exec_rows(cuda_dev *dv, const tdd_opcall *c, tdc_rowop op)
{
    const tdd_tensor *x = c->in[0], *y = c->out[0];
    tdc_rows_layout l;
    memset(&l, 0, sizeof l);
    int dim = (int)c->args->i[0];
    int64_t ks[TD_MAX_NDIM], kst[2][TD_MAX_NDIM];
    int nk = 0;
    l.n = 1;
    for (int d = 0; d < x->ndim; d++) {
        if (d == dim) {
            l.n = x->shape[d];
            l.xs = x->strides[d];
            l.ys = y->strides[d];
            continue;
        }
        ks[nk] = x->shape[d];
        kst[0][nk] = x->strides[d];
        kst[1][nk++] = y->strides[d];
    }
    tdd_iter it;
    tdd_iter_init(&it, 2, ks, nk, (const int64_t(*)[TD_MAX_NDIM])kst, NULL);
    l.nk = it.ndim;
    l.nrows = it.numel;
    for (int d = 0; d < it.ndim; d++) {
        l.kshape[d] = it.shape[d];
        l.kstride[d] = it.strides[0][d];
        l.ostride[d] = it.strides[1][d];
    }
    return cuda_rc(
        dv, tdc_rows(&cuda_slot_now(dv)->kd, op, &l, (int)x->dtype, tdd_data(y), tdd_data(x)),
        tdd_opdefs[c->op].name);
}

static int exec_ew(cuda_dev *dv, const tdd_opcall *c)
{
    const tdd_opargs *g = c->args;
    const tdd_tensor *y = c->out[0];
    int arity = tdd_ew_arity(c->op);
    const tdd_tensor *ts[3] = {y, c->in[0], c->n_in > 1 ? c->in[1] : NULL};
    tdc_layout l;
    layout_of(&l, y->shape, y->ndim, c->n_in + 1, ts);
    tdc_ewargs a = {.ydt = (int)y->dtype,
                    .adt = (int)c->in[0]->dtype,
                    .bdt = c->n_in > 1 ? (int)c->in[1]->dtype : 0,
                    .cdt = (int)g->cdtype,
                    .variant = arity == 1 && g->i[0] != 0,
                    .f = {g->f[0], g->f[1]},
                    .n = {g->n[0], g->n[1]}};
    int bad = 0;
    cudaError_t e = tdc_ew(&cuda_slot_now(dv)->kd, c->op, &l, tdd_data(y), tdd_data(c->in[0]),
                           c->n_in > 1 ? tdd_data(c->in[1]) : NULL, &a, &bad);
    int rc = cuda_rc(dv, e, tdd_opdefs[c->op].name);
    return rc ? rc : bad ? TD_EINVALID_ARGUMENT : 0;
}

static tdc_view view_of(const tdd_tensor *t)
{
    tdc_view v;
    memset(&v, 0, sizeof v);
    v.ndim = t->ndim;
    v.dt = (int)t->dtype;
    for (int d = 0; d < t->ndim; d++) {
        v.shape[d] = t->shape[d];
        v.strides[d] = t->strides[d];
    }
    return v;
}

static int checked(cuda_dev *dv, cudaError_t e, int bad, const tdd_opcall *c)
{
    int rc = cuda_rc(dv, e, tdd_opdefs[c->op].name);
    return rc ? rc : bad ? TD_EINVALID_ARGUMENT : 0; /* an index or class out of range */
}

static int copy_view(cuda_dev *dv, const tdd_tensor *dst, const tdd_tensor *src);

static int exec_index(cuda_dev *dv, const tdd_opcall *c)
{
    const tdd_opargs *g = c->args;
    const tdd_tensor *y = c->out[0];
    tdc_view yv = view_of(y), a = view_of(c->in[0]), b = view_of(c->in[c->n_in > 1]);
    int bad = 0, dim = (int)g->i[0];
    cudaError_t e;
    switch (c->op) {
    case TDD_OP_GATHER:
    case TDD_OP_INDEX_SELECT:
        e = tdc_index(&cuda_slot_now(dv)->kd,
                      c->op == TDD_OP_GATHER ? TDC_GATHER : TDC_INDEX_SELECT, dim, &yv, tdd_data(y),
                      &a, tdd_data(c->in[0]), &b, tdd_data(c->in[1]), (int)td_dtype_size(y->dtype),
                      &bad);
        break;
    case TDD_OP_EMBEDDING: /* embedding(indices, weight) */
        e = tdc_index(&cuda_slot_now(dv)->kd, TDC_EMBEDDING, 0, &yv, tdd_data(y), &b,
                      tdd_data(c->in[1]), &a, tdd_data(c->in[0]), (int)td_dtype_size(y->dtype),
                      &bad);
        break;
    case TDD_OP_ONE_HOT:
        if (y->dtype != TD_I64 || !tdd_is_contiguous(y))
            return TD_EINTERNAL;
        e = tdc_one_hot(&cuda_slot_now(dv)->kd, &a, tdd_data(c->in[0]), tdd_data(y), g->i[0], &bad);
        break;
    case TDD_OP_SCATTER_ADD: {
        int rc = copy_view(dv, y, c->in[0]);
        if (rc)
            return rc;
        tdc_view src = view_of(c->in[2]);
        e = tdc_scatter_add(&cuda_slot_now(dv)->kd, dim, &yv, tdd_data(y), &b, tdd_data(c->in[1]),
                            &src, tdd_data(c->in[2]), &bad);
        break;
    }
    default:
        return TD_EUNSUPPORTED_OP;
    }
    return checked(dv, e, bad, c);
}

/* embedding_bag and its backward, multinomial: the reference's loops (ref_bag.c) as
 * kernels. */
static int exec_bag(cuda_dev *dv, const tdd_opcall *c)
{
    const tdd_opargs *g = c->args;
    tdd_tensor *y = c->out[0];
    int bad = 0;
    cudaError_t e;
    if (!tdd_is_contiguous(y))
        return TD_EINTERNAL; /* outputs are fresh, dense tensors */
    if (c->op == TDD_OP_MULTINOMIAL) {
        tdc_view x = view_of(c->in[0]);
        e = tdc_multinomial(&cuda_slot_now(dv)->kd, &x, tdd_data(c->in[0]), tdd_data(y), g->i[2],
                            g->i[3], g->i[0], (int)g->i[1], g->seed, &bad);
        return checked(dv, e, bad, c);
    }
    bool bw = c->op == TDD_OP_EMBEDDING_BAG_BACKWARD;
    int o = bw ? 1 : 0;
    const tdd_tensor *ix = c->in[o], *off = c->in[o + (bw ? 1 : 2)], *w = c->in[o + (bw ? 2 : 1)];
    const tdd_tensor *psw = g->flags & 1u ? c->in[o + 3] : NULL, *gy = bw ? c->in[0] : NULL;
    tdc_view iv = view_of(ix), ov = view_of(off), wv = view_of(w), yv = view_of(y), pv, gv;
    memset(&pv, 0, sizeof pv);
    memset(&gv, 0, sizeof gv);
    if (psw)
        pv = view_of(psw);
    if (gy)
        gv = view_of(gy);
    tdc_bag b = {.B = g->i[3], .pad = g->i[1], .mode = (int)g->i[0], .last = (int)g->i[2]};
    if (bw) { /* the gradient accumulates: zeros first */
        int rc = cuda_rc(dv,
                         tdc_fill(&cuda_slot_now(dv)->kd, tdd_data(y), tdd_numel(y),
                                  (int)td_dtype_size(y->dtype), 0),
                         "embedding_bag_backward");
        if (rc)
            return rc;
    }
    e = tdc_embedding_bag(&cuda_slot_now(dv)->kd, bw, &b, &iv, tdd_data(ix), &ov, tdd_data(off),
                          &wv, tdd_data(w), &pv, psw ? tdd_data(psw) : NULL, &gv,
                          gy ? tdd_data(gy) : NULL, &yv, tdd_data(y), &bad);
    return checked(dv, e, bad, c);
}

static int exec_loss(cuda_dev *dv, const tdd_opcall *c)
{
    const tdd_opargs *g = c->args;
    const tdd_tensor *x = c->in[0], *t = c->in[1];
    bool ce = c->op == TDD_OP_CROSS_ENTROPY;
    int cd = x->ndim == 1 ? 0 : 1;
    tdc_closs p = {.is_ce = ce,
                   .probs = (g->flags & 2u) != 0,
                   .N = x->ndim == 1 ? 1 : x->shape[0],
                   .S = g->i[2],
                   .C = x->shape[cd],
                   .cs = x->strides[cd],
                   .ignore = g->i[1],
                   .eps = ce ? g->f[0] : 0.0};
    if (x->ndim > 1) { /* [N, C, d...] is dense here (wants_dense): the d dims flatten */
        p.rs = x->strides[0];
        p.ss = x->ndim > 2 ? x->strides[x->ndim - 1] : 0;
        if (!p.probs) {
            p.trs = t->strides[0];
            p.tss = t->ndim > 1 ? t->strides[t->ndim - 1] : 0;
        }
    }
    int bad = 0;
    cudaError_t e = tdc_class_loss(
        &cuda_slot_now(dv)->kd, &p, (int)x->dtype, tdd_data(x), tdd_data(t), (int)t->dtype,
        (g->flags & 1u) ? tdd_data(c->in[2]) : NULL, tdd_data(c->out[0]), (int)g->i[0], &bad);
    return checked(dv, e, bad, c);
}

/* A dense f32 operand of shape [n] for layouts (only shape and strides are read). */
static tdd_tensor dense_like(const tdd_tensor *t, td_dtype dt)
{
    tdd_tensor d = *t;
    d.dtype = dt;
    d.offset = 0;
    tdd_set_contiguous(&d);
    return d;
}

static int exec_pointwise_loss(cuda_dev *dv, const tdd_opcall *c)
{
    const tdd_tensor *x = c->in[0], *t = c->in[1], *y = c->out[0];
    int red = (int)c->args->i[0], bce = c->op == TDD_OP_BCE_WITH_LOGITS;
    const char *name = tdd_opdefs[c->op].name;
    int dt = (int)x->dtype; /* f32 or f64 */
    tdc_layout l;
    if (red == TDD_RED_NONE) {
        const tdd_tensor *ts[3] = {y, x, t};
        layout_of(&l, x->shape, x->ndim, 3, ts);
        return cuda_rc(dv,
                       tdc_pointwise_loss(&cuda_slot_now(dv)->kd, bce, dt, &l, tdd_data(y),
                                          tdd_data(x), tdd_data(t)),
                       name);
    }
    int64_t n = tdd_numel(x);
    void *v = NULL;
    int rc = cuda_rc(dv,
                     cudaMallocAsync(&v, (size_t)(n > 0 ? n : 1) * td_dtype_size(x->dtype),
                                     cuda_slot_now(dv)->stream),
                     name);
    if (rc)
        return rc;
    tdd_tensor d = dense_like(x, x->dtype);
    const tdd_tensor *ts[3] = {&d, x, t};
    layout_of(&l, x->shape, x->ndim, 3, ts);
    cudaError_t e =
        tdc_pointwise_loss(&cuda_slot_now(dv)->kd, bce, dt, &l, v, tdd_data(x), tdd_data(t));
    if (!e) { /* the sum (or mean: 0/0 is NaN, as ref) of the n values */
        tdc_reduce_layout r;
        memset(&r, 0, sizeof r);
        r.nk = r.nr = 1;
        r.nout = r.kshape[0] = 1;
        r.nred = r.rshape[0] = n;
        r.rstride[0] = 1;
        double scale = red == TDD_RED_MEAN ? 1.0 / (double)n : 1.0;
        e = tdc_reduce(&cuda_slot_now(dv)->kd, &r, dt, tdd_data(y), v, TDC_R_SUM, TDC_M_ID,
                       TDC_F_SCALE, NULL, scale);
    }
    (void)cudaFreeAsync(v, cuda_slot_now(dv)->stream);
    return cuda_rc(dv, e, name);
}

/* The window geometry of a pool or conv2d: x [N, C, H, W] (or [C, H, W]), y [.., Ho, Wo]. */
static void window_of(tdc_pool *p, const tdd_tensor *x, const tdd_tensor *y, const tdd_opargs *g,
                      int64_t kh, int64_t kw)
{
    int b4 = x->ndim == 4;
    memset(p, 0, sizeof *p);
    p->N = b4 ? x->shape[0] : 1;
    p->C = x->shape[b4];
    p->H = x->shape[b4 + 1];
    p->W = x->shape[b4 + 2];
    p->Ho = y->shape[y->ndim - 2];
    p->Wo = y->shape[y->ndim - 1];
    p->k[0] = kh;
    p->k[1] = kw;
    for (int k = 0; k < 2; k++) {
        p->stride[k] = g->ints[0][k];
        p->pad[k] = g->ints[1][k];
        p->dil[k] = g->ints[2][k];
    }
    p->include_pad = g->i[2] != 0;
}

/* dropout, layer_norm and the pools (dense operands: runs_via_copies sees to it). */
static int exec_nn(cuda_dev *dv, const tdd_opcall *c)
{
    const tdd_opargs *g = c->args;
    const tdd_tensor *x = c->in[0], *y = c->out[0];
    cudaError_t e;
    switch (c->op) {
    case TDD_OP_DROPOUT: {
        if (!g->i[0]) /* eval: the identity */
            return copy_view(dv, y, x);
        const tdd_tensor *ts[2] = {y, x};
        tdc_layout l;
        layout_of(&l, y->shape, y->ndim, 2, ts);
        e = tdc_dropout(&cuda_slot_now(dv)->kd, &l, tdd_data(y), (int)y->dtype, tdd_data(x),
                        g->f[0], g->seed);
        break;
    }
    case TDD_OP_LAYER_NORM: {
        int64_t D = 1, n = tdd_numel(x);
        for (int k = 0; k < g->i[0]; k++)
            D *= x->shape[x->ndim - 1 - k];
        e = tdc_layer_norm(&cuda_slot_now(dv)->kd, (int)x->dtype, D ? n / D : 0, D, tdd_data(x),
                           tdd_data(y), (g->flags & 1u) ? tdd_data(c->in[1]) : NULL,
                           (g->flags & 2u) ? tdd_data(c->in[2]) : NULL, g->f[0]);
        break;
    }
    case TDD_OP_MAX_POOL2D:
    case TDD_OP_AVG_POOL2D: {
        tdc_pool p;
        window_of(&p, x, y, g, g->ints[3][0], g->ints[3][1]);
        p.is_max = c->op == TDD_OP_MAX_POOL2D;
        e = tdc_pool2d(&cuda_slot_now(dv)->kd, &p, tdd_data(x), tdd_data(y),
                       p.is_max && c->n_out > 1 ? tdd_data(c->out[1]) : NULL, (int)x->dtype);
        break;
    }
    default:
        return TD_EUNSUPPORTED_OP;
    }
    return cuda_rc(dv, e, tdd_opdefs[c->op].name);
}

static int exec_pixel_shuffle(cuda_dev *dv, const tdd_opcall *c)
{
    const tdd_tensor *y = c->out[0];
    int nd = y->ndim;
    int64_t C = y->shape[nd - 3], H = y->shape[nd - 2], W = y->shape[nd - 1], n = tdd_numel(y);
    return cuda_rc(dv,
                   tdc_pixel_shuffle(&cuda_slot_now(dv)->kd, c->op == TDD_OP_PIXEL_UNSHUFFLE,
                                     c->args->i[0], n ? n / (C * H * W) : 0, C, H, W,
                                     tdd_data(c->in[0]), tdd_data(y), (int)td_dtype_size(y->dtype)),
                   tdd_opdefs[c->op].name);
}

static int exec_max_pool2d_backward(cuda_dev *dv, const tdd_opcall *c)
{
    const tdd_tensor *go = c->in[0], *x = c->in[1];
    tdc_pool p;
    window_of(&p, x, go, c->args, c->args->ints[3][0], c->args->ints[3][1]);
    p.is_max = 1;
    return cuda_rc(dv,
                   tdc_max_pool2d_backward(&cuda_slot_now(dv)->kd, &p, tdd_data(go), tdd_data(x),
                                           tdd_data(c->out[0]), (int)x->dtype),
                   "max_pool2d_backward");
}

/* conv2d as im2col + one strided-batched GEMM per group over the batch: y[n, group] =
 * W[group] (Og x K) col[n] (K x Ho*Wo), K = Cg*kh*kw; a bias is written first (beta = 1). */
static int exec_conv2d(cuda_dev *dv, const tdd_opcall *c)
{
    const tdd_opargs *g = c->args;
    const tdd_tensor *x = c->in[0], *w = c->in[1], *y = c->out[0];
    tdc_pool p;
    window_of(&p, x, y, g, w->shape[2], w->shape[3]);
    int64_t G = g->i[0], O = w->shape[0], Cg = w->shape[1], Og = O / G;
    int64_t K = Cg * p.k[0] * p.k[1], P = p.Ho * p.Wo;
    if (P > INT_MAX || Og > INT_MAX || K > INT_MAX || p.N > INT_MAX || O * P > INT64_MAX / 2)
        return TD_EUNSUPPORTED_OP; /* past cuBLAS's 32-bit sizes */
    if (x->dtype == TD_F64)
        return cuda_rc(dv,
                       tdc_conv2d_f64(&cuda_slot_now(dv)->kd, &p, tdd_data(x), tdd_data(w),
                                      (g->flags & 4u) ? tdd_data(c->in[2]) : NULL, tdd_data(y), O,
                                      Cg, Og),
                       "conv2d");
    float *yp = tdd_data(y), beta = 0.0f;
    int rc = 0;
    if (g->flags & 4u) {
        const tdd_tensor *bias = c->in[2];
        tdd_tensor yv = *y, bv = *bias;
        yv.ndim = bv.ndim = 3;
        yv.shape[0] = bv.shape[0] = p.N;
        yv.shape[1] = bv.shape[1] = O;
        yv.shape[2] = bv.shape[2] = P;
        tdd_set_contiguous(&yv);
        bv.strides[0] = bv.strides[2] = 0;
        bv.strides[1] = bias->strides[0];
        const tdd_tensor *ts[2] = {&yv, &bv};
        tdc_layout l;
        layout_of(&l, yv.shape, 3, 2, ts);
        rc =
            cuda_rc(dv, tdc_copy(&cuda_slot_now(dv)->kd, &l, yp, tdd_data(bias), 4), "conv2d bias");
        beta = 1.0f;
    }
    if (rc || p.N * O * P == 0)
        return rc;
    float *col = NULL;
    rc = cuda_rc(dv,
                 cudaMallocAsync((void **)&col, (size_t)(p.N * K * P) * sizeof(float),
                                 cuda_slot_now(dv)->stream),
                 "conv2d scratch");
    const float one = 1.0f;
    const float *wp = tdd_data(w);
    for (int64_t grp = 0; grp < G && !rc; grp++) {
        rc = cuda_rc(dv, tdc_im2col(&cuda_slot_now(dv)->kd, &p, tdd_data(x), col, Cg, grp),
                     "conv2d");
        if (!rc)
            rc = cuda_blas_rc(cuda_blas.sgemm_strided_batched(
                cuda_slot_now(dv)->blas, CUBLAS_OP_N, CUBLAS_OP_N, (int)P, (int)Og, (int)K, &one,
                col, (int)P, K * P, wp + grp * Og * K, (int)K, 0, &beta, yp + grp * Og * P, (int)P,
                O * P, (int)p.N));
    }
    if (col)
        (void)cudaFreeAsync(col, cuda_slot_now(dv)->stream);
    return rc;
}

/* How cuBLAS sees one operand of C = A B (row-major R x C view at strides sr, sc), given
 * that we compute C^T = B^T A^T in its column-major terms: a row-major matrix is the
 * transpose it wants (op N, ld = row stride); a column-major one needs op T. Size-1 dims
 * leave their stride free. False: neither (the operand is copied dense first). */
static bool gemm_side(int64_t rows, int64_t cols, int64_t sr, int64_t sc, cublasOperation_t *op,
                      int *ld)
{
    int64_t l;
    if (cols == 1 || sc == 1) {
        l = rows == 1 ? (cols > 1 ? cols : 1) : sr;
        if (l >= cols && l >= 1 && l <= INT_MAX) {
            *op = CUBLAS_OP_N;
            *ld = (int)l;
            return true;
        }
    }
    if (rows == 1 || sr == 1) {
        l = cols == 1 ? (rows > 1 ? rows : 1) : sc;
        if (l >= rows && l >= 1 && l <= INT_MAX) {
            *op = CUBLAS_OP_T;
            *ld = (int)l;
            return true;
        }
    }
    return false;
}

/* The one stride that steps through the nb batch dims of v in C order, if there is one. */
static bool batch_stride(const tdd_tensor *v, int nb, int64_t *stride)
{
    int64_t want = -1, s = 0;
    for (int d = nb - 1; d >= 0; d--) {
        if (v->shape[d] == 1)
            continue;
        if (want < 0)
            s = v->strides[d];
        else if (v->strides[d] != want)
            return false;
        want = v->strides[d] * v->shape[d];
    }
    *stride = s;
    return true;
}

typedef struct {
    const void *p;
    int64_t bstride;
    cublasOperation_t op;
    int ld;
} gemm_operand;

/* Describes view v ([batch.., R, C]) for cuBLAS, copying it dense into *tmp if it must. */
static int gemm_prepare(cuda_dev *dv, const tdd_tensor *v, int nb, int64_t batch, gemm_operand *o,
                        void **tmp)
{
    int64_t R = v->shape[nb], C = v->shape[nb + 1];
    *tmp = NULL;
    if (batch_stride(v, nb, &o->bstride) &&
        gemm_side(R, C, v->strides[nb], v->strides[nb + 1], &o->op, &o->ld)) {
        o->p = tdd_data(v);
        return 0;
    }
    size_t bytes = (size_t)(batch * R * C) * td_dtype_size(v->dtype);
    cudaError_t e = cudaMallocAsync(tmp, bytes ? bytes : 1, cuda_slot_now(dv)->stream);
    if (e)
        return cuda_rc(dv, e, "matmul scratch");
    int rc = copy_dense(dv, *tmp, v);
    if (rc)
        return rc;
    o->p = *tmp;
    o->bstride = R * C;
    o->op = CUBLAS_OP_N;
    o->ld = (int)(C > 1 ? C : 1);
    return 0;
}

/* matmul/bmm/linear in f64 and integers (tdc_gemm); a bias is written first. */
static int exec_gemm_naive(cuda_dev *dv, const tdd_opcall *c, const tdd_tensor *a,
                           const tdd_tensor *b, const tdd_tensor *y, int nb, int64_t M, int64_t N,
                           int64_t K)
{
    int acc = 0, rc = 0;
    if (c->op == TDD_OP_LINEAR && (c->args->flags & 4u)) {
        const tdd_tensor *bias = c->in[2];
        const tdd_tensor *ts[2] = {y, bias};
        tdc_layout l;
        layout_of(&l, y->shape, y->ndim, 2, ts);
        rc = cuda_rc(dv,
                     tdc_copy(&cuda_slot_now(dv)->kd, &l, tdd_data(y), tdd_data(bias),
                              (int)td_dtype_size(y->dtype)),
                     "linear bias");
        acc = 1;
    }
    if (rc)
        return rc;
    tdc_view yv = view_of(y), av = view_of(a), bv = view_of(b);
    return cuda_rc(dv,
                   tdc_gemm(&cuda_slot_now(dv)->kd, &yv, tdd_data(y), &av, tdd_data(a), &bv,
                            tdd_data(b), nb, M, N, K, acc),
                   tdd_opdefs[c->op].name);
}

static int exec_matmul(cuda_dev *dv, const tdd_opcall *c)
{
    const tdd_opargs *g = c->args;
    tdd_tensor a, b, y;
    tdd_matmul_views(c, &a, &b, &y);
    int nb = (int)g->i[3];
    int64_t M = g->i[0], K = g->i[1], N = g->i[2], batch = 1;
    for (int d = 0; d < nb; d++)
        batch *= g->ints[0][d];
    void *yp = tdd_data(c->out[0]);
    td_dtype dt = c->out[0]->dtype;
    size_t es = td_dtype_size(dt);
    if (batch == 0 || M == 0 || N == 0)
        return 0;
    if (dt != TD_F32 && !is_half(dt))
        return exec_gemm_naive(dv, c, &a, &b, &y, nb, M, N, K);
    if (M > INT_MAX || N > INT_MAX || K > INT_MAX || batch > INT_MAX)
        return TD_EUNSUPPORTED_OP; /* past cuBLAS's 32-bit sizes */
    float beta = 0.0f;
    int rc = 0;
    if (c->op == TDD_OP_LINEAR && (g->flags & 4u)) {
        /* y = bias broadcast, then the GEMM adds into it (beta = 1): no extra pass. */
        const tdd_tensor *bias = c->in[2];
        const tdd_tensor *ts[2] = {&y, bias};
        tdc_layout l;
        layout_of(&l, y.shape, y.ndim, 2, ts);
        rc = cuda_rc(dv, tdc_copy(&cuda_slot_now(dv)->kd, &l, yp, tdd_data(bias), (int)es),
                     "linear bias");
        beta = 1.0f;
    } else if (K == 0) {
        rc = cuda_rc(
            dv, cudaMemsetAsync(yp, 0, (size_t)(batch * M * N) * es, cuda_slot_now(dv)->stream),
            "matmul");
    }
    if (rc || K == 0)
        return rc;
    gemm_operand A, B;
    void *ta = NULL, *tb = NULL;
    rc = gemm_prepare(dv, &a, nb, batch, &A, &ta);
    if (!rc)
        rc = gemm_prepare(dv, &b, nb, batch, &B, &tb);
    if (!rc) {
        const float one = 1.0f;
        int m = (int)M, n = (int)N, k = (int)K;
        cublasStatus_t s;
        cudaDataType ht = dt == TD_F16 ? CUDA_R_16F : CUDA_R_16BF;
        if (is_half(dt) && batch == 1) /* f16/bf16 in, f32 sums, rounded once on store */
            s = cuda_blas.gemm_ex(cuda_slot_now(dv)->blas, B.op, A.op, n, m, k, &one, B.p, ht, B.ld,
                                  A.p, ht, A.ld, &beta, yp, ht, n, CUBLAS_COMPUTE_32F,
                                  CUBLAS_GEMM_DEFAULT);
        else if (is_half(dt))
            s = cuda_blas.gemm_strided_batched_ex(cuda_slot_now(dv)->blas, B.op, A.op, n, m, k,
                                                  &one, B.p, ht, B.ld, B.bstride, A.p, ht, A.ld,
                                                  A.bstride, &beta, yp, ht, n, M * N, (int)batch,
                                                  CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
        else if (batch == 1)
            s = cuda_blas.sgemm(cuda_slot_now(dv)->blas, B.op, A.op, n, m, k, &one, B.p, B.ld, A.p,
                                A.ld, &beta, yp, n);
        else
            s = cuda_blas.sgemm_strided_batched(cuda_slot_now(dv)->blas, B.op, A.op, n, m, k, &one,
                                                B.p, B.ld, B.bstride, A.p, A.ld, A.bstride, &beta,
                                                yp, n, M * N, (int)batch);
        rc = cuda_blas_rc(s);
    }
    if (ta)
        cudaFreeAsync(ta, cuda_slot_now(dv)->stream);
    if (tb)
        cudaFreeAsync(tb, cuda_slot_now(dv)->stream);
    return rc;
}

/* The bit pattern of value v (float value f, exact integer n) as one element of dt. */
static uint64_t element_bits(td_dtype dt, double f, int64_t n)
{
    uint64_t bits = 0; /* little-endian: the element sits in the low bytes */
    if (tdd_dtype_is_float(dt))
        tdd_store_f(&bits, dt, 0, f);
    else
        tdd_store_i(&bits, dt, 0, n);
    return bits;
}

static int exec_create(cuda_dev *dv, const tdd_opcall *c)
{
    const tdd_opargs *g = c->args;
    const tdd_tensor *y = c->out[0];
    void *yp = tdd_data(y);
    int64_t n = tdd_numel(y);
    int es = (int)td_dtype_size(y->dtype);
    cudaError_t e;
    switch (c->op) {
    case TDD_OP_FULL:
    case TDD_OP_ZEROS:
    case TDD_OP_ONES:
        e = tdc_fill(&cuda_slot_now(dv)->kd, yp, n, es, element_bits(y->dtype, g->f[0], g->n[0]));
        break;
    case TDD_OP_EYE:
        e = tdc_eye(&cuda_slot_now(dv)->kd, yp, y->shape[0], y->ndim > 1 ? y->shape[1] : 1, es,
                    element_bits(y->dtype, 1.0, 1));
        break;
    case TDD_OP_ARANGE:
        e = y->dtype == TD_I64
                ? tdc_arange_i64(&cuda_slot_now(dv)->kd, yp, n, g->n[0], g->n[2])
                : tdc_arange_f(&cuda_slot_now(dv)->kd, (int)y->dtype, yp, n, g->f[0], g->f[2]);
        break;
    case TDD_OP_LINSPACE:
        e = tdc_linspace_f(&cuda_slot_now(dv)->kd, (int)y->dtype, yp, n, g->f[0], g->f[1]);
        break;
    case TDD_OP_RAND:
    case TDD_OP_RANDN:
        e = tdc_random_fill(&cuda_slot_now(dv)->kd, c->op == TDD_OP_RAND ? TDC_RAND : TDC_RANDN, yp,
                            (int)y->dtype, n, g->seed, 0, 0);
        break;
    case TDD_OP_RANDINT:
        e = tdc_random_fill(&cuda_slot_now(dv)->kd, TDC_RANDINT, yp, (int)y->dtype, n, g->seed,
                            g->n[0], (uint64_t)g->n[1] - (uint64_t)g->n[0]);
        break;
    default:
        return TD_EUNSUPPORTED_OP;
    }
    return cuda_rc(dv, e, tdd_opdefs[c->op].name);
}

/* Copies view src into view dst of the same shape (any strides, same dtype). */
static int copy_view(cuda_dev *dv, const tdd_tensor *dst, const tdd_tensor *src)
{
    const tdd_tensor *ts[2] = {dst, src};
    tdc_layout l;
    layout_of(&l, src->shape, src->ndim, 2, ts);
    return cuda_rc(dv,
                   tdc_copy(&cuda_slot_now(dv)->kd, &l, tdd_data(dst), tdd_data(src),
                            (int)td_dtype_size(src->dtype)),
                   "copy");
}

/* cat/stack: each input copied into its slice of the output (no kernel of their own). */
static int exec_join(cuda_dev *dv, const tdd_opcall *c)
{
    const tdd_tensor *y = c->out[0];
    int dim = (int)c->args->i[0], rc = 0;
    int64_t at = 0;
    for (int k = 0; k < c->n_in && !rc; k++) {
        const tdd_tensor *x = c->in[k];
        tdd_tensor part = *y;
        if (c->op == TDD_OP_STACK) {
            part.ndim = x->ndim;
            for (int d = 0, e = 0; d < y->ndim; d++) {
                if (d == dim)
                    continue;
                part.shape[e] = y->shape[d];
                part.strides[e++] = y->strides[d];
            }
            part.offset = y->offset + k * y->strides[dim];
        } else {
            if (tdd_numel(x) == 0) { /* PyTorch lets an empty 1-D tensor join anything */
                at += x->ndim == y->ndim ? x->shape[dim] : 0;
                continue;
            }
            part.shape[dim] = x->shape[dim];
            part.offset = y->offset + at * y->strides[dim];
            at += x->shape[dim];
        }
        if (x->dtype == y->dtype) {
            rc = copy_view(dv, &part, x);
        } else {
            const tdd_tensor *ts[2] = {&part, x};
            tdc_layout l;
            layout_of(&l, x->shape, x->ndim, 2, ts);
            rc = cuda_rc(dv,
                         tdc_cast(&cuda_slot_now(dv)->kd, &l, tdd_data(&part), (int)y->dtype,
                                  tdd_data(x), (int)x->dtype),
                         "cast");
        }
    }
    return rc;
}

/* Constant pad (negative pads crop): fill with the value, then copy the overlap. */
static int exec_pad(cuda_dev *dv, const tdd_opcall *c)
{
    const tdd_opargs *g = c->args;
    const tdd_tensor *x = c->in[0], *y = c->out[0];
    if (g->i[0]) { /* reflect, replicate, circular: every output element reads the input */
        tdc_padmode pm;
        memset(&pm, 0, sizeof pm);
        pm.ndim = y->ndim;
        pm.mode = (int)g->i[0];
        pm.numel = tdd_numel(y);
        for (int d = 0; d < y->ndim; d++) {
            pm.yshape[d] = y->shape[d];
            pm.ystrides[d] = y->strides[d];
            pm.xshape[d] = x->shape[d];
            pm.xstrides[d] = x->strides[d];
            pm.before[d] = g->ints[0][d];
            pm.keep_start[d] = g->ints[1][d];
            pm.keep_len[d] = g->ints[2][d];
        }
        return cuda_rc(dv,
                       tdc_pad_mode(&cuda_slot_now(dv)->kd, &pm, tdd_data(y), tdd_data(x),
                                    (int)td_dtype_size(y->dtype)),
                       "pad");
    }
    /* A bool pad value is its truth (0.5 pads true, as ref), not its integer part. */
    int64_t n = y->dtype == TD_BOOL ? g->f[0] != 0.0 : tdd_sat_i64(g->f[0]);
    int rc = cuda_rc(dv,
                     tdc_fill(&cuda_slot_now(dv)->kd, tdd_data(y), tdd_numel(y),
                              (int)td_dtype_size(y->dtype), element_bits(y->dtype, g->f[0], n)),
                     "pad");
    tdd_tensor src = *x, dst = *y;
    for (int d = 0; d < x->ndim; d++) {
        int64_t lo = g->ints[0][d];
        int64_t skip = lo < 0 ? -lo : 0, start = lo > 0 ? lo : 0;
        int64_t len =
            x->shape[d] - skip < y->shape[d] - start ? x->shape[d] - skip : y->shape[d] - start;
        if (len < 0)
            len = 0;
        src.shape[d] = dst.shape[d] = len;
        src.offset += skip * x->strides[d];
        dst.offset += start * y->strides[d];
    }
    return rc ? rc : copy_view(dv, &dst, &src);
}

static int exec_tri(cuda_dev *dv, const tdd_opcall *c)
{
    const tdd_tensor *x = c->in[0], *y = c->out[0];
    if (y->ndim < 2)
        return TD_EINTERNAL; /* tdd_op_prepare requires a matrix */
    const tdd_tensor *ts[2] = {y, x};
    tdc_layout l;
    layout_of(&l, y->shape, y->ndim, 2, ts);
    return cuda_rc(dv,
                   tdc_tri(&cuda_slot_now(dv)->kd, &l, tdd_data(y), tdd_data(x),
                           (int)td_dtype_size(y->dtype), y->shape[y->ndim - 2],
                           y->shape[y->ndim - 1], c->args->i[0], c->op == TDD_OP_TRIU),
                   tdd_opdefs[c->op].name);
}

/* The dtype op c's kernel wants operand t in: f16/bf16 widened to f32 (the f32 kernels run on
 * copies, computed there and rounded back once: cpu_via_f32's way); the reductions' integer
 * and bool operands widened to int64 (or to the float dtype of a float output: logsumexp,
 * mean). Element moves and the elementwise kernels take every dtype as it is. */
static td_dtype kernel_dtype(const tdd_opcall *c, const tdd_tensor *t, bool out)
{
    if (tdd_ew_arity(c->op) || tdd_opdefs[c->op].kind == TDD_KIND_VIEW)
        return t->dtype;
    if (c->op == TDD_OP_WHERE) /* a select: both values in the promoted dtype */
        return out || t == c->in[0] ? t->dtype : c->out[0]->dtype;
    if (c->op == TDD_OP_SCATTER_ADD && t != c->in[1] && tdd_dtype_is_small_int(t->dtype))
        return TD_I32; /* atomic adds of 4 bytes; the sums wrap back the same way */
    if (c->op == TDD_OP_MASKED_FILL && c->n_in == 3 && !out && t == c->in[2])
        return c->out[0]->dtype; /* the value tensor, converted to the output's dtype */
    if (cuda_kernels[c->op].as_is)
        return t->dtype; /* any dtype as it is */
    if (is_half(t->dtype) && cuda_kernels[c->op].run == exec_matmul && inputs_are(c, 0, t->dtype) &&
        c->out[0]->dtype == t->dtype)
        return t->dtype; /* cublasGemmEx: f16/bf16 operands, f32 sums */
    if (is_half(t->dtype))
        return TD_F32;
    if (tdd_opdefs[c->op].kind == TDD_KIND_REDUCE && !tdd_dtype_is_float(t->dtype)) {
        td_dtype o = c->out[0]->dtype;
        if (out || !tdd_dtype_is_float(o))
            return TD_I64;
        return is_half(o) ? TD_F32 : o;
    }
    return t->dtype;
}

/* Ops whose kernels take dense operands only (anything else goes through a dense copy). */
static bool wants_dense(const tdd_opcall *c)
{
    const cuda_kernel *k = &cuda_kernels[c->op];
    return k->dense || (k->dense_if && k->dense_if(c));
}

static bool needs_copy(const tdd_opcall *c, const tdd_tensor *t, bool out)
{
    return kernel_dtype(c, t, out) != t->dtype || (wants_dense(c) && !tdd_is_contiguous(t));
}

/* Operands in another dtype (kernel_dtype) or strided where the kernel wants them dense get
 * scratch copies; the op runs on those; outputs are converted (or copied) back. */
static bool runs_via_copies(const tdd_opcall *c)
{
    for (int k = 0; k < c->n_in; k++)
        if (needs_copy(c, c->in[k], false))
            return true;
    for (int k = 0; k < c->n_out; k++)
        if (needs_copy(c, c->out[k], true))
            return true;
    return false;
}

static int execute_op(cuda_dev *dv, const tdd_opcall *c);

static int via_copies(cuda_dev *dv, const tdd_opcall *c)
{
    tdd_opcall fc = *c;
    tdd_opargs fa = *c->args;
    tdd_tensor tin[TDD_MAX_OP_INPUTS], tout[TDD_MAX_OP_OUTPUTS];
    tdd_storage sin[TDD_MAX_OP_INPUTS], sout[TDD_MAX_OP_OUTPUTS];
    void *bufs[TDD_MAX_OP_INPUTS + TDD_MAX_OP_OUTPUTS];
    int nb = 0, rc = 0;
    fc.args = &fa;
    if (is_half(fa.dtype))
        fa.dtype = TD_F32;
    if (is_half(fa.cdtype))
        fa.cdtype = TD_F32;
    if (c->n_out > 0 && needs_copy(c, c->out[0], true))
        fa.dtype = kernel_dtype(c, c->out[0], true);
    for (int k = 0; k < c->n_in + c->n_out && !rc; k++) {
        bool out = k >= c->n_in;
        const tdd_tensor *t = out ? c->out[k - c->n_in] : c->in[k];
        if (!needs_copy(c, t, out))
            continue;
        td_dtype kdt = kernel_dtype(c, t, out);
        tdd_tensor *f = out ? &tout[k - c->n_in] : &tin[k];
        tdd_storage *st = out ? &sout[k - c->n_in] : &sin[k];
        *f = *t;
        f->dtype = kdt;
        f->offset = 0;
        tdd_set_contiguous(f);
        int64_t n = tdd_numel(t);
        memset(st, 0, sizeof *st);
        st->nbytes = (size_t)n * td_dtype_size(f->dtype);
        rc = cuda_rc(
            dv, cudaMallocAsync(&st->data, st->nbytes ? st->nbytes : 1, cuda_slot_now(dv)->stream),
            "f32 scratch");
        if (rc)
            break;
        bufs[nb++] = st->data;
        f->st = st;
        if (out) {
            fc.out[k - c->n_in] = f;
            continue;
        }
        if (kdt == t->dtype) {
            rc = copy_dense(dv, st->data, t);
        } else {
            const tdd_tensor *ts[2] = {f, t};
            tdc_layout l;
            layout_of(&l, t->shape, t->ndim, 2, ts);
            rc = cuda_rc(dv,
                         tdc_cast(&cuda_slot_now(dv)->kd, &l, st->data, (int)kdt, tdd_data(t),
                                  (int)t->dtype),
                         "cast");
        }
        fc.in[k] = f;
    }
    if (!rc)
        rc = execute_op(dv, &fc);
    for (int k = 0; k < c->n_out && !rc; k++) {
        const tdd_tensor *t = c->out[k];
        if (fc.out[k] == t)
            continue;
        if (tout[k].dtype == t->dtype) {
            rc = copy_view(dv, t, &tout[k]);
            continue;
        }
        const tdd_tensor *ts[2] = {t, &tout[k]};
        tdc_layout l;
        layout_of(&l, t->shape, t->ndim, 2, ts);
        rc = cuda_rc(dv,
                     tdc_cast(&cuda_slot_now(dv)->kd, &l, tdd_data(t), (int)t->dtype,
                              tout[k].st->data, (int)tout[k].dtype),
                     "cast");
    }
    for (int k = 0; k < nb; k++)
        (void)cudaFreeAsync(bufs[k], cuda_slot_now(dv)->stream);
    return rc;
}

static int execute_call(void *ctx, int ordinal, const tdd_opcall *c);

/* One call on the calling session's slot: its operands first wait for their last users on
 * other slots (tensors of another session: graph values, transfers, collectives). */
int cuda_execute(void *ctx, int ordinal, const tdd_opcall *c)
{
    cuda_dev *dv = cuda_dev_of(ctx, ordinal);
    if (!dv)
        return TD_EINTERNAL;
    if (cuda_cur_slot && cuda_cur_slot->dev == dv) /* a part of a call (the by_parts helpers) */
        return execute_call(ctx, ordinal, c);
    cuda_last_err[0] = 0;
    int rc = cuda_dev_failed(dv);
    if (rc || (rc = cuda_rc(dv, cudaSetDevice(dv->id), "cudaSetDevice")))
        return rc;
    cuda_slot *sl = cuda_call_begin(dv);
    for (int i = 0; i < c->n_in + c->n_out && !rc; i++) {
        const tdd_tensor *t = i < c->n_in ? c->in[i] : c->out[i - c->n_in];
        if (t && t->st)
            rc = cuda_mem_use(dv, sl, t->st->data, t->st->nbytes);
    }
    if (!rc)
        rc = execute_call(ctx, ordinal, c);
    tdc_checks_name(&sl->checks, tdd_backend_session, c->op);
    cuda_call_end(sl);
    return rc;
}

static int execute_call(void *ctx, int ordinal, const tdd_opcall *c)
{
    cuda_dev *dv = cuda_dev_of(ctx, ordinal);
    cuda_last_err[0] = 0;
    int rc = cuda_dev_failed(dv);
    if (rc)
        return rc;
    tdd_composite_fn parts = tdd_op_composite(c); /* run as other ops (ops.h) */
    if (parts)
        return parts(c, cuda_execute, ctx, ordinal);
    if ((rc = cuda_supports(ctx, c)))
        return rc;
    if ((rc = cuda_rc(dv, cudaSetDevice(dv->id), "cudaSetDevice")))
        return rc;
    return runs_via_copies(c) ? via_copies(dv, c) : execute_op(dv, c);
}

/* The f32 path of every op (f16/bf16 reach here widened, through via_f32). */
static bool fast_f32(const tdd_opcall *c)
{
    return c->args->cdtype == TD_F32 && inputs_are(c, 0, TD_F32);
}

/* scaled_dot_product_attention: each operand's batch strides over the broadcast batch shape
 * (0 where it broadcasts), then its last two; f16/bf16 arrive widened (kernel_dtype). */
static int exec_sdpa(cuda_dev *dv, const tdd_opcall *c)
{
    const tdd_opargs *g = c->args;
    const tdd_tensor *y = c->out[0];
    tdc_sdpa_args a;
    memset(&a, 0, sizeof a);
    a.nb = (int)g->i[6];
    a.mask = (int)g->i[1];
    a.causal = (int)g->i[0];
    a.L = g->i[2];
    a.S = g->i[3];
    a.E = g->i[4];
    a.Ev = g->i[5];
    a.rows = a.Ev ? tdd_numel(y) / a.Ev : 0;
    a.scale = g->f[1];
    a.p = g->f[0];
    a.seed = g->seed;
    memcpy(a.bshape, g->ints[0], (size_t)a.nb * sizeof *a.bshape);
    for (int o = 0; o < c->n_in; o++) {
        const tdd_tensor *t = c->in[o];
        int tn = t->ndim;
        for (int d = 0; d < a.nb; d++) {
            int td = d - (a.nb + 2 - tn);
            a.bst[o][d] = td < 0 || t->shape[td] == 1 ? 0 : t->strides[td];
        }
        for (int d = 0; d < 2; d++) {
            int td = tn - 2 + d;
            a.rst[o][d] = td < 0 || t->shape[td] == 1 ? 0 : t->strides[td];
        }
    }
    const tdd_tensor *m = c->n_in > 3 ? c->in[3] : NULL;
    return cuda_rc(dv,
                   tdc_sdpa(&cuda_slot_now(dv)->kd, &a, (int)y->dtype, tdd_data(c->in[0]),
                            tdd_data(c->in[1]), tdd_data(c->in[2]), m ? tdd_data(m) : NULL,
                            tdd_data(y)),
                   tdd_opdefs[c->op].name);
}

/* interpolate: dense planes of [H, W] (H = 1 for 3-D inputs) */
static int exec_interp(cuda_dev *dv, const tdd_opcall *c)
{
    const tdd_opargs *g = c->args;
    const tdd_tensor *x = c->in[0], *y = c->out[0];
    int nd = (int)g->i[2];
    int64_t H = nd == 2 ? x->shape[2] : 1, W = x->shape[x->ndim - 1];
    int64_t Ho = nd == 2 ? y->shape[2] : 1, Wo = y->shape[y->ndim - 1];
    return cuda_rc(dv,
                   tdc_interpolate(&cuda_slot_now(dv)->kd, (int)y->dtype, tdd_data(x), tdd_data(y),
                                   x->shape[0] * x->shape[1], H, W, Ho, Wo, nd, (int)g->i[0],
                                   (int)g->i[1], g->f[0], g->f[nd - 1]),
                   tdd_opdefs[c->op].name);
}

/* where(cond, a, b) and masked_fill(input, mask, value): operands y, cond, a[, b]; masked_fill's
 * mask goes first; with a value tensor it is where(mask, value, input) */
static int exec_select(cuda_dev *dv, const tdd_opcall *c)
{
    const tdd_tensor *y = c->out[0];
    bool w = c->op == TDD_OP_WHERE, t = !w && c->n_in == 3, sel = w || t;
    const tdd_tensor *ts[4] = {y, w ? c->in[0] : c->in[1],
                               w   ? c->in[1]
                               : t ? c->in[2]
                                   : c->in[0],
                               w   ? c->in[2]
                               : t ? c->in[0]
                                   : NULL};
    tdc_layout l;
    layout_of(&l, y->shape, y->ndim, sel ? 4 : 3, ts);
    cudaError_t e =
        tdc_select(&cuda_slot_now(dv)->kd, &l, tdd_data(y), tdd_data(ts[1]), tdd_data(ts[2]),
                   sel ? tdd_data(ts[3]) : NULL, (int)td_dtype_size(y->dtype),
                   sel ? 0 : element_bits(y->dtype, c->args->f[0], c->args->n[0]));
    return cuda_rc(dv, e, tdd_opdefs[c->op].name);
}

static int exec_softmax(cuda_dev *dv, const tdd_opcall *c)
{
    return exec_rows(dv, c, TDC_SOFTMAX);
}

static int exec_log_softmax(cuda_dev *dv, const tdd_opcall *c)
{
    return exec_rows(dv, c, TDC_LOG_SOFTMAX);
}

static int exec_cumsum(cuda_dev *dv, const tdd_opcall *c)
{
    return exec_rows(dv, c, TDC_CUMSUM);
}

/* clone, and cast (same-dtype: a copy) */
static int exec_cast(cuda_dev *dv, const tdd_opcall *c)
{
    const tdd_tensor *x = c->in[0], *y = c->out[0];
    if (x->dtype == y->dtype)
        return copy_dense(dv, tdd_data(y), x);
    const tdd_tensor *ts[2] = {y, x};
    tdc_layout l;
    layout_of(&l, y->shape, y->ndim, 2, ts);
    return cuda_rc(dv,
                   tdc_cast(&cuda_slot_now(dv)->kd, &l, tdd_data(y), (int)y->dtype, tdd_data(x),
                            (int)x->dtype),
                   "cast");
}

static int exec_conv_transpose2d(cuda_dev *dv, const tdd_opcall *c)
{
    const tdd_tensor *x = c->in[0], *w = c->in[1], *y = c->out[0];
    const tdd_opargs *g = c->args;
    int nd = x->ndim;
    tdc_convt_args a = {.N = nd == 4 ? x->shape[0] : 1,
                        .Ci = x->shape[nd - 3],
                        .H = x->shape[nd - 2],
                        .W = x->shape[nd - 1],
                        .Co = y->shape[nd - 3],
                        .Ho = y->shape[nd - 2],
                        .Wo = y->shape[nd - 1],
                        .KH = w->shape[2],
                        .KW = w->shape[3],
                        .G = g->i[0],
                        .sh = g->ints[0][0],
                        .sw = g->ints[0][1],
                        .ph = g->ints[1][0],
                        .pw = g->ints[1][1],
                        .dh = g->ints[2][0],
                        .dw = g->ints[2][1]};
    return cuda_rc(dv,
                   tdc_conv_transpose2d(&cuda_slot_now(dv)->kd, (int)x->dtype, tdd_data(x),
                                        tdd_data(w), (g->flags & 4u) ? tdd_data(c->in[2]) : NULL,
                                        tdd_data(y), &a),
                   "conv_transpose2d");
}

static int exec_batch_norm(cuda_dev *dv, const tdd_opcall *c)
{
    const tdd_tensor *x = c->in[0], *y = c->out[0];
    const tdd_opargs *g = c->args;
    int64_t N = x->shape[0], C = x->shape[1], n = tdd_numel(x);
    int64_t S = N != 0 && C != 0 ? n / (N * C) : 0;
    bool stats = g->flags & 1u;
    return cuda_rc(dv,
                   tdc_batch_norm(&cuda_slot_now(dv)->kd, (int)x->dtype, tdd_data(x), tdd_data(y),
                                  stats ? tdd_data(c->in[1]) : NULL,
                                  stats ? tdd_data(c->in[2]) : NULL,
                                  (g->flags & 2u) ? tdd_data(c->in[3]) : NULL,
                                  (g->flags & 4u) ? tdd_data(c->in[4]) : NULL, N, C, S,
                                  (int)g->i[0], g->f[1], g->f[0]),
                   "batch_norm");
}

static int exec_group_norm(cuda_dev *dv, const tdd_opcall *c)
{
    const tdd_tensor *x = c->in[0], *y = c->out[0];
    const tdd_opargs *g = c->args;
    int64_t N = x->shape[0], C = x->shape[1], n = tdd_numel(x);
    int64_t S = N != 0 && C != 0 ? n / (N * C) : 0;
    return cuda_rc(dv,
                   tdc_group_norm(&cuda_slot_now(dv)->kd, (int)x->dtype, tdd_data(x), tdd_data(y),
                                  (g->flags & 1u) ? tdd_data(c->in[1]) : NULL,
                                  (g->flags & 2u) ? tdd_data(c->in[2]) : NULL, N, C, S, g->i[0],
                                  g->f[0]),
                   "group_norm");
}

static int exec_adaptive_avg_pool2d(cuda_dev *dv, const tdd_opcall *c)
{
    const tdd_tensor *x = c->in[0], *y = c->out[0];
    int nd = x->ndim;
    int64_t hw = x->shape[nd - 2] * x->shape[nd - 1], planes = hw ? tdd_numel(x) / hw : 0;
    return cuda_rc(dv,
                   tdc_adaptive_avg_pool2d(&cuda_slot_now(dv)->kd, (int)x->dtype, tdd_data(x),
                                           tdd_data(y), planes, x->shape[nd - 2], x->shape[nd - 1],
                                           y->shape[nd - 2], y->shape[nd - 1]),
                   tdd_opdefs[c->op].name);
}

static int exec_sort(cuda_dev *dv, const tdd_opcall *c)
{
    const tdd_tensor *x = c->in[0], *y = c->out[0];
    const tdd_opargs *g = c->args;
    int d = (int)g->i[0];
    int64_t outer = 1, inner = 1, L = x->ndim ? x->shape[d] : 1;
    for (int k = 0; k < x->ndim; k++) {
        if (k < d)
            outer *= x->shape[k];
        else if (k > d)
            inner *= x->shape[k];
    }
    bool arg = c->op == TDD_OP_ARGSORT;
    return cuda_rc(dv,
                   tdc_sort(&cuda_slot_now(dv)->kd, tdd_data(x), (int)x->dtype,
                            (int)td_dtype_size(x->dtype), outer, L, inner, g->i[2], (int)g->i[1],
                            arg ? NULL : tdd_data(y), (int64_t *)tdd_data(arg ? y : c->out[1])),
                   tdd_opdefs[c->op].name);
}

/* The rules of the table's rows that an output-dtype mask does not say. */
static bool where_accepts(const tdd_opcall *c) /* a select of one dtype (kernel_dtype) */
{
    return c->in[0]->dtype == TD_BOOL;
}

static bool masked_fill_accepts(const tdd_opcall *c)
{
    return c->in[0]->dtype == c->args->dtype;
}

static bool multinomial_accepts(const tdd_opcall *c) /* f32, f64 weights (tdc_multinomial) */
{
    return c->in[0]->dtype == TD_F32 || c->in[0]->dtype == TD_F64;
}

static bool loss_dense_if(const tdd_opcall *c) /* [N, C, d...], weights, soft targets */
{
    return c->in[0]->ndim > 2 || c->args->flags != 0;
}

#define DT(t) (1u << TD_##t)
#define FLOATS (DT(F16) | DT(BF16) | DT(F32) | DT(F64))
/* cuda's kernel table: each op's dispatch function and what it runs (f16/bf16 operands are
 * widened to f32 unless as_is; the reductions' integer operands to int64: kernel_dtype). An op
 * absent here (and neither elementwise, a view nor a composite) is UNSUPPORTED_OP on cuda. */
static const cuda_kernel cuda_kernels[TDD_OP_COUNT] = {
    [TDD_OP_WHERE] = {.run = exec_select, .accepts = where_accepts},
    [TDD_OP_MASKED_FILL] = {.run = exec_select, .accepts = masked_fill_accepts, .as_is = true},
    /* reductions: f32, f64, int64 kernels; the rest widened (kernel_dtype) */
    [TDD_OP_SUM] = {.run = exec_reduce},
    [TDD_OP_MEAN] = {.run = exec_reduce},
    [TDD_OP_AMAX] = {.run = exec_reduce},
    [TDD_OP_AMIN] = {.run = exec_reduce},
    [TDD_OP_ARGMAX] = {.run = exec_reduce},
    [TDD_OP_ARGMIN] = {.run = exec_reduce},
    [TDD_OP_VAR] = {.run = exec_reduce},
    [TDD_OP_STD] = {.run = exec_reduce},
    [TDD_OP_LOGSUMEXP] = {.run = exec_reduce},
    [TDD_OP_PROD] = {.run = exec_reduce},
    [TDD_OP_SUM_TO] = {.run = exec_reduce},
    [TDD_OP_CUMSUM] = {.run = exec_cumsum},
    [TDD_OP_SOFTMAX] = {.run = exec_softmax},
    [TDD_OP_LOG_SOFTMAX] = {.run = exec_log_softmax},
    /* sgemm; f16/bf16 through f32 copies; f64 and integers: tdc_gemm */
    [TDD_OP_MATMUL] = {.run = exec_matmul},
    [TDD_OP_BMM] = {.run = exec_matmul},
    [TDD_OP_LINEAR] = {.run = exec_matmul},
    /* copies, casts, joins, index moves: any dtype as it is */
    [TDD_OP_CLONE] = {.run = exec_cast, .as_is = true},
    [TDD_OP_CAST] = {.run = exec_cast, .as_is = true},
    [TDD_OP_CAT] = {.run = exec_join, .as_is = true},
    [TDD_OP_STACK] = {.run = exec_join, .as_is = true},
    [TDD_OP_GATHER] = {.run = exec_index, .as_is = true},
    [TDD_OP_SCATTER_ADD] = {.run = exec_index}, /* f16/bf16 accumulate in f32 copies */
    [TDD_OP_INDEX_SELECT] = {.run = exec_index, .as_is = true},
    [TDD_OP_ONE_HOT] = {.run = exec_index, .as_is = true},
    [TDD_OP_EMBEDDING] = {.run = exec_index, .as_is = true},
    [TDD_OP_EMBEDDING_BAG] = {.run = exec_bag, .dtypes = DT(F32) | DT(F64)},
    [TDD_OP_EMBEDDING_BAG_BACKWARD] = {.run = exec_bag, .dtypes = DT(F32) | DT(F64)},
    [TDD_OP_MULTINOMIAL] = {.run = exec_bag, .accepts = multinomial_accepts},
    [TDD_OP_TRIL] = {.run = exec_tri, .as_is = true},
    [TDD_OP_TRIU] = {.run = exec_tri, .as_is = true},
    [TDD_OP_PAD] = {.run = exec_pad, .as_is = true},
    /* ranks of dense lines, any dtype */
    [TDD_OP_SORT] = {.run = exec_sort, .dense = true},
    [TDD_OP_ARGSORT] = {.run = exec_sort, .dense = true},
    [TDD_OP_TOPK] = {.run = exec_sort, .dense = true},
    /* f32 and f64 kernels; f16/bf16 through f32 */
    [TDD_OP_CROSS_ENTROPY] = {.run = exec_loss, .dense_if = loss_dense_if},
    [TDD_OP_NLL_LOSS] = {.run = exec_loss, .dense_if = loss_dense_if},
    [TDD_OP_MSE_LOSS] = {.run = exec_pointwise_loss},
    [TDD_OP_BCE_WITH_LOGITS] = {.run = exec_pointwise_loss},
    [TDD_OP_LAYER_NORM] = {.run = exec_nn, .dense = true},
    [TDD_OP_GROUP_NORM] = {.run = exec_group_norm, .dense = true},
    /* any float dtype as it is (the running stats, dense, written in place) */
    [TDD_OP_BATCH_NORM] = {.run = exec_batch_norm, .as_is = true, .dense = true},
    [TDD_OP_DROPOUT] = {.run = exec_nn, .as_is = true},
    /* strided operands, f16/bf16 widened; a bool mask as bytes */
    [TDD_OP_SDPA] = {.run = exec_sdpa},
    [TDD_OP_INTERPOLATE] = {.run = exec_interp, .dense = true},
    /* f32 (f16/bf16 widened) through sgemm; f64 directly */
    [TDD_OP_CONV2D] = {.run = exec_conv2d, .dense = true},
    [TDD_OP_CONV_TRANSPOSE2D] = {.run = exec_conv_transpose2d, .dense = true},
    [TDD_OP_MAX_POOL2D] = {.run = exec_nn, .dense = true},
    [TDD_OP_AVG_POOL2D] = {.run = exec_nn, .dense = true},
    [TDD_OP_MAX_POOL2D_BACKWARD] = {.run = exec_max_pool2d_backward, .dense = true},
    [TDD_OP_PIXEL_SHUFFLE] = {.run = exec_pixel_shuffle, .as_is = true, .dense = true},
    [TDD_OP_PIXEL_UNSHUFFLE] = {.run = exec_pixel_shuffle, .as_is = true, .dense = true},
    [TDD_OP_ADAPTIVE_AVG_POOL2D] = {.run = exec_adaptive_avg_pool2d, .dense = true},
    [TDD_OP_FULL] = {.run = exec_create},
    [TDD_OP_ZEROS] = {.run = exec_create},
    [TDD_OP_ONES] = {.run = exec_create},
    [TDD_OP_EYE] = {.run = exec_create},
    [TDD_OP_ARANGE] = {.run = exec_create, .dtypes = DT(F32) | DT(F64) | DT(I64)},
    [TDD_OP_LINSPACE] = {.run = exec_create, .dtypes = FLOATS},
    /* f16/bf16: the f32 draws rounded (via_copies) */
    [TDD_OP_RAND] = {.run = exec_create, .dtypes = FLOATS},
    [TDD_OP_RANDN] = {.run = exec_create, .dtypes = FLOATS},
    [TDD_OP_RANDINT] = {.run = exec_create, .dtypes = DT(I64) | DT(I32)},
};
#undef DT
#undef FLOATS

static int execute_op(cuda_dev *dv, const tdd_opcall *c)
{
    if (tdd_ew_arity(c->op) == 2)
        return fast_f32(c) ? exec_binary(dv, c) : exec_ew(dv, c);
    if (tdd_ew_arity(c->op) == 1)
        return fast_f32(c) ? exec_unary(dv, c) : exec_ew(dv, c);
    if (tdd_opdefs[c->op].kind == TDD_KIND_VIEW)
        return c->args->out_view ? 0 : copy_dense(dv, tdd_data(c->out[0]), c->in[0]);
    return cuda_kernels[c->op].run(dv, c); /* supports() let only the table's ops through */
}
