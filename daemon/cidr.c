/* cidr.c -- address lists for --transfer-peers (see cidr.h). */
#include "cidr.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

typedef struct {
    int family;    /* AF_INET or AF_INET6 */
    uint8_t a[16]; /* the address, network order (4 bytes for IPv4) */
    int bits;      /* prefix length */
} entry;

/* One entry of text [s, s + len) into e; -1 when it is not ADDR[/BITS]. */
static int parse_entry(const char *s, size_t len, entry *e)
{
    char buf[INET6_ADDRSTRLEN + 8];
    if (!len || len >= sizeof buf)
        return -1;
    memcpy(buf, s, len);
    buf[len] = 0;
    char *slash = strchr(buf, '/');
    if (slash)
        *slash = 0;
    if (inet_pton(AF_INET, buf, e->a) == 1) {
        e->family = AF_INET;
        e->bits = 32;
    } else if (inet_pton(AF_INET6, buf, e->a) == 1) {
        e->family = AF_INET6;
        e->bits = 128;
    } else
        return -1;
    if (slash) {
        char *end;
        long b = strtol(slash + 1, &end, 10);
        if (!slash[1] || *end || b < 0 || b > e->bits)
            return -1;
        e->bits = (int)b;
    }
    return 0;
}

/* Calls fn on each entry; stops at the first bad one (returned as -1 with its text). */
static int each_entry(const char *list, int (*fn)(const entry *, void *), void *arg,
                      const char **bad, size_t *badlen)
{
    const char *p = list;
    while (*p) {
        while (*p == ' ' || *p == ',')
            p++;
        if (!*p)
            break;
        size_t len = strcspn(p, ", ");
        entry e;
        if (parse_entry(p, len, &e)) {
            *bad = p;
            *badlen = len;
            return -1;
        }
        if (fn(&e, arg))
            return 1;
        p += len;
    }
    return 0;
}

static int no_op(const entry *e, void *arg)
{
    (void)e;
    (void)arg;
    return 0;
}

int tdd_cidr_check(const char *list, char *why, size_t n)
{
    const char *bad = NULL;
    size_t badlen = 0;
    if (each_entry(list, no_op, NULL, &bad, &badlen) >= 0)
        return 0;
    snprintf(why, n, "'%.*s' is not ADDR or ADDR/BITS", (int)(badlen > 64 ? 64 : badlen), bad);
    return -1;
}

typedef struct {
    int family;
    uint8_t a[16];
} probe;

static int matches(const entry *e, void *arg)
{
    const probe *q = arg;
    if (e->family != q->family)
        return 0;
    int full = e->bits / 8, rest = e->bits % 8;
    if (memcmp(e->a, q->a, (size_t)full))
        return 0;
    if (rest) {
        uint8_t mask = (uint8_t)(0xff << (8 - rest));
        if ((e->a[full] & mask) != (q->a[full] & mask))
            return 0;
    }
    return 1;
}

bool tdd_cidr_match(const char *list, const struct sockaddr *sa)
{
    probe q = {0};
    if (sa->sa_family == AF_INET) {
        const struct sockaddr_in *in = (const struct sockaddr_in *)(const void *)sa;
        q.family = AF_INET;
        memcpy(q.a, &in->sin_addr, 4);
    } else if (sa->sa_family == AF_INET6) {
        const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)(const void *)sa;
        if (IN6_IS_ADDR_V4MAPPED(&in6->sin6_addr)) {
            q.family = AF_INET;
            memcpy(q.a, in6->sin6_addr.s6_addr + 12, 4);
        } else {
            q.family = AF_INET6;
            memcpy(q.a, &in6->sin6_addr, 16);
        }
    } else
        return false;
    const char *p = list;
    while (*p == ' ' || *p == ',')
        p++;
    if (!*p)
        return false;
    const char *bad = NULL;
    size_t badlen = 0;
    return each_entry(list, matches, &q, &bad, &badlen) == 1;
}

bool tdd_cidr_any(const char *list)
{
    return list && list[strspn(list, " ,")] != 0;
}
