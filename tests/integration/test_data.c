/* test_data.c -- integration: bytes and numbers through a real daemon (round trips, ops vs a C
 * reference). */
#include <arpa/inet.h>
#include <math.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "itest.h"

/* ---------------------------------------------------------------- round trips */

START_TEST(test_roundtrip_small_dtypes)
{
    td_client *c = it_client("roundtrip-small");
    td_error e;
    td_device cpu = it_dev("cpu:0");
    uint64_t seed = 0x1234;
    /* Every dtype of the wire, odd sizes, bit patterns including NaN payloads. */
    const td_dtype dts[] = {TD_F32, TD_F64, TD_F16, TD_BF16, TD_I32, TD_I64, TD_BOOL};
    for (size_t k = 0; k < sizeof dts / sizeof dts[0]; k++) {
        int64_t shape[3] = {3, 5, 7};
        size_t bytes = 105 * td_dtype_size(dts[k]);
        uint8_t *in = malloc(bytes), *out = malloc(bytes + 16);
        for (size_t i = 0; i < bytes; i++)
            in[i] = (uint8_t)it_rand(&seed);
        if (dts[k] == TD_BOOL)
            for (size_t i = 0; i < bytes; i++)
                in[i] &= 1;
        td_handle h;
        int rc = td_upload(c, &cpu, dts[k], 3, shape, in, 0, &h, &e);
        ck_assert_msg(rc == 0, "upload %s: %s", td_dtype_name(dts[k]), e.message);
        td_tensor_info info;
        memset(out, 0xAB, bytes + 16);
        rc = td_download(c, h, out, bytes + 16, &info, &e);
        if (rc == TD_EUNSUPPORTED_DTYPE && dts[k] != TD_F32) {
            /* This slice of the daemon may serve f32 only; a typed refusal is fine. */
            free(in);
            free(out);
            continue;
        }
        ck_assert_msg(rc == 0, "download %s: %s: %s", td_dtype_name(dts[k]), td_err_name(rc),
                      e.message);
        ck_assert_int_eq(info.dtype, dts[k]);
        ck_assert_int_eq(info.ndim, 3);
        ck_assert_int_eq(info.shape[0], 3);
        ck_assert_int_eq(info.shape[1], 5);
        ck_assert_int_eq(info.shape[2], 7);
        ck_assert_str_eq(info.device.backend, "cpu");
        ck_assert_msg(memcmp(in, out, bytes) == 0, "%s round trip not bit-exact",
                      td_dtype_name(dts[k]));
        ck_assert_uint_eq(out[bytes], 0xAB); /* nothing written past the tensor */
        free(in);
        free(out);
    }
    /* A scalar (ndim 0) and an empty tensor. */
    float s = 42.5f, s2 = 0;
    td_handle hs;
    ck_assert_int_eq(td_upload(c, &cpu, TD_F32, 0, NULL, &s, 0, &hs, &e), 0);
    td_tensor_info info;
    ck_assert_int_eq(td_download(c, hs, &s2, sizeof s2, &info, &e), 0);
    ck_assert_int_eq(info.ndim, 0);
    ck_assert(s2 == 42.5f);
    int64_t zero[2] = {0, 4};
    td_handle hz;
    ck_assert_int_eq(td_upload(c, &cpu, TD_F32, 2, zero, NULL, 0, &hz, &e), 0);
    ck_assert_int_eq(td_download(c, hz, &s2, sizeof s2, &info, &e), 0);
    ck_assert_int_eq(info.shape[0], 0);
    ck_assert_int_eq(info.shape[1], 4);
    td_close(c);
}
END_TEST

