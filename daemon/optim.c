/* optim.c -- optimizers in the daemon (SGD, Adam, AdamW, RMSprop, Adagrad with
 * PyTorch's exact update rules): state keyed by parameter, updates in place on the
 * parameter's device queue, reading a Gradients handle.
 *
 * On host-memory backends (ref, cpu) the update is one loop per parameter
 * on its device's worker; elsewhere (or with the "foreach" attribute) it is
 * the same arithmetic as queued ops (see step_ops). The requests that create
 * and step optimizers are in optim_req.c. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef __SSE2__
#include <immintrin.h>
#endif

#include "optim.h"

/* Steps whose parameters hold at most this many elements in all run on the
 * loop thread when the device is idle: ~5 us on the SSE path, tens of us on
 * the scalar one -- less than the thread hand-off it saves, and short next to
 * other sessions' round trips. */
#define OPTIM_INLINE_MAX_ELEMS 16384

void tdd_optim_free(tdd_optim *o)
{
    for (size_t i = 0; i < o->n; i++) {
        tdd_value_unref(o->ps[i].p);
        tdd_value_unref(o->ps[i].buf[0]);
        tdd_value_unref(o->ps[i].buf[1]);
        tdd_value_unref(o->ps[i].buf[2]);
    }
    if (o->acct) {
        tdd_account_credit(o->acct, o->bytes);
        tdd_account_unref(o->acct);
    }
    free(o->ps);
    free(o);
}

static void optim_free(void *obj)
{
    tdd_optim_free(obj);
}

void tdd_optim_init(void)
{
    tdd_handle_set_free_fn(TD_HANDLE_OPTIMIZER, optim_free);
}

tdd_optim *tdd_optim_new(tdd_session *s, size_t n_params, td_error *err)
{
    tdd_optim *o = calloc(1, sizeof *o);
    uint64_t bytes = sizeof *o + n_params * sizeof *o->ps;
    if (!o || !(o->ps = calloc(n_params, sizeof *o->ps))) {
        free(o);
        tdd_err_set(err, TD_ERESOURCE_EXHAUSTED, "out of host memory");
        return NULL;
    }
    if (tdd_account_charge(s->acct, bytes, err)) {
        free(o->ps);
        free(o);
        return NULL;
    }
    o->acct = s->acct;
    o->acct->refs++;
    o->bytes = bytes;
    return o;
}

unsigned tdd_optim_kept(const opt_hyper *h)
{
    switch (h->kind) {
    case OPT_SGD:
        return h->momentum != 0.0 ? 1u : 0u;
    case OPT_ADAM:
    case OPT_ADAMW:
        return h->amsgrad ? 7u : 3u;
    case OPT_RMSPROP:
        return 1u | (h->momentum > 0.0 ? 2u : 0u) | (h->centered ? 4u : 0u);
    case OPT_ADAGRAD:
        return 1u;
    }
    return 0u;
}

void tdd_optim_add_param(tdd_optim *o, tdd_value *p)
{
    tdd_value_ref(p);
    o->ps[o->n++].p = p;
}

/* ---------------------------------------------------------------- the update (worker side) */

typedef struct {
    opt_hyper h;
    int64_t step;   /* after this update (Adam's bias correction, Adagrad's lr decay) */
    unsigned fresh; /* bit k: buffer k starts with this update (torch's zeros, or Adagrad's
                     * initial_accumulator_value) */
    tdd_tensor p, g, b0, b1, b2;
    tdd_value *pv, *gv, *bv[3]; /* references keeping the tensors alive */
    tdd_session *s;
} step_job;

/* Storage offset of the i-th element (C order) of a strided view. */
static int64_t elem_off(const tdd_tensor *t, int64_t i)
{
    int64_t off = t->offset;
    for (int d = t->ndim - 1; d >= 0; d--) {
        int64_t n = t->shape[d];
        off += (i % n) * t->strides[d];
        i /= n;
    }
    return off;
}

/* In a step loop over element i: the parameter's storage offset po and the gradient gi,
 * negated for maximize and, when l2, with weight decay added as torch.optim does (AdamW
 * decays the parameter instead). */
#define TDD_OPTIM_GRAD(T, po, gi, l2)                                                              \
    int64_t po = pc ? j->p.offset + i : elem_off(&j->p, i);                                        \
    T gi = G[gc ? j->g.offset + i : elem_off(&j->g, i)];                                           \
    if (h->maximize)                                                                               \
        gi = -gi;                                                                                  \
    if ((l2) && h->weight_decay != 0.0)                                                            \
        gi = gi + wd * P[po];

/* One definition per dtype: arithmetic in the parameter's dtype, scalars
 * rounded to it once, in the order torch.optim applies them. */
