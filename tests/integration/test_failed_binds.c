/* test_failed_binds.c -- integration: a request that names a new handle and fails still
 * binds it, to a poisoned placeholder of the right kind. Releasing the id then
 * succeeds, and using it is POISONED naming the failed request. Before, Backward,
 * Grad, GradRemove and OptimizerCreate left the id unbound: the client's Release of it
 * was answered UNKNOWN_HANDLE at the next, unrelated synchronising call. */
#include <string.h>

#include "itest.h"

Suite *it_failed_binds_suite(void);

static td_handle up(td_client *c, int ndim, const int64_t *shape, const float *data, int rg)
{
    td_device d = it_dev("cpu:0");
    td_handle h = 0;
    td_error e;
    int rc = td_upload(c, &d, TD_F32, ndim, shape, data, rg, &h, &e);
    ck_assert_msg(rc == 0, "upload: %s: %s", td_err_name(rc), e.message);
    return h;
}

static td_handle op(td_client *c, const char *name, td_handle a, td_handle b, const td_attr *attrs,
                    size_t n)
{
    td_handle in[2] = {a, b};
    td_op_opts o = {.attrs = attrs, .nattrs = n};
    td_error e;
    td_handle h = td_op1(c, name, in, b ? 2 : 1, &o, &e);
    ck_assert_msg(h != 0, "%s: %s", name, e.message);
    return h;
}

/* The id the client named in its latest handle-creating request: the C client counts
 * ids up, and returns none when the call failed. */
static td_handle last_named_id(td_client *c)
{
    float one = 1;
    td_handle probe = up(c, 0, NULL, &one, 0);
    td_error e;
    ck_assert_int_eq(td_release(c, &probe, 1, &e), 0);
    return probe - 1;
}

static uint64_t session_handles(td_client *c)
{
    td_stats st;
    td_error e;
    ck_assert_int_eq(td_sync(c, &e), 0);
    ck_assert_int_eq(td_stats_get(c, &st, &e), 0);
    for (size_t i = 0; i < st.nsessions && i < 64; i++)
        if (st.session_list[i].session_id == td_session_id(c))
            return st.session_list[i].handles;
    ck_abort_msg("own session not listed");
    return 0;
}

/* After the failure: the failed id is a placeholder of its kind (use says POISONED naming
 * origin_req, when use is given), its Release succeeds, and an unrelated call works. */
static void release_and_go_on(td_client *c, td_handle failed, uint64_t origin_req, td_handle x,
                              int (*use)(td_client *, td_handle, td_error *), uint64_t base)
{
    td_error e;
    if (use) {
        int rc = use(c, failed, &e);
        ck_assert_msg(rc == TD_EPOISONED, "use of %llu: %s: %s", (unsigned long long)failed,
                      td_err_name(rc), e.message);
        ck_assert_int_eq(e.detail_kind, TD_DETAIL_POISONED);
        ck_assert_uint_eq(e.detail.poisoned.handle, failed);
        ck_assert_uint_eq(e.detail.poisoned.origin_request, origin_req);
    }
    ck_assert_int_eq(td_release(c, &failed, 1, &e), 0);
    td_handle y = op(c, "mul", x, x, NULL, 0);
    float got[16];
    int rc = td_download(c, y, got, sizeof got, NULL, &e);
    ck_assert_msg(rc == 0, "the next call: %s: %s", td_err_name(rc), e.message);
    ck_assert_float_eq(got[0], 1.0f);
    ck_assert_int_eq(td_release(c, &y, 1, &e), 0);
    ck_assert_uint_eq(session_handles(c), base); /* the placeholder's charge is back */
}

static td_handle g_tensor; /* a tracked tensor for the uses below */

static int use_grads(td_client *c, td_handle grads, td_error *e)
{
    td_handle out = 0;
    int rc = td_grad(c, grads, g_tensor, &out, e);
    /* The failed Grad's own output id is a placeholder too: release it. */
    td_handle named = last_named_id(c);
    td_error e2;
    ck_assert_int_eq(td_release(c, &named, 1, &e2), 0);
    return rc;
}

static int use_tensor(td_client *c, td_handle t, td_error *e)
{
    td_handle in[1] = {t}, out = 0;
    int rc = td_op(c, "neg", in, 1, NULL, &out, 1, e);
    if (rc)
        return rc;
    float v[16];
    rc = td_download(c, out, v, sizeof v, NULL, e);
    td_error e2;
    td_release(c, &out, 1, &e2);
    return rc;
}

static int use_optimizer(td_client *c, td_handle o, td_error *e)
{
    return td_optimizer_step(c, o, o, e);
}

