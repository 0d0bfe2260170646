/* exec.c -- one worker thread per lane (a device has --device-lanes of them: device.c).
 * Each session with work on a lane has a queue of its own there; the worker serves the
 * queues round-robin, one task (or one piece of a chunked kernel) at a time, so work
 * keeps its order within a session while one session's long run of work no longer
 * holds up the others. Completions go back to the loop thread through one wake-up pipe. */
#include "exec.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "log.h"

struct tdd_queue {
    tdd_lane *lane;
    tdd_task *head, *tail;        /* under lane->mu; head stays put while it runs */
    tdd_queue *prev_on, *next_on; /* the lane's turn order of queues with work, under mu */
    bool on;                      /* in that order */
    uint64_t submitted;           /* loop thread only */
    /* Written by the worker under mu; read without it by the loop's checks (idle,
     * reached), which run per small op and used to contend for mu with the worker
     * (futex wake-ups on both sides). */
    _Atomic uint64_t completed;
    /* loop thread only: the session it serves while bound, its hash chain, the lane's
     * list of every queue (freed with the lane) and of unbound ones */
    uint64_t session;
    tdd_queue *hnext, *next_all, *next_free;
};

struct tdd_lane {
    pthread_mutex_t mu;
    pthread_cond_t cv; /* work arrived / stop */
    tdd_queue *first_on, *last_on;
    _Atomic int n_on; /* queues with work (read by tdd_task_contended without mu) */
    int stop;
    pthread_t thread;
    /* Whether other work may run beside the worker's (host-memory kernels): then a
     * queue is idle when its own tasks have run, else when the whole lane's have. */
    bool overlap;
    int nice;                   /* the worker's nice value (tdd_lane_new) */
    bool started;               /* the worker runs at it (under mu) */
    uint64_t submitted;         /* loop thread only */
    _Atomic uint64_t completed; /* tasks, every queue */
    /* loop thread only: session id -> its queue */
    tdd_queue **buckets;
    size_t nbuckets, nbound, sweep_at;
    tdd_queue *all, *unbound;
    /* every session's queue when a new one could not be allocated: one FIFO keeps
     * each session's order, only not the turns */
    tdd_queue *spare;
    char name[24];
};

/* A worker whose lane has work but no ready task, and tdd_queue_wait, sleep until some
 * task completes anywhere (or a lane gets new work): the epoch counts those events. */
static _Atomic uint64_t dep_epoch;
static _Atomic int dep_waiters;
static pthread_mutex_t dep_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t dep_cv = PTHREAD_COND_INITIALIZER;

static void dep_bump(void)
{
    atomic_fetch_add(&dep_epoch, 1);
    if (atomic_load(&dep_waiters) > 0) {
        pthread_mutex_lock(&dep_mu);
        pthread_cond_broadcast(&dep_cv);
        pthread_mutex_unlock(&dep_mu);
    }
}

/* Sleeps until the epoch has moved past seen. */
static void dep_wait(uint64_t seen)
{
    atomic_fetch_add(&dep_waiters, 1);
    pthread_mutex_lock(&dep_mu);
    while (atomic_load(&dep_epoch) == seen)
        pthread_cond_wait(&dep_cv, &dep_mu);
    pthread_mutex_unlock(&dep_mu);
    atomic_fetch_sub(&dep_waiters, 1);
}

/* Completions wake the loop through a pipe watched by a uv_poll, not a
 * uv_async: libuv 1.44's loop busy-waits (pause, then sched_yield) on an
 * async whose sender is between its two atomic steps, and on 2 cores a
 * worker preempted there made that spin ~6% of the daemon's time in an MLP
 * training step. A pipe write has no such window. */
static uv_poll_t done_poll;
static int wake_fd[2] = {-1, -1}; /* read end (loop), write end (workers) */
static pthread_mutex_t done_mu = PTHREAD_MUTEX_INITIALIZER;
static tdd_task *done_head, *done_tail;
static uint64_t pending;
static int draining;
static bool wake_owed; /* under done_mu: the list holds completions no wake-up announced */
/* Completions a worker posts without waking the loop in a row, at most (their replies and
 * freed memory wait for the run's end). */