START_TEST(test_roundtrip_256mib)
{
    td_client *c = it_client("roundtrip-256mib");
    const size_t n = (256u << 20) / sizeof(float);
    uint32_t *in = malloc(n * 4), *out = malloc(n * 4);
    ck_assert_ptr_nonnull(in);
    ck_assert_ptr_nonnull(out);
    uint64_t seed = 99;
    for (size_t i = 0; i < n; i += 2) {
        uint64_t r = it_rand(&seed);
        in[i] = (uint32_t)r;
        in[i + 1] = (uint32_t)(r >> 32);
    }
    memset(out, 0, n * 4);
    int64_t shape[2] = {16384, 4096};
    td_handle h = it_upload_f32(c, "cpu:0", 2, shape, (const float *)in);
    it_download_f32(c, h, (float *)out, n);
    ck_assert_msg(memcmp(in, out, n * 4) == 0, "256 MiB round trip is not bit-exact");
    td_error e;
    ck_assert_int_eq(td_release(c, &h, 1, &e), 0);
    ck_assert_int_eq(td_sync(c, &e), 0);
    free(in);
    free(out);
    td_close(c);
}
END_TEST

/* ---------------------------------------------------------------- ops vs reference */

static void check_binary(td_client *c, const char *dev, const char *op, int which)
{
    enum { N = 1031 };
    static float a[N], b[N], got[N];
    uint64_t seed = 7 + (uint64_t)which;
    for (int i = 0; i < N; i++) {
        a[i] = it_randf(&seed, -4, 4);
        b[i] = it_randf(&seed, 0.5f, 2.0f) * (i % 2 ? 1.0f : -1.0f); /* never 0: div */
    }
    int64_t shape[2] = {1, N};
    td_handle in[2] = {it_upload_f32(c, dev, 2, shape, a), it_upload_f32(c, dev, 2, shape, b)};
    td_error e;
    td_handle out = td_op1(c, op, in, 2, NULL, &e);
    ck_assert_uint_ne(out, 0);
    it_download_f32(c, out, got, N);
    for (int i = 0; i < N; i++) {
        float ref = which == 0   ? a[i] + b[i]
                    : which == 1 ? a[i] - b[i]
                    : which == 2 ? a[i] * b[i]
                                 : a[i] / b[i];
        /* Tolerance: add/sub/mul are single IEEE operations, exact. div: 2 ulp,
         * in case a backend multiplies by a reciprocal. */
        float tol = which == 3 ? 2 * ldexpf(1.0f, -23) * fabsf(ref) : 0.0f;
        ck_assert_msg(fabsf(got[i] - ref) <= tol, "%s on %s: [%d] %g %s %g = %.9g, want %.9g", op,
                      dev, i, (double)a[i], op, (double)b[i], (double)got[i], (double)ref);
    }
    td_release(c, in, 2, &e);
    td_release(c, &out, 1, &e);
}

START_TEST(test_elementwise_vs_reference)
{
    td_client *c = it_client("elementwise");
    const char *devs[] = {"cpu:0", "ref:0"};
    const char *ops[] = {"add", "sub", "mul", "div"};
    for (int d = 0; d < 2; d++)
        for (int k = 0; k < 4; k++)
            check_binary(c, devs[d], ops[k], k);
    td_close(c);
}
END_TEST

START_TEST(test_matmul_vs_reference)
{
    td_client *c = it_client("matmul");
    enum { M = 37, K = 53, N = 29 };
    static float a[M * K], b[K * N], got[M * N];
    uint64_t seed = 5;
    for (int i = 0; i < M * K; i++)
        a[i] = it_randf(&seed, -1, 1);
    for (int i = 0; i < K * N; i++)
        b[i] = it_randf(&seed, -1, 1);
    const char *devs[] = {"cpu:0", "ref:0"};
    for (int d = 0; d < 2; d++) {
        int64_t sa[2] = {M, K}, sb[2] = {K, N};
        td_handle in[2] = {it_upload_f32(c, devs[d], 2, sa, a),
                           it_upload_f32(c, devs[d], 2, sb, b)};
        td_error e;
        td_handle out = td_op1(c, "matmul", in, 2, NULL, &e);
        ck_assert_uint_ne(out, 0);
        td_tensor_info info;
        ck_assert_int_eq(td_describe(c, out, &info, &e), 0);
        ck_assert_int_eq(info.ndim, 2);
        ck_assert_int_eq(info.shape[0], M);
        ck_assert_int_eq(info.shape[1], N);
        it_download_f32(c, out, got, M * N);
        for (int i = 0; i < M; i++)
            for (int j = 0; j < N; j++) {
                double ref = 0, mag = 0;
                for (int k = 0; k < K; k++) {
                    ref += (double)a[i * K + k] * (double)b[k * N + j];
                    mag += fabs((double)a[i * K + k] * (double)b[k * N + j]);
                }
                /* f32 accumulation of K products: error below K * eps * sum|a*b|. */
                double tol = K * 1.2e-7 * mag + 1e-6;
                ck_assert_msg(fabs((double)got[i * N + j] - ref) <= tol,
                              "matmul on %s: [%d,%d] = %.9g, want %.9g (tol %.3g)", devs[d], i, j,
                              (double)got[i * N + j], ref, tol);
            }
    }
    td_close(c);
}
END_TEST

