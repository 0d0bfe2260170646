/* autograd_fn.c -- the backward formulas: each op's input gradients written
 * as ordinary ops queued on the inputs' device (no kernel of its own).
 *
 * A formula may return gradients in the broadcast shape and a promoted dtype;
 * autograd.c reduces them (sum_to) and casts them to each input's. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "autograd_impl.h"
#include "dtype.h"

#define A_INT(nm, v) ((td_attr){.name = (nm), .kind = TD_ATTR_INT, .i = (v), .f = (double)(v)})
#define A_F(nm, v) ((td_attr){.name = (nm), .kind = TD_ATTR_FLOAT, .f = (v)})
#define A_B(nm, v) ((td_attr){.name = (nm), .kind = TD_ATTR_BOOL, .b = (v), .i = (v)})
#define A_INTS(nm, p, k)                                                                           \
    ((td_attr){.name = (nm), .kind = TD_ATTR_INTS, .ints = (p), .n = (size_t)(k)})

/* ---------------------------------------------------------------- builders */

static tdd_value *un(tdd_bw *b, tdd_op op, tdd_value *x)
{
    return x ? tdd_bw_op(b, op, &x, 1, NULL, 0, 0, NULL) : NULL;
}

static tdd_value *bin(tdd_bw *b, tdd_op op, tdd_value *x, tdd_value *y)
{
    tdd_value *in[2] = {x, y};
    return x && y ? tdd_bw_op(b, op, in, 2, NULL, 0, 0, NULL) : NULL;
}

/* x op scalar (PyTorch's Python-scalar rules: the tensor's float dtype stays). */
static tdd_value *sc(tdd_bw *b, tdd_op op, tdd_value *x, double v)
{
    td_attr a = A_F("other", v);
    return x ? tdd_bw_op(b, op, &x, 1, &a, 1, 0, NULL) : NULL;
}

static tdd_value *op1a(tdd_bw *b, tdd_op op, tdd_value *x, const td_attr *a, size_t na)
{
    return x ? tdd_bw_op(b, op, &x, 1, a, na, 0, NULL) : NULL;
}

static tdd_value *cast(tdd_bw *b, tdd_value *x, td_dtype dt)
{
    if (x && x->t.dtype == dt)
        return x;
    return x ? tdd_bw_op(b, TDD_OP_CAST, &x, 1, NULL, 0, dt, NULL) : NULL;
}

static tdd_value *reshape(tdd_bw *b, tdd_value *x, const int64_t *shape, int nd)
{
    td_attr a = A_INTS("shape", shape, nd);
    return op1a(b, TDD_OP_RESHAPE, x, &a, 1);
}

static tdd_value *expand(tdd_bw *b, tdd_value *x, const int64_t *shape, int nd)
{
    td_attr a = A_INTS("shape", shape, nd);
    return op1a(b, TDD_OP_EXPAND, x, &a, 1);
}

static tdd_value *unsqueeze(tdd_bw *b, tdd_value *x, int64_t dim)
{
    td_attr a = A_INT("dim", dim);
    return op1a(b, TDD_OP_UNSQUEEZE, x, &a, 1);
}

static tdd_value *transpose(tdd_bw *b, tdd_value *x, int64_t d0, int64_t d1)
{
    td_attr a[2] = {A_INT("dim0", d0), A_INT("dim1", d1)};
    return op1a(b, TDD_OP_TRANSPOSE, x, a, 2);
}

static tdd_value *zeros(tdd_bw *b, const int64_t *shape, int nd, td_dtype dt, tdd_device *dev)
{
    td_attr a = A_INTS("shape", shape, nd);
    return tdd_bw_op(b, TDD_OP_ZEROS, NULL, 0, &a, 1, dt, dev);
}

/* Sum over the dims in mask (keepdim). */
static tdd_value *sum_dims(tdd_bw *b, tdd_value *x, uint32_t mask, bool keepdim)
{
    int64_t dims[TD_MAX_NDIM];
    int n = 0;
    for (int d = 0; x && d < x->t.ndim; d++)
        if (mask & (1u << d))
            dims[n++] = d;
    td_attr a[2] = {A_INTS("dim", dims, n), A_B("keepdim", keepdim)};
    if (x && n == 0)
        return x;
    return op1a(b, TDD_OP_SUM, x, a, 2);
}

static tdd_value *sum_dim(tdd_bw *b, tdd_value *x, int64_t d, bool keepdim)
{
    td_attr a[2] = {A_INT("dim", d), A_B("keepdim", keepdim)};
    return op1a(b, TDD_OP_SUM, x, a, 2);
}

static tdd_value *mean_dims(tdd_bw *b, tdd_value *x, const int64_t *dims, int n)
{
    td_attr a[2] = {A_INTS("dim", dims, n), A_B("keepdim", true)};
    return op1a(b, TDD_OP_MEAN, x, a, 2);
}

/* A reduction's output (or its gradient) spread back over the input's shape. */
static tdd_value *expand_back(tdd_bw *b, tdd_value *g, const tdd_node_in *x, uint32_t mask,
                              bool keepdim)
{
    int64_t ks[TD_MAX_NDIM];
    for (int d = 0; d < x->ndim; d++)
        ks[d] = (mask & (1u << d)) ? 1 : x->shape[d];
    if (!keepdim)
        g = reshape(b, g, ks, x->ndim);
    return expand(b, g, x->shape, x->ndim);
}

static tdd_value *zeros_in(tdd_bw *b, const tdd_node_in *x)
{
    return zeros(b, x->shape, x->ndim, x->dtype, x->dev);
}

/* ---------------------------------------------------------------- what is saved */

/* The backward row of each op, indexed by op: what its formula keeps from the forward (the
 * output; whether it needs its inputs' data or only their shapes, which the node always keeps)
 * and, for an op whose formula is a function of its own, that function (the rest are the
 * kind's formula: tdd_backward_formula). A view's inputs are never saved (the op table's
 * kind: their shapes are all the formula needs). */
typedef int (*bw_formula)(tdd_bw *b, tdd_node *n, tdd_value *g, tdd_value **gin);
typedef struct {
    bool saves_output;
    bool shape_only; /* the inputs' shapes (in the node) are enough: no data saved */
    bw_formula formula;
    /* notes the attributes the formula reads in the node (n->ex) when it is made, or NULL */
    void (*note)(tdd_node *n, const tdd_attrs *as, int nd);
} bw_row;

static void note_transpose(tdd_node *n, const tdd_attrs *as, int nd);
static void note_permute(tdd_node *n, const tdd_attrs *as, int nd);
static void note_slice(tdd_node *n, const tdd_attrs *as, int nd);
static void note_dim(tdd_node *n, const tdd_attrs *as, int nd);

static int f_conv2d(tdd_bw *b, tdd_node *n, tdd_value *g, tdd_value **gin);
static int f_conv1d(tdd_bw *b, tdd_node *n, tdd_value *g, tdd_value **gin);
static int f_conv_transpose2d(tdd_bw *b, tdd_node *n, tdd_value *g, tdd_value **gin);
static int f_sdpa(tdd_bw *b, tdd_node *n, tdd_value *g, tdd_value **gin);
static int f_batch_norm(tdd_bw *b, tdd_node *n, tdd_value *g, tdd_value **gin);
static int f_interp(tdd_bw *b, tdd_node *n, tdd_value *g, tdd_value **gin);
static int f_pool1d(tdd_bw *b, tdd_node *n, tdd_value *g, tdd_value **gin);

#define SAVES_OUT                                                                                  \
    {                                                                                              \
        .saves_output = true                                                                       \
    }
#define SHAPE_ONLY                                                                                 \
    {                                                                                              \
        .shape_only = true                                                                         \
    }
#define OUT_SHAPE_ONLY                                                                             \
    {                                                                                              \
        .saves_output = true, .shape_only = true                                                   \
    }
static const bw_row bw_rows[TDD_OP_COUNT] = {
    [TDD_OP_ADD] = SHAPE_ONLY,
    [TDD_OP_SUB] = SHAPE_ONLY,
    [TDD_OP_DIV] = SAVES_OUT,
    [TDD_OP_POW] = SAVES_OUT,
    [TDD_OP_NEG] = SHAPE_ONLY,
    [TDD_OP_EXP] = OUT_SHAPE_ONLY,
    [TDD_OP_EXPM1] = OUT_SHAPE_ONLY,
    [TDD_OP_SQRT] = OUT_SHAPE_ONLY,
    [TDD_OP_RSQRT] = OUT_SHAPE_ONLY,
    [TDD_OP_TANH] = OUT_SHAPE_ONLY,
    [TDD_OP_SIGMOID] = OUT_SHAPE_ONLY,
    [TDD_OP_RECIPROCAL] = OUT_SHAPE_ONLY,
    [TDD_OP_FLOOR] = SHAPE_ONLY,
    [TDD_OP_CEIL] = SHAPE_ONLY,
    [TDD_OP_ROUND] = SHAPE_ONLY,
    [TDD_OP_SIGN] = SHAPE_ONLY,
    [TDD_OP_SUM] = SHAPE_ONLY,
    [TDD_OP_MEAN] = SHAPE_ONLY,
    [TDD_OP_AMAX] = SAVES_OUT,
    [TDD_OP_AMIN] = SAVES_OUT,
    [TDD_OP_STD] = SAVES_OUT,
    [TDD_OP_LOGSUMEXP] = SAVES_OUT,
    [TDD_OP_PROD] = SAVES_OUT,
    [TDD_OP_SUM_TO] = SHAPE_ONLY,
    [TDD_OP_CUMSUM] = SHAPE_ONLY,
    [TDD_OP_SOFTMAX] = OUT_SHAPE_ONLY,
    [TDD_OP_LOG_SOFTMAX] = OUT_SHAPE_ONLY,
    [TDD_OP_TRANSPOSE] = {.note = note_transpose},
    [TDD_OP_PERMUTE] = {.note = note_permute},
    [TDD_OP_SLICE] = {.note = note_slice},
    [TDD_OP_SPLIT] = {.note = note_dim},
    [TDD_OP_CHUNK] = {.note = note_dim},
    [TDD_OP_CLONE] = SHAPE_ONLY,
    [TDD_OP_CAST] = SHAPE_ONLY,
    [TDD_OP_CAT] = SHAPE_ONLY,
    [TDD_OP_STACK] = SHAPE_ONLY,
    [TDD_OP_TRIL] = SHAPE_ONLY,
    [TDD_OP_TRIU] = SHAPE_ONLY,
    [TDD_OP_PAD] = SHAPE_ONLY,
    [TDD_OP_DROPOUT] = OUT_SHAPE_ONLY,
    [TDD_OP_SDPA] = {.formula = f_sdpa},
    [TDD_OP_BATCH_NORM] = {.formula = f_batch_norm},
    [TDD_OP_INTERPOLATE] = {.formula = f_interp},
    [TDD_OP_CONV2D] = {.formula = f_conv2d},
    [TDD_OP_CONV1D] = {.formula = f_conv1d},
    [TDD_OP_CONV_TRANSPOSE2D] = {.formula = f_conv_transpose2d},
    [TDD_OP_AVG_POOL2D] = SHAPE_ONLY,
    [TDD_OP_MAX_POOL1D] = {.formula = f_pool1d},
    [TDD_OP_AVG_POOL1D] = {.shape_only = true, .formula = f_pool1d},
};
#undef SAVES_OUT
#undef SHAPE_ONLY
#undef OUT_SHAPE_ONLY

/* ---------------------------------------------------------------- grad programs */

/* An op whose backward is a call of another op (its schema's grad, ops.h):
 * "name(arg, ...; new=old, ...)", each arg grad, inK or outK. What it saves is read off it. */
typedef struct {
    char name[48];
    int n_args;
    char args[TDD_MAX_OP_INPUTS][8];
    int n_renames;
    char renames[4][2][32]; /* [k][0] new name, [k][1] the forward's */
} grad_call;

static const char *grad_program(tdd_op op)
{
    return (unsigned)op < TDD_OP_COUNT ? tdd_op_schema[op].grad : NULL;
}

/* Reads the token at *s up to one of ",;=)" (spaces skipped) into buf: its length, -1 when
 * it does not fit. */
static int grad_token(const char **s, char *buf, size_t cap)
{
    while (**s == ' ')
        (*s)++;
    size_t k = 0;
    while (**s && !strchr(",;=) ", **s)) {
        if (k + 1 >= cap)
            return -1;
        buf[k++] = *(*s)++;
    }
    buf[k] = 0;
    while (**s == ' ')
        (*s)++;
    return (int)k;
}

/* 0, or -1 when the program is malformed (test_optable.c parses every row's). */
static int grad_parse(const char *prog, grad_call *gc)
{
    memset(gc, 0, sizeof *gc);
    const char *s = strchr(prog, '(');
    if (!s || (size_t)(s - prog) >= sizeof gc->name)
        return -1;
    memcpy(gc->name, prog, (size_t)(s - prog));
    s++;
    bool renames = false;
    for (;;) {
        char tok[32];
        if (grad_token(&s, tok, sizeof tok) <= 0)
            return -1;
        if (!renames) {
            if (gc->n_args >= TDD_MAX_OP_INPUTS || strlen(tok) >= sizeof gc->args[0])
                return -1;
            strcpy(gc->args[gc->n_args++], tok);
        } else {
            if (gc->n_renames >= 4 || *s != '=')
                return -1;
            s++;
            strcpy(gc->renames[gc->n_renames][0], tok);
            if (grad_token(&s, gc->renames[gc->n_renames][1], sizeof gc->renames[0][1]) <= 0)
                return -1;
            gc->n_renames++;
        }
        if (*s == ')')
            return s[1] ? -1 : 0;
        if (*s == ';' && !renames)
            renames = true;
        else if (*s != ',')
            return -1;
        s++;
    }
}

/* Whether op's grad program names an arg starting with what ("in", "out"). */
static bool grad_uses(tdd_op op, const char *what)
{
    grad_call gc;
    const char *prog = grad_program(op);
    if (!prog || grad_parse(prog, &gc))
        return false;
    for (int k = 0; k < gc.n_args; k++)
        if (strncmp(gc.args[k], what, strlen(what)) == 0)
            return true;
    return false;
}

