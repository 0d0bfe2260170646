/* test_tls.c -- integration: libtensordd over tls:// (td_connect_tls) against a daemon with a
 * tcp:// and a mutual-TLS tls:// listener. Certificates are made at run time with the
 * openssl command (a CA, a server certificate for 127.0.0.1, a client certificate, and a
 * second CA with its own client); the test is skipped without it. The oracle for the
 * round trip is the same arithmetic in C. */
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "itest.h"

static char dir[64];

/* The certificates under dir; 0, or -1 when openssl is missing or failed. */
static int make_pki(void)
{
    snprintf(dir, sizeof dir, "/tmp/tddtlsXXXXXX");
    if (!mkdtemp(dir))
        return -1;
#define EC "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes"
    char cmd[1200];
    for (int i = 0; i < 2; i++) {
        const char *ca = i ? "otherca" : "ca";
        snprintf(cmd, sizeof cmd,
                 "cd %s && openssl req -x509 " EC " -keyout %s.key -out %s.pem -days 1 "
                 "-subj /CN=%s >/dev/null 2>&1",
                 dir, ca, ca, ca);
        if (system(cmd))
            return -1;
    }
    const char *leaf[3][3] = {{"server", "ca", "subjectAltName=IP:127.0.0.1"},
                              {"client", "ca", "extendedKeyUsage=clientAuth"},
                              {"intruder", "otherca", "extendedKeyUsage=clientAuth"}};
    for (int i = 0; i < 3; i++) {
        const char *n = leaf[i][0], *ca = leaf[i][1];
        snprintf(cmd, sizeof cmd,
                 "cd %s && echo %s > %s.ext && openssl req -new " EC " -keyout %s.key -out "
                 "%s.csr -subj /CN=%s >/dev/null 2>&1 && openssl x509 -req -in %s.csr -CA "
                 "%s.pem -CAkey %s.key -CAcreateserial -out %s.pem -days 1 -extfile %s.ext "
                 ">/dev/null 2>&1",
                 dir, leaf[i][2], n, n, n, n, n, ca, ca, n, n);
        if (system(cmd))
            return -1;
    }
#undef EC
    return 0;
}

static const char *path(char *buf, size_t n, const char *name)
{
    snprintf(buf, n, "%s/%s", dir, name);
    return buf;
}

static int free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t sl = sizeof sa;
    int port = -1;
    if (fd >= 0 && bind(fd, (struct sockaddr *)&sa, sizeof sa) == 0 &&
        getsockname(fd, (struct sockaddr *)&sa, &sl) == 0)
        port = ntohs(sa.sin_port);
    if (fd >= 0)
        close(fd);
    return port;
}

static int connect_tls(const char *ep, const char *ca, const char *cert, const char *key,
                       td_client **c, td_error *e)
{
    td_connect_opts o = {.client_name = "itest-tls", .timeout_ms = TDT_TIMEOUT_MS};
    td_tls_opts t = {.ca_file = ca, .cert_file = cert, .key_file = key};
    return td_connect_tls(ep, &o, &t, c, e);
}

