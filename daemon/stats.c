/* stats.c -- the daemon's counters: every layer counts here, Stats and /metrics read
 * them. Loop thread only. */
#include "stats.h"

tdd_counters tdd_stats;

/* 10 us .. 10 s */
const uint64_t tdd_lat_bounds_ns[TDD_LAT_BUCKETS] = {
    10000,    50000,    100000,    500000,    1000000,    5000000,
    10000000, 50000000, 100000000, 500000000, 1000000000, 10000000000,
};

void tdd_count_error(int code)
{
    if (code < 0 && -code < TD_ERRNO_COUNT)
        tdd_stats.errors[-code]++;
}

void tdd_count_request(int body_case)
{
    tdd_stats.by_request[body_case > 0 && body_case < TDD_REQ_KINDS ? body_case : 0]++;
}

void tdd_count_op(int op, int rc, uint64_t ns)
{
    if (op < 0 || op >= TDD_OP_COUNT)
        return;
    tdd_op_counters *o = &tdd_stats.ops[op];
    if (rc)
        o->failed++;
    else
        o->ok++;
    o->sum_ns += ns;
    int b = 0;
    while (b < TDD_LAT_BUCKETS && ns > tdd_lat_bounds_ns[b])
        b++;
    o->buckets[b]++;
}