int tdd_grad_program_check(const char *prog, char *why, size_t len)
{
    grad_call gc;
    if (grad_parse(prog, &gc)) {
        snprintf(why, len, "malformed");
        return -1;
    }
    if (!tdd_op_find(gc.name)) {
        snprintf(why, len, "no op %s", gc.name);
        return -1;
    }
    for (int k = 0; k < gc.n_args; k++) {
        const char *a = gc.args[k];
        if (strcmp(a, "grad") != 0 && !(strncmp(a, "in", 2) == 0 && a[2] >= '0' && a[2] <= '9') &&
            !(strncmp(a, "out", 3) == 0 && a[3] >= '0' && a[3] <= '9')) {
            snprintf(why, len, "argument %s is not grad, inK or outK", a);
            return -1;
        }
    }
    return 0;
}

/* The call: its arguments from the node (the saved inputs and outputs, output 0's gradient),
 * the forward's attributes renamed; its result is input 0's gradient. */
static int f_program(tdd_bw *b, tdd_node *n, tdd_value *g, tdd_value **gin)
{
    grad_call gc;
    if (!n->in[0].needs_grad)
        return b->rc;
    const tdd_opdef *d = NULL;
    if (grad_parse(grad_program(n->op), &gc) || !(d = tdd_op_find(gc.name)))
        return tdd_bw_fail(b, TD_EINTERNAL, "backward of %s: a malformed grad program",
                           tdd_opdefs[n->op].name);
    tdd_value *in[TDD_MAX_OP_INPUTS];
    for (int k = 0; k < gc.n_args; k++) {
        const char *a = gc.args[k];
        int i = a[0] == 'g' ? 0 : atoi(a + (a[0] == 'i' ? 2 : 3));
        in[k] = a[0] == 'g'   ? g
                : a[0] == 'i' ? (i < n->n_in ? n->in[i].v : NULL)
                              : (i < n->n_out ? n->out[i].alias : NULL);
        if (!in[k])
            return tdd_bw_fail(b, TD_EINTERNAL, "backward of %s: %s was not kept",
                               tdd_opdefs[n->op].name, a);
    }
    td_attr at[32];
    size_t na = n->n_attrs < 32 ? n->n_attrs : 32;
    if (na)
        memcpy(at, n->attrs, na * sizeof *at);
    for (size_t k = 0; k < na; k++)
        for (int r = 0; r < gc.n_renames; r++)
            if (strcmp(at[k].name, gc.renames[r][1]) == 0)
                at[k].name = tdd_op_attr(d->op, gc.renames[r][0])
                                 ? tdd_op_attr(d->op, gc.renames[r][0])->name
                                 : at[k].name;
    gin[0] = tdd_bw_op(b, d->op, in, gc.n_args, at, na, 0, NULL);
    return b->rc;
}

/* A copy of the forward's attributes in one allocation (strings and lists with them), charged
 * to the node's account; left NULL when there is no room (the call then sees none). */
static void keep_attrs(tdd_node *n, const tdd_attrs *as)
{
    size_t bytes = as->n * sizeof(td_attr);
    for (size_t k = 0; k < as->n; k++) {
        const td_attr *a = &as->a[k];
        bytes += strlen(a->name) + 1 + (a->s ? strlen(a->s) + 1 : 0) + 16;
        bytes += a->kind == TD_ATTR_INTS ? a->n * sizeof(int64_t) : 0;
        bytes += a->kind == TD_ATTR_FLOATS ? a->n * sizeof(double) : 0;
    }
    td_error err;
    if (!as->n || tdd_account_charge(n->acct, bytes, &err))
        return;
    char *blob = malloc(bytes);
    if (!blob) {
        tdd_account_credit(n->acct, bytes);
        return;
    }
    n->bytes += bytes;
    td_attr *at = (td_attr *)(void *)blob;
    char *p = blob + as->n * sizeof(td_attr);
    for (size_t k = 0; k < as->n; k++) {
        const td_attr *a = &as->a[k];
        at[k] = *a;
        p += (8 - (uintptr_t)p % 8) % 8;
        if (a->kind == TD_ATTR_INTS && a->n) {
            at[k].ints = memcpy(p, a->ints, a->n * sizeof(int64_t));
            p += a->n * sizeof(int64_t);
        }
        if (a->kind == TD_ATTR_FLOATS && a->n) {
            at[k].floats = memcpy(p, a->floats, a->n * sizeof(double));
            p += a->n * sizeof(double);
        }
        at[k].name = strcpy(p, a->name);
        p += strlen(a->name) + 1;
        if (a->s) {
            at[k].s = strcpy(p, a->s);
            p += strlen(a->s) + 1;
        }
    }
    n->attrs = at;
    n->n_attrs = as->n;
}

bool tdd_formula_saves_output(tdd_op op)
{
    if (grad_program(op))
        return grad_uses(op, "out");
    return (unsigned)op < TDD_OP_COUNT && bw_rows[op].saves_output;
}

bool tdd_formula_saves_inputs(tdd_op op)
{
    if (grad_program(op))
        return grad_uses(op, "in");
    return (unsigned)op < TDD_OP_COUNT && tdd_opdefs[op].kind != TDD_KIND_VIEW &&
           !bw_rows[op].shape_only;
}

/* batch_norm's running stats in training: the formula recomputes the batch's statistics,
 * so another training forward updating them before this backward is no error (torch's). */
bool tdd_formula_skips_input(tdd_op op, const tdd_opargs *args, int i)
{
    return op == TDD_OP_BATCH_NORM && args->i[0] && (i == 1 || i == 2);
}

bool tdd_formula_exists(tdd_op op)
{
    switch (op) {
    case TDD_OP_COUNT:
        return false;
    default:
        return true;
    }
}

static int64_t attr_int(const tdd_attrs *as, const char *name, int64_t def)
{
    const td_attr *a = tdd_attr_get(as, name);
    if (!a)
        return def;
    if (a->kind == TD_ATTR_INT || a->kind == TD_ATTR_BOOL)
        return a->i;
    if (a->kind == TD_ATTR_INTS && a->n == 1)
        return a->ints[0];
    return def;
}

static int64_t norm_dim(int64_t d, int nd)
{
    int64_t n = nd > 0 ? nd : 1;
    return d < 0 ? d + n : d;
}

/* The attributes a view's formula reads, noted in the node (n->ex) when it is made. */
static void note_transpose(tdd_node *n, const tdd_attrs *as, int nd)
{
    n->ex[0] = norm_dim(attr_int(as, "dim0", 0), nd);
    n->ex[1] = norm_dim(attr_int(as, "dim1", 0), nd);
}

static void note_permute(tdd_node *n, const tdd_attrs *as, int nd)
{
    const td_attr *a = tdd_attr_get(as, "dims");
    for (int d = 0; a && a->kind == TD_ATTR_INTS && d < nd && (size_t)d < a->n; d++)
        n->ex[d] = norm_dim(a->ints[d], nd);
}

static void note_slice(tdd_node *n, const tdd_attrs *as, int nd)
{
    /* The same clamping as the op's (Python slices). */
    int64_t d = norm_dim(attr_int(as, "dim", 0), nd);
    int64_t size = n->in[0].shape[d], start = attr_int(as, "start", 0);
    if (start < 0)
        start = start < -size ? 0 : start + size;
    if (start > size)
        start = size;
    n->ex[0] = d;
    n->ex[1] = start;
    n->ex[2] = attr_int(as, "step", 1);
}

static void note_dim(tdd_node *n, const tdd_attrs *as, int nd) /* split, chunk */
{
    n->ex[0] = norm_dim(attr_int(as, "dim", 0), nd);
}

void tdd_formula_note_attrs(tdd_node *n, const tdd_attrs *as)
{
    if (grad_program(n->op))
        keep_attrs(n, as);
    if ((unsigned)n->op < TDD_OP_COUNT && bw_rows[n->op].note)
        bw_rows[n->op].note(n, as, n->in[0].ndim);
}

/* ---------------------------------------------------------------- formulas */

/* 1 where cond holds, as x's dtype (masks must not pull arithmetic to f32). */
static tdd_value *maskf(tdd_bw *b, tdd_value *m, td_dtype dt)
{
    return cast(b, m, dt);
}

static int f_binary(tdd_bw *b, tdd_node *n, tdd_value *g, tdd_value **gin)
{
    const tdd_opargs *a = &n->args;
    tdd_value *x = n->in[0].v, *y = a->scalar_form ? NULL : n->in[1].v;
    tdd_value *out = n->out[0].alias;
    td_dtype dt = g->t.dtype;
    double other = a->f[0], alpha = a->f[1];
    switch (n->op) {
    case TDD_OP_ADD:
        gin[0] = g;
        if (!a->scalar_form)
            gin[1] = alpha == 1.0 ? g : sc(b, TDD_OP_MUL, g, alpha);
        break;
    case TDD_OP_SUB:
        gin[0] = g;
        if (!a->scalar_form)
            gin[1] = alpha == 1.0 ? un(b, TDD_OP_NEG, g) : sc(b, TDD_OP_MUL, g, -alpha);
        break;
    case TDD_OP_MUL:
        if (a->scalar_form) {
            gin[0] = sc(b, TDD_OP_MUL, g, other);
        } else {
            if (n->in[0].needs_grad)
                gin[0] = bin(b, TDD_OP_MUL, g, y);
            if (n->in[1].needs_grad)
                gin[1] = bin(b, TDD_OP_MUL, g, x);
        }
        break;
    case TDD_OP_DIV:
        if (a->scalar_form) {
            gin[0] = sc(b, TDD_OP_DIV, g, other);
        } else {
            tdd_value *ga = bin(b, TDD_OP_DIV, g, y);
            gin[0] = ga;
            if (n->in[1].needs_grad) /* d(x/y)/dy = -(g/y) * (x/y) */
                gin[1] = un(b, TDD_OP_NEG, bin(b, TDD_OP_MUL, ga, out));
        }
        break;
    case TDD_OP_POW:
        if (a->scalar_form) {
            if (other == 0.0) {
                gin[0] = zeros_in(b, &n->in[0]);
            } else {
                tdd_value *p = sc(b, TDD_OP_POW, x, other - 1.0);
                gin[0] = bin(b, TDD_OP_MUL, g, sc(b, TDD_OP_MUL, p, other));
            }
        } else {
            if (n->in[0].needs_grad) {
                tdd_value *p = bin(b, TDD_OP_POW, x, sc(b, TDD_OP_SUB, y, 1.0));
                gin[0] = bin(b, TDD_OP_MUL, g, bin(b, TDD_OP_MUL, y, p));
            }
            if (n->in[1].needs_grad)
                gin[1] = bin(b, TDD_OP_MUL, bin(b, TDD_OP_MUL, g, out), un(b, TDD_OP_LOG, x));
        }
        break;
    case TDD_OP_REMAINDER: /* a - floor(a / b) * b */
        gin[0] = g;
        if (!a->scalar_form && n->in[1].needs_grad)
            gin[1] = un(b, TDD_OP_NEG,
                        bin(b, TDD_OP_MUL, g, un(b, TDD_OP_FLOOR, bin(b, TDD_OP_DIV, x, y))));
        break;
    case TDD_OP_ATAN2: { /* atan2(x, y): d/dx = y / (x^2 + y^2), d/dy = -x / (x^2 + y^2) */
        tdd_value *r2 = a->scalar_form
                            ? sc(b, TDD_OP_ADD, un(b, TDD_OP_SQUARE, x), other * other)
                            : bin(b, TDD_OP_ADD, un(b, TDD_OP_SQUARE, x), un(b, TDD_OP_SQUARE, y));
        tdd_value *gr = bin(b, TDD_OP_DIV, g, r2);
        gin[0] = a->scalar_form ? sc(b, TDD_OP_MUL, gr, other) : bin(b, TDD_OP_MUL, gr, y);
        if (!a->scalar_form && n->in[1].needs_grad)
            gin[1] = un(b, TDD_OP_NEG, bin(b, TDD_OP_MUL, gr, x));
        break;
    }
    case TDD_OP_MAXIMUM:
    case TDD_OP_MINIMUM: {
        /* Ties split the gradient in half, as PyTorch does. */
        tdd_op win = n->op == TDD_OP_MAXIMUM ? TDD_OP_GT : TDD_OP_LT;
        tdd_value *w, *eq;
        if (a->scalar_form) {
            w = maskf(b, sc(b, win, x, other), dt);
            eq = maskf(b, sc(b, TDD_OP_EQ, x, other), dt);
        } else {
            w = maskf(b, bin(b, win, x, y), dt);
            eq = maskf(b, bin(b, TDD_OP_EQ, x, y), dt);
        }
        tdd_value *k = bin(b, TDD_OP_ADD, w, sc(b, TDD_OP_MUL, eq, 0.5));
        tdd_value *ga = bin(b, TDD_OP_MUL, g, k);
        gin[0] = ga;
        if (!a->scalar_form)
            gin[1] = bin(b, TDD_OP_SUB, g, ga);
        break;
    }
    default:
        return tdd_bw_fail(b, TD_EUNSUPPORTED_OP, "backward of %s is not implemented",
                           tdd_opdefs[n->op].name);
    }
    return b->rc;
}

/* d gelu/dx = Phi(x) + x phi(x). The op set has no erf: Phi(x) is read back
 * from the gelu kernel itself as gelu(x)/x (exact to rounding; 1/2 at 0). */
static tdd_value *gelu_grad(tdd_bw *b, tdd_value *x)
{
    tdd_value *zero = sc(b, TDD_OP_EQ, x, 0.0);
    td_attr one = A_F("value", 1.0), half = A_F("value", 0.5);
    tdd_value *in[2] = {x, zero};
    tdd_value *xs = zero ? tdd_bw_op(b, TDD_OP_MASKED_FILL, in, 2, &one, 1, 0, NULL) : NULL;
    tdd_value *cdf = bin(b, TDD_OP_DIV, un(b, TDD_OP_GELU, xs), xs);
    in[0] = cdf;
    cdf = cdf ? tdd_bw_op(b, TDD_OP_MASKED_FILL, in, 2, &half, 1, 0, NULL) : NULL;
    tdd_value *pdf =
        sc(b, TDD_OP_MUL, un(b, TDD_OP_EXP, sc(b, TDD_OP_MUL, un(b, TDD_OP_SQUARE, x), -0.5)),
           0.3989422804014327 /* 1/sqrt(2 pi) */);
    /* At 0 the fill is a constant: + x * pdf there (0 in value) gives it Phi's slope, so a
     * create_graph pass differentiates it as PyTorch does. */
    tdd_value *at0 = x ? cast(b, zero, x->t.dtype) : NULL;
    cdf = bin(b, TDD_OP_ADD, cdf, bin(b, TDD_OP_MUL, bin(b, TDD_OP_MUL, x, pdf), at0));
    return bin(b, TDD_OP_ADD, cdf, bin(b, TDD_OP_MUL, x, pdf));
}

