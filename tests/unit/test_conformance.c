/* test_conformance.c -- every op x dtype x shape set on cpu vs ref (the
 * table in test_conformance_cases.c, tolerances in its compare()), plus
 * tdd_op_prepare's typed errors, view semantics, and PyTorch reference values. */
#include <check.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dtype.h"
#include "test_conformance.h"

Suite *conformance_suite(void);

static conf_backend ref_be, cpu_be, sim_be, cuda_be;
/* Every backend built here is held to ref: cpu always, sim (device memory with
 * ref's kernels: the staged paths), cuda when this machine has a GPU. */
static conf_backend *others[3];
static int nothers;

/* Attribute constructors (the client library's are not linked into this binary). */
static td_attr at_int(const char *name, int64_t v)
{
    return (td_attr){.name = name, .kind = TD_ATTR_INT, .i = v};
}

static td_attr at_float(const char *name, double v)
{
    return (td_attr){.name = name, .kind = TD_ATTR_FLOAT, .f = v};
}

static td_attr at_ints(const char *name, const int64_t *v, size_t n)
{
    return (td_attr){.name = name, .kind = TD_ATTR_INTS, .ints = v, .n = n};
}

static void setup(void)
{
    tdd_backend_config cfg = {.cpu_devices = 1, .threads = 2, .sim_devices = 1};
    ref_be.be = &tdd_backend_ref;
    cpu_be.be = &tdd_backend_cpu;
    sim_be.be = &tdd_backend_sim;
    cuda_be.be = &tdd_backend_cuda;
    ck_assert_int_ge(ref_be.be->init(&cfg, &ref_be.ctx, NULL, 0), 1);
    ck_assert_int_ge(cpu_be.be->init(&cfg, &cpu_be.ctx, NULL, 0), 1);
    ck_assert_int_ge(sim_be.be->init(&cfg, &sim_be.ctx, NULL, 0), 1);
    nothers = 0;
    others[nothers++] = &cpu_be;
    others[nothers++] = &sim_be;
    char why[256];
    if (cuda_be.be->init(&cfg, &cuda_be.ctx, why, sizeof why) > 0 && cuda_be.be->execute)
        others[nothers++] = &cuda_be; /* joins automatically on a GPU machine */
}

static void teardown(void)
{
    for (int i = 0; i < nothers; i++)
        if (others[i]->be->shutdown)
            others[i]->be->shutdown(others[i]->ctx);
    ref_be.be->shutdown(ref_be.ctx);
}

/* One table row: every listed dtype, as written and with non-contiguous inputs. */
START_TEST(case_matches_ref)
{
    const conf_case *c = &conf_cases[_i];
    const char *dts = c->dtypes[0] ? c->dtypes : "-";
    int failures = 0;
    for (int o = 0; o < nothers; o++) {
        conf_backend *other = others[o];
        for (const char *l = dts; *l; l++) {
            td_dtype dt = *l == '-' ? TD_DTYPE_INVALID : conf_dtype_of(*l);
            for (int variant = 0; variant < 2; variant++) {
                conf_result r;
                conf_run(c, dt, variant, &ref_be, other, true, &r);
                /* A backend may decline an op/dtype it does not support (typed); what it
                 * runs must match ref. cpu supports everything. */
                bool declined = !r.supported[1] && other != &cpu_be;
                bool ok =
                    r.prep_rc == 0 && r.rc[0] == 0 && (declined || r.rc[1] == 0) && r.bad == 0;
                if (!ok) {
                    failures++;
                    fprintf(stderr,
                            "conformance: %s [%s] %s variant %d: prep %s, ref %s, %s %s: %s\n",
                            c->op, c->attrs, td_dtype_name(dt), variant, td_err_name(r.prep_rc),
                            td_err_name(r.rc[0]), other->be->name, td_err_name(r.rc[1]), r.msg);
                }
            }
        }
    }
    ck_assert_msg(failures == 0, "%s [%s]: %d failing dtype/layout combinations (see stderr)",
                  c->op, c->attrs, failures);
}
END_TEST

/* ------------------------------------------------------------------ attribute extremes */

/* Every small table row again with each scalar attribute of its op (tdd_op_schema in
 * backends/ops_schema.c) at its extremes, and each ordered pair reversed: prepare either refuses
 * it with a typed error (INVALID_ARGUMENT naming an attribute, RESOURCE_EXHAUSTED, ...)
 * or every backend runs it and agrees with ref (tril/triu with diagonal INT64_MAX
 * and clamp with min > max or a NaN bound differed, and overflowed under UBSan). */
#define GEN_MAX_NUMEL 4096 /* rows with larger inputs are skipped; outputs are bounded too */

static const int64_t gen_ints[] = {0,
                                   1,
                                   -1,
                                   2,
                                   INT32_MAX,
                                   INT32_MIN,
                                   (int64_t)INT32_MAX + 1,
                                   (int64_t)INT32_MIN - 1,
                                   INT64_MAX,
                                   INT64_MIN,
                                   INT64_MAX - 1,
                                   INT64_MIN + 1};
