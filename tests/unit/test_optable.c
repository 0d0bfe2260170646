/* test_optable.c -- every op in the table is found by its name, and nothing else is. */
#include <check.h>
#include <string.h>

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

Suite *optable_suite(void)
{
    Suite *s = suite_create("optable");
    TCase *tc = tcase_create("names");
    tcase_add_test(tc, test_every_op_by_name);
    tcase_add_test(tc, test_unknown_names);
    tcase_add_test(tc, test_names_unique);
    suite_add_tcase(s, tc);
    return s;
}
