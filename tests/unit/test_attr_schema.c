/* test_attr_schema.c -- the attribute schema (tdd_op_schema in backends/ops_schema.c) held to the
 * code: every op has an entry; every attribute the prepare code reads, over every row of
 * the conformance table and each of its dtypes, is in its op's schema, and every attribute
 * in a schema is read by some row; and tdd_op_prepare refuses an unknown, mistyped or
 * repeated attribute with INVALID_ARGUMENT naming it. */
#include <check.h>
#include <stdio.h>
#include <string.h>

#include "test_conformance.h"

Suite *attr_schema_suite(void);

START_TEST(every_op_has_a_schema)
{
    for (int op = 0; op < TDD_OP_COUNT; op++) {
        const tdd_opschema *s = &tdd_op_schema[op];
        const char *nm = tdd_opdefs[op].name;
        ck_assert_msg(s->inputs != NULL, "op %s has no schema entry (tdd_op_schema, ops_schema.c)",
                      nm);
        ck_assert_msg(s->n_attrs == 0 || s->attrs, "op %s: schema without attributes", nm);
        ck_assert_msg((s->inputs[0] == 0) == (tdd_opdefs[op].max_inputs == 0),
                      "op %s: documented inputs \"%s\" disagree with its arity", nm, s->inputs);
        for (int i = 0; i < s->n_attrs; i++) {
            const tdd_attrdef *a = &s->attrs[i];
            ck_assert_msg(a->name && a->name[0], "op %s: attribute %d has no name", nm, i);
            ck_assert_msg(a->required == (a->def == NULL),
                          "op %s: %s must have a default exactly when optional", nm, a->name);
            ck_assert_ptr_eq(tdd_op_attr((tdd_op)op, a->name), a);
            for (int j = 0; j < i; j++)
                ck_assert_msg(strcmp(s->attrs[j].name, a->name) != 0, "op %s: %s listed twice", nm,
                              a->name);
        }
    }
}
END_TEST

/* ---- every attribute the prepare code reads is in the schema */

static int reads[TDD_OP_COUNT][32]; /* per op: schema index -> times read */
static char stray[40][96];
static int nstray;

static void on_read(tdd_op op, const char *name)
{
    const tdd_attrdef *a = tdd_op_attr(op, name);
    if (a) {
        int i = (int)(a - tdd_op_schema[op].attrs);
        if (i < 32)
            reads[op][i]++;
        return;
    }
    for (int k = 0; k < nstray; k++)
        if (strncmp(stray[k], tdd_opdefs[op].name, strlen(tdd_opdefs[op].name)) == 0 &&
            strstr(stray[k], name))
            return;
    if (nstray < 40)
        snprintf(stray[nstray++], sizeof stray[0], "%s reads '%s'", tdd_opdefs[op].name, name);
}