/* The tanh approximation's derivative, term by term as PyTorch's. */
static tdd_value *gelu_tanh_grad(tdd_bw *b, tdd_value *x)
{
    const double k = 0.7978845608028654 /* sqrt(2/pi) */, c = 0.044715;
    tdd_value *x2 = un(b, TDD_OP_SQUARE, x);
    tdd_value *inner = sc(
        b, TDD_OP_MUL, bin(b, TDD_OP_ADD, x, sc(b, TDD_OP_MUL, bin(b, TDD_OP_MUL, x2, x), c)), k);
    tdd_value *t = un(b, TDD_OP_TANH, inner);
    tdd_value *left_d = sc(b, TDD_OP_MUL, sc(b, TDD_OP_ADD, t, 1.0), 0.5);
    tdd_value *tanh_d = sc(b, TDD_OP_ADD, un(b, TDD_OP_NEG, un(b, TDD_OP_SQUARE, t)), 1.0);
    tdd_value *inner_d =
        sc(b, TDD_OP_MUL, sc(b, TDD_OP_ADD, sc(b, TDD_OP_MUL, x2, 3.0 * c), 1.0), k);
    tdd_value *right_d =
        bin(b, TDD_OP_MUL, sc(b, TDD_OP_MUL, x, 0.5), bin(b, TDD_OP_MUL, tanh_d, inner_d));
    return bin(b, TDD_OP_ADD, left_d, right_d);
}

static int f_unary(tdd_bw *b, tdd_node *n, tdd_value *g, tdd_value **gin)
{
    tdd_value *x = n->in[0].v, *out = n->out[0].alias;
    td_dtype dt = n->in[0].dtype;
    const tdd_opargs *a = &n->args;
    tdd_value *r = NULL;
    switch (n->op) {
    case TDD_OP_NEG:
        r = un(b, TDD_OP_NEG, g);
        break;
    case TDD_OP_ABS:
        r = bin(b, TDD_OP_MUL, g, un(b, TDD_OP_SIGN, x));
        break;
    case TDD_OP_SIGN:
    case TDD_OP_FLOOR:
    case TDD_OP_CEIL:
    case TDD_OP_ROUND:
        r = zeros_in(b, &n->in[0]);
        break;
    case TDD_OP_EXP:
        r = bin(b, TDD_OP_MUL, g, out);
        break;
    case TDD_OP_EXPM1:
        r = bin(b, TDD_OP_MUL, g, sc(b, TDD_OP_ADD, out, 1.0));
        break;
    case TDD_OP_LOG:
        r = bin(b, TDD_OP_DIV, g, x);
        break;
    case TDD_OP_LOG1P:
        r = bin(b, TDD_OP_DIV, g, sc(b, TDD_OP_ADD, x, 1.0));
        break;
    case TDD_OP_SQRT:
        r = bin(b, TDD_OP_DIV, g, sc(b, TDD_OP_MUL, out, 2.0));
        break;
    case TDD_OP_RSQRT: /* -0.5 * out^3 */
        r = bin(b, TDD_OP_MUL, g, sc(b, TDD_OP_MUL, sc(b, TDD_OP_POW, out, 3.0), -0.5));
        break;
    case TDD_OP_RECIPROCAL: /* -out^2 */
        r = bin(b, TDD_OP_MUL, g, un(b, TDD_OP_NEG, un(b, TDD_OP_SQUARE, out)));
        break;
    case TDD_OP_SIN:
        r = bin(b, TDD_OP_MUL, g, un(b, TDD_OP_COS, x));
        break;
    case TDD_OP_COS:
        r = bin(b, TDD_OP_MUL, g, un(b, TDD_OP_NEG, un(b, TDD_OP_SIN, x)));
        break;
    case TDD_OP_TANH: /* 1 - out^2 */
        r = bin(b, TDD_OP_MUL, g,
                sc(b, TDD_OP_ADD, un(b, TDD_OP_NEG, un(b, TDD_OP_SQUARE, out)), 1.0));
        break;
    case TDD_OP_SIGMOID: /* out * (1 - out) */
        r = bin(b, TDD_OP_MUL, g,
                bin(b, TDD_OP_MUL, out, sc(b, TDD_OP_ADD, un(b, TDD_OP_NEG, out), 1.0)));
        break;
    case TDD_OP_RELU:
        r = bin(b, TDD_OP_RELU_BACKWARD, g, x);
        break;
    case TDD_OP_LEAKY_RELU: {
        double slope = a->f[0];
        tdd_value *pos = maskf(b, sc(b, TDD_OP_GT, x, 0.0), dt);
        r = bin(b, TDD_OP_MUL, g, sc(b, TDD_OP_ADD, sc(b, TDD_OP_MUL, pos, 1.0 - slope), slope));
        break;
    }
    case TDD_OP_SILU: { /* s * (1 + x * (1 - s)) */
        tdd_value *s = un(b, TDD_OP_SIGMOID, x);
        tdd_value *t = sc(b, TDD_OP_ADD,
                          bin(b, TDD_OP_MUL, x, sc(b, TDD_OP_ADD, un(b, TDD_OP_NEG, s), 1.0)), 1.0);
        r = bin(b, TDD_OP_MUL, g, bin(b, TDD_OP_MUL, s, t));
        break;
    }
    case TDD_OP_SOFTPLUS: { /* sigmoid(beta x), 1 past the threshold where it is linear */
        tdd_value *bx = sc(b, TDD_OP_MUL, x, a->f[0]);
        tdd_value *s = un(b, TDD_OP_SIGMOID, bx);
        tdd_value *over = sc(b, TDD_OP_GT, bx, a->f[1]);
        tdd_value *in[2] = {s, over};
        td_attr v = A_F("value", 1.0);
        tdd_value *k = s && over ? tdd_bw_op(b, TDD_OP_MASKED_FILL, in, 2, &v, 1, 0, NULL) : NULL;
        r = bin(b, TDD_OP_MUL, g, k);
        break;
    }
    case TDD_OP_CLAMP: { /* passes where min <= x <= max */
        if (n->n_in > 1) {
            /* tensor bounds, PyTorch's rule: the bound that won gets the gradient; where
             * min > max, max wins (min gets none) */
            tdd_value *lo = n->in[1].v, *hi = n->n_in > 2 ? n->in[2].v : NULL;
            tdd_value *ge = bin(b, TDD_OP_GE, x, lo);
            tdd_value *le = hi ? bin(b, TDD_OP_LE, x, hi) : NULL;
            td_dtype gd = g->t.dtype;
            gin[0] =
                bin(b, TDD_OP_MUL, g, maskf(b, le ? bin(b, TDD_OP_LOGICAL_AND, ge, le) : ge, gd));
            if (n->in[1].needs_grad) {
                tdd_value *w = bin(b, TDD_OP_LT, x, lo);
                if (hi)
                    w = bin(b, TDD_OP_LOGICAL_AND, w, bin(b, TDD_OP_LT, lo, hi));
                gin[1] = bin(b, TDD_OP_MUL, g, maskf(b, w, gd));
            }
            if (hi && n->in[2].needs_grad) {
                tdd_value *w =
                    bin(b, TDD_OP_LOGICAL_OR, bin(b, TDD_OP_GT, x, hi), bin(b, TDD_OP_LT, hi, lo));
                gin[2] = bin(b, TDD_OP_MUL, g, maskf(b, w, gd));
            }
            return b->rc;
        }
        r = g;
        if (a->flags & 1u)
            r = bin(b, TDD_OP_MUL, r, maskf(b, sc(b, TDD_OP_GE, x, a->f[0]), dt));
        if (a->flags & 2u)
            r = bin(b, TDD_OP_MUL, r, maskf(b, sc(b, TDD_OP_LE, x, a->f[1]), dt));
        break;
    }
    case TDD_OP_SQUARE:
        r = bin(b, TDD_OP_MUL, g, sc(b, TDD_OP_MUL, x, 2.0));
        break;
    case TDD_OP_GELU:
        r = bin(b, TDD_OP_MUL, g, a->i[0] ? gelu_tanh_grad(b, x) : gelu_grad(b, x));
        break;
    default:
        return tdd_bw_fail(b, TD_EUNSUPPORTED_OP, "backward of %s is not implemented",
                           tdd_opdefs[n->op].name);
    }
    gin[0] = r;
    return b->rc;
}

static tdd_value *scatter_into_zeros(tdd_bw *b, const tdd_node_in *xi, tdd_value *idx,
                                     tdd_value *src, int64_t dim);

static int f_reduce(tdd_bw *b, tdd_node *n, tdd_value *g, tdd_value **gin)
{
    const tdd_opargs *a = &n->args;
    const tdd_node_in *xi = &n->in[0];
    tdd_value *x = xi->v, *out = n->out[0].alias;
    uint32_t m = a->dims_mask;
    bool kd = a->keepdim;
    switch (n->op) {
    case TDD_OP_MAX:
    case TDD_OP_MIN: { /* the gradient goes to the index the forward picked (PyTorch's) */
        int64_t d = a->i[0];
        td_attr at[2] = {A_INT("dim", d), A_B("keepdim", true)};
        tdd_value *idx = op1a(b, n->op == TDD_OP_MAX ? TDD_OP_ARGMAX : TDD_OP_ARGMIN,
                              xi->dtype == TD_BOOL ? cast(b, x, TD_U8) : x, at, 2);
        tdd_value *gk = kd || !xi->ndim ? g : unsqueeze(b, g, d);
        if (!xi->ndim) {
            gin[0] = g;
            break;
        }
        gin[0] = scatter_into_zeros(b, xi, idx, gk, d);
        break;
    }
    case TDD_OP_SUM:
        gin[0] = expand_back(b, g, xi, m, kd);
        break;
    case TDD_OP_MEAN:
        gin[0] = sc(b, TDD_OP_DIV, expand_back(b, g, xi, m, kd), (double)a->i[1]);
        break;
    case TDD_OP_SUM_TO: {
        int64_t ks[TD_MAX_NDIM];
        int lead = xi->ndim - n->out[0].ndim;
        for (int d = 0; d < xi->ndim; d++)
            ks[d] = d < lead ? 1 : n->out[0].shape[d - lead];
        gin[0] = expand(b, reshape(b, g, ks, xi->ndim), xi->shape, xi->ndim);
        break;
    }
    case TDD_OP_AMAX:
    case TDD_OP_AMIN: { /* shared equally among the elements equal to the extreme */
        tdd_value *hit = maskf(b, bin(b, TDD_OP_EQ, x, expand_back(b, out, xi, m, kd)), xi->dtype);
        tdd_value *cnt = expand(b, sum_dims(b, hit, m, true), xi->shape, xi->ndim);
        gin[0] = bin(b, TDD_OP_MUL, bin(b, TDD_OP_DIV, expand_back(b, g, xi, m, kd), cnt), hit);
        break;
    }
    case TDD_OP_VAR:
    case TDD_OP_STD: {
        int64_t dims[TD_MAX_NDIM];
        int nd = 0;
        for (int d = 0; d < xi->ndim; d++)
            if (m & (1u << d))
                dims[nd++] = d;
        tdd_value *xc = bin(b, TDD_OP_SUB, x, mean_dims(b, x, dims, nd));
        double denom = (double)a->i[1] - a->f[0];
        tdd_value *ge = expand_back(b, g, xi, m, kd);
        if (n->op == TDD_OP_VAR)
            gin[0] = bin(b, TDD_OP_MUL, ge, sc(b, TDD_OP_MUL, xc, 2.0 / denom));
        else
            gin[0] = bin(b, TDD_OP_DIV, bin(b, TDD_OP_MUL, ge, sc(b, TDD_OP_DIV, xc, denom)),
                         expand_back(b, out, xi, m, kd));
        break;
    }
    case TDD_OP_LOGSUMEXP:
        gin[0] = bin(b, TDD_OP_MUL, expand_back(b, g, xi, m, kd),
                     un(b, TDD_OP_EXP, bin(b, TDD_OP_SUB, x, expand_back(b, out, xi, m, kd))));
        break;
    case TDD_OP_PROD: {
        /* g * out / x, except where x is 0: there the product of the others
         * (nonzero only when that 0 is the slice's only one), as PyTorch. */
        tdd_value *z = sc(b, TDD_OP_EQ, x, 0.0), *zf = maskf(b, z, xi->dtype);
        tdd_value *in[2] = {x, z};
        td_attr one = A_F("value", 1.0);
        tdd_value *x1 = z ? tdd_bw_op(b, TDD_OP_MASKED_FILL, in, 2, &one, 1, 0, NULL) : NULL;
        tdd_value *ge = expand_back(b, g, xi, m, kd);
        tdd_value *a0 =
            bin(b, TDD_OP_DIV, bin(b, TDD_OP_MUL, ge, expand_back(b, out, xi, m, kd)), x1);
        /* 0 where x is 0 (out is 0 there), but as a constant: out's slope must not leak into
         * a create_graph pass's second derivative at the zero itself */
        td_attr zv = A_F("value", 0.0);
        in[0] = a0;
        a0 = a0 ? tdd_bw_op(b, TDD_OP_MASKED_FILL, in, 2, &zv, 1, 0, NULL) : NULL;
        int64_t dims[TD_MAX_NDIM];
        int nd = 0;
        for (int d = 0; d < xi->ndim; d++)
            if (m & (1u << d))
                dims[nd++] = d;
        td_attr pa[2] = {A_INTS("dim", dims, nd), A_B("keepdim", true)};
        tdd_value *others = expand(b, op1a(b, TDD_OP_PROD, x1, pa, 2), xi->shape, xi->ndim);
        tdd_value *single = maskf(b, sc(b, TDD_OP_EQ, sum_dims(b, zf, m, true), 1.0), xi->dtype);
        tdd_value *b0 = bin(b, TDD_OP_MUL, bin(b, TDD_OP_MUL, ge, others),
                            bin(b, TDD_OP_MUL, zf, expand(b, single, xi->shape, xi->ndim)));
        gin[0] = bin(b, TDD_OP_ADD, a0, b0);
        break;
    }
    case TDD_OP_CUMSUM: { /* reversed cumulative sum: total - cumsum(g) + g */
        td_attr d = A_INT("dim", a->i[0]);
        tdd_value *cs = op1a(b, TDD_OP_CUMSUM, g, &d, 1);
        gin[0] = bin(b, TDD_OP_ADD, bin(b, TDD_OP_SUB, sum_dim(b, g, a->i[0], true), cs), g);
        break;
    }
    case TDD_OP_SOFTMAX: /* out * (g - sum(g * out)) */
        gin[0] = bin(b, TDD_OP_MUL, out,
                     bin(b, TDD_OP_SUB, g, sum_dim(b, bin(b, TDD_OP_MUL, g, out), a->i[0], true)));
        break;
    case TDD_OP_LOG_SOFTMAX: /* g - exp(out) * sum(g) */
        gin[0] = bin(b, TDD_OP_SUB, g,
                     bin(b, TDD_OP_MUL, un(b, TDD_OP_EXP, out), sum_dim(b, g, a->i[0], true)));
        break;
    default:
        return tdd_bw_fail(b, TD_EUNSUPPORTED_OP, "backward of %s is not implemented",
                           tdd_opdefs[n->op].name);
    }
    return b->rc;
}