START_TEST(test_relu_sum_vs_reference)
{
    td_client *c = it_client("relu-sum");
    enum { N = 10007 };
    static float x[N], got[N];
    uint64_t seed = 11;
    for (int i = 0; i < N; i++)
        x[i] = it_randf(&seed, -1, 1);
    x[0] = -0.0f;
    const char *devs[] = {"cpu:0", "ref:0"};
    for (int d = 0; d < 2; d++) {
        int64_t shape[1] = {N};
        td_handle h = it_upload_f32(c, devs[d], 1, shape, x);
        td_error e;
        td_handle r = td_op1(c, "relu", &h, 1, NULL, &e);
        it_download_f32(c, r, got, N);
        for (int i = 0; i < N; i++) {
            float ref = x[i] > 0 ? x[i] : 0.0f; /* exact: relu only selects */
            ck_assert_msg(got[i] == ref, "relu on %s: [%d] relu(%g) = %g", devs[d], i, (double)x[i],
                          (double)got[i]);
        }
        td_handle s = td_op1(c, "sum", &h, 1, NULL, &e);
        float sum = 0;
        td_tensor_info info;
        int rc = td_download(c, s, &sum, sizeof sum, &info, &e);
        ck_assert_msg(rc == 0, "sum download: %s: %s", td_err_name(rc), e.message);
        int64_t numel = 1;
        for (int i = 0; i < info.ndim; i++)
            numel *= info.shape[i];
        ck_assert_int_eq(numel, 1);
        double ref = 0, mag = 0;
        for (int i = 0; i < N; i++) {
            ref += x[i];
            mag += fabs(x[i]);
        }
        /* f32 accumulation: within 1e-5 of the sum of magnitudes (naive order
         * gives ~N*eps/2*mag in the worst case, far less in practice). */
        ck_assert_msg(fabs((double)sum - ref) <= 1e-5 * mag, "sum on %s = %.9g, want %.9g", devs[d],
                      (double)sum, ref);
    }
    td_close(c);
}
END_TEST

/* ---------------------------------------------------------------- client behaviour */

/* 20,000 fire-and-forget ops with batched releases, then one download: the
 * write buffer coalesces, order is kept, nothing is lost. */
START_TEST(test_pipelined_ops_and_release)
{
    td_client *c = it_client("pipeline");
    float one[4] = {1, 1, 1, 1}, zero[4] = {0}, got[4];
    int64_t shape[1] = {4};
    td_handle inc = it_upload_f32(c, "cpu:0", 1, shape, one);
    td_handle acc = it_upload_f32(c, "cpu:0", 1, shape, zero);
    td_error e;
    for (int i = 0; i < 20000; i++) {
        td_handle in[2] = {acc, inc};
        td_handle next = td_op1(c, "add", in, 2, NULL, &e);
        ck_assert_uint_ne(next, 0);
        ck_assert_int_eq(td_release(c, &acc, 1, &e), 0);
        acc = next;
    }
    it_download_f32(c, acc, got, 4);
    for (int i = 0; i < 4; i++)
        ck_assert(got[i] == 20000.0f);
    ck_assert_int_eq(td_sync(c, &e), 0);

    td_stats st;
    ck_assert_int_eq(td_stats_get(c, &st, &e), 0);
    /* This session holds 2 handles now; the released 20,000 must be gone. */
    int found = 0;
    for (size_t i = 0; i < st.nsessions && i < 64; i++)
        if (st.session_list[i].session_id == td_session_id(c)) {
            found = 1;
            ck_assert_uint_le(st.session_list[i].handles, 2);
        }
    ck_assert_msg(found, "stats does not list this session");
    td_close(c);
}
END_TEST

