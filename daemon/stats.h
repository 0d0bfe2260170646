/* stats.h -- the daemon's counters for Stats and /metrics: bytes, requests by type,
 * ops by name with their latency, errors by code, sessions. Every counter is written
 * and read on the loop thread only (the metrics endpoint answers there too). */
#ifndef TDD_STATS_H
#define TDD_STATS_H

#include <stdint.h>

#include "ops.h"
#include "tensordd.h"

/* Upper bounds of the op latency histogram's buckets, in nanoseconds (+Inf after). */
#define TDD_LAT_BUCKETS 12
extern const uint64_t tdd_lat_bounds_ns[TDD_LAT_BUCKETS];
#define TDD_REQ_KINDS 64 /* Request.body field numbers counted (larger ones land in 0) */

typedef struct {
    uint64_t ok, failed;
    uint64_t sum_ns;                       /* submission to completion */
    uint64_t buckets[TDD_LAT_BUCKETS + 1]; /* non-cumulative; the last is +Inf */
} tdd_op_counters;

typedef struct {
    uint64_t bytes_received, bytes_sent, requests;
    uint64_t errors[TD_ERRNO_COUNT];
    uint64_t start_ms;
    uint64_t by_request[TDD_REQ_KINDS]; /* by Request.body field number */
    uint64_t sessions_opened;           /* Hellos accepted */
    uint64_t auth_failures;             /* Hellos refused for their token */
    tdd_op_counters ops[TDD_OP_COUNT];
} tdd_counters;
extern tdd_counters tdd_stats;
/* Counts a failed request once, where it failed (errors by code, for Stats). */
void tdd_count_error(int code);
/* Counts a request by its Request.body field number. */
void tdd_count_request(int body_case);
/* Counts an op that ran (rc 0) or failed, ns after it was submitted. */
void tdd_count_op(int op, int rc, uint64_t ns);

#endif