static int f_matmul(tdd_bw *b, tdd_node *n, tdd_value *g, tdd_value **gin)
{
    const tdd_opargs *a = &n->args;
    tdd_value *x = n->in[0].v, *w = n->in[1].v;
    const tdd_node_in *xi = &n->in[0], *wi = &n->in[1];
    bool a1 = a->flags & 1u, b1 = a->flags & 2u;
    int64_t M = a->i[0], K = a->i[1], N = a->i[2];
    if (n->op == TDD_OP_LINEAR) {
        /* y = x W^T (+ bias): rows of x against rows of W. */
        int64_t P = K ? tdd_shape_numel(xi->shape, xi->ndim, INT64_MAX) / K : 0;
        int64_t x2s[2] = {P, K}, g2s[2] = {P, N}, gw1[2] = {1, P};
        tdd_value *x2 = reshape(b, x, x2s, 2);
        if (b1) {
            if (xi->needs_grad)
                gin[0] = bin(b, TDD_OP_MUL, unsqueeze(b, g, -1), w);
            if (wi->needs_grad)
                gin[1] = bin(b, TDD_OP_MATMUL, reshape(b, g, gw1, 2), x2);
        } else {
            if (xi->needs_grad)
                gin[0] = bin(b, TDD_OP_MATMUL, g, w);
            if (wi->needs_grad)
                gin[1] = bin(b, TDD_OP_MATMUL, transpose(b, reshape(b, g, g2s, 2), 0, 1), x2);
        }
        if (n->n_in == 3 && n->in[2].needs_grad)
            gin[2] = g; /* sum_to the bias's shape */
        return b->rc;
    }
    /* matmul/bmm: lift 1-D operands to matrices, then the two products;
     * batch broadcasting is undone by sum_to. */
    (void)M;
    int64_t as[2] = {1, K}, bs[2] = {K, 1};
    tdd_value *A = a1 ? reshape(b, x, as, 2) : x;
    tdd_value *B = b1 ? reshape(b, w, bs, 2) : w;
    tdd_value *G = g;
    if (a1 && b1) {
        int64_t gs[2] = {1, 1};
        G = reshape(b, g, gs, 2);
    } else if (a1) {
        G = unsqueeze(b, g, -2);
    } else if (b1) {
        G = unsqueeze(b, g, -1);
    }
    if (xi->needs_grad) /* [.., M, N] x [.., N, K]; a 1-D x: [.., 1, K] sums to [K] */
        gin[0] = bin(b, TDD_OP_MATMUL, G, transpose(b, B, -1, -2));
    if (wi->needs_grad) {
        tdd_value *gb = bin(b, TDD_OP_MATMUL, transpose(b, A, -1, -2), G);
        if (b1) {
            td_attr d = A_INT("dim", -1);
            gb = op1a(b, TDD_OP_SQUEEZE, gb, &d, 1);
        }
        gin[1] = gb;
    }
    return b->rc;
}

/* ignore_index, label smoothing, class weights, soft targets and the reduction, as PyTorch
 * applies them. With u = w * q (q the smoothed one-hot or soft target, w the class weights),
 * a row's loss is sum_k u_k (lse - x_k), so d/dx = softmax(x) * sum(u) - u (cross_entropy) and
 * -u (nll_loss), each row scaled by the incoming gradient over the mean's denominator (the
 * summed weights of the counted rows; for soft targets, the row count). */
static int f_class_loss(tdd_bw *b, tdd_node *n, tdd_value *g, tdd_value **gin)
{
    const tdd_opargs *a = &n->args;
    tdd_value *x = n->in[0].v, *t = n->in[1].v;
    const tdd_node_in *xi = &n->in[0];
    td_dtype dt = xi->dtype;
    int nd = xi->ndim, cd = nd == 1 ? 0 : 1;
    int64_t C = xi->shape[cd], red = a->i[0], ii = a->i[1];
    bool ce = n->op == TDD_OP_CROSS_ENTROPY, probs = (a->flags & 2u) != 0;
    double eps = ce ? a->f[0] : 0.0;
    /* the class weights, shaped to broadcast along the class dim */
    tdd_value *w = NULL;
    if (a->flags & 1u) {
        int64_t ws[TD_MAX_NDIM];
        for (int d = 0; d < nd; d++)
            ws[d] = d == cd ? C : 1;
        w = reshape(b, n->in[2].v, ws, nd);
    }
    tdd_value *q, *valid = NULL;
    if (probs) {
        q = t;
    } else {
        td_attr ia = A_INT("other", ii);
        valid = op1a(b, TDD_OP_NE, t, &ia, 1);
        tdd_value *mf_in[2] = {t, un(b, TDD_OP_LOGICAL_NOT, valid)};
        td_attr zv = A_INT("value", 0);
        tdd_value *tsafe =
            mf_in[1] ? tdd_bw_op(b, TDD_OP_MASKED_FILL, mf_in, 2, &zv, 1, 0, NULL) : NULL;
        td_attr nc = A_INT("num_classes", C);
        q = cast(b, op1a(b, TDD_OP_ONE_HOT, tsafe, &nc, 1), dt); /* [rows..., C] */
        if (nd > 2) {                                            /* the classes back to dim 1 */
            int64_t perm[TD_MAX_NDIM];
            perm[0] = 0;
            perm[1] = nd - 1;
            for (int d = 2; d < nd; d++)
                perm[d] = d - 1;
            td_attr pa = A_INTS("dims", perm, nd);
            q = op1a(b, TDD_OP_PERMUTE, q, &pa, 1);
        }
    }
    tdd_value *onehot = q;
    if (eps > 0.0)
        q = sc(b, TDD_OP_ADD, sc(b, TDD_OP_MUL, q, 1.0 - eps), eps / (double)C);
    tdd_value *u = w ? bin(b, TDD_OP_MUL, q, w) : q;
    /* the per-row scale: the incoming gradient (per row for "none") over the denominator */
    tdd_value *rw = g;
    if (valid)
        rw = bin(b, TDD_OP_MUL, cast(b, valid, dt), rw);
    if (red == TDD_RED_MEAN) {
        tdd_value *den;
        if (probs) {
            int64_t rows = tdd_shape_numel(xi->shape, nd, INT64_MAX) / C;
            rw = sc(b, TDD_OP_DIV, rw, (double)rows);
            den = NULL;
        } else if (w) { /* the weights of the counted rows' targets */
            den = un(b, TDD_OP_SUM,
                     bin(b, TDD_OP_MUL, sum_dim(b, bin(b, TDD_OP_MUL, onehot, w), cd, false),
                         cast(b, valid, dt)));
        } else {
            den = un(b, TDD_OP_SUM, cast(b, valid, dt));
        }
        if (den)
            rw = bin(b, TDD_OP_DIV, rw, den);
    }
    /* rw has the rows' shape (index targets, or "none"): spread along the class dim */
    tdd_value *rwu = (valid || red == TDD_RED_NONE) && nd > 1 ? unsqueeze(b, rw, cd) : rw;
    tdd_value *d;
    if (ce) {
        td_attr dim = A_INT("dim", cd);
        d = bin(b, TDD_OP_SUB,
                bin(b, TDD_OP_MUL, op1a(b, TDD_OP_SOFTMAX, x, &dim, 1), sum_dim(b, u, cd, true)),
                u);
    } else {
        d = un(b, TDD_OP_NEG, u);
    }
    gin[0] = bin(b, TDD_OP_MUL, d, rwu);
    if (probs && n->in[1].needs_grad) { /* d/dq_k = -(1 - eps) w_k log_softmax(x)_k */
        td_attr dim = A_INT("dim", cd);
        tdd_value *lp = op1a(b, TDD_OP_LOG_SOFTMAX, x, &dim, 1);
        tdd_value *gq = sc(b, TDD_OP_MUL, w ? bin(b, TDD_OP_MUL, lp, w) : lp, -(1.0 - eps));
        gin[1] = bin(b, TDD_OP_MUL, gq, rwu);
    }
    return b->rc;
}

/* Reverses dims 2 and 3 of a [O, C, kh, kw] kernel (index_select with a
 * descending arange: the op set has no flip). */
static tdd_value *flip_hw(tdd_bw *b, tdd_value *w, const int64_t *shape)
{
    for (int d = 2; d < 4 && w; d++) {
        td_attr r[3] = {A_INT("start", shape[d] - 1), A_INT("end", -1), A_INT("step", -1)};
        tdd_value *idx = tdd_bw_op(b, TDD_OP_ARANGE, NULL, 0, r, 3, TD_I64, w->dev);
        tdd_value *in[2] = {w, idx};
        td_attr dim = A_INT("dim", d);
        w = idx ? tdd_bw_op(b, TDD_OP_INDEX_SELECT, in, 2, &dim, 1, 0, NULL) : NULL;
    }
    return w;
}

/* The adjoint of conv2d (groups 1) with respect to its input: g [N,O,Ho,Wo]
 * correlated with the flipped, transposed kernel w [O,C,kh,kw] over g with
 * zeros between its rows and columns (stride) and around it (padding),
 * giving [N,C,H,W]. Also the adjoint of a pooling window sum. */
static tdd_value *conv_input_grad(tdd_bw *b, tdd_value *g, tdd_value *w, const int64_t *wshape,
                                  int64_t G, int64_t N, const int64_t *H, const int64_t *Ho,
                                  const int64_t *st, const int64_t *pd, const int64_t *dl)
{
    int64_t O = wshape[0], K[2] = {wshape[2], wshape[3]};
    int64_t span[2], rem[2];
    for (int k = 0; k < 2; k++) {
        span[k] = dl[k] * (K[k] - 1);
        /* Rows past the last window (floor mode: 0 <= rem < stride), or,
         * negative, how far a ceil_mode window reaches past the padding. */
        rem[k] = H[k] + 2 * pd[k] - span[k] - 1 - (Ho[k] - 1) * st[k];
    }
    tdd_value *gz = g;
    if (st[0] > 1 || st[1] > 1) {
        /* Zeros between the rows and columns: [N,O,Ho,1,Wo,1] padded to
         * [N,O,Ho,sh,Wo,sw], folded, the trailing zeros cut. */
        int64_t s6[6] = {N, O, Ho[0], 1, Ho[1], 1}, s4[4] = {N, O, Ho[0] * st[0], Ho[1] * st[1]};
        int64_t pad[6] = {0, st[1] - 1, 0, 0, 0, st[0] - 1};
        td_attr pa = A_INTS("pad", pad, 6);
        gz = reshape(b, op1a(b, TDD_OP_PAD, reshape(b, g, s6, 6), &pa, 1), s4, 4);
        for (int k = 0; k < 2; k++) {
            td_attr sl[3] = {A_INT("dim", 2 + k), A_INT("start", 0),
                             A_INT("stop", (Ho[k] - 1) * st[k] + 1)};
            gz = op1a(b, TDD_OP_SLICE, gz, sl, 3);
        }
    }
    if (rem[0] > 0 || rem[1] > 0) {
        /* Window starts past the last one: zeros, so the correlation below
         * spans the whole input. */
        int64_t pad[4] = {0, rem[1] > 0 ? rem[1] : 0, 0, rem[0] > 0 ? rem[0] : 0};
        td_attr pa = A_INTS("pad", pad, 4);
        gz = op1a(b, TDD_OP_PAD, gz, &pa, 1);
    }
    /* Per group, in and out channels swap: [G, O/G, C/G, kh, kw] -> [C, O/G, kh, kw]. */
    int64_t Cg = wshape[1], Og = O / G;
    int64_t s5[5] = {G, Og, Cg, K[0], K[1]}, s4[4] = {G * Cg, Og, K[0], K[1]};
    tdd_value *wf = reshape(b, transpose(b, reshape(b, flip_hw(b, w, wshape), s5, 5), 1, 2), s4, 4);
    /* The full correlation pads by span - pd; where the padding is wider than the dilated
     * kernel that is negative: no padding, and that much cut from both ends after. */
    int64_t cp[2] = {span[0] - pd[0], span[1] - pd[1]}, one[2] = {1, 1}, crop[2];
    for (int k = 0; k < 2; k++) {
        crop[k] = cp[k] < 0 ? -cp[k] : 0;
        cp[k] += crop[k];
    }
    td_attr ca[4] = {A_INTS("padding", cp, 2), A_INTS("dilation", dl, 2), A_INTS("stride", one, 2),
                     A_INT("groups", G)};
    tdd_value *in[2] = {gz, wf};
    tdd_value *gx = gz && wf ? tdd_bw_op(b, TDD_OP_CONV2D, in, 2, ca, 4, 0, NULL) : NULL;
    for (int k = 0; k < 2; k++)
        if (crop[k] > 0 && gx) {
            int64_t len = gx->t.shape[2 + k];
            td_attr sl[3] = {A_INT("dim", 2 + k), A_INT("start", crop[k]),
                             A_INT("stop", len - crop[k])};
            gx = op1a(b, TDD_OP_SLICE, gx, sl, 3);
        }
    for (int k = 0; k < 2; k++)
        if (rem[k] < 0) { /* the overhanging window's part beyond the input */
            td_attr sl[3] = {A_INT("dim", 2 + k), A_INT("start", 0), A_INT("stop", H[k])};
            gx = op1a(b, TDD_OP_SLICE, gx, sl, 3);
        }
    return gx;
}

