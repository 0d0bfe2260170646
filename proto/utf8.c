/* utf8.c -- protobuf string fields must be valid UTF-8 (a decoder refuses the whole
 * message otherwise): everything the daemon echoes from a client goes through here. */
#include "utf8.h"

#include <string.h>

size_t td_utf8_seq(const unsigned char *s, size_t n)
{
    if (n == 0)
        return 0;
    unsigned c = s[0];
    if (c < 0x80)
        return 1;
    size_t len;
    unsigned lo = 0x80, hi = 0xbf; /* bounds of the second byte */
    if (c >= 0xc2 && c <= 0xdf)
        len = 2;
    else if (c >= 0xe0 && c <= 0xef) {
        len = 3;
        if (c == 0xe0)
            lo = 0xa0; /* overlong */
        else if (c == 0xed)
            hi = 0x9f; /* UTF-16 surrogates */
    } else if (c >= 0xf0 && c <= 0xf4) {
        len = 4;
        if (c == 0xf0)
            lo = 0x90; /* overlong */
        else if (c == 0xf4)
            hi = 0x8f; /* past U+10FFFF */
    } else
        return 0;
    if (n < len || s[1] < lo || s[1] > hi)
        return 0;
    for (size_t i = 2; i < len; i++)
        if ((s[i] & 0xc0) != 0x80)
            return 0;
    return len;
}

bool td_utf8_valid(const char *s, size_t n)
{
    const unsigned char *p = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        size_t k = td_utf8_seq(p + i, n - i);
        if (!k)
            return false;
        i += k;
    }
    return true;
}

/* Bytes at s[0..n) that start a multi-byte sequence but stop short of its end (a
 * string cut by bytes, e.g. by "%.64s"): 0 when s does not start one. */
static size_t cut_sequence(const unsigned char *s, size_t n)
{
    unsigned c = s[0];
    size_t len = c >= 0xc2 && c <= 0xdf   ? 2
                 : c >= 0xe0 && c <= 0xef ? 3
                 : c >= 0xf0 && c <= 0xf4 ? 4
                                          : 0;
    size_t j = 1;
    while (j < len && j < n && (s[j] & 0xc0) == 0x80)
        j++;
    return len && j < len ? j : 0;
}

size_t td_utf8_copy(char *dst, size_t cap, const char *src)
{
    const unsigned char *p = (const unsigned char *)(src ? src : "");
    size_t n = strlen((const char *)p), o = 0;
    for (size_t i = 0; i < n;) {
        size_t k = td_utf8_seq(p + i, n - i);
        size_t cut = k ? 0 : cut_sequence(p + i, n - i);
        if (cut) { /* a character cut short is left out, not shown as '?' */
            i += cut;
            continue;
        }
        const unsigned char *from = p + i;
        size_t take = k ? k : 1;
        if (!k)
            from = (const unsigned char *)"?";
        if (o + take >= cap)
            break;
        memcpy(dst + o, from, take);
        o += take;
        i += k ? k : 1;
    }
    dst[o] = 0;
    return o;
}
