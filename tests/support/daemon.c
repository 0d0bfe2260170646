/* daemon.c -- test support: start/stop the real daemon, bounded raw-socket helpers. */
#include "daemon.h"

#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "frame.h"

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

/* A port nobody holds right now (the daemon may still lose a race for it:
 * start() retries). */
static int free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0)
        return -1;
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t sl = sizeof sa;
    int port = -1;
    if (bind(fd, (struct sockaddr *)&sa, sizeof sa) == 0 &&
        getsockname(fd, (struct sockaddr *)&sa, &sl) == 0)
        port = ntohs(sa.sin_port);
    close(fd);
    return port;
}

/* After the "listening" line the daemon's stdout still has to go somewhere,
 * or a chatty daemon would block on a full pipe. A small process (not a
 * thread: Check forks every test) copies it to stderr until the daemon exits. */
static pid_t drain_stdout(int fd)
{
    pid_t pid = fork();
    if (pid != 0) {
        close(fd);
        return pid;
    }
    char buf[4096];
    ssize_t n;
    while ((n = read(fd, buf, sizeof buf)) > 0 || (n < 0 && errno == EINTR))
        if (n > 0 && write(2, buf, (size_t)n) < 0)
            break;
    _exit(0);
}

static const char *daemon_bin(void)
{
    const char *b = getenv("TDD_BIN");
    return b && b[0] ? b : "build/tensordd";
}

/* Waits for "listening on <endpoint>" on fd. 1 found, 0 not (EOF/timeout). */
static int wait_listening(int fd, const char *endpoint, int timeout_ms)
{
    char buf[8192];
    size_t len = 0;
    double end = now_ms() + timeout_ms;
    char want[200];
    snprintf(want, sizeof want, "listening on %s", endpoint);
    for (;;) {
        double left = end - now_ms();
        if (left <= 0)
            return 0;
        struct pollfd p = {.fd = fd, .events = POLLIN};
        int r = poll(&p, 1, (int)left);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return 0;
        if (len == sizeof buf - 1) { /* keep the tail only */
            memmove(buf, buf + len / 2, len - len / 2);
            len -= len / 2;
        }
        ssize_t n = read(fd, buf + len, sizeof buf - 1 - len);
        if (n <= 0)
            return 0;
        if (write(2, buf + len, (size_t)n) < 0) { /* echo for the test log */
        }
        len += (size_t)n;
        buf[len] = 0;
        if (strstr(buf, want))
            return 1;
    }
}

int tdt_daemon_start(tdt_daemon *d, const char *const *extra_args, int with_unix)
{
    memset(d, 0, sizeof *d);
    d->pid = -1;
    for (int attempt = 0; attempt < 5; attempt++) {
        int port = free_port();
        if (port <= 0)
            continue;
        snprintf(d->endpoint, sizeof d->endpoint, "tcp://127.0.0.1:%d", port);
        if (with_unix)
            snprintf(d->unix_path, sizeof d->unix_path, "/tmp/tdd-test-%d-%d.sock", (int)getpid(),
                     port);
        char unix_ep[160];
        snprintf(unix_ep, sizeof unix_ep, "unix://%s", d->unix_path);

        const char *argv[64];
        int n = 0;
        argv[n++] = daemon_bin();
        argv[n++] = "--listen";
        argv[n++] = d->endpoint;
        if (with_unix) {
            argv[n++] = "--listen";
            argv[n++] = unix_ep;
        }
        for (int i = 0; extra_args && extra_args[i] && n < 62; i++)
            argv[n++] = extra_args[i];
        argv[n] = NULL;

        int pfd[2];
        if (pipe2(pfd, O_CLOEXEC) != 0)
            return -1;
        pid_t pid = fork();
        if (pid < 0) {
            close(pfd[0]);
            close(pfd[1]);
            return -1;
        }
        if (pid == 0) {
            dup2(pfd[1], 1);
            execv(argv[0], (char *const *)(uintptr_t)argv);
            fprintf(stderr, "tdt: cannot exec %s: %s\n", argv[0], strerror(errno));
            _exit(127);
        }
        close(pfd[1]);
        if (wait_listening(pfd[0], d->endpoint, 10000)) {
            d->pid = pid;
            d->port = port;
            d->drain_pid = drain_stdout(pfd[0]);
            return 0;
        }
        close(pfd[0]);
        kill(pid, SIGKILL);
        int st;
        waitpid(pid, &st, 0);
        fprintf(stderr, "tdt: %s did not report 'listening on %s' (attempt %d)\n", argv[0],
                d->endpoint, attempt + 1);
    }
    return -1;
}

int tdt_daemon_alive(const tdt_daemon *d)
{
    if (d->pid <= 0)
        return 0;
    int st;
    pid_t r = waitpid(d->pid, &st, WNOHANG);
    if (r < 0 && errno == ECHILD) /* asked from a forked test: not our child */
        return kill(d->pid, 0) == 0;
    return r == 0;
}