static const double gen_floats[] = {0.0,       -0.0,    1.0,      -1.0,   0.5,    NAN,     INFINITY,
                                    -INFINITY, DBL_MAX, -DBL_MAX, 1e-300, 3.0e38, 65504.0, 1e10};

typedef struct {
    char name[32];
    char kind; /* i, f, b */
} gen_attr;

/* The scalar attributes of op's schema (tdd_op_schema in backends/ops_schema.c: ints, "int or int
 * list", numbers, bools, unless marked no_extremes) and its ordered pairs (indices into at). */
static int gen_parse(tdd_op op, gen_attr *at, int max, int pairs[][2], int *npairs)
{
    const tdd_opschema *sc = &tdd_op_schema[op];
    int n = 0;
    *npairs = 0;
    for (int k = 0; k < sc->n_attrs; k++) {
        const tdd_attrdef *d = &sc->attrs[k];
        char kind =
            d->type == TDD_AT_INT || d->type == TDD_AT_INT_OR_INTS || d->type == TDD_AT_INTS_OR_STR
                ? 'i'
            : d->type == TDD_AT_NUM  ? 'f'
            : d->type == TDD_AT_BOOL ? 'b'
                                     : 0;
        if (!kind || d->no_extremes)
            continue;
        ck_assert_msg(n < max, "%s: too many scalar attributes", tdd_opdefs[op].name);
        snprintf(at[n].name, sizeof at[n].name, "%.31s", d->name);
        at[n++].kind = kind;
    }
    char tok[80];
    for (const char *q = sc->ordered; q && *q;) {
        size_t len = strcspn(q, " ");
        snprintf(tok, sizeof tok, "%.*s", (int)len, q);
        q += len + (q[len] == ' ');
        char *le = strstr(tok, "<=");
        ck_assert_msg(le != NULL, "%s: ordered \"%s\": bad token %s", tdd_opdefs[op].name,
                      sc->ordered, tok);
        *le = 0;
        int a = -1, b = -1;
        for (int k = 0; k < n; k++) {
            if (strcmp(at[k].name, tok) == 0)
                a = k;
            if (strcmp(at[k].name, le + 2) == 0)
                b = k;
        }
        ck_assert_msg(a >= 0 && b >= 0, "%s: ordered \"%s\": pair of unknown attributes",
                      tdd_opdefs[op].name, sc->ordered);
        pairs[*npairs][0] = a;
        pairs[(*npairs)++][1] = b;
    }
    return n;
}

/* The case's attributes with the given ones put in (replacing same-named ones). */
static size_t gen_attrs(const conf_case *c, const td_attr *put, int nput, td_attr *out,
                        conf_attrs *as)
{
    conf_parse_attrs(c->attrs, as);
    size_t n = 0;
    for (size_t k = 0; k < as->n; k++) {
        bool replaced = false;
        for (int j = 0; j < nput; j++)
            replaced = replaced || strcmp(as->a[k].name, put[j].name) == 0;
        if (!replaced)
            out[n++] = as->a[k];
    }
    for (int j = 0; j < nput; j++)
        out[n++] = put[j];
    return n;
}

static bool gen_small(const conf_case *c)
{
    conf_input in[4];
    int n = conf_inputs(c, TD_F32, 0, in);
    bool small = true;
    for (int k = 0; k < n; k++)
        small = small && in[k].numel <= GEN_MAX_NUMEL;
    conf_inputs_free(in, n);
    return small;
}

static int gen_failures, gen_runs;

static const char *gen_attr_str(const td_attr *a, char *buf, size_t len)
{
    if (a->kind == TD_ATTR_INT)
        snprintf(buf, len, "%s=%lld", a->name, (long long)a->i);
    else if (a->kind == TD_ATTR_FLOAT)
        snprintf(buf, len, "%s=%g", a->name, a->f);
    else
        snprintf(buf, len, "%s=%s", a->name, a->b ? "true" : "false");
    return buf;
}

/* Runs case c with put[] on every dtype of the row and every backend; counts failures. */
static void gen_check(const conf_case *c, const td_attr *put, int nput)
{
    td_attr attrs[CONF_MAX_ATTRS + 2];
    conf_attrs as;
    size_t na = gen_attrs(c, put, nput, attrs, &as);
    const char *dts = c->dtypes[0] ? c->dtypes : "-";
    for (int o = 0; o < nothers; o++) {
        for (const char *l = dts; *l; l++) {
            td_dtype dt = *l == '-' ? TD_DTYPE_INVALID : conf_dtype_of(*l);
            conf_result r;
            conf_run_attrs(c, dt, 0, &ref_be, others[o], true, attrs, na, GEN_MAX_NUMEL * 16, &r);
            gen_runs++;
            const char *why = NULL;
            if (r.prep_rc) {
                int code = r.prep_rc;
                if (code != TD_EINVALID_ARGUMENT && code != TD_ESHAPE_MISMATCH &&
                    code != TD_ERESOURCE_EXHAUSTED && code != TD_EUNSUPPORTED_DTYPE &&
                    code != TD_EDTYPE_MISMATCH)
                    why = "prepare refused it with an untyped code";
                else if (code == TD_EINVALID_ARGUMENT &&
                         (r.prep_err.detail_kind != TD_DETAIL_ARGUMENT ||
                          !r.prep_err.detail.argument.argument[0]))
                    why = "INVALID_ARGUMENT names no attribute";
            } else {
                bool declined = !r.supported[1] && others[o] != &cpu_be;
                if (r.bad || (!declined && r.rc[1] != r.rc[0]))
                    why = "differs from ref";
                else if (r.rc[0] != 0 && r.rc[0] != TD_EINVALID_ARGUMENT)
                    why = "ref failed untyped";
            }
            if (why && ++gen_failures <= 40) {
                char b0[64], b1[64] = "";
                gen_attr_str(&put[0], b0, sizeof b0);
                if (nput > 1)
                    gen_attr_str(&put[1], b1, sizeof b1);
                fprintf(stderr,
                        "attr extremes: %s [%s] %s %s %s on %s: %s (prep %s, ref %s, %s %s: "
                        "%s)\n",
                        c->op, c->attrs, b0, b1, td_dtype_name(dt), others[o]->be->name, why,
                        td_err_name(r.prep_rc), td_err_name(r.rc[0]), others[o]->be->name,
                        td_err_name(r.rc[1]), r.msg);
            }
        }
    }
}

