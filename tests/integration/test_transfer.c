/* test_transfer.c -- integration: td_transfer_accept / td_transfer_send, between two sessions
 * of the shared daemon (the source daemon pushes to its own listener): the bytes land
 * bit-exact, the capability is spent by its first use, a foreign one is refused, typed. */
#include <string.h>

#include "itest.h"

START_TEST(test_transfer_between_sessions)
{
    td_client *src = it_client("transfer-src"), *dst = it_client("transfer-dst");
    td_error e;
    int64_t shape[2] = {3, 4};
    float in[12], out[12];
    for (int i = 0; i < 12; i++)
        in[i] = (float)i * 0.5f - 1.0f;
    td_handle x = it_upload_f32(src, "cpu:0", 2, shape, in);
    td_device cpu1 = it_dev("cpu:1");
    uint8_t cap[TD_CAPABILITY_SIZE];
    td_handle y = 0;
    int rc = td_transfer_accept(dst, &cpu1, TD_F32, 2, shape, cap, &y, &e);
    ck_assert_msg(rc == 0, "accept: %s", e.message);
    ck_assert_uint_ne(y, 0);
    rc = td_transfer_send(src, x, it_daemon.endpoint, "", cap, &e);
    ck_assert_msg(rc == 0, "send: %s", e.message);
    td_tensor_info info;
    rc = td_download(dst, y, out, sizeof out, &info, &e);
    ck_assert_msg(rc == 0, "download: %s", e.message);
    ck_assert_str_eq(info.device.backend, "cpu");
    ck_assert_int_eq(info.device.ordinal, 1);
    ck_assert_mem_eq(in, out, sizeof in);
    /* the same capability again: spent */
    rc = td_transfer_send(src, x, it_daemon.endpoint, "", cap, &e);
    ck_assert_int_eq(rc, TD_EINVALID_ARGUMENT);
    ck_assert_str_eq(e.detail.argument.argument, "capability");
    /* one the daemon never issued */
    memset(cap, 0x5A, sizeof cap);
    ck_assert_int_eq(td_transfer_send(src, x, it_daemon.endpoint, "", cap, &e),
                     TD_EINVALID_ARGUMENT);
    /* a bad endpoint, before any connection */
    ck_assert_int_eq(td_transfer_send(src, x, "udp://x:1", "", cap, &e), TD_EINVALID_ARGUMENT);
    /* td_transfer: describe, accept and send in one; a strided view lands contiguous */
    td_attr dims[2] = {td_attr_int("dim0", 0), td_attr_int("dim1", 1)};
    td_op_opts tr = {.attrs = dims, .nattrs = 2};
    td_handle xt = td_op1(src, "transpose", &x, 1, &tr, &e), z = 0;
    ck_assert_uint_ne(xt, 0);
    rc = td_transfer(src, xt, dst, it_daemon.endpoint, "", NULL, &z, &e);
    ck_assert_msg(rc == 0, "td_transfer: %s", e.message);
    rc = td_download(dst, z, out, sizeof out, &info, &e);
    ck_assert_msg(rc == 0, "download: %s", e.message);
    ck_assert_int_eq(info.shape[0], 4);
    ck_assert_int_eq(info.shape[1], 3);
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 3; j++)
            ck_assert_float_eq(out[i * 3 + j], in[j * 4 + i]);
    ck_assert_int_eq(td_sync(src, &e), 0);
    ck_assert_int_eq(td_sync(dst, &e), 0);
    td_close(src);
    td_close(dst);
}
END_TEST

Suite *it_transfer_suite(void)
{
    Suite *s = suite_create("transfer");
    TCase *tc = tcase_create("between sessions");
    tcase_add_test(tc, test_transfer_between_sessions);
    suite_add_tcase(s, tc);
    return s;
}
