/* alloc.c -- the rows of issue 11 that allocation and idle threads decide:
 *   - a 16 MiB f32 add through the daemon (add + release + sync, one at a time) against
 *     the same add in this process into an output it keeps (1 thread), with the daemon's
 *     minor page faults and CPU time per add;
 *   - 1 MiB uploads on 4 connections at once (upload + release, one sync at the end)
 *     against raw loopback TCP on 4 connections into buffers another process keeps, with
 *     the daemon's page faults per upload.
 *
 * RESULT lines (bench/summary.py): alloc.upload4 (throughput / raw's, target >= 0.9),
 * alloc.add16 (time / local's), alloc.faults.add16 and alloc.faults.upload (per add, per
 * upload; target 0).
 *
 *   bench/alloc ENDPOINT DAEMON_PID [--reps N]
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench.h"
#include "tensordd.h"

#define CONNS 4
#define UPLOADS 200 /* per connection per run */
#define UP_BYTES ((size_t)1 << 20)

/* minflt and utime + stime (seconds) of pid, summed over its threads. */
static void proc_stat(int pid, long *minflt, double *cpu_s)
{
    char path[64], buf[2048];
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    FILE *f = fopen(path, "r");
    *minflt = -1;
    *cpu_s = -1;
    if (!f)
        return;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    char *p = strrchr(buf, ')');
    if (!p)
        return;
    /* fields 3.. after the name: state(3) ... minflt(10) ... utime(14) stime(15) */
    unsigned long v[16] = {0};
    int k = 0;
    for (char *tok = strtok(p + 2, " "); tok && k < 16; tok = strtok(NULL, " "))
        v[k++] = strtoul(tok, NULL, 10);
    long tick = sysconf(_SC_CLK_TCK);
    *minflt = (long)v[7];
    *cpu_s = (double)(v[11] + v[12]) / (double)(tick > 0 ? tick : 100);
}

static void die(const char *what, const td_error *err)
{
    fprintf(stderr, "alloc: %s: %s: %s\n", what, td_err_name(err->code), err->message);
    exit(1);
}

/* ---- 16 MiB add */

static void bench_add(const char *ep, int pid, int reps)
{
    const int64_t n = 4 << 20; /* f32: 16 MiB */
    float *a = malloc((size_t)n * 4), *b = malloc((size_t)n * 4), *y = malloc((size_t)n * 4);
    for (int64_t i = 0; i < n; i++) {
        a[i] = (float)i;
        b[i] = 1.0f;
        y[i] = 0.0f;
    }
    td_client *c;
    td_error err;
    if (td_connect(ep, NULL, &c, &err))
        die("connect", &err);
    td_handle h[2];
    if (td_upload(c, NULL, TD_F32, 1, &n, a, 0, &h[0], &err) ||
        td_upload(c, NULL, TD_F32, 1, &n, b, 0, &h[1], &err) || td_sync(c, &err))
        die("upload", &err);
    enum { BLOCK = 10 };
    double remote[64] = {0}, local[64] = {0};
    if (reps > 64)
        reps = 64;
    long f0 = 0, f1 = 0;
    double c0 = 0, c1 = 0;
    for (int r = -1; r < reps; r++) { /* r = -1: warm-up */
        if (r == 0)
            proc_stat(pid, &f0, &c0);
        double t0 = bench_now();
        for (int i = 0; i < BLOCK; i++) {
            td_handle o = td_op1(c, "add", h, 2, NULL, &err);
            if (!o || td_release(c, &o, 1, &err) || td_sync(c, &err))
                die("add", &err);
        }
        double t1 = bench_now();
        for (int i = 0; i < BLOCK; i++)
            for (int64_t k = 0; k < n; k++)
                y[k] = a[k] + b[k];
        double t2 = bench_now();
        if (r >= 0) {
            remote[r] = (t1 - t0) / BLOCK;
            local[r] = (t2 - t1) / BLOCK;
        }
        usleep(20000);
    }
    proc_stat(pid, &f1, &c1);
    td_close(c);
    double adds = (double)reps * BLOCK;
    double rm = bench_median(remote, reps), lm = bench_median(local, reps);
    printf("16 MiB f32 add, one at a time (add + release + sync; median of %d blocks of %d)\n",
           reps, BLOCK);
    printf("  local, 1 thread, output kept  %7.3f ms   %6.2f GB/s (y[k] = a[k] + b[k]: %.1f)\n",
           lm * 1e3, 3.0 * (double)n * 4 / lm / 1e9, (double)y[n - 1]);
    printf("  tensordd                      %7.3f ms   %6.2f GB/s   %.2fx local\n", rm * 1e3,
           3.0 * (double)n * 4 / rm / 1e9, rm / lm);
    printf("  daemon per add: %.1f minor page faults, %.2f ms CPU (all its threads; with the local "
           "adds' time in between)\n",
           (double)(f1 - f0) / adds, (c1 - c0) / adds * 1e3);
    printf("RESULT alloc.add16 %.4f -\nRESULT alloc.faults.add16 %.3f <=0\n", rm / lm,
           (double)(f1 - f0) / adds);
    free(a);
    free(b);
    free(y);
}

/* ---- 1 MiB uploads on 4 connections */

