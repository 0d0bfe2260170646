/* metrics.h -- /metrics (Prometheus text) and /healthz on --metrics-listen. */
#ifndef TDD_METRICS_H
#define TDD_METRICS_H

#include <stdbool.h>
#include <uv.h>

/* Serves on hostport (HOST:PORT, port 0 picks one; beyond loopback only with a token,
 * which /metrics then asks for, or --insecure) from loop's thread;
 * prints "metrics on http://HOST:PORT/metrics". 0, or -1 after logging why. */
int tdd_metrics_start(uv_loop_t *loop, const char *hostport);
/* The metrics listener is beyond loopback: a token must stay configured (SIGHUP). */
bool tdd_metrics_needs_token(void);
/* /healthz answers 503 from now on (shutdown began). */
void tdd_metrics_draining(void);
/* Closes the listener and its loop handles (before the loop's last run). */
void tdd_metrics_stop(void);

#endif
