/* progress.h -- tdctl's terminal progress bar for large transfers (rate and ETA on stderr). */
#ifndef TDCTL_PROGRESS_H
#define TDCTL_PROGRESS_H

#include <stdint.h>

#include "tensordd.h"

/* Transfers smaller than this draw nothing. */
#define PROGRESS_MIN_BYTES (8u << 20)

typedef struct {
    int enabled;       /* stderr is a terminal */
    const char *label; /* "upload A.npy" */
    uint64_t total, last_done;
    uint64_t start_done; /* done at the first sample: the rate counts from it */
    double start, last_draw;
    int drawn;
} progress_bar;

void progress_init(progress_bar *p);
/* Starts a new transfer under this label. */
void progress_begin(progress_bar *p, const char *label);
/* td_progress_fn: arg is the progress_bar. */
void progress_cb(void *arg, uint64_t done, uint64_t total);
/* Ends the line if a bar was drawn. */
void progress_end(progress_bar *p);

#endif
