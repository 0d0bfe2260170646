/* pool.c -- the caching allocator (see pool.h). */
#include "pool.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <time.h>

/* Class 0 is 64 bytes; then 8 slots per power of two from 2^6 up (4 or fewer used). */
#define NCLASS (1 + 58 * 8)
#define MAX_REQUEST ((size_t)1 << 56)
#define BATCH 64

typedef struct {
    void **v; /* a stack: the last block freed is the first reused */
    uint32_t n, cap;
    size_t size;
} freelist;

struct tdd_pool {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    tdd_pool_raw raw;
    tdd_pool_config cfg;
    uint64_t uses; /* allocs + frees: the idle trim waits for a period without any */
    uint64_t idle_uses, idle_since; /* tdd_pool_trim_idle's last look (ms) */
    tdd_pool_stats st;
    bool stop, idle_wait, has_thread;
    bool trim_now;    /* tdd_pool_trim_all asked the thread for a trim ... */
    uint64_t trim_at; /* ... at this CLOCK_MONOTONIC time (ns), the last call's + its delay */
    pthread_t thread;
    struct tdd_pool *next; /* every pool, for tdd_pool_trim_all */
    freelist cls[NCLASS];
};

tdd_pool_config tdd_pool_defaults;

static pthread_mutex_t pools_mu = PTHREAD_MUTEX_INITIALIZER;
static tdd_pool *pools;

static int class_of(size_t n, size_t *size)
{
    if (n <= 64) {
        *size = 64;
        return 0;
    }
    unsigned k = 63u - (unsigned)__builtin_clzll((unsigned long long)(n - 1)); /* 2^k < n */
    size_t base = (size_t)1 << k;
    /* The step depends on the power of two alone, so one class is one size: deciding it by
     * n gave a 4 MiB request the slot of (2 MiB, 2.5 MiB], whose freed blocks it then got. */
    size_t step = base >= TDD_POOL_LARGE ? base / 8 : base / 4;
    if (base >= TDD_POOL_LARGE && step < TDD_POOL_HUGE)
        step = TDD_POOL_HUGE;
    if (step < 64)
        step = 64;
    size_t j = (n - base + step - 1) / step; /* 1 .. base/step (at most 8) */
    *size = base + j * step;
    return 1 + (int)(k - 6) * 8 + (int)(j - 1);
}

size_t tdd_pool_block_size(size_t nbytes)
{
    size_t size;
    class_of(nbytes ? nbytes : 1, &size);
    return size;
}

/* Called and returns with p->mu held; drops it around the raw frees. */
static uint64_t trim_locked(tdd_pool *p, uint64_t keep)
{
    uint64_t released = 0;
    while (p->st.cached > keep) {
        void *blk[BATCH];
        size_t sz[BATCH];
        int nb = 0;
        for (int c = NCLASS - 1; c >= 0 && nb < BATCH && p->st.cached > keep; c--) {
            freelist *f = &p->cls[c];
            while (f->n && nb < BATCH && p->st.cached > keep) {
                blk[nb] = f->v[--f->n];
                sz[nb] = f->size;
                p->st.cached -= f->size;
                nb++;
            }
        }
        if (!nb)
            break;
        p->st.raw_frees += (uint64_t)nb;
        pthread_mutex_unlock(&p->mu);
        for (int i = 0; i < nb; i++) {
            p->raw.free(p->raw.ctx, blk[i], sz[i]);
            released += sz[i];
        }
        pthread_mutex_lock(&p->mu);
    }
    if (!keep) /* the lists' own arrays too (10^5 small blocks: 800 KB of them) */
        for (int c = 0; c < NCLASS; c++)
            if (!p->cls[c].n && p->cls[c].cap > 16) {
                free(p->cls[c].v);
                p->cls[c].v = NULL;
                p->cls[c].cap = 0;
            }
    return released;
}

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void deadline_in(struct timespec *ts, uint32_t ms)
{
    clock_gettime(CLOCK_MONOTONIC, ts);
    ts->tv_sec += ms / 1000;
    ts->tv_nsec += (long)(ms % 1000) * 1000000L;
    if (ts->tv_nsec >= 1000000000L) {
        ts->tv_sec++;
        ts->tv_nsec -= 1000000000L;
    }
}

/* Sleeps while nothing is cached; otherwise wakes once per trim_after_ms and releases
 * everything when no alloc or free happened in the whole period. */
