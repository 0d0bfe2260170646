/* test_resume.c -- integration: libtensordd resumes a session whose connection a proxy cuts
 * (td_connect_resume; docs/protocol.md, section 7 "Resume"). The oracle is the same
 * training run without cuts: the parameters must be equal bit for bit (a request applied
 * twice or lost would change them). */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "itest.h"

Suite *it_resume_suite(void);

/* ---------------------------------------------------------------- a cutting proxy */

/* A loopback proxy to the daemon, one connection at a time, that closes the connection it
 * carries when the bytes sent one way (counted over every connection) reach the next cut.
 * refuse: after the first cut, every new connection is closed at once. */
typedef struct {
    int lfd, port, target;
    uint64_t cut[2][4]; /* [0] upstream, [1] downstream: offsets, ascending, 0 = none */
    uint64_t count[2];
    int conns, cuts_done, refuse;
    volatile int stop;
    pthread_t th;
} cproxy;

static int next_cut(cproxy *p, int d, uint64_t *at)
{
    for (int i = 0; i < 4; i++)
        if (p->cut[d][i]) {
            *at = p->cut[d][i];
            return i;
        }
    return -1;
}

static void send_all(int fd, const uint8_t *b, size_t n)
{
    while (n) {
        ssize_t k = send(fd, b, n, MSG_NOSIGNAL);
        if (k <= 0)
            return;
        b += k;
        n -= (size_t)k;
    }
}

static void carry(cproxy *p, int cfd, int dfd)
{
    static uint8_t buf[65536];
    int fds[2] = {cfd, dfd};
    while (!p->stop) {
        struct pollfd pf[2] = {{.fd = cfd, .events = POLLIN}, {.fd = dfd, .events = POLLIN}};
        if (poll(pf, 2, 100) <= 0)
            continue;
        for (int d = 0; d < 2; d++) {
            if (!(pf[d].revents & (POLLIN | POLLHUP | POLLERR)))
                continue;
            ssize_t n = recv(fds[d], buf, sizeof buf, 0);
            if (n <= 0)
                return;
            uint64_t at;
            int i = next_cut(p, d, &at);
            if (i >= 0 && p->count[d] + (uint64_t)n >= at) {
                send_all(fds[1 - d], buf, (size_t)(at - p->count[d]));
                p->count[d] = at;
                p->cut[d][i] = 0;
                p->cuts_done++;
                return;
            }
            p->count[d] += (uint64_t)n;
            send_all(fds[1 - d], buf, (size_t)n);
        }
    }
}

static void *proxy_main(void *arg)
{
    cproxy *p = arg;
    while (!p->stop) {
        struct pollfd pf = {.fd = p->lfd, .events = POLLIN};
        if (poll(&pf, 1, 100) <= 0)
            continue;
        int cfd = accept(p->lfd, NULL, NULL);
        if (cfd < 0)
            continue;
        p->conns++;
        if (p->refuse && p->cuts_done) {
            close(cfd);
            continue;
        }
        int dfd = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)p->target)};
        sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        if (dfd >= 0 && connect(dfd, (struct sockaddr *)&sa, sizeof sa) == 0) {
            int one = 1;
            setsockopt(cfd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
            setsockopt(dfd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
            carry(p, cfd, dfd);
        }
        if (dfd >= 0) {
            shutdown(dfd, SHUT_RDWR);
            close(dfd);
        }
        shutdown(cfd, SHUT_RDWR);
        close(cfd);
    }
    return NULL;
}

