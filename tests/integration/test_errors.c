/* test_errors.c -- integration: every error reaches the client typed; poison; garbage on the wire.
 */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "frame.h"
#include "itest.h"

static const td_op_opts want_reply = {.want_reply = 1};

static void assert_device(const td_device *d, const char *want)
{
    char s[40];
    td_device_format(d, s, sizeof s);
    ck_assert_str_eq(s, want);
}

/* ---------------------------------------------------------------- typed errors via the lib */

START_TEST(test_unknown_handle)
{
    td_client *c = it_client("unknown-handle");
    td_handle bogus = 987654321, out = 0;
    td_error e;
    /* Synchronous verdict. */
    int rc = td_op(c, "relu", &bogus, 1, &want_reply, &out, 1, &e);
    ck_assert_int_eq(rc, TD_EUNKNOWN_HANDLE);
    ck_assert_int_eq(e.code, TD_EUNKNOWN_HANDLE);
    ck_assert_uint_eq(e.request_id, td_last_request_id(c));
    ck_assert_int_eq(e.detail_kind, TD_DETAIL_HANDLE);
    ck_assert_uint_eq(e.detail.handle.handle, bogus);
    td_sync(c, &e); /* whatever the session's sticky state, clear it */

    /* Asynchronous: reported by the next sync, naming the op's request. */
    ck_assert_uint_ne(td_op1(c, "relu", &bogus, 1, NULL, &e), 0);
    uint64_t op_id = td_last_request_id(c);
    rc = td_sync(c, &e);
    ck_assert_int_eq(rc, TD_EUNKNOWN_HANDLE);
    ck_assert_uint_eq(e.request_id, op_id);
    ck_assert_int_eq(e.detail_kind, TD_DETAIL_HANDLE);
    ck_assert_uint_eq(e.detail.handle.handle, bogus);
    /* Reported once: the session is clean again. */
    ck_assert_int_eq(td_sync(c, &e), 0);

    float y;
    rc = td_download(c, bogus + 1, &y, sizeof y, NULL, &e);
    ck_assert_int_eq(rc, TD_EUNKNOWN_HANDLE);
    ck_assert_uint_eq(e.detail.handle.handle, bogus + 1);
    td_close(c);
}
END_TEST

START_TEST(test_shape_mismatch)
{
    td_client *c = it_client("shape-mismatch");
    float x[6] = {0};
    int64_t s23[2] = {2, 3}, s32[2] = {3, 2};
    td_handle in[2] = {it_upload_f32(c, "cpu:0", 2, s23, x), it_upload_f32(c, "cpu:0", 2, s32, x)};
    td_handle out;
    td_error e;
    int rc = td_op(c, "add", in, 2, &want_reply, &out, 1, &e);
    ck_assert_int_eq(rc, TD_ESHAPE_MISMATCH);
    ck_assert_int_eq(e.detail_kind, TD_DETAIL_SHAPES);
    ck_assert_int_eq(e.detail.shapes.expected_ndim, 2);
    ck_assert_int_eq(e.detail.shapes.got_ndim, 2);
    /* Both shapes named: expected is the first input's, got the second's. */
    ck_assert_int_eq(e.detail.shapes.expected[0], 2);
    ck_assert_int_eq(e.detail.shapes.expected[1], 3);
    ck_assert_int_eq(e.detail.shapes.got[0], 3);
    ck_assert_int_eq(e.detail.shapes.got[1], 2);
    td_sync(c, &e);

    /* matmul of [2,3] @ [2,3]: inner dimensions disagree. */
    td_handle mm[2] = {in[0], in[0]};
    rc = td_op(c, "matmul", mm, 2, &want_reply, &out, 1, &e);
    ck_assert_int_eq(rc, TD_ESHAPE_MISMATCH);
    td_sync(c, &e);
    ck_assert_int_eq(td_ping(c, &e), 0);
    td_close(c);
}
END_TEST

START_TEST(test_device_mismatch)
{
    td_client *c = it_client("device-mismatch");
    float x[4] = {1, 2, 3, 4};
    int64_t shape[1] = {4};
    td_handle in[2] = {it_upload_f32(c, "cpu:0", 1, shape, x),
                       it_upload_f32(c, "cpu:1", 1, shape, x)};
    td_handle out;
    td_error e;
    int rc = td_op(c, "add", in, 2, &want_reply, &out, 1, &e);
    ck_assert_int_eq(rc, TD_EDEVICE_MISMATCH);
    ck_assert_int_eq(e.detail_kind, TD_DETAIL_DEVICES);
    assert_device(&e.detail.devices.target, "cpu:0");
    assert_device(&e.detail.devices.grad, "cpu:1");
    ck_assert_uint_eq(e.detail.devices.target_index, 0);
    ck_assert_uint_eq(e.detail.devices.grad_index, 1);
    td_close(c);
}
END_TEST