/* The same adjoint as conv_input_grad, as one conv_transpose2d (a GEMM and a col2im on
 * cpu, no zero-stuffed copy of g and no im2col over it): the transposed conv with conv2d's
 * stride, padding, dilation and groups maps Ho back to (Ho - 1) s - 2 p + d (k - 1) + 1,
 * and output_padding adds the rows past the last window (floor mode: 0 <= rem < stride,
 * which conv_transpose2d accepts). NULL, nothing built, where that does not hold. */
static tdd_value *conv_input_by_transpose(tdd_bw *b, tdd_value *g, tdd_value *w,
                                          const int64_t *wshape, int64_t G, const int64_t *H,
                                          const int64_t *Ho, const int64_t *st, const int64_t *pd,
                                          const int64_t *dl)
{
    int64_t rem[2];
    for (int k = 0; k < 2; k++) {
        rem[k] = H[k] + 2 * pd[k] - dl[k] * (wshape[2 + k] - 1) - 1 - (Ho[k] - 1) * st[k];
        if (rem[k] < 0 || (rem[k] >= st[k] && rem[k] >= dl[k]))
            return NULL;
    }
    if (!g || !w)
        return NULL;
    td_attr ca[5] = {A_INTS("stride", st, 2), A_INTS("padding", pd, 2),
                     A_INTS("output_padding", rem, 2), A_INTS("dilation", dl, 2),
                     A_INT("groups", G)};
    tdd_value *in[2] = {g, w};
    return tdd_bw_op(b, TDD_OP_CONV_TRANSPOSE2D, in, 2, ca, 5, 0, NULL);
}

/* conv2d: the input's gradient is the full correlation of the
 * stride-dilated output gradient with the flipped kernel; the weight's is the
 * correlation of the input with the output gradient, batch as channels. */
static int f_conv2d(tdd_bw *b, tdd_node *n, tdd_value *g, tdd_value **gin)
{
    const tdd_opargs *a = &n->args;
    const tdd_node_in *xi = &n->in[0], *wi = &n->in[1];
    const int64_t *st = a->ints[0], *pd = a->ints[1], *dl = a->ints[2];
    int64_t G = a->i[0];
    bool batched = xi->ndim == 4;
    tdd_value *x = xi->v, *w = wi->v;
    if (!batched) {
        x = unsqueeze(b, x, 0);
        g = unsqueeze(b, g, 0);
    }
    int64_t N = batched ? xi->shape[0] : 1, C = xi->shape[xi->ndim - 3];
    int64_t H[2] = {xi->shape[xi->ndim - 2], xi->shape[xi->ndim - 1]};
    int64_t K[2] = {wi->shape[2], wi->shape[3]};
    int64_t Ho[2] = {n->out[0].shape[n->out[0].ndim - 2], n->out[0].shape[n->out[0].ndim - 1]};
    const int64_t *more = a->ints[1] + 2; /* padding="same": one more row/column at the end */
    if (more[0] || more[1]) {
        /* the same conv on the input padded by that much at the end, padding symmetric */
        int64_t pad[4] = {0, more[1], 0, more[0]};
        td_attr pa = A_INTS("pad", pad, 4);
        x = op1a(b, TDD_OP_PAD, x, &pa, 1);
        H[0] += more[0];
        H[1] += more[1];
    }
    if (n->n_in == 3 && n->in[2].needs_grad) {
        int64_t dims[3] = {0, 2, 3};
        td_attr at = A_INTS("dim", dims, 3);
        gin[2] = op1a(b, TDD_OP_SUM, g, &at, 1);
    }
    if (xi->needs_grad) {
        tdd_value *gx = conv_input_by_transpose(b, g, w, wi->shape, G, H, Ho, st, pd, dl);
        if (!gx && !b->rc)
            gx = conv_input_grad(b, g, w, wi->shape, G, N, H, Ho, st, pd, dl);
        for (int k = 0; k < 2; k++)
            if (more[k]) { /* the end padding's gradient is dropped */
                td_attr sl[3] = {A_INT("dim", 2 + k), A_INT("start", 0),
                                 A_INT("stop", H[k] - more[k])};
                gx = op1a(b, TDD_OP_SLICE, gx, sl, 3);
            }
        gin[0] = batched ? gx : reshape(b, gx, xi->shape, xi->ndim);
    }
    if (wi->needs_grad) {
        td_attr ca[3] = {A_INTS("padding", pd, 2), A_INTS("dilation", st, 2),
                         A_INTS("stride", dl, 2)};
        tdd_value *in[2] = {transpose(b, x, 0, 1), transpose(b, g, 0, 1)};
        tdd_value *gw = in[0] && in[1] ? tdd_bw_op(b, TDD_OP_CONV2D, in, 2, ca, 3, 0, NULL)
                                       : NULL; /* [C, O, kh', kw'], kh' >= kh */
        for (int k = 0; k < 2; k++) {
            td_attr sl[3] = {A_INT("dim", 2 + k), A_INT("start", 0), A_INT("stop", K[k])};
            gw = op1a(b, TDD_OP_SLICE, gw, sl, 3);
        }
        gw = transpose(b, gw, 0, 1); /* [O, C, kh, kw]: every (out, in) channel pair */
        if (G > 1) {
            /* Keep the pairs within a group: the diagonal of [G, G] blocks. */
            int64_t Og = wi->shape[0] / G, Cg = wi->shape[1];
            int64_t s6[6] = {G, Og, G, Cg, K[0], K[1]}, s5[5] = {G * G, Og, Cg, K[0], K[1]};
            int64_t perm[6] = {0, 2, 1, 3, 4, 5};
            td_attr pa = A_INTS("dims", perm, 6);
            gw = reshape(b, op1a(b, TDD_OP_PERMUTE, reshape(b, gw, s6, 6), &pa, 1), s5, 5);
            td_attr r[3] = {A_INT("start", 0), A_INT("end", G * G), A_INT("step", G + 1)};
            tdd_value *in2[2] = {gw, tdd_bw_op(b, TDD_OP_ARANGE, NULL, 0, r, 3, TD_I64, xi->dev)};
            td_attr d0 = A_INT("dim", 0);
            gw = in2[0] && in2[1] ? tdd_bw_op(b, TDD_OP_INDEX_SELECT, in2, 2, &d0, 1, 0, NULL)
                                  : NULL;
            gw = reshape(b, gw, wi->shape, 4);
        }
        gin[1] = gw;
        (void)C;
    }
    return b->rc;
}

/* v with a unit dim inserted before its last: conv1d's operands as conv2d's. */
static tdd_value *unit_row(tdd_bw *b, tdd_value *v, const tdd_node_in *like, tdd_node_in *as)
{
    *as = *like;
    int nd = like->ndim;
    as->shape[nd] = like->shape[nd - 1];
    as->shape[nd - 1] = 1;
    as->ndim = nd + 1;
    as->v = v ? unsqueeze(b, v, nd - 1) : NULL;
    return as->v;
}

/* A 1-D op that is its 2-D twin on [N, C, 1, L] (its arguments are the twin's): the twin's
 * formula on the first n_wide operands widened, the gradients narrowed back. */
static int f_unit_row(tdd_bw *b, tdd_node *n, tdd_value *g, tdd_value **gin, tdd_op twin,
                      int n_wide, bw_formula formula)
{
    tdd_node_in in[3];
    tdd_node_out out = n->out[0];
    tdd_node m = *n;
    m.op = twin;
    m.in = in;
    m.out = &out;
    for (int k = 0; k < n->n_in && k < 3; k++) {
        if (k < n_wide)
            unit_row(b, n->in[k].v, &n->in[k], &in[k]);
        else
            in[k] = n->in[k];
    }
    int nd = out.ndim;
    out.shape[nd] = out.shape[nd - 1];
    out.shape[nd - 1] = 1;
    out.ndim = nd + 1;
    tdd_value *g4 = unsqueeze(b, g, nd - 1);
    if (b->rc)
        return b->rc;
    int rc = formula(b, &m, g4, gin);
    for (int k = 0; k < n_wide && !rc; k++)
        if (gin[k])
            gin[k] = reshape(b, gin[k], n->in[k].shape, n->in[k].ndim);
    return rc ? rc : b->rc;
}

/* conv1d is conv2d on [N, C, 1, L]: input and weight widened */
static int f_conv1d(tdd_bw *b, tdd_node *n, tdd_value *g, tdd_value **gin)
{
    return f_unit_row(b, n, g, gin, TDD_OP_CONV2D, 2, f_conv2d);
}

/* conv_transpose2d is conv2d's adjoint in its input: gx = conv2d(g, w) (the same stride,
 * padding, dilation and groups), and gw is conv2d's weight gradient with g as that conv's
 * input and x as its output's gradient (conv2d's formula on such a node). */
static int f_conv_transpose2d(tdd_bw *b, tdd_node *n, tdd_value *g, tdd_value **gin)
{
    const tdd_opargs *a = &n->args;
    const tdd_node_in *xi = &n->in[0], *wi = &n->in[1];
    int nd = xi->ndim;
    if (n->n_in == 3 && n->in[2].needs_grad) {
        int64_t dims[3] = {0, 2, 3}, udims[2] = {1, 2};
        td_attr at = nd == 4 ? A_INTS("dim", dims, 3) : A_INTS("dim", udims, 2);
        gin[2] = op1a(b, TDD_OP_SUM, g, &at, 1);
    }
    if (xi->needs_grad) {
        td_attr ca[4] = {A_INTS("stride", a->ints[0], 2), A_INTS("padding", a->ints[1], 2),
                         A_INTS("dilation", a->ints[2], 2), A_INT("groups", a->i[0])};
        tdd_value *in[2] = {g, wi->v};
        tdd_value *gx = tdd_bw_op(b, TDD_OP_CONV2D, in, 2, ca, 4, 0, NULL);
        for (int k = 0; k < 2 && gx; k++) /* output_padding >= stride: one more row/column */
            if (gx->t.shape[nd - 2 + k] != xi->shape[nd - 2 + k]) {
                td_attr sl[3] = {A_INT("dim", nd - 2 + k), A_INT("start", 0),
                                 A_INT("stop", xi->shape[nd - 2 + k])};
                gx = op1a(b, TDD_OP_SLICE, gx, sl, 3);
            }
        gin[0] = gx;
    }
    if (wi->needs_grad) {
        tdd_node_in in[2] = {n->in[0], n->in[1]};
        tdd_node_out out = n->out[0];
        tdd_node m = *n;
        m.op = TDD_OP_CONV2D;
        m.n_in = 2;
        m.in = in;
        m.out = &out;
        in[0].v = g; /* the conv's input: g, shaped as this op's output */
        in[0].ndim = n->out[0].ndim;
        memcpy(in[0].shape, n->out[0].shape, sizeof in[0].shape);
        in[0].needs_grad = false;
        out.ndim = xi->ndim; /* its output: x's shape */
        memcpy(out.shape, xi->shape, sizeof out.shape);
        memset(m.args.ints[1] + 2, 0, 2 * sizeof(int64_t)); /* no padding="same" extra */
        tdd_value *gw[TDD_MAX_OP_INPUTS] = {0};
        int rc = f_conv2d(b, &m, xi->v, gw);
        if (rc)
            return rc;
        gin[1] = gw[1];
    }
    return b->rc;
}

/* batch_norm per channel over every dim but 1: training through the batch's statistics
 * (layer_norm's formula), eval through the running ones (an affine map of x). */
static int f_batch_norm(tdd_bw *b, tdd_node *n, tdd_value *g, tdd_value **gin)
{
    const tdd_opargs *a = &n->args;
    const tdd_node_in *xi = &n->in[0];
    tdd_value *x = xi->v;
    int nd = xi->ndim, k = 0;
    int64_t C = xi->shape[1], od[TD_MAX_NDIM], cshape[TD_MAX_NDIM];
    for (int d = 0; d < nd; d++) {
        cshape[d] = d == 1 ? C : 1;
        if (d != 1)
            od[k++] = d;
    }
    uint32_t others = ((1u << nd) - 1u) & ~2u;
    for (int i = 1; i < 3 && i < n->n_in; i++)
        if (n->in[i].needs_grad)
            return tdd_bw_fail(b, TD_EUNSUPPORTED_OP,
                               "batch_norm: the derivative for %s is not implemented",
                               i == 1 ? "running_mean" : "running_var");
    bool wg = (a->flags & 2u) && n->in[3].needs_grad, bg = (a->flags & 4u) && n->in[4].needs_grad;
    tdd_value *w = (a->flags & 2u) ? reshape(b, n->in[3].v, cshape, nd) : NULL;
    tdd_value *xhat = NULL;
    if (a->i[0]) {
        tdd_value *xc = bin(b, TDD_OP_SUB, x, mean_dims(b, x, od, k));
        tdd_value *var = mean_dims(b, un(b, TDD_OP_SQUARE, xc), od, k);
        tdd_value *rstd = un(b, TDD_OP_RSQRT, sc(b, TDD_OP_ADD, var, a->f[0]));
        xhat = bin(b, TDD_OP_MUL, xc, rstd);
        if (xi->needs_grad) {
            tdd_value *gh = w ? bin(b, TDD_OP_MUL, g, w) : g;
            tdd_value *m1 = mean_dims(b, gh, od, k);
            tdd_value *m2 = mean_dims(b, bin(b, TDD_OP_MUL, gh, xhat), od, k);
            gin[0] =
                bin(b, TDD_OP_MUL, rstd,
                    bin(b, TDD_OP_SUB, bin(b, TDD_OP_SUB, gh, m1), bin(b, TDD_OP_MUL, xhat, m2)));
        }
    } else {
        tdd_value *rm = reshape(b, n->in[1].v, cshape, nd);
        tdd_value *rstd =
            un(b, TDD_OP_RSQRT, sc(b, TDD_OP_ADD, reshape(b, n->in[2].v, cshape, nd), a->f[0]));
        if (xi->needs_grad)
            gin[0] = bin(b, TDD_OP_MUL, g, w ? bin(b, TDD_OP_MUL, rstd, w) : rstd);
        if (wg)
            xhat = bin(b, TDD_OP_MUL, bin(b, TDD_OP_SUB, x, rm), rstd);
    }
    if (wg)
        gin[3] = reshape(b, sum_dims(b, bin(b, TDD_OP_MUL, g, xhat), others, false), &C, 1);
    if (bg)
        gin[4] = reshape(b, sum_dims(b, g, others, false), &C, 1);
    return b->rc;
}

