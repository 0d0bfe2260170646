/* test_autograd.c -- integration: autodiff in the daemon (backward, Gradients, the
 * grad_replace mismatch matrix, optimizers), against the real daemon (--cpu-devices 2). */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "itest.h"

Suite *it_autograd_suite(void);

/* ---------------------------------------------------------------- helpers */

static td_handle up(td_client *c, const char *dev, td_dtype dt, int ndim, const int64_t *shape,
                    const void *data, int requires_grad)
{
    td_device d = it_dev(dev);
    td_handle h = 0;
    td_error e;
    int rc = td_upload(c, &d, dt, ndim, shape, data, requires_grad, &h, &e);
    ck_assert_msg(rc == 0, "upload: %s: %s", td_err_name(rc), e.message);
    return h;
}

static void down(td_client *c, td_handle h, void *out, size_t nbytes)
{
    td_error e;
    int rc = td_download(c, h, out, nbytes, NULL, &e);
    ck_assert_msg(rc == 0, "download of %llu: %s: %s", (unsigned long long)h, td_err_name(rc),
                  e.message);
}

static td_handle op1(td_client *c, const char *name, td_handle a, td_handle b, const td_attr *attrs,
                     size_t n)
{
    td_handle in[2] = {a, b};
    td_op_opts o = {.attrs = attrs, .nattrs = n};
    td_error e;
    td_handle h = td_op1(c, name, in, b ? 2 : 1, &o, &e);
    ck_assert_msg(h != 0, "%s: %s", name, e.message);
    return h;
}

static td_handle backward(td_client *c, td_handle loss, int retain)
{
    td_handle g = 0;
    td_error e;
    int rc = td_backward(c, loss, 0, retain, &g, &e);
    ck_assert_msg(rc == 0, "backward: %s: %s", td_err_name(rc), e.message);
    return g;
}

/* t's gradient in grads, downloaded (the temporary handle is released). */
static void grad_of(td_client *c, td_handle grads, td_handle t, void *out, size_t nbytes)
{
    td_handle g = 0;
    td_error e;
    int rc = td_grad(c, grads, t, &g, &e);
    ck_assert_msg(rc == 0, "grad: %s: %s", td_err_name(rc), e.message);
    down(c, g, out, nbytes);
    ck_assert_int_eq(td_release(c, &g, 1, &e), 0);
}

static void assert_dev(const td_device *d, const char *want)
{
    char s[40];
    td_device_format(d, s, sizeof s);
    ck_assert_str_eq(s, want);
}

typedef struct {
    uint64_t bytes, tensors;
} mem_snapshot;

static mem_snapshot snapshot(td_client *c)
{
    td_stats st;
    td_error e;
    ck_assert_int_eq(td_sync(c, &e), 0);
    ck_assert_int_eq(td_stats_get(c, &st, &e), 0);
    mem_snapshot m = {0, st.tensors_alive};
    for (size_t i = 0; i < st.ndevices; i++)
        m.bytes += st.memory[i].bytes_in_use;
    return m;
}

/* ---------------------------------------------------------------- the mismatch matrix */

/* After a refused GradReplace: x's gradient is unchanged, the session works,
 * and nothing is left allocated. */
static void after_failure(td_client *c, td_handle grads, td_handle x, const float *want,
                          mem_snapshot before)
{
    float got[6];
    td_error e;
    ck_assert_int_eq(td_ping(c, &e), 0);
    grad_of(c, grads, x, got, sizeof got);
    ck_assert_mem_eq(got, want, sizeof got);
    mem_snapshot now = snapshot(c);
    ck_assert_uint_eq(now.bytes, before.bytes);
    ck_assert_uint_eq(now.tensors, before.tensors);
}