START_TEST(prepare_reads_only_schema_attributes)
{
    memset(reads, 0, sizeof reads);
    nstray = 0;
    tdd_attr_read_hook = on_read;
    int prepared = 0;
    for (int ci = 0; ci < conf_ncases; ci++) {
        const conf_case *c = &conf_cases[ci];
        const tdd_opdef *def = tdd_op_find(c->op);
        ck_assert_msg(def != NULL, "conformance row names unknown op %s", c->op);
        conf_attrs as;
        conf_parse_attrs(c->attrs, &as);
        const char *dts = c->dtypes[0] ? c->dtypes : "-";
        for (const char *l = dts; *l; l++) {
            td_dtype dt = *l == '-' ? TD_DTYPE_INVALID : conf_dtype_of(*l);
            conf_input in[4];
            int n = conf_inputs(c, dt, 0, in);
            tdd_tensor t[4];
            const tdd_tensor *tp[4];
            for (int k = 0; k < n; k++) {
                memset(&t[k], 0, sizeof t[k]);
                t[k].dtype = in[k].dtype;
                t[k].ndim = in[k].ndim;
                memcpy(t[k].shape, in[k].shape, sizeof t[k].shape);
                tdd_set_contiguous(&t[k]);
                tp[k] = &t[k];
            }
            /* as written; creation ops also without the dtype field (so the "dtype"
             * attribute is read); binary ops also in their scalar form (other=1) */
            for (int form = 0; form < 2; form++) {
                tdd_opreq req = {.attrs = {as.a, as.n},
                                 .dtype = n == 0 && form == 0 ? dt : TD_DTYPE_INVALID};
                int nin = n;
                td_attr sc[CONF_MAX_ATTRS + 1];
                if (form == 1 && def->kind == TDD_KIND_BINARY && n == 2) {
                    memcpy(sc, as.a, as.n * sizeof *sc);
                    sc[as.n] = (td_attr){.name = "other", .kind = TD_ATTR_INT, .i = 1};
                    req.attrs = (tdd_attrs){sc, as.n + 1};
                    nin = 1;
                } else if (form == 1 && n != 0) {
                    continue;
                }
                tdd_opargs args;
                tdd_outdesc od[TDD_MAX_OP_OUTPUTS];
                int nout;
                td_error err;
                int rc =
                    tdd_op_prepare(def->op, tp, nin, &req, INT64_MAX / 2, &args, od, &nout, &err);
                ck_assert_msg(rc == 0, "%s [%s] %s form %d: prepare refused the row: %s", c->op,
                              c->attrs, td_dtype_name(dt), form, err.message);
                prepared++;
            }
            conf_inputs_free(in, n);
        }
    }
    tdd_attr_read_hook = NULL;
    for (int k = 0; k < nstray; k++)
        fprintf(stderr,
                "attr schema: %s, not in its schema (tdd_op_schema, backends/ops_schema.c)\n",
                stray[k]);
    ck_assert_msg(nstray == 0, "%d attribute(s) read by prepare are missing from the schema",
                  nstray);
    /* and the other way: a schema attribute no row's prepare reads is dead or untested */
    int unread = 0;
    for (int op = 0; op < TDD_OP_COUNT; op++)
        for (int i = 0; i < tdd_op_schema[op].n_attrs; i++)
            if (!reads[op][i]) {
                unread++;
                fprintf(stderr, "attr schema: %s's '%s' is never read over the conformance rows\n",
                        tdd_opdefs[op].name, tdd_op_schema[op].attrs[i].name);
            }
    ck_assert_msg(unread == 0, "%d schema attribute(s) never read (stderr)", unread);
    ck_assert_int_gt(prepared, TDD_OP_COUNT);
}
END_TEST

/* ---- the check */

static int prep_attrs(const char *op, const tdd_tensor *a, const td_attr *attrs, size_t n,
                      td_error *err)
{
    const tdd_tensor *in[1] = {a};
    tdd_opreq req = {.attrs = {attrs, n}};
    tdd_opargs args;
    tdd_outdesc od[TDD_MAX_OP_OUTPUTS];
    int nout;
    return tdd_op_prepare(tdd_op_find(op)->op, in, a ? 1 : 0, &req, 1 << 20, &args, od, &nout, err);
}

static tdd_tensor t23(void)
{
    tdd_tensor t;
    memset(&t, 0, sizeof t);
    t.dtype = TD_F32;
    t.ndim = 2;
    t.shape[0] = 2;
    t.shape[1] = 3;
    tdd_set_contiguous(&t);
    return t;
}

START_TEST(unknown_attribute_is_refused)
{
    tdd_tensor x = t23();
    int64_t d0[1] = {0};
    td_attr at[2] = {{.name = "dim", .kind = TD_ATTR_INTS, .ints = d0, .n = 1},
                     {.name = "keepdm", .kind = TD_ATTR_BOOL, .b = 1}};
    td_error err;
    ck_assert_int_eq(prep_attrs("sum", &x, at, 2, &err), TD_EINVALID_ARGUMENT);
    ck_assert_int_eq(err.detail_kind, TD_DETAIL_ARGUMENT);
    ck_assert_str_eq(err.detail.argument.argument, "keepdm");
    ck_assert_str_eq(err.message, "sum takes no attribute 'keepdm' (accepts: dim, keepdim)");
    /* slice's end is stop */
    td_attr sl[3] = {{.name = "dim", .kind = TD_ATTR_INT, .i = 1},
                     {.name = "start", .kind = TD_ATTR_INT, .i = 0},
                     {.name = "end", .kind = TD_ATTR_INT, .i = 64}};
    ck_assert_int_eq(prep_attrs("slice", &x, sl, 3, &err), TD_EINVALID_ARGUMENT);
    ck_assert_str_eq(err.detail.argument.argument, "end");
    ck_assert_ptr_nonnull(strstr(err.message, "slice takes no attribute 'end'"));
    ck_assert_ptr_nonnull(strstr(err.message, "stop"));
    /* an op without attributes says so */
    td_attr r = {.name = "inplace", .kind = TD_ATTR_BOOL, .b = 1};
    ck_assert_int_eq(prep_attrs("relu", &x, &r, 1, &err), TD_EINVALID_ARGUMENT);
    ck_assert_str_eq(err.message, "relu takes no attribute 'inplace' (accepts: none)");
    /* max_pool2d's count_include_pad and avg_pool2d's dilation are not theirs (PyTorch) */
    td_attr mp[2] = {{.name = "kernel_size", .kind = TD_ATTR_INT, .i = 2},
                     {.name = "count_include_pad", .kind = TD_ATTR_BOOL, .b = 0}};
    ck_assert_int_eq(prep_attrs("max_pool2d", &x, mp, 2, &err), TD_EINVALID_ARGUMENT);
    ck_assert_str_eq(err.detail.argument.argument, "count_include_pad");
}
END_TEST

