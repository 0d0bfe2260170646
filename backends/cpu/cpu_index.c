/* cpu_index.c -- joins and masks that move elements without arithmetic: cat,
 * stack, tril, triu, pad (any dtype: elements move as raw bytes of the dtype's
 * size, contiguous runs by memcpy), and dropout (float dtypes, the reference's
 * counter-based draws, so the same seed gives the same tensor bit for bit).
 * tdd_cpu_native (cpu.c) sends a call here only when every input has the output's
 * dtype (cat/stack promote otherwise: the reference converts) and, for the
 * row-based kernels, the output is C-contiguous. */
#include <stdlib.h>
#include <string.h>

#include "cpu.h"
#include "dtype.h"

/* ---------------------------------------------------------------- element moves */

/* n elements of esz bytes from a (stride sa) to y (stride sy), strides in elements. */
static void move_n(char *y, int64_t sy, const char *a, int64_t sa, int64_t n, size_t esz)
{
    if (sy == 1 && sa == 1) {
        memcpy(y, a, (size_t)n * esz);
        return;
    }
    switch (esz) {
    case 1:
        for (int64_t i = 0; i < n; i++)
            y[i * sy] = a[i * sa];
        return;
    case 2: {
        uint16_t *yy = (uint16_t *)(void *)y;
        const uint16_t *aa = (const uint16_t *)(const void *)a;
        for (int64_t i = 0; i < n; i++)
            yy[i * sy] = aa[i * sa];
        return;
    }
    case 4: {
        uint32_t *yy = (uint32_t *)(void *)y;
        const uint32_t *aa = (const uint32_t *)(const void *)a;
        for (int64_t i = 0; i < n; i++)
            yy[i * sy] = aa[i * sa];
        return;
    }
    case 8: {
        uint64_t *yy = (uint64_t *)(void *)y;
        const uint64_t *aa = (const uint64_t *)(const void *)a;
        for (int64_t i = 0; i < n; i++)
            yy[i * sy] = aa[i * sa];
        return;
    }
    default:
        for (int64_t i = 0; i < n; i++)
            memcpy(y + (size_t)(i * sy) * esz, a + (size_t)(i * sa) * esz, esz);
        return;
    }
}

/* n contiguous elements of esz bytes, each the bytes at pat. */
static void fill_n(char *y, int64_t n, const unsigned char *pat, size_t esz)
{
    bool zero = true;
    for (size_t b = 0; b < esz; b++)
        zero = zero && pat[b] == 0;
    if (zero || esz == 1) {
        memset(y, pat[0], (size_t)n * esz);
        return;
    }
    switch (esz) {
    case 2: {
        uint16_t v, *yy = (uint16_t *)(void *)y;
        memcpy(&v, pat, sizeof v);
        for (int64_t i = 0; i < n; i++)
            yy[i] = v;
        return;
    }
    case 4: {
        uint32_t v, *yy = (uint32_t *)(void *)y;
        memcpy(&v, pat, sizeof v);
        for (int64_t i = 0; i < n; i++)
            yy[i] = v;
        return;
    }
    case 8: {
        uint64_t v, *yy = (uint64_t *)(void *)y;
        memcpy(&v, pat, sizeof v);
        for (int64_t i = 0; i < n; i++)
            yy[i] = v;
        return;
    }
    default:
        for (int64_t i = 0; i < n; i++)
            memcpy(y + (size_t)i * esz, pat, esz);
        return;
    }
}

/* Threads for a kernel over n elements: one below CPU_PAR_MIN (waking the team costs
 * more), at most one per unit of parallel work. */
static int threads_for(int nt, int64_t n, int64_t units)
{
    if (nt <= 1 || n < CPU_PAR_MIN || units <= 1)
        return 1;
    return units < nt ? (int)units : nt;
}

/* ---------------------------------------------------------------- cat, stack */

typedef struct {
    char *y;
    const char *a;
    size_t esz;
} mv_ctx;