START_TEST(test_grad_replace_matrix)
{
    td_client *c = it_client("grad-replace-matrix");
    td_error e;
    int64_t s23[2] = {2, 3}, s32[2] = {3, 2};
    float xv[6] = {1, -2, 3, 0.5f, -1.5f, 2}, gv[6] = {0.25f, 0.5f, -1, 2, -0.75f, 4};
    double gd[6] = {0};
    td_handle x = up(c, "cpu:0", TD_F32, 2, s23, xv, 1);
    td_handle loss = op1(c, "sum", op1(c, "mul", x, x, NULL, 0), 0, NULL, 0);
    td_handle grads = backward(c, loss, 1);
    float want[6];
    grad_of(c, grads, x, want, sizeof want);
    for (int i = 0; i < 6; i++)
        ck_assert_float_eq(want[i], 2 * xv[i]);

    /* The offered gradients, and a second Gradients handle that is released. */
    td_handle g_ref = up(c, "ref:0", TD_F32, 2, s23, gv, 0);
    td_handle g_cpu1 = up(c, "cpu:1", TD_F32, 2, s23, gv, 0);
    td_handle g_shape = up(c, "cpu:0", TD_F32, 2, s32, gv, 0);
    td_handle g_f64 = up(c, "cpu:0", TD_F64, 2, s23, gd, 0);
    td_handle g_ok = up(c, "cpu:0", TD_F32, 2, s23, gv, 0);
    td_handle untracked = up(c, "cpu:0", TD_F32, 2, s23, xv, 0);
    td_handle gone = backward(c, loss, 1);
    ck_assert_int_eq(td_release(c, &gone, 1, &e), 0);
    mem_snapshot base = snapshot(c);

    /* Backend: the error names cpu:0 (target) and ref:0 (gradient). */
    int rc = td_grad_replace(c, grads, x, g_ref, &e);
    ck_assert_int_eq(rc, TD_EBACKEND_MISMATCH);
    ck_assert_int_eq(e.detail_kind, TD_DETAIL_DEVICES);
    assert_dev(&e.detail.devices.target, "cpu:0");
    assert_dev(&e.detail.devices.grad, "ref:0");
    ck_assert_msg(strstr(e.message, "cpu:0") && strstr(e.message, "ref:0"), "%s", e.message);
    after_failure(c, grads, x, want, base);

    /* Same backend, other ordinal. */
    rc = td_grad_replace(c, grads, x, g_cpu1, &e);
    ck_assert_int_eq(rc, TD_EDEVICE_MISMATCH);
    ck_assert_int_eq(e.detail_kind, TD_DETAIL_DEVICES);
    assert_dev(&e.detail.devices.target, "cpu:0");
    assert_dev(&e.detail.devices.grad, "cpu:1");
    after_failure(c, grads, x, want, base);

    rc = td_grad_replace(c, grads, x, g_shape, &e);
    ck_assert_int_eq(rc, TD_ESHAPE_MISMATCH);
    ck_assert_int_eq(e.detail_kind, TD_DETAIL_SHAPES);
    ck_assert_int_eq(e.detail.shapes.expected_ndim, 2);
    ck_assert_int_eq(e.detail.shapes.expected[0], 2);
    ck_assert_int_eq(e.detail.shapes.expected[1], 3);
    ck_assert_int_eq(e.detail.shapes.got[0], 3);
    ck_assert_int_eq(e.detail.shapes.got[1], 2);
    after_failure(c, grads, x, want, base);

    rc = td_grad_replace(c, grads, x, g_f64, &e);
    ck_assert_int_eq(rc, TD_EDTYPE_MISMATCH);
    ck_assert_int_eq(e.detail_kind, TD_DETAIL_DTYPES);
    ck_assert_int_eq(e.detail.dtypes.target, TD_F32);
    ck_assert_int_eq(e.detail.dtypes.grad, TD_F64);
    after_failure(c, grads, x, want, base);

    rc = td_grad_replace(c, grads, untracked, g_ok, &e);
    ck_assert_int_eq(rc, TD_ENOT_TRACKED);
    after_failure(c, grads, x, want, base);

    rc = td_grad_replace(c, gone, x, g_ok, &e);
    ck_assert_int_eq(rc, TD_EUNKNOWN_HANDLE);
    ck_assert_int_eq(e.detail_kind, TD_DETAIL_HANDLE);
    ck_assert_uint_eq(e.detail.handle.handle, gone);
    after_failure(c, grads, x, want, base);

    rc = td_grad_replace(c, g_ok, x, g_ok, &e);
    ck_assert_int_eq(rc, TD_EWRONG_HANDLE_KIND);
    ck_assert_int_eq(e.detail_kind, TD_DETAIL_HANDLE_KIND);
    ck_assert_int_eq(e.detail.handle_kind.expected, TD_HANDLE_GRADIENTS);
    ck_assert_int_eq(e.detail.handle_kind.got, TD_HANDLE_TENSOR);
    after_failure(c, grads, x, want, base);

    /* A gradient of the right device, dtype and shape made by a failed request (a gather
     * whose indices are out of range): POISONED naming the gather, nothing installed. */
    int64_t bad_iv[6] = {0, 7, 1, 2, 0, 1};
    td_handle bad_idx = up(c, "cpu:0", TD_I64, 2, s23, bad_iv, 0);
    td_attr dim1 = td_attr_int("dim", 1);
    td_handle g_poisoned = op1(c, "gather", g_ok, bad_idx, &dim1, 1);
    uint64_t gather_req = td_last_request_id(c);
    rc = td_sync(c, &e); /* the gather's own error, reported once */
    ck_assert_msg(rc != 0 && e.request_id == gather_req, "gather: %s", td_err_name(rc));
    rc = td_grad_replace(c, grads, x, g_poisoned, &e);
    ck_assert_msg(rc == TD_EPOISONED, "poisoned gradient: %s: %s", td_err_name(rc), e.message);
    ck_assert_int_eq(e.detail_kind, TD_DETAIL_POISONED);
    ck_assert_uint_eq(e.detail.poisoned.origin_request, gather_req);
    ck_assert_uint_eq(e.detail.poisoned.handle, g_poisoned);
    td_handle drop[2] = {g_poisoned, bad_idx};
    ck_assert_int_eq(td_release(c, drop, 2, &e), 0);
    after_failure(c, grads, x, want, base);

    /* Order of the checks: with everything wrong, the Gradients handle is named first. */
    rc = td_grad_replace(c, gone, untracked, g_ref, &e);
    ck_assert_int_eq(rc, TD_EUNKNOWN_HANDLE);
    rc = td_grad_replace(c, grads, untracked, g_ref, &e);
    ck_assert_int_eq(rc, TD_ENOT_TRACKED);
    after_failure(c, grads, x, want, base);
    /* ... the dtype before the shape, and a poisoned gradient's mismatches before its
     * poison (docs/protocol.md, GradReplace). */
    int64_t s3[1] = {3};
    td_handle g_f64_3 = up(c, "cpu:0", TD_F64, 1, s3, gd, 0);
    rc = td_grad_replace(c, grads, x, g_f64_3, &e);
    ck_assert_int_eq(rc, TD_EDTYPE_MISMATCH);
    int64_t s22[2] = {2, 2}, bad22[4] = {0, 9, 1, 2};
    td_handle idx22 = up(c, "cpu:0", TD_I64, 2, s22, bad22, 0);
    td_handle g_poisoned22 = op1(c, "gather", g_ok, idx22, &dim1, 1);
    ck_assert_int_ne(td_sync(c, &e), 0);
    rc = td_grad_replace(c, grads, x, g_poisoned22, &e);
    ck_assert_msg(rc == TD_ESHAPE_MISMATCH, "poisoned (2, 2) gradient: %s", td_err_name(rc));
    td_handle drop2[3] = {g_f64_3, idx22, g_poisoned22};
    ck_assert_int_eq(td_release(c, drop2, 3, &e), 0);
    after_failure(c, grads, x, want, base);

    /* A valid replace is what Grad returns and what the optimizer uses. */
    ck_assert_int_eq(td_grad_replace(c, grads, x, g_ok, &e), 0);
    float got[6];
    grad_of(c, grads, x, got, sizeof got);
    ck_assert_mem_eq(got, gv, sizeof got);
    td_attr lr = td_attr_float("lr", 0.5);
    td_handle opt = 0;
    ck_assert_int_eq(td_optimizer_create(c, "sgd", &x, 1, &lr, 1, &opt, &e), 0);
    rc = td_optimizer_step(c, opt, grads, &e);
    ck_assert_msg(rc == 0, "step: %s: %s", td_err_name(rc), e.message);
    down(c, x, got, sizeof got);
    for (int i = 0; i < 6; i++)
        ck_assert_float_eq(got[i], xv[i] + (-0.5f) * gv[i]);
    /* The same step as queued ops (the path of non-host devices): the same bits. */
    td_attr fe[2] = {lr, td_attr_bool("foreach", 1)};
    ck_assert_int_eq(td_optimizer_create(c, "sgd", &x, 1, fe, 2, &opt, &e), 0);
    rc = td_optimizer_step(c, opt, grads, &e);
    ck_assert_msg(rc == 0, "foreach step: %s: %s", td_err_name(rc), e.message);
    float again[6];
    down(c, x, again, sizeof again);
    for (int i = 0; i < 6; i++)
        ck_assert_float_eq(again[i], got[i] + (-0.5f) * gv[i]);
    td_close(c);
}
END_TEST

