/* metrics.h -- tdctl's reader of the daemon's /metrics page (Prometheus text). */
#ifndef TDCTL_METRICS_H
#define TDCTL_METRICS_H

#include <stddef.h>

/* GET url (http://HOST:PORT[/path], default path /metrics), with "Authorization: Bearer"
 * when bearer is not NULL; *body (malloc'd, NUL terminated) on status 200. -1 with err
 * filled otherwise. timeout_ms 0: no limit. */
int tdctl_http_get(const char *url, int timeout_ms, const char *bearer, char **body, size_t *len,
                   char *err, size_t errlen);

#define TDCTL_MAX_LABELS 4
typedef struct {
    const char *name;
    const char *labels[TDCTL_MAX_LABELS][2]; /* key, value (unescaped) */
    int nlabels;
    double value;
} tdctl_sample;

/* The next sample of the page at *cursor (which it cuts into strings): 1, or 0 at
 * its end. Comments are skipped. */
int tdctl_metric_next(char **cursor, tdctl_sample *s);
/* A label's value, "" when absent. */
const char *tdctl_label(const tdctl_sample *s, const char *key);

#endif
