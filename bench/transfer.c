/* transfer.c -- upload/download throughput against raw loopback TCP measured in
 * the same run, bit-exactness, and the daemon's peak RSS during the transfer.
 *
 *   bench/transfer ENDPOINT DAEMON_PID [MIB] [--check] [--reps N]
 *
 * --check: exit 1 unless the round trip is bit-exact and the daemon's peak RSS
 * stays under 1.3x the tensor size above its idle RSS (used by `make test`).
 * RESULT lines (bench/summary.py): transfer.upload and transfer.download (throughput /
 * raw loopback TCP's). */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench.h"
#include "tensordd.h"

/* kB value of a /proc/PID/status field, or -1. */
static long proc_kb(int pid, const char *field)
{
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%d/status", pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    long v = -1;
    size_t fl = strlen(field);
    while (fgets(line, sizeof line, f))
        if (strncmp(line, field, fl) == 0 && line[fl] == ':')
            v = atol(line + fl + 1);
    fclose(f);
    return v;
}

/* ---- the raw TCP baseline: another process that receives n bytes into a buffer
 * it keeps (already faulted in: the best case) and sends them back. */

static void raw_baseline(size_t n, int reps, double *up_gbs, double *down_gbs)
{
    int lfd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t sl = sizeof sa;
    bind(lfd, (struct sockaddr *)&sa, sizeof sa);
    listen(lfd, 1);
    getsockname(lfd, (struct sockaddr *)&sa, &sl);
    pid_t child = fork();
    if (child == 0) {
        int fd = accept(lfd, NULL, NULL);
        char *buf = malloc(n);
        memset(buf, 1, n);
        char b = 0;
        for (int r = 0; r < reps; r++) {
            bench_recv_all(fd, buf, n);
            bench_send_all(fd, &b, 1); /* received */
            bench_recv_all(fd, &b, 1); /* asked for it back */
            bench_send_all(fd, buf, n);
        }
        _exit(0);
    }
    close(lfd);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa))
        exit(2);
    char *src = malloc(n), *dst = malloc(n);
    memset(src, 7, n);
    memset(dst, 0, n);
    double best_up = 1e9, best_down = 1e9;
    for (int r = 0; r < reps; r++) {
        char b = 0;
        double t0 = bench_now();
        bench_send_all(fd, src, n);
        bench_recv_all(fd, &b, 1); /* the server has it all */
        double t1 = bench_now();
        bench_send_all(fd, &b, 1);
        bench_recv_all(fd, dst, n);
        double t2 = bench_now();
        best_up = t1 - t0 < best_up ? t1 - t0 : best_up;
        best_down = t2 - t1 < best_down ? t2 - t1 : best_down;
    }
    close(fd);
    waitpid(child, NULL, 0);
    free(src);
    free(dst);
    *up_gbs = (double)n / best_up / 1e9;
    *down_gbs = (double)n / best_down / 1e9;
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: transfer ENDPOINT DAEMON_PID [MIB] [--check] [--reps N]\n");
        return 2;
    }
    const char *ep = argv[1];
    int pid = atoi(argv[2]);
    size_t mib = 256;
    int check = 0, reps = 3;
    for (int i = 3; i < argc; i++) {
        if (strcmp(argv[i], "--check") == 0)
            check = 1;
        else if (strcmp(argv[i], "--reps") == 0 && i + 1 < argc)
            reps = atoi(argv[++i]);
        else
            mib = (size_t)atol(argv[i]);
    }
    size_t n = mib << 20;
    int64_t shape[1] = {(int64_t)(n / sizeof(float))};
    float *src = malloc(n), *dst = malloc(n);
    uint32_t x = 2463534242u;
    for (size_t i = 0; i < n / 4; i++) {
        x ^= x << 13, x ^= x >> 17, x ^= x << 5;
        memcpy(&src[i], &x, 4); /* arbitrary bit patterns, NaNs included */
    }
    memset(dst, 0, n);

    td_client *c;
    td_error err;
    if (bench_connect(ep, &c, &err)) {
        fprintf(stderr, "transfer: connect %s: %s\n", ep, err.message);
        return 3;
    }
    long idle_kb = proc_kb(pid, "VmRSS");
    double best_up = 1e9, best_down = 1e9;
    long peak_kb = 0;
    int exact = 1;
    for (int r = 0; r < reps; r++) {
        td_handle h;
        double t0 = bench_now();
        if (td_upload(c, NULL, TD_F32, 1, shape, src, 0, &h, &err) || td_sync(c, &err)) {
            fprintf(stderr, "transfer: upload: %s: %s\n", td_err_name(err.code), err.message);
            return 1;
        }
        double t1 = bench_now();
        if (td_download(c, h, dst, n, NULL, &err)) {
            fprintf(stderr, "transfer: download: %s: %s\n", td_err_name(err.code), err.message);
            return 1;
        }
        double t2 = bench_now();
        long hwm = proc_kb(pid, "VmHWM");
        peak_kb = hwm > peak_kb ? hwm : peak_kb;
        exact &= memcmp(src, dst, n) == 0;
        memset(dst, 0, n);
        td_release(c, &h, 1, &err);
        td_sync(c, &err);
        best_up = t1 - t0 < best_up ? t1 - t0 : best_up;
        best_down = t2 - t1 < best_down ? t2 - t1 : best_down;
    }
    td_close(c);
    double up = (double)n / best_up / 1e9, down = (double)n / best_down / 1e9;
    double raw_up, raw_down;
    raw_baseline(n, reps, &raw_up, &raw_down);
    double above = (double)(peak_kb - idle_kb) / (double)(n >> 10);
    printf("transfer of %zu MiB f32 (best of %d)\n", mib, reps);
    printf("  upload    %6.2f GB/s   raw loopback TCP %6.2f GB/s   ratio %.2f\n", up, raw_up,
           up / raw_up);
    printf("  download  %6.2f GB/s   raw loopback TCP %6.2f GB/s   ratio %.2f\n", down, raw_down,
           down / raw_down);
    printf("  round trip bit-exact: %s\n", exact ? "yes" : "NO");
    printf("  daemon RSS idle %ld MiB, peak %ld MiB: %.2fx the tensor above idle\n", idle_kb >> 10,
           peak_kb >> 10, above);
    printf("RESULT transfer.upload %.4f -\nRESULT transfer.download %.4f -\n", up / raw_up,
           down / raw_down);
    free(src);
    free(dst);
    if (check && (!exact || above > 1.3 || idle_kb < 0)) {
        fprintf(stderr, "transfer: FAILED (%s)\n", !exact ? "data differs" : "peak RSS over 1.3x");
        return 1;
    }
    return 0;
}