START_TEST(test_bad_conv_attribute_then_backward_and_step_are_typed)
{
    td_client *c = it_client("failed-binds-repro");
    int64_t s4[4] = {1, 1, 4, 4}, s3[4] = {1, 1, 3, 3};
    float xv[16], wv[9];
    for (int i = 0; i < 16; i++)
        xv[i] = 1;
    for (int i = 0; i < 9; i++)
        wv[i] = 1;
    td_handle x = up(c, 4, s4, xv, 1), w = up(c, 4, s3, wv, 0);
    g_tensor = x;
    uint64_t base = session_handles(c);
    td_attr pad = {.name = "padding", .kind = TD_ATTR_STR, .s = "sideways"}; /* not a padding */
    td_handle in[2] = {x, w}, y = 0, loss = 0, grads = 0;
    td_op_opts o = {.attrs = &pad, .nattrs = 1};
    td_error e;
    /* Refused now or when queued: either way the backward fails. */
    int rc = td_op(c, "conv2d", in, 2, &o, &y, 1, &e);
    if (rc == 0)
        rc = td_op(c, "sum", &y, 1, NULL, &loss, 1, &e);
    if (rc == 0)
        rc = td_backward(c, loss, 0, 0, &grads, &e);
    ck_assert_int_ne(rc, 0);
    td_handle failed = last_named_id(c);
    td_handle rel[2] = {y, loss};
    ck_assert_int_eq(td_release(c, rel, (size_t)(y != 0) + (size_t)(loss != 0), &e), 0);
    release_and_go_on(c, failed, 0, x, NULL, base);
    td_close(c);
}
END_TEST

/* Each way a Backward can fail. */
START_TEST(test_failed_backward)
{
    td_client *c = it_client("failed-binds-backward");
    int64_t s4[1] = {4}, s3[1] = {3};
    float v[16] = {1, 1, 1, 1};
    td_handle x = up(c, 1, s4, v, 1), plain = up(c, 1, s4, v, 0), go3 = up(c, 1, s3, v, 0);
    g_tensor = x;
    td_error e;
    for (int k = 0; k < 7; k++) {
        uint64_t base = session_handles(c);
        td_handle nonscalar = op(c, "mul", x, x, NULL, 0), extra = 0, g = 0, ok = 0;
        td_handle loss = op(c, "sum", nonscalar, 0, NULL, 0);
        int want, rc;
        switch (k) {
        case 0: /* a loss with more than one element, no grad_output */
            want = TD_EINVALID_ARGUMENT;
            rc = td_backward(c, nonscalar, 0, 0, &g, &e);
            break;
        case 1: /* untracked */
            extra = op(c, "sum", plain, 0, NULL, 0);
            want = TD_ENOT_TRACKED;
            rc = td_backward(c, extra, 0, 0, &g, &e);
            break;
        case 2: /* the graph was freed by an earlier pass */
            ck_assert_int_eq(td_backward(c, loss, 0, 0, &ok, &e), 0);
            want = TD_EINVALID_ARGUMENT;
            rc = td_backward(c, loss, 0, 0, &g, &e);
            break;
        case 3: { /* a released loss */
            td_handle gone = op(c, "sum", nonscalar, 0, NULL, 0);
            ck_assert_int_eq(td_release(c, &gone, 1, &e), 0);
            want = TD_EUNKNOWN_HANDLE;
            rc = td_backward(c, gone, 0, 0, &g, &e);
            break;
        }
        case 4: { /* a poisoned loss (its error already told) */
            td_attr shape = td_attr_ints("shape", (const int64_t[]){7}, 1);
            extra = op(c, "reshape", x, 0, &shape, 1);
            ck_assert_int_ne(td_sync(c, &e), 0);
            want = TD_EPOISONED;
            rc = td_backward(c, extra, 0, 0, &g, &e);
            break;
        }
        case 5: { /* an earlier asynchronous error is told by the backward */
            td_attr shape = td_attr_ints("shape", (const int64_t[]){7}, 1);
            extra = op(c, "reshape", x, 0, &shape, 1);
            want = TD_ESHAPE_MISMATCH;
            rc = td_backward(c, loss, 0, 0, &g, &e);
            break;
        }
        default: /* a grad_output of the wrong shape */
            want = TD_ESHAPE_MISMATCH;
            rc = td_backward(c, nonscalar, go3, 0, &g, &e);
            break;
        }
        if (k == 5 && rc != want) /* whichever code the queued reshape fails with */
            want = rc;
        ck_assert_msg(rc == want, "case %d: %s (%s)", k, td_err_name(rc), e.message);
        ck_assert_uint_eq(g, 0);
        uint64_t origin = k == 4 || k == 5 ? 0 : e.request_id;
        td_handle failed = last_named_id(c);
        td_handle rel[4] = {loss, nonscalar, extra, ok};
        ck_assert_int_eq(td_release(c, rel, 2, &e), 0);
        if (extra)
            ck_assert_int_eq(td_release(c, &rel[2], 1, &e), 0);
        if (ok)
            ck_assert_int_eq(td_release(c, &rel[3], 1, &e), 0);
        if (origin)
            release_and_go_on(c, failed, origin, x, use_grads, base);
        else
            release_and_go_on(c, failed, 0, x, NULL, base);
    }
    td_close(c);
}
END_TEST

