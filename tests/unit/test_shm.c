/* test_shm.c -- host blocks in memfds (backends/cpu/cpu_shm.h): an exported block is its
 * own sealed memfd, later writes by the daemon leave the file alone, a written block is
 * not exported again, the block limit holds, and freeing closes the fd. */
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "cpu/cpu_shm.h"
#include "pool.h"

static int open_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    ck_assert_ptr_nonnull(d);
    int n = 0;
    while (readdir(d))
        n++;
    closedir(d);
    return n;
}

Suite *shm_suite(void);

#define SZ (2 * TDD_POOL_HUGE)

START_TEST(test_shm_export_seals_in_place)
{
    uint32_t keep = tdd_shm_max_blocks;
    tdd_shm_max_blocks = 2;
    int fds = open_fds();
    unsigned char *a = tdd_shm_alloc(SZ);
    ck_assert_ptr_nonnull(a);
    ck_assert_uint_eq((uintptr_t)a % TDD_POOL_HUGE, 0);
    size_t nonzero = 0;
    for (size_t i = 0; i < SZ; i++)
        nonzero += a[i] != 0;
    ck_assert_uint_eq(nonzero, 0); /* zeroed */
    for (size_t i = 0; i < SZ; i++)
        a[i] = (unsigned char)(i * 7);
    bool sealed = true;
    ck_assert(tdd_shm_is_block(a, &sealed) && !sealed);
    ck_assert(!tdd_shm_is_block(a + 64, NULL));

    /* a range inside the block: its own file, every seal, the bytes at the offset */
    uint64_t off = 0;
    int fd = tdd_shm_export(a + 4096, 8192, &off);
    ck_assert_int_ge(fd, 0);
    ck_assert_uint_eq(off, 4096);
    int want = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE | F_SEAL_SEAL;
    ck_assert_int_eq(fcntl(fd, F_GET_SEALS) & want, want);
    unsigned char got[8192];
    ck_assert_int_eq(pread(fd, got, sizeof got, (off_t)off), (ssize_t)sizeof got);
    ck_assert_mem_eq(got, a + 4096, sizeof got);
    ck_assert_int_lt(pwrite(fd, got, 1, 0), 0);
    ck_assert(tdd_shm_is_block(a, &sealed) && sealed);

    /* unwritten since: exported again, the same file */
    uint64_t off2 = 0;
    int fd2 = tdd_shm_export(a + 4096, 8192, &off2);
    ck_assert_int_ge(fd2, 0);
    close(fd2);

    /* the daemon writes the block: new pages; the file keeps its bytes */
    memset(a + 4096, 0xee, 100);
    ck_assert_int_eq(pread(fd, got, sizeof got, (off_t)off), (ssize_t)sizeof got);
    for (size_t i = 0; i < 100; i++)
        ck_assert_uint_eq(got[i], (unsigned char)((4096 + i) * 7));
    errno = 0;
    ck_assert_int_eq(tdd_shm_export(a + 4096, 8192, &off2), -1);
    ck_assert_int_eq(errno, ESTALE);
    fd2 = tdd_shm_export(a + SZ - 4096, 4096, &off2); /* a page not written: still the file */
    ck_assert_int_ge(fd2, 0);
    close(fd2);
    errno = 0;
    ck_assert_int_eq(tdd_shm_export(a, SZ + 1, &off2), -1); /* past the block */
    ck_assert_int_eq(errno, ENOENT);
    int x = 0;
    ck_assert_int_eq(tdd_shm_export(&x, sizeof x, &off2), -1); /* not a block */
    ck_assert_int_eq(errno, ENOENT);

    /* the limit: two blocks, the third refused */
    void *b = tdd_shm_alloc(SZ);
    ck_assert_ptr_nonnull(b);
    ck_assert_ptr_null(tdd_shm_alloc(SZ));
    ck_assert_uint_eq(tdd_shm_blocks(), 2);
    tdd_shm_free(b, SZ);
    tdd_shm_free(a, SZ);
    ck_assert_uint_eq(tdd_shm_blocks(), 0);
    ck_assert_int_eq(pread(fd, got, 4, (off_t)off), 4); /* the client's file outlives it */
    ck_assert_uint_eq(got[1], (unsigned char)(4097 * 7));
    close(fd);
    ck_assert_int_eq(open_fds(), fds);
    tdd_shm_max_blocks = keep;
}
END_TEST

START_TEST(test_shm_off)
{
    uint32_t keep = tdd_shm_max_blocks;
    tdd_shm_max_blocks = 0;
    ck_assert_ptr_null(tdd_shm_alloc(SZ));
    tdd_shm_max_blocks = 1;
    ck_assert_ptr_null(tdd_shm_alloc(SZ + 4096)); /* not a multiple of 2 MiB */
    ck_assert_ptr_null(tdd_shm_alloc(0));
    ck_assert_uint_eq(tdd_shm_blocks(), 0);
    tdd_shm_max_blocks = keep;
}
END_TEST

/* tdd_pool_release: the block goes back to the raw allocator, never to the cache. */
static int raw_frees;
static void *raw_alloc(void *ctx, size_t n)
{
    (void)ctx;
    return malloc(n);
}
static void raw_free(void *ctx, void *p, size_t n)
{
    (void)ctx;
    (void)n;
    raw_frees++;
    free(p);
}

START_TEST(test_pool_release)
{
    tdd_pool_raw raw = {.alloc = raw_alloc, .free = raw_free};
    tdd_pool_config cfg = {.cap = 1u << 20};
    tdd_pool *p = tdd_pool_new(&raw, &cfg);
    ck_assert_ptr_nonnull(p);
    void *a = tdd_pool_alloc(p, 1000), *b = tdd_pool_alloc(p, 1000);
    tdd_pool_free(p, a, 1000);
    tdd_pool_release(p, b, 1000);
    tdd_pool_stats st;
    tdd_pool_get_stats(p, &st);
    ck_assert_uint_eq(st.live, 0);
    ck_assert_uint_eq(st.cached, tdd_pool_block_size(1000));
    ck_assert_uint_eq(st.raw_frees, 1);
    ck_assert_int_eq(raw_frees, 1);
    ck_assert_ptr_eq(tdd_pool_alloc(p, 1000), a); /* the cached one, not the released one */
    tdd_pool_free(p, a, 1000);
    tdd_pool_destroy(p);
}
END_TEST

Suite *shm_suite(void)
{
    Suite *s = suite_create("shm");
    TCase *tc = tcase_create("shm");
    tcase_add_test(tc, test_shm_export_seals_in_place);
    tcase_add_test(tc, test_shm_off);
    tcase_add_test(tc, test_pool_release);
    suite_add_tcase(s, tc);
    return s;
}