static td_attr gen_value(const char *name, char kind, int k, int *count)
{
    int ni = (int)(sizeof gen_ints / sizeof gen_ints[0]);
    int nf = (int)(sizeof gen_floats / sizeof gen_floats[0]);
    if (kind == 'b') {
        *count = 2;
        return (td_attr){.name = name, .kind = TD_ATTR_BOOL, .b = k == 1};
    }
    if (kind == 'i') {
        *count = ni;
        return at_int(name, gen_ints[k]);
    }
    *count = ni + nf; /* a number: ints and floats */
    return k < ni ? at_int(name, gen_ints[k]) : at_float(name, gen_floats[k - ni]);
}

START_TEST(attribute_extremes_match_ref)
{
    const conf_case *c = &conf_cases[_i];
    const tdd_opdef *def = tdd_op_find(c->op);
    ck_assert_ptr_nonnull(def);
    if (!gen_small(c))
        return;
    gen_attr at[8];
    int pairs[4][2], np;
    int n = gen_parse(def->op, at, 8, pairs, &np);
    gen_failures = gen_runs = 0;
    for (int a = 0; a < n; a++) {
        int count = 1;
        for (int k = 0; k < count; k++) {
            td_attr v = gen_value(at[a].name, at[a].kind, k, &count);
            gen_check(c, &v, 1);
        }
    }
    /* ordered pairs reversed (min > max), equal, and at the limits */
    for (int p = 0; p < np; p++) {
        const char *lo = at[pairs[p][0]].name, *hi = at[pairs[p][1]].name;
        td_attr rev[][2] = {{at_int(lo, 1), at_int(hi, 0)},
                            {at_int(lo, 3), at_int(hi, 1)},
                            {at_int(lo, 2), at_int(hi, 2)},
                            {at_int(lo, INT64_MAX), at_int(hi, INT64_MIN)},
                            {at_int(lo, INT64_MIN + 1), at_int(hi, INT64_MAX)},
                            {at_float(lo, 3.0), at_float(hi, 1.0)},
                            {at_float(lo, 0.5), at_float(hi, -0.5)},
                            {at_float(lo, INFINITY), at_float(hi, -INFINITY)},
                            {at_float(lo, NAN), at_float(hi, NAN)}};
        for (size_t k = 0; k < sizeof rev / sizeof rev[0]; k++) {
            if (at[pairs[p][0]].kind == 'i' && rev[k][0].kind == TD_ATTR_FLOAT)
                continue;
            gen_check(c, rev[k], 2);
        }
    }
    if (getenv("GEN_DEBUG"))
        fprintf(stderr, "gen %s [%s]: %d runs\n", c->op, c->attrs, gen_runs);
    ck_assert_msg(gen_failures == 0, "%s [%s]: %d of %d generated attribute cases fail (stderr)",
                  c->op, c->attrs, gen_failures, gen_runs);
}
END_TEST

/* ------------------------------------------------------------------ prepare's typed errors */

static tdd_tensor mk(td_dtype dt, int nd, const int64_t *shape)
{
    tdd_tensor t;
    memset(&t, 0, sizeof t);
    t.dtype = dt;
    t.ndim = nd;
    memcpy(t.shape, shape, (size_t)nd * sizeof *shape);
    tdd_set_contiguous(&t);
    return t;
}

static int prep(const char *op, const tdd_tensor *a, const tdd_tensor *b, const td_attr *attrs,
                size_t nattrs, td_error *err, tdd_outdesc *od, int *n_out)
{
    const tdd_tensor *in[2] = {a, b};
    tdd_opreq req = {.attrs = {attrs, nattrs}};
    tdd_opargs args;
    tdd_outdesc tmp[TDD_MAX_OP_OUTPUTS];
    int n = 0;
    return tdd_op_prepare(tdd_op_find(op)->op, in, a ? (b ? 2 : 1) : 0, &req, 1000000, &args,
                          od ? od : tmp, n_out ? n_out : &n, err);
}

