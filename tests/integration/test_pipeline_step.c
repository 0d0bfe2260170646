/* test_pipeline_step.c -- integration: a training step with td_backward_ex and
 * td_optimizer_step_ex pipelined (TD_BACKWARD_PIPELINED, TD_STEP_PIPELINED) gives the same
 * bits as the synchronous calls, and a failed backward leaves the parameters untouched,
 * its error reported by the next synchronising call (the first error). */
#include <string.h>

#include "itest.h"

#define STEPS 5

typedef struct {
    float w[4 * 3], b[3], loss[STEPS];
} run_out;

static td_handle up(td_client *c, td_dtype dt, int ndim, const int64_t *shape, const void *data,
                    int requires_grad)
{
    td_device d = it_dev("cpu:0");
    td_handle h = 0;
    td_error e;
    ck_assert_int_eq(td_upload(c, &d, dt, ndim, shape, data, requires_grad, &h, &e), 0);
    return h;
}

static td_handle op2(td_client *c, const char *name, td_handle a, td_handle b)
{
    td_handle in[2] = {a, b};
    td_error e;
    td_handle h = td_op1(c, name, in, 2, NULL, &e);
    ck_assert_msg(h != 0, "%s: %s", name, e.message);
    return h;
}

/* STEPS Adam steps of a 4 -> 3 linear model with cross_entropy on fixed data. */
static void train(int pipelined, run_out *out)
{
    td_client *c = it_client(pipelined ? "step-pipelined" : "step-sync");
    td_error e;
    float w0[12], x[5 * 4];
    uint64_t seed = 0xfeed;
    for (int i = 0; i < 12; i++)
        w0[i] = it_randf(&seed, -0.5f, 0.5f);
    for (int i = 0; i < 20; i++)
        x[i] = it_randf(&seed, -1.0f, 1.0f);
    float b0[3] = {0.1f, -0.2f, 0.05f};
    int64_t y[5] = {0, 2, 1, 2, 0};
    int64_t sw[2] = {4, 3}, sb[1] = {3}, sx[2] = {5, 4}, sy[1] = {5};
    td_handle w = up(c, TD_F32, 2, sw, w0, 1), b = up(c, TD_F32, 1, sb, b0, 1);
    td_handle xs = up(c, TD_F32, 2, sx, x, 0), ys = up(c, TD_I64, 1, sy, y, 0);
    td_handle params[2] = {w, b}, opt = 0;
    td_attr lr = td_attr_float("lr", 0.05);
    ck_assert_int_eq(td_optimizer_create(c, "adam", params, 2, &lr, 1, &opt, &e), 0);
    for (int s = 0; s < STEPS; s++) {
        td_handle logits = op2(c, "add", op2(c, "matmul", xs, w), b);
        td_handle loss = op2(c, "cross_entropy", logits, ys);
        td_handle grads = 0;
        int rc =
            td_backward_ex(c, loss, 0, pipelined ? TD_BACKWARD_PIPELINED : 0, NULL, 0, &grads, &e);
        ck_assert_msg(rc == 0, "backward: %s", e.message);
        rc = td_optimizer_step_ex(c, opt, grads, NULL, 0, pipelined ? TD_STEP_PIPELINED : 0, &e);
        ck_assert_msg(rc == 0, "step: %s", e.message);
        it_download_f32(c, loss, &out->loss[s], 1); /* the step's one synchronising read */
        ck_assert_int_eq(td_release(c, &grads, 1, &e), 0);
    }
    it_download_f32(c, w, out->w, 12);
    it_download_f32(c, b, out->b, 3);
    td_close(c);
}

START_TEST(test_pipelined_step_bit_identical)
{
    run_out sync_run, pipe_run;
    train(0, &sync_run);
    train(1, &pipe_run);
    ck_assert_mem_eq(&sync_run, &pipe_run, sizeof sync_run);
    ck_assert_float_lt(pipe_run.loss[STEPS - 1], pipe_run.loss[0]); /* it trains */
}
END_TEST

START_TEST(test_pipelined_failed_backward_poisons_the_step)
{
    td_client *c = it_client("step-failed-backward");
    td_error e;
    float w0[3] = {1.0f, -2.0f, 0.5f};
    int64_t s3[1] = {3};
    td_handle w = up(c, TD_F32, 1, s3, w0, 1), opt = 0;
    td_attr lr = td_attr_float("lr", 0.5);
    ck_assert_int_eq(td_optimizer_create(c, "sgd", &w, 1, &lr, 1, &opt, &e), 0);
    td_handle y = op2(c, "mul", w, w); /* three elements and no grad_output: refused */
    td_handle grads = 0;
    ck_assert_int_eq(td_backward_ex(c, y, 0, TD_BACKWARD_PIPELINED, NULL, 0, &grads, &e), 0);
    ck_assert_uint_ne(grads, 0);
    ck_assert_int_eq(td_optimizer_step_ex(c, opt, grads, NULL, 0, TD_STEP_PIPELINED, &e), 0);
    float got[3];
    int rc = td_download(c, w, got, sizeof got, NULL, &e); /* reports the pending error */
    ck_assert_msg(rc == TD_EINVALID_ARGUMENT, "first error: %s: %s", td_err_name(rc), e.message);
    ck_assert_ptr_nonnull(strstr(e.message, "grad_output"));
    it_download_f32(c, w, got, 3);
    ck_assert_mem_eq(got, w0, sizeof got); /* the step did not run */
    rc = td_grad(c, grads, w, &y, &e);     /* the Gradients is a poisoned placeholder */
    ck_assert_msg(rc == TD_EPOISONED, "grads: %s: %s", td_err_name(rc), e.message);
    ck_assert_int_eq(td_release(c, &grads, 1, &e), 0);
    ck_assert_int_eq(td_optimizer_step_ex(c, opt, grads, NULL, 0, 0x80, &e),
                     TD_EINVALID_ARGUMENT); /* an unknown flag: refused by the client */
    ck_assert_int_eq(td_sync(c, &e), 0);
    td_close(c);
}
END_TEST

Suite *it_pipeline_step_suite(void)
{
    Suite *s = suite_create("pipeline step");
    TCase *tc = tcase_create("pipelined");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_pipelined_step_bit_identical);
    tcase_add_test(tc, test_pipelined_failed_backward_poisons_the_step);
    suite_add_tcase(s, tc);
    return s;
}
