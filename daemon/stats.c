/* stats.c -- the daemon's counters: every layer counts here, Stats reads them. */
#include "stats.h"

tdd_counters tdd_stats;

void tdd_count_error(int code)
{
    if (code < 0 && -code < TD_ERRNO_COUNT)
        tdd_stats.errors[-code]++;
}