START_TEST(shape_mismatch_names_both_shapes)
{
    int64_t s1[2] = {2, 3}, s2[2] = {4, 3};
    tdd_tensor a = mk(TD_F32, 2, s1), b = mk(TD_F32, 2, s2);
    td_error err;
    ck_assert_int_eq(prep("add", &a, &b, NULL, 0, &err, NULL, NULL), TD_ESHAPE_MISMATCH);
    ck_assert_int_eq(err.code, TD_ESHAPE_MISMATCH);
    ck_assert_int_eq(err.detail_kind, TD_DETAIL_SHAPES);
    ck_assert_int_eq(err.detail.shapes.expected_ndim, 2);
    ck_assert_int_eq(err.detail.shapes.got_ndim, 2);
    ck_assert_int_eq(err.detail.shapes.expected[0], 2);
    ck_assert_int_eq(err.detail.shapes.got[0], 4);
    /* matmul inner dims */
    int64_t m1[2] = {5, 7}, m2[2] = {6, 3};
    a = mk(TD_F32, 2, m1);
    b = mk(TD_F32, 2, m2);
    ck_assert_int_eq(prep("matmul", &a, &b, NULL, 0, &err, NULL, NULL), TD_ESHAPE_MISMATCH);
    ck_assert_int_eq(err.detail.shapes.expected[1], 7);
    ck_assert_int_eq(err.detail.shapes.got[0], 6);
    ck_assert_ptr_nonnull(strstr(err.message, "matmul"));
}
END_TEST

static void expect_arg(const char *op, const tdd_tensor *a, const tdd_tensor *b,
                       const td_attr *attrs, size_t n, const char *argument)
{
    td_error err;
    int rc = prep(op, a, b, attrs, n, &err, NULL, NULL);
    ck_assert_msg(rc == TD_EINVALID_ARGUMENT, "%s: got %s (%s)", op, td_err_name(rc), err.message);
    ck_assert_int_eq(err.detail_kind, TD_DETAIL_ARGUMENT);
    ck_assert_str_eq(err.detail.argument.argument, argument);
}

START_TEST(bad_attributes_name_the_attribute)
{
    int64_t s[2] = {2, 3};
    tdd_tensor a = mk(TD_F32, 2, s);
    td_attr dim5 = at_int("dim", 5);
    expect_arg("sum", &a, NULL, &dim5, 1, "dim");
    expect_arg("softmax", &a, NULL, &dim5, 1, "dim");
    expect_arg("softmax", &a, NULL, NULL, 0, "dim"); /* missing */
    td_attr dup[1] = {at_ints("dim", (const int64_t[]){1, -1}, 2)};
    expect_arg("sum", &a, NULL, dup, 1, "dim");
    td_attr appr = {.name = "approximate", .kind = TD_ATTR_STR, .s = "fast"};
    expect_arg("gelu", &a, NULL, &appr, 1, "approximate");
    td_attr red = {.name = "reduction", .kind = TD_ATTR_STR, .s = "avg"};
    tdd_tensor b = mk(TD_F32, 2, s);
    expect_arg("mse_loss", &a, &b, &red, 1, "reduction");
    td_attr shape = at_ints("shape", (const int64_t[]){-1, -1}, 2);
    expect_arg("reshape", &a, NULL, &shape, 1, "shape");
    td_attr step = at_int("step", 0);
    expect_arg("slice", &a, NULL, &step, 1, "step");
    td_attr p = at_float("p", 1.5);
    expect_arg("dropout", &a, NULL, &p, 1, "p");
    td_attr kind = at_float("dim", 1.0);
    expect_arg("sum", &a, NULL, &kind, 1, "dim");
    expect_arg("add", &a, NULL, NULL, 0, "other");
    /* a non-viewable view names shape */
    tdd_tensor t = a;
    t.strides[0] = 1;
    t.strides[1] = 2;
    td_attr flat = at_ints("shape", (const int64_t[]){6}, 1);
    expect_arg("view", &t, NULL, &flat, 1, "shape");
}
END_TEST

