/* exec.c -- one worker thread per queue (a device has one queue per lane: device.c);
 * tasks run in submission order and their completions are handed back to the loop
 * thread through one wake-up pipe. */
#include "exec.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "log.h"

struct tdd_queue {
    pthread_mutex_t mu;
    pthread_cond_t cv;      /* work arrived / stop */
    pthread_cond_t done_cv; /* completed advanced (for cross-queue waits) */
    tdd_task *head, *tail;
    uint64_t submitted; /* loop thread only */
    /* Written by the worker under mu; read without it by the loop's checks
     * (idle, reached), which run per small op and used to contend for mu
     * with the worker (futex wake-ups on both sides). */
    _Atomic uint64_t completed;
    int waiters;
    int stop;
    pthread_t thread;
    char name[24];
};

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
static void post_done(tdd_task *t)
{
    t->next = NULL;
    pthread_mutex_lock(&done_mu);
    bool first = !done_head;
    if (done_tail)
        done_tail->next = t;
    else
        done_head = t;
    done_tail = t;
    pthread_mutex_unlock(&done_mu);
    if (first) {
        /* A full pipe (EAGAIN) already holds a wake-up; nothing else can fail here. */
        ssize_t n;
        do
            n = write(wake_fd[1], "", 1);
        while (n < 0 && errno == EINTR);
    }
}

static void *worker(void *arg)
{
    tdd_queue *q = arg;
    pthread_mutex_lock(&q->mu);
    for (;;) {
        while (!q->head && !q->stop)
            pthread_cond_wait(&q->cv, &q->mu);
        if (!q->head)
            break;
        tdd_task *t = q->head;
        q->head = t->next;
        if (!q->head)
            q->tail = NULL;
        pthread_mutex_unlock(&q->mu);
        t->run(t);
        pthread_mutex_lock(&q->mu);
        atomic_store_explicit(&q->completed, t->seq, memory_order_release);
        if (q->waiters)
            pthread_cond_broadcast(&q->done_cv);
        /* After completed is published (done() may submit again), and
         * outside mu: the wake-up write must not hold up the loop's submits. */
        pthread_mutex_unlock(&q->mu);
        post_done(t);
        pthread_mutex_lock(&q->mu);
    }
    pthread_mutex_unlock(&q->mu);
    return NULL;
}

tdd_queue *tdd_queue_new(const char *name)
{
    tdd_queue *q = calloc(1, sizeof *q);
    if (!q)
        return NULL;
    pthread_mutex_init(&q->mu, NULL);
    pthread_cond_init(&q->cv, NULL);
    pthread_cond_init(&q->done_cv, NULL);
    strncpy(q->name, name, sizeof q->name - 1);
    if (pthread_create(&q->thread, NULL, worker, q)) {
        free(q);
        return NULL;
    }
    return q;
}

void tdd_queue_free(tdd_queue *q)
{
    if (!q)
        return;
    pthread_mutex_lock(&q->mu);
    q->stop = 1;
    pthread_cond_signal(&q->cv);
    pthread_mutex_unlock(&q->mu);
    pthread_join(q->thread, NULL);
    pthread_mutex_destroy(&q->mu);
    pthread_cond_destroy(&q->cv);
    pthread_cond_destroy(&q->done_cv);
    free(q);
}

uint64_t tdd_queue_submit(tdd_queue *q, tdd_task *t)
{
    t->next = NULL;
    t->q = q;
    pending++;
    pthread_mutex_lock(&q->mu);
    t->seq = ++q->submitted;
    if (q->tail)
        q->tail->next = t;
    else
        q->head = t;
    q->tail = t;
    pthread_cond_signal(&q->cv);
    pthread_mutex_unlock(&q->mu);
    return t->seq;
}

uint64_t tdd_queue_next_seq(const tdd_queue *q)
{
    return q->submitted + 1; /* submitted is only written on the loop thread */
}

void tdd_queue_wait(tdd_queue *q, uint64_t seq)
{
    pthread_mutex_lock(&q->mu);
    q->waiters++;
    while (atomic_load_explicit(&q->completed, memory_order_acquire) < seq)
        pthread_cond_wait(&q->done_cv, &q->mu);
    q->waiters--;
    pthread_mutex_unlock(&q->mu);
}

bool tdd_queue_idle(tdd_queue *q)
{
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
