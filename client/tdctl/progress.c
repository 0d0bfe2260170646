/* progress.c -- tdctl's progress bar: redrawn at most every 100 ms, only on a terminal. */
#include "progress.h"

#include <stdio.h>
#include <time.h>
#include <unistd.h>

/* No rate is shown before this much time has passed since the first sample. */
#define RATE_MIN_S 0.01

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

void progress_init(progress_bar *p)
{
    *p = (progress_bar){.enabled = isatty(2)};
}

void progress_begin(progress_bar *p, const char *label)
{
    progress_end(p);
    p->label = label;
    p->total = 0;
    p->last_done = 0;
    p->start_done = 0;
    p->start = now_s();
    p->last_draw = 0;
}

static void draw(progress_bar *p, uint64_t done, double t)
{
    enum { WIDTH = 30 };
    double frac = p->total ? (double)done / (double)p->total : 1.0;
    int fill = (int)(frac * WIDTH);
    char bar[WIDTH + 1];
    for (int i = 0; i < WIDTH; i++)
        bar[i] = i < fill ? '#' : '.';
    bar[WIDTH] = 0;
    /* The rate of what moved since the first sample (which may already count a whole
     * buffer, sent before the clock started), once there is a time to divide by. */
    double el = t - p->start;
    double rate = el >= RATE_MIN_S && done > p->start_done ? (double)(done - p->start_done) / el
                                                           : 0; /* bytes/s */
    double eta = rate > 0 ? (double)(p->total - done) / rate : 0;
    char speed[32] = "      -- MiB/s", left[16] = "ETA    -";
    if (rate > 0) {
        snprintf(speed, sizeof speed, "%8.1f MiB/s", rate / (1024.0 * 1024.0));
        snprintf(left, sizeof left, "ETA %4.0fs", eta);
    }
    /* \033[K clears what a longer earlier line left behind */
    fprintf(stderr, "\r%-24.24s [%s] %3d%% %s %s\033[K", p->label ? p->label : "", bar,
            (int)(frac * 100), speed, left);
    fflush(stderr);
    p->drawn = 1;
    p->last_draw = t;
}

void progress_cb(void *arg, uint64_t done, uint64_t total)
{
    progress_bar *p = arg;
    if (!p->enabled || total < PROGRESS_MIN_BYTES)
        return;
    if (total != p->total || done < p->last_done) {
        /* A new payload under the same label (the lib reports each transfer from 0). */
        p->total = total;
        p->start = now_s();
        p->start_done = done;
    }
    p->last_done = done;
    double t = now_s();
    if (done == total || t - p->last_draw >= 0.1)
        draw(p, done, t);
}

void progress_end(progress_bar *p)
{
    if (p->drawn)
        fputc('\n', stderr);
    p->drawn = 0;
}
