/* test_exec.c -- a lane's scheduling (daemon/exec.h): each session's queue in its own
 * order, the queues served one task at a time in turn, a task not ready skipped until its
 * producer on another lane has run, a task asking to run again (a chunked kernel's next
 * piece) going to the back of the turn, a run of quick tasks announced to the loop once
 * but every completion delivered. The order tasks ran in is recorded and compared with the
 * one the rules give. */
#include <check.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>

#include "exec.h"

Suite *exec_suite(void);

static uv_loop_t loop;

#define MAXLOG 64

static char order[MAXLOG + 1];
static _Atomic int norder;
static _Atomic int gate_open;

typedef struct {
    tdd_task base;
    char tag;
    int again; /* more pieces to run */
    /* ready only once this queue has reached this seq (a producer on another lane) */
    tdd_queue *after_q;
    uint64_t after_seq;
    bool gate; /* holds the worker until gate_open */
    bool quick;
} rec_task;

static void rec_run(tdd_task *t)
{
    rec_task *r = (rec_task *)t;
    while (r->gate && !atomic_load(&gate_open)) {
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    int k = atomic_fetch_add(&norder, 1);
    if (k < MAXLOG)
        order[k] = r->tag;
    if (r->again > 0) {
        r->again--;
        t->more = true;
    }
}

static bool rec_ready(tdd_task *t)
{
    rec_task *r = (rec_task *)t;
    return !r->after_q || tdd_queue_reached(r->after_q, r->after_seq);
}

static char done_order[MAXLOG + 1];
static int ndone; /* loop thread */

static void rec_done(tdd_task *t)
{
    if (ndone < MAXLOG)
        done_order[ndone] = ((rec_task *)t)->tag;
    ndone++;
}

/* Runs the loop until n completions have been delivered (or about 10 s went by). */
static void deliver(int n)
{
    for (int i = 0; i < 10000 && ndone < n; i++) {
        uv_run(&loop, UV_RUN_NOWAIT);
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
}

static void reset(void)
{
    memset(order, 0, sizeof order);
    memset(done_order, 0, sizeof done_order);
    ndone = 0;
    atomic_store(&norder, 0);
    atomic_store(&gate_open, 0);
}

/* Submits r, set up as init says (before the worker may see it). */
static uint64_t put(tdd_queue *q, rec_task *r, rec_task init)
{
    *r = init;
    r->base.run = rec_run;
    r->base.done = rec_done;
    r->base.ready = rec_ready;
    r->base.quick = init.quick;
    return tdd_queue_submit(q, &r->base);
}

static void setup(void)
{
    ck_assert_int_eq(uv_loop_init(&loop), 0);
    ck_assert_int_eq(tdd_exec_init(&loop), 0);
    reset();
}

static void teardown(void)
{
    uv_run(&loop, UV_RUN_NOWAIT); /* the completions */
    tdd_exec_close();
    uv_run(&loop, UV_RUN_DEFAULT);
    ck_assert_int_eq(uv_loop_close(&loop), 0);
}

START_TEST(test_sessions_take_turns)
{
    tdd_lane *l = tdd_lane_new("t/0", true, 0);
    ck_assert_ptr_nonnull(l);
    tdd_queue *a = tdd_lane_queue(l, 1), *b = tdd_lane_queue(l, 2);
    ck_assert_ptr_ne(a, b);
    ck_assert_ptr_eq(tdd_lane_queue(l, 1), a);
    static rec_task t[8]; /* completions are drained after the test returns */
    put(a, &t[0], (rec_task){.tag = 'G', .gate = true});
    for (int i = 0; i < 4; i++)
        put(a, &t[1 + i], (rec_task){.tag = (char)('1' + i)});
    uint64_t last_b = 0;
    for (int i = 0; i < 3; i++)
        last_b = put(b, &t[5 + i], (rec_task){.tag = (char)('a' + i)});
    ck_assert(!tdd_queue_idle(a) && !tdd_queue_idle(b));
    atomic_store(&gate_open, 1);
    tdd_queue_wait(a, 5);
    tdd_queue_wait(b, last_b);
    /* A's gate ran first; then B and A in turn, one task each, and A's rest alone */
    ck_assert_str_eq(order, "Ga1b2c34");
    ck_assert(tdd_queue_idle(a) && tdd_queue_idle(b));
    ck_assert_uint_eq(tdd_lane_depth(l), 0);
    tdd_lane_free(l);
}
END_TEST

START_TEST(test_a_task_waits_for_its_producer_without_holding_the_lane)
{
    tdd_lane *l = tdd_lane_new("t/0", true, 0), *other = tdd_lane_new("u/0", true, 0);
    tdd_queue *a = tdd_lane_queue(l, 1), *b = tdd_lane_queue(l, 2);
    tdd_queue *p = tdd_lane_queue(other, 2); /* B's work on another device */
    static rec_task t[6];                    /* completions are drained after the test returns */
    uint64_t produced = put(p, &t[0], (rec_task){.tag = 'P', .gate = true});
    put(b, &t[1], (rec_task){.tag = 'x', .after_q = p, .after_seq = produced});
    put(a, &t[2], (rec_task){.tag = '1'});
    put(a, &t[3], (rec_task){.tag = '2'});
    uint64_t a_last = put(a, &t[4], (rec_task){.tag = '3'});
    tdd_queue_wait(a, a_last); /* A's tasks run while B's first waits for P */
    ck_assert_str_eq(order, "123");
    ck_assert(!tdd_queue_reached(b, 1));
    atomic_store(&gate_open, 1);
    tdd_queue_wait(b, 1);
    ck_assert_str_eq(order, "123Px");
    tdd_lane_free(l);
    tdd_lane_free(other);
}
END_TEST

START_TEST(test_a_task_run_in_pieces_takes_turns)
{
    tdd_lane *l = tdd_lane_new("t/0", true, 0);
    tdd_queue *a = tdd_lane_queue(l, 1), *b = tdd_lane_queue(l, 2);
    static rec_task t[5]; /* completions are drained after the test returns */
    put(a, &t[0], (rec_task){.tag = 'G', .gate = true});
    put(a, &t[1], (rec_task){.tag = 'P', .again = 3});
    put(b, &t[2], (rec_task){.tag = 'x'});
    put(b, &t[3], (rec_task){.tag = 'y'});
    uint64_t after = put(a, &t[4], (rec_task){.tag = 'z'});
    atomic_store(&gate_open, 1);
    tdd_queue_wait(a, after);
    tdd_queue_wait(b, 2);
    /* the pieces alternate with B's tasks; the task after them waits for the last */
    ck_assert_str_eq(order, "GxPyPPPz");
    tdd_lane_free(l);
}
END_TEST

START_TEST(test_idle_is_the_sessions_or_the_lanes)
{
    tdd_lane *shared = tdd_lane_new("t/0", true, 0), *staged = tdd_lane_new("s/0", false, 0);
    static rec_task t[2]; /* completions are drained after the test returns */
    tdd_queue *a = tdd_lane_queue(shared, 1), *b = tdd_lane_queue(shared, 2);
    tdd_queue *c = tdd_lane_queue(staged, 1), *d = tdd_lane_queue(staged, 2);
    put(a, &t[0], (rec_task){.tag = 'A', .gate = true});
    put(c, &t[1], (rec_task){.tag = 'C', .gate = true});
    ck_assert(!tdd_queue_idle(a) && tdd_queue_idle(b));  /* host memory: per session */
    ck_assert(!tdd_queue_idle(c) && !tdd_queue_idle(d)); /* staged: the whole lane */
    ck_assert_uint_eq(tdd_lane_depth(shared), 1);
    atomic_store(&gate_open, 1);
    tdd_queue_wait(a, 1);
    tdd_queue_wait(c, 1);
    ck_assert(tdd_queue_idle(d));
    tdd_lane_free(shared);
    tdd_lane_free(staged);
}
END_TEST

START_TEST(test_a_run_of_quick_tasks_delivers_every_completion)
{
    tdd_lane *l = tdd_lane_new("t/0", true, 0);
    tdd_queue *a = tdd_lane_queue(l, 1);
    static rec_task t[8]; /* completions are drained after the test returns */
    put(a, &t[0], (rec_task){.tag = 'G', .gate = true, .quick = true});
    for (int i = 1; i < 5; i++)
        put(a, &t[i], (rec_task){.tag = (char)('0' + i), .quick = true});
    atomic_store(&gate_open, 1);
    tdd_queue_wait(a, 5);
    deliver(5); /* the run's last completion wakes the loop for all five */
    ck_assert_int_eq(ndone, 5);
    ck_assert_str_eq(done_order, "G1234");
    /* quick ones before a task that may block: theirs are delivered while it blocks */
    atomic_store(&gate_open, 0);
    put(a, &t[5], (rec_task){.tag = 'a', .quick = true});
    put(a, &t[6], (rec_task){.tag = 'b', .quick = true});
    put(a, &t[7], (rec_task){.tag = 'S', .gate = true});
    deliver(7);
    ck_assert_int_eq(ndone, 7);
    ck_assert(!tdd_queue_reached(a, 8));
    atomic_store(&gate_open, 1);
    tdd_queue_wait(a, 8);
    deliver(8);
    ck_assert_str_eq(done_order, "G1234abS");
    tdd_lane_free(l);
}
END_TEST

Suite *exec_suite(void)
{
    Suite *s = suite_create("exec");
    TCase *tc = tcase_create("lanes");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_sessions_take_turns);
    tcase_add_test(tc, test_a_task_waits_for_its_producer_without_holding_the_lane);
    tcase_add_test(tc, test_a_task_run_in_pieces_takes_turns);
    tcase_add_test(tc, test_idle_is_the_sessions_or_the_lanes);
    tcase_add_test(tc, test_a_run_of_quick_tasks_delivers_every_completion);
    suite_add_tcase(s, tc);
    return s;
}