/* Backward's own checks, typed. */
START_TEST(test_backward_errors)
{
    td_client *c = it_client("backward-errors");
    td_error e;
    int64_t s3[1] = {3};
    float v[3] = {1, 2, 3};
    td_handle x = up(c, "cpu:0", TD_F32, 1, s3, v, 1);
    td_handle plain = up(c, "cpu:0", TD_F32, 1, s3, v, 0);
    td_handle y = op1(c, "mul", x, x, NULL, 0), g = 0;
    /* Not a scalar and no grad_output. */
    ck_assert_int_eq(td_backward(c, y, 0, 0, &g, &e), TD_EINVALID_ARGUMENT);
    /* Nothing to differentiate. */
    ck_assert_int_eq(td_backward(c, op1(c, "sum", plain, 0, NULL, 0), 0, 0, &g, &e),
                     TD_ENOT_TRACKED);
    /* grad_output on the wrong device / of the wrong shape. */
    td_handle go1 = up(c, "cpu:1", TD_F32, 1, s3, v, 0);
    ck_assert_int_eq(td_backward(c, y, go1, 0, &g, &e), TD_EDEVICE_MISMATCH);
    int64_t s2[1] = {2};
    td_handle go2 = up(c, "cpu:0", TD_F32, 1, s2, v, 0);
    ck_assert_int_eq(td_backward(c, y, go2, 0, &g, &e), TD_ESHAPE_MISMATCH);
    /* A valid grad_output: d(sum(go * x*x))/dx = 2 x go. */
    td_handle go = up(c, "cpu:0", TD_F32, 1, s3, v, 0);
    ck_assert_int_eq(td_backward(c, y, go, 0, &g, &e), 0);
    float got[3];
    grad_of(c, g, x, got, sizeof got);
    for (int i = 0; i < 3; i++)
        ck_assert_float_eq(got[i], 2 * v[i] * v[i]);
    /* The graph was freed: a second pass is refused, typed. */
    td_handle g2 = 0;
    ck_assert_int_eq(td_backward(c, y, go, 0, &g2, &e), TD_EINVALID_ARGUMENT);
    ck_assert_str_eq(e.detail.argument.argument, "retain_graph");
    /* Grad of a tensor with no gradient; GradRemove takes it out. */
    ck_assert_int_eq(td_grad(c, g, plain, &g2, &e), TD_ENOT_TRACKED);
    ck_assert_int_eq(td_grad_remove(c, g, x, &g2, &e), 0);
    ck_assert_int_eq(td_grad(c, g, x, &g2, &e), TD_EINVALID_ARGUMENT);
    ck_assert_int_eq(td_ping(c, &e), 0);
    td_close(c);
}
END_TEST

/* A tensor used several times accumulates; retain_graph allows a second pass;
 * detach and no-grad mode cut the graph. */
START_TEST(test_accumulate_retain_detach)
{
    td_client *c = it_client("accumulate");
    td_error e;
    int64_t s4[1] = {4};
    float v[4] = {0.5f, -1, 2, 3};
    td_handle x = up(c, "cpu:0", TD_F32, 1, s4, v, 1);
    /* loss = sum(x*x + x*3) -> 2x + 3 */
    td_attr three = td_attr_float("other", 3.0);
    td_handle t =
        op1(c, "add", op1(c, "mul", x, x, NULL, 0), op1(c, "mul", x, 0, &three, 1), NULL, 0);
    td_handle loss = op1(c, "sum", t, 0, NULL, 0);
    float got[4];
    for (int pass = 0; pass < 2; pass++) {
        td_handle g = backward(c, loss, 1);
        grad_of(c, g, x, got, sizeof got);
        for (int i = 0; i < 4; i++)
            ck_assert_float_eq(got[i], 2 * v[i] + 3);
        td_release(c, &g, 1, &e);
    }
    /* Releasing every intermediate handle keeps the graph's data alive. */
    td_handle dead[1] = {t};
    td_release(c, dead, 1, &e);
    td_handle g = backward(c, loss, 0);
    grad_of(c, g, x, got, sizeof got);
    ck_assert_float_eq(got[1], 1.0f);

    /* detach: d has x's values but no history: d(sum(d * x))/dx = d. */
    td_handle d = op1(c, "detach", x, 0, NULL, 0);
    td_tensor_info info;
    ck_assert_int_eq(td_describe(c, d, &info, &e), 0);
    ck_assert_int_eq(info.requires_grad, 0);
    g = backward(c, op1(c, "sum", op1(c, "mul", d, x, NULL, 0), 0, NULL, 0), 0);
    grad_of(c, g, x, got, sizeof got);
    ck_assert_mem_eq(got, v, sizeof v);

    /* No-grad mode records nothing. */
    ck_assert_int_eq(td_set_grad_enabled(c, 0, &e), 0);
    td_handle nl = op1(c, "sum", op1(c, "mul", x, x, NULL, 0), 0, NULL, 0);
    td_handle g3 = 0;
    ck_assert_int_eq(td_backward(c, nl, 0, 0, &g3, &e), TD_ENOT_TRACKED);
    ck_assert_int_eq(td_set_grad_enabled(c, 1, &e), 0);
    td_close(c);
}
END_TEST

/* ToDevice stays in the graph: the gradient comes back to the source device. */
START_TEST(test_to_device_gradient)
{
    td_client *c = it_client("to-device");
    td_error e;
    int64_t s3[1] = {3};
    float v[3] = {1, -2, 4};
    td_handle x = up(c, "cpu:0", TD_F32, 1, s3, v, 1);
    td_device d1 = it_dev("cpu:1"), r0 = it_dev("ref:0");
    td_handle y = 0, z = 0;
    ck_assert_int_eq(td_to_device(c, x, &d1, &y, &e), 0);
    ck_assert_int_eq(td_to_device(c, y, &r0, &z, &e), 0);
    td_handle g = backward(c, op1(c, "sum", op1(c, "mul", z, z, NULL, 0), 0, NULL, 0), 0);
    td_handle gx = 0;
    ck_assert_int_eq(td_grad(c, g, x, &gx, &e), 0);
    td_tensor_info info;
    ck_assert_int_eq(td_describe(c, gx, &info, &e), 0);
    assert_dev(&info.device, "cpu:0");
    float got[3];
    down(c, gx, got, sizeof got);
    for (int i = 0; i < 3; i++)
        ck_assert_float_eq(got[i], 2 * v[i]);
    td_close(c);
}
END_TEST

/* OptimizerCreate is asynchronous: its typed errors surface at the next sync;
 * a step with the wrong handles is refused and changes nothing. */