START_TEST(test_tls_round_trip_and_refusals)
{
    if (system("openssl version >/dev/null 2>&1") != 0 || make_pki() != 0) {
        fprintf(stderr, "tls: skipped (no working openssl command)\n");
        return;
    }
    char ca[128], otherca[128], scert[128], skey[128], ccert[128], ckey[128], icert[128], ikey[128],
        tls_ep[64], tls_arg[64];
    int port = free_port();
    ck_assert_int_gt(port, 0);
    snprintf(tls_ep, sizeof tls_ep, "tls://127.0.0.1:%d", port);
    snprintf(tls_arg, sizeof tls_arg, "%s", tls_ep);
    const char *args[] = {"--cpu-devices",
                          "1",
                          "--listen",
                          tls_arg,
                          "--tls-cert",
                          path(scert, sizeof scert, "server.pem"),
                          "--tls-key",
                          path(skey, sizeof skey, "server.key"),
                          "--tls-client-ca",
                          path(ca, sizeof ca, "ca.pem"),
                          NULL};
    path(otherca, sizeof otherca, "otherca.pem");
    path(ccert, sizeof ccert, "client.pem");
    path(ckey, sizeof ckey, "client.key");
    path(icert, sizeof icert, "intruder.pem");
    path(ikey, sizeof ikey, "intruder.key");
    tdt_daemon d;
    ck_assert_int_eq(tdt_daemon_start(&d, args, 0), 0);

    /* a round trip of 1 MiB each way, against the same arithmetic here */
    td_client *c = NULL;
    td_error e;
    int rc = connect_tls(tls_ep, ca, ccert, ckey, &c, &e);
    ck_assert_msg(rc == 0, "connect %s: %s: %s", tls_ep, td_err_name(rc), e.message);
    enum { N = 1 << 18 };
    float *x = malloc(N * sizeof *x), *y = malloc(N * sizeof *y);
    ck_assert_ptr_nonnull(x);
    ck_assert_ptr_nonnull(y);
    uint64_t s = 7;
    for (int i = 0; i < N; i++)
        x[i] = it_randf(&s, -4, 4);
    int64_t shape[1] = {N};
    td_handle h = it_upload_f32(c, "cpu:0", 1, shape, x), in[2] = {h, h};
    td_handle sq = td_op1(c, "mul", in, 2, NULL, &e);
    ck_assert_uint_ne(sq, 0);
    it_download_f32(c, sq, y, N);
    for (int i = 0; i < N; i++)
        ck_assert_msg(y[i] == x[i] * x[i], "element %d: %g != %g", i, (double)y[i],
                      (double)(x[i] * x[i]));
    free(x);
    free(y);
    td_close(c);

    /* refusals, each typed */
    c = NULL;
    rc = connect_tls(tls_ep, ca, NULL, NULL, &c, &e); /* no client certificate */
    ck_assert_msg(rc == TD_EUNAUTHENTICATED, "no certificate: %s: %s", td_err_name(rc), e.message);
    ck_assert_ptr_null(c);
    rc = connect_tls(tls_ep, ca, icert, ikey, &c, &e); /* another CA's client */
    ck_assert_msg(rc == TD_EUNAUTHENTICATED, "intruder: %s: %s", td_err_name(rc), e.message);
    rc = connect_tls(tls_ep, otherca, ccert, ckey, &c, &e); /* the daemon's CA not trusted */
    ck_assert_msg(rc == TD_EUNAUTHENTICATED && strstr(e.message, "verification"),
                  "wrong CA: %s: %s", td_err_name(rc), e.message);
    /* TLS to the plaintext listener, plaintext to the TLS one, TLS options on tcp:// */
    char tls_to_plain[256], plain_to_tls[64];
    snprintf(tls_to_plain, sizeof tls_to_plain, "tls://%s", d.endpoint + strlen("tcp://"));
    snprintf(plain_to_tls, sizeof plain_to_tls, "tcp://127.0.0.1:%d", port);
    rc = connect_tls(tls_to_plain, ca, ccert, ckey, &c, &e);
    ck_assert_msg(rc == TD_EPROTOCOL_ERROR, "tls to plain: %s: %s", td_err_name(rc), e.message);
    td_connect_opts o = {.timeout_ms = TDT_TIMEOUT_MS};
    rc = td_connect(plain_to_tls, &o, &c, &e);
    ck_assert_msg(rc == TD_EPROTOCOL_ERROR && strstr(e.message, "speaks TLS"),
                  "plain to tls: %s: %s", td_err_name(rc), e.message);
    rc = connect_tls(d.endpoint, ca, NULL, NULL, &c, &e);
    ck_assert_int_eq(rc, TD_EINVALID_ARGUMENT);

    ck_assert_int_eq(tdt_daemon_stop(&d), 0);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    ck_assert_int_eq(system(cmd), 0);
}
END_TEST

Suite *it_tls_suite(void)
{
    Suite *s = suite_create("tls");
    TCase *tc = tcase_create("mutual TLS");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_tls_round_trip_and_refusals);
    suite_add_tcase(s, tc);
    return s;
}