START_TEST(test_backend_mismatch)
{
    td_client *c = it_client("backend-mismatch");
    float x[4] = {1, 2, 3, 4};
    int64_t shape[1] = {4};
    td_handle in[2] = {it_upload_f32(c, "cpu:0", 1, shape, x),
                       it_upload_f32(c, "ref:0", 1, shape, x)};
    td_handle out;
    td_error e;
    int rc = td_op(c, "mul", in, 2, &want_reply, &out, 1, &e);
    ck_assert_int_eq(rc, TD_EBACKEND_MISMATCH);
    ck_assert_int_eq(e.detail_kind, TD_DETAIL_DEVICES);
    assert_device(&e.detail.devices.target, "cpu:0");
    assert_device(&e.detail.devices.grad, "ref:0");
    td_close(c);
}
END_TEST

START_TEST(test_unsupported_op)
{
    td_client *c = it_client("unsupported-op");
    float x[2] = {1, 2};
    int64_t shape[1] = {2};
    td_handle h = it_upload_f32(c, "cpu:0", 1, shape, x), out;
    td_error e;
    int rc = td_op(c, "no_such_op_xyz", &h, 1, &want_reply, &out, 1, &e);
    ck_assert_int_eq(rc, TD_EUNSUPPORTED_OP);
    ck_assert_uint_eq(e.request_id, td_last_request_id(c));
    td_sync(c, &e);
    ck_assert_int_eq(td_ping(c, &e), 0);
    td_close(c);
}
END_TEST

/* ---------------------------------------------------------------- raw wire */

static Tensordd__V1__Response *raw_call(int fd, Tensordd__V1__Request *req, const void *payload,
                                        uint64_t plen)
{
    ck_assert_int_eq(tdt_raw_send(fd, req, payload, plen), 0);
    int closed;
    Tensordd__V1__Response *r = tdt_raw_recv(fd, TDT_TIMEOUT_MS, &closed);
    ck_assert_msg(r != NULL, "no response to request %llu (%s)", (unsigned long long)req->id,
                  closed ? "connection closed" : "timeout or garbage");
    ck_assert_uint_eq(r->id, req->id);
    return r;
}

static int response_code(const Tensordd__V1__Response *r)
{
    if (r->body_case != TENSORDD__V1__RESPONSE__BODY_ERROR || !r->error)
        return 0;
    return -(int)r->error->code;
}

/* Bad uploads the C library would refuse locally, sent raw. */
START_TEST(test_invalid_argument_upload)
{
    int fd = it_raw_session();
    ck_assert_int_ge(fd, 0);
    Tensordd__V1__Device dev = TENSORDD__V1__DEVICE__INIT;
    dev.backend = "cpu";
    int64_t shape[1] = {4};
    Tensordd__V1__Upload up = TENSORDD__V1__UPLOAD__INIT;
    up.handle = 10;
    up.dtype = TENSORDD__V1__DTYPE__DTYPE_INVALID;
    up.n_shape = 1;
    up.shape = shape;
    up.device = &dev;
    Tensordd__V1__Request req = TENSORDD__V1__REQUEST__INIT;
    req.id = 2;
    req.want_reply = 1;
    req.body_case = TENSORDD__V1__REQUEST__BODY_UPLOAD;
    req.upload = &up;
    Tensordd__V1__Response *r = raw_call(fd, &req, NULL, 0);
    ck_assert_int_eq(response_code(r), TD_EINVALID_ARGUMENT);
    ck_assert_uint_eq(r->error->request_id, 2);
    tensordd__v1__response__free_unpacked(r, NULL);

    /* A negative dimension. */
    int64_t neg[2] = {2, -3};
    up.handle = 11;
    up.dtype = TENSORDD__V1__DTYPE__DTYPE_F32;
    up.n_shape = 2;
    up.shape = neg;
    req.id = 3;
    r = raw_call(fd, &req, NULL, 0);
    ck_assert_int_eq(response_code(r), TD_EINVALID_ARGUMENT);
    tensordd__v1__response__free_unpacked(r, NULL);

    /* The session survives: a Sync on the same connection is answered. */
    Tensordd__V1__Sync sy = TENSORDD__V1__SYNC__INIT;
    Tensordd__V1__Request sreq = TENSORDD__V1__REQUEST__INIT;
    sreq.id = 4;
    sreq.body_case = TENSORDD__V1__REQUEST__BODY_SYNC;
    sreq.sync = &sy;
    r = raw_call(fd, &sreq, NULL, 0);
    tensordd__v1__response__free_unpacked(r, NULL);
    close(fd);

    /* The library refuses the same locally, with no request id. */
    td_client *c = it_client("invalid-local");
    td_error e;
    td_handle h;
    ck_assert_int_eq(td_upload(c, NULL, TD_DTYPE_INVALID, 1, shape, shape, 0, &h, &e),
                     TD_EINVALID_ARGUMENT);
    ck_assert_uint_eq(e.request_id, 0);
    ck_assert_int_eq(td_ping(c, &e), 0);
    td_close(c);
}
END_TEST