START_TEST(dtype_errors_are_typed)
{
    int64_t s[2] = {2, 3}, n[1] = {2};
    tdd_tensor a = mk(TD_I64, 2, s), f = mk(TD_F32, 2, s), tgt = mk(TD_F32, 1, n);
    td_error err;
    ck_assert_int_eq(prep("mean", &a, NULL, NULL, 0, &err, NULL, NULL), TD_EUNSUPPORTED_DTYPE);
    /* nll_loss: class indices only (cross_entropy also takes float class probabilities) */
    ck_assert_int_eq(prep("nll_loss", &f, &tgt, NULL, 0, &err, NULL, NULL), TD_EDTYPE_MISMATCH);
    ck_assert_int_eq(err.detail.dtypes.target, TD_I64);
    ck_assert_int_eq(err.detail.dtypes.grad, TD_F32);
    tdd_tensor d = mk(TD_F64, 2, s);
    int64_t s3[2] = {3, 2};
    tdd_tensor d2 = mk(TD_F32, 2, s3);
    d2.dtype = TD_F64;
    ck_assert_int_eq(prep("matmul", &f, &d2, NULL, 0, &err, NULL, NULL), TD_EDTYPE_MISMATCH);
    (void)d;
    int64_t big[2] = {100000, 100000};
    tdd_tensor x = mk(TD_F32, 2, s);
    td_attr e = at_ints("shape", big, 2);
    ck_assert_int_eq(prep("expand", &x, NULL, &e, 1, &err, NULL, NULL), TD_ESHAPE_MISMATCH);
    td_attr z = at_ints("shape", big, 2);
    ck_assert_int_eq(prep("zeros", NULL, NULL, &z, 1, &err, NULL, NULL), TD_ERESOURCE_EXHAUSTED);
    /* client numbers never overflow the size arithmetic */
    td_attr ar[2] = {at_int("start", INT64_MIN + 5), at_int("end", INT64_MAX)};
    expect_arg("arange", NULL, NULL, ar, 2, "end");
    td_attr ar2[3] = {at_int("start", 0), at_int("end", 5), at_int("step", 0)};
    expect_arg("arange", NULL, NULL, ar2, 3, "step");
    td_attr ri[2] = {at_int("low", 5), at_int("high", 5)};
    td_attr ri3[3] = {ri[0], ri[1], at_ints("shape", (const int64_t[]){2}, 1)};
    expect_arg("randint", NULL, NULL, ri3, 3, "high");
}
END_TEST

START_TEST(promotion_follows_pytorch)
{
    int64_t s[1] = {3};
    tdd_tensor i32 = mk(TD_I32, 1, s), i64 = mk(TD_I64, 1, s), f32 = mk(TD_F32, 1, s),
               bl = mk(TD_BOOL, 1, s), f64_0d = mk(TD_F64, 0, s), f16 = mk(TD_F16, 1, s),
               bf16 = mk(TD_BF16, 1, s);
    tdd_outdesc od[TDD_MAX_OP_OUTPUTS];
    td_error err;
    td_attr fl = at_float("other", 2.5), in = at_int("other", 2);
    ck_assert_int_eq(prep("add", &i32, &i64, NULL, 0, &err, od, NULL), 0);
    ck_assert_int_eq(od[0].dtype, TD_I64);
    ck_assert_int_eq(prep("add", &i64, NULL, &fl, 1, &err, od, NULL), 0);
    ck_assert_int_eq(od[0].dtype, TD_F32); /* int tensor + Python float -> default float */
    ck_assert_int_eq(prep("add", &i32, NULL, &in, 1, &err, od, NULL), 0);
    ck_assert_int_eq(od[0].dtype, TD_I32); /* a Python int keeps int32 */
    ck_assert_int_eq(prep("add", &f32, &f64_0d, NULL, 0, &err, od, NULL), 0);
    ck_assert_int_eq(od[0].dtype, TD_F32); /* a 0-dim tensor of the same category */
    ck_assert_int_eq(prep("add", &bl, &bl, NULL, 0, &err, od, NULL), 0);
    ck_assert_int_eq(od[0].dtype, TD_BOOL);
    ck_assert_int_eq(prep("add", &f16, &bf16, NULL, 0, &err, od, NULL), 0);
    ck_assert_int_eq(od[0].dtype, TD_F32);
    ck_assert_int_eq(prep("div", &i32, &i32, NULL, 0, &err, od, NULL), 0);
    ck_assert_int_eq(od[0].dtype, TD_F32);
    ck_assert_int_eq(prep("lt", &i32, &f32, NULL, 0, &err, od, NULL), 0);
    ck_assert_int_eq(od[0].dtype, TD_BOOL);
    ck_assert_int_eq(prep("sum", &i32, NULL, NULL, 0, &err, od, NULL), 0);
    ck_assert_int_eq(od[0].dtype, TD_I64);
    ck_assert_int_eq(prep("exp", &i32, NULL, NULL, 0, &err, od, NULL), 0);
    ck_assert_int_eq(od[0].dtype, TD_F32);
    ck_assert_int_eq(prep("sub", &bl, &bl, NULL, 0, &err, od, NULL), TD_EUNSUPPORTED_DTYPE);
}
END_TEST

/* ------------------------------------------------------------------ views */

