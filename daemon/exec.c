/* exec.c -- one worker thread per device; tasks run in submission order and
 * their completions are handed back to the loop thread through one uv_async. */
#include "exec.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"

struct tdd_queue {
    pthread_mutex_t mu;
    pthread_cond_t cv;      /* work arrived / stop */
    pthread_cond_t done_cv; /* completed advanced (for cross-queue waits) */
    tdd_task *head, *tail;
    uint64_t submitted, completed;
    int waiters;
    int stop;
    pthread_t thread;
    char name[24];
};

static uv_async_t done_async;
static pthread_mutex_t done_mu = PTHREAD_MUTEX_INITIALIZER;
static tdd_task *done_head, *done_tail;
static uint64_t pending;
static int draining;

/* The loop may end once nothing is pending: the completion handle stops
 * holding it open. */
static void maybe_release_loop(void)
{
    if (draining && pending == 0 && uv_has_ref((uv_handle_t *)&done_async))
        uv_unref((uv_handle_t *)&done_async);
}

void tdd_exec_drain(void)
{
    draining = 1;
    maybe_release_loop();
}

static void drain_done(uv_async_t *a)
{
    (void)a;
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

int tdd_exec_init(uv_loop_t *loop)
{
    return uv_async_init(loop, &done_async, drain_done);
}

void tdd_exec_close(void)
{
    drain_done(&done_async);
    uv_close((uv_handle_t *)&done_async, NULL);
}

static void post_done(tdd_task *t)
{
    t->next = NULL;
    pthread_mutex_lock(&done_mu);
    if (done_tail)
        done_tail->next = t;
    else
        done_head = t;
    done_tail = t;
    pthread_mutex_unlock(&done_mu);
    uv_async_send(&done_async); /* coalesces: one wake-up for many completions */
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
        q->completed = t->seq;
        if (q->waiters)
            pthread_cond_broadcast(&q->done_cv);
        post_done(t); /* after completed is published: done() may submit again */
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
    while (q->completed < seq)
        pthread_cond_wait(&q->done_cv, &q->mu);
    q->waiters--;
    pthread_mutex_unlock(&q->mu);
}

bool tdd_queue_idle(tdd_queue *q)
{
    pthread_mutex_lock(&q->mu);
    bool idle = q->completed == q->submitted;
    pthread_mutex_unlock(&q->mu);
    return idle;
}

bool tdd_queue_reached(tdd_queue *q, uint64_t seq)
{
    pthread_mutex_lock(&q->mu);
    bool done = q->completed >= seq;
    pthread_mutex_unlock(&q->mu);
    return done;
}

uint64_t tdd_exec_pending(void)
{
    return pending;
}
