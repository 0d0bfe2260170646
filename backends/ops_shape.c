/* ops_shape.c -- tdd_op_prepare rules for views (strided, no copy where
 * PyTorch makes a view), copies, joins and indexing ops. */
#include <string.h>

#include "dtype.h"
#include "ops_impl.h"

/* PyTorch's stride computation for a view of t as shape ns: possible when
 * every run of t's dims that is contiguous in memory maps onto a run of new
 * dims. Returns false if a copy is needed. */
static bool view_strides(const tdd_tensor *t, const int64_t *ns, int nn, int64_t *nst)
{
    int64_t numel = tdd_numel(t);
    if (numel == 0 || t->ndim == 0) {
        int64_t s = 1;
        for (int d = nn - 1; d >= 0; d--) {
            nst[d] = s;
            s *= ns[d] ? ns[d] : 1;
        }
        return true;
    }
    int vd = nn - 1;
    int64_t base = t->strides[t->ndim - 1], tn = 1, vn = 1;
    for (int td = t->ndim - 1; td >= 0; td--) {
        tn *= t->shape[td];
        if (td == 0 || (t->shape[td - 1] != 1 && t->strides[td - 1] != tn * base)) {
            while (vd >= 0 && (vn < tn || ns[vd] == 1)) {
                nst[vd] = vn * base;
                vn *= ns[vd];
                vd--;
            }
            if (vn != tn)
                return false;
            if (td > 0) {
                base = t->strides[td - 1];
                tn = vn = 1;
            }
        }
    }
    return vd == -1;
}

/* reshape/view/flatten: a view when strides allow, else (not for view) a copy. */
static int reshape_to(tdd_prep *p, const int64_t *req, int nn, bool must_view)
{
    const tdd_tensor *a = p->in[0];
    int64_t ns[TD_MAX_NDIM], st[TD_MAX_NDIM];
    int infer = -1;
    uint64_t known = 1;
    for (int d = 0; d < nn; d++) {
        ns[d] = req[d];
        if (req[d] == -1) {
            if (infer >= 0)
                return tdd_err_arg(p->err, "shape", "%s: only one dimension can be -1", p->name);
            infer = d;
        } else if (req[d] < 0) {
            return tdd_err_arg(p->err, "shape", "%s: invalid size %lld", p->name,
                               (long long)req[d]);
        } else if (tdd_mul_overflows(known, (uint64_t)req[d], &known)) {
            return tdd_err_arg(p->err, "shape", "%s: shape is too large", p->name);
        }
    }
    uint64_t numel = (uint64_t)tdd_numel(a);
    if (infer >= 0) {
        if (known == 0 || numel % known != 0)
            return tdd_err_shape(p->err, a->shape, a->ndim, req, nn,
                                 "%s: shape is invalid for an input of %llu elements", p->name,
                                 (unsigned long long)numel);
        ns[infer] = (int64_t)(numel / known);
    } else if (known != numel) {
        return tdd_err_shape(p->err, a->shape, a->ndim, req, nn,
                             "%s: shape is invalid for an input of %llu elements", p->name,
                             (unsigned long long)numel);
    }
    if (view_strides(a, ns, nn, st)) {
        tdd_p_view(p, 0, 0, ns, st, nn, a->offset);
        return 0;
    }
    if (must_view)
        return tdd_err_arg(p->err, "shape",
                           "view: the input's strides do not allow this shape; use reshape");
    tdd_p_out(p, 0, a->dtype, ns, nn);
    return 0;
}

