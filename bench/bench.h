/* bench.h -- timing helpers shared by the benchmark programs. */
#ifndef TDD_BENCH_H
#define TDD_BENCH_H

#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "tensordd.h"

/* td_connect; a tls:// endpoint with the CA certificates of $TENSORDD_CA_FILE (else the
 * system's), as bench/tls.sh runs them. */
static inline int bench_connect(const char *ep, td_client **c, td_error *err)
{
    td_tls_opts t = {.ca_file = getenv("TENSORDD_CA_FILE")};
    return td_connect_tls(ep, NULL, strncmp(ep, "tls://", 6) == 0 ? &t : NULL, c, err);
}

/* Raw-socket baselines: all n bytes or the process ends (exit 2; _exit, as the callers
 * may be forked children). */
static inline void bench_recv_all(int fd, char *buf, size_t n)
{
    size_t got = 0;
    while (got < n) {
        ssize_t r = recv(fd, buf + got, n - got, 0);
        if (r <= 0)
            _exit(2);
        got += (size_t)r;
    }
}

static inline void bench_send_all(int fd, const char *buf, size_t n)
{
    size_t off = 0;
    while (off < n) {
        ssize_t r = send(fd, buf + off, n - off, MSG_NOSIGNAL);
        if (r <= 0)
            _exit(2);
        off += (size_t)r;
    }
}

static inline double bench_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static inline int bench_cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Sorts v in place and returns its median. */
static inline double bench_median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, bench_cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

#endif