START_TEST(test_optimizer_errors)
{
    td_client *c = it_client("optimizer-errors");
    td_error e;
    int64_t s2[1] = {2};
    float v[2] = {1, 2}, got[2];
    td_handle p = up(c, "cpu:0", TD_F32, 1, s2, v, 1), plain = up(c, "cpu:0", TD_F32, 1, s2, v, 0);
    td_handle nonleaf = op1(c, "mul", p, p, NULL, 0), o = 0;
    td_attr lr = td_attr_float("lr", 0.1);
    struct {
        const char *kind;
        td_handle param;
        td_attr attrs[2];
        size_t n;
        int code;
    } bad[] = {
        {"sgd", plain, {lr}, 1, TD_ENOT_TRACKED},
        {"sgd", nonleaf, {lr}, 1, TD_EINVALID_ARGUMENT},
        {"lbfgs", p, {lr}, 1, TD_EINVALID_ARGUMENT},
        {"sgd", p, {td_attr_bool("nesterov", 1), lr}, 2, TD_EINVALID_ARGUMENT},
        {"sgd", p, {td_attr_float("momentum", 0.9)}, 1, TD_EINVALID_ARGUMENT}, /* no lr */
        {"adam", p, {td_attr_float("beta1", 1.0)}, 1, TD_EINVALID_ARGUMENT},
        {"sgd", p, {td_attr_bool("amsgrad", 1), lr}, 2, TD_EINVALID_ARGUMENT}, /* Adam's only */
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ck_assert_int_eq(
            td_optimizer_create(c, bad[i].kind, &bad[i].param, 1, bad[i].attrs, bad[i].n, &o, &e),
            0);
        ck_assert_msg(td_sync(c, &e) == bad[i].code, "case %zu: got %s (%s)", i,
                      td_err_name(e.code), e.message);
        /* The handle is bound to a placeholder of the failed create. */
        ck_assert_int_eq(td_optimizer_step(c, o, o, &e), TD_EPOISONED);
        ck_assert_int_eq(td_release(c, &o, 1, &e), 0);
    }
    ck_assert_int_eq(td_optimizer_create(c, "adam", &p, 1, &lr, 1, &o, &e), 0);
    td_handle g = backward(c, op1(c, "sum", nonleaf, 0, NULL, 0), 0);
    ck_assert_int_eq(td_optimizer_step(c, g, o, &e), TD_EWRONG_HANDLE_KIND);
    ck_assert_int_eq(td_optimizer_step(c, o, p, &e), TD_EWRONG_HANDLE_KIND);
    down(c, p, got, sizeof got);
    ck_assert_mem_eq(got, v, sizeof v);
    /* A gradient replaced by one of another dtype cannot get in (GradReplace
     * refuses it), so the step runs: Adam's first step moves by lr * sign(g). */
    ck_assert_int_eq(td_optimizer_step(c, o, g, &e), 0);
    down(c, p, got, sizeof got);
    for (int i = 0; i < 2; i++)
        ck_assert_msg(fabsf(got[i] - (v[i] - 0.1f)) < 1e-6f, "p[%d] = %g", i, got[i]);
    td_close(c);
}
END_TEST

/* td_optimizer_step_attrs: RMSprop's lr changed for its second step (the state kept: the
 * square average goes on from the first step), and a refused option steps nothing.
 * p = [1, 2], loss sum(p): g = 1. Step 1 (lr 0.1, alpha 0.99): square_avg 0.01, p -= 0.1 *
 * 1 / (0.1 + 1e-8). Step 2 at lr 0.01: square_avg 0.0199, p -= 0.01 / sqrt(0.0199). */
START_TEST(test_optimizer_step_attrs)
{
    td_client *c = it_client("optimizer-step-attrs");
    td_error e;
    int64_t s2[1] = {2};
    float v[2] = {1, 2}, got[2];
    td_handle p = up(c, "cpu:0", TD_F32, 1, s2, v, 1), o = 0;
    td_attr lr = td_attr_float("lr", 0.1);
    ck_assert_int_eq(td_optimizer_create(c, "rmsprop", &p, 1, &lr, 1, &o, &e), 0);
    td_handle g = backward(c, op1(c, "sum", p, 0, NULL, 0), 0);
    ck_assert_int_eq(td_optimizer_step(c, o, g, &e), 0);
    td_attr bad[2] = {td_attr_float("lr", 0.01), td_attr_float("alpha", -1.0)};
    ck_assert_int_eq(td_optimizer_step_attrs(c, o, g, bad, 2, &e), TD_EINVALID_ARGUMENT);
    td_attr other = td_attr_float("momentum", 0.5); /* sgd's and rmsprop's, not adagrad's */
    td_attr lr2 = td_attr_float("lr", 0.01);
    ck_assert_int_eq(td_optimizer_step_attrs(c, o, g, &lr2, 1, &e), 0);
    down(c, p, got, sizeof got);
    double step2 = 0.01 / sqrt(0.0199);
    for (int i = 0; i < 2; i++) {
        double want = v[i] - 0.1 / (0.1 + 1e-8) - step2;
        ck_assert_msg(fabs(got[i] - want) < 1e-5, "p[%d] = %g, want %g", i, got[i], want);
    }
    td_handle a = 0;
    ck_assert_int_eq(td_optimizer_create(c, "adagrad", &p, 1, &lr, 1, &a, &e), 0);
    ck_assert_int_eq(td_optimizer_step_attrs(c, a, g, &other, 1, &e), TD_EINVALID_ARGUMENT);
    td_close(c);
}
END_TEST

/* td_optimizer_state / td_optimizer_load_state: Adam's moments after two steps with
 * gradient 1 (exp_avg 1 - beta1^2, exp_avg_sq 1 - beta2^2), carried into a second
 * optimizer; a load that does not fit changes nothing. */
START_TEST(test_optimizer_state)
{
    td_client *c = it_client("optimizer-state");
    td_error e;
    int64_t s2[1] = {2}, steps[1];
    float v[2] = {1, 2}, m[2], sq[2];
    td_handle p = up(c, "cpu:0", TD_F32, 1, s2, v, 1), o = 0, o2 = 0, bufs[3];
    td_attr lr = td_attr_float("lr", 0.1);
    ck_assert_int_eq(td_optimizer_create(c, "adam", &p, 1, &lr, 1, &o, &e), 0);
    ck_assert_int_eq(td_optimizer_state(c, o, 1, steps, bufs, &e), 0);
    ck_assert(steps[0] == 0 && !bufs[0] && !bufs[1] && !bufs[2]); /* no state yet */
    for (int i = 0; i < 2; i++) {
        td_handle g = backward(c, op1(c, "sum", p, 0, NULL, 0), 0);
        ck_assert_int_eq(td_optimizer_step(c, o, g, &e), 0);
        ck_assert_int_eq(td_release(c, &g, 1, &e), 0);
    }
    ck_assert_int_eq(td_optimizer_state(c, o, 1, steps, bufs, &e), 0);
    ck_assert(steps[0] == 2 && bufs[0] && bufs[1] && !bufs[2]);
    down(c, bufs[0], m, sizeof m);
    down(c, bufs[1], sq, sizeof sq);
    for (int i = 0; i < 2; i++) {
        ck_assert_msg(fabsf(m[i] - 0.19f) < 1e-6f, "exp_avg %g", m[i]);
        ck_assert_msg(fabsf(sq[i] - 0.001999f) < 1e-7f, "exp_avg_sq %g", sq[i]);
    }
    int64_t zero = 0;
    ck_assert_int_eq(td_optimizer_state(c, o, 2, steps, bufs + 0, &e), TD_EINVALID_ARGUMENT);
    ck_assert_int_eq(td_optimizer_create(c, "adam", &p, 1, &lr, 1, &o2, &e), 0);
    td_handle none[3] = {0, 0, 0};
    ck_assert_int_eq(td_optimizer_load_state(c, o2, 1, steps, none, &e), TD_EINVALID_ARGUMENT);
    ck_assert_int_eq(td_optimizer_load_state(c, o2, 1, &zero, bufs, &e), TD_EINVALID_ARGUMENT);
    ck_assert_int_eq(td_optimizer_load_state(c, o2, 1, steps, bufs, &e), 0);
    ck_assert_int_eq(td_release(c, bufs, 2, &e), 0);
    ck_assert_int_eq(td_optimizer_state(c, o2, 1, steps, bufs, &e), 0);
    ck_assert(steps[0] == 2 && bufs[0] && bufs[1] && !bufs[2]);
    float m2[2];
    down(c, bufs[0], m2, sizeof m2);
    ck_assert_mem_eq(m2, m, sizeof m);
    td_close(c);
}
END_TEST