#define TDD_OPTIM_LOOP(T, NAME)                                                                    \
    static void NAME(step_job *j)                                                                  \
    {                                                                                              \
        const opt_hyper *h = &j->h;                                                                \
        T *P = j->p.st->data, *G = j->g.st->data;                                                  \
        T *SB0 = j->bv[0] ? (T *)tdd_data(&j->b0) : NULL;                                          \
        T *SB1 = j->bv[1] ? (T *)tdd_data(&j->b1) : NULL;                                          \
        T *SB2 = j->bv[2] ? (T *)tdd_data(&j->b2) : NULL;                                          \
        bool f0 = j->fresh & 1u, f1 = j->fresh & 2u, f2 = j->fresh & 4u;                           \
        int64_t n = tdd_numel(&j->p);                                                              \
        bool pc = tdd_is_contiguous(&j->p), gc = tdd_is_contiguous(&j->g);                         \
        T wd = (T)h->weight_decay, lr = (T)h->lr;                                                  \
        if (h->kind == OPT_SGD) {                                                                  \
            T mom = (T)h->momentum, damp = (T)(1.0 - h->dampening);                                \
            for (int64_t i = 0; i < n; i++) {                                                      \
                TDD_OPTIM_GRAD(T, po, gi, true)                                                    \
                if (h->momentum != 0.0) {                                                          \
                    SB0[i] = f0 ? gi : SB0[i] * mom + damp * gi;                                   \
                    gi = h->nesterov ? gi + mom * SB0[i] : SB0[i];                                 \
                }                                                                                  \
                P[po] = P[po] + (-lr) * gi;                                                        \
            }                                                                                      \
            return;                                                                                \
        }                                                                                          \
        if (h->kind == OPT_RMSPROP) {                                                              \
            T al = (T)h->alpha, oal = (T)(1.0 - h->alpha), mom = (T)h->momentum, eps = (T)h->eps;  \
            for (int64_t i = 0; i < n; i++) {                                                      \
                TDD_OPTIM_GRAD(T, po, gi, true)                                                    \
                T sa = (f0 ? (T)0 : SB0[i]) * al + oal * (gi * gi), avg;                           \
                SB0[i] = sa;                                                                       \
                if (h->centered) {                                                                 \
                    T ga = (f2 ? (T)0 : SB2[i]) * al + oal * gi;                                   \
                    SB2[i] = ga;                                                                   \
                    avg = SQRT_##T(sa - ga * ga);                                                  \
                } else {                                                                           \
                    avg = SQRT_##T(sa);                                                            \
                }                                                                                  \
                avg = avg + eps;                                                                   \
                if (h->momentum > 0.0) {                                                           \
                    T b = (f1 ? (T)0 : SB1[i]) * mom + gi / avg;                                   \
                    SB1[i] = b;                                                                    \
                    P[po] = P[po] + (-lr) * b;                                                     \
                } else {                                                                           \
                    P[po] = P[po] + (-lr) * (gi / avg);                                            \
                }                                                                                  \
            }                                                                                      \
            return;                                                                                \
        }                                                                                          \
        if (h->kind == OPT_ADAGRAD) {                                                              \
            T clr = (T)(h->lr / (1.0 + (double)(j->step - 1) * h->lr_decay)), eps = (T)h->eps,     \
              acc = (T)h->init_acc;                                                                \
            for (int64_t i = 0; i < n; i++) {                                                      \
                TDD_OPTIM_GRAD(T, po, gi, true)                                                    \
                T sum = (f0 ? acc : SB0[i]) + gi * gi;                                             \
                SB0[i] = sum;                                                                      \
                P[po] = P[po] + (-clr) * (gi / (SQRT_##T(sum) + eps));                             \
            }                                                                                      \
            return;                                                                                \
        }                                                                                          \
        double bc1 = 1.0 - pow(h->beta1, (double)j->step);                                         \
        double bc2 = 1.0 - pow(h->beta2, (double)j->step);                                         \
        T b1 = (T)h->beta1, b2 = (T)h->beta2, ob1 = (T)(1.0 - h->beta1),                           \
          ob2 = (T)(1.0 - h->beta2);                                                               \
        T step_size = (T)(h->lr / bc1), bc2s = (T)sqrt(bc2), eps = (T)h->eps;                      \
        T decay = (T)(1.0 - h->lr * h->weight_decay);                                              \
        for (int64_t i = 0; i < n; i++) {                                                          \
            TDD_OPTIM_GRAD(T, po, gi, h->kind != OPT_ADAMW)                                        \
            if (h->kind == OPT_ADAMW)                                                              \
                P[po] = P[po] * decay;                                                             \
            T m = f0 ? (T)0 : SB0[i], v = f1 ? (T)0 : SB1[i];                                      \
            m = m * b1 + ob1 * gi;                                                                 \
            v = v * b2 + ob2 * (gi * gi);                                                          \
            SB0[i] = m;                                                                            \
            SB1[i] = v;                                                                            \
            if (h->amsgrad) {                                                                      \
                /* torch.maximum (NaN propagates); max(0, v) is v */                               \
                T mx = f2 ? v : SB2[i];                                                            \
                v = mx > v || mx != mx ? mx : v;                                                   \
                SB2[i] = v;                                                                        \
            }                                                                                      \
            T denom = (T)(SQRT_##T(v) / bc2s) + eps;                                               \
            P[po] = P[po] + (-step_size) * (m / denom);                                            \
        }                                                                                          \
    }

#define SQRT_float sqrtf
#define SQRT_double sqrt
TDD_OPTIM_LOOP(float, update_f32)
TDD_OPTIM_LOOP(double, update_f64)

/* The common case -- Adam or AdamW on float32, dense, unaliased tensors --
 * four elements at a time in SSE: the per-element branches of the loop above
 * become per-call constants, fresh moments are zeroed first (0 * beta1 + x is
 * what the loop above computes too), and the operations are the same, in
 * the same order, each correctly rounded: bit-identical to the loop above.
 * (gcc -O2 will not vectorise the plain loop: sqrtf may set errno.) */
#ifdef __SSE2__
static void adam_dense_f32(step_job *j, int64_t n)
{
    const opt_hyper *h = &j->h;
    float *P = tdd_data(&j->p), *M = tdd_data(&j->b0), *V = tdd_data(&j->b1);
    float *X = j->h.amsgrad ? tdd_data(&j->b2) : NULL; /* max_exp_avg_sq */
    const float *G = tdd_data(&j->g);
    if (j->fresh & 1u)
        memset(M, 0, (size_t)n * sizeof *M);
    if (j->fresh & 2u)
        memset(V, 0, (size_t)n * sizeof *V);
    if (X && (j->fresh & 4u)) /* max(0, v) is v, as the loop's max(v, v) */
        memset(X, 0, (size_t)n * sizeof *X);
    double bc1 = 1.0 - pow(h->beta1, (double)j->step);
    double bc2 = 1.0 - pow(h->beta2, (double)j->step);
    float gsign = h->maximize ? -1.0f : 1.0f, wd = (float)h->weight_decay;
    float decay = (float)(1.0 - h->lr * h->weight_decay), b1 = (float)h->beta1,
          b2 = (float)h->beta2, ob1 = (float)(1.0 - h->beta1), ob2 = (float)(1.0 - h->beta2),
          nss = -(float)(h->lr / bc1), bc2s = (float)sqrt(bc2), eps = (float)h->eps;
    bool adamw = h->kind == OPT_ADAMW, l2 = !adamw && h->weight_decay != 0.0;
    __m128 vgs = _mm_set1_ps(gsign), vwd = _mm_set1_ps(wd), vdec = _mm_set1_ps(decay),
           vb1 = _mm_set1_ps(b1), vb2 = _mm_set1_ps(b2), vob1 = _mm_set1_ps(ob1),
           vob2 = _mm_set1_ps(ob2), vnss = _mm_set1_ps(nss), vbc2s = _mm_set1_ps(bc2s),
           veps = _mm_set1_ps(eps);
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) {
        __m128 g = _mm_mul_ps(_mm_loadu_ps(G + i), vgs), p = _mm_loadu_ps(P + i);
        if (adamw)
            p = _mm_mul_ps(p, vdec);
        else if (l2)
            g = _mm_add_ps(g, _mm_mul_ps(vwd, p));
        __m128 m = _mm_add_ps(_mm_mul_ps(_mm_loadu_ps(M + i), vb1), _mm_mul_ps(vob1, g));
        __m128 v =
            _mm_add_ps(_mm_mul_ps(_mm_loadu_ps(V + i), vb2), _mm_mul_ps(vob2, _mm_mul_ps(g, g)));
        _mm_storeu_ps(M + i, m);
        _mm_storeu_ps(V + i, v);
        if (X) {
            /* maxps answers its second operand when either is NaN; a NaN
             * maximum is kept as the loop (and torch.maximum) keeps it */
            __m128 x = _mm_loadu_ps(X + i), nan = _mm_cmpunord_ps(x, x);
            v = _mm_or_ps(_mm_and_ps(nan, x), _mm_andnot_ps(nan, _mm_max_ps(x, v)));
            _mm_storeu_ps(X + i, v);
        }
        __m128 denom = _mm_add_ps(_mm_div_ps(_mm_sqrt_ps(v), vbc2s), veps);
        _mm_storeu_ps(P + i, _mm_add_ps(p, _mm_mul_ps(vnss, _mm_div_ps(m, denom))));
    }
    for (; i < n; i++) {
        float g = G[i] * gsign, p = P[i];
        if (adamw)
            p = p * decay;
        else if (l2)
            g = g + wd * p;
        float m = M[i] * b1 + ob1 * g, v = V[i] * b2 + ob2 * (g * g);
        M[i] = m;
        V[i] = v;
        if (X) {
            float x = X[i];
            v = x > v || x != x ? x : v;
            X[i] = v;
        }
        P[i] = p + nss * (m / (sqrtf(v) / bc2s + eps));
    }
}

/* Plain SGD (with weight decay, momentum, dampening, nesterov, maximize) on float32,
 * dense and unaliased: the loop above four elements at a time, the same operations
 * in the same order (bit-identical). The scalar loop's index arithmetic and
 * per-element branches cost ~1.7 ns an element: 8% of a 64-128-10 MLP step. */
static void sgd_dense_f32(step_job *j, int64_t n)
{
    const opt_hyper *h = &j->h;
    float *P = tdd_data(&j->p), *B = h->momentum != 0.0 ? tdd_data(&j->b0) : NULL;
    const float *G = tdd_data(&j->g);
    bool fresh = j->fresh & 1u, l2 = h->weight_decay != 0.0, nesterov = h->nesterov,
         neg = h->maximize;
    float wd = (float)h->weight_decay, nlr = -(float)h->lr, mom = (float)h->momentum,
          damp = (float)(1.0 - h->dampening);
    /* maximize flips the sign bit, as the loop's negation does (NaNs included) */
    __m128 vneg = _mm_set1_ps(neg ? -0.0f : 0.0f), vwd = _mm_set1_ps(wd), vnlr = _mm_set1_ps(nlr),
           vmom = _mm_set1_ps(mom), vdamp = _mm_set1_ps(damp);
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) {
        __m128 g = _mm_xor_ps(_mm_loadu_ps(G + i), vneg), p = _mm_loadu_ps(P + i);
        if (l2)
            g = _mm_add_ps(g, _mm_mul_ps(vwd, p));
        if (B) {
            __m128 b =
                fresh ? g : _mm_add_ps(_mm_mul_ps(_mm_loadu_ps(B + i), vmom), _mm_mul_ps(vdamp, g));
            _mm_storeu_ps(B + i, b);
            g = nesterov ? _mm_add_ps(g, _mm_mul_ps(vmom, b)) : b;
        }
        _mm_storeu_ps(P + i, _mm_add_ps(p, _mm_mul_ps(vnlr, g)));
    }
    for (; i < n; i++) {
        float g = neg ? -G[i] : G[i], p = P[i];
        if (l2)
            g = g + wd * p;
        if (B) {
            float b = fresh ? g : B[i] * mom + damp * g;
            B[i] = b;
            g = nesterov ? g + mom * b : b;
        }
        P[i] = p + nlr * g;
    }
}

/* The SGD dense path applies: float32, parameter, gradient (and momentum buffer)
 * contiguous, none sharing storage with another. */
static bool sgd_dense_ok(const step_job *j)
{
    if (j->h.kind != OPT_SGD || j->p.dtype != TD_F32 || !tdd_is_contiguous(&j->p) ||
        !tdd_is_contiguous(&j->g) || j->p.st == j->g.st)
        return false;
    if (j->h.momentum == 0.0)
        return true;
    return j->bv[0] && tdd_is_contiguous(&j->b0) && j->b0.st != j->p.st && j->b0.st != j->g.st;
}

/* The dense path applies: Adam(W) on float32, every tensor contiguous, no
 * two sharing storage (each element is read before it is written). */
static bool adam_dense_ok(const step_job *j)
{
    bool ok = (j->h.kind == OPT_ADAM || j->h.kind == OPT_ADAMW) && j->p.dtype == TD_F32 &&
              j->bv[0] && j->bv[1] && tdd_is_contiguous(&j->p) && tdd_is_contiguous(&j->g) &&
              tdd_is_contiguous(&j->b0) && tdd_is_contiguous(&j->b1) && j->p.st != j->g.st &&
              j->p.st != j->b0.st && j->p.st != j->b1.st && j->g.st != j->b0.st &&
              j->g.st != j->b1.st && j->b0.st != j->b1.st;
    if (ok && j->h.amsgrad) /* max_exp_avg_sq likewise */
        ok = j->bv[2] && tdd_is_contiguous(&j->b2) && j->b2.st != j->p.st && j->b2.st != j->g.st &&
             j->b2.st != j->b0.st && j->b2.st != j->b1.st;
    return ok;
}
#endif

static int step_run(void *arg)
{
    step_job *j = arg;
    /* Earlier work of the session on this queue has run; a gradient that
     * came from a failed op says so. */
    if (tdd_value_poisoned(j->gv))
        return TD_EPOISONED;
#ifdef __SSE2__
    if (adam_dense_ok(j)) {
        adam_dense_f32(j, tdd_numel(&j->p));
        return 0;
    }
    if (sgd_dense_ok(j)) {
        sgd_dense_f32(j, tdd_numel(&j->p));
        return 0;
    }
#endif
    if (j->p.dtype == TD_F32)
        update_f32(j);
    else
        update_f64(j);
    return 0;
}

/* All of one step's updates on one device: one task. A task per parameter cost two
 * thread hand-offs and a completion each on the loop (200k one-element parameters
 * stalled every session 0.7 s per step). */
typedef struct {
    tdd_value *pv, *gv, *bv[3]; /* references */
    int64_t step;               /* after this update */
    unsigned fresh;
    size_t pi; /* the parameter's index in the optimizer (loop side) */
} step_item;

typedef struct {
    opt_hyper h;
    tdd_session *s;
    tdd_device *dev;
    size_t n;
    size_t failed; /* the first item whose update failed (worker side) */
    step_item it[];
} step_batch;

/* A batch on a device whose memory the loop cannot touch: the backend's fused step, one
 * call for all of them (poisoned gradients fail their own update, as below). */
static int batch_run_fused(step_batch *b)
{
    tdd_fused_param *ps = calloc(b->n ? b->n : 1, sizeof *ps);
    if (!ps)
        return TD_ERESOURCE_EXHAUSTED;
    int first = 0;
    size_t m = 0;
    for (size_t i = 0; i < b->n; i++) {
        const step_item *it = &b->it[i];
        if (tdd_value_poisoned(it->gv)) {
            if (!first) {
                first = TD_EPOISONED;
                b->failed = i;
            }
            continue;
        }
        tdd_fused_param *q = &ps[m++];
        q->p = &it->pv->t;
        q->g = &it->gv->t;
        for (int k = 0; k < 3; k++)
            q->buf[k] = it->bv[k] ? &it->bv[k]->t : NULL;
        q->step = it->step;
        q->fresh = it->fresh;
    }
    const opt_hyper *h = &b->h;
    tdd_fused_hyper fh = {.kind = h->kind == OPT_SGD    ? 0
                                  : h->kind == OPT_ADAM ? 1
                                                        : 2,
                          .nesterov = h->nesterov,
                          .maximize = h->maximize,
                          .amsgrad = h->amsgrad,
                          .lr = h->lr,
                          .momentum = h->momentum,
                          .dampening = h->dampening,
                          .weight_decay = h->weight_decay,
                          .beta1 = h->beta1,
                          .beta2 = h->beta2,
                          .eps = h->eps};
    int rc = m ? b->dev->be->optim_step(b->dev->ctx, b->dev->ordinal, &fh, ps, m) : 0;
    free(ps);
    if (rc && !first) {
        first = rc;
        b->failed = 0;
    }
    return first;
}

static int batch_run(void *arg)
{
    step_batch *b = arg;
    if (!b->dev->be->host_memory)
        return batch_run_fused(b);
    int first = 0;
    for (size_t i = 0; i < b->n; i++) {
        const step_item *it = &b->it[i];
        /* The values' tensors are fixed at their creation: reading them here is safe. */
        step_job j = {.h = b->h, .step = it->step, .fresh = it->fresh, .s = b->s};
        j.pv = it->pv;
        j.gv = it->gv;
        j.p = it->pv->t;
        j.g = it->gv->t;
        for (int k = 0; k < 3; k++)
            j.bv[k] = it->bv[k];
        if (it->bv[0])
            j.b0 = it->bv[0]->t;
        if (it->bv[1])
            j.b1 = it->bv[1]->t;
        if (it->bv[2])
            j.b2 = it->bv[2]->t;
        int rc = step_run(&j);
        if (rc && !first) {
            first = rc;
            b->failed = i;
        }
    }
    return first;
}

static void batch_done(void *arg, int rc)
{
    step_batch *b = arg;
    tdd_ag_session *ag = b->s->autograd;
    if (rc && ag && !ag->step_failed) {
        const step_item *it = &b->it[b->failed];
        ag->step_failed = true;
        if (rc == TD_EPOISONED)
            tdd_err_poisoned(&ag->step_err, it->gv);
        else
            tdd_err_set(&ag->step_err, rc, "optimizer update of handle %llu failed: %s",
                        (unsigned long long)it->pv->handle, td_strerror(rc));
    }
    for (size_t i = 0; i < b->n; i++) {
        tdd_value_unref(b->it[i].pv);
        tdd_value_unref(b->it[i].gv);
        for (int k = 0; k < 3; k++)
            tdd_value_unref(b->it[i].bv[k]);
    }
    free(b);
}

/* ---------------------------------------------------------------- the update as ops */

/* PyTorch's "foreach" flavour: the same update as a sequence of tensor ops
 * (torch.optim's own formulation, op for op), queued on the parameter's
 * device, for backends whose memory the loop cannot touch. The new value is
 * then copied into the parameter's own storage, in place, as torch.optim and
 * the host loop update it: every view of the parameter (detach(w),
 * unsqueeze(w)) sees the step on every backend. The copy is queued after the
 * ops that read the old values, on the same device queue. */
#define A_F(nm, v) ((td_attr){.name = (nm), .kind = TD_ATTR_FLOAT, .f = (v)})

static tdd_value *sc(tdd_bw *b, tdd_op op, tdd_value *x, double v)
{
    td_attr a = A_F("other", v);
    return x ? tdd_bw_op(b, op, &x, 1, &a, 1, 0, NULL) : NULL;
}

static tdd_value *un(tdd_bw *b, tdd_op op, tdd_value *x)
{
    return x ? tdd_bw_op(b, op, &x, 1, NULL, 0, 0, NULL) : NULL;
}

/* x + alpha * y (add's alpha, as torch's add_(y, alpha=...)) */
static tdd_value *axpy(tdd_bw *b, tdd_value *x, tdd_value *y, double alpha)
{
    tdd_value *in[2] = {x, y};
    td_attr a = A_F("alpha", alpha);
    return x && y ? tdd_bw_op(b, TDD_OP_ADD, in, 2, &a, alpha == 1.0 ? 0 : 1, 0, NULL) : NULL;
}

static tdd_value *mul2(tdd_bw *b, tdd_value *x, tdd_value *y)
{
    tdd_value *in[2] = {x, y};
    return x && y ? tdd_bw_op(b, TDD_OP_MUL, in, 2, NULL, 0, 0, NULL) : NULL;
}

static tdd_value *div2(tdd_bw *b, tdd_value *x, tdd_value *y)
{
    tdd_value *in[2] = {x, y};
    return x && y ? tdd_bw_op(b, TDD_OP_DIV, in, 2, NULL, 0, 0, NULL) : NULL;
}

static tdd_value *max2(tdd_bw *b, tdd_value *x, tdd_value *y)
{
    tdd_value *in[2] = {x, y};
    return x && y ? tdd_bw_op(b, TDD_OP_MAXIMUM, in, 2, NULL, 0, 0, NULL) : NULL;
}

static int step_ops(tdd_bw *b, const opt_hyper *h, opt_param *op, tdd_value *grad, unsigned fresh)
{
    tdd_value *pa = tdd_value_alias(op->p);
    if (!pa)
        return tdd_bw_fail(b, TD_ERESOURCE_EXHAUSTED, "out of host memory");
    tdd_bw_keep(b, pa);
    tdd_value *p = pa, *g = h->maximize ? un(b, TDD_OP_NEG, grad) : grad;
    tdd_value *nb[3] = {NULL, NULL, NULL};
    bool init = fresh & 1u;
    if (h->kind == OPT_RMSPROP) {
        if (h->weight_decay != 0.0)
            g = axpy(b, g, p, h->weight_decay);
        tdd_value *gg = mul2(b, g, g);
        /* Fresh buffers are zeros: 0 * alpha + x is x exactly. */
        nb[0] = init ? sc(b, TDD_OP_MUL, gg, 1.0 - h->alpha)
                     : axpy(b, sc(b, TDD_OP_MUL, op->buf[0], h->alpha), gg, 1.0 - h->alpha);
        tdd_value *avg;
        if (h->centered) {
            nb[2] = (fresh & 4u)
                        ? sc(b, TDD_OP_MUL, g, 1.0 - h->alpha)
                        : axpy(b, sc(b, TDD_OP_MUL, op->buf[2], h->alpha), g, 1.0 - h->alpha);
            avg = un(b, TDD_OP_SQRT, axpy(b, nb[0], mul2(b, nb[2], nb[2]), -1.0));
        } else {
            avg = un(b, TDD_OP_SQRT, nb[0]);
        }
        avg = sc(b, TDD_OP_ADD, avg, h->eps);
        if (h->momentum > 0.0) {
            nb[1] = (fresh & 2u)
                        ? div2(b, g, avg)
                        : axpy(b, sc(b, TDD_OP_MUL, op->buf[1], h->momentum), div2(b, g, avg), 1.0);
            p = axpy(b, p, nb[1], -h->lr);
        } else {
            p = axpy(b, p, div2(b, g, avg), -h->lr);
        }
    } else if (h->kind == OPT_ADAGRAD) {
        if (h->weight_decay != 0.0)
            g = axpy(b, g, p, h->weight_decay);
        tdd_value *gg = mul2(b, g, g);
        nb[0] = !init                ? axpy(b, op->buf[0], gg, 1.0)
                : h->init_acc != 0.0 ? sc(b, TDD_OP_ADD, gg, h->init_acc)
                                     : gg;
        double clr = h->lr / (1.0 + (double)op->step * h->lr_decay); /* step before this one */
        tdd_value *std = sc(b, TDD_OP_ADD, un(b, TDD_OP_SQRT, nb[0]), h->eps);
        p = axpy(b, p, div2(b, g, std), -clr);
    } else if (h->kind == OPT_SGD) {
        if (h->weight_decay != 0.0)
            g = axpy(b, g, p, h->weight_decay);
        if (h->momentum != 0.0) {
            /* torch.clone(grad) on the first step: the buffer must not share the
             * gradient's storage (which may be a view of a parameter updated in place). */
            nb[0] =
                init ? un(b, TDD_OP_CLONE, g)
                     : axpy(b, sc(b, TDD_OP_MUL, op->buf[0], h->momentum), g, 1.0 - h->dampening);
            g = h->nesterov ? axpy(b, g, nb[0], h->momentum) : nb[0];
        }
        p = axpy(b, p, g, -h->lr);
    } else {
        double step = (double)(op->step + 1);
        if (h->kind == OPT_ADAMW)
            p = sc(b, TDD_OP_MUL, p, 1.0 - h->lr * h->weight_decay);
        else if (h->weight_decay != 0.0)
            g = axpy(b, g, p, h->weight_decay);
        tdd_value *gg = mul2(b, g, g);
        /* Fresh moments are zeros: 0 * beta + alpha * x is alpha * x exactly. */
        nb[0] = init ? sc(b, TDD_OP_MUL, g, 1.0 - h->beta1)
                     : axpy(b, sc(b, TDD_OP_MUL, op->buf[0], h->beta1), g, 1.0 - h->beta1);
        nb[1] = (fresh & 2u) ? sc(b, TDD_OP_MUL, gg, 1.0 - h->beta2)
                             : axpy(b, sc(b, TDD_OP_MUL, op->buf[1], h->beta2), gg, 1.0 - h->beta2);
        /* amsgrad: torch.maximum(max_exp_avg_sq, exp_avg_sq); the fresh
         * maximum, max(0, exp_avg_sq), is exp_avg_sq itself. */
        if (h->amsgrad)
            nb[2] = (fresh & 4u) ? nb[1] : max2(b, op->buf[2], nb[1]);
        double bc1 = 1.0 - pow(h->beta1, step), bc2 = 1.0 - pow(h->beta2, step);
        tdd_value *denom = sc(
            b, TDD_OP_ADD,
            sc(b, TDD_OP_DIV, un(b, TDD_OP_SQRT, h->amsgrad ? nb[2] : nb[1]), sqrt(bc2)), h->eps);
        p = axpy(b, p, div2(b, nb[0], denom), -(h->lr / bc1));
    }
    if (b->rc)
        return b->rc;
    if (tdd_submit_assign(b->s, b->req_id, op->p, p, &b->err))
        return b->rc = b->err.code;
    for (int k = 0; k < 3; k++)
        if (nb[k]) {
            /* State buffers are values of their own: take the result itself
             * (amsgrad's first maximum is exp_avg_sq's value too; results
             * are never written in place, so sharing it is safe). */
            tdd_value_ref(nb[k]);
            tdd_value_unref(op->buf[k]);
            op->buf[k] = nb[k];
        }
    return 0;
}

/* ---------------------------------------------------------------- step (loop side) */

static int check_grad(const tdd_value *p, const tdd_value *g, td_error *err)
{
    if (g->dev->be != p->dev->be)
        return tdd_err_devices(err, TD_EBACKEND_MISMATCH, p->dev, g->dev, 0, 0,
                               "gradient of parameter %llu is on %s, the parameter on %s",
                               (unsigned long long)p->handle, g->dev->label, p->dev->label);
    if (g->dev != p->dev)
        return tdd_err_devices(err, TD_EDEVICE_MISMATCH, p->dev, g->dev, 0, 0,
                               "gradient of parameter %llu is on %s, the parameter on %s",
                               (unsigned long long)p->handle, g->dev->label, p->dev->label);
    if (g->t.dtype != p->t.dtype)
        return tdd_err_dtypes(
            err, p->t.dtype, g->t.dtype, "gradient of parameter %llu is %s, the parameter %s",
            (unsigned long long)p->handle, td_dtype_name(g->t.dtype), td_dtype_name(p->t.dtype));
    if (!tdd_same_shape(&g->t, &p->t))
        return tdd_err_shape(err, p->t.shape, p->t.ndim, g->t.shape, g->t.ndim,
                             "gradient of parameter %llu has another shape",
                             (unsigned long long)p->handle);
    if (tdd_value_poisoned(g))
        return tdd_err_poisoned(err, g);
    if (tdd_value_poisoned(p))
        return tdd_err_poisoned(err, p);
    return 0;
}

/* Whether parameter p steps on its device's fused kernel (device memory, a backend that
 * has one for the kind and dtype, dense parameter and gradient). */
static bool fused_for(const opt_hyper *h, const tdd_value *p, const tdd_value *g)
{
    const tdd_backend *be = p->dev->be;
    if (h->foreach || !be->optim_step || !be->optim_fused ||
        (h->kind != OPT_SGD && h->kind != OPT_ADAM && h->kind != OPT_ADAMW))
        return false;
    int kind = h->kind == OPT_SGD ? 0 : h->kind == OPT_ADAM ? 1 : 2;
    return be->optim_fused(p->dev->ctx, p->dev->ordinal, kind, p->t.dtype) &&
           tdd_is_contiguous(&p->t) && (!g || tdd_is_contiguous(&g->t));
}

int tdd_optim_step_run(tdd_session *s, tdd_ag_session *ag, uint64_t req_id, tdd_optim *o,
                       tdd_grads *grads, td_error *err)
{
    int rc = 0;
    /* Everything is checked, and every state buffer allocated, before any
     * update is queued: a failed step changes no parameter. */
    unsigned kept = tdd_optim_kept(&o->h), alloc = kept;
    /* Every parameter steps the same way: as ops when asked, or when one
     * lives where the loop cannot loop over it and its backend has no fused step for it
     * (the fused step takes the host loop's batches, one backend call per device). */
    bool via_ops = o->h.foreach;
    for (size_t i = 0; i < o->n; i++)
        if (!o->ps[i].p->dev->be->host_memory) {
            tdd_grad_entry *e = tdd_grads_find(grads, o->ps[i].p);
            via_ops |= !fused_for(&o->h, o->ps[i].p, e ? e->grad : NULL);
        }
    if (via_ops)
        alloc = 0; /* the ops make their state as results */
    /* Each parameter's gradient is looked up once (a hash lookup is a cache miss or two
     * with 10^5 entries; the passes below used to repeat it). */
    tdd_grad_entry **ge = NULL;
    if (!(ge = calloc(o->n ? o->n : 1, sizeof *ge)))
        rc = tdd_err_set(err, TD_ERESOURCE_EXHAUSTED, "out of host memory");
    for (size_t i = 0; !rc && i < o->n; i++) {
        opt_param *op = &o->ps[i];
        tdd_grad_entry *e = ge[i] = tdd_grads_find(grads, op->p);
        if (!e)
            continue;
        rc = check_grad(op->p, e->grad, err);
        for (int k = 0; !rc && k < 3; k++) {
            if (!(alloc & (1u << k)) || op->buf[k])
                continue;
            if (!(op->buf[k] = tdd_value_alloc(s, op->p->dev, op->p->t.dtype, op->p->t.ndim,
                                               op->p->t.shape, err)))
                rc = err->code;
            else
                op->fresh |= 1u << k;
        }
    }
    if (rc) {
        free(ge);
        return rc;
    }
    size_t queued = 0;
    if (via_ops) {
        tdd_bw b = {.s = s, .req_id = req_id};
        for (size_t i = 0; i < o->n && !b.rc; i++) {
            opt_param *op = &o->ps[i];
            if (!ge[i])
                continue;
            unsigned fresh = op->fresh;
            for (int k = 0; k < 3; k++) {
                if (!(kept & (1u << k))) {
                    /* a buffer the options no longer keep is dropped (torch's SGD sets
                     * its momentum_buffer to None) */
                    tdd_value_unref(op->buf[k]);
                    op->buf[k] = NULL;
                }
                if (!op->buf[k])
                    fresh |= 1u << k;
            }
            if (step_ops(&b, &o->h, op, ge[i]->grad, fresh))
                continue;
            op->fresh = 0;
            op->p->t.st->version++;
            op->step++;
            tdd_bw_release(&b, 0);
        }
        tdd_bw_release(&b, 0);
        free(b.tmp);
        free(ge);
        if (b.rc) {
            /* Parameters before the failing one have stepped (queued ops
             * cannot be taken back); the error says so. */
            *err = b.err;
            return b.rc;
        }
        if (s->inflight == 0)
            return 0; /* an update that ran inline and failed is the session's pending error */
        ag->step_failed = false;
        return 1;
    }
    /* The host loop: one batch of updates per device, made before anything runs (so
     * running out of memory here steps nothing). */
    int ndev = tdd_device_count();
    step_batch **bat = calloc((size_t)ndev, sizeof *bat);
    size_t *cnt = calloc((size_t)ndev, sizeof *cnt);
    int64_t total = 0;
    bool ok = bat && cnt;
    for (size_t i = 0; ok && i < o->n; i++)
        if (ge[i]) {
            cnt[o->ps[i].p->dev->index]++;
            total += tdd_numel(&o->ps[i].p->t);
        }
    for (int d = 0; ok && d < ndev; d++) {
        if (!cnt[d])
            continue;
        if (!(bat[d] = calloc(1, sizeof(step_batch) + cnt[d] * sizeof(step_item)))) {
            ok = false;
            break;
        }
        bat[d]->h = o->h;
        bat[d]->s = s;
        bat[d]->dev = tdd_device_get(d);
    }
    if (!ok) {
        for (int d = 0; bat && d < ndev; d++)
            free(bat[d]);
        free(bat);
        free(cnt);
        free(ge);
        return tdd_err_set(err, TD_ERESOURCE_EXHAUSTED, "out of host memory");
    }
    for (size_t i = 0; i < o->n; i++) {
        if (!ge[i])
            continue; /* no gradient: skipped, as torch.optim skips p.grad None */
        opt_param *op = &o->ps[i];
        step_batch *b = bat[op->p->dev->index];
        step_item *it = &b->it[b->n++];
        it->pi = i;
        it->fresh = op->fresh;
        op->fresh = 0;
        it->step = op->step + 1;
        it->pv = op->p;
        it->gv = ge[i]->grad;
        tdd_value_ref(it->pv);
        tdd_value_ref(it->gv);
        for (int k = 0; k < 3; k++) {
            if (!(kept & (1u << k))) { /* see the ops path */
                tdd_value_unref(op->buf[k]);
                op->buf[k] = NULL;
                continue;
            }
            it->bv[k] = op->buf[k];
            tdd_value_ref(op->buf[k]);
        }
    }
    free(ge);
    free(cnt);
    /* Small updates run here, on the loop, when their device has nothing
     * queued: the session's own work has all run (inflight is 0), and two
     * thread wake-ups per step cost more than a few thousand elements of
     * Adam (the inline op path in exec_op.c makes the same trade). */
    bool small = total <= OPTIM_INLINE_MAX_ELEMS;
    ag->step_failed = false; /* only this step's updates report here */
    for (int d = 0; d < ndev; d++) {
        step_batch *b = bat[d];
        if (!b)
            continue;
        tdd_device *dev = tdd_device_get(d);
        tdd_queue *lane = tdd_device_lane(dev, s->id);
        bool inline_run = small && dev->be->host_memory && tdd_queue_idle(lane);
        uint64_t seq = 0;
        if (!inline_run) {
            seq = tdd_queue_next_seq(lane);
            if (tdd_submit_work(s, dev, batch_run, batch_done, b)) {
                batch_done(b, 0);
                rc = tdd_err_set(err, TD_ERESOURCE_EXHAUSTED, "out of host memory");
                continue;
            }
            queued++;
        }
        /* (b is freed by batch_done, which runs on this thread: after this loop when
         * queued, below when inline.) */
        for (size_t i = 0; i < b->n; i++) {
            tdd_value *p = b->it[i].pv;
            /* Readers on other queues now wait for the update, not the upload. */
            p->fq = inline_run ? NULL : lane;
            p->fseq = seq;
            p->t.st->version++;
            o->ps[b->it[i].pi].step++;
        }
        if (inline_run)
            batch_done(b, batch_run(b)); /* a failure lands in ag->step_failed */
    }
    free(bat);
    if (rc && !queued) {
        ag->step_failed = false;
        return rc;
    }
    if (rc) {
        ag->step_failed = true;
        ag->step_err = *err;
    }
    if (!queued) {
        if (ag->step_failed) { /* an update that ran here failed */
            ag->step_failed = false;
            *err = ag->step_err;
            return err->code;
        }
        return 0;
    }
    return 1;
}
