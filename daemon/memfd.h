/* memfd.h -- same-host zero copy: a client's sealed memfd checked and mapped as tensor
 * storage, and sealed memfds made for downloads (docs/protocol.md, "Same-host zero copy").
 *
 * The daemon trusts nothing about a received fd: it must be a memfd (F_GET_SEALS answers),
 * sealed with F_SEAL_SHRINK (a shrink would turn the mapping's pages into SIGBUS) and
 * F_SEAL_WRITE (nobody, the sender included, can change the bytes after the daemon looked:
 * F_SEAL_FUTURE_WRITE is not enough, as it leaves a writable mapping the sender made
 * before sealing in place), as long as offset + the tensor's bytes. The mapping is
 * MAP_PRIVATE: the daemon's own in-place updates copy the page they touch and never reach
 * the file the client holds. Nothing here blocks: fcntl, fstat and mmap of a memfd. */
#ifndef TDD_MEMFD_H
#define TDD_MEMFD_H

#include <fcntl.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "td_error.h"

/* The seals a client's memfd must carry. */
#define TDD_MEMFD_SEALS_NEEDED (F_SEAL_SHRINK | F_SEAL_WRITE)
/* fd_offset must be a multiple of this (the alignment of the daemon's own storage). */
#define TDD_MEMFD_ALIGN 64u

typedef struct tdd_memfd_map {
    int fd;     /* the client's memfd, kept while mapped (-1: over --max-memfd-keep) */
    void *base; /* the mapping, from the page holding offset */
    size_t maplen;
    uint64_t offset; /* the tensor's first byte in the file */
    void *data;      /* that byte in the mapping */
    size_t nbytes;
} tdd_memfd_map;

/* Checks fd as the bytes of a tensor of nbytes at offset (INVALID_ARGUMENT, argument
 * "payload_fd" or "fd_offset", naming what is wrong). Does not close fd. */
int tdd_memfd_check(int fd, uint64_t offset, uint64_t nbytes, td_error *err);

/* Checks and maps fd (nbytes > 0); on success the map owns fd (keeping it open while
 * fewer than --max-memfd-keep are kept, else closing it), else the caller keeps it. */
tdd_memfd_map *tdd_memfd_map_new(int fd, uint64_t offset, uint64_t nbytes, td_error *err);
/* Unmaps and closes. */
void tdd_memfd_map_free(tdd_memfd_map *m);

/* Whether the mapping still shows the file's bytes: no page of it was written (a
 * written private page is anonymous memory, which /proc/self/pagemap tells apart from a
 * page of the file). false when that cannot be told. */
bool tdd_memfd_map_clean(const tdd_memfd_map *m);

/* A sealed memfd (its fd, close-on-exec) whose bytes from *offset on are data[0..n): the
 * memfd holding data itself, sealed (no copy), when data lies in host storage made in a
 * memfd (backends/cpu/cpu_shm.h) that the daemon has not written since it was sealed;
 * else tdd_memfd_sealed_copy's, *offset 0. A negative TD_E* with err set on failure. */
int tdd_memfd_export(const void *data, size_t n, uint64_t *offset, td_error *err);

/* A new memfd holding data[0..n), sealed against every change: its fd (close-on-exec),
 * or a negative TD_E* with err set. One copy (pwrite: the file's pages are not zeroed
 * first); blocks only as memory does, so call it on a worker for large n. */
int tdd_memfd_sealed_copy(const void *data, size_t n, td_error *err);

#endif
