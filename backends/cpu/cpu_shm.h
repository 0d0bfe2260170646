/* cpu_shm.h -- host storage in memfds (shmem), so that a download to a client on the same
 * host hands the tensor's own pages over as a sealed memfd instead of a copy of them.
 *
 * A block is a memfd mapped shared and writable: kernels write it as any memory. To hand
 * it out, tdd_shm_export seals it: the shared mapping is replaced, at the same address,
 * by a private (copy-on-write) mapping of the same file, and the file gets every seal.
 * From then on no write by anyone reaches the file: the daemon's later in-place updates
 * copy the pages they touch, as for a client's uploaded memfd (daemon/memfd.h). A sealed
 * block never goes back to the cpu pool's cache: freeing it unmaps it and closes the fd.
 *
 * Each block keeps its memfd open (sealing needs it): at most tdd_shm_max_blocks exist at
 * once; past it tdd_shm_alloc answers NULL (the caller takes anonymous memory). Every
 * function is thread-safe. */
#ifndef TDD_CPU_SHM_H
#define TDD_CPU_SHM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Blocks that may exist at once (the daemon's --max-memfd-storage); 0: none. */
extern uint32_t tdd_shm_max_blocks;

/* A new block of n bytes (a multiple of 2 MiB), 2 MiB aligned, zeroed; NULL when over
 * tdd_shm_max_blocks or when memfd_create, ftruncate or mmap fail. */
void *tdd_shm_alloc(size_t n);
/* Unmaps and closes the block at p (from tdd_shm_alloc, n as given there). */
void tdd_shm_free(void *p, size_t n);
/* Whether p is the start of a block; *sealed: whether it was exported. */
bool tdd_shm_is_block(const void *p, bool *sealed);
/* A sealed memfd (a new fd, close-on-exec) whose bytes from *offset on are [p, p + n),
 * which lies in one block: the block is sealed first if it is not yet. -1 with errno
 * ENOENT: not in a block; ESTALE: the block was sealed before and the daemon has written
 * some page of [p, p + n) since (its bytes are no longer the file's); else the errno of
 * the failed call. */
int tdd_shm_export(const void *p, size_t n, uint64_t *offset);
/* Whether no page of [p, p + n), in a private mapping of a file, has been written since
 * the mapping was made (/proc/self/pagemap: a written private page is anonymous memory).
 * false when that cannot be told. */
bool tdd_shm_range_clean(const void *p, size_t n);
/* Blocks existing now (tests, stats). */
uint32_t tdd_shm_blocks(void);

#endif