static void *trimmer(void *arg)
{
    tdd_pool *p = arg;
    pthread_mutex_lock(&p->mu);
    while (!p->stop) {
        if (p->trim_now) { /* asked: everything cached and the raw allocator's free pages */
            uint64_t t = now_ns();
            if (t < p->trim_at) { /* a later call moves it on: wait for the calls to stop */
                struct timespec dl = {.tv_sec = (time_t)(p->trim_at / 1000000000u),
                                      .tv_nsec = (long)(p->trim_at % 1000000000u)};
                int rc = 0;
                while (!p->stop && rc != ETIMEDOUT)
                    rc = pthread_cond_timedwait(&p->cv, &p->mu, &dl);
                continue;
            }
            p->trim_now = false;
            if (trim_locked(p, 0))
                p->st.idle_trims++;
            if (p->raw.trimmed) {
                pthread_mutex_unlock(&p->mu);
                p->raw.trimmed(p->raw.ctx);
                pthread_mutex_lock(&p->mu);
            }
            continue;
        }
        if (!p->st.cached) {
            p->idle_wait = true;
            pthread_cond_wait(&p->cv, &p->mu);
            p->idle_wait = false;
            continue;
        }
        uint64_t seen = p->uses;
        struct timespec dl;
        deadline_in(&dl, p->cfg.trim_after_ms);
        int rc = 0;
        while (!p->stop && !p->trim_now && rc != ETIMEDOUT)
            rc = pthread_cond_timedwait(&p->cv, &p->mu, &dl);
        if (p->stop || p->trim_now || p->uses != seen)
            continue;
        if (trim_locked(p, 0)) {
            p->st.idle_trims++;
            if (p->raw.trimmed) {
                pthread_mutex_unlock(&p->mu);
                p->raw.trimmed(p->raw.ctx);
                pthread_mutex_lock(&p->mu);
            }
        }
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

tdd_pool *tdd_pool_new(const tdd_pool_raw *raw, const tdd_pool_config *cfg)
{
    tdd_pool *p = calloc(1, sizeof *p);
    if (!p)
        return NULL;
    p->raw = *raw;
    p->cfg = *cfg;
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, &ca);
    pthread_condattr_destroy(&ca);
    if (cfg->trim_thread && cfg->trim_after_ms && cfg->cap) {
        if (pthread_create(&p->thread, NULL, trimmer, p)) {
            tdd_pool_destroy(p);
            return NULL;
        }
        p->has_thread = true;
    }
    pthread_mutex_lock(&pools_mu);
    p->next = pools;
    pools = p;
    pthread_mutex_unlock(&pools_mu);
    return p;
}

void tdd_pool_destroy(tdd_pool *p)
{
    if (!p)
        return;
    pthread_mutex_lock(&pools_mu);
    for (tdd_pool **q = &pools; *q; q = &(*q)->next)
        if (*q == p) {
            *q = p->next;
            break;
        }
    pthread_mutex_unlock(&pools_mu);
    if (p->has_thread) {
        pthread_mutex_lock(&p->mu);
        p->stop = true;
        pthread_cond_signal(&p->cv);
        pthread_mutex_unlock(&p->mu);
        pthread_join(p->thread, NULL);
    }
    pthread_mutex_lock(&p->mu);
    trim_locked(p, 0);
    pthread_mutex_unlock(&p->mu);
    for (int c = 0; c < NCLASS; c++)
        free(p->cls[c].v);
    pthread_cond_destroy(&p->cv);
    pthread_mutex_destroy(&p->mu);
    free(p);
}

void *tdd_pool_alloc(tdd_pool *p, size_t nbytes)
{
    if (nbytes > MAX_REQUEST)
        return NULL;
    size_t size;
    int c = class_of(nbytes ? nbytes : 1, &size);
    pthread_mutex_lock(&p->mu);
    p->uses++;
    freelist *f = &p->cls[c];
    if (f->n) {
        void *b = f->v[--f->n];
        p->st.cached -= size;
        p->st.live += size;
        p->st.hits++;
        pthread_mutex_unlock(&p->mu);
        return b;
    }
    /* A new block: what is cached gives way first when live + cached would pass the limit. */
    uint64_t lim = p->cfg.limit;
    if (lim && p->st.cached && p->st.live + p->st.cached + size > lim)
        trim_locked(p, p->st.live + size < lim ? lim - p->st.live - size : 0);
    p->st.live += size;
    p->st.raw_allocs++;
    pthread_mutex_unlock(&p->mu);
    void *b = p->raw.alloc(p->raw.ctx, size);
    if (!b) { /* memory pressure: release everything cached and try once more */
        pthread_mutex_lock(&p->mu);
        uint64_t released = trim_locked(p, 0);
        pthread_mutex_unlock(&p->mu);
        if (released)
            b = p->raw.alloc(p->raw.ctx, size);
    }
    if (!b) {
        pthread_mutex_lock(&p->mu);
        p->st.live -= size;
        p->st.raw_allocs--;
        pthread_mutex_unlock(&p->mu);
    }
    return b;
}

void tdd_pool_free(tdd_pool *p, void *ptr, size_t nbytes)
{
    if (!ptr)
        return;
    size_t size;
    int c = class_of(nbytes ? nbytes : 1, &size);
    pthread_mutex_lock(&p->mu);
    p->uses++;
    p->st.live -= size;
    freelist *f = &p->cls[c];
    uint64_t lim = p->cfg.limit;
    bool keep =
        p->st.cached + size <= p->cfg.cap && (!lim || p->st.live + p->st.cached + size <= lim);
    if (keep && f->n == f->cap) {
        uint32_t ncap = f->cap ? f->cap * 2 : 16;
        void **v = realloc(f->v, ncap * sizeof *v);
        if (v) {
            f->v = v;
            f->cap = ncap;
        } else {
            keep = false;
        }
    }
    if (keep) {
        f->v[f->n++] = ptr;
        f->size = size;
        if (!p->st.cached && p->idle_wait)
            pthread_cond_signal(&p->cv);
        p->st.cached += size;
        pthread_mutex_unlock(&p->mu);
        return;
    }
    p->st.raw_frees++;
    pthread_mutex_unlock(&p->mu);
    p->raw.free(p->raw.ctx, ptr, size);
}

void tdd_pool_release(tdd_pool *p, void *ptr, size_t nbytes)
{
    if (!ptr)
        return;
    size_t size;
    class_of(nbytes ? nbytes : 1, &size);
    pthread_mutex_lock(&p->mu);
    p->uses++;
    p->st.live -= size;
    p->st.raw_frees++;
    pthread_mutex_unlock(&p->mu);
    p->raw.free(p->raw.ctx, ptr, size);
}

uint64_t tdd_pool_trim(tdd_pool *p, uint64_t keep)
{
    pthread_mutex_lock(&p->mu);
    uint64_t released = trim_locked(p, keep);
    pthread_mutex_unlock(&p->mu);
    return released;
}

void tdd_pool_trim_all(uint32_t delay_ms)
{
    uint64_t at = now_ns() + (uint64_t)delay_ms * 1000000u;
    pthread_mutex_lock(&pools_mu);
    for (tdd_pool *p = pools; p; p = p->next) {
        pthread_mutex_lock(&p->mu);
        if (p->has_thread) {
            p->trim_at = at;
            if (!p->trim_now) { /* one wake-up per trim, not one per call */
                p->trim_now = true;
                pthread_cond_signal(&p->cv);
            }
            pthread_mutex_unlock(&p->mu);
            continue;
        }
        trim_locked(p, 0);
        pthread_mutex_unlock(&p->mu);
        if (p->raw.trimmed)
            p->raw.trimmed(p->raw.ctx);
    }
    pthread_mutex_unlock(&pools_mu);
}

uint64_t tdd_pool_trim_idle(tdd_pool *p)
{
    /* Owners without the thread call this periodically: release when no alloc or free
     * happened since the previous call at least trim_after_ms ago. */
    static const uint64_t ms = 1000000ull;
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    uint64_t t = (uint64_t)now.tv_sec * 1000ull + (uint64_t)now.tv_nsec / ms;
    uint64_t released = 0;
    pthread_mutex_lock(&p->mu);
    if (p->uses != p->idle_uses) {
        p->idle_uses = p->uses;
        p->idle_since = t;
    } else if (p->cfg.trim_after_ms && t - p->idle_since >= p->cfg.trim_after_ms && p->st.cached) {
        released = trim_locked(p, 0);
        if (released)
            p->st.idle_trims++;
    }
    pthread_mutex_unlock(&p->mu);
    if (released && p->raw.trimmed)
        p->raw.trimmed(p->raw.ctx);
    return released;
}

void tdd_pool_get_stats(tdd_pool *p, tdd_pool_stats *s)
{
    pthread_mutex_lock(&p->mu);
    *s = p->st;
    pthread_mutex_unlock(&p->mu);
}