/* adaptive pooling's [m, n] averaging matrix (tdd_adaptive_window): row i holds
 * 1 / (hi - lo) over [lo, hi), in float64 then dt */
static tdd_value *adaptive_matrix(tdd_bw *b, int64_t m, int64_t n, td_dtype dt, tdd_device *dev)
{
    td_attr ri[2] = {A_INT("start", 0), A_INT("end", m)},
            rj[2] = {A_INT("start", 0), A_INT("end", n)};
    tdd_value *i = tdd_bw_op(b, TDD_OP_ARANGE, NULL, 0, ri, 2, TD_F64, dev);
    tdd_value *j = tdd_bw_op(b, TDD_OP_ARANGE, NULL, 0, rj, 2, TD_F64, dev);
    /* lo = floor(i n / m), hi = ceil((i + 1) n / m): exact in double for these sizes */
    tdd_value *lo =
        un(b, TDD_OP_FLOOR, sc(b, TDD_OP_DIV, sc(b, TDD_OP_MUL, i, (double)n), (double)m));
    tdd_value *hi =
        un(b, TDD_OP_CEIL,
           sc(b, TDD_OP_DIV, sc(b, TDD_OP_MUL, sc(b, TDD_OP_ADD, i, 1.0), (double)n), (double)m));
    tdd_value *lo1 = unsqueeze(b, lo, 1), *hi1 = unsqueeze(b, hi, 1);
    tdd_value *in =
        bin(b, TDD_OP_LOGICAL_AND, bin(b, TDD_OP_GE, j, lo1), bin(b, TDD_OP_LT, j, hi1));
    tdd_value *p = bin(b, TDD_OP_DIV, cast(b, in, TD_F64), bin(b, TDD_OP_SUB, hi1, lo1));
    return cast(b, p, dt);
}

/* scaled_dot_product_attention's dropout multipliers (0 or 1/(1-p)) over shape: dropout of
 * ones with the forward's seed, so the same draws (ops.h: both index [batch..., L, S]). */
static tdd_value *sdpa_keep(tdd_bw *b, const tdd_opargs *a, const int64_t *shape, int nd,
                            td_dtype dt, tdd_device *dev)
{
    td_attr sa = A_INTS("shape", shape, nd);
    tdd_value *ones = tdd_bw_op(b, TDD_OP_ONES, NULL, 0, &sa, 1, dt, dev);
    if (!ones)
        return NULL;
    td_attr pa = A_F("p", a->f[0]);
    tdd_opreq req = {.attrs = {.a = &pa, .n = 1}, .dtype = 0, .seed = a->seed};
    tdd_value *o = NULL;
    int got = 1;
    td_error err;
    int rc = tdd_submit_op(b->s, b->req_id, false, TDD_OP_DROPOUT, &req, &ones, 1, NULL, &o, &got,
                           NULL, &err);
    if (rc) {
        tdd_bw_fail(b, rc, "backward (scaled_dot_product_attention): %.200s", err.message);
        return NULL;
    }
    tdd_bw_keep(b, o);
    return o;
}

static tdd_value *masked(tdd_bw *b, tdd_value *x, tdd_value *mask, double v)
{
    td_attr va = A_F("value", v);
    tdd_value *in[2] = {x, mask};
    return x && mask ? tdd_bw_op(b, TDD_OP_MASKED_FILL, in, 2, &va, 1, 0, NULL) : NULL;
}

/* scaled_dot_product_attention: the weights P recomputed by ordinary ops (scores, mask,
 * softmax), then y = (P * keep) v differentiated as the matmuls and softmax are. */
static int f_sdpa(tdd_bw *b, tdd_node *n, tdd_value *g, tdd_value **gin)
{
    const tdd_opargs *a = &n->args;
    const tdd_node_in *qi = &n->in[0];
    tdd_value *q = qi->v, *k = n->in[1].v, *v = n->in[2].v;
    tdd_value *m = n->n_in > 3 ? n->in[3].v : NULL;
    int nb = (int)a->i[6];
    int64_t ls[TD_MAX_NDIM];
    memcpy(ls, a->ints[0], (size_t)nb * sizeof *ls);
    ls[nb] = a->i[2];
    ls[nb + 1] = a->i[3];
    tdd_value *s = sc(b, TDD_OP_MUL, bin(b, TDD_OP_MATMUL, q, transpose(b, k, -2, -1)), a->f[1]);
    tdd_value *hide = NULL; /* bool: the positions not attended (causal, or a bool mask) */
    if (a->i[0]) {
        td_attr fa[2] = {A_INTS("shape", ls + nb, 2), A_F("value", 1.0)};
        hide = un(b, TDD_OP_LOGICAL_NOT,
                  op1a(b, TDD_OP_TRIL, tdd_bw_op(b, TDD_OP_FULL, NULL, 0, fa, 2, TD_BOOL, qi->dev),
                       NULL, 0));
    } else if (a->i[1] == 1) {
        hide = un(b, TDD_OP_LOGICAL_NOT, m);
    }
    if (hide) {
        s = masked(b, s, hide, -INFINITY);
    } else if (a->i[1] == 2) {
        s = bin(b, TDD_OP_ADD, s, m);
    }
    td_attr last = A_INT("dim", -1);
    tdd_value *P = op1a(b, TDD_OP_SOFTMAX, s, &last, 1);
    tdd_value *keep = a->f[0] > 0.0 ? sdpa_keep(b, a, ls, nb + 2, qi->dtype, qi->dev) : NULL;
    tdd_value *Pd = keep ? bin(b, TDD_OP_MUL, P, keep) : P;
    if (n->in[2].needs_grad)
        gin[2] = bin(b, TDD_OP_MATMUL, transpose(b, Pd, -2, -1), g);
    bool mg = a->i[1] == 2 && n->in[3].needs_grad;
    if (!qi->needs_grad && !n->in[1].needs_grad && !mg)
        return b->rc;
    tdd_value *gP = bin(b, TDD_OP_MATMUL, g, transpose(b, v, -2, -1));
    if (keep)
        gP = bin(b, TDD_OP_MUL, gP, keep);
    tdd_value *dot = sum_dim(b, bin(b, TDD_OP_MUL, gP, P), -1, true);
    tdd_value *gs = bin(b, TDD_OP_MUL, P, bin(b, TDD_OP_SUB, gP, dot));
    if (hide) /* masked_fill's gradient: none where filled (a row attending nothing: 0, not NaN) */
        gs = masked(b, gs, hide, 0.0);
    if (mg)
        gin[3] = gs;
    gs = sc(b, TDD_OP_MUL, gs, a->f[1]);
    if (qi->needs_grad)
        gin[0] = bin(b, TDD_OP_MATMUL, gs, k);
    if (n->in[1].needs_grad)
        gin[1] = bin(b, TDD_OP_MATMUL, transpose(b, gs, -2, -1), q);
    return b->rc;
}

/* interpolate's weights along dim d as a matrix [out, in] (row o: its sources' weights), built
 * by ops in the forward kernel's arithmetic (tdd_interp_src): float, or double for f64. */
static tdd_value *interp_matrix(tdd_bw *b, const tdd_opargs *a, int d, int64_t in, int64_t out,
                                td_dtype dt, tdd_device *dev)
{
    int mode = (int)a->i[0];
    td_dtype mt = dt == TD_F64 && mode == 1 ? TD_F64 : TD_F32;
    double s = mt == TD_F32 ? (double)(float)a->f[d] : a->f[d];
    td_attr ro[2] = {A_INT("start", 0), A_INT("end", out)},
            ri[2] = {A_INT("start", 0), A_INT("end", in)};
    tdd_value *o = tdd_bw_op(b, TDD_OP_ARANGE, NULL, 0, ro, 2, mt, dev);
    tdd_value *j = unsqueeze(b, tdd_bw_op(b, TDD_OP_ARANGE, NULL, 0, ri, 2, mt, dev), 0);
    tdd_value *w;
    if (mode == 0) {
        tdd_value *k = out == in       ? o
                       : out == 2 * in ? un(b, TDD_OP_FLOOR, sc(b, TDD_OP_MUL, o, 0.5))
                                       : un(b, TDD_OP_FLOOR, sc(b, TDD_OP_MUL, o, s));
        k = unsqueeze(b, sc(b, TDD_OP_MINIMUM, k, (double)(in - 1)), 1);
        w = cast(b, bin(b, TDD_OP_EQ, j, k), dt);
    } else {
        tdd_value *src =
            a->i[1] ? sc(b, TDD_OP_MUL, o, s)
                    : sc(b, TDD_OP_SUB, sc(b, TDD_OP_MUL, sc(b, TDD_OP_ADD, o, 0.5), s), 0.5);
        src = unsqueeze(b, sc(b, TDD_OP_MAXIMUM, src, 0.0), 1);
        tdd_value *k0 = un(b, TDD_OP_FLOOR, src);
        tdd_value *l1 = bin(b, TDD_OP_SUB, src, k0);
        tdd_value *k1 = sc(b, TDD_OP_MINIMUM, sc(b, TDD_OP_ADD, k0, 1.0), (double)(in - 1));
        tdd_value *w0 = bin(b, TDD_OP_MUL, cast(b, bin(b, TDD_OP_EQ, j, k0), mt),
                            sc(b, TDD_OP_ADD, sc(b, TDD_OP_MUL, l1, -1.0), 1.0));
        tdd_value *w1 = bin(b, TDD_OP_MUL, cast(b, bin(b, TDD_OP_EQ, j, k1), mt), l1);
        w = cast(b, bin(b, TDD_OP_ADD, w0, w1), dt);
    }
    return w;
}

/* interpolate is linear per spatial dim, y = Wh x Ww^T, so gx = Wh^T g Ww. */
static int f_interp(tdd_bw *b, tdd_node *n, tdd_value *g, tdd_value **gin)
{
    const tdd_opargs *a = &n->args;
    const tdd_node_in *xi = &n->in[0];
    int nd = (int)a->i[2], last = xi->ndim - 1;
    tdd_value *ww =
        interp_matrix(b, a, nd - 1, xi->shape[last], n->out[0].shape[last], xi->dtype, xi->dev);
    tdd_value *gx = bin(b, TDD_OP_MATMUL, g, ww);
    if (nd == 2) {
        tdd_value *wh =
            interp_matrix(b, a, 0, xi->shape[2], n->out[0].shape[2], xi->dtype, xi->dev);
        gx = bin(b, TDD_OP_MATMUL, transpose(b, wh, 0, 1), gx);
    }
    gin[0] = gx;
    return b->rc;
}

/* embedding_bag's gradient to per_sample_weights (mode sum): entry j gets
 * dot(g[bag(j)], weight[input[j]]), 0 for padding_idx and entries past the last bag. bag(j)
 * counts the bag starts after the first at or before j: a scatter of ones at offsets[1..]
 * and a cumulative sum. */
static tdd_value *bag_psw_grad(tdd_bw *b, tdd_node *n, tdd_value *g)
{
    const tdd_opargs *a = &n->args;
    const tdd_node_in *pi = &n->in[3];
    int64_t N = n->in[0].shape[0], B = a->i[3], nb = a->i[2] ? B : B - 1, n1[1] = {N + 1},
            nbs[1] = {nb > 0 ? nb : 0};
    if (B == 0 || N == 0)
        return zeros_in(b, pi);
    tdd_value *ix = cast(b, n->in[0].v, TD_I64), *bag = zeros(b, n1, 1, TD_I64, pi->dev);
    if (nb > 0) {
        td_attr sl[3] = {A_INT("dim", 0), A_INT("start", 1), A_INT("stop", 1 + nb)};
        td_attr one = A_INT("other", 1);
        tdd_value *in[3] = {bag, op1a(b, TDD_OP_SLICE, cast(b, n->in[2].v, TD_I64), sl, 3),
                            op1a(b, TDD_OP_ADD, zeros(b, nbs, 1, TD_I64, pi->dev), &one, 1)};
        td_attr d0 = A_INT("dim", 0);
        bag = in[0] && in[1] && in[2] ? tdd_bw_op(b, TDD_OP_SCATTER_ADD, in, 3, &d0, 1, 0, NULL)
                                      : NULL;
        bag = op1a(b, TDD_OP_CUMSUM, bag, &d0, 1);
    }
    td_attr sl[3] = {A_INT("dim", 0), A_INT("start", 0), A_INT("stop", N)};
    td_attr last = A_INT("other", B - 1), lim = A_INT("other", B), pad = A_INT("other", a->i[1]);
    bag = op1a(b, TDD_OP_SLICE, bag, sl, 3);
    /* entries after the last bag (include_last_offset) get nothing */
    tdd_value *keep = cast(b, op1a(b, TDD_OP_LT, bag, &lim, 1), pi->dtype);
    if (a->i[1] >= 0)
        keep = bin(b, TDD_OP_MUL, keep, cast(b, op1a(b, TDD_OP_NE, ix, &pad, 1), pi->dtype));
    tdd_value *rows[2] = {op1a(b, TDD_OP_MINIMUM, bag, &last, 1), g};
    tdd_value *gsel = rows[0] ? tdd_bw_op(b, TDD_OP_EMBEDDING, rows, 2, NULL, 0, 0, NULL) : NULL;
    tdd_value *wrow[2] = {ix, n->in[1].v};
    tdd_value *wsel = ix ? tdd_bw_op(b, TDD_OP_EMBEDDING, wrow, 2, NULL, 0, 0, NULL) : NULL;
    return bin(b, TDD_OP_MUL, sum_dim(b, bin(b, TDD_OP_MUL, gsel, wsel), 1, false), keep);
}

