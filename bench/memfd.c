/* memfd.c -- same-host zero copy: upload and download through sealed memfds against the
 * same transfers through the Unix socket and through loopback TCP, one daemon of its own
 * (tcp:// and unix:// listeners), ratios of the same run.
 *
 *   bench/memfd TENSORDD_BIN [MIB] [--reps N] [-- DAEMON_OPTIONS]
 *
 * Upload: td_upload + td_sync of MIB MiB of f32 from a buffer already faulted in, against
 * td_upload_fd + td_sync of a sealed memfd holding the same bytes (writing the memfd is
 * timed apart: it is what a client pays when its data is not in a memfd already).
 * Download: td_download into a buffer already faulted in, against td_download_fd of the
 * uploaded tensor (the daemon hands the memfd back) with the mmap of it, and with a read
 * of every page of the mapping; and td_download_fd of a computed tensor (neg), with the
 * mmap and with a read of every page, twice: from the daemon as started (by default it
 * writes a sealed copy), then from one started again with --memfd-storage-min 4M (neg's
 * output is made in a memfd of the daemon's own, which the download seals and hands over);
 * each row says which it got. neg's own time is shown beside the same op on the TCP
 * session (anonymous storage): a fresh memfd's page allocation moves into the op. Options
 * after -- go to both daemons. Best of N; every result is checked bit for bit. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench.h"

static pid_t daemon_pid;
static char tcp_ep[128], unix_ep[160], sock_dir[64];

static void stop_daemon(void)
{
    if (daemon_pid > 0) {
        kill(daemon_pid, SIGTERM);
        waitpid(daemon_pid, NULL, 0);
        daemon_pid = 0;
    }
    if (sock_dir[0]) {
        char p[96];
        snprintf(p, sizeof p, "%s/s", sock_dir);
        unlink(p);
        rmdir(sock_dir);
    }
}

/* Starts bin with a tcp:// and a unix:// listener; fills tcp_ep and unix_ep. */
static int start_daemon(const char *bin, char **extra, int nextra)
{
    snprintf(sock_dir, sizeof sock_dir, "/tmp/tdd-memfd-XXXXXX");
    if (!mkdtemp(sock_dir))
        return -1;
    char unix_arg[sizeof unix_ep];
    snprintf(unix_ep, sizeof unix_ep, "unix://%s/s", sock_dir);
    snprintf(unix_arg, sizeof unix_arg, "%s", unix_ep);
    int out[2];
    if (pipe(out))
        return -1;
    daemon_pid = fork();
    if (daemon_pid == 0) {
        dup2(out[1], 1);
        close(out[0]);
        close(out[1]);
        char *args[32] = {(char *)bin,   "--listen", "tcp://127.0.0.1:0", "--listen", unix_arg,
                          "--log-level", "warn"};
        for (int i = 0; i < nextra && i < 24; i++)
            args[7 + i] = extra[i];
        execv(bin, args);
        _exit(127);
    }
    close(out[1]);
    FILE *f = fdopen(out[0], "r");
    char line[256];
    int seen = 0;
    while (seen < 2 && f && fgets(line, sizeof line, f)) {
        const char *p = strstr(line, "listening on tcp://");
        if (p)
            sscanf(p + 13, "%127s", tcp_ep);
        seen += strstr(line, "listening on") != NULL;
    }
    if (seen < 2)
        return -1;
    /* (the daemon writes nothing more to stdout at --log-level warn; the pipe stays open) */
    return 0;
}

/* Whether fd is a memfd whose name holds name (/proc/self/fd's link: "/memfd:NAME"). */
static int memfd_named(int fd, const char *name)
{
    char path[64], link[256];
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    ssize_t k = readlink(path, link, sizeof link - 1);
    if (k <= 0)
        return 0;
    link[k] = 0;
    return strstr(link, name) != NULL;
}

static int fail(const char *what, const td_error *e)
{
    fprintf(stderr, "memfd: %s: %s: %s\n", what, td_err_name(e->code), e->message);
    stop_daemon();
    return 1;
}

static double best(double a, double b)
{
    return b < a ? b : a;
}

