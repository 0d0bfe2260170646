/* test_multi.c -- integration: td_multi_*, one client over two daemons of its own (on
 * 127.0.0.1, both with one token): devices named by alias and by endpoint, a tensor moved
 * daemon to daemon bit-exact and back, DEVICE_MISMATCH naming both devices, bad names
 * typed INVALID_ARGUMENT, peer endpoints used for the push, everything closed. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "itest.h"

#define TOKEN "multi-test-token"

/* Started once for the suite, in the runner's process (an unchecked fixture), so they are
 * stopped even when a test fails. */
static tdt_daemon da, db;
static int started_a, started_b;
static char token_path[64];

static void daemons_start(void)
{
    snprintf(token_path, sizeof token_path, "/tmp/tdd-multi-token-XXXXXX");
    int fd = mkstemp(token_path);
    if (fd < 0 || write(fd, TOKEN, strlen(TOKEN)) != (ssize_t)strlen(TOKEN)) {
        fprintf(stderr, "multi: cannot write the token file\n");
        if (fd >= 0)
            close(fd);
        return;
    }
    close(fd);
    /* the pushes go to the other daemon, on loopback */
    const char *args[] = {"--transfer-peers", "127.0.0.1", "--cpu-devices", "2", "--token-file",
                          token_path,         NULL};
    started_a = tdt_daemon_start(&da, args, 0) == 0;
    started_b = tdt_daemon_start(&db, args, 0) == 0;
}

static void daemons_stop(void)
{
    if (started_a)
        tdt_daemon_stop(&da);
    if (started_b)
        tdt_daemon_stop(&db);
    started_a = started_b = 0;
    unlink(token_path);
}

static td_multi *open_ab(const char *const *peers)
{
    ck_assert_msg(started_a && started_b, "the two daemons did not start");
    const char *eps[2] = {da.endpoint, db.endpoint};
    const char *aliases[2] = {"a", "b"};
    td_connect_opts o = {.token = TOKEN, .client_name = "multi-test", .timeout_ms = TDT_TIMEOUT_MS};
    td_multi *m = NULL;
    td_error e;
    int rc = td_multi_connect(eps, aliases, peers, 2, &o, NULL, &m, &e);
    ck_assert_msg(rc == 0, "td_multi_connect: %s: %s", td_err_name(rc), e.message);
    ck_assert_ptr_nonnull(m);
    return m;
}

static void expect_bad(int rc, const td_error *e, const char *argument)
{
    ck_assert_msg(rc == TD_EINVALID_ARGUMENT, "want INVALID_ARGUMENT, got %s (%s)", td_err_name(rc),
                  e->message);
    ck_assert_int_eq(e->code, TD_EINVALID_ARGUMENT);
    ck_assert_int_eq(e->detail_kind, TD_DETAIL_ARGUMENT);
    ck_assert_str_eq(e->detail.argument.argument, argument);
}

