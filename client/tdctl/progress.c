/* progress.c -- tdctl's progress bar: redrawn at most every 100 ms, only on a terminal. */
#include "progress.h"

#include <stdio.h>
#include <time.h>
#include <unistd.h>

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
    double el = t - p->start;
    double rate = el > 0 ? (double)done / el : 0; /* bytes/s */
    double eta = rate > 0 ? (double)(p->total - done) / rate : 0;
    /* \033[K clears what a longer earlier line left behind */
    fprintf(stderr, "\r%-24.24s [%s] %3d%% %8.1f MiB/s ETA %4.0fs\033[K", p->label ? p->label : "",
            bar, (int)(frac * 100), rate / (1024.0 * 1024.0), eta);
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