int tdt_daemon_stop(tdt_daemon *d)
{
    if (d->pid <= 0)
        return -1;
    kill(d->pid, SIGTERM);
    int st = 0;
    pid_t r = 0;
    double end = now_ms() + 15000;
    while ((r = waitpid(d->pid, &st, WNOHANG)) == 0 && now_ms() < end)
        usleep(10000);
    int killed = 0;
    if (r == 0) {
        fprintf(stderr, "tdt: daemon ignored SIGTERM for 15 s; killing it\n");
        kill(d->pid, SIGKILL);
        waitpid(d->pid, &st, 0);
        killed = 1;
    }
    d->pid = -1;
    if (d->drain_pid > 0) { /* it sees EOF once the daemon is gone */
        int dst;
        waitpid(d->drain_pid, &dst, 0);
        d->drain_pid = 0;
    }
    if (d->unix_path[0])
        unlink(d->unix_path);
    if (r < 0 || killed)
        return -1;
    if (WIFEXITED(st))
        return WEXITSTATUS(st);
    if (WIFSIGNALED(st))
        return 128 + WTERMSIG(st);
    return -1;
}

td_client *tdt_connect(const char *endpoint, const char *name)
{
    td_connect_opts o = {.client_name = name, .timeout_ms = TDT_TIMEOUT_MS};
    td_client *c = NULL;
    td_error e;
    if (td_connect(endpoint, &o, &c, &e) != 0) {
        fprintf(stderr, "tdt: connect %s: %s: %s\n", endpoint, td_err_name(e.code), e.message);
        return NULL;
    }
    return c;
}

int tdt_raw_connect(const tdt_daemon *d)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    struct sockaddr_in sa = {.sin_family = AF_INET,
                             .sin_port = htons((uint16_t)d->port),
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
        close(fd);
        return -1;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    struct timeval tv = {.tv_sec = TDT_TIMEOUT_MS / 1000};
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    return fd;
}

int tdt_raw_write(int fd, const void *buf, size_t len)
{
    const uint8_t *p = buf;
    while (len) {
        ssize_t n = send(fd, p, len, MSG_NOSIGNAL);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return -errno;
        }
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

int tdt_raw_send(int fd, const Tensordd__V1__Request *req, const void *payload, uint64_t plen)
{
    size_t ml = tensordd__v1__request__get_packed_size(req);
    uint8_t *buf = malloc(TD_FRAME_HEADER_SIZE + ml);
    if (!buf)
        return -ENOMEM;
    td_frame_encode(buf, (uint32_t)ml, plen);
    tensordd__v1__request__pack(req, buf + TD_FRAME_HEADER_SIZE);
    int rc = tdt_raw_write(fd, buf, TD_FRAME_HEADER_SIZE + ml);
    free(buf);
    if (rc == 0 && plen)
        rc = tdt_raw_write(fd, payload, (size_t)plen);
    return rc;
}

/* Reads exactly n bytes before the deadline: 1 ok, 0 closed, -1 timeout/error. */
static int read_full(int fd, void *dst, size_t n, double deadline)
{
    uint8_t *p = dst;
    while (n) {
        double left = deadline - now_ms();
        if (left <= 0)
            return -1;
        struct pollfd pf = {.fd = fd, .events = POLLIN};
        int r = poll(&pf, 1, (int)left + 1);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return -1;
        ssize_t k = recv(fd, p, n, 0);
        if (k == 0 || (k < 0 && errno == ECONNRESET))
            return 0;
        if (k < 0) {
            if (errno == EINTR || errno == EAGAIN)
                continue;
            return -1;
        }
        p += k;
        n -= (size_t)k;
    }
    return 1;
}

Tensordd__V1__Response *tdt_raw_recv(int fd, int timeout_ms, int *closed)
{
    double deadline = now_ms() + timeout_ms;
    *closed = 0;
    uint8_t hdr[TD_FRAME_HEADER_SIZE];
    int r = read_full(fd, hdr, sizeof hdr, deadline);
    if (r <= 0) {
        *closed = r == 0;
        return NULL;
    }
    td_frame_limits lim = {.max_msg = 64u << 20, .max_payload = 1ull << 40};
    td_frame_header h;
    if (td_frame_decode(hdr, &lim, &h) != 0)
        return NULL;
    uint8_t *msg = malloc(h.msg_len);
    if (!msg)
        return NULL;
    r = read_full(fd, msg, h.msg_len, deadline);
    if (r <= 0) {
        *closed = r == 0;
        free(msg);
        return NULL;
    }
    Tensordd__V1__Response *resp = tensordd__v1__response__unpack(NULL, h.msg_len, msg);
    free(msg);
    uint8_t sink[65536];
    for (uint64_t left = h.payload_len; left && resp;) {
        size_t take = left < sizeof sink ? (size_t)left : sizeof sink;
        if (read_full(fd, sink, take, deadline) <= 0)
            break;
        left -= take;
    }
    return resp;
}

int tdt_raw_wait_close(int fd, int timeout_ms)
{
    double deadline = now_ms() + timeout_ms;
    uint8_t buf[4096];
    for (;;) {
        double left = deadline - now_ms();
        if (left <= 0)
            return 0;
        struct pollfd pf = {.fd = fd, .events = POLLIN};
        int r = poll(&pf, 1, (int)left + 1);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return 0;
        ssize_t k = recv(fd, buf, sizeof buf, 0);
        if (k == 0 || (k < 0 && (errno == ECONNRESET || errno == EPIPE)))
            return 1;
        if (k < 0 && errno != EINTR && errno != EAGAIN)
            return 1;
    }
}