START_TEST(test_multi_names)
{
    td_multi *m = open_ab(NULL);
    td_error e;
    ck_assert_uint_eq(td_multi_count(m), 2);
    td_client *a = td_multi_at(m, 0), *b = td_multi_at(m, 1), *c = NULL;
    ck_assert_ptr_nonnull(a);
    ck_assert_ptr_nonnull(b);
    ck_assert_ptr_ne(a, b);
    ck_assert_ptr_null(td_multi_at(m, 2));
    ck_assert_int_eq(td_multi_client(m, "a", &c, &e), 0);
    ck_assert_ptr_eq(c, a);
    ck_assert_int_eq(td_multi_client(m, db.endpoint, &c, &e), 0);
    ck_assert_ptr_eq(c, b);
    ck_assert_str_eq(td_multi_name(m, a), "a");
    ck_assert_str_eq(td_multi_name(m, b), "b");
    /* the two sessions are with two daemons */
    ck_assert_int_eq(td_ping(a, &e), 0);
    ck_assert_int_eq(td_ping(b, &e), 0);

    /* by alias and by endpoint */
    td_device dev;
    c = NULL;
    ck_assert_int_eq(td_multi_resolve(m, "a/cpu:1", &c, &dev, &e), 0);
    ck_assert_ptr_eq(c, a);
    ck_assert_str_eq(dev.backend, "cpu");
    ck_assert_uint_eq(dev.ordinal, 1);
    char name[200];
    snprintf(name, sizeof name, "%s/cpu:0", db.endpoint);
    ck_assert_int_eq(td_multi_resolve(m, name, &c, &dev, &e), 0);
    ck_assert_ptr_eq(c, b);
    ck_assert_uint_eq(dev.ordinal, 0);
    ck_assert_int_eq(td_multi_resolve(m, "b/ref", &c, &dev, &e), 0);
    ck_assert_ptr_eq(c, b);
    ck_assert_str_eq(dev.backend, "ref");

    /* bad names: typed, outputs cleared, no crash */
    const char *bad[] = {"cpu:0", "c/cpu:0", "a/gpu:x", "/cpu:0", "a/", "a/cpu:", "tcp://x/cpu:0"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        c = a;
        int rc = td_multi_resolve(m, bad[i], &c, &dev, &e);
        expect_bad(rc, &e, "device");
        ck_assert_ptr_null(c);
    }
    expect_bad(td_multi_resolve(m, NULL, &c, &dev, &e), &e, "device");
    expect_bad(td_multi_resolve(NULL, "a/cpu:0", &c, &dev, &e), &e, "device");
    c = a;
    expect_bad(td_multi_client(m, "zzz", &c, &e), &e, "name");
    ck_assert_ptr_null(c);
    ck_assert_msg(strstr(e.message, "zzz") && strstr(e.message, "a, "), "message: %s", e.message);
    expect_bad(td_multi_client(m, NULL, &c, &e), &e, "name");
    /* the error pointer may be NULL */
    ck_assert_int_eq(td_multi_resolve(m, "nope", NULL, NULL, NULL), TD_EINVALID_ARGUMENT);

    /* a client not of this set */
    td_client *other = tdt_connect(it_daemon.endpoint, "multi-outsider");
    ck_assert_ptr_nonnull(other);
    ck_assert_ptr_null(td_multi_name(m, other));
    td_close(other);
    ck_assert_ptr_null(td_multi_name(m, NULL));
    ck_assert_uint_eq(td_multi_count(NULL), 0);

    ck_assert_int_eq(td_multi_sync(m, &e), 0);
    td_multi_close(m);
    td_multi_close(NULL);
}
END_TEST

START_TEST(test_multi_connect_refused)
{
    ck_assert_msg(started_a && started_b, "the two daemons did not start");
    td_connect_opts o = {.token = TOKEN, .timeout_ms = TDT_TIMEOUT_MS};
    td_multi *m = (td_multi *)(uintptr_t)1; /* must be cleared */
    td_error e;
    const char *eps[3] = {da.endpoint, db.endpoint, NULL};
    const char *dup_alias[2] = {"x", "x"};
    expect_bad(td_multi_connect(eps, dup_alias, NULL, 2, &o, NULL, &m, &e), &e, "aliases");
    ck_assert_ptr_null(m);
    const char *colon[2] = {"x", "y:1"};
    expect_bad(td_multi_connect(eps, colon, NULL, 2, &o, NULL, &m, &e), &e, "aliases");
    const char *slash[2] = {"x/", NULL};
    expect_bad(td_multi_connect(eps, slash, NULL, 2, &o, NULL, &m, &e), &e, "aliases");
    const char *empty[2] = {"", NULL};
    expect_bad(td_multi_connect(eps, empty, NULL, 2, &o, NULL, &m, &e), &e, "aliases");
    const char *twice[2] = {da.endpoint, da.endpoint};
    expect_bad(td_multi_connect(twice, NULL, NULL, 2, &o, NULL, &m, &e), &e, "aliases");
    expect_bad(td_multi_connect(eps, NULL, NULL, 3, &o, NULL, &m, &e), &e, "endpoints");
    expect_bad(td_multi_connect(eps, NULL, NULL, 0, &o, NULL, &m, &e), &e, "endpoints");
    expect_bad(td_multi_connect(NULL, NULL, NULL, 2, &o, NULL, &m, &e), &e, "endpoints");
    expect_bad(td_multi_connect(eps, NULL, NULL, 2, &o, NULL, NULL, &e), &e, "out");

    /* the daemon refuses (no token): the error is the daemon's and names the endpoint */
    td_connect_opts none = {.timeout_ms = TDT_TIMEOUT_MS};
    const char *one[1] = {db.endpoint};
    int rc = td_multi_connect(one, NULL, NULL, 1, &none, NULL, &m, &e);
    ck_assert_int_eq(rc, TD_EUNAUTHENTICATED);
    ck_assert_ptr_null(m);
    ck_assert_msg(strstr(e.message, db.endpoint) != NULL, "message: %s", e.message);
    /* a malformed endpoint after a good one: the first session is closed again */
    const char *bad_ep[2] = {da.endpoint, "udp://127.0.0.1:1"};
    rc = td_multi_connect(bad_ep, NULL, NULL, 2, &o, NULL, &m, &e);
    ck_assert_int_eq(rc, TD_EINVALID_ARGUMENT);
    ck_assert_ptr_null(m);
    ck_assert_msg(strstr(e.message, "udp://") != NULL, "message: %s", e.message);
}
END_TEST

