/* latency.c -- small-op round trips against a raw loopback TCP ping-pong of the
 * same size measured in the same run, and pipelined small ops per second.
 *
 *   bench/latency ENDPOINT */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "bench.h"
#include "tensordd.h"

#define ROUNDS 2000
#define PIPELINED 200000

static void *echo(void *arg)
{
    int lfd = *(int *)arg;
    int fd = accept(lfd, NULL, NULL);
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    char buf[64];
    for (;;) {
        size_t got = 0;
        while (got < sizeof buf) {
            ssize_t n = recv(fd, buf + got, sizeof buf - got, 0);
            if (n <= 0)
                goto out;
            got += (size_t)n;
        }
        if (send(fd, buf, sizeof buf, MSG_NOSIGNAL) != (ssize_t)sizeof buf)
            break;
    }
out:
    close(fd);
    return NULL;
}

/* Median microseconds of a 64-byte ping-pong over loopback TCP. */
static double raw_pingpong_us(void)
{
    int lfd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t sl = sizeof sa;
    bind(lfd, (struct sockaddr *)&sa, sizeof sa);
    listen(lfd, 1);
    getsockname(lfd, (struct sockaddr *)&sa, &sl);
    pthread_t th;
    pthread_create(&th, NULL, echo, &lfd);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa))
        exit(2);
    char buf[64] = {0};
    static double t[ROUNDS];
    for (int r = 0; r < ROUNDS; r++) {
        double t0 = bench_now();
        send(fd, buf, sizeof buf, MSG_NOSIGNAL);
        size_t got = 0;
        while (got < sizeof buf) {
            ssize_t n = recv(fd, buf + got, sizeof buf - got, 0);
            if (n <= 0)
                exit(2);
            got += (size_t)n;
        }
        t[r] = bench_now() - t0;
    }
    close(fd);
    pthread_join(th, NULL);
    close(lfd);
    return bench_median(t, ROUNDS) * 1e6;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: latency ENDPOINT\n");
        return 2;
    }
    td_client *c;
    td_error err;
    if (td_connect(argv[1], NULL, &c, &err)) {
        fprintf(stderr, "latency: connect: %s\n", err.message);
        return 3;
    }
    int64_t shape[1] = {4};
    float x[4] = {1, -2, 3, -4};
    td_handle h;
    td_upload(c, NULL, TD_F32, 1, shape, x, 0, &h, &err);
    td_sync(c, &err);

    /* Round trip of one small op that asks for its reply. */
    static double t[ROUNDS];
    td_op_opts sync_opts = {.want_reply = 1};
    for (int r = 0; r < ROUNDS; r++) {
        double t0 = bench_now();
        td_handle y = td_op1(c, "relu", &h, 1, &sync_opts, &err);
        t[r] = bench_now() - t0;
        if (!y) {
            fprintf(stderr, "latency: relu: %s\n", err.message);
            return 1;
        }
        td_release(c, &y, 1, &err);
    }
    double op_us = bench_median(t, ROUNDS) * 1e6;

    /* Sync round trip (no work). */
    for (int r = 0; r < ROUNDS; r++) {
        double t0 = bench_now();
        td_ping(c, &err);
        t[r] = bench_now() - t0;
    }
    double ping_us = bench_median(t, ROUNDS) * 1e6;

    /* Pipelined: fire-and-forget ops, one sync at the end. */
    static td_handle ys[PIPELINED];
    double t0 = bench_now();
    for (int i = 0; i < PIPELINED; i++)
        ys[i] = td_op1(c, "relu", &h, 1, NULL, &err);
    if (td_sync(c, &err)) {
        fprintf(stderr, "latency: pipelined: %s\n", err.message);
        return 1;
    }
    double secs = bench_now() - t0;
    td_release(c, ys, PIPELINED, &err);
    td_sync(c, &err);
    td_close(c);

    double raw_us = raw_pingpong_us();
    printf("small ops (median of %d)\n", ROUNDS);
    printf("  raw TCP ping-pong 64 B   %7.1f us\n", raw_us);
    printf("  Sync round trip          %7.1f us   %.2fx raw\n", ping_us, ping_us / raw_us);
    printf("  relu(4) with reply       %7.1f us   %.2fx raw\n", op_us, op_us / raw_us);
    printf("  pipelined relu(4)        %7.0f ops/s (%d ops, one sync)\n", PIPELINED / secs,
           PIPELINED);
    return 0;
}
