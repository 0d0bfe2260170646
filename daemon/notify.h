/* notify.h -- systemd: readiness and status (sd_notify), inherited listening sockets
 * (socket activation, sd_listen_fds). Each is a no-op outside systemd. */
#ifndef TDD_NOTIFY_H
#define TDD_NOTIFY_H

#include <uv.h>

/* The listening sockets systemd passed (tensordd.socket): their count, fds from 3. */
int tdd_notify_listen_fds(void);
/* READY=1 with a STATUS line, then STATUS every few seconds while sessions change. */
void tdd_notify_ready(uv_loop_t *loop);
/* STOPPING=1 (shutdown began: draining). */
void tdd_notify_stopping(void);
/* Closes the status timer. */
void tdd_notify_close(void);

#endif