static void mv_run(void *vc, int64_t n, const int64_t *off, const int64_t *st)
{
    const mv_ctx *m = vc;
    move_n(m->y + (size_t)off[0] * m->esz, st[0], m->a + (size_t)off[1] * m->esz, st[1], n, m->esz);
}

/* Input k lands in a slab of the output: the output seen with input k's shape, its
 * strides (stack: without the new dim) and an offset to the slab. One iteration per
 * input over (slab, input); the inputs' elements, end to end, are split evenly
 * between the threads, so a thread copies whole runs of one or a few inputs. */
typedef struct {
    const tdd_opcall *c;
    const tdd_iter *its;
    const int64_t *start;
    int64_t total;
    mv_ctx m;
} join_job;

static void join_part(void *arg, int t, int use)
{
    const join_job *j = arg;
    const tdd_opcall *c = j->c;
    const int64_t *start = j->start;
    mv_ctx m = j->m;
    int64_t lo, hi;
    cpu_split(j->total, t, use, &lo, &hi);
    for (int k = 0; k < c->n_in && lo < hi; k++) {
        int64_t a0 = lo > start[k] ? lo : start[k];
        int64_t a1 = hi < start[k + 1] ? hi : start[k + 1];
        if (a0 >= a1)
            continue;
        m.a = c->in[k]->st->data;
        tdd_iter_range(&j->its[k], a0 - start[k], a1 - start[k], mv_run, &m);
    }
}

static int cpu_join(const tdd_opcall *c, int nt)
{
    tdd_tensor *y = c->out[0];
    int d = (int)c->args->i[0];
    bool stack = c->op == TDD_OP_STACK;
    size_t esz = td_dtype_size(y->dtype);
    tdd_iter its[TDD_MAX_OP_INPUTS];
    int64_t start[TDD_MAX_OP_INPUTS + 1];
    int64_t pos = 0;
    start[0] = 0;
    for (int k = 0; k < c->n_in; k++) {
        const tdd_tensor *a = c->in[k];
        tdd_tensor slab = *a;
        slab.st = y->st;
        if (stack) {
            for (int j = 0; j < a->ndim; j++)
                slab.strides[j] = y->strides[j < d ? j : j + 1];
            slab.offset = y->offset + k * y->strides[d];
        } else {
            memcpy(slab.strides, y->strides, sizeof slab.strides);
            slab.offset = y->offset + pos * y->strides[d];
            pos += a->shape[d];
        }
        const tdd_tensor *ops[2] = {&slab, a};
        tdd_iter_tensors(&its[k], a->shape, a->ndim, 2, ops);
        start[k + 1] = start[k] + its[k].numel;
    }
    int64_t total = start[c->n_in];
    join_job j = {c, its, start, total, {y->st->data, NULL, esz}};
    cpu_parallel(threads_for(nt, total, total), join_part, &j);
    return 0;
}

/* ---------------------------------------------------------------- row walks */

/* Rows (last dim) [r0, r1) of a C-contiguous shape, keeping the multi-index of the
 * row's leading dims idx[0..nd-1) and the input offset that index maps to. */
typedef struct {
    int nd;               /* dims of the shape (>= 1) */
    const int64_t *shape; /* the output's shape */
    int64_t idx[TD_MAX_NDIM];
} row_walk;

static void row_seek(row_walk *w, int64_t r)
{
    for (int k = w->nd - 2; k >= 0; k--) {
        w->idx[k] = w->shape[k] ? r % w->shape[k] : 0;
        r = w->shape[k] ? r / w->shape[k] : 0;
    }
}

static void row_next(row_walk *w)
{
    for (int k = w->nd - 2; k >= 0; k--) {
        if (++w->idx[k] < w->shape[k])
            return;
        w->idx[k] = 0;
    }
}

typedef struct {
    const tdd_tensor *a, *y;
    int nd;
    int64_t C, rows, diag;
    bool lower;
    size_t esz;
    char *yd;
    const char *ad;
    int64_t as;
} tri_job;