START_TEST(views_share_storage_with_pytorch_strides)
{
    int64_t s[3] = {2, 3, 4};
    tdd_tensor a = mk(TD_F32, 3, s);
    a.offset = 5;
    tdd_outdesc od[TDD_MAX_OP_OUTPUTS];
    td_error err;
    int n;
    td_attr tr[2] = {at_int("dim0", 0), at_int("dim1", -1)};
    ck_assert_int_eq(prep("transpose", &a, NULL, tr, 2, &err, od, &n), 0);
    ck_assert(od[0].view);
    ck_assert_int_eq(od[0].shape[0], 4);
    ck_assert_int_eq(od[0].strides[0], 1);
    ck_assert_int_eq(od[0].strides[2], 12);
    ck_assert_int_eq(od[0].offset, 5);
    td_attr sl[4] = {at_int("dim", 2), at_int("start", 1), at_int("stop", 4), at_int("step", 2)};
    ck_assert_int_eq(prep("slice", &a, NULL, sl, 4, &err, od, &n), 0);
    ck_assert(od[0].view);
    ck_assert_int_eq(od[0].shape[2], 2);
    ck_assert_int_eq(od[0].strides[2], 2);
    ck_assert_int_eq(od[0].offset, 6);
    td_attr ex = at_ints("shape", (const int64_t[]){5, 2, 3, 4}, 4);
    ck_assert_int_eq(prep("expand", &a, NULL, &ex, 1, &err, od, &n), 0);
    ck_assert_int_eq(od[0].strides[0], 0);
    td_attr us = at_int("dim", -1);
    ck_assert_int_eq(prep("unsqueeze", &a, NULL, &us, 1, &err, od, &n), 0);
    ck_assert_int_eq(od[0].ndim, 4);
    ck_assert_int_eq(od[0].shape[3], 1);
    /* reshape of a transposed tensor cannot be a view: a copy */
    tdd_tensor t = a;
    t.strides[1] = 1;
    t.strides[2] = 3;
    td_attr rs = at_ints("shape", (const int64_t[]){2, 12}, 2);
    ck_assert_int_eq(prep("reshape", &t, NULL, &rs, 1, &err, od, &n), 0);
    ck_assert(!od[0].view);
    /* ...but merging dims that are contiguous is */
    td_attr rs2 = at_ints("shape", (const int64_t[]){6, 4}, 2);
    ck_assert_int_eq(prep("reshape", &a, NULL, &rs2, 1, &err, od, &n), 0);
    ck_assert(od[0].view);
    ck_assert_int_eq(od[0].strides[0], 4);
    td_attr ch[2] = {at_int("chunks", 2), at_int("dim", 1)};
    ck_assert_int_eq(prep("chunk", &a, NULL, ch, 2, &err, od, &n), 0);
    ck_assert_int_eq(n, 2);
    ck_assert_int_eq(od[0].shape[1], 2);
    ck_assert_int_eq(od[1].shape[1], 1);
    ck_assert_int_eq(od[1].offset, 5 + 2 * 4);
}
END_TEST

/* ------------------------------------------------------------------ reference values */

/* Runs op on backend be over one f32 input (values v) and returns output values. */
static int run1(conf_backend *be, const char *op, const int64_t *shape, int nd, const float *v,
                const td_attr *attrs, size_t na, const tdd_tensor *second, double *out, int64_t cap,
                int *rc_exec)
{
    tdd_tensor t = mk(TD_F32, nd, shape);
    tdd_storage st = {.data = (void *)v, .nbytes = 0};
    t.st = &st;
    const tdd_tensor *in[2] = {&t, second};
    tdd_opreq req = {.attrs = {attrs, na}};
    tdd_opargs args;
    tdd_outdesc od[TDD_MAX_OP_OUTPUTS];
    int n_out;
    td_error err;
    int rc = tdd_op_prepare(tdd_op_find(op)->op, in, second ? 2 : 1, &req, 1 << 20, &args, od,
                            &n_out, &err);
    if (rc)
        return rc;
    tdd_tensor o = mk(od[0].dtype, od[0].ndim, od[0].shape);
    int64_t n = tdd_numel(&o);
    tdd_storage ost = {.data = calloc((size_t)n + 1, 8)};
    o.st = &ost;
    tdd_opcall call = {.op = tdd_op_find(op)->op,
                       .args = &args,
                       .n_in = second ? 2 : 1,
                       .n_out = 1,
                       .in = {&t, second},
                       .out = {&o}};
    *rc_exec = be->be->execute(be->ctx, 0, &call);
    for (int64_t i = 0; i < n && i < cap; i++)
        out[i] = tdd_load_f(ost.data, o.dtype, i);
    free(ost.data);
    return 0;
}

