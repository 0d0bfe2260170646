/* main.c -- integration suite runner: one shared daemon, helpers, lifecycle checks, final liveness.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "itest.h"

tdt_daemon it_daemon;

td_client *it_client(const char *name)
{
    td_client *c = tdt_connect(it_daemon.endpoint, name);
    ck_assert_msg(c != NULL, "cannot connect to %s", it_daemon.endpoint);
    return c;
}

td_device it_dev(const char *text)
{
    td_device d;
    ck_assert_int_eq(td_device_parse(text, &d), 0);
    return d;
}

td_handle it_upload_f32(td_client *c, const char *dev, int ndim, const int64_t *shape,
                        const float *data)
{
    td_device d = it_dev(dev);
    td_handle h = 0;
    td_error e;
    int rc = td_upload(c, &d, TD_F32, ndim, shape, data, 0, &h, &e);
    ck_assert_msg(rc == 0, "upload: %s: %s", td_err_name(rc), e.message);
    ck_assert_uint_ne(h, 0);
    return h;
}

void it_download_f32(td_client *c, td_handle h, float *out, size_t n)
{
    td_error e;
    td_tensor_info info;
    int rc = td_download(c, h, out, n * sizeof(float), &info, &e);
    ck_assert_msg(rc == 0, "download of %llu: %s: %s (request %llu)", (unsigned long long)h,
                  td_err_name(rc), e.message, (unsigned long long)e.request_id);
    ck_assert_int_eq(info.dtype, TD_F32);
}

uint64_t it_rand(uint64_t *s)
{
    uint64_t x = *s;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *s = x;
    return x * 0x2545F4914F6CDD1Dull;
}

float it_randf(uint64_t *s, float lo, float hi)
{
    return lo + (hi - lo) * (float)(it_rand(s) >> 40) / (float)(1u << 24);
}

int it_raw_session(void)
{
    int fd = tdt_raw_connect(&it_daemon);
    if (fd < 0)
        return -1;
    Tensordd__V1__Hello hello = TENSORDD__V1__HELLO__INIT;
    hello.min_version = 1;
    hello.max_version = 1;
    hello.client_name = "raw-test";
    Tensordd__V1__Request req = TENSORDD__V1__REQUEST__INIT;
    req.id = 1;
    req.body_case = TENSORDD__V1__REQUEST__BODY_HELLO;
    req.hello = &hello;
    int closed;
    Tensordd__V1__Response *r = NULL;
    if (tdt_raw_send(fd, &req, NULL, 0) == 0)
        r = tdt_raw_recv(fd, TDT_TIMEOUT_MS, &closed);
    int ok = r && r->id == 1 && r->body_case == TENSORDD__V1__RESPONSE__BODY_HELLO;
    if (r)
        tensordd__v1__response__free_unpacked(r, NULL);
    if (!ok) {
        close(fd);
        return -1;
    }
    return fd;
}

/* ---------------------------------------------------------------- lifecycle */

/* A daemon of its own: tcp and unix listeners, devices listed, clean exit 0 on SIGTERM. */
START_TEST(test_lifecycle_own_daemon)
{
    tdt_daemon d;
    const char *args[] = {"--cpu-devices", "2", NULL};
    ck_assert_int_eq(tdt_daemon_start(&d, args, 1), 0);

    td_client *c = tdt_connect(d.endpoint, "lifecycle");
    ck_assert_ptr_nonnull(c);
    td_error e;
    ck_assert_int_eq(td_ping(c, &e), 0);
    ck_assert_uint_gt(td_session_id(c), 0);

    td_device_info devs[16];
    size_t n = 0;
    ck_assert_int_eq(td_list_devices(c, devs, 16, &n, &e), 0);
    int cpu0 = 0, cpu1 = 0, ref0 = 0;
    for (size_t i = 0; i < n && i < 16; i++) {
        char s[40];
        td_device_format(&devs[i].device, s, sizeof s);
        cpu0 |= strcmp(s, "cpu:0") == 0;
        cpu1 |= strcmp(s, "cpu:1") == 0;
        ref0 |= strcmp(s, "ref:0") == 0;
    }
    ck_assert_msg(cpu0 && cpu1 && ref0, "devices must include cpu:0, cpu:1, ref:0 (got %zu)", n);
    td_close(c);

    /* The same daemon over its unix socket. */
    char ep[160];
    snprintf(ep, sizeof ep, "unix://%s", d.unix_path);
    c = tdt_connect(ep, "lifecycle-unix");
    ck_assert_ptr_nonnull(c);
    float x[3] = {1, -2, 3}, y[3];
    int64_t shape[1] = {3};
    td_handle h = it_upload_f32(c, "cpu:0", 1, shape, x);
    it_download_f32(c, h, y, 3);
    ck_assert_mem_eq(x, y, sizeof x);
    td_close(c);

    ck_assert_int_eq(tdt_daemon_stop(&d), 0);
}
END_TEST

