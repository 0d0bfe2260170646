/* test_pool.c -- the caching allocator's size classes (backends/pool.c), over a raw
 * allocator that records the size of every block it hands out, so a block reused for a
 * request it is too small for is seen (the bytes past its end would be someone else's). */
#include <check.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

#include "pool.h"

Suite *pool_suite(void);

#define MAXB 4096

static struct {
    void *p;
    size_t n;
} blocks[MAXB];

static void *raw_alloc(void *ctx, size_t n)
{
    (void)ctx;
    for (int i = 0; i < MAXB; i++)
        if (!blocks[i].p) {
            blocks[i].p = malloc(1); /* the address only: nothing is written to it */
            blocks[i].n = n;
            return blocks[i].p;
        }
    return NULL;
}

static void raw_free(void *ctx, void *p, size_t n)
{
    (void)ctx;
    for (int i = 0; i < MAXB; i++)
        if (blocks[i].p == p) {
            ck_assert_uint_eq(n, blocks[i].n); /* released with the size it was made with */
            free(p);
            blocks[i].p = NULL;
            return;
        }
    ck_abort_msg("raw free of a block the raw allocator never made");
}

static size_t raw_size(const void *p)
{
    for (int i = 0; i < MAXB; i++)
        if (blocks[i].p == p)
            return blocks[i].n;
    ck_abort_msg("not a raw block");
    return 0;
}

static tdd_pool *new_pool(void)
{
    tdd_pool_raw raw = {.alloc = raw_alloc, .free = raw_free};
    tdd_pool_config cfg = {.cap = (uint64_t)1 << 40};
    tdd_pool *p = tdd_pool_new(&raw, &cfg);
    ck_assert_ptr_nonnull(p);
    return p;
}

/* Request sizes around every power of two from 64 B to 64 MiB, and the 4 MiB boundary. */
static size_t sizes(size_t *out)
{
    size_t n = 0;
    for (size_t b = 64; b <= ((size_t)64 << 20); b *= 2) {
        const size_t near[] = {b - 1, b, b + 1, b + b / 8, b + b / 4 + 1, b + b / 2, b + b - 64};
        for (size_t i = 0; i < sizeof near / sizeof near[0]; i++)
            out[n++] = near[i];
    }
    const size_t edge[] = {((size_t)5 << 19), ((size_t)4 << 20) - 4096, ((size_t)9 << 19) + 1};
    for (size_t i = 0; i < sizeof edge / sizeof edge[0]; i++)
        out[n++] = edge[i];
    return n;
}

/* Every request freed, then every request again (in the other order): each gets a block
 * at least its size, and the pool's block size is what the raw allocator made. */
START_TEST(test_reused_blocks_are_big_enough)
{
    static size_t ns[256];
    size_t n = sizes(ns);
    tdd_pool *p = new_pool();
    for (size_t i = 0; i < n; i++) {
        void *b = tdd_pool_alloc(p, ns[i]);
        ck_assert_ptr_nonnull(b);
        ck_assert_uint_ge(raw_size(b), ns[i]);
        ck_assert_uint_eq(raw_size(b), tdd_pool_block_size(ns[i]));
        tdd_pool_free(p, b, ns[i]);
    }
    for (size_t i = n; i-- > 0;) {
        void *b = tdd_pool_alloc(p, ns[i]);
        ck_assert_ptr_nonnull(b);
        ck_assert_msg(raw_size(b) >= ns[i], "a request of %zu bytes got a block of %zu", ns[i],
                      raw_size(b));
        tdd_pool_free(p, b, ns[i]);
    }
    tdd_pool_destroy(p); /* raw_free checks every cached block's size */
}
END_TEST