static void proxy_start(cproxy *p, int target)
{
    p->target = target;
    p->lfd = socket(AF_INET, SOCK_STREAM, 0);
    ck_assert_int_ge(p->lfd, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t sl = sizeof sa;
    ck_assert_int_eq(bind(p->lfd, (struct sockaddr *)&sa, sizeof sa), 0);
    ck_assert_int_eq(listen(p->lfd, 8), 0);
    getsockname(p->lfd, (struct sockaddr *)&sa, &sl);
    p->port = ntohs(sa.sin_port);
    ck_assert_int_eq(pthread_create(&p->th, NULL, proxy_main, p), 0);
}

static void proxy_stop(cproxy *p)
{
    p->stop = 1;
    pthread_join(p->th, NULL);
    close(p->lfd);
}

/* ---------------------------------------------------------------- a training run */

#define IN 64
#define HID 256
#define OUT 4
#define BATCH 32

typedef struct {
    float w1[IN * HID], w2[HID * OUT];
    float losses[3];
} result;

static td_client *connect_resume(int port, unsigned window)
{
    char ep[64];
    snprintf(ep, sizeof ep, "tcp://127.0.0.1:%d", port);
    td_connect_opts o = {.client_name = "itest-resume", .timeout_ms = TDT_TIMEOUT_MS};
    td_client *c = NULL;
    td_error e;
    int rc = td_connect_resume(ep, &o, NULL, window, &c, &e);
    ck_assert_msg(rc == 0, "connect: %s: %s", td_err_name(rc), e.message);
    return c;
}

static td_handle upload(td_client *c, int ndim, const int64_t *shape, td_dtype dt, const void *data,
                        int rg)
{
    td_device d = it_dev("cpu:0");
    td_handle h = 0;
    td_error e;
    int rc = td_upload(c, &d, dt, ndim, shape, data, rg, &h, &e);
    ck_assert_msg(rc == 0, "upload: %s: %s", td_err_name(rc), e.message);
    return h;
}

static td_handle op(td_client *c, const char *name, td_handle a, td_handle b)
{
    td_handle in[2] = {a, b};
    td_error e;
    td_handle h = td_op1(c, name, in, b ? 2 : 1, NULL, &e);
    ck_assert_msg(h != 0, "%s: %s", name, e.message);
    return h;
}

static void download(td_client *c, td_handle h, void *out, size_t n)
{
    td_error e;
    int rc = td_download(c, h, out, n, NULL, &e);
    ck_assert_msg(rc == 0, "download: %s: %s", td_err_name(rc), e.message);
}

/* Three SGD steps (momentum) of a two-layer net whose first layer is 64 KiB. */
static void train(td_client *c, result *r)
{
    uint64_t seed = 7;
    static float w1[IN * HID], w2[HID * OUT], x[BATCH * IN];
    int64_t y[BATCH];
    for (size_t i = 0; i < IN * HID; i++)
        w1[i] = it_randf(&seed, -0.1f, 0.1f);
    for (size_t i = 0; i < HID * OUT; i++)
        w2[i] = it_randf(&seed, -0.1f, 0.1f);
    int64_t s1[2] = {IN, HID}, s2[2] = {HID, OUT}, sx[2] = {BATCH, IN}, sy[1] = {BATCH};
    td_handle p[2] = {upload(c, 2, s1, TD_F32, w1, 1), upload(c, 2, s2, TD_F32, w2, 1)};
    td_attr attrs[2] = {td_attr_float("lr", 0.05), td_attr_float("momentum", 0.9)};
    td_handle opt = 0;
    td_error e;
    ck_assert_int_eq(td_optimizer_create(c, "sgd", p, 2, attrs, 2, &opt, &e), 0);
    for (int k = 0; k < 3; k++) {
        for (size_t i = 0; i < BATCH * IN; i++)
            x[i] = it_randf(&seed, -1.0f, 1.0f);
        for (size_t i = 0; i < BATCH; i++)
            y[i] = (int64_t)(it_rand(&seed) % OUT);
        td_handle hx = upload(c, 2, sx, TD_F32, x, 0), hy = upload(c, 1, sy, TD_I64, y, 0);
        td_handle h = op(c, "relu", op(c, "matmul", hx, p[0]), 0);
        td_handle loss = op(c, "cross_entropy", op(c, "matmul", h, p[1]), hy);
        td_handle g = 0;
        int rc = td_backward(c, loss, 0, 0, &g, &e);
        ck_assert_msg(rc == 0, "backward: %s: %s", td_err_name(rc), e.message);
        rc = td_optimizer_step(c, opt, g, &e);
        ck_assert_msg(rc == 0, "step: %s: %s", td_err_name(rc), e.message);
        download(c, loss, &r->losses[k], sizeof r->losses[k]);
    }
    download(c, p[0], r->w1, sizeof r->w1);
    download(c, p[1], r->w2, sizeof r->w2);
}

/* Bytes each way of one run through a proxy that cuts nothing. */
static void measure(uint64_t *up, uint64_t *down, result *r)
{
    static cproxy p;
    memset(&p, 0, sizeof p);
    proxy_start(&p, it_daemon.port);
    td_client *c = connect_resume(p.port, 30);
    train(c, r);
    td_close(c);
    usleep(100 * 1000);
    proxy_stop(&p);
    *up = p.count[0];
    *down = p.count[1];
}

START_TEST(test_resume_three_cuts_same_parameters)
{
    static result plain, want, got;
    td_client *c = it_client("resume-plain");
    train(c, &plain);
    td_close(c);
    uint64_t up, down;
    measure(&up, &down, &want);
    ck_assert(memcmp(&plain, &want, sizeof want) == 0);

    static cproxy p;
    memset(&p, 0, sizeof p);
    uint64_t w1 = sizeof want.w1;
    p.cut[0][0] = 200 + w1 / 2; /* mid-upload of w1, right after Hello */
    p.cut[0][1] = up / 2;       /* in the middle of the run */
    /* in w1's download: the last frames are w1 then w2 (4 KiB) and the Goodbye's Ok */
    p.cut[1][0] = down - (sizeof want.w2 + 200) - w1 / 2;
    proxy_start(&p, it_daemon.port);
    c = connect_resume(p.port, 30);
    train(c, &got);
    unsigned resumes = td_resume_count(c);
    td_close(c);
    proxy_stop(&p);
    ck_assert_int_eq(p.cuts_done, 3);
    ck_assert_int_eq(p.conns, 4);
    ck_assert_uint_ge(resumes, 1);
    ck_assert_msg(memcmp(&want, &got, sizeof got) == 0,
                  "the parameters after 3 cuts differ from the uncut run's");
}
END_TEST

START_TEST(test_resume_expired_window_is_connection_lost)
{
    tdt_daemon d;
    const char *args[] = {"--cpu-devices", "1", "--max-resume-window", "1", NULL};
    ck_assert_int_eq(tdt_daemon_start(&d, args, 0), 0);
    static cproxy p;
    memset(&p, 0, sizeof p);
    p.refuse = 1;
    proxy_start(&p, d.port);
    td_client *c = connect_resume(p.port, 60);
    static float big[64 * 1024];
    int64_t shape[1] = {64 * 1024};
    td_handle h = upload(c, 1, shape, TD_F32, big, 0);
    td_error e;
    ck_assert_int_eq(td_sync(c, &e), 0);
    p.cut[1][0] = p.count[1] + 100; /* inside the download's payload */
    int rc = td_download(c, h, big, sizeof big, NULL, &e);
    ck_assert_msg(rc == TD_ECONNECTION_LOST, "download: %s: %s", td_err_name(rc), e.message);
    rc = td_sync(c, &e);
    ck_assert_int_eq(rc, TD_ECONNECTION_LOST);
    td_close(c);
    proxy_stop(&p);
    /* the daemon frees the held session once its window ran out: back to one session */
    td_client *o = tdt_connect(d.endpoint, "observer");
    ck_assert_ptr_nonnull(o);
    td_stats st;
    for (int i = 0; i < 100; i++) {
        ck_assert_int_eq(td_stats_get(o, &st, &e), 0);
        if (st.sessions == 1 && st.handles == 0)
            break;
        usleep(50 * 1000);
    }
    ck_assert_uint_eq(st.sessions, 1);
    ck_assert_uint_eq(st.handles, 0);
    td_close(o);
    ck_assert_int_eq(tdt_daemon_stop(&d), 0);
}
END_TEST

Suite *it_resume_suite(void)
{
    Suite *s = suite_create("resume");
    TCase *tc = tcase_create("cuts");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_resume_three_cuts_same_parameters);
    tcase_add_test(tc, test_resume_expired_window_is_connection_lost);
    suite_add_tcase(s, tc);
    return s;
}