START_TEST(test_multi_move)
{
    td_multi *m = open_ab(NULL);
    td_client *a = td_multi_at(m, 0), *b = td_multi_at(m, 1);
    td_error e;
    float in[15], out[15];
    uint64_t seed = 0x5eed16;
    for (int i = 0; i < 15; i++)
        in[i] = it_randf(&seed, -3.0f, 3.0f);
    in[7] = -0.0f;
    int64_t shape[2] = {3, 5};
    td_handle x = it_upload_f32(a, "cpu:1", 2, shape, in);

    /* a -> b, by alias */
    td_handle y = 0;
    int rc = td_multi_move(m, a, x, "b/cpu:1", &y, &e);
    ck_assert_msg(rc == 0, "move a->b: %s: %s", td_err_name(rc), e.message);
    ck_assert_uint_ne(y, 0);
    td_tensor_info info;
    memset(out, 0, sizeof out);
    rc = td_download(b, y, out, sizeof out, &info, &e);
    ck_assert_msg(rc == 0, "download from b: %s", e.message);
    ck_assert_mem_eq(in, out, sizeof in);
    ck_assert_str_eq(info.device.backend, "cpu");
    ck_assert_uint_eq(info.device.ordinal, 1);
    ck_assert_int_eq(info.ndim, 2);
    ck_assert_int_eq(info.shape[0], 3);
    ck_assert_int_eq(info.shape[1], 5);
    /* a handle of b's session: ops there take it */
    td_handle yy = td_op1(b, "add", (td_handle[]){y, y}, 2, NULL, &e);
    ck_assert_uint_ne(yy, 0);
    it_download_f32(b, yy, out, 15);
    for (int i = 0; i < 15; i++)
        ck_assert_float_eq(out[i], in[i] + in[i]);

    /* b -> a, by endpoint, to another device than the source's */
    char to[200];
    snprintf(to, sizeof to, "%s/cpu:0", da.endpoint);
    td_handle z = 0;
    rc = td_multi_move(m, b, yy, to, &z, &e);
    ck_assert_msg(rc == 0, "move b->a: %s: %s", td_err_name(rc), e.message);
    rc = td_download(a, z, out, sizeof out, &info, &e);
    ck_assert_msg(rc == 0, "download from a: %s", e.message);
    for (int i = 0; i < 15; i++)
        ck_assert_float_eq(out[i], in[i] + in[i]);
    ck_assert_uint_eq(info.device.ordinal, 0);

    /* within one daemon: td_to_device in the same session, which keeps the autodiff
     * graph (a transfer would land a new leaf) */
    td_device cpu1 = it_dev("cpu:1");
    td_handle xg = 0, w = 0;
    ck_assert_int_eq(td_upload(a, &cpu1, TD_F32, 2, shape, in, 1, &xg, &e), 0);
    ck_assert_int_eq(td_multi_move(m, a, xg, "a/cpu:0", &w, &e), 0);
    ck_assert_uint_ne(w, 0);
    rc = td_download(a, w, out, sizeof out, &info, &e);
    ck_assert_msg(rc == 0, "download: %s", e.message);
    ck_assert_mem_eq(in, out, sizeof in);
    ck_assert_uint_eq(info.device.ordinal, 0);
    ck_assert_int_eq(info.requires_grad, 1);

    /* bad moves are typed and change nothing */
    td_handle v = 99;
    expect_bad(td_multi_move(m, a, x, "c/cpu:0", &v, &e), &e, "device");
    ck_assert_uint_eq(v, 0);
    expect_bad(td_multi_move(m, a, x, "cpu:0", &v, &e), &e, "device");
    td_client *other = tdt_connect(it_daemon.endpoint, "multi-outsider");
    ck_assert_ptr_nonnull(other);
    expect_bad(td_multi_move(m, other, x, "b/cpu:0", &v, &e), &e, "src");
    td_close(other);
    expect_bad(td_multi_move(NULL, a, x, "b/cpu:0", &v, &e), &e, "src");
    /* a handle a never bound: the daemon's own answer */
    rc = td_multi_move(m, a, 123456, "b/cpu:0", &v, &e);
    ck_assert_int_eq(rc, TD_EUNKNOWN_HANDLE);

    ck_assert_int_eq(td_multi_sync(m, &e), 0);
    td_multi_close(m);
}
END_TEST