static int f_nn(tdd_bw *b, tdd_node *n, tdd_value *g, tdd_value **gin)
{
    const tdd_opargs *a = &n->args;
    const tdd_node_in *xi = &n->in[0];
    tdd_value *x = xi->v;
    switch (n->op) {
    case TDD_OP_EMBEDDING_BAG: { /* the weight's: embedding_bag_backward, the same attrs */
        static const char *const modes[] = {"sum", "mean", "max"};
        if (n->n_in > 3 && n->in[3].needs_grad)
            gin[3] = bag_psw_grad(b, n, g);
        if (!n->in[1].needs_grad)
            return b->rc;
        tdd_value *in[5] = {g, x, n->in[2].v, n->in[1].v, n->n_in > 3 ? n->in[3].v : NULL};
        td_attr at[3] = {{.name = "mode", .kind = TD_ATTR_STR, .s = modes[a->i[0]]},
                         A_B("include_last_offset", a->i[2] != 0),
                         A_INT("padding_idx", a->i[1])};
        gin[1] = tdd_bw_op(b, TDD_OP_EMBEDDING_BAG_BACKWARD, in, n->n_in + 1, at,
                           a->i[1] >= 0 ? 3 : 2, 0, NULL);
        return b->rc;
    }
    case TDD_OP_MATMUL:
    case TDD_OP_BMM:
    case TDD_OP_LINEAR:
        return f_matmul(b, n, g, gin);
    case TDD_OP_CROSS_ENTROPY:
    case TDD_OP_NLL_LOSS:
        return f_class_loss(b, n, g, gin);
    case TDD_OP_ADDMM:
    case TDD_OP_BADDBMM: { /* beta g; alpha g m2^T; alpha m1^T g */
        double beta = a->f[2], alpha = a->f[3];
        tdd_value *m1 = n->in[1].v, *m2 = n->in[2].v;
        if (xi->needs_grad)
            gin[0] = sc(b, TDD_OP_MUL, g, beta);
        if (n->in[1].needs_grad)
            gin[1] = sc(b, TDD_OP_MUL, bin(b, TDD_OP_MATMUL, g, transpose(b, m2, -1, -2)), alpha);
        if (n->in[2].needs_grad)
            gin[2] = sc(b, TDD_OP_MUL, bin(b, TDD_OP_MATMUL, transpose(b, m1, -1, -2), g), alpha);
        return b->rc;
    }
    case TDD_OP_MSE_LOSS:
    case TDD_OP_BCE_WITH_LOGITS: {
        tdd_value *y = n->in[1].v;
        double k = a->i[0] == TDD_RED_MEAN
                       ? 1.0 / (double)tdd_shape_numel(xi->shape, xi->ndim, INT64_MAX)
                       : 1.0;
        tdd_value *gx, *gy;
        if (n->op == TDD_OP_MSE_LOSS) {
            gx = bin(b, TDD_OP_MUL, sc(b, TDD_OP_MUL, bin(b, TDD_OP_SUB, x, y), 2.0 * k), g);
            gy = un(b, TDD_OP_NEG, gx);
        } else {
            gx = bin(b, TDD_OP_MUL,
                     sc(b, TDD_OP_MUL, bin(b, TDD_OP_SUB, un(b, TDD_OP_SIGMOID, x), y), k), g);
            gy = bin(b, TDD_OP_MUL, sc(b, TDD_OP_MUL, x, -k), g);
        }
        gin[0] = gx;
        gin[1] = gy;
        return b->rc;
    }
    case TDD_OP_LAYER_NORM: {
        int k = (int)a->i[0];
        int64_t dims[TD_MAX_NDIM];
        for (int d = 0; d < k; d++)
            dims[d] = xi->ndim - k + d;
        tdd_value *w = (a->flags & 1u) ? n->in[1].v : NULL;
        tdd_value *xc = bin(b, TDD_OP_SUB, x, mean_dims(b, x, dims, k));
        tdd_value *var = mean_dims(b, un(b, TDD_OP_SQUARE, xc), dims, k);
        tdd_value *rstd = un(b, TDD_OP_RSQRT, sc(b, TDD_OP_ADD, var, a->f[0]));
        tdd_value *xhat = bin(b, TDD_OP_MUL, xc, rstd);
        tdd_value *gh = w ? bin(b, TDD_OP_MUL, g, w) : g;
        tdd_value *m1 = mean_dims(b, gh, dims, k);
        tdd_value *m2 = mean_dims(b, bin(b, TDD_OP_MUL, gh, xhat), dims, k);
        gin[0] = bin(b, TDD_OP_MUL, rstd,
                     bin(b, TDD_OP_SUB, bin(b, TDD_OP_SUB, gh, m1), bin(b, TDD_OP_MUL, xhat, m2)));
        if (w && n->in[1].needs_grad)
            gin[1] = bin(b, TDD_OP_MUL, g, xhat);
        int bi = (a->flags & 1u) ? 2 : 1;
        if ((a->flags & 2u) && bi < n->n_in && n->in[bi].needs_grad)
            gin[bi] = g;
        return b->rc;
    }
    case TDD_OP_GROUP_NORM: { /* layer_norm's formula over [N, G, C/G * S] */
        int nd = xi->ndim;
        int64_t N = xi->shape[0], C = xi->shape[1], G = a->i[0];
        int64_t M = N != 0 && G != 0 ? tdd_shape_numel(xi->shape, nd, INT64_MAX) / (N * G) : 0;
        int64_t s3[3] = {N, G, M}, last[1] = {2}, wshape[TD_MAX_NDIM];
        for (int d = 0; d < nd; d++)
            wshape[d] = d == 1 ? C : 1;
        tdd_value *w = (a->flags & 1u) ? reshape(b, n->in[1].v, wshape, nd) : NULL;
        tdd_value *xr = reshape(b, x, s3, 3);
        tdd_value *xc = bin(b, TDD_OP_SUB, xr, mean_dims(b, xr, last, 1));
        tdd_value *var = mean_dims(b, un(b, TDD_OP_SQUARE, xc), last, 1);
        tdd_value *rstd = un(b, TDD_OP_RSQRT, sc(b, TDD_OP_ADD, var, a->f[0]));
        tdd_value *xhat = bin(b, TDD_OP_MUL, xc, rstd);
        tdd_value *gh = reshape(b, w ? bin(b, TDD_OP_MUL, g, w) : g, s3, 3);
        tdd_value *m1 = mean_dims(b, gh, last, 1);
        tdd_value *m2 = mean_dims(b, bin(b, TDD_OP_MUL, gh, xhat), last, 1);
        gin[0] = reshape(
            b,
            bin(b, TDD_OP_MUL, rstd,
                bin(b, TDD_OP_SUB, bin(b, TDD_OP_SUB, gh, m1), bin(b, TDD_OP_MUL, xhat, m2))),
            xi->shape, nd);
        uint32_t others = ((1u << nd) - 1u) & ~2u; /* every dim but the channels */
        if (w && n->in[1].needs_grad)
            gin[1] = reshape(
                b,
                sum_dims(b, bin(b, TDD_OP_MUL, g, reshape(b, xhat, xi->shape, nd)), others, false),
                &C, 1);
        if ((a->flags & 2u) && n->n_in > 2 && n->in[2].needs_grad)
            gin[2] = reshape(b, sum_dims(b, g, others, false), &C, 1);
        return b->rc;
    }
    case TDD_OP_ADAPTIVE_AVG_POOL2D: { /* y = Ph x Pw^T per plane, so gx = Ph^T g Pw */
        int nd = xi->ndim;
        tdd_value *ph = adaptive_matrix(b, a->ints[3][0], xi->shape[nd - 2], xi->dtype, xi->dev);
        tdd_value *pw = adaptive_matrix(b, a->ints[3][1], xi->shape[nd - 1], xi->dtype, xi->dev);
        gin[0] = bin(b, TDD_OP_MATMUL, transpose(b, ph, 0, 1), bin(b, TDD_OP_MATMUL, g, pw));
        return b->rc;
    }
    case TDD_OP_AVG_POOL2D: {
        /* Each window's gradient, divided by its divisor, spread evenly over
         * the window: the adjoint of a window sum with a kernel of ones. */
        const int64_t *ks = a->ints[3], *st = a->ints[0], *pd = a->ints[1];
        int nd = xi->ndim;
        int64_t H[2] = {xi->shape[nd - 2], xi->shape[nd - 1]};
        int64_t Ho[2] = {n->out[0].shape[nd - 2], n->out[0].shape[nd - 1]}, one[2] = {1, 1};
        int64_t B = tdd_shape_numel(xi->shape, nd, INT64_MAX) / (H[0] * H[1]);
        int64_t gs[4] = {B, 1, Ho[0], Ho[1]}, kshape[4] = {1, 1, ks[0], ks[1]};
        td_attr fa[2] = {A_INTS("shape", kshape, 4), A_F("value", 1.0)};
        tdd_value *k1 = tdd_bw_op(b, TDD_OP_FULL, NULL, 0, fa, 2, xi->dtype, xi->dev);
        /* The divisors, per output row and column, as PyTorch's kernel
         * computes them: the window clipped to the padded input (or, without
         * count_include_pad, to the input). */
        tdd_value *div[2];
        for (int k = 0; k < 2; k++) {
            td_attr r[2] = {A_INT("start", 0), A_INT("end", Ho[k])};
            tdd_value *s0 =
                sc(b, TDD_OP_SUB,
                   sc(b, TDD_OP_MUL, tdd_bw_op(b, TDD_OP_ARANGE, NULL, 0, r, 2, TD_I64, xi->dev),
                      (double)st[k]),
                   (double)pd[k]); /* window starts, padded coordinates */
            double lim = a->i[2] ? (double)(H[k] + pd[k]) : (double)H[k];
            td_attr hi = A_F("max", lim), lo = A_F("min", a->i[2] ? -(double)pd[k] : 0.0);
            tdd_value *end = op1a(b, TDD_OP_CLAMP, sc(b, TDD_OP_ADD, s0, (double)ks[k]), &hi, 1);
            div[k] = cast(b, bin(b, TDD_OP_SUB, end, op1a(b, TDD_OP_CLAMP, s0, &lo, 1)), xi->dtype);
        }
        tdd_value *dv = bin(b, TDD_OP_MUL, unsqueeze(b, div[0], -1), div[1]); /* [Ho, Wo] */
        tdd_value *g2 = bin(b, TDD_OP_DIV, reshape(b, g, gs, 4), dv);
        gin[0] =
            reshape(b, conv_input_grad(b, g2, k1, kshape, 1, B, H, Ho, st, pd, one), xi->shape, nd);
        return b->rc;
    }
    case TDD_OP_MAX_POOL2D_BACKWARD: {
        /* linear in grad_output: its gradient picks gg at each window's maximum (the pool
         * again with indices, deterministic, so the forward's); none for the input */
        const tdd_node_in *pi = &n->in[1];
        const int64_t *ks = a->ints[3], *st = a->ints[0], *pd = a->ints[1], *dl = a->ints[2];
        td_attr at[6] = {A_INTS("kernel_size", ks, 2),   A_INTS("stride", st, 2),
                         A_INTS("padding", pd, 2),       A_INTS("dilation", dl, 2),
                         A_B("ceil_mode", a->i[1] != 0), A_B("return_indices", true)};
        tdd_value *o[2] = {NULL, NULL}, *xv = pi->v;
        if (pi->needs_grad) /* piecewise constant in the input */
            gin[1] = zeros_in(b, pi);
        if (!xi->needs_grad || tdd_bw_op_n(b, TDD_OP_MAX_POOL2D, &xv, 1, at, 6, o, 2))
            return b->rc;
        int nd = pi->ndim;
        int64_t fs[4], gs[4];
        for (int d = 0; d < nd - 2; d++)
            fs[d] = gs[d] = pi->shape[d];
        fs[nd - 2] = pi->shape[nd - 2] * pi->shape[nd - 1];
        gs[nd - 2] = xi->shape[nd - 2] * xi->shape[nd - 1];
        tdd_value *in[2] = {reshape(b, g, fs, nd - 1), reshape(b, o[1], gs, nd - 1)};
        td_attr dd = A_INT("dim", -1);
        tdd_value *ga = in[0] && in[1] ? tdd_bw_op(b, TDD_OP_GATHER, in, 2, &dd, 1, 0, NULL) : NULL;
        gin[0] = reshape(b, ga, xi->shape, nd);
        return b->rc;
    }
    case TDD_OP_DROPOUT: {
        double p = a->f[0];
        if (!a->i[0]) {
            gin[0] = g;
        } else if (p >= 1.0) {
            gin[0] = zeros_in(b, xi);
        } else {
            /* Kept elements are the nonzero outputs (an input that was
             * exactly 0 gets gradient 0 here rather than 1/(1-p)). */
            tdd_value *kept = cast(b, sc(b, TDD_OP_NE, n->out[0].alias, 0.0), xi->dtype);
            gin[0] = sc(b, TDD_OP_MUL, bin(b, TDD_OP_MUL, g, kept), 1.0 / (1.0 - p));
        }
        return b->rc;
    }
    default:
        return tdd_bw_fail(b, TD_EUNSUPPORTED_OP, "backward of %s is not implemented",
                           tdd_opdefs[n->op].name);
    }
}

/* index is spread to shape along dim (index is 1-D of length shape[dim]). */
static tdd_value *index_along(tdd_bw *b, tdd_value *idx, int64_t dim, const int64_t *shape, int nd)
{
    int64_t s[TD_MAX_NDIM];
    for (int d = 0; d < nd; d++)
        s[d] = d == dim ? shape[d] : 1;
    return expand(b, reshape(b, idx, s, nd), shape, nd);
}

