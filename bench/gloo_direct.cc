// gloo_direct.cc -- the baseline for bench/allreduce.py: an all-reduce of float32 buffers
// across WORLD processes of one host, called on Gloo directly through the daemon's own
// shim (daemon/gloo_shim.cc): the same rendezvous, device and algorithm, without tensordd.
//
//   build/gloo/gloo_direct WORLD ITERS MIB [MIB...]   (make BUILD=build build/gloo/gloo_direct)
//
// Prints one line per size: "gloo-direct world W MiB M: median S s (min S s), N iters".
// Each rank fills its buffer with rank + 1 once; the result of the iterations is checked
// (the sum, times world for each later iteration). Before each timed call the ranks meet
// in a one-element all-reduce, so no rank's clock runs while another is not ready.
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <string>
#include <vector>

#include "gloo_shim.h"

static double now_s()
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

// Memory as the daemon's cpu backend takes it (backends/cpu/cpu.c): 2 MiB-aligned and
// hinted for transparent huge pages, so the two sides reduce the same kind of pages.
struct HostBuffer {
    void *p = nullptr;
    size_t len = 0;
    explicit HostBuffer(size_t n)
    {
        const size_t huge = size_t(2) << 20;
        len = (n + huge - 1) / huge * huge + huge;
        void *m = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (m == MAP_FAILED)
            return;
        base = m;
        uintptr_t a = ((uintptr_t)m + huge - 1) & ~(uintptr_t)(huge - 1);
        (void)madvise((void *)a, len - huge, MADV_HUGEPAGE);
        p = (void *)a;
    }
    ~HostBuffer()
    {
        if (base)
            munmap(base, len);
    }
    HostBuffer(const HostBuffer &) = delete;
    HostBuffer &operator=(const HostBuffer &) = delete;

  private:
    void *base = nullptr;
};

static int run_rank(const char *dir, int rank, int world, int iters, const std::vector<long> &mib)
{
    int code = 0;
    char msg[256] = "";
    tdd_gloo *g = tdd_gloo_connect("127.0.0.1", dir, rank, world, 60000, &code, msg, sizeof msg);
    if (!g) {
        fprintf(stderr, "rank %d: connect: %s\n", rank, msg);
        return 1;
    }
    for (long m : mib) {
        size_t n = (size_t)m * 1024 * 1024 / sizeof(float);
        HostBuffer hb(n * sizeof(float));
        float *buf = static_cast<float *>(hb.p);
        if (!buf) {
            fprintf(stderr, "rank %d: out of memory\n", rank);
            return 1;
        }
        std::fill(buf, buf + n, (float)(rank + 1));
        std::vector<double> t;
        float one = 0.0f, want = (float)world * (float)(world + 1) / 2.0f;
        for (int it = 0; it < iters + 1; it++) {
            // every rank ready before the clock starts: a one-element all-reduce
            if (tdd_gloo_allreduce(g, &one, 1, TDD_GLOO_F32, TDD_GLOO_SUM, msg, sizeof msg)) {
                fprintf(stderr, "rank %d: allreduce: %s\n", rank, msg);
                return 1;
            }
            double t0 = now_s();
            if (tdd_gloo_allreduce(g, buf, n, TDD_GLOO_F32, TDD_GLOO_SUM, msg, sizeof msg)) {
                fprintf(stderr, "rank %d: allreduce: %s\n", rank, msg);
                return 1;
            }
            if (it > 0) // the first is a warm-up
                t.push_back(now_s() - t0);
            if (it < iters)
                want *= (float)world;
        }
        if (buf[0] != want || buf[n - 1] != want) {
            fprintf(stderr, "rank %d: wrong sum %g, expected %g\n", rank, buf[0], want);
            return 1;
        }
        std::sort(t.begin(), t.end());
        if (rank == 0)
            printf("gloo-direct world %d MiB %ld: median %.6f s (min %.6f s), %d iters\n", world, m,
                   t[t.size() / 2], t[0], iters);
        fflush(stdout);
    }
    tdd_gloo_free(g);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 4) {
        fprintf(stderr, "usage: %s WORLD ITERS MIB [MIB...]\n", argv[0]);
        return 2;
    }
    int world = atoi(argv[1]), iters = atoi(argv[2]);
    std::vector<long> mib;
    for (int i = 3; i < argc; i++)
        mib.push_back(atol(argv[i]));
    if (world < 1 || iters < 1) {
        fprintf(stderr, "WORLD and ITERS must be positive\n");
        return 2;
    }
    char tmpl[] = "/tmp/gloo-direct-XXXXXX";
    if (!mkdtemp(tmpl)) {
        perror("mkdtemp");
        return 1;
    }
    std::string dir = std::string(tmpl) + "/g";
    std::vector<pid_t> kids;
    for (int r = 1; r < world; r++) {
        pid_t p = fork();
        if (p == 0)
            _exit(run_rank(dir.c_str(), r, world, iters, mib));
        kids.push_back(p);
    }
    int rc = run_rank(dir.c_str(), 0, world, iters, mib);
    for (pid_t p : kids) {
        int st = 0;
        waitpid(p, &st, 0);
        if (!WIFEXITED(st) || WEXITSTATUS(st))
            rc = 1;
    }
    rmdir(tmpl);
    return rc;
}