START_TEST(test_version_mismatch)
{
    int fd = tdt_raw_connect(&it_daemon);
    ck_assert_int_ge(fd, 0);
    Tensordd__V1__Hello hello = TENSORDD__V1__HELLO__INIT;
    hello.min_version = 99;
    hello.max_version = 99;
    Tensordd__V1__Request req = TENSORDD__V1__REQUEST__INIT;
    req.id = 1;
    req.body_case = TENSORDD__V1__REQUEST__BODY_HELLO;
    req.hello = &hello;
    Tensordd__V1__Response *r = raw_call(fd, &req, NULL, 0);
    ck_assert_int_eq(response_code(r), TD_EVERSION_MISMATCH);
    ck_assert_int_eq(r->error->detail_case, TENSORDD__V1__ERROR__DETAIL_VERSION_MISMATCH);
    ck_assert_uint_le(r->error->version_mismatch->server_min, 1);
    ck_assert_uint_ge(r->error->version_mismatch->server_max, 1);
    tensordd__v1__response__free_unpacked(r, NULL);
    close(fd);
}
END_TEST

/* A frame whose protobuf part is not a Request. */
START_TEST(test_protocol_error_bad_message)
{
    int fd = tdt_raw_connect(&it_daemon);
    ck_assert_int_ge(fd, 0);
    uint8_t buf[TD_FRAME_HEADER_SIZE + 16];
    td_frame_encode(buf, 16, 0);
    memset(buf + TD_FRAME_HEADER_SIZE, 0xFF, 16);
    ck_assert_int_eq(tdt_raw_write(fd, buf, sizeof buf), 0);
    int closed;
    Tensordd__V1__Response *r = tdt_raw_recv(fd, 10000, &closed);
    if (r) {
        ck_assert_int_eq(response_code(r), TD_EPROTOCOL_ERROR);
        tensordd__v1__response__free_unpacked(r, NULL);
        ck_assert_msg(tdt_raw_wait_close(fd, 10000), "daemon kept the connection after "
                                                     "PROTOCOL_ERROR");
    } else {
        ck_assert_msg(closed, "daemon neither answered PROTOCOL_ERROR nor closed");
    }
    close(fd);
}
END_TEST

/* Bytes that are not a frame at all (wrong magic). */
START_TEST(test_protocol_error_bad_magic)
{
    int fd = tdt_raw_connect(&it_daemon);
    ck_assert_int_ge(fd, 0);
    const char *http = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
    ck_assert_int_eq(tdt_raw_write(fd, http, strlen(http)), 0);
    int closed;
    Tensordd__V1__Response *r = tdt_raw_recv(fd, 10000, &closed);
    if (r) {
        ck_assert_int_eq(response_code(r), TD_EPROTOCOL_ERROR);
        tensordd__v1__response__free_unpacked(r, NULL);
        ck_assert(tdt_raw_wait_close(fd, 10000));
    } else {
        ck_assert_msg(closed, "daemon neither answered PROTOCOL_ERROR nor closed");
    }
    close(fd);
}
END_TEST

/* A header announcing a 4 GiB message: FRAME_TOO_LARGE, then that connection
 * (only) is closed. */
START_TEST(test_frame_too_large)
{
    td_client *other = it_client("bystander");
    int fd = it_raw_session();
    ck_assert_int_ge(fd, 0);
    uint8_t hdr[TD_FRAME_HEADER_SIZE];
    td_frame_encode(hdr, 0xFFFFFFF0u, 0);
    ck_assert_int_eq(tdt_raw_write(fd, hdr, sizeof hdr), 0);
    int closed;
    Tensordd__V1__Response *r = tdt_raw_recv(fd, 10000, &closed);
    ck_assert_msg(r != NULL, "no FRAME_TOO_LARGE reply (%s)", closed ? "closed" : "timeout");
    ck_assert_int_eq(response_code(r), TD_EFRAME_TOO_LARGE);
    tensordd__v1__response__free_unpacked(r, NULL);
    ck_assert_msg(tdt_raw_wait_close(fd, 10000), "connection not closed after FRAME_TOO_LARGE");
    close(fd);
    td_error e;
    ck_assert_int_eq(td_ping(other, &e), 0);
    td_close(other);
}
END_TEST

