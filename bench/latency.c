/* latency.c -- small-op round trips against a raw loopback TCP ping-pong of
 * the same size measured in the same run, and pipelined small ops per second.
 *
 *   bench/latency ENDPOINT [--quick]   (--quick: 4 blocks, 20000 pipelined ops: a smoke run)
 *
 * The machine's load drifts from second to second (2 shared cores), so the
 * baselines and the calls are timed in interleaved blocks (raw, raw, Sync,
 * relu, raw, raw, Sync, relu, ...) and each figure is the median of all its
 * blocks' rounds: a ratio then compares rounds that saw the same load.
 * Two baselines: the echo in a thread of this process (what this benchmark
 * always used) and in a forked process (as the daemon is: a round trip then
 * also switches address spaces).
 * RESULT lines (bench/summary.py): c.relu_reply (relu(4) with reply / the raw ping-pong
 * with the echo in another process) and c.pipelined_oneshot (ops/s). */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench.h"
#include "tensordd.h"

#define BLOCKS 20
#define BLOCK 100
#define ROUNDS (BLOCKS * BLOCK)
#define PIPELINED 200000
#define MSG 64

static void echo_fd(int fd)
{
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    char buf[MSG];
    for (;;) {
        size_t got = 0;
        while (got < sizeof buf) {
            ssize_t n = recv(fd, buf + got, sizeof buf - got, 0);
            if (n <= 0)
                return;
            got += (size_t)n;
        }
        if (send(fd, buf, sizeof buf, MSG_NOSIGNAL) != (ssize_t)sizeof buf)
            return;
    }
}

static void *echo_thread(void *arg)
{
    int lfd = *(int *)arg;
    int fd = accept(lfd, NULL, NULL);
    echo_fd(fd);
    close(fd);
    return NULL;
}

/* A listening loopback socket; its address in *sa. */
static int listen_loopback(struct sockaddr_in *sa)
{
    int lfd = socket(AF_INET, SOCK_STREAM, 0);
    *sa = (struct sockaddr_in){.sin_family = AF_INET};
    sa->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t sl = sizeof *sa;
    if (lfd < 0 || bind(lfd, (struct sockaddr *)sa, sizeof *sa) || listen(lfd, 1) ||
        getsockname(lfd, (struct sockaddr *)sa, &sl))
        exit(2);
    return lfd;
}

static int connect_loopback(const struct sockaddr_in *sa)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (connect(fd, (const struct sockaddr *)sa, sizeof *sa))
        exit(2);
    return fd;
}

/* n ping-pongs of MSG bytes on fd, each one's seconds into t. */
static void pingpong(int fd, double *t, int n)
{
    char buf[MSG] = {0};
    for (int r = 0; r < n; r++) {
        double t0 = bench_now();
        send(fd, buf, sizeof buf, MSG_NOSIGNAL);
        size_t got = 0;
        while (got < sizeof buf) {
            ssize_t k = recv(fd, buf + got, sizeof buf - got, 0);
            if (k <= 0)
                exit(2);
            got += (size_t)k;
        }
        t[r] = bench_now() - t0;
    }
}

int main(int argc, char **argv)
{
    if (argc < 2 || (argc > 2 && strcmp(argv[2], "--quick") != 0) || argc > 3) {
        fprintf(stderr, "usage: latency ENDPOINT [--quick]\n");
        return 2;
    }
    int blocks = argc > 2 ? 4 : BLOCKS, rounds = blocks * BLOCK;
    int pipelined = argc > 2 ? PIPELINED / 10 : PIPELINED;
    /* The forked echo first, while this process has one thread. */
    struct sockaddr_in sa_proc, sa_thr;
    int lproc = listen_loopback(&sa_proc);
    pid_t child = fork();
    if (child < 0)
        return 2;
    if (child == 0) {
        int fd = accept(lproc, NULL, NULL);
        echo_fd(fd);
        _exit(0);
    }
    close(lproc);
    int lthr = listen_loopback(&sa_thr);
    pthread_t th;
    pthread_create(&th, NULL, echo_thread, &lthr);
    int fd_thr = connect_loopback(&sa_thr), fd_proc = connect_loopback(&sa_proc);

    td_client *c;
    td_error err;
    if (bench_connect(argv[1], &c, &err)) {
        fprintf(stderr, "latency: connect: %s\n", err.message);
        return 3;
    }
    int64_t shape[1] = {4};
    float x[4] = {1, -2, 3, -4};
    td_handle h;
    td_upload(c, NULL, TD_F32, 1, shape, x, 0, &h, &err);
    td_sync(c, &err);

    static double t_thr[ROUNDS], t_proc[ROUNDS], t_sync[ROUNDS], t_op[ROUNDS];
    td_op_opts sync_opts = {.want_reply = 1};
    for (int b = 0; b < blocks; b++) {
        int o = b * BLOCK;
        pingpong(fd_thr, t_thr + o, BLOCK);
        pingpong(fd_proc, t_proc + o, BLOCK);
        /* Sync round trip (no work). */
        for (int r = 0; r < BLOCK; r++) {
            double t0 = bench_now();
            td_ping(c, &err);
            t_sync[o + r] = bench_now() - t0;
        }
        /* Round trip of one small op that asks for its reply. */
        for (int r = 0; r < BLOCK; r++) {
            double t0 = bench_now();
            td_handle y = td_op1(c, "relu", &h, 1, &sync_opts, &err);
            t_op[o + r] = bench_now() - t0;
            if (!y) {
                fprintf(stderr, "latency: relu: %s\n", err.message);
                return 1;
            }
            td_release(c, &y, 1, &err);
        }
    }
    close(fd_thr);
    close(fd_proc);
    pthread_join(th, NULL);
    close(lthr);
    waitpid(child, NULL, 0);
    double thr_us = bench_median(t_thr, rounds) * 1e6;
    double proc_us = bench_median(t_proc, rounds) * 1e6;
    double sync_us = bench_median(t_sync, rounds) * 1e6;
    double op_us = bench_median(t_op, rounds) * 1e6;

    /* Pipelined: fire-and-forget ops, one sync at the end. */
    static td_handle ys[PIPELINED];
    double t0 = bench_now();
    for (int i = 0; i < pipelined; i++)
        ys[i] = td_op1(c, "relu", &h, 1, NULL, &err);
    if (td_sync(c, &err)) {
        fprintf(stderr, "latency: pipelined: %s\n", err.message);
        return 1;
    }
    double secs = bench_now() - t0;
    td_release(c, ys, (size_t)pipelined, &err);
    td_sync(c, &err);
    td_close(c);

    printf("small ops (medians of %d rounds in %d interleaved blocks)\n", rounds, blocks);
    printf("  raw TCP ping-pong 64 B   %7.1f us   (echo in a thread of this process)\n", thr_us);
    printf("  raw TCP ping-pong 64 B   %7.1f us   (echo in another process)\n", proc_us);
    printf("  Sync round trip          %7.1f us   %.2fx raw   %.2fx raw (process)\n", sync_us,
           sync_us / thr_us, sync_us / proc_us);
    printf("  relu(4) with reply       %7.1f us   %.2fx raw   %.2fx raw (process)\n", op_us,
           op_us / thr_us, op_us / proc_us);
    printf("  pipelined relu(4)        %7.0f ops/s (%d ops, one sync)\n", pipelined / secs,
           pipelined);
    printf("RESULT c.relu_reply %.4f -\nRESULT c.pipelined_oneshot %.0f -\n", op_us / proc_us,
           pipelined / secs);
    return 0;
}