static void tri_part(void *arg, int t, int use)
{
    const tri_job *j = arg;
    const tdd_tensor *a = j->a;
    int nd = j->nd;
    int64_t C = j->C, diag = j->diag, as = j->as;
    bool lower = j->lower;
    size_t esz = j->esz;
    char *yd = j->yd;
    const char *ad = j->ad;
    int64_t r0, r1;
    cpu_split(j->rows, t, use, &r0, &r1);
    row_walk w = {.nd = nd, .shape = j->y->shape};
    row_seek(&w, r0);
    for (int64_t r = r0; r < r1; r++, row_next(&w)) {
        int64_t i = w.idx[nd - 2], ao = a->offset;
        for (int k = 0; k < nd - 1; k++)
            ao += w.idx[k] * a->strides[k];
        /* kept columns: [0, e) for tril, [e, C) for triu, clamped to [0, C]; the
         * client's diagonal may be anything, so the sum saturates (i, 1 and C are
         * small: past either edge is all that matters) */
        int64_t e;
        if (__builtin_add_overflow(i + (lower ? 1 : 0), diag, &e))
            e = diag < 0 ? 0 : C;
        e = e < 0 ? 0 : e > C ? C : e;
        int64_t k0 = lower ? 0 : e, k1 = lower ? e : C;
        char *yr = yd + (size_t)(r * C) * esz;
        memset(yr, 0, (size_t)k0 * esz);
        move_n(yr + (size_t)k0 * esz, 1, ad + (size_t)(ao + k0 * as) * esz, as, k1 - k0, esz);
        memset(yr + (size_t)k1 * esz, 0, (size_t)(C - k1) * esz);
    }
}

/* tril/triu: row i of each matrix keeps columns j with j - i <= diag (tril) or
 * >= diag (triu); the rest are zero (all-zero bytes in every dtype). */
static int cpu_tri(const tdd_opcall *c, int nt)
{
    const tdd_tensor *a = c->in[0];
    tdd_tensor *y = c->out[0];
    int nd = y->ndim;
    int64_t C = y->shape[nd - 1], n = tdd_numel(y);
    if (n == 0)
        return 0;
    int64_t rows = n / C, diag = c->args->i[0];
    bool lower = c->op == TDD_OP_TRIL;
    size_t esz = td_dtype_size(y->dtype);
    char *yd = (char *)y->st->data + (size_t)y->offset * esz;
    const char *ad = a->st->data;
    int64_t as = a->strides[nd - 1];
    tri_job j = {a, y, nd, C, rows, diag, lower, esz, yd, ad, as};
    cpu_parallel(threads_for(nt, n, rows), tri_part, &j);
    return 0;
}

typedef struct {
    const tdd_tensor *a, *y;
    int nd;
    const int64_t *before;
    int64_t C, rows, as, lo, c0, c1;
    size_t esz;
    const unsigned char *pat;
    char *yd;
    const char *ad;
} pad_job;

static void pad_part(void *arg, int t, int use)
{
    const pad_job *jb = arg;
    const tdd_tensor *a = jb->a;
    int nd = jb->nd;
    const int64_t *before = jb->before;
    int64_t C = jb->C, as = jb->as, lo = jb->lo, c0 = jb->c0, c1 = jb->c1;
    size_t esz = jb->esz;
    const unsigned char *pat = jb->pat;
    char *yd = jb->yd;
    const char *ad = jb->ad;
    int64_t r0, r1;
    cpu_split(jb->rows, t, use, &r0, &r1);
    row_walk w = {.nd = nd, .shape = jb->y->shape};
    row_seek(&w, r0);
    for (int64_t r = r0; r < r1; r++, row_next(&w)) {
        char *yr = yd + (size_t)(r * C) * esz;
        bool inside = c1 > c0;
        int64_t ao = a->offset;
        for (int k = 0; k < nd - 1 && inside; k++) {
            int64_t j = w.idx[k] - before[k];
            inside = j >= 0 && j < a->shape[k];
            ao += j * a->strides[k];
        }
        if (!inside) {
            fill_n(yr, C, pat, esz);
            continue;
        }
        fill_n(yr, c0, pat, esz);
        move_n(yr + (size_t)c0 * esz, 1, ad + (size_t)(ao + (c0 - lo) * as) * esz, as, c1 - c0,
               esz);
        fill_n(yr + (size_t)c1 * esz, C - c1, pat, esz);
    }
}