START_TEST(test_multi_mismatch)
{
    td_multi *m = open_ab(NULL);
    td_error e;
    int rc = td_multi_check_same(m, "a/cpu:0", "b/cpu:0", &e);
    ck_assert_int_eq(rc, TD_EDEVICE_MISMATCH);
    ck_assert_int_eq(e.code, TD_EDEVICE_MISMATCH);
    ck_assert_msg(strstr(e.message, "a/cpu:0") && strstr(e.message, "b/cpu:0") &&
                      strstr(e.message, "two daemons"),
                  "message: %s", e.message);
    ck_assert_int_eq(e.detail_kind, TD_DETAIL_DEVICES);
    ck_assert_str_eq(e.detail.devices.target.backend, "cpu");
    ck_assert_str_eq(e.detail.devices.grad.backend, "cpu");
    /* the same device of different daemons still differs, named by endpoint too */
    char by_ep[200];
    snprintf(by_ep, sizeof by_ep, "%s/cpu:1", db.endpoint);
    rc = td_multi_check_same(m, "a/cpu:1", by_ep, &e);
    ck_assert_int_eq(rc, TD_EDEVICE_MISMATCH);
    ck_assert_msg(strstr(e.message, "a/cpu:1") && strstr(e.message, "b/cpu:1"), "message: %s",
                  e.message);
    /* two devices of one daemon */
    rc = td_multi_check_same(m, "a/cpu:0", "a/cpu:1", &e);
    ck_assert_int_eq(rc, TD_EDEVICE_MISMATCH);
    ck_assert_msg(strstr(e.message, "a/cpu:0") && strstr(e.message, "a/cpu:1") &&
                      strstr(e.message, "one daemon"),
                  "message: %s", e.message);
    ck_assert_uint_eq(e.detail.devices.target.ordinal, 0);
    ck_assert_uint_eq(e.detail.devices.grad.ordinal, 1);
    /* the same device, named two ways */
    char a_ep[200];
    snprintf(a_ep, sizeof a_ep, "%s/cpu:0", da.endpoint);
    ck_assert_int_eq(td_multi_check_same(m, "a/cpu:0", a_ep, &e), 0);
    ck_assert_int_eq(td_multi_check_same(m, "b/ref", "b/ref:0", &e), 0);
    /* bad names are not mismatches */
    expect_bad(td_multi_check_same(m, "a/cpu:0", "q/cpu:0", &e), &e, "device");
    expect_bad(td_multi_check_same(m, "a/cpu:0", NULL, &e), &e, "device");
    td_multi_close(m);
}
END_TEST

/* peer_endpoints: where the target is pushed to. Naming daemon a as b's peer sends b's
 * capability to a, which never issued it: refused, typed, and nothing is bound. */