/* ---------------------------------------------------------------- poison */

START_TEST(test_poisoned_propagation)
{
    td_client *c = it_client("poison");
    float x[3] = {1, -2, 3}, y[3];
    int64_t shape[1] = {3};
    td_handle a = it_upload_f32(c, "cpu:0", 1, shape, x);
    td_handle bogus = 55555555;
    td_error e;

    /* r1 fails (unknown input) and poisons p; q consumes p (fails: poisoned). */
    td_handle p = td_op1(c, "relu", &bogus, 1, NULL, &e);
    uint64_t r1 = td_last_request_id(c);
    td_handle in[2] = {p, a};
    td_handle q = td_op1(c, "add", in, 2, NULL, &e);
    ck_assert_uint_ne(p, 0);
    ck_assert_uint_ne(q, 0);

    /* The first error of the session, with its original request id. */
    int rc = td_sync(c, &e);
    ck_assert_int_eq(rc, TD_EUNKNOWN_HANDLE);
    ck_assert_uint_eq(e.request_id, r1);

    /* Consumers of p and of q fail POISONED and name the origin. */
    td_handle out;
    rc = td_op(c, "relu", &p, 1, &want_reply, &out, 1, &e);
    ck_assert_int_eq(rc, TD_EPOISONED);
    ck_assert_int_eq(e.detail_kind, TD_DETAIL_POISONED);
    ck_assert_uint_eq(e.detail.poisoned.origin_request, r1);
    ck_assert_int_eq(e.detail.poisoned.origin_code, TD_EUNKNOWN_HANDLE);
    ck_assert_uint_eq(e.detail.poisoned.handle, p);
    td_sync(c, &e);

    rc = td_download(c, q, y, sizeof y, NULL, &e);
    ck_assert_int_eq(rc, TD_EPOISONED);
    ck_assert_int_eq(e.detail_kind, TD_DETAIL_POISONED);
    ck_assert_uint_eq(e.detail.poisoned.origin_request, r1);
    ck_assert_int_eq(e.detail.poisoned.origin_code, TD_EUNKNOWN_HANDLE);
    td_sync(c, &e);

    /* detach takes the same path as every op: when it fails, its output is bound
     * poisoned (it once answered the error and left the output unbound). */
    td_handle pd = td_op1(c, "detach", &bogus, 1, NULL, &e);
    uint64_t rd = td_last_request_id(c);
    ck_assert_int_eq(td_sync(c, &e), TD_EUNKNOWN_HANDLE);
    rc = td_download(c, pd, y, sizeof y, NULL, &e);
    ck_assert_int_eq(rc, TD_EPOISONED);
    ck_assert_uint_eq(e.detail.poisoned.origin_request, rd);
    ck_assert_int_eq(e.detail.poisoned.origin_code, TD_EUNKNOWN_HANDLE);
    td_sync(c, &e);

    /* The session works afterwards and is clean. */
    td_handle r = td_op1(c, "relu", &a, 1, NULL, &e);
    it_download_f32(c, r, y, 3);
    ck_assert(y[0] == 1 && y[1] == 0 && y[2] == 3);
    ck_assert_int_eq(td_sync(c, &e), 0);
    td_close(c);
}
END_TEST

/* ---------------------------------------------------------------- garbage */