/* The case that was wrong: a 2.5 MiB block freed, then 4 MiB asked for. */
START_TEST(test_four_mib_does_not_take_a_smaller_freed_block)
{
    tdd_pool *p = new_pool();
    size_t small = (size_t)5 << 19, large = (size_t)4 << 20;
    void *a = tdd_pool_alloc(p, small);
    tdd_pool_free(p, a, small);
    void *b = tdd_pool_alloc(p, large);
    ck_assert_uint_ge(raw_size(b), large);
    tdd_pool_free(p, b, large);
    tdd_pool_destroy(p);
}
END_TEST

/* Block sizes: never below the request, never falling as requests grow, and 2 MiB
 * multiples from 4 MiB up (the cpu backend maps those on 2 MiB pages). */
START_TEST(test_block_sizes_are_monotonic)
{
    size_t last = 0;
    for (size_t n = 1; n <= ((size_t)40 << 20); n += n < 8192 ? 1 : n / 64) {
        size_t s = tdd_pool_block_size(n);
        ck_assert_uint_ge(s, n);
        ck_assert_uint_ge(s, last);
        if (s >= TDD_POOL_LARGE)
            ck_assert_uint_eq(s % TDD_POOL_HUGE, 0);
        last = s;
    }
}
END_TEST

static atomic_int trimmed_calls;

static void raw_trimmed(void *ctx)
{
    (void)ctx;
    atomic_fetch_add(&trimmed_calls, 1);
}

/* tdd_pool_trim_all: a pool with a trim thread releases everything it keeps there, after
 * the last of a burst of calls, and calls its trimmed hook once; one without a thread at
 * once. The idle trim (an hour) is not what releases them. */
START_TEST(test_trim_all_releases_every_pool)
{
    tdd_pool_raw raw = {.alloc = raw_alloc, .free = raw_free, .trimmed = raw_trimmed};
    tdd_pool_config cfg = {
        .cap = (uint64_t)1 << 40, .trim_after_ms = 3600u * 1000u, .trim_thread = true};
    tdd_pool *threaded = tdd_pool_new(&raw, &cfg);
    cfg.trim_thread = false;
    tdd_pool *plain = tdd_pool_new(&raw, &cfg);
    ck_assert_ptr_nonnull(threaded);
    ck_assert_ptr_nonnull(plain);
    void *b[200];
    for (int i = 0; i < 200; i++)
        b[i] = tdd_pool_alloc(i % 2 ? threaded : plain, 64u * (size_t)(1 + i % 7));
    for (int i = 0; i < 200; i++)
        tdd_pool_free(i % 2 ? threaded : plain, b[i], 64u * (size_t)(1 + i % 7));
    tdd_pool_stats st;
    tdd_pool_get_stats(threaded, &st);
    ck_assert_uint_gt(st.cached, 0);
    atomic_store(&trimmed_calls, 0);
    for (int i = 0; i < 5; i++) /* a burst: one trim at its end */
        tdd_pool_trim_all(20);
    tdd_pool_get_stats(plain, &st);
    ck_assert_uint_eq(st.cached, 0); /* no thread: done before the call returned */
    for (int i = 0; i < 500; i++) {
        tdd_pool_get_stats(threaded, &st);
        if (!st.cached && atomic_load(&trimmed_calls) >= 6)
            break;
        nanosleep(&(struct timespec){.tv_nsec = 10000000}, NULL);
    }
    ck_assert_uint_eq(st.cached, 0);
    ck_assert_int_eq(atomic_load(&trimmed_calls), 6); /* 5 inline, 1 on the thread */
    tdd_pool_destroy(threaded);
    tdd_pool_destroy(plain);
}
END_TEST

Suite *pool_suite(void)
{
    Suite *s = suite_create("pool");
    TCase *tc = tcase_create("classes");
    tcase_add_test(tc, test_reused_blocks_are_big_enough);
    tcase_add_test(tc, test_four_mib_does_not_take_a_smaller_freed_block);
    tcase_add_test(tc, test_block_sizes_are_monotonic);
    tcase_add_test(tc, test_trim_all_releases_every_pool);
    suite_add_tcase(s, tc);
    return s;
}