#define DEFER_MAX 32

/* The loop may end once nothing is pending: the completion handle stops
 * holding it open. */
static void maybe_release_loop(void)
{
    if (draining && pending == 0 && uv_has_ref((uv_handle_t *)&done_poll))
        uv_unref((uv_handle_t *)&done_poll);
}

void tdd_exec_drain(void)
{
    draining = 1;
    maybe_release_loop();
}

static void drain_done(void)
{
    /* Empty the pipe before taking the list: a completion posted after the
     * take finds the list empty and writes again. */
    char buf[64];
    while (read(wake_fd[0], buf, sizeof buf) > 0)
        ;
    pthread_mutex_lock(&done_mu);
    tdd_task *t = done_head;
    done_head = done_tail = NULL;
    wake_owed = false;
    pthread_mutex_unlock(&done_mu);
    while (t) {
        tdd_task *next = t->next;
        pending--;
        t->done(t);
        t = next;
    }
    maybe_release_loop();
}

static void on_wake(uv_poll_t *p, int status, int events)
{
    (void)p;
    (void)status;
    (void)events;
    drain_done();
}

static int set_nonblock(int fd)
{
    int fl = fcntl(fd, F_GETFL);
    return fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0 || fcntl(fd, F_SETFD, FD_CLOEXEC) < 0
               ? -1
               : 0;
}

int tdd_exec_init(uv_loop_t *loop)
{
    if (pipe(wake_fd) || set_nonblock(wake_fd[0]) || set_nonblock(wake_fd[1]))
        return -1;
    int rc = uv_poll_init(loop, &done_poll, wake_fd[0]);
    return rc ? rc : uv_poll_start(&done_poll, UV_READABLE, on_wake);
}

static void poll_closed(uv_handle_t *h)
{
    (void)h;
    close(wake_fd[0]);
    close(wake_fd[1]);
    wake_fd[0] = wake_fd[1] = -1;
}

void tdd_exec_close(void)
{
    drain_done();
    uv_close((uv_handle_t *)&done_poll, poll_closed);
}

/* Only the completion that finds the list empty wakes the loop: the loop takes
 * the whole list at once, so a completion added behind others is drained with
 * them, after the wake-up their first one sent (one write per batch, not one
 * system call per task). */
static void wake_loop(void)
{
    /* A full pipe (EAGAIN) already holds a wake-up; nothing else can fail here. */
    ssize_t n;
    do
        n = write(wake_fd[1], "", 1);
    while (n < 0 && errno == EINTR);
}

/* defer: the worker runs a quick task of the same queue next (tdd_task.quick) and
 * wakes the loop after it (flush_done) instead of now: the list's first completion then
 * owes the wake-up. */
static void post_done(tdd_task *t, bool defer)
{
    t->next = NULL;
    pthread_mutex_lock(&done_mu);
    bool first = !done_head;
    if (done_tail)
        done_tail->next = t;
    else
        done_head = t;
    done_tail = t;
    bool wake = false;
    if (defer)
        wake_owed |= first;
    else if (first || wake_owed)
        wake = true, wake_owed = false;
    pthread_mutex_unlock(&done_mu);
    if (wake)
        wake_loop();
}

/* Sends a wake-up that a deferred completion owes. */
static void flush_done(void)
{
    pthread_mutex_lock(&done_mu);
    bool wake = wake_owed;
    wake_owed = false;
    pthread_mutex_unlock(&done_mu);
    if (wake)
        wake_loop();
}

/* ---------------------------------------------------------------- the worker */

static void turn_unlink(tdd_lane *l, tdd_queue *q)
{
    if (q->prev_on)
        q->prev_on->next_on = q->next_on;
    else
        l->first_on = q->next_on;
    if (q->next_on)
        q->next_on->prev_on = q->prev_on;
    else
        l->last_on = q->prev_on;
    q->prev_on = q->next_on = NULL;
}