/* Four SGD steps on w, loss = sum(tanh(w * x)) for a new x each step, sent one by one or
 * recorded on the first step (td_graph_begin .. td_graph_end) and replayed: w after. */
static void sgd_steps(td_client *c, int replay, float *w_out)
{
    td_error e;
    int64_t s3[1] = {3};
    float w0[3] = {0.5f, -1.0f, 2.0f};
    td_handle w = up(c, "cpu:0", TD_F32, 1, s3, w0, 1), o = 0, graph = 0;
    td_attr lr = td_attr_float("lr", 0.1);
    ck_assert_int_eq(td_optimizer_create(c, "sgd", &w, 1, &lr, 1, &o, &e), 0);
    for (int k = 0; k < 4; k++) {
        float xv[3] = {1.0f + (float)k, 2.0f - (float)k, 0.5f * (float)k};
        td_handle x = up(c, "cpu:0", TD_F32, 1, s3, xv, 0);
        if (graph) {
            ck_assert_int_eq(td_replay(c, graph, &x, 1, &e), 0);
        } else {
            if (replay)
                ck_assert_int_eq(td_graph_begin(c, &x, 1, &e), 0);
            td_handle t[3];
            t[0] = op1(c, "mul", w, x, NULL, 0);
            t[1] = op1(c, "tanh", t[0], 0, NULL, 0);
            t[2] = op1(c, "sum", t[1], 0, NULL, 0);
            td_handle g = backward(c, t[2], 0);
            ck_assert_int_eq(td_optimizer_step(c, o, g, &e), 0);
            ck_assert_int_eq(td_release(c, t, 3, &e), 0); /* held back while recording */
            ck_assert_int_eq(td_release(c, &g, 1, &e), 0);
            if (replay)
                ck_assert_int_eq(td_graph_end(c, &graph, &e), 0);
        }
        ck_assert_int_eq(td_release(c, &x, 1, &e), 0);
    }
    down(c, w, w_out, 3 * sizeof *w_out);
    if (graph) { /* a replay with the wrong input is the session's next error, typed */
        int64_t s2[1] = {2};
        td_handle bad = up(c, "cpu:0", TD_F32, 1, s2, w0, 0);
        ck_assert_int_eq(td_replay(c, graph, &bad, 1, &e), 0);
        ck_assert_int_eq(td_sync(c, &e), TD_ESHAPE_MISMATCH);
        ck_assert_int_eq(td_graph_end(c, NULL, &e), TD_EINVALID_ARGUMENT); /* none begun */
    }
}

/* A recurrence total = state + x: the state, made before the recording, is named as an
 * input at its end (td_graph_end_with); each replay is given the previous replay's total
 * in its place (the one recorded op reads it and binds it again). A tensor made before the
 * recording and released inside it stays released, not released again by a replay. */
START_TEST(test_graph_end_inputs)
{
    td_client *c = it_client("graph_end_inputs");
    td_error e;
    int64_t s3[1] = {3};
    float z[3] = {0, 0, 0}, one[3] = {1, 1, 1};
    td_handle state = up(c, "cpu:0", TD_F32, 1, s3, z, 0);
    td_handle x0 = up(c, "cpu:0", TD_F32, 1, s3, one, 0);
    td_handle before = up(c, "cpu:0", TD_F32, 1, s3, one, 0), graph = 0;
    ck_assert_int_eq(td_graph_begin(c, &x0, 1, &e), 0);
    td_handle total = op1(c, "add", state, x0, NULL, 0);
    td_handle tmp = op1(c, "mul", total, before, NULL, 0);
    ck_assert_int_eq(td_release(c, &tmp, 1, &e), 0);    /* made inside: recorded */
    ck_assert_int_eq(td_release(c, &before, 1, &e), 0); /* from before: after GraphEnd */
    /* (total: bound by the recording itself) */
    ck_assert_int_eq(td_graph_end_with(c, &graph, &total, 1, &e), TD_EINVALID_ARGUMENT);
    ck_assert(strstr(e.message, "bound by the graph") != NULL);
    before = up(c, "cpu:0", TD_F32, 1, s3, one, 0);
    ck_assert_int_eq(td_graph_begin(c, &x0, 1, &e), 0);
    total = op1(c, "add", state, x0, NULL, 0);
    ck_assert_int_eq(td_release(c, &before, 1, &e), 0); /* not recorded: no replay repeats it */
    ck_assert_int_eq(td_graph_end_with(c, &graph, &state, 1, &e), 0);
    for (int k = 2; k <= 4; k++) {
        float xv[3] = {(float)k, (float)k, (float)k};
        td_handle in[2] = {up(c, "cpu:0", TD_F32, 1, s3, xv, 0), total};
        ck_assert_int_eq(td_replay(c, graph, in, 2, &e), 0);
        ck_assert_int_eq(td_release(c, in, 1, &e), 0);
    }
    float got[3];
    down(c, total, got, sizeof got);
    for (int i = 0; i < 3; i++)
        ck_assert(got[i] == 1.0f + 2 + 3 + 4);
    ck_assert_int_eq(td_sync(c, &e), 0);
    td_close(c);
}
END_TEST

START_TEST(test_graph_replay)
{
    td_client *c = it_client("graph");
    float one[3], rec[3];
    sgd_steps(c, 0, one);
    sgd_steps(c, 1, rec);
    ck_assert_mem_eq(one, rec, sizeof one); /* bit for bit */
    ck_assert(one[0] != 0.5f);              /* and the steps did move w */
    td_close(c);
}
END_TEST

/* ---------------------------------------------------------------- gradient checks (f64, ref) */

/* A case builds a scalar loss from uploaded inputs (all f64 on ref:0). */
typedef td_handle (*case_fn)(td_client *c, const td_handle *in);

typedef struct {
    const char *name;
    case_fn f;
    int n_in;
    int ndim[3];
    int64_t shape[3][4];
} grad_case;

static td_handle sum_all(td_client *c, td_handle h)
{
    return op1(c, "sum", h, 0, NULL, 0);
}

/* A fixed weighting so that every output element matters differently. */
static td_handle weigh(td_client *c, td_handle h)
{
    return sum_all(c, op1(c, "mul", h, op1(c, "sin", h, 0, NULL, 0), NULL, 0));
}

static td_handle c_mlp(td_client *c, const td_handle *in)
{
    /* matmul + broadcast bias -> relu -> cross_entropy: the digits MLP in small */
    td_handle h =
        op1(c, "relu", op1(c, "add", op1(c, "matmul", in[0], in[1], NULL, 0), in[2], NULL, 0), 0,
            NULL, 0);
    int64_t t[3] = {4, 0, 2}, st[1] = {3};
    td_handle tgt = up(c, "ref:0", TD_I64, 1, st, t, 0);
    return op1(c, "add", op1(c, "cross_entropy", h, tgt, NULL, 0), weigh(c, h), NULL, 0);
}

