/* metrics.c -- tdctl stats --metrics URL: the daemon's /metrics page (HTTP/1.0 GET on
 * its --metrics-listen address) read into samples, for the numbers the Stats request
 * does not carry: requests by type, ops by name with their latency, queue depth per
 * device. A daemon whose metrics are beyond loopback asks for its token (bearer). */
#include "metrics.h"

#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define MAX_PAGE (16u << 20)

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* Waits for fd to be ready for events; 0 ready, -1 timeout or error. */
static int wait_fd(int fd, short events, double deadline)
{
    for (;;) {
        int left = deadline > 0 ? (int)(deadline - now_ms()) : -1;
        if (deadline > 0 && left <= 0)
            return -1;
        struct pollfd p = {.fd = fd, .events = events};
        int r = poll(&p, 1, left);
        if (r < 0 && errno == EINTR)
            continue;
        return r > 0 ? 0 : -1;
    }
}

int tdctl_http_get(const char *url, int timeout_ms, const char *bearer, char **body, size_t *len,
                   char *err, size_t errlen)
{
    char host[256], port[16] = "80";
    const char *path = "/metrics";
    if (strncmp(url, "http://", 7) != 0) {
        snprintf(err, errlen, "%s: expected http://HOST:PORT", url);
        return -1;
    }
    const char *h = url + 7, *slash = strchr(h, '/');
    size_t hl = slash ? (size_t)(slash - h) : strlen(h);
    if (slash && slash[1])
        path = slash;
    if (hl == 0 || hl >= sizeof host) {
        snprintf(err, errlen, "%s: bad host", url);
        return -1;
    }
    memcpy(host, h, hl);
    host[hl] = 0;
    char *colon = strrchr(host, ':');
    if (colon && (host[0] != '[' || colon > strchr(host, ']'))) {
        snprintf(port, sizeof port, "%s", colon + 1);
        *colon = 0;
    }
    if (host[0] == '[') {
        memmove(host, host + 1, strlen(host));
        char *rb = strchr(host, ']');
        if (rb)
            *rb = 0;
    }
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *ai;
    int rc = getaddrinfo(host, port, &hints, &ai);
    if (rc) {
        snprintf(err, errlen, "%s: %s", url, gai_strerror(rc));
        return -1;
    }
    double deadline = timeout_ms > 0 ? now_ms() + timeout_ms : 0;
    int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0 || connect(fd, ai->ai_addr, ai->ai_addrlen) != 0) {
        snprintf(err, errlen, "%s: cannot connect: %s", url, strerror(errno));
        freeaddrinfo(ai);
        if (fd >= 0)
            close(fd);
        return -1;
    }
    freeaddrinfo(ai);
    char req[2048];
    int n = snprintf(req, sizeof req, "GET %s HTTP/1.0\r\nHost: %s\r\n%s%s%s\r\n", path, host,
                     bearer ? "Authorization: Bearer " : "", bearer ? bearer : "",
                     bearer ? "\r\n" : "");
    if (n < 0 || (size_t)n >= sizeof req || write(fd, req, (size_t)n) != n) {
        snprintf(err, errlen, "%s: cannot send the request", url);
        close(fd);
        return -1;
    }
    size_t cap = 65536, got = 0;
    char *buf = malloc(cap);
    for (;;) {
        if (!buf) {
            snprintf(err, errlen, "out of memory");
            close(fd);
            return -1;
        }
        if (wait_fd(fd, POLLIN, deadline)) {
            snprintf(err, errlen, "%s: no answer within %d ms", url, timeout_ms);
            free(buf);
            close(fd);
            return -1;
        }
        if (got + 1 >= cap) {
            if (cap >= MAX_PAGE) {
                snprintf(err, errlen, "%s: page over %u bytes", url, MAX_PAGE);
                free(buf);
                close(fd);
                return -1;
            }
            char *nb = realloc(buf, cap * 2);
            if (!nb)
                free(buf);
            buf = nb;
            cap *= 2;
            continue;
        }
        ssize_t r = read(fd, buf + got, cap - 1 - got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break;
        got += (size_t)r;
    }
    close(fd);
    buf[got] = 0;
    int status = 0;
    char *sep = strstr(buf, "\r\n\r\n");
    if (sscanf(buf, "HTTP/%*d.%*d %d", &status) != 1 || !sep) {
        snprintf(err, errlen, "%s: not an HTTP answer", url);
        free(buf);
        return -1;
    }
    if (status != 200) {
        snprintf(err, errlen, "%s: HTTP status %d", url, status);
        free(buf);
        return -1;
    }
    sep += 4;
    *len = got - (size_t)(sep - buf);
    memmove(buf, sep, *len + 1);
    *body = buf;
    return 0;
}

int tdctl_metric_next(char **cursor, tdctl_sample *s)
{
    while (**cursor) {
        char *line = *cursor, *nl = strchr(line, '\n');
        *cursor = nl ? nl + 1 : line + strlen(line);
        if (nl)
            *nl = 0;
        if (line[0] == '#' || !line[0])
            continue;
        char *brace = strchr(line, '{'), *space = strrchr(line, ' ');
        if (!space)
            continue;
        *space = 0;
        s->value = strtod(space + 1, NULL);
        s->nlabels = 0;
        if (brace && brace < space) {
            *brace = 0;
            char *p = brace + 1;
            while (*p && *p != '}' && s->nlabels < TDCTL_MAX_LABELS) {
                char *eq = strchr(p, '=');
                if (!eq || eq[1] != '"')
                    break;
                *eq = 0;
                s->labels[s->nlabels][0] = p;
                char *v = eq + 2, *w = v;
                while (*v && *v != '"') { /* unescape in place */
                    if (*v == '\\' && v[1]) {
                        v++;
                        *w++ = *v == 'n' ? '\n' : *v;
                        v++;
                    } else {
                        *w++ = *v++;
                    }
                }
                if (*v == '"')
                    v++;
                *w = 0;
                s->labels[s->nlabels++][1] = eq + 2;
                p = *v == ',' ? v + 1 : v;
            }
        }
        s->name = line;
        return 1;
    }
    return 0;
}

const char *tdctl_label(const tdctl_sample *s, const char *key)
{
    for (int i = 0; i < s->nlabels; i++)
        if (strcmp(s->labels[i][0], key) == 0)
            return s->labels[i][1];
    return "";
}
