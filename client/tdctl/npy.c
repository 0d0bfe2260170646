/* npy.c -- .npy header parsing and writing for tdctl; data stays in mmap'd files. */
#include "npy.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

static const uint8_t magic[6] = {0x93, 'N', 'U', 'M', 'P', 'Y'};

static const struct {
    const char *descr;
    td_dtype dt;
} descrs[] = {
    {"<f4", TD_F32},  {"<f8", TD_F64}, {"<f2", TD_F16}, {"<i4", TD_I32}, {"<i8", TD_I64},
    {"|b1", TD_BOOL}, {"|u1", TD_U8},  {"|i1", TD_I8},  {"<i2", TD_I16},
};

static int fail(char *why, size_t len, const char *msg, const char *arg)
{
    snprintf(why, len, "%s%s", msg, arg ? arg : "");
    return -1;
}

static const char *skip_ws(const char *p, const char *end)
{
    while (p < end && (*p == ' ' || *p == '\t' || *p == '\n'))
        p++;
    return p;
}

/* Finds the value that follows key ('key' or "key") and a colon. */
static const char *find_value(const char *h, const char *end, const char *key)
{
    size_t kl = strlen(key);
    for (const char *p = h; p + kl + 2 <= end; p++) {
        if ((*p == '\'' || *p == '"') && p[kl + 1] == *p && memcmp(p + 1, key, kl) == 0) {
            const char *q = skip_ws(p + kl + 2, end);
            if (q < end && *q == ':')
                return skip_ws(q + 1, end);
        }
    }
    return NULL;
}

int npy_parse_header(const uint8_t *buf, size_t len, npy_array *out, char *why, size_t whylen)
{
    memset(out, 0, sizeof *out);
    if (len < 10 || memcmp(buf, magic, sizeof magic) != 0)
        return fail(why, whylen, "not an .npy file (bad magic)", NULL);
    unsigned major = buf[6];
    size_t hlen, hstart;
    if (major == 1) {
        hlen = (size_t)buf[8] | (size_t)buf[9] << 8;
        hstart = 10;
    } else if (major == 2 || major == 3) {
        if (len < 12)
            return fail(why, whylen, "truncated .npy header", NULL);
        hlen = (size_t)buf[8] | (size_t)buf[9] << 8 | (size_t)buf[10] << 16 | (size_t)buf[11] << 24;
        hstart = 12;
    } else {
        char v[16];
        snprintf(v, sizeof v, "%u", major);
        return fail(why, whylen, "unsupported .npy format version ", v);
    }
    if (hlen > len - hstart)
        return fail(why, whylen, "truncated .npy header", NULL);
    const char *h = (const char *)buf + hstart, *end = h + hlen;

    const char *d = find_value(h, end, "descr");
    if (!d || d >= end || (*d != '\'' && *d != '"'))
        return fail(why, whylen, "npy header has no 'descr' string", NULL);
    const char *de = memchr(d + 1, *d, (size_t)(end - d - 1));
    if (!de)
        return fail(why, whylen, "npy header: unterminated 'descr'", NULL);
    char descr[32];
    size_t dl = (size_t)(de - d - 1);
    if (dl >= sizeof descr)
        return fail(why, whylen, "unsupported dtype (structured or too long)", NULL);
    memcpy(descr, d + 1, dl);
    descr[dl] = 0;
    out->dtype = TD_DTYPE_INVALID;
    for (size_t i = 0; i < sizeof descrs / sizeof descrs[0]; i++)
        if (strcmp(descr, descrs[i].descr) == 0)
            out->dtype = descrs[i].dt;
    if (out->dtype == TD_DTYPE_INVALID) {
        if (descr[0] == '>')
            return fail(why, whylen, "big-endian data is not supported: dtype ", descr);
        return fail(why, whylen, "unsupported dtype (supported: <f4 <f8 <f2 <i4 <i8 |b1): ", descr);
    }

    const char *f = find_value(h, end, "fortran_order");
    if (!f)
        return fail(why, whylen, "npy header has no 'fortran_order'", NULL);
    if ((size_t)(end - f) >= 4 && memcmp(f, "True", 4) == 0)
        return fail(why, whylen,
                    "fortran_order True is not supported: save the array in C order "
                    "(numpy.ascontiguousarray)",
                    NULL);
    if ((size_t)(end - f) < 5 || memcmp(f, "False", 5) != 0)
        return fail(why, whylen, "npy header: bad 'fortran_order'", NULL);

    const char *s = find_value(h, end, "shape");
    if (!s || *s != '(')
        return fail(why, whylen, "npy header has no 'shape' tuple", NULL);
    s++;
    uint64_t bytes = td_dtype_size(out->dtype);
    for (;;) {
        s = skip_ws(s, end);
        if (s >= end)
            return fail(why, whylen, "npy header: unterminated 'shape'", NULL);
        if (*s == ')')
            break;
        if (*s < '0' || *s > '9')
            return fail(why, whylen, "npy header: bad 'shape'", NULL);
        if (out->ndim == TD_MAX_NDIM)
            return fail(why, whylen, "too many dimensions (tensordd allows 8)", NULL);
        uint64_t v = 0;
        while (s < end && *s >= '0' && *s <= '9') {
            v = v * 10 + (uint64_t)(*s - '0');
            if (v > (uint64_t)INT64_MAX / 10)
                return fail(why, whylen, "npy header: dimension too large", NULL);
            s++;
        }
        if (s < end && *s == 'L') /* Python 2 longs */
            s++;
        if (v && bytes > UINT64_MAX / v)
            return fail(why, whylen, "npy array too large", NULL);
        bytes *= v;
        out->shape[out->ndim++] = (int64_t)v;
        s = skip_ws(s, end);
        if (s < end && *s == ',')
            s++;
    }
    out->nbytes = bytes;
    out->data_off = hstart + hlen;
    return 0;
}