/* A client still connected when SIGTERM comes: the daemon must still exit 0. */
START_TEST(test_lifecycle_sigterm_with_client)
{
    tdt_daemon d;
    ck_assert_int_eq(tdt_daemon_start(&d, NULL, 0), 0);
    td_client *c = tdt_connect(d.endpoint, "lingering");
    ck_assert_ptr_nonnull(c);
    td_error e;
    ck_assert_int_eq(td_ping(c, &e), 0);
    ck_assert_int_eq(tdt_daemon_stop(&d), 0);
    td_close(c); /* must not hang or die of SIGPIPE on a closed daemon */
}
END_TEST

/* ---------------------------------------------------------------- the end */

/* Runs last: after every abuse above, the shared daemon still answers. */
START_TEST(test_final_daemon_alive)
{
    ck_assert_msg(tdt_daemon_alive(&it_daemon), "the shared daemon died");
    td_client *c = it_client("final");
    td_error e;
    ck_assert_int_eq(td_ping(c, &e), 0);
    td_stats st;
    ck_assert_int_eq(td_stats_get(c, &st, &e), 0);
    ck_assert_uint_ge(st.sessions, 1);
    ck_assert_uint_gt(st.requests, 0);
    td_close(c);
}
END_TEST

static Suite *lifecycle_suite(void)
{
    Suite *s = suite_create("lifecycle");
    TCase *tc = tcase_create("own daemon");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_lifecycle_own_daemon);
    tcase_add_test(tc, test_lifecycle_sigterm_with_client);
    suite_add_tcase(s, tc);
    return s;
}

static Suite *final_suite(void)
{
    Suite *s = suite_create("final");
    TCase *tc = tcase_create("alive");
    tcase_add_test(tc, test_final_daemon_alive);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    /* the transfer suite pushes from the daemon to its own listener */
    const char *args[] = {"--cpu-devices", "2", "--transfer-peers", "127.0.0.1", NULL};
    if (tdt_daemon_start(&it_daemon, args, 0) != 0) {
        fprintf(stderr, "integration: cannot start the daemon (TDD_BIN=%s)\n",
                getenv("TDD_BIN") ? getenv("TDD_BIN") : "(unset)");
        return 1;
    }
    SRunner *sr = srunner_create(lifecycle_suite());
    srunner_add_suite(sr, it_data_suite());
    srunner_add_suite(sr, it_error_suite());
    srunner_add_suite(sr, it_autograd_suite());
    srunner_add_suite(sr, it_double_backward_suite());
    srunner_add_suite(sr, it_ops_wire_suite());
    srunner_add_suite(sr, it_failed_binds_suite());
    srunner_add_suite(sr, it_resume_suite());
    srunner_add_suite(sr, it_tls_suite());
    srunner_add_suite(sr, it_memfd_suite());
    srunner_add_suite(sr, it_handles_suite());
    srunner_add_suite(sr, it_pipeline_step_suite());
    srunner_add_suite(sr, it_transfer_suite());
    srunner_add_suite(sr, it_multi_suite());
    srunner_add_suite(sr, final_suite());
    srunner_run_all(sr, CK_ENV); /* CK_VERBOSITY=verbose lists every test */
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);

    int alive = tdt_daemon_alive(&it_daemon);
    int status = tdt_daemon_stop(&it_daemon);
    if (!alive) {
        fprintf(stderr, "integration: FAIL: the shared daemon was not running at the end\n");
        failed++;
    } else if (status != 0) {
        fprintf(stderr,
                "integration: FAIL: the shared daemon exited with status %d on SIGTERM "
                "(want 0)\n",
                status);
        failed++;
    } else {
        printf("integration: shared daemon exited 0 on SIGTERM\n");
    }
    return failed ? 1 : 0;
}