typedef struct {
    const char *ep;
    int raw_fd; /* >= 0: the raw baseline on this socket */
    const float *src;
} up_arg;

static void *uploader(void *arg)
{
    const up_arg *u = arg;
    if (u->raw_fd >= 0) {
        for (int i = 0; i < UPLOADS; i++)
            bench_send_all(u->raw_fd, (const char *)u->src, UP_BYTES);
        char b;
        bench_recv_all(u->raw_fd, &b, 1); /* the server has it all */
        return NULL;
    }
    td_client *c;
    td_error err;
    if (td_connect(u->ep, NULL, &c, &err))
        die("connect", &err);
    int64_t shape = (int64_t)(UP_BYTES / 4);
    for (int i = 0; i < UPLOADS; i++) {
        td_handle h;
        if (td_upload(c, NULL, TD_F32, 1, &shape, u->src, 0, &h, &err) ||
            td_release(c, &h, 1, &err))
            die("upload", &err);
    }
    if (td_sync(c, &err))
        die("sync", &err);
    td_close(c);
    return NULL;
}

/* Seconds for CONNS x UPLOADS x 1 MiB: raw (another process receiving into buffers it
 * keeps, one thread per connection) or through the daemon. */
static double run_uploads(const char *ep, int raw, const float *src)
{
    int fds[CONNS];
    pid_t child = -1;
    if (raw) {
        int lfd = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in sa = {.sin_family = AF_INET};
        sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        socklen_t sl = sizeof sa;
        if (bind(lfd, (struct sockaddr *)&sa, sizeof sa) || listen(lfd, CONNS) ||
            getsockname(lfd, (struct sockaddr *)&sa, &sl))
            exit(2);
        child = fork();
        if (child == 0) {
            for (int k = 0; k < CONNS; k++) {
                if (fork() == 0) {
                    int fd = accept(lfd, NULL, NULL);
                    char *buf = malloc(UP_BYTES);
                    memset(buf, 1, UP_BYTES);
                    for (int i = 0; i < UPLOADS; i++)
                        bench_recv_all(fd, buf, UP_BYTES);
                    bench_send_all(fd, buf, 1);
                    _exit(0);
                }
            }
            for (int k = 0; k < CONNS; k++)
                wait(NULL);
            _exit(0);
        }
        close(lfd);
        for (int k = 0; k < CONNS; k++) {
            fds[k] = socket(AF_INET, SOCK_STREAM, 0);
            int one = 1;
            setsockopt(fds[k], IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
            if (connect(fds[k], (struct sockaddr *)&sa, sizeof sa))
                exit(2);
        }
    }
    pthread_t th[CONNS];
    up_arg args[CONNS];
    double t0 = bench_now();
    for (int k = 0; k < CONNS; k++) {
        args[k] = (up_arg){ep, raw ? fds[k] : -1, src};
        pthread_create(&th[k], NULL, uploader, &args[k]);
    }
    for (int k = 0; k < CONNS; k++)
        pthread_join(th[k], NULL);
    double t = bench_now() - t0;
    if (raw) {
        for (int k = 0; k < CONNS; k++)
            close(fds[k]);
        waitpid(child, NULL, 0);
    }
    return t;
}

static void bench_uploads(const char *ep, int pid, int reps)
{
    float *src = malloc(UP_BYTES);
    for (size_t i = 0; i < UP_BYTES / 4; i++)
        src[i] = (float)i;
    double rawt[64] = {0}, tdt[64] = {0};
    if (reps > 64)
        reps = 64;
    run_uploads(ep, 0, src); /* warm-up */
    long f0, f1;
    double c0, c1;
    proc_stat(pid, &f0, &c0);
    for (int r = 0; r < reps; r++) { /* interleaved, so both see the same load */
        rawt[r] = run_uploads(ep, 1, src);
        tdt[r] = run_uploads(ep, 0, src);
    }
    proc_stat(pid, &f1, &c1);
    double bytes = (double)CONNS * UPLOADS * (double)UP_BYTES;
    double rm = bench_median(rawt, reps), tm = bench_median(tdt, reps);
    printf("1 MiB uploads on %d connections at once (%d each, released as they go; median of "
           "%d runs)\n",
           CONNS, UPLOADS, reps);
    printf("  raw loopback TCP  %6.2f GB/s\n", bytes / rm / 1e9);
    printf("  tensordd          %6.2f GB/s   ratio %.2f; daemon: %.1f minor page faults per "
           "upload\n",
           bytes / tm / 1e9, rm / tm, (double)(f1 - f0) / ((double)reps * CONNS * UPLOADS));
    printf("RESULT alloc.upload4 %.4f >=0.9\nRESULT alloc.faults.upload %.3f <=0\n", rm / tm,
           (double)(f1 - f0) / ((double)reps * CONNS * UPLOADS));
    free(src);
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: alloc ENDPOINT DAEMON_PID [--reps N]\n");
        return 2;
    }
    int reps = 9;
    for (int i = 3; i + 1 < argc; i++)
        if (strcmp(argv[i], "--reps") == 0)
            reps = atoi(argv[++i]);
    if (reps < 1)
        reps = 1;
    bench_add(argv[1], atoi(argv[2]), reps);
    bench_uploads(argv[1], atoi(argv[2]), reps);
    return 0;
}