START_TEST(test_garbage_does_not_hurt_others)
{
    td_client *c = it_client("busy-bystander");
    int fd = tdt_raw_connect(&it_daemon);
    ck_assert_int_ge(fd, 0);
    enum { CHUNK = 64 * 1024, TOTAL = 1 << 20 };
    uint8_t *junk = malloc(CHUNK);
    uint64_t seed = 0xdeadbeef;
    float x[256], y[256];
    for (int i = 0; i < 256; i++)
        x[i] = (float)i;
    int64_t shape[1] = {256};
    int send_failed = 0;
    for (int sent = 0; sent < TOTAL; sent += CHUNK) {
        for (int i = 0; i < CHUNK; i++)
            junk[i] = (uint8_t)it_rand(&seed);
        /* Once the daemon hangs up, writes fail (EPIPE/ECONNRESET): expected. */
        if (!send_failed && tdt_raw_write(fd, junk, CHUNK) != 0)
            send_failed = 1;
        td_handle h = it_upload_f32(c, "cpu:0", 1, shape, x);
        td_handle in[2] = {h, h};
        td_error e;
        td_handle s = td_op1(c, "add", in, 2, NULL, &e);
        it_download_f32(c, s, y, 256);
        for (int i = 0; i < 256; i++)
            ck_assert(y[i] == 2.0f * (float)i);
        td_release(c, in, 1, &e);
        td_release(c, &s, 1, &e);
    }
    free(junk);
    /* The garbage connection got PROTOCOL_ERROR (or FRAME_TOO_LARGE, if the
     * junk happened to look like a huge header) or was simply closed. */
    int closed;
    Tensordd__V1__Response *r = tdt_raw_recv(fd, 10000, &closed);
    if (r) {
        int code = response_code(r);
        ck_assert_msg(code == TD_EPROTOCOL_ERROR || code == TD_EFRAME_TOO_LARGE,
                      "garbage answered with %s", td_err_name(code));
        tensordd__v1__response__free_unpacked(r, NULL);
        ck_assert(tdt_raw_wait_close(fd, 10000));
    } else {
        ck_assert_msg(closed, "garbage connection neither answered nor closed");
    }
    close(fd);
    td_error e;
    ck_assert_int_eq(td_sync(c, &e), 0);
    td_close(c);
}
END_TEST

/* An attribute the op does not take (a typo) is INVALID_ARGUMENT naming it, the op and the
 * attributes it accepts, answered before anything is queued (it used to be ignored). */
START_TEST(test_unknown_attribute)
{
    td_client *c = it_client("unknown-attribute");
    float x[6] = {0, 1, 2, 3, 4, 5};
    int64_t s23[2] = {2, 3}, d0[1] = {0};
    td_handle in = it_upload_f32(c, "cpu:0", 2, s23, x), out;
    td_attr at[2] = {td_attr_ints("dim", d0, 1), td_attr_bool("keepdm", 1)};
    td_op_opts oo = {.want_reply = 1, .attrs = at, .nattrs = 2};
    td_error e;
    int rc = td_op(c, "sum", &in, 1, &oo, &out, 1, &e);
    ck_assert_int_eq(rc, TD_EINVALID_ARGUMENT);
    ck_assert_int_eq(e.detail_kind, TD_DETAIL_ARGUMENT);
    ck_assert_str_eq(e.detail.argument.argument, "keepdm");
    ck_assert_ptr_nonnull(
        strstr(e.message, "sum takes no attribute 'keepdm' (accepts: dim, keepdim)"));
    td_sync(c, &e);
    /* the wrong type: a string where slice wants an int */
    td_attr sl[2] = {td_attr_int("dim", 1),
                     (td_attr){.name = "stop", .kind = TD_ATTR_STR, .s = "2"}};
    oo.attrs = sl;
    rc = td_op(c, "slice", &in, 1, &oo, &out, 1, &e);
    ck_assert_int_eq(rc, TD_EINVALID_ARGUMENT);
    ck_assert_str_eq(e.detail.argument.argument, "stop");
    td_sync(c, &e);
    /* the session goes on */
    td_attr ok[2] = {td_attr_ints("dim", d0, 1), td_attr_bool("keepdim", 1)};
    oo.attrs = ok;
    ck_assert_int_eq(td_op(c, "sum", &in, 1, &oo, &out, 1, &e), 0);
    float y[3];
    ck_assert_int_eq(td_download(c, out, y, sizeof y, NULL, &e), 0);
    ck_assert(y[0] == 3 && y[1] == 5 && y[2] == 7);
    td_close(c);
}
END_TEST

Suite *it_error_suite(void)
{
    Suite *s = suite_create("errors");
    TCase *tc = tcase_create("typed");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_unknown_handle);
    tcase_add_test(tc, test_shape_mismatch);
    tcase_add_test(tc, test_device_mismatch);
    tcase_add_test(tc, test_backend_mismatch);
    tcase_add_test(tc, test_unsupported_op);
    tcase_add_test(tc, test_invalid_argument_upload);
    tcase_add_test(tc, test_version_mismatch);
    tcase_add_test(tc, test_protocol_error_bad_message);
    tcase_add_test(tc, test_protocol_error_bad_magic);
    tcase_add_test(tc, test_frame_too_large);
    tcase_add_test(tc, test_unknown_attribute);
    suite_add_tcase(s, tc);

    tc = tcase_create("async");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_poisoned_propagation);
    tcase_add_test(tc, test_garbage_does_not_hurt_others);
    suite_add_tcase(s, tc);
    return s;
}
