/* test_memfd.c -- same-host zero copy through libtensordd: td_upload_fd / td_download_fd
 * over a Unix socket are bit-exact, hand the same memfd back when the daemon never wrote
 * to it, hand a computed tensor's own memfd over sealed (a later in-place step leaves the
 * bytes the client holds alone), refuse a memfd that is not sealed (nothing kept: the
 * daemon's open fds are counted), and are refused over TCP. */
#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "itest.h"

#define N 3000
#define OFF 4096

static int open_fds(pid_t pid)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/fd", (int)pid);
    DIR *d = opendir(path);
    ck_assert_ptr_nonnull(d);
    int n = 0;
    while (readdir(d))
        n++;
    closedir(d);
    return n;
}

/* A memfd holding OFF zero bytes then data, sealed with seals (0: none). */
static int memfd_of(const float *data, size_t n, int seals)
{
    int fd = memfd_create("itest", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(ftruncate(fd, OFF), 0);
    ck_assert_int_eq(pwrite(fd, data, n * sizeof *data, OFF), (ssize_t)(n * sizeof *data));
    if (seals)
        ck_assert_int_eq(fcntl(fd, F_ADD_SEALS, seals), 0);
    return fd;
}

/* The bytes of fd at offset, compared with want. */
static void check_fd(int fd, uint64_t offset, const float *want, size_t n)
{
    ck_assert_int_ne(fcntl(fd, F_GET_SEALS) & F_SEAL_WRITE, 0);
    float *got = malloc(n * sizeof *got);
    ck_assert_int_eq(pread(fd, got, n * sizeof *got, (off_t)offset), (ssize_t)(n * sizeof *got));
    ck_assert_mem_eq(got, want, n * sizeof *got);
    free(got);
}

START_TEST(test_memfd_unix)
{
    tdt_daemon d;
    const char *args[] = {"--sim-devices", "1", NULL};
    ck_assert_int_eq(tdt_daemon_start(&d, args, 1), 0);
    char ep[160];
    snprintf(ep, sizeof ep, "unix://%s", d.unix_path);
    td_client *c = tdt_connect(ep, "memfd");
    ck_assert_ptr_nonnull(c);
    uint64_t seed = 11;
    static float x[N], negx[N];
    for (int i = 0; i < N; i++) {
        x[i] = it_randf(&seed, -5, 5);
        negx[i] = -x[i];
    }
    int64_t shape[2] = {30, N / 30};
    td_error e;
    td_device cpu = it_dev("cpu:0");

    /* up and back: the same file, no copy */
    int fd = memfd_of(x, N, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE);
    td_handle h = 0;
    ck_assert_int_eq(td_upload_fd(c, &cpu, TD_F32, 2, shape, fd, OFF, 0, &h, &e), 0);
    int back = -1;
    uint64_t at = 0;
    td_tensor_info info;
    ck_assert_msg(td_download_fd(c, h, &back, &at, &info, &e) == 0, "%s", e.message);
    struct stat a, b;
    ck_assert_int_eq(fstat(fd, &a), 0);
    ck_assert_int_eq(fstat(back, &b), 0);
    ck_assert_msg(a.st_ino == b.st_ino, "the download is not the uploaded memfd");
    ck_assert_uint_eq(at, OFF);
    ck_assert_int_eq(info.ndim, 2);
    ck_assert_int_eq(info.shape[1], N / 30);
    check_fd(back, at, x, N);
    close(back);
    static float y[N];
    it_download_f32(c, h, y, N);
    ck_assert_mem_eq(x, y, sizeof y);

    /* a computed tensor: a sealed memfd the daemon wrote */
    td_handle n = td_op1(c, "neg", &h, 1, NULL, &e);
    ck_assert_uint_ne(n, 0);
    ck_assert_msg(td_download_fd(c, n, &back, &at, NULL, &e) == 0, "%s", e.message);
    check_fd(back, at, negx, N);
    close(back);
    close(fd);

    /* device memory (sim:0): the daemon answers with a payload, the library seals it */
    td_handle hs = it_upload_f32(c, "sim:0", 2, shape, x);
    ck_assert_msg(td_download_fd(c, hs, &back, &at, NULL, &e) == 0, "%s", e.message);
    check_fd(back, at, x, N);
    close(back);

    /* an unsealed memfd: refused, typed, and not kept */
    ck_assert_int_eq(td_sync(c, &e), 0); /* (the memfd sent above is closed once written) */
    int before = open_fds(d.pid);
    fd = memfd_of(x, N, 0);
    ck_assert_int_eq(td_upload_fd(c, &cpu, TD_F32, 2, shape, fd, OFF, 0, &h, &e), 0);
    close(fd);
    ck_assert_int_eq(td_sync(c, &e), TD_EINVALID_ARGUMENT);
    ck_assert_msg(strstr(e.message, "not sealed") != NULL, "%s", e.message);
    ck_assert_int_eq(open_fds(d.pid), before);
    td_close(c);
    ck_assert_int_eq(tdt_daemon_stop(&d), 0);
}
END_TEST

/* Whether fd is the daemon's storage memfd (backends/cpu/cpu_shm.c names them). */
static int is_storage(int fd)
{
    char path[64], link[256];
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    ssize_t k = readlink(path, link, sizeof link - 1);
    ck_assert_int_gt(k, 0);
    link[k] = 0;
    return strstr(link, "memfd:tensordd-storage") != NULL;
}

#define BIG (1 << 21) /* floats: 8 MiB, over --memfd-storage-min */

START_TEST(test_memfd_computed_zero_copy)
{
    tdt_daemon d;
    const char *args[] = {"--memfd-storage-min", "4M", NULL};
    ck_assert_int_eq(tdt_daemon_start(&d, args, 1), 0);
    char ep[160];
    snprintf(ep, sizeof ep, "unix://%s", d.unix_path);
    td_client *c = tdt_connect(ep, "memfd-computed");
    ck_assert_ptr_nonnull(c);
    float *x = malloc(BIG * sizeof *x), *negx = malloc(BIG * sizeof *x);
    float *w = malloc(BIG * sizeof *x), *want = malloc(BIG * sizeof *x);
    ck_assert(x && negx && w && want);
    uint64_t seed = 12;
    for (int i = 0; i < BIG; i++) {
        x[i] = it_randf(&seed, -5, 5);
        negx[i] = -x[i];
        w[i] = (float)(i % 9 - 4); /* small integers: the SGD step below is exact */
    }
    int64_t shape[1] = {BIG};
    td_error e;

    /* a memfd upload: the session passes fds, its large tensors are made in memfds */
    int fd = memfd_create("itest", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    ck_assert_int_eq(pwrite(fd, x, BIG * sizeof *x, 0), (ssize_t)(BIG * sizeof *x));
    ck_assert_int_eq(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE), 0);
    td_handle h = 0;
    ck_assert_int_eq(td_upload_fd(c, NULL, TD_F32, 1, shape, fd, 0, 0, &h, &e), 0);
    close(fd);

    /* neg(x): its storage's memfd, sealed, bit-exact; twice the same file */
    td_handle n = td_op1(c, "neg", &h, 1, NULL, &e);
    ck_assert_uint_ne(n, 0);
    int a = -1, b = -1;
    uint64_t at = 0, bt = 0;
    ck_assert_msg(td_download_fd(c, n, &a, &at, NULL, &e) == 0, "%s", e.message);
    ck_assert_msg(is_storage(a), "the download of a computed tensor is a copy");
    ck_assert_int_eq(fcntl(a, F_GET_SEALS) & (F_SEAL_WRITE | F_SEAL_SEAL),
                     F_SEAL_WRITE | F_SEAL_SEAL);
    check_fd(a, at, negx, BIG);
    ck_assert_int_lt(pwrite(a, x, 4, (off_t)at), 0);
    ck_assert_ptr_eq(mmap(NULL, 4096, PROT_WRITE, MAP_SHARED, a, 0), MAP_FAILED);
    ck_assert_msg(td_download_fd(c, n, &b, &bt, NULL, &e) == 0, "%s", e.message);
    struct stat sa, sb;
    ck_assert_int_eq(fstat(a, &sa), 0);
    ck_assert_int_eq(fstat(b, &sb), 0);
    ck_assert_msg(sa.st_ino == sb.st_ino && at == bt, "the second download is another file");
    close(a);
    close(b);

    /* a parameter uploaded through the socket (made in a memfd too), downloaded, then an
     * SGD step: the bytes the client holds stay, the next download has the step's */
    td_handle p = 0, wh = it_upload_f32(c, "cpu:0", 1, shape, w);
    ck_assert_int_eq(td_upload(c, NULL, TD_F32, 1, shape, x, 1, &p, &e), 0);
    ck_assert_msg(td_download_fd(c, p, &a, &at, NULL, &e) == 0, "%s", e.message);
    ck_assert(is_storage(a));
    const float *held = mmap(NULL, BIG * sizeof *x, PROT_READ, MAP_SHARED, a, (off_t)at);
    ck_assert_ptr_ne(held, MAP_FAILED);
    td_handle pw[2] = {p, wh};
    td_handle prod = td_op1(c, "mul", pw, 2, NULL, &e);
    td_handle loss = td_op1(c, "sum", &prod, 1, NULL, &e);
    td_handle grads = 0, opt = 0;
    ck_assert_msg(td_backward(c, loss, 0, 0, &grads, &e) == 0, "%s", e.message);
    td_attr lr = td_attr_float("lr", 0.5);
    ck_assert_int_eq(td_optimizer_create(c, "sgd", &p, 1, &lr, 1, &opt, &e), 0);
    ck_assert_msg(td_optimizer_step(c, opt, grads, &e) == 0, "%s", e.message);
    for (int i = 0; i < BIG; i++)
        want[i] = x[i] + (-0.5f) * w[i];
    ck_assert_mem_eq(held, x, BIG * sizeof *x); /* sealed: the step wrote new pages */
    check_fd(a, at, x, BIG);
    ck_assert_msg(td_download_fd(c, p, &b, &bt, NULL, &e) == 0, "%s", e.message);
    ck_assert_msg(!is_storage(b), "the storage was written: its download must be a copy");
    check_fd(b, bt, want, BIG);
    ck_assert_mem_eq(held, x, BIG * sizeof *x);
    munmap((void *)held, BIG * sizeof *x);
    close(a);
    close(b);
    free(x), free(negx), free(w), free(want);
    td_close(c);
    ck_assert_int_eq(tdt_daemon_stop(&d), 0);
}
END_TEST

START_TEST(test_memfd_tcp_refused)
{
    td_client *c = it_client("memfd-tcp");
    float x[4] = {1, 2, 3, 4};
    int64_t shape[1] = {4};
    td_handle h = it_upload_f32(c, "cpu:0", 1, shape, x);
    td_error e;
    int fd = -1;
    uint64_t at = 0;
    ck_assert_int_eq(td_download_fd(c, h, &fd, &at, NULL, &e), TD_EINVALID_ARGUMENT);
    ck_assert_msg(strstr(e.message, "TCP") != NULL, "%s", e.message);
    ck_assert_int_eq(fd, -1);
    fd = memfd_create("itest", MFD_CLOEXEC);
    td_handle u = 0;
    ck_assert_int_eq(td_upload_fd(c, NULL, TD_F32, 1, shape, fd, 0, 0, &u, &e),
                     TD_EINVALID_ARGUMENT); /* refused here: the session goes on */
    ck_assert_msg(strstr(e.message, "TCP") != NULL, "%s", e.message);
    close(fd);
    float y[4];
    it_download_f32(c, h, y, 4); /* the session goes on */
    ck_assert_mem_eq(x, y, sizeof y);
    td_close(c);
}
END_TEST

Suite *it_memfd_suite(void)
{
    Suite *s = suite_create("memfd");
    TCase *tc = tcase_create("memfd");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_memfd_unix);
    tcase_add_test(tc, test_memfd_computed_zero_copy);
    tcase_add_test(tc, test_memfd_tcp_refused);
    suite_add_tcase(s, tc);
    return s;
}