START_TEST(test_download_small_buffer_keeps_stream)
{
    td_client *c = it_client("small-buffer");
    float x[64], y[64];
    for (int i = 0; i < 64; i++)
        x[i] = (float)i;
    int64_t shape[1] = {64};
    td_handle h = it_upload_f32(c, "cpu:0", 1, shape, x);
    td_error e;
    ck_assert_int_eq(td_download(c, h, y, 16, NULL, &e), TD_EINVALID_ARGUMENT);
    ck_assert_int_eq(e.code, TD_EINVALID_ARGUMENT);
    /* The payload was drained: the next call reads the right frame. */
    it_download_f32(c, h, y, 64);
    ck_assert_mem_eq(x, y, sizeof x);
    td_close(c);
}
END_TEST

START_TEST(test_release_then_use_is_unknown)
{
    td_client *c = it_client("release");
    float x[2] = {1, 2}, y[2];
    int64_t shape[1] = {2};
    td_handle keep = it_upload_f32(c, "cpu:0", 1, shape, x); /* so h is not the easy id 1 */
    td_handle h = it_upload_f32(c, "cpu:0", 1, shape, x);
    ck_assert_uint_ne(h, keep);
    td_error e;
    ck_assert_int_eq(td_release(c, &h, 1, &e), 0);
    int rc = td_download(c, h, y, sizeof y, NULL, &e);
    ck_assert_int_eq(rc, TD_EUNKNOWN_HANDLE);
    ck_assert_int_eq(e.detail_kind, TD_DETAIL_HANDLE);
    ck_assert_uint_eq(e.detail.handle.handle, h);
    td_close(c);
}
END_TEST

START_TEST(test_to_device_and_describe)
{
    td_client *c = it_client("to-device");
    float x[6] = {1, 2, 3, 4, 5, 6}, y[6];
    int64_t shape[2] = {2, 3};
    td_handle h = it_upload_f32(c, "cpu:0", 2, shape, x);
    const char *targets[] = {"ref:0", "cpu:1"};
    for (int k = 0; k < 2; k++) {
        td_device d = it_dev(targets[k]);
        td_handle m;
        td_error e;
        ck_assert_int_eq(td_to_device(c, h, &d, &m, &e), 0);
        td_tensor_info info;
        ck_assert_int_eq(td_describe(c, m, &info, &e), 0);
        char s[40];
        td_device_format(&info.device, s, sizeof s);
        ck_assert_str_eq(s, targets[k]);
        ck_assert_int_eq(info.ndim, 2);
        it_download_f32(c, m, y, 6);
        ck_assert_mem_eq(x, y, sizeof x);
    }
    td_close(c);
}
END_TEST

START_TEST(test_device_parse)
{
    td_device d;
    ck_assert_int_eq(td_device_parse("cpu:0", &d), 0);
    ck_assert_str_eq(d.backend, "cpu");
    ck_assert_uint_eq(d.ordinal, 0);
    ck_assert_int_eq(td_device_parse("cuda:1", &d), 0);
    ck_assert_str_eq(d.backend, "cuda");
    ck_assert_uint_eq(d.ordinal, 1);
    ck_assert_int_eq(td_device_parse("ref", &d), 0);
    ck_assert_str_eq(d.backend, "ref");
    ck_assert_uint_eq(d.ordinal, 0);
    ck_assert_int_eq(td_device_parse("cpu:", &d), TD_EINVALID_ARGUMENT);
    ck_assert_int_eq(td_device_parse(":1", &d), TD_EINVALID_ARGUMENT);
    ck_assert_int_eq(td_device_parse("cpu:x", &d), TD_EINVALID_ARGUMENT);
    ck_assert_int_eq(td_device_parse("cpu:99999999999", &d), TD_EINVALID_ARGUMENT);
    ck_assert_int_eq(td_device_parse("averyveryverylongbackend:0", &d), TD_EINVALID_ARGUMENT);
    char buf[32];
    d = (td_device){.backend = "ref", .ordinal = 3};
    td_device_format(&d, buf, sizeof buf);
    ck_assert_str_eq(buf, "ref:3");
}
END_TEST