START_TEST(test_multi_peer_endpoints)
{
    const char *peers[2] = {NULL, da.endpoint};
    td_multi *m = open_ab(peers);
    td_client *a = td_multi_at(m, 0);
    td_error e;
    float in[4] = {1, 2, 3, 4};
    int64_t shape[1] = {4};
    td_handle x = it_upload_f32(a, "cpu:0", 1, shape, in), y = 77;
    int rc = td_multi_move(m, a, x, "b/cpu:0", &y, &e);
    ck_assert_msg(rc == TD_EINVALID_ARGUMENT, "want INVALID_ARGUMENT, got %s (%s)", td_err_name(rc),
                  e.message);
    ck_assert_str_eq(e.detail.argument.argument, "capability");
    ck_assert_uint_eq(y, 0);
    /* b -> a goes to a's own endpoint (its peer is itself) */
    td_client *b = td_multi_at(m, 1);
    td_handle u = it_upload_f32(b, "cpu:0", 1, shape, in), v = 0;
    rc = td_multi_move(m, b, u, "a/cpu:0", &v, &e);
    ck_assert_msg(rc == 0, "move b->a: %s: %s", td_err_name(rc), e.message);
    float out[4];
    it_download_f32(a, v, out, 4);
    ck_assert_mem_eq(in, out, sizeof in);
    td_multi_close(m);
}
END_TEST

/* A tensor off host memory: staged through the source's cpu:0, landed in the target's
 * cpu:0 and copied on to its cuda:0. Runs only where the daemons have a cuda device. */
START_TEST(test_multi_move_cuda)
{
    td_multi *m = open_ab(NULL);
    td_client *a = td_multi_at(m, 0), *b = td_multi_at(m, 1);
    td_error e;
    td_device_info devs[16];
    size_t n = 0;
    ck_assert_int_eq(td_list_devices(a, devs, 16, &n, &e), 0);
    int cuda = 0;
    for (size_t i = 0; i < n && i < 16; i++)
        cuda |= strcmp(devs[i].device.backend, "cuda") == 0 && devs[i].device.ordinal == 0 &&
                !devs[i].failed;
    if (!cuda) {
        fprintf(stderr, "multi: no cuda:0 here; moves from and to cuda devices not checked\n");
        td_multi_close(m);
        return;
    }
    float in[6] = {1.5f, -2.25f, 3.0f, 0.0f, -0.0f, 1e-30f}, out[6];
    int64_t shape[2] = {2, 3};
    td_handle x = it_upload_f32(a, "cuda:0", 2, shape, in), y = 0, z = 0;
    int rc = td_multi_move(m, a, x, "b/cuda:0", &y, &e);
    ck_assert_msg(rc == 0, "move a/cuda:0 -> b/cuda:0: %s: %s", td_err_name(rc), e.message);
    td_tensor_info info;
    ck_assert_int_eq(td_download(b, y, out, sizeof out, &info, &e), 0);
    ck_assert_mem_eq(in, out, sizeof in);
    ck_assert_str_eq(info.device.backend, "cuda");
    rc = td_multi_move(m, b, y, "a/cpu:1", &z, &e);
    ck_assert_msg(rc == 0, "move b/cuda:0 -> a/cpu:1: %s: %s", td_err_name(rc), e.message);
    ck_assert_int_eq(td_download(a, z, out, sizeof out, &info, &e), 0);
    ck_assert_mem_eq(in, out, sizeof in);
    ck_assert_str_eq(info.device.backend, "cpu");
    ck_assert_int_eq(td_multi_sync(m, &e), 0);
    td_multi_close(m);
}
END_TEST

Suite *it_multi_suite(void)
{
    Suite *s = suite_create("multi");
    TCase *tc = tcase_create("two daemons");
    tcase_add_unchecked_fixture(tc, daemons_start, daemons_stop);
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_multi_names);
    tcase_add_test(tc, test_multi_connect_refused);
    tcase_add_test(tc, test_multi_move);
    tcase_add_test(tc, test_multi_mismatch);
    tcase_add_test(tc, test_multi_peer_endpoints);
    tcase_add_test(tc, test_multi_move_cuda);
    suite_add_tcase(s, tc);
    return s;
}