static tdd_value *scatter_into_zeros(tdd_bw *b, const tdd_node_in *xi, tdd_value *idx,
                                     tdd_value *src, int64_t dim)
{
    tdd_value *in[3] = {zeros_in(b, xi), idx, src};
    td_attr d = A_INT("dim", dim);
    return in[0] && idx && src ? tdd_bw_op(b, TDD_OP_SCATTER_ADD, in, 3, &d, 1, 0, NULL) : NULL;
}

/* x op an int scalar (integer tensors stay integral). */
static tdd_value *sci(tdd_bw *b, tdd_op op, tdd_value *x, int64_t v)
{
    td_attr a = A_INT("other", v);
    return op1a(b, op, x, &a, 1);
}

/* pad in mode reflect/replicate/circular: each output position's gradient goes back to the
 * input position it read (tdd_pad_src), one padded dim at a time, summed by scatter_add. */
static tdd_value *pad_mode_grad(tdd_bw *b, tdd_node *n, tdd_value *g)
{
    const tdd_node_in *xi = &n->in[0];
    int nd = xi->ndim, mode = (int)n->args.i[0];
    int64_t cur[TD_MAX_NDIM];
    memcpy(cur, n->out[0].shape, (size_t)nd * sizeof *cur);
    for (int d = nd - 1; d >= 0 && g; d--) {
        int64_t len = xi->shape[d], before = n->args.ints[0][d];
        int64_t s = mode == 3 ? n->args.ints[1][d] : 0, kept = n->args.ints[2][d];
        if (cur[d] == len && before == 0)
            continue;
        td_attr r[2] = {A_INT("start", -before - s), A_INT("end", cur[d] - before - s)};
        tdd_value *k = tdd_bw_op(b, TDD_OP_ARANGE, NULL, 0, r, 2, TD_I64, xi->dev);
        if (mode == 1) /* (n-1) - |(n-1) - |k|| */
            k = sci(b, TDD_OP_SUB,
                    un(b, TDD_OP_NEG,
                       un(b, TDD_OP_ABS, sci(b, TDD_OP_SUB, un(b, TDD_OP_ABS, k), len - 1))),
                    -(len - 1));
        else if (mode == 2) {
            td_attr cl[2] = {A_INT("min", 0), A_INT("max", len - 1)};
            k = op1a(b, TDD_OP_CLAMP, k, cl, 2);
        } else { /* circular, within the kept range (tdd_pad_at) */
            k = sci(b, TDD_OP_ADD, sci(b, TDD_OP_REMAINDER, k, kept), s);
        }
        tdd_value *idx = index_along(b, k, d, cur, nd);
        int64_t to[TD_MAX_NDIM];
        memcpy(to, cur, sizeof to);
        to[d] = len;
        tdd_value *in[3] = {zeros(b, to, nd, g->t.dtype, xi->dev), idx, g};
        td_attr da = A_INT("dim", d);
        g = in[0] && idx ? tdd_bw_op(b, TDD_OP_SCATTER_ADD, in, 3, &da, 1, 0, NULL) : NULL;
        cur[d] = len;
    }
    return g;
}

static int f_shape(tdd_bw *b, tdd_node *n, tdd_value **gin)
{
    const tdd_opargs *a = &n->args;
    const tdd_node_in *xi = &n->in[0];
    tdd_value *g = n->out[0].grad;
    switch (n->op) {
    case TDD_OP_TRANSPOSE:
        gin[0] = transpose(b, g, n->ex[0], n->ex[1]);
        break;
    case TDD_OP_PERMUTE: {
        int64_t inv[TD_MAX_NDIM];
        for (int d = 0; d < xi->ndim; d++)
            inv[n->ex[d]] = d;
        td_attr at = A_INTS("dims", inv, xi->ndim);
        gin[0] = op1a(b, TDD_OP_PERMUTE, g, &at, 1);
        break;
    }
    case TDD_OP_RESHAPE:
    case TDD_OP_VIEW:
    case TDD_OP_FLATTEN:
    case TDD_OP_SQUEEZE:
    case TDD_OP_UNSQUEEZE:
        gin[0] = reshape(b, g, xi->shape, xi->ndim);
        break;
    case TDD_OP_EXPAND:
    case TDD_OP_CONTIGUOUS:
    case TDD_OP_CLONE:
    case TDD_OP_CAST:
        gin[0] = g; /* sum_to / cast back happen in the caller */
        break;
    case TDD_OP_SLICE: {
        int64_t d = n->ex[0], start = n->ex[1], step = n->ex[2];
        int64_t len = n->out[0].shape[d];
        if (step == 1) {
            /* pad lists pairs from the last dim backwards */
            int64_t pad[2 * TD_MAX_NDIM] = {0};
            int np = 2 * (xi->ndim - (int)d);
            pad[np - 2] = start;
            pad[np - 1] = xi->shape[d] - start - len;
            td_attr at = A_INTS("pad", pad, np);
            gin[0] = op1a(b, TDD_OP_PAD, g, &at, 1);
        } else {
            td_attr r[3] = {A_INT("start", start), A_INT("end", start + len * step),
                            A_INT("step", step)};
            tdd_value *idx = tdd_bw_op(b, TDD_OP_ARANGE, NULL, 0, r, 3, TD_I64, xi->dev);
            gin[0] =
                scatter_into_zeros(b, xi, index_along(b, idx, d, n->out[0].shape, xi->ndim), g, d);
        }
        break;
    }
    case TDD_OP_SPLIT:
    case TDD_OP_CHUNK: {
        tdd_value *parts[TDD_MAX_OP_OUTPUTS];
        for (int k = 0; k < n->n_out; k++)
            parts[k] = n->out[k].grad;
        td_attr d = A_INT("dim", n->ex[0]);
        gin[0] = tdd_bw_op(b, TDD_OP_CAT, parts, n->n_out, &d, 1, 0, NULL);
        break;
    }
    case TDD_OP_CAT:
    case TDD_OP_STACK: {
        int64_t d = a->i[0], off = 0;
        for (int i = 0; i < n->n_in; i++) {
            int64_t len = n->op == TDD_OP_CAT ? n->in[i].shape[d] : 1;
            if (n->in[i].needs_grad) {
                td_attr s[3] = {A_INT("dim", d), A_INT("start", off), A_INT("stop", off + len)};
                tdd_value *p = op1a(b, TDD_OP_SLICE, g, s, 3);
                gin[i] = n->op == TDD_OP_CAT ? p : reshape(b, p, n->in[i].shape, n->in[i].ndim);
            }
            off += len;
        }
        break;
    }
    case TDD_OP_TRIL:
    case TDD_OP_TRIU: {
        td_attr d = A_INT("diagonal", a->i[0]);
        gin[0] = op1a(b, n->op, g, &d, 1);
        break;
    }
    case TDD_OP_PAD: {
        if (a->i[0]) {
            gin[0] = pad_mode_grad(b, n, g);
            break;
        }
        /* Positive padding is cut off the gradient; negative padding (a crop)
         * comes back as zeros. */
        tdd_value *r = g;
        int nd = xi->ndim;
        int64_t back[2 * TD_MAX_NDIM] = {0};
        bool grow = false;
        for (int d = 0; d < nd && r; d++) {
            int64_t before = a->ints[0][d];
            int64_t after = n->out[0].shape[d] - xi->shape[d] - before;
            int64_t lo = before > 0 ? before : 0, hi = after > 0 ? after : 0;
            back[2 * (nd - 1 - d)] = before < 0 ? -before : 0;
            back[2 * (nd - 1 - d) + 1] = after < 0 ? -after : 0;
            grow |= before < 0 || after < 0;
            if (lo == 0 && hi == 0)
                continue;
            td_attr sl[3] = {A_INT("dim", d), A_INT("start", lo),
                             A_INT("stop", n->out[0].shape[d] - hi)};
            r = op1a(b, TDD_OP_SLICE, r, sl, 3);
        }
        if (grow) {
            td_attr pa = A_INTS("pad", back, 2 * nd);
            r = op1a(b, TDD_OP_PAD, r, &pa, 1);
        }
        gin[0] = r;
        break;
    }
    case TDD_OP_GATHER:
        gin[0] = scatter_into_zeros(b, xi, n->in[1].v, g, a->i[0]);
        break;
    case TDD_OP_SORT:
    case TDD_OP_TOPK: {
        /* the values' gradient back to where they came from: the indices again (the sort is
         * deterministic), scattered into the input's shape */
        bool tk = n->op == TDD_OP_TOPK;
        td_attr at[3] = {A_INT(tk ? "k" : "dim", tk ? a->i[2] : a->i[0]),
                         A_INT(tk ? "dim" : "descending", tk ? a->i[0] : a->i[1]),
                         A_B("largest", a->i[1] != 0)};
        tdd_value *x = xi->v, *o[2] = {NULL, NULL};
        if (!g || tdd_bw_op_n(b, n->op, &x, 1, at, tk ? 3 : 2, o, 2))
            break;
        gin[0] = scatter_into_zeros(b, xi, o[1], g, xi->ndim ? a->i[0] : 0);
        break;
    }
    case TDD_OP_SCATTER_ADD: {
        gin[0] = g;
        if (n->in[2].needs_grad) {
            tdd_value *in[2] = {g, n->in[1].v};
            td_attr d = A_INT("dim", a->i[0]);
            gin[2] = tdd_bw_op(b, TDD_OP_GATHER, in, 2, &d, 1, 0, NULL);
        }
        break;
    }
    case TDD_OP_INDEX_SELECT:
        gin[0] = scatter_into_zeros(
            b, xi, index_along(b, n->in[1].v, a->i[0], n->out[0].shape, xi->ndim), g, a->i[0]);
        break;
    case TDD_OP_EMBEDDING: {
        const tdd_node_in *wi = &n->in[1];
        int64_t P = tdd_shape_numel(xi->shape, xi->ndim, INT64_MAX), D = wi->shape[1];
        int64_t p1[2] = {P, 1}, pd[2] = {P, D};
        tdd_value *idx = expand(b, reshape(b, n->in[0].v, p1, 2), pd, 2);
        gin[1] = scatter_into_zeros(b, wi, idx, reshape(b, g, pd, 2), 0);
        break;
    }
    case TDD_OP_WHERE: {
        tdd_value *c = n->in[0].v;
        if (n->in[1].needs_grad)
            gin[1] = bin(b, TDD_OP_MUL, g, cast(b, c, g->t.dtype));
        if (n->in[2].needs_grad)
            gin[2] = bin(b, TDD_OP_MUL, g, cast(b, un(b, TDD_OP_LOGICAL_NOT, c), g->t.dtype));
        break;
    }
    case TDD_OP_MASKED_FILL: {
        tdd_value *in[2] = {g, n->in[1].v};
        td_attr v = A_F("value", 0.0);
        gin[0] = tdd_bw_op(b, TDD_OP_MASKED_FILL, in, 2, &v, 1, 0, NULL);
        if (n->n_in == 3 && n->in[2].needs_grad) /* a value tensor: the filled places' sum */
            gin[2] = bin(b, TDD_OP_MUL, g, cast(b, n->in[1].v, g->t.dtype));
        break;
    }
    case TDD_OP_RELU_BACKWARD:
        /* Linear in its first input; the mask input gets no gradient (PyTorch: zero). */
        gin[0] = bin(b, TDD_OP_RELU_BACKWARD, g, n->in[1].v);
        if (n->in[1].needs_grad)
            gin[1] = zeros_in(b, &n->in[1]);
        break;
    default:
        return tdd_bw_fail(b, TD_EUNSUPPORTED_OP, "backward of %s is not implemented",
                           tdd_opdefs[n->op].name);
    }
    return b->rc;
}

/* max_pool2d's input gradient from its normalised arguments (the node of a max_pool1d seen
 * as max_pool2d, whose attributes are the 1-D ones): max_pool2d_backward, as max_pool2d's
 * grad column calls it. */
static int f_max_pool2d_args(tdd_bw *b, tdd_node *n, tdd_value *g, tdd_value **gin)
{
    const tdd_opargs *a = &n->args;
    const int64_t *ks = a->ints[3], *st = a->ints[0], *pd = a->ints[1], *dl = a->ints[2];
    td_attr at[5] = {A_INTS("kernel_size", ks, 2), A_INTS("stride", st, 2),
                     A_INTS("padding", pd, 2), A_INTS("dilation", dl, 2),
                     A_B("ceil_mode", a->i[1] != 0)};
    tdd_value *in[2] = {g, n->in[0].v};
    if (n->in[0].needs_grad)
        gin[0] = tdd_bw_op(b, TDD_OP_MAX_POOL2D_BACKWARD, in, 2, at, 5, 0, NULL);
    return b->rc;
}

/* max_pool1d/avg_pool1d are max_pool2d/avg_pool2d on [N, C, 1, L] (tdd_pool1d_by_parts) */
static int f_pool1d(tdd_bw *b, tdd_node *n, tdd_value *g, tdd_value **gin)
{
    if (n->op == TDD_OP_MAX_POOL1D)
        return f_unit_row(b, n, g, gin, TDD_OP_MAX_POOL2D, 1, f_max_pool2d_args);
    return f_unit_row(b, n, g, gin, TDD_OP_AVG_POOL2D, 1, f_nn);
}

int tdd_backward_formula(tdd_bw *b, tdd_node *n, tdd_value **gin)
{
    tdd_value *g = n->out[0].grad;
    if (grad_program(n->op))
        return f_program(b, n, g, gin);
    if ((unsigned)n->op < TDD_OP_COUNT && bw_rows[n->op].formula)
        return bw_rows[n->op].formula(b, n, g, gin);
    switch (tdd_opdefs[n->op].kind) {
    case TDD_KIND_BINARY:
        return f_binary(b, n, g, gin);
    case TDD_KIND_UNARY:
        return f_unary(b, n, g, gin);
    case TDD_KIND_REDUCE:
        return f_reduce(b, n, g, gin);
    case TDD_KIND_LINALG:
    case TDD_KIND_NN:
        return f_nn(b, n, g, gin);
    case TDD_KIND_ELEMENT:
    case TDD_KIND_VIEW:
    case TDD_KIND_INDEX:
        return f_shape(b, n, gin);
    case TDD_KIND_CREATE:
        break;
    }
    return tdd_bw_fail(b, TD_EUNSUPPORTED_OP, "backward of %s is not implemented",
                       tdd_opdefs[n->op].name);
}
