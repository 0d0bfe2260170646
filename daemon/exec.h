/* exec.h -- worker threads: FIFO task queues (a device's lanes), completions to the loop. */
#ifndef TDD_EXEC_H
#define TDD_EXEC_H

#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

typedef struct tdd_task tdd_task;
typedef struct tdd_queue tdd_queue;

struct tdd_task {
    tdd_task *next;
    void (*run)(tdd_task *t);  /* on the device's worker thread */
    void (*done)(tdd_task *t); /* then on the loop thread */
    tdd_queue *q;
    uint64_t seq; /* position in q, from 1 */
};

/* Starts the completion path on loop. */
int tdd_exec_init(uv_loop_t *loop);
/* Shutting down: let the loop end once every queued task has completed. */
void tdd_exec_drain(void);
/* Closes the completion handle (after every queue is freed). */
void tdd_exec_close(void);

tdd_queue *tdd_queue_new(const char *name);
/* Finishes queued work, joins the worker. */
void tdd_queue_free(tdd_queue *q);
/* Appends t; returns its seq. Loop thread. */
uint64_t tdd_queue_submit(tdd_queue *q, tdd_task *t);
/* The seq the next submitted task will get. */
uint64_t tdd_queue_next_seq(const tdd_queue *q);
/* Blocks (on a worker) until q has run every task up to seq. A task may
 * wait only on tasks submitted before it, so waits can never form a cycle. */
void tdd_queue_wait(tdd_queue *q, uint64_t seq);
/* Every task submitted to q has run. */
bool tdd_queue_idle(tdd_queue *q);
/* q has run every task up to seq. */
bool tdd_queue_reached(tdd_queue *q, uint64_t seq);
/* Tasks submitted to q and not yet run. Loop thread. */
uint64_t tdd_queue_depth(const tdd_queue *q);
/* Tasks submitted and not yet completed, all queues. */
uint64_t tdd_exec_pending(void);

#endif