/* pad (constant mode): output element idx reads input idx - before (per dim) when
 * that is inside the input, else the value (stored as the reference stores it).
 * Negative padding crops. Rows of the output: the leading dims decide whether the
 * row is inside; the inside part of an inside row is one (strided) run. */
static int cpu_pad(const tdd_opcall *c, int nt)
{
    const tdd_opargs *g = c->args;
    const tdd_tensor *a = c->in[0];
    tdd_tensor *y = c->out[0];
    int64_t n = tdd_numel(y);
    if (n == 0)
        return 0;
    size_t esz = td_dtype_size(y->dtype);
    unsigned char pat[8] = {0};
    tdd_store_f(pat, y->dtype, 0, g->f[0]);
    char *yd = (char *)y->st->data + (size_t)y->offset * esz;
    const char *ad = a->st->data;
    if (y->ndim == 0) { /* nothing to pad: one element */
        move_n(yd, 1, ad + (size_t)a->offset * esz, 1, 1, esz);
        return 0;
    }
    int nd = y->ndim;
    const int64_t *before = g->ints[0];
    int64_t C = y->shape[nd - 1], rows = n / C;
    int64_t as = a->strides[nd - 1], ain = a->shape[nd - 1], lo = before[nd - 1];
    /* columns [c0, c1) of a row are inside: input column j - lo */
    int64_t c0 = lo > 0 ? lo : 0, c1 = lo + ain < C ? lo + ain : C;
    if (c1 < c0)
        c1 = c0;
    pad_job j = {a, y, nd, before, C, rows, as, lo, c0, c1, esz, pat, yd, ad};
    cpu_parallel(threads_for(nt, n, rows), pad_part, &j);
    return 0;
}

/* ---------------------------------------------------------------- dropout */

/* The reference's formula and draws, element i of the C-order output drawing
 * tdd_rng_uniform(seed, i): kept values are divided by 1 - p in double and rounded
 * once to the dtype, so cpu and ref agree bit for bit. */
typedef struct {
    char *y;
    const char *x;
    td_dtype dt;
    int64_t y0; /* the output's offset: element i is at y0 + i (contiguous) */
    double p, scale;
    uint64_t seed;
    bool train;
} dr_ctx;

static inline double dropout1(const dr_ctx *q, double v, int64_t i)
{
    if (!q->train)
        return v;
    return (q->p < 1.0 && tdd_rng_uniform(q->seed, (uint64_t)i) >= q->p) ? v / q->scale : 0.0;
}

static void dropout_run(void *vc, int64_t n, const int64_t *off, const int64_t *st)
{
    const dr_ctx *q = vc;
    int64_t i0 = off[0] - q->y0;
    switch (q->dt) {
    case TD_F32: {
        float *y = (float *)(void *)q->y + off[0];
        const float *x = (const float *)(const void *)q->x + off[1];
        for (int64_t i = 0; i < n; i++)
            y[i * st[0]] = (float)dropout1(q, (double)x[i * st[1]], i0 + i * st[0]);
        return;
    }
    case TD_F64: {
        double *y = (double *)(void *)q->y + off[0];
        const double *x = (const double *)(const void *)q->x + off[1];
        for (int64_t i = 0; i < n; i++)
            y[i * st[0]] = dropout1(q, x[i * st[1]], i0 + i * st[0]);
        return;
    }
    case TD_F16:
    case TD_BF16:
    case TD_I32:
    case TD_I64:
    case TD_BOOL:
    case TD_U8: /* the small integers run on ref (tdd_cpu_native) */
    case TD_I8:
    case TD_I16:
    case TD_DTYPE_INVALID:
    case TD_DTYPE_COUNT:
        break;
    }
    /* 16-bit floats: dtype.h's conversions, exactly the reference's */
    for (int64_t i = 0; i < n; i++)
        tdd_store_f(q->y, q->dt, off[0] + i * st[0],
                    dropout1(q, tdd_load_f(q->x, q->dt, off[1] + i * st[1]), i0 + i * st[0]));
}

