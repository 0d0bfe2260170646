/* config.c -- the daemon's limits and their safe defaults. */
#include "config.h"

#include <string.h>

tdd_config tdd_cfg;

void tdd_config_defaults(tdd_config *c)
{
    memset(c, 0, sizeof *c);
    c->cpu_devices = 1;
    c->max_msg = 4u << 20;           /* op requests are small; 4 MiB is generous */
    c->max_payload = 64ull << 30;    /* one tensor upload */
    c->max_numel = (int64_t)1 << 36; /* 256 GiB of f32 */
    c->max_handles = 1u << 20;
    c->max_id_runs = 1u << 16;
    c->session_memory = 0;
    c->memory_cap = 0;
    c->max_inflight = 4096;
    c->max_sessions = 1024;
    c->idle_timeout_s = 0;
    c->hello_timeout_s = 10;
    c->max_handshakes = 64;
    c->write_timeout_s = 20; /* under the 30 s shutdown grace: a stuck reader cannot hold it */
    c->max_write_queue = 64u << 20;
    c->shutdown_grace_s = 30;
}
