/* cpu_shm.c -- host storage in memfds, handed out sealed without a copy (cpu_shm.h). */
#include "cpu_shm.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "pool.h"

uint32_t tdd_shm_max_blocks;

typedef struct {
    uintptr_t base;
    size_t n;
    int fd;
    bool sealed;
} shm_block;

/* The blocks, sorted by base; nres counts blocks being made too (the limit holds). */
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static shm_block *blocks;
static uint32_t nblocks, cap, nres;

/* The index of the last block whose base is <= a, or -1. Called with mu held. */
static long find_le(uintptr_t a)
{
    long lo = 0, hi = (long)nblocks - 1, at = -1;
    while (lo <= hi) {
        long mid = lo + (hi - lo) / 2;
        if (blocks[mid].base <= a) {
            at = mid;
            lo = mid + 1;
        } else {
            hi = mid - 1;
        }
    }
    return at;
}

static void unreserve(void)
{
    pthread_mutex_lock(&mu);
    nres--;
    pthread_mutex_unlock(&mu);
}

void *tdd_shm_alloc(size_t n)
{
    pthread_mutex_lock(&mu);
    bool room = nres < tdd_shm_max_blocks;
    if (room && nres == cap) {
        uint32_t ncap = cap ? cap * 2 : 16;
        shm_block *b = realloc(blocks, ncap * sizeof *b);
        if (b) {
            blocks = b;
            cap = ncap;
        } else {
            room = false;
        }
    }
    if (room)
        nres++;
    pthread_mutex_unlock(&mu);
    if (!room)
        return NULL;
    if (n == 0 || n % TDD_POOL_HUGE) {
        unreserve();
        return NULL;
    }
    int fd = memfd_create("tensordd-storage", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0) {
        unreserve();
        return NULL;
    }
    /* 2 MiB aligned (shmem huge pages, where the host enables them, map only so): a
     * reservation with room to align in, the file mapped over its aligned part. */
    char *r = MAP_FAILED;
    if (ftruncate(fd, (off_t)n) == 0)
        r = mmap(NULL, n + TDD_POOL_HUGE, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                 -1, 0);
    uintptr_t a = ((uintptr_t)r + TDD_POOL_HUGE - 1) & ~(uintptr_t)(TDD_POOL_HUGE - 1);
    void *m = r == MAP_FAILED
                  ? MAP_FAILED
                  : mmap((void *)a, n, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0);
    if (m == MAP_FAILED) {
        if (r != MAP_FAILED)
            munmap(r, n + TDD_POOL_HUGE);
        close(fd);
        unreserve();
        return NULL;
    }
    size_t head = (size_t)(a - (uintptr_t)r);
    if (head)
        munmap(r, head);
    if (TDD_POOL_HUGE - head)
        munmap((char *)a + n, TDD_POOL_HUGE - head);
    (void)madvise(m, n, MADV_HUGEPAGE); /* a hint: with shmem huge pages off, nothing */
    pthread_mutex_lock(&mu);
    long at = find_le(a) + 1;
    for (long i = (long)nblocks; i > at; i--)
        blocks[i] = blocks[i - 1];
    blocks[at] = (shm_block){.base = a, .n = n, .fd = fd};
    nblocks++;
    pthread_mutex_unlock(&mu);
    return m;
}

void tdd_shm_free(void *p, size_t n)
{
    int fd = -1;
    pthread_mutex_lock(&mu);
    long at = find_le((uintptr_t)p);
    if (at >= 0 && blocks[at].base == (uintptr_t)p) {
        fd = blocks[at].fd;
        n = blocks[at].n;
        for (long i = at; i + 1 < (long)nblocks; i++)
            blocks[i] = blocks[i + 1];
        nblocks--;
        nres--;
    }
    pthread_mutex_unlock(&mu);
    if (fd < 0)
        return;
    munmap(p, n);
    close(fd);
}

bool tdd_shm_is_block(const void *p, bool *sealed)
{
    pthread_mutex_lock(&mu);
    long at = find_le((uintptr_t)p);
    bool is = at >= 0 && blocks[at].base == (uintptr_t)p;
    if (is && sealed)
        *sealed = blocks[at].sealed;
    pthread_mutex_unlock(&mu);
    return is;
}

uint32_t tdd_shm_blocks(void)
{
    pthread_mutex_lock(&mu);
    uint32_t n = nblocks;
    pthread_mutex_unlock(&mu);
    return n;
}

/* Turns block b's mapping private and seals its file; 0 or an errno. With mu held (the
 * block cannot go away meanwhile). If sealing fails, the shared mapping comes back: it
 * shows the file, which holds every byte written so far. */
static int seal_block(shm_block *b)
{
    int prot = PROT_READ | PROT_WRITE;
    if (mmap((void *)b->base, b->n, prot, MAP_PRIVATE | MAP_FIXED, b->fd, 0) == MAP_FAILED) {
        int e = errno;
        (void)mmap((void *)b->base, b->n, prot, MAP_SHARED | MAP_FIXED, b->fd, 0);
        return e;
    }
    if (fcntl(b->fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE | F_SEAL_SEAL)) {
        int e = errno;
        (void)mmap((void *)b->base, b->n, prot, MAP_SHARED | MAP_FIXED, b->fd, 0);
        return e;
    }
    b->sealed = true;
    return 0;
}

int tdd_shm_export(const void *p, size_t n, uint64_t *offset)
{
    uintptr_t a = (uintptr_t)p;
    int e = 0, fd = -1;
    pthread_mutex_lock(&mu);
    long at = find_le(a);
    shm_block *b = at >= 0 ? &blocks[at] : NULL;
    if (!b || a - b->base > b->n || n > b->n - (a - b->base))
        e = ENOENT;
    else if (b->sealed && !tdd_shm_range_clean(p, n))
        e = ESTALE;
    else if (!b->sealed)
        e = seal_block(b);
    if (!e) {
        fd = fcntl(b->fd, F_DUPFD_CLOEXEC, 3);
        e = fd < 0 ? errno : 0;
        *offset = (uint64_t)(a - b->base);
    }
    pthread_mutex_unlock(&mu);
    errno = e;
    return fd;
}

/* /proc/self/pagemap: 8 bytes per page; bit 63 present, 62 swapped, 61 a page of a file
 * (or shared anonymous memory). A private page written since the mapping was made is
 * anonymous: present without bit 61, or swapped. */
#define PM_PRESENT (1ull << 63)
#define PM_SWAPPED (1ull << 62)
#define PM_FILE (1ull << 61)

bool tdd_shm_range_clean(const void *p, size_t n)
{
    int pm = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
    if (pm < 0)
        return false;
    long psz = sysconf(_SC_PAGESIZE);
    uint64_t pg = psz > 0 ? (uint64_t)psz : 4096u;
    uint64_t first = (uint64_t)(uintptr_t)p / pg;
    uint64_t npages = n ? ((uint64_t)(uintptr_t)p + n - 1) / pg - first + 1 : 0;
    uint64_t ent[2048];
    bool clean = true;
    for (uint64_t i = 0; i < npages && clean;) {
        size_t k = npages - i < 2048 ? (size_t)(npages - i) : 2048;
        ssize_t got = pread(pm, ent, k * sizeof ent[0], (off_t)((first + i) * sizeof ent[0]));
        if (got != (ssize_t)(k * sizeof ent[0])) {
            clean = false;
            break;
        }
        for (size_t j = 0; j < k; j++)
            if ((ent[j] & PM_SWAPPED) || ((ent[j] & PM_PRESENT) && !(ent[j] & PM_FILE)))
                clean = false;
        i += k;
    }
    close(pm);
    return clean;
}
