/* exec.h -- worker threads: a device's lanes, each serving its sessions' task queues
 * round-robin; completions to the loop. */
#ifndef TDD_EXEC_H
#define TDD_EXEC_H

#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

typedef struct tdd_task tdd_task;
typedef struct tdd_queue tdd_queue;
typedef struct tdd_lane tdd_lane;

struct tdd_task {
    tdd_task *next;
    /* On the lane's worker. A run that sets more (a chunked kernel with pieces left) is
     * called again later, other sessions' tasks on the lane running in between. */
    void (*run)(tdd_task *t);
    void (*done)(tdd_task *t); /* then on the loop thread */
    /* Optional: whether run would start now without waiting on other queues (its inputs'
     * producers have run). A lane runs only ready tasks, so no worker blocks on another
     * while a ready task waits behind it. NULL: always ready. Worker thread. */
    bool (*ready)(tdd_task *t);
    tdd_queue *q;
    uint64_t seq; /* position in q, from 1 */
    bool more;
    /* Set by the submitter: run neither blocks nor needs the loop thread (a host kernel
     * whose inputs are ready when ready says so). The lane's worker may then post the
     * completion before it without waking the loop, when it is the next task of the only
     * queue on the lane: one wake-up for a session's run of kernels, not one per kernel. */
    bool quick;
};

/* Starts the completion path on loop. */
int tdd_exec_init(uv_loop_t *loop);
/* Shutting down: let the loop end once every queued task has completed. */
void tdd_exec_drain(void);
/* Closes the completion handle (after every lane is freed). */
void tdd_exec_close(void);

/* A lane: one worker thread (overlap: work may run beside it, see tdd_queue_idle). Each session
 * that has work on it has a queue of its own; the worker takes one task (or one piece of a chunked
 * task) from each ready queue in turn, so a session's long run of work holds up another's by at
 * most one piece. The worker (and the threads it starts, which inherit it) runs at nice value
 * nice, above the caller's: a busy machine's cores go to the loop thread's small requests first. */
tdd_lane *tdd_lane_new(const char *name, bool overlap, int nice);
/* Finishes queued work, joins the worker, frees every queue. */
void tdd_lane_free(tdd_lane *l);
/* The queue that orders session_id's work on l. Loop thread. A queue whose work has all
 * run may later serve another session: its positions only grow, so a (queue, seq) a
 * value remembers stays reached. */
tdd_queue *tdd_lane_queue(tdd_lane *l, uint64_t session_id);
/* Tasks submitted to l's queues and not yet run. Loop thread. */
uint64_t tdd_lane_depth(const tdd_lane *l);

/* Appends t; returns its seq. Loop thread. */
uint64_t tdd_queue_submit(tdd_queue *q, tdd_task *t);
/* The seq the next submitted task will get. */
uint64_t tdd_queue_next_seq(const tdd_queue *q);
/* Blocks (on a worker) until q has run every task up to seq. A task may
 * wait only on tasks submitted before it, so waits can never form a cycle. */
void tdd_queue_wait(tdd_queue *q, uint64_t seq);
/* Every task submitted to q has run; on a lane made without overlap (a staged device,
 * whose work must not run beside its worker's), every task submitted to the lane. */
bool tdd_queue_idle(tdd_queue *q);
/* q has run every task up to seq. */
bool tdd_queue_reached(tdd_queue *q, uint64_t seq);
/* Tasks submitted to q and not yet run. Loop thread. */
uint64_t tdd_queue_depth(const tdd_queue *q);
/* Tasks submitted and not yet completed, all queues (detached ones too). */
uint64_t tdd_exec_pending(void);
/* Runs t->run on a thread of its own, at nice value nice, on no lane: work that waits on
 * something outside the daemon (a process group's peers) and so must hold nothing another
 * session needs. t->done then runs on the loop thread, as a lane task's does; t->q is NULL
 * and t->ready is not called. 0, or -1 when no thread could be started (t not taken).
 * Loop thread. */
int tdd_exec_detached(tdd_task *t, int nice);
/* Other sessions' tasks are waiting on the lane running t (a chunked kernel's cue to
 * hand the worker over between pieces). Worker thread. */
bool tdd_task_contended(const tdd_task *t);

#endif