static td_handle c_bcast(td_client *c, const td_handle *in)
{
    td_handle a = op1(c, "mul", in[0], in[1], NULL, 0);                        /* [3,4] * [4] */
    td_handle b = op1(c, "div", a, op1(c, "exp", in[2], 0, NULL, 0), NULL, 0); /* / [3,1] */
    return weigh(c, op1(c, "sub", b, in[1], NULL, 0));
}

static td_handle c_unary(td_client *c, const td_handle *in)
{
    td_attr one = td_attr_float("other", 1.0);
    td_handle t = op1(c, "tanh", in[0], 0, NULL, 0);
    td_handle s = op1(c, "sigmoid", in[0], 0, NULL, 0);
    td_handle x = op1(c, "exp", op1(c, "mul", t, s, NULL, 0), 0, NULL, 0);
    td_handle l = op1(c, "log", op1(c, "add", x, 0, &one, 1), 0, NULL, 0);
    return weigh(c, op1(c, "mul", l, op1(c, "sqrt", x, 0, NULL, 0), NULL, 0));
}

static td_handle c_reduce(td_client *c, const td_handle *in)
{
    td_attr a[2] = {td_attr_int("dim", 1), td_attr_bool("keepdim", 1)};
    td_handle m = op1(c, "mean", in[0], 0, a, 2);   /* [3,1] */
    td_handle s = op1(c, "sum", in[0], 0, a, 1);    /* [3] */
    td_handle d = op1(c, "sub", in[0], m, NULL, 0); /* broadcast back */
    return sum_all(c, op1(c, "add", weigh(c, d), weigh(c, s), NULL, 0));
}

static td_handle c_softmax(td_client *c, const td_handle *in)
{
    td_attr dim = td_attr_int("dim", -1);
    td_handle p = op1(c, "softmax", in[0], 0, &dim, 1);
    td_handle lp = op1(c, "log_softmax", in[0], 0, &dim, 1);
    return sum_all(c, op1(c, "add", weigh(c, p), weigh(c, lp), NULL, 0));
}

static td_handle c_views(td_client *c, const td_handle *in)
{
    td_attr tr[2] = {td_attr_int("dim0", 0), td_attr_int("dim1", 1)};
    int64_t shp[2] = {2, 6};
    td_attr rs = td_attr_ints("shape", shp, 2);
    td_handle t = op1(c, "transpose", in[0], 0, tr, 2); /* [4,3] */
    td_handle r = op1(c, "reshape", t, 0, &rs, 1);      /* [2,6] */
    td_attr sl[3] = {td_attr_int("dim", 1), td_attr_int("start", 1), td_attr_int("stop", 5)};
    return weigh(c, op1(c, "slice", r, 0, sl, 3));
}

static td_handle c_matmul_batched(td_client *c, const td_handle *in)
{
    return weigh(c, op1(c, "matmul", in[0], in[1], NULL, 0)); /* [2,3,4] @ [4,2] */
}

static td_handle un_(td_client *c, const char *op, td_handle x)
{
    return op1(c, op, x, 0, NULL, 0);
}

static td_handle sc_(td_client *c, const char *op, td_handle x, double v)
{
    td_attr a = td_attr_float("other", v);
    return op1(c, op, x, 0, &a, 1);
}

static td_handle add_(td_client *c, td_handle a, td_handle b)
{
    return op1(c, "add", a, b, NULL, 0);
}

static td_handle c_elementwise(td_client *c, const td_handle *in)
{
    td_handle x = in[0], y = in[1];
    td_handle l = weigh(c, op1(c, "maximum", x, y, NULL, 0));
    l = add_(c, l, weigh(c, op1(c, "minimum", x, y, NULL, 0)));
    l = add_(c, l, weigh(c, sc_(c, "pow", un_(c, "exp", x), 1.5)));
    l = add_(c, l, weigh(c, op1(c, "pow", un_(c, "exp", x), y, NULL, 0)));
    td_attr lr = td_attr_float("negative_slope", 0.2);
    l = add_(c, l, weigh(c, op1(c, "leaky_relu", x, 0, &lr, 1)));
    l = add_(c, l, weigh(c, un_(c, "silu", x)));
    td_attr sp = td_attr_float("beta", 2.0);
    l = add_(c, l, weigh(c, op1(c, "softplus", x, 0, &sp, 1)));
    td_attr cl[2] = {td_attr_float("min", -0.5), td_attr_float("max", 0.7)};
    l = add_(c, l, weigh(c, op1(c, "clamp", x, 0, cl, 2)));
    l = add_(c, l, weigh(c, un_(c, "abs", x)));
    l = add_(c, l, weigh(c, un_(c, "square", y)));
    l = add_(c, l, weigh(c, un_(c, "rsqrt", un_(c, "exp", y))));
    l = add_(c, l, weigh(c, un_(c, "reciprocal", un_(c, "exp", y))));
    l = add_(c, l, weigh(c, un_(c, "log1p", un_(c, "exp", y))));
    l = add_(c, l, weigh(c, un_(c, "expm1", y)));
    l = add_(c, l, weigh(c, un_(c, "cos", y)));
    l = add_(c, l, weigh(c, un_(c, "neg", y)));
    td_handle m = sc_(c, "gt", x, 0.1);
    td_handle wh[3] = {m, x, y};
    td_op_opts o = {0};
    td_error e;
    l = add_(c, l, weigh(c, td_op1(c, "where", wh, 3, &o, &e)));
    td_attr fv = td_attr_float("value", 2.0);
    return add_(c, l, weigh(c, op1(c, "masked_fill", x, m, &fv, 1)));
}

static td_handle c_reduce2(td_client *c, const td_handle *in)
{
    td_attr d1[2] = {td_attr_int("dim", 1), td_attr_bool("keepdim", 0)};
    td_attr d0[2] = {td_attr_int("dim", 0), td_attr_bool("keepdim", 1)};
    td_handle x = in[0];
    td_handle l = weigh(c, op1(c, "amax", x, 0, d1, 2));
    l = add_(c, l, weigh(c, op1(c, "amin", x, 0, d0, 2)));
    l = add_(c, l, weigh(c, op1(c, "var", x, 0, d1, 2)));
    l = add_(c, l, weigh(c, op1(c, "std", x, 0, d0, 2)));
    l = add_(c, l, weigh(c, op1(c, "logsumexp", x, 0, d1, 2)));
    l = add_(c, l, weigh(c, op1(c, "prod", x, 0, d0, 2)));
    l = add_(c, l, weigh(c, op1(c, "cumsum", x, 0, d1, 1)));
    l = add_(c, l, weigh(c, un_(c, "mean", x)));
    return l;
}

