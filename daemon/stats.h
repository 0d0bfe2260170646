/* stats.h -- the daemon's counters for Stats: bytes, requests, errors by code. */
#ifndef TDD_STATS_H
#define TDD_STATS_H

#include <stdint.h>

#include "tensordd.h"

typedef struct {
    uint64_t bytes_received, bytes_sent, requests;
    uint64_t errors[TD_ERRNO_COUNT];
    uint64_t start_ms;
} tdd_counters;
extern tdd_counters tdd_stats;
/* Counts a failed request once, where it failed (errors by code, for Stats). */
void tdd_count_error(int code);

#endif