static int cpu_dropout(const tdd_opcall *c, int nt)
{
    const tdd_opargs *g = c->args;
    const tdd_tensor *x = c->in[0];
    tdd_tensor *y = c->out[0];
    dr_ctx q = {.y = y->st->data,
                .x = x->st->data,
                .dt = y->dtype,
                .y0 = y->offset,
                .p = g->f[0],
                .scale = 1.0 - g->f[0],
                .seed = g->seed,
                .train = g->i[0] != 0};
    const tdd_tensor *ops[2] = {y, x};
    tdd_iter it;
    tdd_iter_tensors(&it, y->shape, y->ndim, 2, ops);
    /* a draw costs about what a few elements of a copy do */
    cpu_par_iter_n(&it, dropout_run, &q, nt, q.train ? 8 * it.numel : it.numel);
    return 0;
}

int cpu_index(const tdd_opcall *c, int nt)
{
    switch (c->op) {
    case TDD_OP_CAT:
    case TDD_OP_STACK:
        return cpu_join(c, nt);
    case TDD_OP_TRIL:
    case TDD_OP_TRIU:
        return cpu_tri(c, nt);
    case TDD_OP_PAD:
        return cpu_pad(c, nt);
    case TDD_OP_DROPOUT:
        return cpu_dropout(c, nt);
    default:
        return TD_EINTERNAL; /* tdd_cpu_native sends no other op here */
    }
}

/* ---------------------------------------------------------------- integer inputs, float kernels */

/* The float dtype a call's integer and bool inputs convert to before a float kernel
 * runs them: binary ops compute in the promoted dtype (true division, a float "other",
 * an integer tensor with a float one), float functions of integers (exp, sqrt, ...,
 * clamp to float bounds, logsumexp) in their output dtype. The reference rounds every
 * input to that dtype first too (ref_elem.c), so converting first changes nothing. */
static td_dtype int_cast_target(const tdd_opcall *c)
{
    tdd_opkind k = tdd_opdefs[c->op].kind;
    if (k != TDD_KIND_BINARY && k != TDD_KIND_UNARY && c->op != TDD_OP_LOGSUMEXP)
        return TD_DTYPE_INVALID;
    td_dtype ct = k == TDD_KIND_BINARY ? c->args->cdtype : c->args->dtype;
    return ct == TD_F32 || ct == TD_F64 ? ct : TD_DTYPE_INVALID;
}

bool cpu_ints_to_float(const tdd_opcall *c)
{
    td_dtype ct = int_cast_target(c);
    bool any = false;
    if (ct == TD_DTYPE_INVALID)
        return false;
    for (int k = 0; k < c->n_in; k++) {
        td_dtype dt = c->in[k]->dtype;
        if (dt == ct)
            continue;
        if (tdd_dtype_is_float(dt))
            return false; /* f16/bf16 with f32 go through cpu_via_f32 */
        any = true;
    }
    return any;
}