static td_handle c_losses(td_client *c, const td_handle *in)
{
    td_handle x = in[0], y = in[1];
    td_attr dim = td_attr_int("dim", 1);
    int64_t t[3] = {1, -100, 3}, st[1] = {3};
    td_handle tgt = up(c, "ref:0", TD_I64, 1, st, t, 0);
    td_handle l = op1(c, "nll_loss", op1(c, "log_softmax", x, 0, &dim, 1), tgt, NULL, 0);
    td_attr ls = td_attr_float("label_smoothing", 0.1);
    td_op_opts o = {.attrs = &ls, .nattrs = 1};
    td_error e;
    td_handle xt[2] = {x, tgt};
    l = add_(c, l, td_op1(c, "cross_entropy", xt, 2, &o, &e));
    td_attr none = {.name = "reduction", .kind = TD_ATTR_STR, .s = "none"};
    l = add_(c, l, weigh(c, op1(c, "cross_entropy", x, tgt, &none, 1)));
    l = add_(c, l, op1(c, "mse_loss", x, y, NULL, 0));
    td_attr sum = {.name = "reduction", .kind = TD_ATTR_STR, .s = "sum"};
    l = add_(c, l, op1(c, "binary_cross_entropy_with_logits", x, un_(c, "sigmoid", y), &sum, 1));
    return l;
}

static td_handle c_layers(td_client *c, const td_handle *in)
{
    td_handle x = in[0], w = in[1], b = in[2];
    int64_t ns[1] = {4};
    td_attr na = td_attr_ints("normalized_shape", ns, 1);
    td_handle ln3[3] = {x, b, w};
    td_op_opts o = {.attrs = &na, .nattrs = 1};
    td_error e;
    td_handle l = weigh(c, td_op1(c, "layer_norm", ln3, 3, &o, &e));
    td_attr nb = td_attr_ints("normalized_shape", ns, 1);
    l = add_(c, l, weigh(c, op1(c, "layer_norm", x, 0, &nb, 1)));
    td_handle lin[3] = {
        x, un_(c, "tanh", op1(c, "unsqueeze", w, 0, (td_attr[]){td_attr_int("dim", 0)}, 1)), b};
    td_op_opts oo = {0};
    lin[2] = op1(c, "slice", b, 0, (td_attr[]){td_attr_int("start", 0), td_attr_int("stop", 1)}, 2);
    return add_(c, l, weigh(c, td_op1(c, "linear", lin, 3, &oo, &e)));
}

static td_handle c_index(td_client *c, const td_handle *in)
{
    td_handle x = in[0], w = in[1];
    int64_t iv[4] = {2, 0, 2, 1}, si[1] = {4}, gv[6] = {0, 2, 1, 1, 0, 3}, sg[2] = {3, 2};
    td_handle idx = up(c, "ref:0", TD_I64, 1, si, iv, 0);
    td_handle gidx = up(c, "ref:0", TD_I64, 2, sg, gv, 0);
    td_handle l = weigh(c, op1(c, "embedding", idx, w, NULL, 0));
    td_attr d1 = td_attr_int("dim", 1), d0 = td_attr_int("dim", 0);
    l = add_(c, l, weigh(c, op1(c, "gather", x, gidx, &d1, 1)));
    td_handle si2 = op1(c, "slice", idx, 0, (td_attr[]){td_attr_int("stop", 3)}, 1);
    l = add_(c, l, weigh(c, op1(c, "index_select", x, si2, &d0, 1)));
    td_handle cat[3] = {x, un_(c, "exp", x), x};
    td_op_opts o = {.attrs = &d1, .nattrs = 1};
    td_error e;
    l = add_(c, l, weigh(c, td_op1(c, "cat", cat, 3, &o, &e)));
    l = add_(c, l, weigh(c, td_op1(c, "stack", cat, 2, &o, &e)));
    td_attr ch[2] = {td_attr_int("chunks", 2), td_attr_int("dim", 1)};
    td_op_opts oc = {.attrs = ch, .nattrs = 2};
    td_handle parts[2];
    ck_assert_int_eq(td_op(c, "chunk", &x, 1, &oc, parts, 2, &e), 0);
    l = add_(c, l, weigh(c, op1(c, "mul", parts[0], parts[1], NULL, 0)));
    int64_t perm[3] = {2, 0, 1}, sh3[3] = {1, 3, 4}, ex3[3] = {2, 3, 4};
    td_handle x3 = op1(c, "reshape", x, 0, (td_attr[]){td_attr_ints("shape", sh3, 3)}, 1);
    td_handle e3 = op1(c, "expand", x3, 0, (td_attr[]){td_attr_ints("shape", ex3, 3)}, 1);
    l = add_(c, l,
             weigh(c, op1(c, "permute", e3, 0, (td_attr[]){td_attr_ints("dims", perm, 3)}, 1)));
    td_attr sl[4] = {td_attr_int("dim", 1), td_attr_int("start", 0), td_attr_int("stop", 4),
                     td_attr_int("step", 2)};
    l = add_(c, l, weigh(c, op1(c, "slice", x, 0, sl, 4)));
    l = add_(c, l, weigh(c, un_(c, "tril", x)));
    int64_t pad[2] = {1, 2};
    l = add_(c, l, weigh(c, op1(c, "pad", x, 0, (td_attr[]){td_attr_ints("pad", pad, 2)}, 1)));
    return l;
}

static td_handle c_pool_gelu(td_client *c, const td_handle *in)
{
    td_handle x = in[0];
    td_attr tanh_a = {.name = "approximate", .kind = TD_ATTR_STR, .s = "tanh"};
    td_handle l = weigh(c, un_(c, "gelu", x));
    l = add_(c, l, weigh(c, op1(c, "gelu", x, 0, &tanh_a, 1)));
    int64_t k2[2] = {2, 2}, k3[2] = {3, 3}, one[2] = {1, 1};
    td_attr p1 = td_attr_ints("kernel_size", k2, 2);
    l = add_(c, l, weigh(c, op1(c, "max_pool2d", x, 0, &p1, 1)));
    td_attr p2[3] = {td_attr_ints("kernel_size", k3, 2), td_attr_ints("stride", one, 2),
                     td_attr_ints("padding", one, 2)};
    return add_(c, l, weigh(c, op1(c, "max_pool2d", x, 0, p2, 3)));
}

static const grad_case grad_cases[] = {
    {"mlp", c_mlp, 3, {2, 2, 1}, {{3, 4}, {4, 5}, {5}}},
    {"broadcast", c_bcast, 3, {2, 1, 2}, {{3, 4}, {4}, {3, 1}}},
    {"unary", c_unary, 1, {2}, {{3, 4}}},
    {"reduce", c_reduce, 1, {2}, {{3, 4}}},
    {"softmax", c_softmax, 1, {2}, {{3, 4}}},
    {"views", c_views, 1, {2}, {{3, 4}}},
    {"matmul-batched", c_matmul_batched, 2, {3, 2}, {{2, 3, 4}, {4, 2}}},
    {"elementwise", c_elementwise, 2, {2, 1}, {{3, 4}, {4}}},
    {"reduce2", c_reduce2, 1, {2}, {{3, 4}}},
    {"losses", c_losses, 2, {2, 2}, {{3, 4}, {3, 4}}},
    {"layers", c_layers, 3, {2, 1, 1}, {{3, 4}, {4}, {4}}},
    {"index", c_index, 2, {2, 2}, {{3, 4}, {3, 2}}},
    {"pool-gelu", c_pool_gelu, 1, {4}, {{1, 2, 4, 5}}},
};

