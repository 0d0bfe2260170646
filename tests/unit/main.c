/* main.c -- the Check unit-test runner: every suite of tests/unit in one binary. */
#include <check.h>
#include <stdlib.h>

Suite *frame_suite(void);
Suite *errors_suite(void);
Suite *optable_suite(void);
Suite *wire_suite(void);
/* Suites that may not be linked in every build stage. */
__attribute__((weak)) Suite *conformance_suite(void);
__attribute__((weak)) Suite *autograd_suite(void);
__attribute__((weak)) Suite *exec_suite(void);
__attribute__((weak)) Suite *attr_schema_suite(void);
__attribute__((weak)) Suite *shm_suite(void);
__attribute__((weak)) Suite *pool_suite(void);
__attribute__((weak)) Suite *dispatch_suite(void);

int main(void)
{
    SRunner *sr = srunner_create(frame_suite());
    srunner_add_suite(sr, errors_suite());
    srunner_add_suite(sr, optable_suite());
    srunner_add_suite(sr, wire_suite());
    Suite *(*const optional[])(void) = {conformance_suite, autograd_suite, exec_suite,
                                        attr_schema_suite, shm_suite,      pool_suite,
                                        dispatch_suite};
    for (size_t i = 0; i < sizeof optional / sizeof optional[0]; i++)
        if (optional[i])
            srunner_add_suite(sr, optional[i]());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
