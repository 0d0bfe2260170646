/* daemon.h -- test support: run the real tensordd on a free port, and speak raw frames to it. */
#ifndef TDT_DAEMON_H
#define TDT_DAEMON_H

#include <stdint.h>
#include <sys/types.h>

#include "tensordd.h"
#include "tensordd.pb-c.h"

/* Every wait in the tests is bounded by this. */
#define TDT_TIMEOUT_MS 30000

typedef struct {
    pid_t pid;
    pid_t drain_pid; /* copies the daemon's stdout to our stderr */
    int port;
    char endpoint[128];
    char unix_path[108]; /* non-empty when a unix listener was asked for */
} tdt_daemon;

/* Starts $TDD_BIN (or ./build/tensordd) with --listen tcp://127.0.0.1:PORT and
 * the extra arguments (NULL-terminated; may be NULL), waits for its
 * "listening on" line. with_unix adds a unix:// listener too. Returns 0, or -1
 * with a reason on stderr. */
int tdt_daemon_start(tdt_daemon *d, const char *const *extra_args, int with_unix);
/* SIGTERM, then waits (bounded; SIGKILL after the bound). Returns the exit
 * status (0..255), 128+signal if it died of one, or -1. */
int tdt_daemon_stop(tdt_daemon *d);
/* 1 while the process exists and has not exited. */
int tdt_daemon_alive(const tdt_daemon *d);

/* A libtensordd client with the bounded timeout; NULL (reason on stderr) on failure. */
td_client *tdt_connect(const char *endpoint, const char *name);

/* Raw socket to the daemon (TCP_NODELAY, receive timeout), or -1. */
int tdt_raw_connect(const tdt_daemon *d);
/* Sends all of buf; 0, or -errno (EPIPE and the like are expected in tests). */
int tdt_raw_write(int fd, const void *buf, size_t len);
/* Frames and sends one request (+payload). */
int tdt_raw_send(int fd, const Tensordd__V1__Request *req, const void *payload, uint64_t plen);
/* Reads one response within timeout_ms; its payload is drained. Returns NULL
 * on close (*closed = 1), timeout or garbage (*closed = 0). */
Tensordd__V1__Response *tdt_raw_recv(int fd, int timeout_ms, int *closed);
/* Waits up to timeout_ms for EOF (or a reset); 1 if the peer closed. */
int tdt_raw_wait_close(int fd, int timeout_ms);

#endif