int cpu_via_cast(const tdd_opcall *c, int nt, int (*run)(const tdd_opcall *, int))
{
    td_dtype ct = int_cast_target(c);
    tdd_opcall fc = *c;
    tdd_tensor tin[TDD_MAX_OP_INPUTS];
    tdd_storage sin[TDD_MAX_OP_INPUTS];
    void *bufs[TDD_MAX_OP_INPUTS] = {0};
    int nb = 0, rc = 0;
    tdd_opargs ca;
    memset(&ca, 0, sizeof ca);
    ca.dtype = ca.cdtype = ct;
    for (int k = 0; k < c->n_in && !rc; k++) {
        const tdd_tensor *t = c->in[k];
        if (tdd_dtype_is_float(t->dtype))
            continue;
        tdd_tensor *f = &tin[k];
        *f = *t;
        f->dtype = ct;
        f->offset = 0;
        tdd_set_contiguous(f);
        int64_t n = tdd_numel(t);
        memset(&sin[k], 0, sizeof sin[k]);
        sin[k].data = bufs[nb++] = malloc((size_t)(n > 0 ? n : 1) * td_dtype_size(ct));
        sin[k].nbytes = (size_t)n * td_dtype_size(ct);
        f->st = &sin[k];
        if (!sin[k].data) {
            rc = TD_ERESOURCE_EXHAUSTED;
            break;
        }
        tdd_opcall cc = {.op = TDD_OP_CAST, .args = &ca, .n_in = 1, .n_out = 1};
        cc.in[0] = t;
        cc.out[0] = f;
        rc = cpu_cast(&cc, nt);
        fc.in[k] = f;
    }
    if (!rc)
        rc = run(&fc, nt);
    for (int k = 0; k < nb; k++)
        free(bufs[k]);
    return rc;
}

/* pixel_shuffle / pixel_unshuffle: element moves of any dtype, output rows split over the team
 * (tdd_pixel_src maps each output element to its input element). */
typedef struct {
    const tdd_opcall *c;
    int64_t rows; /* output rows: every dim but the last */
} pixel_job;

static void pixel_part(void *arg, int t, int nt)
{
    const pixel_job *jb = arg;
    const tdd_tensor *x = jb->c->in[0], *y = jb->c->out[0];
    int nd = y->ndim, down = jb->c->op == TDD_OP_PIXEL_UNSHUFFLE;
    int64_t C = y->shape[nd - 3], H = y->shape[nd - 2], W = y->shape[nd - 1], r = jb->c->args->i[0];
    size_t es = td_dtype_size(y->dtype);
    const char *xd = (const char *)x->st->data;
    char *yd = (char *)y->st->data;
    int64_t lo, hi;
    cpu_split(jb->rows, t, nt, &lo, &hi);
    for (int64_t row = lo; row < hi; row++) {
        int64_t h = row % H, ch = row / H % C, rest = row / (H * C), src0 = x->offset,
                dst = y->offset;
        for (int d = nd - 4; d >= 0; d--) {
            int64_t k = rest % y->shape[d];
            rest /= y->shape[d];
            src0 += k * x->strides[d];
            dst += k * y->strides[d];
        }
        dst += ch * y->strides[nd - 3] + h * y->strides[nd - 2];
        for (int64_t w = 0; w < W; w++) {
            int64_t ic, ih, iw;
            tdd_pixel_src(down, r, ch, h, w, &ic, &ih, &iw);
            int64_t src =
                src0 + ic * x->strides[nd - 3] + ih * x->strides[nd - 2] + iw * x->strides[nd - 1];
            memcpy(yd + (size_t)(dst + w * y->strides[nd - 1]) * es, xd + (size_t)src * es, es);
        }
    }
}

int cpu_pixel_shuffle(const tdd_opcall *c, int nt)
{
    const tdd_tensor *y = c->out[0];
    int64_t n = tdd_numel(y);
    pixel_job jb = {.c = c, .rows = y->shape[y->ndim - 1] ? n / y->shape[y->ndim - 1] : 0};
    if (n == 0)
        return 0;
    cpu_parallel(n >= 256 * 1024 && jb.rows > 1 ? (int)(jb.rows < nt ? jb.rows : nt) : 1,
                 pixel_part, &jb);
    return 0;
}