/* Upload and download of n bytes over ep with the socket path, and neg of the uploaded
 * tensor (its output in anonymous memory: a session that passed no memfd); best seconds
 * each. */
static int socket_path(const char *ep, const float *src, float *dst, size_t n, int reps, double *up,
                       double *down, double *neg)
{
    td_client *c;
    td_error e;
    if (bench_connect(ep, &c, &e))
        return fail("connect", &e);
    int64_t shape[1] = {(int64_t)(n / sizeof(float))};
    *up = *down = *neg = 1e9;
    for (int r = 0; r < reps; r++) {
        td_handle h;
        double t0 = bench_now();
        if (td_upload(c, NULL, TD_F32, 1, shape, src, 0, &h, &e) || td_sync(c, &e))
            return fail("upload", &e);
        double t1 = bench_now();
        if (td_download(c, h, dst, n, NULL, &e))
            return fail("download", &e);
        double t2 = bench_now();
        if (memcmp(src, dst, n)) {
            fprintf(stderr, "memfd: %s round trip differs\n", ep);
            return 1;
        }
        td_handle hn;
        double t3 = bench_now();
        if (td_op(c, "neg", &h, 1, NULL, &hn, 1, &e) || td_sync(c, &e))
            return fail("neg", &e);
        double t4 = bench_now();
        td_handle both[2] = {h, hn};
        td_release(c, both, 2, &e);
        td_sync(c, &e);
        *up = best(*up, t1 - t0);
        *down = best(*down, t2 - t1);
        *neg = best(*neg, t4 - t3);
    }
    td_close(c);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: memfd TENSORDD_BIN [MIB] [--reps N] [-- DAEMON_OPTIONS]\n");
        return 2;
    }
    size_t mib = 1024;
    int reps = 3;
    char **extra = NULL;
    int nextra = 0;
    for (int i = 2; i < argc; i++) {
        if (strcmp(argv[i], "--") == 0) {
            extra = argv + i + 1;
            nextra = argc - i - 1;
            break;
        }
        if (strcmp(argv[i], "--reps") == 0 && i + 1 < argc)
            reps = atoi(argv[++i]);
        else
            mib = (size_t)atol(argv[i]);
    }
    size_t n = mib << 20, count = n / sizeof(float);
    float *src = malloc(n), *dst = malloc(n), *neg = malloc(n);
    if (!src || !dst || !neg)
        return 2;
    uint32_t x = 2463534242u;
    for (size_t i = 0; i < count; i++) {
        x ^= x << 13, x ^= x >> 17, x ^= x << 5;
        float v = (float)(x >> 8) / 16777216.0f - 0.5f; /* finite: neg is checked bitwise */
        src[i] = v;
        neg[i] = -v;
    }
    memset(dst, 0, n);
    if (start_daemon(argv[1], extra, nextra)) {
        fprintf(stderr, "memfd: cannot start %s\n", argv[1]);
        stop_daemon();
        return 2;
    }

    double tcp_up, tcp_down, unix_up, unix_down, tcp_neg, unix_neg;
    if (socket_path(tcp_ep, src, dst, n, reps, &tcp_up, &tcp_down, &tcp_neg) ||
        socket_path(unix_ep, src, dst, n, reps, &unix_up, &unix_down, &unix_neg)) {
        stop_daemon();
        return 1;
    }
    free(dst);

    /* The memfd paths twice: the daemon as started, then one with --memfd-storage-min 4M
     * (computed tensors made in memfds); the computed-tensor rows are shown for both. */
    double fill = 1e9, up = 1e9, down = 1e9, down_touch = 1e9, down_pop = 1e9;
    double down_copy[2] = {1e9, 1e9}, comp_touch[2] = {1e9, 1e9}, comp_neg[2] = {1e9, 1e9};
    double again[2] = {1e9, 1e9};
    int exact = 1, sealed_in_place[2] = {1, 1};
    td_error e;
    int64_t shape[1] = {(int64_t)count};
    for (int mode = 0; mode < 2; mode++) {
        if (mode == 1) {
            char *more[32] = {"--memfd-storage-min", "4M"};
            for (int i = 0; i < nextra && i < 30; i++)
                more[2 + i] = extra[i];
            stop_daemon();
            if (start_daemon(argv[1], more, nextra < 30 ? nextra + 2 : 32)) {
                fprintf(stderr, "memfd: cannot start %s again\n", argv[1]);
                stop_daemon();
                return 2;
            }
        }
        td_client *c;
        if (bench_connect(unix_ep, &c, &e))
            return fail("connect", &e);
        for (int r = 0; r < reps; r++) {
            double t0 = bench_now();
            int fd = memfd_create("bench", MFD_CLOEXEC | MFD_ALLOW_SEALING);
            for (size_t off = 0; fd >= 0 && off < n;) {
                ssize_t w = pwrite(fd, (const char *)src + off, n - off, (off_t)off);
                if (w <= 0) {
                    fprintf(stderr, "memfd: writing the memfd: %s\n", strerror(errno));
                    stop_daemon();
                    return 1;
                }
                off += (size_t)w;
            }
            if (fd < 0 || fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE)) {
                fprintf(stderr, "memfd: a sealed memfd: %s\n", strerror(errno));
                stop_daemon();
                return 1;
            }
            double t1 = bench_now();
            td_handle h, hn;
            if (td_upload_fd(c, NULL, TD_F32, 1, shape, fd, 0, 0, &h, &e) || td_sync(c, &e))
                return fail("upload_fd", &e);
            double t2 = bench_now();
            int back;
            uint64_t at;
            if (td_download_fd(c, h, &back, &at, NULL, &e))
                return fail("download_fd", &e);
            void *m = mmap(NULL, n, PROT_READ, MAP_SHARED, back, (off_t)at);
            double t3 = bench_now();
            volatile unsigned sum = 0;
            for (size_t off = 0; m != MAP_FAILED && off < n; off += 4096)
                sum += ((const unsigned char *)m)[off]; /* every page once */
            double t4 = bench_now();
            exact &= m != MAP_FAILED && memcmp(m, src, n) == 0;
            if (m != MAP_FAILED)
                munmap(m, n);
            close(back);
            /* the same with the page tables filled by the kernel in one go (MAP_POPULATE) */
            double t7 = bench_now();
            if (td_download_fd(c, h, &back, &at, NULL, &e))
                return fail("download_fd", &e);
            m = mmap(NULL, n, PROT_READ, MAP_SHARED | MAP_POPULATE, back, (off_t)at);
            for (size_t off = 0; m != MAP_FAILED && off < n; off += 4096)
                sum += ((const unsigned char *)m)[off];
            double t8 = bench_now();
            if (m != MAP_FAILED)
                munmap(m, n);
            close(back);
            /* a computed tensor: its own memfd sealed, or a sealed copy */
            double t9 = bench_now();
            if (td_op(c, "neg", &h, 1, NULL, &hn, 1, &e) || td_sync(c, &e))
                return fail("neg", &e);
            double t5 = bench_now();
            if (td_download_fd(c, hn, &back, &at, NULL, &e))
                return fail("download_fd", &e);
            m = mmap(NULL, n, PROT_READ, MAP_SHARED, back, (off_t)at);
            double t6 = bench_now();
            for (size_t off = 0; m != MAP_FAILED && off < n; off += 4096)
                sum += ((const unsigned char *)m)[off];
            double t10 = bench_now();
            exact &= m != MAP_FAILED && memcmp(m, neg, n) == 0;
            sealed_in_place[mode] &= memfd_named(back, "tensordd-storage");
            if (m != MAP_FAILED)
                munmap(m, n);
            close(back);
            /* the same tensor again (unwritten: its storage's memfd once more, or a copy) */
            double t11 = bench_now();
            if (td_download_fd(c, hn, &back, &at, NULL, &e))
                return fail("download_fd", &e);
            m = mmap(NULL, n, PROT_READ, MAP_SHARED, back, (off_t)at);
            double t12 = bench_now();
            exact &= m != MAP_FAILED && memcmp(m, neg, n) == 0;
            if (m != MAP_FAILED)
                munmap(m, n);
            close(back);
            again[mode] = best(again[mode], t12 - t11);
            close(fd);
            td_handle both[2] = {h, hn};
            td_release(c, both, 2, &e);
            td_sync(c, &e);
            fill = best(fill, t1 - t0);
            up = best(up, t2 - t1);
            down = best(down, t3 - t2);
            down_touch = best(down_touch, t4 - t2);
            down_pop = best(down_pop, t8 - t7);
            down_copy[mode] = best(down_copy[mode], t6 - t5);
            comp_touch[mode] = best(comp_touch[mode], t10 - t5);
            comp_neg[mode] = best(comp_neg[mode], t5 - t9);
        }
        td_close(c);
    }
    stop_daemon();
    double g = (double)n / 1e9;
    printf("memfd: same-host transfers of %zu MiB f32 (best of %d), one daemon, its own\n", mib,
           reps);
    printf("  upload    tcp %7.3f s  unix %7.3f s  memfd %7.4f s: %6.1fx tcp, %6.1fx unix\n",
           tcp_up, unix_up, up, tcp_up / up, unix_up / up);
    printf("  upload incl. writing the memfd %7.3f s: %6.2fx tcp\n", fill + up,
           tcp_up / (fill + up));
    printf("  download  tcp %7.3f s  unix %7.3f s  memfd %7.4f s: %6.1fx tcp, %6.1fx unix\n",
           tcp_down, unix_down, down, tcp_down / down, unix_down / down);
    printf("  download incl. a read of every page %7.3f s: %6.2fx tcp\n", down_touch,
           tcp_down / down_touch);
    printf("  the same, mapped with MAP_POPULATE %7.3f s: %6.2fx tcp\n", down_pop,
           tcp_down / down_pop);
    static const char *const daemon_as[2] = {"as started", "--memfd-storage-min 4M"};
    for (int k = 0; k < 2; k++) {
        printf("  computed tensor (neg), daemon %s: %s\n", daemon_as[k],
               sealed_in_place[k] ? "its storage sealed, no copy" : "a sealed copy");
        printf("    download %7.4f s: %6.2fx tcp; then a read of every page %7.3f s: %6.2fx tcp\n",
               down_copy[k], tcp_down / down_copy[k], comp_touch[k], tcp_down / comp_touch[k]);
        printf("    its download again %7.4f s: %6.2fx tcp\n", again[k], tcp_down / again[k]);
        printf("    neg itself %.3f s (tcp session, anonymous storage: %.3f s); neg and the "
               "download, every page read: %.3f s against tcp's %.3f s: %.2fx\n",
               comp_neg[k], tcp_neg, comp_neg[k] + comp_touch[k], tcp_neg + tcp_down,
               (tcp_neg + tcp_down) / (comp_neg[k] + comp_touch[k]));
    }
    printf("  (GB/s: tcp up %.2f down %.2f; unix up %.2f down %.2f)\n", g / tcp_up, g / tcp_down,
           g / unix_up, g / unix_down);
    printf("  bit-exact: %s\n", exact ? "yes" : "NO");
    /* bench/summary.py's rows: upload from data already in a sealed memfd; download
     * mapped and every page read (the bytes in the client's hands, as after a TCP read) */
    printf("RESULT memfd.upload %.4g >=5\nRESULT memfd.download %.4g >=5\n", tcp_up / up,
           tcp_down / down_touch);
    printf("RESULT memfd.download_map %.4g -\nRESULT memfd.upload_fill %.4g -\n", tcp_down / down,
           tcp_up / (fill + up));
    /* computed tensors: the daemon as started, then with --memfd-storage-min */
    for (int k = 0; k < 2; k++) {
        const char *sfx = k ? "_storage" : "";
        printf("RESULT memfd.download_computed%s %.4g >=5\n", sfx, tcp_down / down_copy[k]);
        printf("RESULT memfd.download_computed_read%s %.4g -\n", sfx, tcp_down / comp_touch[k]);
        printf("RESULT memfd.neg_and_download%s %.4g -\n", sfx,
               (tcp_neg + tcp_down) / (comp_neg[k] + comp_touch[k]));
    }
    free(src);
    free(neg);
    return exact ? 0 : 1;
}
