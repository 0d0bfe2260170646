/* test_double_backward.c -- integration: td_backward_ex (create_graph, grad-of inputs)
 * through libtensordd against the real daemon: a second derivative in closed form. */
#include <math.h>
#include <string.h>

#include "itest.h"

Suite *it_double_backward_suite(void);

static td_handle up(td_client *c, const double *v, int64_t n, int requires_grad)
{
    td_device d = it_dev("cpu:0");
    td_handle h = 0;
    td_error e;
    int rc = td_upload(c, &d, TD_F64, 1, &n, v, requires_grad, &h, &e);
    ck_assert_msg(rc == 0, "upload: %s: %s", td_err_name(rc), e.message);
    return h;
}

static td_handle op(td_client *c, const char *name, td_handle a, td_handle b)
{
    td_handle in[2] = {a, b};
    td_op_opts o = {0};
    td_error e;
    td_handle h = td_op1(c, name, in, b ? 2 : 1, &o, &e);
    ck_assert_msg(h != 0, "%s: %s", name, e.message);
    return h;
}

static void grad_of(td_client *c, td_handle grads, td_handle t, double *out, size_t n)
{
    td_handle g = 0;
    td_error e;
    int rc = td_grad(c, grads, t, &g, &e);
    ck_assert_msg(rc == 0, "grad: %s: %s", td_err_name(rc), e.message);
    rc = td_download(c, g, out, n * sizeof *out, NULL, &e);
    ck_assert_msg(rc == 0, "download: %s: %s", td_err_name(rc), e.message);
    ck_assert_int_eq(td_release(c, &g, 1, &e), 0);
}

/* y = sum(x^3): dy/dx = 3x^2 with a history, whose sum's gradient is 6x. */
START_TEST(test_second_derivative)
{
    td_client *c = it_client("double-backward");
    double xv[3] = {0.5, -1.0, 2.0}, got[3];
    td_handle x = up(c, xv, 3, 1);
    td_handle y = op(c, "sum", op(c, "mul", op(c, "mul", x, x), x), 0);
    td_handle grads = 0;
    td_error e;
    int rc = td_backward_ex(c, y, 0, TD_BACKWARD_CREATE_GRAPH | TD_BACKWARD_RETAIN_GRAPH, &x, 1,
                            &grads, &e);
    ck_assert_msg(rc == 0, "backward: %s: %s", td_err_name(rc), e.message);
    td_handle g = 0;
    ck_assert_int_eq(td_grad(c, grads, x, &g, &e), 0);
    td_handle gs = op(c, "sum", g, 0);
    td_handle grads2 = 0;
    /* retained: g's graph leads through y's (x*x, saved by the last mul, is one of y's) */
    rc = td_backward_ex(c, gs, 0, TD_BACKWARD_RETAIN_GRAPH, &x, 1, &grads2, &e);
    ck_assert_msg(rc == 0, "second backward: %s: %s", td_err_name(rc), e.message);
    grad_of(c, grads, x, got, 3);
    for (int i = 0; i < 3; i++)
        ck_assert_double_eq_tol(got[i], 3 * xv[i] * xv[i], 1e-12);
    grad_of(c, grads2, x, got, 3);
    for (int i = 0; i < 3; i++)
        ck_assert_double_eq_tol(got[i], 6 * xv[i], 1e-12);

    /* Without create_graph the gradient has no history: NOT_TRACKED. */
    td_handle grads3 = 0, g3 = 0, g3s;
    ck_assert_int_eq(td_backward_ex(c, y, 0, TD_BACKWARD_RETAIN_GRAPH, NULL, 0, &grads3, &e), 0);
    ck_assert_int_eq(td_grad(c, grads3, x, &g3, &e), 0);
    g3s = op(c, "sum", g3, 0);
    ck_assert_int_eq(td_backward_ex(c, g3s, 0, 0, NULL, 0, NULL, &e), TD_ENOT_TRACKED);

    /* Refused before anything is sent: unknown flags, inputs without an array. */
    ck_assert_int_eq(td_backward_ex(c, y, 0, 8u, NULL, 0, NULL, &e), TD_EINVALID_ARGUMENT);
    ck_assert_int_eq(td_backward_ex(c, y, 0, 0, NULL, 2, NULL, &e), TD_EINVALID_ARGUMENT);
    /* An input that is not tracked: the daemon's NOT_TRACKED, naming inputs[0]. */
    td_handle k = up(c, xv, 3, 0);
    ck_assert_int_eq(td_backward_ex(c, y, 0, TD_BACKWARD_RETAIN_GRAPH, &k, 1, NULL, &e),
                     TD_ENOT_TRACKED);
    ck_assert_msg(strstr(e.message, "inputs[0]"), "%s", e.message);
    ck_assert_int_eq(td_sync(c, &e), 0);
    td_close(c);
}
END_TEST

Suite *it_double_backward_suite(void)
{
    Suite *s = suite_create("double_backward");
    TCase *tc = tcase_create("create_graph");
    tcase_add_test(tc, test_second_derivative);
    suite_add_tcase(s, tc);
    return s;
}