int npy_open(const char *path, npy_array *out, char *why, size_t whylen)
{
    memset(out, 0, sizeof *out);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        snprintf(why, whylen, "%s", strerror(errno));
        return -1;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || st.st_size < 10) {
        close(fd);
        return fail(why, whylen, "not an .npy file (too short)", NULL);
    }
    size_t len = (size_t)st.st_size;
    /* mmap, not read: a 512 MiB input is then sent from the page cache
     * without a second copy in our memory. */
    void *m = mmap(NULL, len, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (m == MAP_FAILED) {
        snprintf(why, whylen, "mmap: %s", strerror(errno));
        return -1;
    }
    npy_array a;
    if (npy_parse_header(m, len, &a, why, whylen) != 0) {
        munmap(m, len);
        return -1;
    }
    if (a.nbytes > len - a.data_off) {
        munmap(m, len);
        snprintf(why, whylen, "file is truncated: header promises %llu data bytes, file has %zu",
                 (unsigned long long)a.nbytes, len - a.data_off);
        return -1;
    }
    madvise(m, len, MADV_SEQUENTIAL);
    a.map = m;
    a.map_len = len;
    a.data = (const uint8_t *)m + a.data_off;
    *out = a;
    return 0;
}

void npy_close(npy_array *a)
{
    if (a->map)
        munmap(a->map, a->map_len);
    a->map = NULL;
}

size_t npy_make_header(td_dtype dt, int ndim, const int64_t *shape, char *out, size_t cap,
                       char *why, size_t whylen)
{
    const char *descr = NULL;
    for (size_t i = 0; i < sizeof descrs / sizeof descrs[0]; i++)
        if (descrs[i].dt == dt)
            descr = descrs[i].descr;
    if (!descr) {
        snprintf(why, whylen, "dtype %s has no .npy representation", td_dtype_name(dt));
        return 0;
    }
    char dict[512];
    int n =
        snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': False, 'shape': (", descr);
    for (int i = 0; i < ndim && n > 0 && (size_t)n < sizeof dict; i++)
        n += snprintf(dict + n, sizeof dict - (size_t)n, "%lld%s", (long long)shape[i],
                      ndim == 1 ? "," : (i + 1 < ndim ? ", " : ""));
    if (n > 0 && (size_t)n < sizeof dict)
        n += snprintf(dict + n, sizeof dict - (size_t)n, "), }");
    if (n <= 0 || (size_t)n >= sizeof dict) {
        snprintf(why, whylen, "npy header too long");
        return 0;
    }
    /* magic(6) + version(2) + len(2) + dict + spaces + '\n', padded to 64. */
    size_t total = 10 + (size_t)n + 1;
    total = (total + 63) / 64 * 64;
    if (total > cap || total - 10 > 65535) {
        snprintf(why, whylen, "npy header too long");
        return 0;
    }
    size_t hlen = total - 10;
    memcpy(out, magic, sizeof magic);
    out[6] = 1;
    out[7] = 0;
    out[8] = (char)(hlen & 0xff);
    out[9] = (char)(hlen >> 8);
    memcpy(out + 10, dict, (size_t)n);
    memset(out + 10 + n, ' ', hlen - (size_t)n - 1);
    out[total - 1] = '\n';
    return total;
}