static int prep_views(tdd_prep *p)
{
    const tdd_tensor *a = p->in[0];
    int64_t shape[TD_MAX_NDIM], st[TD_MAX_NDIM], v[TD_MAX_NDIM];
    int n, rc, nd = a->ndim;
    memcpy(shape, a->shape, sizeof shape);
    memcpy(st, a->strides, sizeof st);
    switch (p->op) {
    case TDD_OP_TRANSPOSE: {
        int64_t d0, d1;
        int i0, i1;
        if (!tdd_p_get(p, "dim0"))
            return tdd_p_missing(p, "dim0");
        if (!tdd_p_get(p, "dim1"))
            return tdd_p_missing(p, "dim1");
        if ((rc = tdd_p_int(p, "dim0", 0, &d0)) || (rc = tdd_p_int(p, "dim1", 0, &d1)) ||
            (rc = tdd_p_dim(p, "dim0", d0, nd, &i0)) || (rc = tdd_p_dim(p, "dim1", d1, nd, &i1)))
            return rc;
        if (nd > 0) {
            shape[i0] = a->shape[i1];
            shape[i1] = a->shape[i0];
            st[i0] = a->strides[i1];
            st[i1] = a->strides[i0];
        }
        break;
    }
    case TDD_OP_PERMUTE: {
        if ((rc = tdd_p_ints(p, "dims", v, TD_MAX_NDIM, &n)))
            return rc;
        if (n < 0)
            return tdd_p_missing(p, "dims");
        if (n != nd)
            return tdd_err_arg(p->err, "dims", "permute: %d dims given for a %d-D tensor", n, nd);
        uint32_t seen = 0;
        for (int d = 0; d < n; d++) {
            int k;
            if ((rc = tdd_p_dim(p, "dims", v[d], nd, &k)))
                return rc;
            if (seen & (1u << k))
                return tdd_err_arg(p->err, "dims", "permute: dim %d repeats", k);
            seen |= 1u << k;
            shape[d] = a->shape[k];
            st[d] = a->strides[k];
        }
        break;
    }
    case TDD_OP_RESHAPE:
    case TDD_OP_VIEW:
        if ((rc = tdd_p_ints(p, "shape", v, TD_MAX_NDIM, &n)))
            return rc;
        if (n < 0)
            return tdd_p_missing(p, "shape");
        return reshape_to(p, v, n, p->op == TDD_OP_VIEW);
    case TDD_OP_FLATTEN: {
        int64_t s, e;
        int is, ie;
        if ((rc = tdd_p_int(p, "start_dim", 0, &s)) || (rc = tdd_p_int(p, "end_dim", -1, &e)) ||
            (rc = tdd_p_dim(p, "start_dim", s, nd, &is)) ||
            (rc = tdd_p_dim(p, "end_dim", e, nd, &ie)))
            return rc;
        if (nd == 0)
            return reshape_to(p, (int64_t[]){1}, 1, false);
        if (is > ie)
            return tdd_err_arg(p->err, "start_dim", "flatten: start_dim comes after end_dim");
        n = 0;
        for (int d = 0; d < nd; d++) {
            if (d > is && d <= ie)
                v[n - 1] *= a->shape[d];
            else
                v[n++] = a->shape[d];
        }
        return reshape_to(p, v, n, false);
    }
    case TDD_OP_SQUEEZE: {
        uint32_t mask = 0;
        if ((rc = tdd_p_ints(p, "dim", v, TD_MAX_NDIM, &n)))
            return rc;
        if (n < 0) {
            mask = (uint32_t)((1u << nd) - 1u);
        } else {
            for (int k = 0; k < n; k++) {
                int d;
                if ((rc = tdd_p_dim(p, "dim", v[k], nd, &d)))
                    return rc;
                mask |= nd ? 1u << d : 0;
            }
        }
        n = 0;
        for (int d = 0; d < nd; d++) {
            if ((mask & (1u << d)) && a->shape[d] == 1)
                continue; /* squeezing a dim of size != 1 leaves it, as PyTorch */
            shape[n] = a->shape[d];
            st[n++] = a->strides[d];
        }
        nd = n;
        break;
    }
    case TDD_OP_UNSQUEEZE: {
        int64_t dv;
        if (!tdd_p_get(p, "dim"))
            return tdd_p_missing(p, "dim");
        if ((rc = tdd_p_int(p, "dim", 0, &dv)))
            return rc;
        if (nd >= TD_MAX_NDIM)
            return tdd_err_arg(p->err, "dim", "unsqueeze: tensor already has %d dims", nd);
        if (dv < -(nd + 1) || dv > nd)
            return tdd_err_arg(p->err, "dim", "unsqueeze: dim %lld out of range for %d-D",
                               (long long)dv, nd);
        int d = (int)(dv < 0 ? dv + nd + 1 : dv);
        for (int k = nd; k > d; k--) {
            shape[k] = shape[k - 1];
            st[k] = st[k - 1];
        }
        shape[d] = 1;
        st[d] = d < nd ? a->strides[d] * a->shape[d] : 1;
        nd++;
        break;
    }
    case TDD_OP_EXPAND: {
        if ((rc = tdd_p_ints(p, "shape", v, TD_MAX_NDIM, &n)))
            return rc;
        if (n < 0)
            return tdd_p_missing(p, "shape");
        if (n < nd)
            return tdd_err_shape(p->err, a->shape, nd, v, n,
                                 "expand: %d sizes given for a %d-D tensor", n, nd);
        for (int d = 0; d < n; d++) {
            int ad = d - (n - nd);
            if (ad < 0) {
                if (v[d] < 0)
                    return tdd_err_arg(p->err, "shape", "expand: new dim %d needs a size", d);
                shape[d] = v[d];
                st[d] = 0;
            } else if (v[d] == -1 || v[d] == a->shape[ad]) {
                shape[d] = a->shape[ad];
                st[d] = a->strides[ad];
            } else if (a->shape[ad] == 1 && v[d] >= 0) {
                shape[d] = v[d];
                st[d] = 0;
            } else {
                return tdd_err_shape(p->err, a->shape, nd, v, n,
                                     "expand: dim %d of size %lld cannot become %lld", ad,
                                     (long long)a->shape[ad], (long long)v[d]);
            }
        }
        nd = n;
        break;
    }
    case TDD_OP_SLICE: {
        int64_t dv, start, stop, step;
        int d;
        if ((rc = tdd_p_int(p, "dim", 0, &dv)) || (rc = tdd_p_int(p, "start", 0, &start)) ||
            (rc = tdd_p_int(p, "stop", INT64_MAX, &stop)) || (rc = tdd_p_int(p, "step", 1, &step)))
            return rc;
        if (nd == 0)
            return tdd_err_arg(p->err, "dim", "slice: cannot slice a 0-dim tensor");
        if ((rc = tdd_p_dim(p, "dim", dv, nd, &d)))
            return rc;
        if (step <= 0)
            return tdd_err_arg(p->err, "step", "slice: step must be positive");
        int64_t size = a->shape[d];
        /* Python slice clamping */
        if (start < 0)
            start = start < -size ? 0 : start + size;
        if (stop < 0)
            stop = stop < -size ? 0 : stop + size;
        if (start > size)
            start = size;
        if (stop > size)
            stop = size;
        int64_t len = stop > start ? (stop - start - 1) / step + 1 : 0;
        shape[d] = len;
        st[d] = a->strides[d] * step;
        tdd_p_view(p, 0, 0, shape, st, nd, a->offset + (len ? start * a->strides[d] : 0));
        return 0;
    }
    case TDD_OP_DETACH:
        break; /* the same bytes, seen outside the graph (autograd records nothing) */
    case TDD_OP_CONTIGUOUS:
        if (tdd_is_contiguous(a))
            break;
        tdd_p_out(p, 0, a->dtype, a->shape, nd);
        return 0;
    case TDD_OP_SPLIT:
    case TDD_OP_CHUNK: {
        int64_t dv, sizes[TDD_MAX_OP_OUTPUTS];
        int d, k = 0;
        if ((rc = tdd_p_int(p, "dim", 0, &dv)))
            return rc;
        if (nd == 0)
            return tdd_err_arg(p->err, "dim", "%s: cannot split a 0-dim tensor", p->name);
        if ((rc = tdd_p_dim(p, "dim", dv, nd, &d)))
            return rc;
        int64_t size = a->shape[d], each;
        if (p->op == TDD_OP_CHUNK) {
            int64_t chunks;
            if (!tdd_p_get(p, "chunks"))
                return tdd_p_missing(p, "chunks");
            if ((rc = tdd_p_int(p, "chunks", 1, &chunks)))
                return rc;
            if (chunks <= 0)
                return tdd_err_arg(p->err, "chunks", "chunk: chunks must be positive");
            each = size / chunks + (size % chunks != 0);
        } else {
            const char *nm = tdd_p_get(p, "split_sizes") ? "split_sizes" : "split_size";
            const td_attr *at = tdd_p_get(p, nm);
            if (!at)
                return tdd_p_missing(p, "split_size");
            if (at->kind == TD_ATTR_INTS) {
                if ((rc = tdd_p_ints(p, nm, sizes, TDD_MAX_OP_OUTPUTS, &k)))
                    return rc;
                int64_t tot = 0;
                for (int i = 0; i < k; i++) {
                    if (sizes[i] < 0 || sizes[i] > size - tot)
                        return tdd_err_arg(p->err, nm, "split: sizes must be >= 0 and sum to %lld",
                                           (long long)size);
                    tot += sizes[i];
                }
                if (tot != size || k == 0)
                    return tdd_err_arg(p->err, nm, "split: sizes must sum to %lld",
                                       (long long)size);
                each = 0;
            } else if ((rc = tdd_p_int(p, nm, 1, &each))) {
                return rc;
            } else if (each < 0 || (each == 0 && size != 0)) {
                return tdd_err_arg(p->err, nm, "split: split_size must be positive");
            }
        }
        if (k == 0) { /* equal pieces of `each`, the last one shorter */
            int64_t pieces = each ? size / each + (size % each != 0) : 1;
            if (pieces == 0)
                pieces = 1;
            if (pieces > TDD_MAX_OP_OUTPUTS)
                return tdd_err_arg(p->err, p->op == TDD_OP_CHUNK ? "chunks" : "split_size",
                                   "%s: %lld pieces, at most %d outputs", p->name,
                                   (long long)pieces, TDD_MAX_OP_OUTPUTS);
            for (int64_t i = 0; i < pieces; i++)
                sizes[k++] = size - i * each < each ? size - i * each : each;
        }
        int64_t pos = 0;
        for (int i = 0; i < k; i++) {
            shape[d] = sizes[i];
            tdd_p_view(p, i, 0, shape, st, nd, a->offset + (sizes[i] ? pos * st[d] : 0));
            pos += sizes[i];
        }
        p->args->i[0] = d;
        return 0;
    }
    default:
        return tdd_err_set(p->err, TD_EINTERNAL, "%s: not a view op", p->name);
    }
    tdd_p_view(p, 0, 0, shape, st, nd, a->offset);
    return 0;
}

