/* pool.h -- a caching allocator for one device, over a "raw" allocator the backend
 * supplies (mmap/posix_memalign on the cpu backend, cudaMalloc on a GPU).
 *
 * Requests are rounded up to size classes (up to 4 MiB: 64 B granules, at most 25% slack;
 * past 4 MiB: 2 MiB multiples, at most 12.5% slack from 16 MiB up); every class is one size,
 * and a freed block goes back
 * to its class's free list and the next request of that class takes it (last freed,
 * first reused: warm in cache and already faulted in). A steady loop of the same sizes
 * therefore stops calling the raw allocator after its first iteration.
 *
 * Free ("cached") blocks are released to the raw allocator
 *  - when the pool has seen no alloc or free for trim_after_ms (the idle trim, on a
 *    thread of the pool's own when cfg.trim_thread, else when the owner calls
 *    tdd_pool_trim_idle),
 *  - when keeping a freed block would put more than cfg.cap bytes in the cache,
 *  - when a raw allocation would take live + cached bytes past cfg.limit (the daemon's
 *    memory cap): cached blocks go first, largest first,
 *  - when the raw allocator fails: everything cached goes, and the request is retried,
 *  - when the owner asks every pool at once (tdd_pool_trim_all: the daemon does after its
 *    sessions released much memory), the raw allocator's trimmed hook called after.
 * Accounting stays with the caller: the pool never refuses what the raw allocator would
 * have granted. Thread-safe (one mutex; the raw allocator runs outside it). */
#ifndef TDD_POOL_H
#define TDD_POOL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct tdd_pool tdd_pool;

typedef struct {
    /* nbytes is a block size (tdd_pool_block_size); NULL when out of memory */
    void *(*alloc)(void *ctx, size_t nbytes);
    void (*free)(void *ctx, void *p, size_t nbytes);
    /* optional: called after an idle trim released blocks (e.g. malloc_trim) */
    void (*trimmed)(void *ctx);
    void *ctx;
} tdd_pool_raw;

typedef struct {
    uint64_t cap;           /* most free bytes kept; 0: none (every free is released) */
    uint64_t limit;         /* live + free bytes past which free ones are released; 0: none */
    uint32_t trim_after_ms; /* release every free block after this long unused; 0: never */
    bool trim_thread;       /* the pool runs its idle trim on a thread of its own */
} tdd_pool_config;

typedef struct {
    uint64_t live;       /* bytes handed out (block sizes) */
    uint64_t cached;     /* bytes free in the pool */
    uint64_t raw_allocs; /* calls to the raw allocator */
    uint64_t raw_frees;  /* blocks given back to it */
    uint64_t hits;       /* requests served from the cache */
    uint64_t idle_trims; /* idle trims that released something */
} tdd_pool_stats;

/* What a backend's pools start from: the daemon sets it from its options (--pool-cap,
 * --pool-trim, --memory-cap as the limit, 0 there meaning the backend's memory) before
 * the backends start; all zero (no caching) for programs that leave it alone. */
extern tdd_pool_config tdd_pool_defaults;

/* NULL when out of memory or the trim thread cannot start. */
tdd_pool *tdd_pool_new(const tdd_pool_raw *raw, const tdd_pool_config *cfg);
/* Releases every cached block; blocks still live are the owner's to free (or leak). */
void tdd_pool_destroy(tdd_pool *p);
/* A block of at least nbytes (0 counts as 1), aligned to 64 bytes (2 MiB from 4 MiB up
 * when the raw allocator aligns so); NULL when the raw allocator fails even after a trim. */
void *tdd_pool_alloc(tdd_pool *p, size_t nbytes);
/* ptr from tdd_pool_alloc with the same nbytes. */
void tdd_pool_free(tdd_pool *p, void *ptr, size_t nbytes);
/* Like tdd_pool_free, but the block goes back to the raw allocator, never to the cache
 * (a block that must not be handed out again as it is). */
void tdd_pool_release(tdd_pool *p, void *ptr, size_t nbytes);
/* Releases cached blocks, largest first, until at most keep bytes stay cached; returns
 * the bytes released. */
uint64_t tdd_pool_trim(tdd_pool *p, uint64_t keep);
/* The idle trim for owners without the trim thread: releases everything cached when the
 * pool has been unused for trim_after_ms. Returns the bytes released. */
uint64_t tdd_pool_trim_idle(tdd_pool *p);
/* Every pool releases everything cached, then calls its raw allocator's trimmed hook (the
 * cpu backend's gives the heap's free pages back): pools with a trim thread do it there,
 * delay_ms after the last of a burst of calls (a caller freeing many objects calls it as
 * it goes, and the trim comes once they are all freed), the caller never waiting on a raw
 * free; the others at once, before this returns. */
void tdd_pool_trim_all(uint32_t delay_ms);
void tdd_pool_get_stats(tdd_pool *p, tdd_pool_stats *s);
/* The size class nbytes falls in: what the raw allocator is asked for. */
size_t tdd_pool_block_size(size_t nbytes);

#define TDD_POOL_LARGE ((size_t)4 << 20) /* from here on, 2 MiB multiples */
#define TDD_POOL_HUGE ((size_t)2 << 20)

#endif