static void turn_append(tdd_lane *l, tdd_queue *q)
{
    q->prev_on = l->last_on;
    q->next_on = NULL;
    if (l->last_on)
        l->last_on->next_on = q;
    else
        l->first_on = q;
    l->last_on = q;
}

/* The first queue in turn order whose next task can start now. Under mu. */
static tdd_queue *pick(tdd_lane *l)
{
    for (tdd_queue *q = l->first_on; q; q = q->next_on)
        if (!q->head->ready || q->head->ready(q->head))
            return q;
    return NULL;
}

/* Lowers the calling thread's priority by `by` nice steps below its own (the daemon may
 * have been started niced itself: the workers stay `by` below the loop thread), at most to
 * 19. Lowering one's own priority needs no privilege; `by` is checked by the options. */
static int lower_own_priority(int by)
{
    id_t tid = (id_t)syscall(SYS_gettid);
    errno = 0;
    int base = getpriority(PRIO_PROCESS, tid);
    if (base == -1 && errno)
        return -1;
    int want = base + by > 19 ? 19 : base + by;
    return want == base ? 0 : setpriority(PRIO_PROCESS, tid, want);
}

static void *worker(void *arg)
{
    tdd_lane *l = arg;
    if (l->nice && lower_own_priority(l->nice) != 0)
        tdd_warn("lane %s: setpriority: %s", l->name, strerror(errno));
    pthread_mutex_lock(&l->mu);
    l->started = true; /* tdd_lane_new returns once the priority is set */
    pthread_cond_broadcast(&l->cv);
    int deferred = 0; /* completions posted since this worker last woke the loop */
    for (;;) {
        uint64_t seen = atomic_load(&dep_epoch); /* before looking: a later event wakes us */
        tdd_queue *q = pick(l);
        if (deferred && (!q || !q->head->quick)) { /* a deferred wake-up is due now */
            pthread_mutex_unlock(&l->mu);
            flush_done();
            deferred = 0;
            pthread_mutex_lock(&l->mu);
            continue;
        }
        if (!q) {
            if (!l->first_on) {
                if (l->stop)
                    break;
                pthread_cond_wait(&l->cv, &l->mu);
            } else { /* every queue waits on another lane's work */
                pthread_mutex_unlock(&l->mu);
                dep_wait(seen);
                pthread_mutex_lock(&l->mu);
            }
            continue;
        }
        tdd_task *t = q->head;
        pthread_mutex_unlock(&l->mu);
        t->more = false;
        t->run(t);
        pthread_mutex_lock(&l->mu);
        /* its turn is over: to the back of the order, or out of it when empty */
        turn_unlink(l, q);
        if (t->more) {
            turn_append(l, q);
            continue;
        }
        q->head = t->next;
        if (!q->head) {
            q->tail = NULL;
            q->on = false;
            atomic_fetch_sub(&l->n_on, 1);
        } else {
            turn_append(l, q);
        }
        /* the lane's count first: who sees the queue's sees it (tdd_queue_idle) */
        atomic_fetch_add_explicit(&l->completed, 1, memory_order_release);
        atomic_store_explicit(&q->completed, t->seq, memory_order_release);
        /* Its wake-up waits for the next task's when that one is quick, of the same
         * queue, the lane's only one, and can start now: the loop wakes once per run. */
        tdd_task *nx = q->head;
        bool defer = t->quick && nx && nx->quick && l->first_on == q && !q->next_on &&
                     deferred < DEFER_MAX && (!nx->ready || nx->ready(nx));
        /* After completed is published (done() may submit again), and outside mu: the
         * wake-up write must not hold up the loop's submits. */
        pthread_mutex_unlock(&l->mu);
        dep_bump();
        post_done(t, defer);
        deferred = defer ? deferred + 1 : 0;
        pthread_mutex_lock(&l->mu);
    }
    pthread_mutex_unlock(&l->mu);
    return NULL;
}