static int need_index(tdd_prep *p, const tdd_tensor *t, bool allow_i32)
{
    if (t->dtype == TD_I64 || (allow_i32 && t->dtype == TD_I32))
        return 0;
    return tdd_err_dtypes(p->err, TD_I64, t->dtype, "%s: indices must be int64, got %s", p->name,
                          td_dtype_name(t->dtype));
}

static int prep_index(tdd_prep *p)
{
    tdd_opargs *g = p->args;
    const tdd_tensor *a = p->in[0];
    int64_t shape[TD_MAX_NDIM], dv;
    int nd = a->ndim, rc, d;
    memcpy(shape, a->shape, sizeof shape);
    g->dtype = a->dtype;
    switch (p->op) {
    case TDD_OP_CLONE:
        break;
    case TDD_OP_CAST: {
        td_dtype dt;
        if ((rc = tdd_p_dtype(p, TD_DTYPE_INVALID, &dt)))
            return rc;
        if (dt == TD_DTYPE_INVALID)
            return tdd_p_missing(p, "dtype");
        g->dtype = dt;
        break;
    }
    case TDD_OP_CAT:
    case TDD_OP_STACK: {
        bool stack = p->op == TDD_OP_STACK;
        if ((rc = tdd_p_int(p, "dim", 0, &dv)))
            return rc;
        if (!stack && nd == 0)
            return tdd_err_arg(p->err, "input", "cat: 0-dim tensors cannot be concatenated");
        if (stack && nd >= TD_MAX_NDIM)
            return tdd_err_arg(p->err, "input", "stack: inputs already have %d dims", nd);
        if ((rc = tdd_p_dim(p, "dim", dv, stack ? nd + 1 : nd, &d)))
            return rc;
        td_dtype dt = a->dtype;
        int64_t total = 0;
        for (int k = 0; k < p->n_in; k++) {
            const tdd_tensor *t = p->in[k];
            bool ok = t->ndim == nd;
            for (int j = 0; ok && j < nd; j++)
                ok = t->shape[j] == a->shape[j] || (!stack && j == d);
            if (!ok)
                return tdd_err_shape(p->err, a->shape, nd, t->shape, t->ndim,
                                     "%s: input %d's shape differs from input 0's", p->name, k);
            if (!stack)
                total += t->shape[d];
            dt = tdd_promote(dt, t->dtype);
        }
        if (stack) {
            for (int j = nd; j > d; j--)
                shape[j] = shape[j - 1];
            shape[d] = p->n_in;
            nd++;
        } else {
            shape[d] = total;
        }
        g->dtype = dt;
        g->i[0] = d;
        break;
    }
    case TDD_OP_GATHER:
    case TDD_OP_SCATTER_ADD: {
        const tdd_tensor *ix = p->in[1];
        const tdd_tensor *src = p->op == TDD_OP_SCATTER_ADD ? p->in[2] : NULL;
        if (!tdd_p_get(p, "dim"))
            return tdd_p_missing(p, "dim");
        if ((rc = tdd_p_int(p, "dim", 0, &dv)) || (rc = tdd_p_dim(p, "dim", dv, nd, &d)) ||
            (rc = need_index(p, ix, false)))
            return rc;
        /* PyTorch: a 0-d input takes a 0-d or 1-D index (every entry 0) */
        bool scalar_in = nd == 0 && ix->ndim <= 1 && (!src || src->ndim == ix->ndim);
        if (!scalar_in && (ix->ndim != nd || (src && src->ndim != nd)))
            return tdd_err_shape(p->err, a->shape, nd, ix->shape, ix->ndim,
                                 "%s: index must have as many dims as the input", p->name);
        for (int j = 0; j < nd; j++) {
            if ((j != d && ix->shape[j] > a->shape[j]) || (src && ix->shape[j] > src->shape[j]))
                return tdd_err_shape(p->err, a->shape, nd, ix->shape, nd,
                                     "%s: index is larger than the input at dim %d", p->name, j);
        }
        if (src && src->dtype != a->dtype)
            return tdd_err_dtypes(p->err, a->dtype, src->dtype,
                                  "scatter_add: src dtype differs from the input's");
        if (!src) {
            memcpy(shape, ix->shape, sizeof shape);
            nd = ix->ndim;
        }
        g->i[0] = d;
        break;
    }
    case TDD_OP_SORT:
    case TDD_OP_ARGSORT:
    case TDD_OP_TOPK: {
        bool desc, unused;
        bool topk = p->op == TDD_OP_TOPK;
        if ((rc = tdd_p_int(p, "dim", -1, &dv)) || (rc = tdd_p_dim(p, "dim", dv, nd, &d)) ||
            (rc = tdd_p_bool(p, topk ? "largest" : "descending", topk, &desc)) ||
            (rc = tdd_p_bool(p, topk ? "sorted" : "stable", true, &unused)))
            return rc;
        int64_t L = nd ? a->shape[d] : 1, k = L;
        if (topk) {
            if (!tdd_p_get(p, "k"))
                return tdd_p_missing(p, "k");
            if ((rc = tdd_p_int(p, "k", 0, &k)))
                return rc;
            if (k < 0 || k > L)
                return tdd_err_arg(p->err, "k", "topk: k = %lld is out of range for a dim of %lld",
                                   (long long)k, (long long)L);
            if (nd)
                shape[d] = k;
        }
        g->i[0] = d;
        g->i[1] = desc;
        g->i[2] = k;
        if (p->op == TDD_OP_ARGSORT) {
            g->dtype = TD_I64;
        } else {
            tdd_p_out(p, 1, TD_I64, shape, nd);
        }
        break;
    }
    case TDD_OP_INDEX_SELECT: {
        const tdd_tensor *ix = p->in[1];
        if (!tdd_p_get(p, "dim"))
            return tdd_p_missing(p, "dim");
        if ((rc = tdd_p_int(p, "dim", 0, &dv)) || (rc = tdd_p_dim(p, "dim", dv, nd, &d)) ||
            (rc = need_index(p, ix, true)))
            return rc;
        if (ix->ndim > 1)
            return tdd_err_arg(p->err, "index", "index_select: index must be 1-D");
        if (nd > 0)
            shape[d] = tdd_numel(ix);
        g->i[0] = d;
        break;
    }
    case TDD_OP_ONE_HOT: {
        int64_t c;
        if ((rc = need_index(p, a, false)))
            return rc;
        if (!tdd_p_get(p, "num_classes"))
            return tdd_p_missing(p, "num_classes");
        if ((rc = tdd_p_int(p, "num_classes", 0, &c)))
            return rc;
        if (c <= 0)
            return tdd_err_arg(p->err, "num_classes", "one_hot: num_classes must be positive");
        if (nd >= TD_MAX_NDIM)
            return tdd_err_arg(p->err, "input", "one_hot: input has too many dims");
        shape[nd++] = c;
        g->i[0] = c;
        g->dtype = TD_I64;
        break;
    }
    case TDD_OP_EMBEDDING: {
        const tdd_tensor *w = p->in[1];
        if ((rc = need_index(p, a, true)))
            return rc;
        if (w->ndim != 2)
            return tdd_err_arg(p->err, "weight", "embedding: weight must be 2-D, got %d-D",
                               w->ndim);
        if (nd >= TD_MAX_NDIM)
            return tdd_err_arg(p->err, "input", "embedding: indices have too many dims");
        shape[nd++] = w->shape[1];
        g->dtype = w->dtype;
        break;
    }
    case TDD_OP_TRIL:
    case TDD_OP_TRIU:
        if (nd < 2)
            return tdd_err_arg(p->err, "input", "%s: input must be at least 2-D", p->name);
        if ((rc = tdd_p_int(p, "diagonal", 0, &g->i[0])))
            return rc;
        break;
    case TDD_OP_PAD: {
        int64_t pads[2 * TD_MAX_NDIM];
        int n;
        const char *mode;
        if ((rc = tdd_p_ints(p, "pad", pads, 2 * TD_MAX_NDIM, &n)) ||
            (rc = tdd_p_str(p, "mode", "constant", &mode)) ||
            (rc = tdd_p_float(p, "value", 0.0, &g->f[0])) ||
            (rc = tdd_p_fits(p, tdd_p_get(p, "value"), g->dtype)))
            return rc;
        if (n < 0)
            return tdd_p_missing(p, "pad");
        static const char *const modes[] = {"constant", "reflect", "replicate", "circular"};
        int m = 0;
        while (m < 4 && strcmp(mode, modes[m]) != 0)
            m++;
        if (m == 4)
            return tdd_err_arg(p->err, "mode",
                               "pad: mode must be constant, reflect, replicate or circular, got "
                               "\"%.32s\"",
                               mode);
        if (n % 2 || n / 2 > nd)
            return tdd_err_arg(p->err, "pad", "pad: needs pairs for at most %d dims", nd);
        g->i[0] = m;
        if (m) { /* PyTorch's rules for the modes that read the input */
            int k = n / 2;
            if (tdd_p_get(p, "value"))
                return tdd_err_arg(p->err, "value", "pad: mode %s takes no value", mode);
            if (k < 1 || k > 3 || nd < k + (m == 3 ? 2 : 1) || nd > k + 2)
                return tdd_err_arg(p->err, "pad",
                                   "pad: mode %s pads the last 1 to 3 dims of a %sbatched input: "
                                   "%d pair(s) need a %d-D%s input, got %d-D",
                                   mode, m == 3 ? "" : "(or un)", k, k + 2,
                                   m == 3 ? "" : " (or one less)", nd);
            for (int e = 0; e < nd; e++) {
                g->ints[1][e] = 0;
                g->ints[2][e] = a->shape[e];
            }
            for (int j = 0; j < k; j++) {
                int64_t len = a->shape[nd - 1 - j], lo = pads[2 * j], hi = pads[2 * j + 1];
                int64_t s = lo < 0 ? -lo : 0, kept = len - s - (hi < 0 ? -hi : 0);
                g->ints[1][nd - 1 - j] = s;
                g->ints[2][nd - 1 - j] = kept;
                if (len == 0 || (m == 1 && (lo >= len || hi >= len)) ||
                    (m == 3 && (lo > kept || hi > kept || kept <= 0)))
                    return tdd_err_arg(p->err, "pad",
                                       "pad: mode %s needs dim %d (size %lld) larger than its "
                                       "padding (%lld, %lld)%s",
                                       mode, nd - 1 - j, (long long)len, (long long)lo,
                                       (long long)hi, m == 3 ? " or as large, after a crop" : "");
            }
        }
        for (int k = 0; k < n / 2; k++) {
            int dd = nd - 1 - k;
            int64_t lo = pads[2 * k], hi = pads[2 * k + 1];
            if (lo < -a->shape[dd] || hi < -a->shape[dd] || lo > INT32_MAX || hi > INT32_MAX ||
                a->shape[dd] + lo + hi < 0)
                return tdd_err_arg(p->err, "pad", "pad: dim %d would get a negative size", dd);
            shape[dd] = a->shape[dd] + lo + hi;
            g->ints[0][dd] = lo;
        }
        break;
    }
    default:
        return tdd_err_set(p->err, TD_EINTERNAL, "%s: not an indexing op", p->name);
    }
    g->cdtype = g->dtype;
    tdd_p_out(p, 0, g->dtype, shape, nd);
    return 0;
}

int tdd_prep_shape(tdd_prep *p)
{
    if (tdd_opdefs[p->op].kind == TDD_KIND_VIEW)
        return prep_views(p);
    return prep_index(p);
}