/* Grad and GradRemove: their output ids. */
START_TEST(test_failed_grad)
{
    td_client *c = it_client("failed-binds-grad");
    int64_t s4[1] = {4};
    float v[16] = {1, 1, 1, 1};
    td_handle x = up(c, 1, s4, v, 1), plain = up(c, 1, s4, v, 0), other = up(c, 1, s4, v, 1);
    g_tensor = x;
    td_error e;
    td_handle loss = op(c, "sum", op(c, "mul", x, x, NULL, 0), 0, NULL, 0), grads = 0;
    ck_assert_int_eq(td_backward(c, loss, 0, 0, &grads, &e), 0);
    for (int k = 0; k < 6; k++) {
        uint64_t base = session_handles(c);
        td_handle out = 0, got = 0;
        int rc, want;
        switch (k) {
        case 0:
            want = TD_ENOT_TRACKED;
            rc = td_grad(c, grads, plain, &out, &e);
            break;
        case 1:
            want = TD_ENOT_TRACKED;
            rc = td_grad_remove(c, grads, plain, &out, &e);
            break;
        case 2: /* no gradient for it */
            want = TD_EINVALID_ARGUMENT;
            rc = td_grad(c, grads, other, &out, &e);
            break;
        case 3: /* removed already */
            ck_assert_int_eq(td_grad_remove(c, grads, x, &got, &e), 0);
            want = TD_EINVALID_ARGUMENT;
            rc = td_grad_remove(c, grads, x, &out, &e);
            break;
        case 4: /* not a Gradients handle */
            want = TD_EWRONG_HANDLE_KIND;
            rc = td_grad(c, x, x, &out, &e);
            break;
        default: /* unknown Gradients */
            want = TD_EUNKNOWN_HANDLE;
            rc = td_grad(c, 999999, x, &out, &e);
            break;
        }
        ck_assert_msg(rc == want, "case %d: %s (%s)", k, td_err_name(rc), e.message);
        uint64_t origin = e.request_id;
        td_handle failed = last_named_id(c);
        if (got) {
            ck_assert_int_eq(td_release(c, &got, 1, &e), 0);
            ck_assert_uint_eq(session_handles(c), base + 1); /* + the placeholder */
        }
        release_and_go_on(c, failed, origin, x, use_tensor, base);
    }
    td_close(c);
}
END_TEST

/* OptimizerCreate (asynchronous in the C client: its error comes at the next sync). */
START_TEST(test_failed_optimizer_create)
{
    td_client *c = it_client("failed-binds-optim");
    int64_t s4[1] = {4};
    float v[16] = {1, 1, 1, 1};
    td_handle x = up(c, 1, s4, v, 1), plain = up(c, 1, s4, v, 0);
    td_error e;
    td_attr lr = td_attr_float("lr", 0.1), bogus = td_attr_float("bogus", 1);
    struct {
        const char *kind;
        td_handle params[2];
        size_t np;
        td_attr attrs[2];
        size_t na;
    } bad[] = {
        {"sgd", {x}, 1, {lr, bogus}, 2},               /* unknown attribute */
        {"sgd", {x, x}, 2, {lr}, 1},                   /* duplicate params */
        {"sgd", {plain}, 1, {lr}, 1},                  /* untracked param */
        {"nope", {x}, 1, {lr}, 1},                     /* unknown kind */
        {"sgd", {x}, 1, {td_attr_float("lr", -1)}, 1}, /* bad value */
        {"sgd", {999999}, 1, {lr}, 1},                 /* unknown param */
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        uint64_t base = session_handles(c);
        td_handle o = 0;
        ck_assert_int_eq(td_optimizer_create(c, bad[i].kind, bad[i].params, bad[i].np, bad[i].attrs,
                                             bad[i].na, &o, &e),
                         0);
        uint64_t origin = td_last_request_id(c);
        int rc = td_sync(c, &e);
        ck_assert_msg(rc != 0, "case %zu: created", i);
        ck_assert_uint_eq(e.request_id, origin);
        release_and_go_on(c, o, origin, x, use_optimizer, base);
    }
    td_close(c);
}
END_TEST

Suite *it_failed_binds_suite(void)
{
    Suite *s = suite_create("failed-binds");
    TCase *tc = tcase_create("placeholders");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_bad_conv_attribute_then_backward_and_step_are_typed);
    tcase_add_test(tc, test_failed_backward);
    tcase_add_test(tc, test_failed_grad);
    tcase_add_test(tc, test_failed_optimizer_create);
    suite_add_tcase(s, tc);
    return s;
}
