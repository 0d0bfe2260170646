/* cpu_threads.c -- the cpu backend's parallel loops run on threads it owns.
 *
 * Each device worker that runs a parallel kernel gets a team of its own (created on its
 * first parallel call, grown when a call asks for more threads, stopped when the worker
 * exits). After a job a team thread spins for a few microseconds (kernels of one op, or
 * ops queued back to back, follow each other that closely) and then sleeps on a futex:
 * between requests the daemon leaves the cores to its clients. libgomp's threads spun
 * for ~300k iterations after every region (milliseconds of a core per op, measured:
 * bench/archive/memory.md), and its spin count is read from the environment before main runs,
 * so it cannot be set from here. */
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "cpu.h"

/* Iterations of a pause before a waiting thread sleeps: ~5-40 us depending on the
 * core's pause latency. */
#define CPU_SPIN 1000

typedef struct cpu_team {
    _Atomic uint32_t gen;     /* bumped per job; workers futex-wait on it */
    _Atomic uint32_t pending; /* workers still in the job; the caller futex-waits on it */
    _Atomic uint32_t sleepers;
    _Atomic bool caller_sleeps;
    _Atomic bool stop;
    cpu_par_fn fn;
    void *ctx;
    int n;
    int nworkers;
    pthread_t th[];
} cpu_team;

typedef struct {
    cpu_team *team;
    int index; /* 1..nworkers: its t in a job */
} worker_arg;

static _Thread_local cpu_team *my_team;
static _Thread_local bool in_job;
static pthread_key_t team_key;
static pthread_once_t key_once = PTHREAD_ONCE_INIT;

static inline void relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

static void futex_wait(_Atomic uint32_t *w, uint32_t v)
{
    syscall(SYS_futex, (uint32_t *)w, FUTEX_WAIT_PRIVATE, v, NULL, NULL, 0);
}

static void futex_wake(_Atomic uint32_t *w, int n)
{
    syscall(SYS_futex, (uint32_t *)w, FUTEX_WAKE_PRIVATE, n, NULL, NULL, 0);
}

static void *worker(void *arg)
{
    worker_arg wa = *(worker_arg *)arg;
    free(arg);
    cpu_team *tm = wa.team;
    in_job = true;     /* a kernel's nested parallel call runs inline */
    uint32_t seen = 0; /* a new team has run no job: the first may be posted before we start */
    for (;;) {
        uint32_t g;
        for (int s = 0;
             (g = atomic_load_explicit(&tm->gen, memory_order_acquire)) == seen && s < CPU_SPIN;
             s++)
            relax();
        while (g == seen) {
            atomic_fetch_add(&tm->sleepers, 1); /* seq_cst, against the caller's gen bump */
            g = atomic_load(&tm->gen);
            if (g == seen)
                futex_wait(&tm->gen, seen);
            atomic_fetch_sub(&tm->sleepers, 1);
            g = atomic_load_explicit(&tm->gen, memory_order_acquire);
        }
        seen = g;
        if (atomic_load_explicit(&tm->stop, memory_order_acquire))
            return NULL;
        if (wa.index < tm->n)
            tm->fn(tm->ctx, wa.index, tm->n);
        if (atomic_fetch_sub(&tm->pending, 1) == 1 && atomic_load(&tm->caller_sleeps))
            futex_wake(&tm->pending, 1);
    }
}

static void team_stop(cpu_team *tm)
{
    if (!tm)
        return;
    atomic_store_explicit(&tm->stop, true, memory_order_release);
    atomic_fetch_add_explicit(&tm->gen, 1, memory_order_release);
    futex_wake(&tm->gen, INT_MAX);
    for (int i = 0; i < tm->nworkers; i++)
        pthread_join(tm->th[i], NULL);
    free(tm);
}

static void team_key_dtor(void *p)
{
    team_stop(p);
}

static void make_key(void)
{
    (void)pthread_key_create(&team_key, team_key_dtor);
}

/* A team of at least n - 1 workers for this thread; NULL when threads cannot start. */
static cpu_team *team_for(int n)
{
    if (my_team && my_team->nworkers >= n - 1)
        return my_team;
    pthread_once(&key_once, make_key);
    team_stop(my_team);
    my_team = NULL;
    (void)pthread_setspecific(team_key, NULL);
    cpu_team *tm = calloc(1, sizeof *tm + (size_t)(n - 1) * sizeof(pthread_t));
    if (!tm)
        return NULL;
    for (int i = 0; i < n - 1; i++) {
        worker_arg *wa = malloc(sizeof *wa);
        if (wa) {
            wa->team = tm;
            wa->index = i + 1;
        }
        if (!wa || pthread_create(&tm->th[i], NULL, worker, wa)) {
            free(wa);
            team_stop(tm); /* joins the ones started (nworkers of them) */
            return NULL;
        }
        tm->nworkers = i + 1;
    }
    my_team = tm;
    (void)pthread_setspecific(team_key, tm);
    return tm;
}

void cpu_parallel(int n, cpu_par_fn fn, void *ctx)
{
    cpu_team *tm = n > 1 && !in_job ? team_for(n) : NULL;
    if (!tm) { /* one thread (or nested, or no threads to be had): same partition, in turn */
        for (int t = 0; t < (n > 1 ? n : 1); t++)
            fn(ctx, t, n > 1 ? n : 1);
        return;
    }
    tm->fn = fn;
    tm->ctx = ctx;
    tm->n = n;
    atomic_store_explicit(&tm->pending, (uint32_t)tm->nworkers, memory_order_relaxed);
    atomic_fetch_add(&tm->gen, 1); /* seq_cst: a worker going to sleep sees it, or is seen */
    if (atomic_load(&tm->sleepers))
        futex_wake(&tm->gen, INT_MAX);
    in_job = true;
    fn(ctx, 0, n);
    in_job = false;
    uint32_t left;
    for (int s = 0;
         (left = atomic_load_explicit(&tm->pending, memory_order_acquire)) && s < CPU_SPIN; s++)
        relax();
    while (left) {
        atomic_store(&tm->caller_sleeps, true);
        left = atomic_load(&tm->pending);
        if (left)
            futex_wait(&tm->pending, left);
        atomic_store(&tm->caller_sleeps, false);
        left = atomic_load_explicit(&tm->pending, memory_order_acquire);
    }
}

/* [lo, hi) of n items: part t of nt, sizes differing by at most one. */
void cpu_split(int64_t n, int t, int nt, int64_t *lo, int64_t *hi)
{
    int64_t per = n / nt, extra = n % nt;
    *lo = t * per + (t < extra ? t : extra);
    *hi = *lo + per + (t < extra ? 1 : 0);
}