static double loss_value(td_client *c, const grad_case *gc, double (*vals)[64])
{
    td_handle in[3];
    for (int k = 0; k < gc->n_in; k++)
        in[k] = up(c, "ref:0", TD_F64, gc->ndim[k], gc->shape[k], vals[k], 0);
    double l;
    down(c, gc->f(c, in), &l, sizeof l);
    return l;
}

static int64_t numel_of(const grad_case *gc, int k)
{
    int64_t n = 1;
    for (int d = 0; d < gc->ndim[k]; d++)
        n *= gc->shape[k][d];
    return n;
}

START_TEST(test_gradcheck_f64)
{
    const grad_case *gc = &grad_cases[_i];
    td_client *c = it_client("gradcheck");
    td_error e;
    uint64_t seed = UINT64_C(0x9e3779b97f4a7c15) + (uint64_t)_i;
    double vals[3][64];
    td_handle in[3];
    for (int k = 0; k < gc->n_in; k++) {
        for (int j = 0; j < numel_of(gc, k); j++)
            vals[k][j] = (double)it_randf(&seed, -1.5f, 1.5f);
        in[k] = up(c, "ref:0", TD_F64, gc->ndim[k], gc->shape[k], vals[k], 1);
    }
    td_handle loss = gc->f(c, in), grads = 0;
    int rc = td_backward(c, loss, 0, 0, &grads, &e);
    ck_assert_msg(rc == 0, "%s: backward: %s: %s", gc->name, td_err_name(rc), e.message);
    const double h = 1e-6;
    for (int k = 0; k < gc->n_in; k++) {
        double an[64];
        grad_of(c, grads, in[k], an, (size_t)numel_of(gc, k) * sizeof(double));
        for (int j = 0; j < numel_of(gc, k); j++) {
            double keep = vals[k][j];
            vals[k][j] = keep + h;
            double lp = loss_value(c, gc, vals);
            vals[k][j] = keep - h;
            double lm = loss_value(c, gc, vals);
            vals[k][j] = keep;
            double num = (lp - lm) / (2 * h);
            /* central differences in f64: error ~h^2 plus rounding ~1e-10 */
            ck_assert_msg(fabs(num - an[j]) <= 1e-6 * (1 + fabs(num)),
                          "%s: input %d element %d: backward %.12g, finite differences %.12g",
                          gc->name, k, j, an[j], num);
        }
    }
    td_close(c);
}
END_TEST

/* ---------------------------------------------------------------- training */

/* Linear regression trained entirely in the daemon: the loss falls and the
 * weights converge; every iteration's handles are released and nothing leaks. */
static void train_linear(const char *kind, double lr, int steps)
{
    td_client *c = it_client("train");
    td_error e;
    enum { N = 64 };
    float X[N * 3], Y[N], w_true[3] = {1.5f, -2.0f, 0.5f}, b_true = 0.25f;
    uint64_t seed = 42;
    for (int i = 0; i < N; i++) {
        Y[i] = b_true;
        for (int j = 0; j < 3; j++) {
            X[i * 3 + j] = it_randf(&seed, -1, 1);
            Y[i] += w_true[j] * X[i * 3 + j];
        }
    }
    int64_t sx[2] = {N, 3}, sy[2] = {N, 1}, sw[2] = {1, 3}, sb[1] = {1};
    float w0[3] = {0}, b0[1] = {0};
    td_handle x = up(c, "cpu:0", TD_F32, 2, sx, X, 0), y = up(c, "cpu:0", TD_F32, 2, sy, Y, 0);
    td_handle params[2] = {up(c, "cpu:0", TD_F32, 2, sw, w0, 1),
                           up(c, "cpu:0", TD_F32, 1, sb, b0, 1)};
    td_attr lra = td_attr_float("lr", lr);
    td_handle opt = 0;
    ck_assert_int_eq(td_optimizer_create(c, kind, params, 2, &lra, 1, &opt, &e), 0);
    mem_snapshot base = {0, 0};
    float first = 0, last = 0;
    for (int it = 0; it < steps; it++) {
        td_handle in[3] = {x, params[0], params[1]};
        td_op_opts o = {0};
        td_handle pred = td_op1(c, "linear", in, 3, &o, &e);
        td_handle yy[2] = {pred, y};
        td_handle loss = td_op1(c, "mse_loss", yy, 2, &o, &e);
        td_handle g = backward(c, loss, 0);
        int rc = td_optimizer_step(c, opt, g, &e);
        ck_assert_msg(rc == 0, "step: %s: %s", td_err_name(rc), e.message);
        if (it == 0 || it == steps - 1) {
            float l;
            down(c, loss, &l, sizeof l);
            if (it == 0)
                first = l;
            last = l;
        }
        td_handle dead[3] = {pred, loss, g};
        td_release(c, dead, 3, &e);
        if (it == 1)
            base = snapshot(c);
    }
    mem_snapshot end = snapshot(c);
    ck_assert_uint_eq(end.tensors, base.tensors);
    ck_assert_uint_eq(end.bytes, base.bytes);
    ck_assert_msg(last < first * 1e-3f, "%s: loss %g -> %g", kind, first, last);
    float w[3], b[1];
    down(c, params[0], w, sizeof w);
    down(c, params[1], b, sizeof b);
    for (int j = 0; j < 3; j++)
        ck_assert_msg(fabsf(w[j] - w_true[j]) < 0.05f, "%s: w[%d] = %g", kind, j, w[j]);
    ck_assert_msg(fabsf(b[0] - b_true) < 0.05f, "%s: b = %g", kind, b[0]);
    td_close(c);
}

START_TEST(test_train_sgd)
{
    train_linear("sgd", 0.2, 300);
}
END_TEST

START_TEST(test_train_adam)
{
    train_linear("adam", 0.05, 400);
}
END_TEST

Suite *it_autograd_suite(void)
{
    Suite *s = suite_create("autograd");
    TCase *tc = tcase_create("gradients");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_grad_replace_matrix);
    tcase_add_test(tc, test_backward_errors);
    tcase_add_test(tc, test_accumulate_retain_detach);
    tcase_add_test(tc, test_to_device_gradient);
    tcase_add_test(tc, test_optimizer_errors);
    tcase_add_test(tc, test_optimizer_state);
    tcase_add_test(tc, test_optimizer_step_attrs);
    tcase_add_test(tc, test_graph_replay);
    tcase_add_test(tc, test_graph_end_inputs);
    tcase_add_loop_test(tc, test_gradcheck_f64, 0, (int)(sizeof grad_cases / sizeof grad_cases[0]));
    suite_add_tcase(s, tc);
    TCase *tt = tcase_create("training");
    tcase_set_timeout(tt, 300);
    tcase_add_test(tt, test_train_sgd);
    tcase_add_test(tt, test_train_adam);
    suite_add_tcase(s, tt);
    return s;
}
