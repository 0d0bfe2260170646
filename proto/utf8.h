/* utf8.h -- text that goes into protobuf string fields: valid UTF-8, cut whole. */
#ifndef TD_UTF8_H
#define TD_UTF8_H

#include <stdbool.h>
#include <stddef.h>

/* Length of the valid UTF-8 sequence at s[0..n) (1..4), or 0 if s does not start
 * one (a stray continuation byte, an overlong form, a surrogate, past U+10FFFF,
 * or a sequence cut short). */
size_t td_utf8_seq(const unsigned char *s, size_t n);
bool td_utf8_valid(const char *s, size_t n);
/* Copies the NUL-terminated src into dst[0..cap) as valid UTF-8: a character cut
 * short (the start of a sequence without its end, as a byte-wise cut leaves) is
 * left out, any other invalid byte becomes '?', and the copy stops before a
 * character that would not fit whole. Returns the bytes written (without the NUL); cap must be > 0.
 */
size_t td_utf8_copy(char *dst, size_t cap, const char *src);

#endif