START_TEST(mistyped_attribute_is_refused)
{
    tdd_tensor x = t23();
    td_error err;
    td_attr s = {.name = "dim", .kind = TD_ATTR_STR, .s = "0"};
    ck_assert_int_eq(prep_attrs("sum", &x, &s, 1, &err), TD_EINVALID_ARGUMENT);
    ck_assert_str_eq(err.detail.argument.argument, "dim");
    ck_assert_str_eq(err.message, "sum: attribute 'dim' must be an int or an int list, got string");
    /* a mistyped attribute the op would not read on this path (argmax's keepdim without
     * dim; alpha on add with two inputs is read, but softmax never reads keepdim) */
    td_attr k[2] = {{.name = "dim", .kind = TD_ATTR_INT, .i = 0},
                    {.name = "keepdim", .kind = TD_ATTR_STR, .s = "yes"}};
    ck_assert_int_eq(prep_attrs("argmax", &x, k, 2, &err), TD_EINVALID_ARGUMENT);
    ck_assert_str_eq(err.detail.argument.argument, "keepdim");
    td_attr g = {.name = "approximate", .kind = TD_ATTR_INT, .i = 1};
    ck_assert_int_eq(prep_attrs("gelu", &x, &g, 1, &err), TD_EINVALID_ARGUMENT);
    ck_assert_str_eq(err.detail.argument.argument, "approximate");
    /* what the readers accept still passes: an int for a number, a bool for an int */
    td_attr ok[2] = {{.name = "min", .kind = TD_ATTR_INT, .i = 0},
                     {.name = "max", .kind = TD_ATTR_FLOAT, .f = 1.5}};
    ck_assert_int_eq(prep_attrs("clamp", &x, ok, 2, &err), 0);
}
END_TEST

START_TEST(repeated_attribute_is_refused)
{
    tdd_tensor x = t23();
    td_error err;
    td_attr d[2] = {{.name = "dim", .kind = TD_ATTR_INT, .i = 0},
                    {.name = "dim", .kind = TD_ATTR_INT, .i = 1}};
    ck_assert_int_eq(prep_attrs("softmax", &x, d, 2, &err), TD_EINVALID_ARGUMENT);
    ck_assert_str_eq(err.detail.argument.argument, "dim");
    ck_assert_ptr_nonnull(strstr(err.message, "twice"));
    td_attr nn = {.name = "", .kind = TD_ATTR_INT, .i = 0};
    ck_assert_int_eq(prep_attrs("softmax", &x, &nn, 1, &err), TD_EINVALID_ARGUMENT);
}
END_TEST

START_TEST(creation_ops_take_dtype)
{
    td_error err;
    int64_t shape[2] = {2, 2};
    td_attr z[2] = {{.name = "shape", .kind = TD_ATTR_INTS, .ints = shape, .n = 2},
                    {.name = "dtype", .kind = TD_ATTR_STR, .s = "int32"}};
    for (int op = 0; op < TDD_OP_COUNT; op++)
        if (tdd_opdefs[op].kind == TDD_KIND_CREATE)
            ck_assert_msg(tdd_op_attr((tdd_op)op, "dtype") != NULL, "%s takes no dtype",
                          tdd_opdefs[op].name);
    ck_assert_int_eq(prep_attrs("zeros", NULL, z, 2, &err), 0);
    td_attr bad = {.name = "dtype", .kind = TD_ATTR_INT, .i = 3};
    ck_assert_int_eq(prep_attrs("cast", NULL, &bad, 1, &err), TD_EINVALID_ARGUMENT);
}
END_TEST

Suite *attr_schema_suite(void)
{
    Suite *s = suite_create("attr_schema");
    TCase *tc = tcase_create("schema");
    tcase_add_test(tc, every_op_has_a_schema);
    tcase_add_test(tc, prepare_reads_only_schema_attributes);
    tcase_add_test(tc, unknown_attribute_is_refused);
    tcase_add_test(tc, mistyped_attribute_is_refused);
    tcase_add_test(tc, repeated_attribute_is_refused);
    tcase_add_test(tc, creation_ops_take_dtype);
    suite_add_tcase(s, tc);
    return s;
}
