/* cidr.h -- address lists ("10.0.0.0/8,fd00::/8,192.168.1.7"): the peers a daemon's own
 * outbound connections may reach (--transfer-peers). */
#ifndef TDD_CIDR_H
#define TDD_CIDR_H

#include <stdbool.h>
#include <stddef.h>

struct sockaddr;

/* 0 when every comma-separated entry of list is ADDR or ADDR/BITS (IPv4 or IPv6);
 * otherwise -1 with the first bad entry described in why. */
int tdd_cidr_check(const char *list, char *why, size_t n);

/* Whether sa (AF_INET or AF_INET6; an IPv4-mapped IPv6 address counts as IPv4) lies in
 * one of list's entries. An empty list admits no address (0.0.0.0/0,::/0 admits all). */
bool tdd_cidr_match(const char *list, const struct sockaddr *sa);
/* Whether list names any address at all (is not empty). */
bool tdd_cidr_any(const char *list);

#endif