bool tdd_task_contended(const tdd_task *t)
{
    return t->q && atomic_load_explicit(&t->q->lane->n_on, memory_order_relaxed) > 1;
}

/* ---------------------------------------------------------------- lanes */

static tdd_queue *queue_new(tdd_lane *l)
{
    tdd_queue *q = calloc(1, sizeof *q);
    if (!q)
        return NULL;
    q->lane = l;
    q->next_all = l->all;
    l->all = q;
    return q;
}

tdd_lane *tdd_lane_new(const char *name, bool overlap, int nice)
{
    tdd_lane *l = calloc(1, sizeof *l);
    if (!l)
        return NULL;
    l->overlap = overlap;
    l->nice = nice;
    l->nbuckets = 64;
    l->sweep_at = 64;
    l->buckets = calloc(l->nbuckets, sizeof *l->buckets);
    l->spare = l->buckets ? queue_new(l) : NULL;
    if (!l->spare) {
        free(l->buckets);
        free(l);
        return NULL;
    }
    pthread_mutex_init(&l->mu, NULL);
    pthread_cond_init(&l->cv, NULL);
    strncpy(l->name, name, sizeof l->name - 1);
    if (pthread_create(&l->thread, NULL, worker, l)) {
        pthread_mutex_destroy(&l->mu);
        pthread_cond_destroy(&l->cv);
        free(l->spare);
        free(l->buckets);
        free(l);
        return NULL;
    }
    pthread_mutex_lock(&l->mu);
    while (!l->started)
        pthread_cond_wait(&l->cv, &l->mu);
    pthread_mutex_unlock(&l->mu);
    return l;
}

void tdd_lane_free(tdd_lane *l)
{
    if (!l)
        return;
    pthread_mutex_lock(&l->mu);
    l->stop = 1;
    pthread_cond_signal(&l->cv);
    pthread_mutex_unlock(&l->mu);
    pthread_join(l->thread, NULL);
    pthread_mutex_destroy(&l->mu);
    pthread_cond_destroy(&l->cv);
    for (tdd_queue *q = l->all, *next; q; q = next) {
        next = q->next_all;
        free(q);
    }
    free(l->buckets);
    free(l);
}

static size_t bucket(const tdd_lane *l, uint64_t session_id)
{
    return (size_t)(session_id * 0x9E3779B97F4A7C15ull >> 32) & (l->nbuckets - 1);
}

static bool queue_drained(const tdd_queue *q)
{
    return atomic_load_explicit(&q->completed, memory_order_acquire) == q->submitted;
}

/* Unbinds the queues whose work has all run: any session may take them. */
static void sweep(tdd_lane *l)
{
    for (size_t b = 0; b < l->nbuckets; b++)
        for (tdd_queue **pq = &l->buckets[b]; *pq;) {
            tdd_queue *q = *pq;
            if (!queue_drained(q)) {
                pq = &q->hnext;
                continue;
            }
            *pq = q->hnext;
            q->next_free = l->unbound;
            l->unbound = q;
            l->nbound--;
        }
    l->sweep_at = l->nbound * 2 > 64 ? l->nbound * 2 : 64;
}

static void grow(tdd_lane *l)
{
    size_t n = l->nbuckets * 2;
    tdd_queue **nb = calloc(n, sizeof *nb);
    if (!nb)
        return; /* longer chains */
    tdd_queue **old = l->buckets;
    size_t oldn = l->nbuckets;
    l->buckets = nb;
    l->nbuckets = n;
    for (size_t b = 0; b < oldn; b++)
        for (tdd_queue *q = old[b], *next; q; q = next) {
            next = q->hnext;
            size_t k = bucket(l, q->session);
            q->hnext = nb[k];
            nb[k] = q;
        }
    free(old);
}