/* A one-connection impostor: 0 hangs up after reading, 1 answers garbage,
 * 2 reads and stays silent. Returns its pid; *port is where it listens. */
static pid_t fake_server(int mode, int *port)
{
    int ls = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t sl = sizeof sa;
    ck_assert_int_eq(bind(ls, (struct sockaddr *)&sa, sizeof sa), 0);
    ck_assert_int_eq(listen(ls, 1), 0);
    ck_assert_int_eq(getsockname(ls, (struct sockaddr *)&sa, &sl), 0);
    *port = ntohs(sa.sin_port);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        int fd = accept(ls, NULL, NULL);
        char buf[256];
        if (fd >= 0 && recv(fd, buf, sizeof buf, 0) > 0) {
            if (mode == 1) {
                memset(buf, 0x5A, 64);
                if (send(fd, buf, 64, MSG_NOSIGNAL) < 0)
                    _exit(1);
            }
            if (mode == 2)
                sleep(3);
        }
        _exit(0);
    }
    close(ls);
    return pid;
}

static int connect_fake(int mode)
{
    int port;
    pid_t pid = fake_server(mode, &port);
    char ep[64];
    snprintf(ep, sizeof ep, "tcp://127.0.0.1:%d", port);
    td_connect_opts o = {.timeout_ms = 500};
    td_client *c = NULL;
    td_error e;
    int rc = td_connect(ep, &o, &c, &e);
    ck_assert_ptr_null(c);
    ck_assert_int_eq(e.code, rc);
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    return rc;
}

START_TEST(test_bad_servers_are_typed)
{
    ck_assert_int_eq(connect_fake(0), TD_ECLOSED);
    ck_assert_int_eq(connect_fake(1), TD_EPROTOCOL_ERROR);
    ck_assert_int_eq(connect_fake(2), TD_ETIMEOUT);
}
END_TEST

START_TEST(test_connect_failures_are_typed)
{
    td_client *c = NULL;
    td_error e;
    ck_assert_int_eq(td_connect("http://x", NULL, &c, &e), TD_EINVALID_ARGUMENT);
    ck_assert_ptr_null(c);
    /* Nobody listens on port 1. */
    td_connect_opts o = {.timeout_ms = 2000};
    ck_assert_int_eq(td_connect("tcp://127.0.0.1:1", &o, &c, &e), TD_EIO);
    ck_assert_int_eq(td_connect("unix:///nonexistent/tdd.sock", &o, &c, &e), TD_EIO);
}
END_TEST

Suite *it_data_suite(void)
{
    Suite *s = suite_create("data");
    TCase *tc = tcase_create("roundtrip");
    tcase_set_timeout(tc, 240);
    tcase_add_test(tc, test_roundtrip_small_dtypes);
    tcase_add_test(tc, test_roundtrip_256mib);
    suite_add_tcase(s, tc);

    tc = tcase_create("ops");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_elementwise_vs_reference);
    tcase_add_test(tc, test_matmul_vs_reference);
    tcase_add_test(tc, test_relu_sum_vs_reference);
    suite_add_tcase(s, tc);

    tc = tcase_create("client");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_pipelined_ops_and_release);
    tcase_add_test(tc, test_download_small_buffer_keeps_stream);
    tcase_add_test(tc, test_release_then_use_is_unknown);
    tcase_add_test(tc, test_to_device_and_describe);
    tcase_add_test(tc, test_device_parse);
    tcase_add_test(tc, test_connect_failures_are_typed);
    tcase_add_test(tc, test_bad_servers_are_typed);
    suite_add_tcase(s, tc);
    return s;
}
