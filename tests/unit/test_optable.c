/* test_optable.c -- every op in the table is found by its name, and nothing else is; the
 * composite column names the ops run as other ops. */
#include <check.h>
#include <string.h>

#include "autograd_impl.h"
#include "ops.h"

Suite *optable_suite(void);

START_TEST(test_every_op_by_name)
{
    for (int i = 0; i < TDD_OP_COUNT; i++) {
        const tdd_opdef *d = tdd_op_find(tdd_opdefs[i].name);
        ck_assert_ptr_nonnull(d);
        ck_assert_int_eq(d->op, i);
        ck_assert_int_eq(tdd_opdefs[i].op, i); /* the table is indexed by its enum */
    }
}
END_TEST

START_TEST(test_unknown_names)
{
    static const char *const bad[] = {"", "Add", "add ", "matmul2", "relu\n", "nope"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        ck_assert_ptr_null(tdd_op_find(bad[i]));
    ck_assert_ptr_null(tdd_op_find(NULL));
}
END_TEST

START_TEST(test_names_unique)
{
    for (int i = 0; i < TDD_OP_COUNT; i++)
        for (int j = i + 1; j < TDD_OP_COUNT; j++)
            ck_assert_msg(strcmp(tdd_opdefs[i].name, tdd_opdefs[j].name) != 0, "op name %s twice",
                          tdd_opdefs[i].name);
}
END_TEST

/* The composite column: which calls run as other ops, and what the 1-D pools run as. */
static tdd_opcall seen[4];
static tdd_tensor seen_in[4], seen_out[4];
static int n_seen;

static int record(void *ctx, int ordinal, const tdd_opcall *c)
{
    (void)ctx;
    (void)ordinal;
    if (n_seen < 4) {
        seen[n_seen] = *c;
        seen_in[n_seen] = *c->in[0];
        seen_out[n_seen] = *c->out[0];
        n_seen++;
    }
    return 0;
}

static tdd_tensor tensor_of(int ndim, const int64_t *shape)
{
    tdd_tensor t;
    memset(&t, 0, sizeof t);
    t.dtype = TD_F32;
    t.ndim = ndim;
    memcpy(t.shape, shape, (size_t)ndim * sizeof *shape);
    tdd_set_contiguous(&t);
    return t;
}

START_TEST(test_composite_column)
{
    tdd_opargs a;
    memset(&a, 0, sizeof a);
    static const int64_t xs[3] = {2, 3, 11}, ys[3] = {2, 3, 5};
    tdd_tensor x = tensor_of(3, xs), y = tensor_of(3, ys), lo = tensor_of(3, xs);
    tdd_opcall c = {.args = &a, .n_in = 1, .n_out = 1, .in = {&x}, .out = {&y}};
    /* clamp is a composite only with tensor bounds; an op with kernels is none */
    c.op = TDD_OP_CLAMP;
    ck_assert(tdd_op_composite(&c) == NULL);
    c.n_in = 2;
    c.in[1] = &lo;
    ck_assert(tdd_op_composite(&c) != NULL);
    c.n_in = 1;
    c.op = TDD_OP_MAX_POOL2D;
    ck_assert(tdd_op_composite(&c) == NULL);
    for (int i = 0; i < TDD_OP_COUNT; i++) { /* views and creation ops never are */
        c.op = (tdd_op)i;
        if (tdd_opdefs[i].kind == TDD_KIND_VIEW || tdd_opdefs[i].kind == TDD_KIND_CREATE)
            ck_assert_msg(!tdd_op_composite(&c), "%s: a composite", tdd_opdefs[i].name);
    }
    /* the 1-D pools: the 2-D pool once, on [N, C, 1, L] views of the same storage */
    static const tdd_op pools[2][2] = {{TDD_OP_MAX_POOL1D, TDD_OP_MAX_POOL2D},
                                       {TDD_OP_AVG_POOL1D, TDD_OP_AVG_POOL2D}};
    for (int k = 0; k < 2; k++) {
        c.op = pools[k][0];
        tdd_composite_fn f = tdd_op_composite(&c);
        ck_assert(f != NULL);
        n_seen = 0;
        ck_assert_int_eq(f(&c, record, NULL, 0), 0);
        ck_assert_int_eq(n_seen, 1);
        ck_assert_int_eq(seen[0].op, pools[k][1]);
        ck_assert_ptr_eq(seen[0].args, &a);
        ck_assert_int_eq(seen_in[0].ndim, 4);
        ck_assert_int_eq(seen_in[0].shape[2], 1);
        ck_assert_int_eq(seen_in[0].shape[3], 11);
        ck_assert_int_eq(seen_in[0].strides[3], 1);
        ck_assert_int_eq(seen_out[0].ndim, 4);
        ck_assert_int_eq(seen_out[0].shape[3], 5);
    }
}
END_TEST

/* The grad column: each row's program is a call of an op of the table the backward can make
 * (arguments grad, inK, outK), and what a row saves follows from it. */
START_TEST(test_grad_column)
{
    int n = 0;
    for (int i = 0; i < TDD_OP_COUNT; i++) {
        const char *prog = tdd_op_schema[i].grad;
        if (!prog)
            continue;
        char why[96];
        ck_assert_msg(tdd_grad_program_check(prog, why, sizeof why) == 0, "%s: grad \"%s\": %s",
                      tdd_opdefs[i].name, prog, why);
        n++;
    }
    ck_assert_int_ge(n, 1);
    ck_assert(tdd_formula_saves_inputs(TDD_OP_MAX_POOL2D));
    ck_assert(!tdd_formula_saves_output(TDD_OP_MAX_POOL2D));
    /* pixel_shuffle's call reads only grad: nothing of the forward is kept */
    ck_assert(!tdd_formula_saves_inputs(TDD_OP_PIXEL_SHUFFLE));
    ck_assert(!tdd_formula_saves_output(TDD_OP_PIXEL_UNSHUFFLE));
    char why[96];
    ck_assert_int_eq(tdd_grad_program_check("max_pool2d_backward(grad, in0", why, sizeof why), -1);
    ck_assert_int_eq(tdd_grad_program_check("no_such_op(grad)", why, sizeof why), -1);
    ck_assert_int_eq(tdd_grad_program_check("max_pool2d_backward(grad, x)", why, sizeof why), -1);
    ck_assert_int_eq(tdd_grad_program_check("max_pool2d(grad; a=b)", why, sizeof why), 0);
}
END_TEST

Suite *optable_suite(void)
{
    Suite *s = suite_create("optable");
    TCase *tc = tcase_create("names");
    tcase_add_test(tc, test_every_op_by_name);
    tcase_add_test(tc, test_unknown_names);
    tcase_add_test(tc, test_names_unique);
    tcase_add_test(tc, test_composite_column);
    tcase_add_test(tc, test_grad_column);
    suite_add_tcase(s, tc);
    return s;
}