tdd_queue *tdd_lane_queue(tdd_lane *l, uint64_t session_id)
{
    for (tdd_queue *q = l->buckets[bucket(l, session_id)]; q; q = q->hnext)
        if (q->session == session_id)
            return q;
    if (l->nbound >= l->sweep_at)
        sweep(l);
    tdd_queue *q = l->unbound;
    if (q)
        l->unbound = q->next_free;
    else if (!(q = queue_new(l)))
        return l->spare;
    if (l->nbound >= l->nbuckets)
        grow(l);
    q->session = session_id;
    size_t k = bucket(l, session_id);
    q->hnext = l->buckets[k];
    l->buckets[k] = q;
    l->nbound++;
    return q;
}

uint64_t tdd_lane_depth(const tdd_lane *l)
{
    uint64_t n = 0;
    for (const tdd_queue *q = l->all; q; q = q->next_all)
        n += tdd_queue_depth(q);
    return n;
}

/* ---------------------------------------------------------------- queues */

uint64_t tdd_queue_submit(tdd_queue *q, tdd_task *t)
{
    tdd_lane *l = q->lane;
    t->next = NULL;
    t->q = q;
    pending++;
    l->submitted++;
    pthread_mutex_lock(&l->mu);
    t->seq = ++q->submitted;
    if (q->tail)
        q->tail->next = t;
    else
        q->head = t;
    q->tail = t;
    if (!q->on) {
        q->on = true;
        atomic_fetch_add(&l->n_on, 1);
        turn_append(l, q);
    }
    pthread_cond_signal(&l->cv);
    pthread_mutex_unlock(&l->mu);
    dep_bump(); /* a worker waiting on other lanes may find this task ready */
    return t->seq;
}

uint64_t tdd_queue_next_seq(const tdd_queue *q)
{
    return q->submitted + 1; /* submitted is only written on the loop thread */
}

void tdd_queue_wait(tdd_queue *q, uint64_t seq)
{
    for (;;) {
        uint64_t seen = atomic_load(&dep_epoch);
        if (tdd_queue_reached(q, seq))
            return;
        dep_wait(seen);
    }
}

bool tdd_queue_idle(tdd_queue *q)
{
    const tdd_lane *l = q->lane;
    if (!l->overlap)
        return atomic_load_explicit(&l->completed, memory_order_acquire) == l->submitted;
    return atomic_load_explicit(&q->completed, memory_order_acquire) == q->submitted;
}

bool tdd_queue_reached(tdd_queue *q, uint64_t seq)
{
    return atomic_load_explicit(&q->completed, memory_order_acquire) >= seq;
}

uint64_t tdd_queue_depth(const tdd_queue *q)
{
    uint64_t done = atomic_load_explicit(&q->completed, memory_order_acquire);
    return q->submitted > done ? q->submitted - done : 0;
}

uint64_t tdd_exec_pending(void)
{
    return pending;
}

/* ---------------------------------------------------------------- detached tasks */

typedef struct {
    tdd_task *t;
    int nice;
} detached;

static void *detached_main(void *arg)
{
    detached d = *(detached *)arg;
    free(arg);
    if (d.nice && lower_own_priority(d.nice) != 0)
        tdd_debug("detached task: setpriority: %s", strerror(errno));
    d.t->more = false;
    d.t->run(d.t);
    dep_bump(); /* a queue may wait on what it did (tdd_queue_wait) */
    post_done(d.t, false);
    return NULL;
}

int tdd_exec_detached(tdd_task *t, int nice)
{
    detached *d = malloc(sizeof *d);
    if (!d)
        return -1;
    d->t = t;
    d->nice = nice;
    t->next = NULL;
    t->q = NULL;
    pthread_attr_t attr;
    pthread_t th;
    int e = pthread_attr_init(&attr);
    if (!e) {
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        pending++; /* before the thread can post its completion */
        e = pthread_create(&th, &attr, detached_main, d);
        if (e)
            pending--;
        pthread_attr_destroy(&attr);
    }
    if (e) {
        free(d);
        return -1;
    }
    return 0;
}
