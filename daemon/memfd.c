/* memfd.c -- same-host zero copy: client memfds checked and mapped, sealed copies made. */
#include "memfd.h"

#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "config.h"
#include "cpu/cpu_shm.h"
#include "ops.h"

/* Client memfds kept open by mappings, daemon-wide (mappings go on any thread). */
static atomic_uint kept;

static size_t page_size(void)
{
    long p = sysconf(_SC_PAGESIZE);
    return p > 0 ? (size_t)p : 4096u;
}

int tdd_memfd_check(int fd, uint64_t offset, uint64_t nbytes, td_error *err)
{
    int seals = fcntl(fd, F_GET_SEALS);
    if (seals < 0) {
        struct stat sb;
        const char *what = fstat(fd, &sb) != 0    ? "not an open file"
                           : S_ISREG(sb.st_mode)  ? "a regular file, not a memfd"
                           : S_ISFIFO(sb.st_mode) ? "a pipe, not a memfd"
                           : S_ISSOCK(sb.st_mode) ? "a socket, not a memfd"
                           : S_ISDIR(sb.st_mode)  ? "a directory, not a memfd"
                                                  : "not a memfd";
        return tdd_err_arg(err, "payload_fd", "the file descriptor sent is %s", what);
    }
    if ((seals & TDD_MEMFD_SEALS_NEEDED) != TDD_MEMFD_SEALS_NEEDED)
        return tdd_err_arg(err, "payload_fd",
                           "the memfd is not sealed against %s%s%s (seal it with fcntl "
                           "F_ADD_SEALS F_SEAL_SHRINK|F_SEAL_WRITE after writing it)",
                           (seals & F_SEAL_SHRINK) ? "" : "shrinking",
                           !(seals & (F_SEAL_SHRINK | F_SEAL_WRITE)) ? " and " : "",
                           (seals & F_SEAL_WRITE) ? "" : "writing");
    if (offset % TDD_MEMFD_ALIGN)
        return tdd_err_arg(err, "fd_offset", "fd_offset %llu is not a multiple of %u",
                           (unsigned long long)offset, TDD_MEMFD_ALIGN);
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode) || sb.st_size < 0)
        return tdd_err_arg(err, "payload_fd", "the memfd cannot be sized: %s", strerror(errno));
    uint64_t size = (uint64_t)sb.st_size;
    if (offset > size || nbytes > size - offset)
        return tdd_err_arg(err, "payload_fd",
                           "the memfd holds %llu bytes; fd_offset %llu plus the tensor's %llu "
                           "bytes need %s",
                           (unsigned long long)size, (unsigned long long)offset,
                           (unsigned long long)nbytes,
                           offset > UINT64_MAX - nbytes ? "more than 2^64" : "more");
    return 0;
}

tdd_memfd_map *tdd_memfd_map_new(int fd, uint64_t offset, uint64_t nbytes, td_error *err)
{
    if (tdd_memfd_check(fd, offset, nbytes, err))
        return NULL;
    size_t pg = page_size();
    uint64_t start = offset - offset % pg;
    uint64_t len = offset - start + nbytes;
    if (nbytes == 0 || len > SIZE_MAX) {
        tdd_err_arg(err, "payload_fd", "nothing to map (%llu bytes)", (unsigned long long)nbytes);
        return NULL;
    }
    tdd_memfd_map *m = calloc(1, sizeof *m);
    if (!m) {
        tdd_err_set(err, TD_ERESOURCE_EXHAUSTED, "out of host memory");
        return NULL;
    }
    /* Private: the tensor's in-place updates copy the pages they write. */
    void *p = mmap(NULL, (size_t)len, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, (off_t)start);
    if (p == MAP_FAILED) {
        int e = errno;
        free(m);
        if (e == ENOMEM)
            tdd_err_set(err, TD_ERESOURCE_EXHAUSTED, "mapping the memfd: %s", strerror(e));
        else
            tdd_err_arg(err, "payload_fd", "the memfd cannot be mapped: %s", strerror(e));
        return NULL;
    }
    m->fd = fd;
    if (atomic_fetch_add(&kept, 1) >= tdd_cfg.max_memfd_keep) {
        atomic_fetch_sub(&kept, 1);
        close(fd); /* the mapping holds the file; only a copy-free download needs the fd */
        m->fd = -1;
    }
    m->base = p;
    m->maplen = (size_t)len;
    m->offset = offset;
    m->data = (char *)p + (offset - start);
    m->nbytes = (size_t)nbytes;
    return m;
}

void tdd_memfd_map_free(tdd_memfd_map *m)
{
    if (!m)
        return;
    munmap(m->base, m->maplen);
    if (m->fd >= 0) {
        close(m->fd);
        atomic_fetch_sub(&kept, 1);
    }
    free(m);
}

bool tdd_memfd_map_clean(const tdd_memfd_map *m)
{
    return tdd_shm_range_clean(m->base, m->maplen);
}

int tdd_memfd_sealed_copy(const void *data, size_t n, td_error *err)
{
    int fd = memfd_create("tensordd-download", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0)
        return tdd_err_set(err,
                           errno == EMFILE || errno == ENFILE ? TD_ERESOURCE_EXHAUSTED : TD_EIO,
                           "memfd_create: %s", strerror(errno));
    int e = 0;
    if (ftruncate(fd, (off_t)n) != 0)
        e = errno;
    for (size_t off = 0; !e && off < n;) {
        ssize_t w = pwrite(fd, (const char *)data + off, n - off, (off_t)off);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            e = w < 0 ? errno : EIO;
        else
            off += (size_t)w;
    }
    if (!e && fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE | F_SEAL_SEAL))
        e = errno;
    if (e) {
        close(fd);
        return tdd_err_set(err, e == ENOMEM || e == ENOSPC ? TD_ERESOURCE_EXHAUSTED : TD_EIO,
                           "writing a memfd of %zu bytes: %s", n, strerror(e));
    }
    return fd;
}

int tdd_memfd_export(const void *data, size_t n, uint64_t *offset, td_error *err)
{
    int fd = n ? tdd_shm_export(data, n, offset) : -1;
    if (fd >= 0)
        return fd;
    *offset = 0;
    return tdd_memfd_sealed_copy(n ? data : "", n, err);
}