START_TEST(values_match_pytorch)
{
    conf_backend *bes[2] = {&ref_be, &cpu_be};
    for (int b = 0; b < 2; b++) {
        double out[8];
        int rc;
        float g[3] = {1.0f, -0.5f, 3.0f};
        ck_assert_int_eq(
            run1(bes[b], "gelu", (const int64_t[]){3}, 1, g, NULL, 0, NULL, out, 8, &rc), 0);
        ck_assert_int_eq(rc, 0);
        /* torch.nn.functional.gelu(torch.tensor([1., -.5, 3.])) */
        ck_assert_double_eq_tol(out[0], 0.8413447, 1e-6);
        ck_assert_double_eq_tol(out[1], -0.1542687, 1e-6);
        ck_assert_double_eq_tol(out[2], 2.9959502, 1e-6);
        float r[4] = {-3.0f, 3.0f, -3.5f, 5.0f};
        td_attr o2 = at_float("other", 2.0);
        ck_assert_int_eq(
            run1(bes[b], "remainder", (const int64_t[]){4}, 1, r, &o2, 1, NULL, out, 8, &rc), 0);
        /* torch.remainder(torch.tensor([-3., 3., -3.5, 5.]), 2) */
        ck_assert_double_eq_tol(out[0], 1.0, 1e-12);
        ck_assert_double_eq_tol(out[1], 1.0, 1e-12);
        ck_assert_double_eq_tol(out[2], 0.5, 1e-12);
        ck_assert_double_eq_tol(out[3], 1.0, 1e-12);
        /* F.cross_entropy(torch.tensor([[1., 2., 3.], [1., 0., -1.]]), torch.tensor([2, 0]))
         * = 0.4076059644; with label_smoothing=0.2: 0.6076059341 */
        float x[6] = {1, 2, 3, 1, 0, -1};
        int64_t tv[2] = {2, 0};
        tdd_tensor tgt = mk(TD_I64, 1, (const int64_t[]){2});
        tdd_storage tst = {.data = tv};
        tgt.st = &tst;
        ck_assert_int_eq(run1(bes[b], "cross_entropy", (const int64_t[]){2, 3}, 2, x, NULL, 0, &tgt,
                              out, 8, &rc),
                         0);
        ck_assert_int_eq(rc, 0);
        ck_assert_double_eq_tol(out[0], 0.4076059644, 1e-6);
        td_attr ls = at_float("label_smoothing", 0.2);
        ck_assert_int_eq(
            run1(bes[b], "cross_entropy", (const int64_t[]){2, 3}, 2, x, &ls, 1, &tgt, out, 8, &rc),
            0);
        ck_assert_double_eq_tol(out[0], 0.6076059341, 1e-6);
        /* a class index out of range is INVALID_ARGUMENT from the kernel, not a crash */
        tv[1] = 7;
        ck_assert_int_eq(run1(bes[b], "cross_entropy", (const int64_t[]){2, 3}, 2, x, NULL, 0, &tgt,
                              out, 8, &rc),
                         0);
        ck_assert_int_eq(rc, TD_EINVALID_ARGUMENT);
        /* torch.var(torch.tensor([1., 2., 3., 4.])) = 1.6667; round half to even */
        float vv[4] = {1, 2, 3, 4};
        ck_assert_int_eq(
            run1(bes[b], "var", (const int64_t[]){4}, 1, vv, NULL, 0, NULL, out, 8, &rc), 0);
        ck_assert_double_eq_tol(out[0], 5.0 / 3.0, 1e-6);
        float rr[4] = {0.5f, 1.5f, 2.5f, -0.5f};
        ck_assert_int_eq(
            run1(bes[b], "round", (const int64_t[]){4}, 1, rr, NULL, 0, NULL, out, 8, &rc), 0);
        ck_assert_double_eq_tol(out[0], 0.0, 1e-12);
        ck_assert_double_eq_tol(out[1], 2.0, 1e-12);
        ck_assert_double_eq_tol(out[2], 2.0, 1e-12);
    }
}
END_TEST

START_TEST(random_ops_are_seeded)
{
    /* same seed -> same values, on ref and cpu alike; another seed differs */
    conf_result r;
    for (int i = 0; i < conf_ncases; i++)
        if (strcmp(conf_cases[i].op, "randn") == 0) {
            conf_run(&conf_cases[i], TD_F32, 0, &ref_be, &cpu_be, true, &r);
            ck_assert_int_eq(r.bad, 0);
            ck_assert_double_eq(r.worst, 0.0); /* bit-identical */
        }
    ck_assert(tdd_rng_u64(1, 0) != tdd_rng_u64(2, 0));
    ck_assert(tdd_rng_uniform(5, 3) == tdd_rng_uniform(5, 3));
}
END_TEST

START_TEST(half_conversions_round_to_nearest_even)
{
    ck_assert_int_eq(tdd_f32_to_f16(1.0f), 0x3c00);
    ck_assert_int_eq(tdd_f32_to_f16(65504.0f), 0x7bff);
    ck_assert_int_eq(tdd_f32_to_f16(65520.0f), 0x7c00);
    ck_assert_int_eq(tdd_f32_to_f16(5.9604645e-8f), 0x0001);
    ck_assert_int_eq(tdd_f32_to_f16(-2.0f), 0xc000);
    ck_assert_int_eq(tdd_f32_to_f16(1.0f + 1.0f / 2048), 0x3c00); /* tie to even */
    for (uint32_t h = 0; h < 0x7c00; h++)
        ck_assert_int_eq(tdd_f32_to_f16(tdd_f16_to_f32((uint16_t)h)), h);
    ck_assert_int_eq(tdd_f32_to_bf16(1.0f), 0x3f80);
    ck_assert(tdd_bf16_to_f32(tdd_f32_to_bf16(3.140625f)) == 3.140625f);
}
END_TEST

/* ------------------------------------------------------------------ generated from the table */

/* Every elementwise op of the op table (kinds UNARY and BINARY, whose expressions live in
 * backends/elementwise.h) on every dtype, from shapes the generator writes itself: plain,
 * broadcast, 0-size, 0-dim, strided and expanded inputs, the scalar form of binary ops, and
 * each again with transposed inputs (variant 1). A new row of the table is tested on every
 * backend without a hand-written case. Attributes: none, or for an op that needs some (clamp)
 * those of its first hand-written row; an op the generator cannot run on any dtype fails. */
static const char *const gen_unary[][1] = {{"x:3,5"}, {"x:0,3"}, {"x:"}, {"x:7S"}, {"x:4,6T"}};
static const char *const gen_binary[][2] = {
    {"x:3,4", "x:3,4"}, {"x:2,1,4", "x:3,1"}, {"x:0,3", "x:3"}, {"x:", "x:5"}, {"x:4,5S", "x:5E"},
};

static const conf_case *first_row(const char *op)
{
    for (int i = 0; i < conf_ncases; i++)
        if (strcmp(conf_cases[i].op, op) == 0)
            return &conf_cases[i];
    return NULL;
}

/* Runs c on every dtype and both variants against each other backend; returns the runs
 * that prepared (an op/dtype prepare refuses with a typed error is not applicable). */
static int gen_table_case(const conf_case *c, int *failures)
{
    static const char dts[] = "sdhbilouc"
                              "w"; /* every dtype */
    int ran = 0;
    for (const char *l = dts; *l; l++) {
        td_dtype dt = conf_dtype_of(*l);
        for (int o = 0; o < nothers; o++) {
            for (int variant = 0; variant < 2; variant++) {
                conf_result r;
                conf_run(c, dt, variant, &ref_be, others[o], true, &r);
                if (r.prep_rc != 0)
                    continue;
                ran++;
                bool declined = !r.supported[1] && others[o] != &cpu_be;
                /* both refusing the same way when they run (integer pow to a negative
                 * power) is agreement too */
                bool ok = declined || (r.rc[0] == r.rc[1] && (r.rc[0] != 0 || r.bad == 0));
                if (!ok) {
                    (*failures)++;
                    fprintf(stderr,
                            "generated: %s (%s%s%s) [%s] %s variant %d: ref %s, %s %s: %s\n", c->op,
                            c->inputs[0], c->inputs[1] ? ", " : "",
                            c->inputs[1] ? c->inputs[1] : "", c->attrs, td_dtype_name(dt), variant,
                            td_err_name(r.rc[0]), others[o]->be->name, td_err_name(r.rc[1]), r.msg);
                }
            }
        }
    }
    return ran;
}

START_TEST(elementwise_ops_from_the_table_match_ref)
{
    tdd_op op = (tdd_op)_i;
    const tdd_opdef *d = &tdd_opdefs[op];
    if (d->kind != TDD_KIND_UNARY && d->kind != TDD_KIND_BINARY)
        return;
    const conf_case *row = first_row(d->name);
    int failures = 0, ran = 0;
    size_t nshapes = d->kind == TDD_KIND_UNARY ? sizeof gen_unary / sizeof gen_unary[0]
                                               : sizeof gen_binary / sizeof gen_binary[0] + 1;
    for (size_t k = 0; k < nshapes; k++) {
        conf_case c = {.op = d->name, .attrs = "", .dtypes = "sdhbilo", .tol = 1};
        if (d->kind == TDD_KIND_UNARY)
            c.inputs[0] = gen_unary[k][0];
        else if (k < nshapes - 1) {
            c.inputs[0] = gen_binary[k][0];
            c.inputs[1] = gen_binary[k][1];
        } else { /* the scalar form: one input and "other" */
            c.inputs[0] = "x:3,4";
            c.attrs = "other=1.5";
        }
        int n = gen_table_case(&c, &failures);
        if (n == 0 && row && row->attrs[0] && k < nshapes - 1) {
            c.attrs = row->attrs; /* an op that needs attributes: its own row's */
            n = gen_table_case(&c, &failures);
        }
        ran += n;
    }
    ck_assert_msg(ran > 0, "%s: the generator could not run it on any dtype or shape", d->name);
    ck_assert_msg(failures == 0, "%s: %d generated cases differ from ref (see stderr)", d->name,
                  failures);
}
END_TEST

Suite *conformance_suite(void)
{
    Suite *s = suite_create("conformance");
    TCase *tc = tcase_create("cpu_vs_ref");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 120);
    tcase_add_loop_test(tc, case_matches_ref, 0, conf_ncases);
    suite_add_tcase(s, tc);
    TCase *gen = tcase_create("attribute_extremes");
    tcase_add_checked_fixture(gen, setup, teardown);
    tcase_set_timeout(gen, 120);
    tcase_add_loop_test(gen, attribute_extremes_match_ref, 0, conf_ncases);
    suite_add_tcase(s, gen);
    TCase *tab = tcase_create("generated_elementwise");
    tcase_add_checked_fixture(tab, setup, teardown);
    tcase_set_timeout(tab, 120);
    tcase_add_loop_test(tab, elementwise_ops_from_the_table_match_ref, 0, TDD_OP_COUNT);
    suite_add_tcase(s, tab);
    TCase *pe = tcase_create("prepare");
    tcase_add_test(pe, shape_mismatch_names_both_shapes);
    tcase_add_test(pe, bad_attributes_name_the_attribute);
    tcase_add_test(pe, dtype_errors_are_typed);
    tcase_add_test(pe, promotion_follows_pytorch);
    tcase_add_test(pe, views_share_storage_with_pytorch_strides);
    suite_add_tcase(s, pe);
    TCase *vals = tcase_create("values");
    tcase_add_checked_fixture(vals, setup, teardown);
    tcase_add_test(vals, values_match_pytorch);
    tcase_add_test(vals, random_ops_are_seeded);
    tcase_add_test(vals, half_conversions_round_to_nearest_even);
    suite_add_tcase(s, vals);
    return s;
}
