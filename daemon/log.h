/* log.h -- leveled logging to stderr: text or JSON lines, with syslog priority
 * prefixes when stderr is the systemd journal. */
#ifndef TDD_LOG_H
#define TDD_LOG_H

#include <stdbool.h>
#include <stdint.h>

enum { TDD_LOG_ERROR = 0, TDD_LOG_WARN, TDD_LOG_INFO, TDD_LOG_DEBUG };

extern int tdd_log_level;

/* "error", "warn", "info", "debug" -> level; -1 if unknown. */
int tdd_log_parse_level(const char *s);
const char *tdd_log_level_name(int level);
/* "text" or "json": 0, or -1 if unknown. */
int tdd_log_set_format(const char *s);
const char *tdd_log_format_name(void);
/* The connection and session (0 = none yet) the calling thread works for: JSON lines
 * carry them until the next call. Returns the previous pair through prev (may be NULL). */
typedef struct {
    uint64_t conn, session;
} tdd_log_ctx;
void tdd_log_set_ctx(tdd_log_ctx ctx, tdd_log_ctx *prev);
/* fd is the systemd journal's stream ($JOURNAL_STREAM names its device and inode). */
bool tdd_log_is_journal(int fd);
void tdd_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define tdd_error(...) tdd_log(TDD_LOG_ERROR, __VA_ARGS__)
#define tdd_warn(...) tdd_log(TDD_LOG_WARN, __VA_ARGS__)
#define tdd_info(...) tdd_log(TDD_LOG_INFO, __VA_ARGS__)
#define tdd_debug(...)                                                                             \
    do {                                                                                           \
        if (tdd_log_level >= TDD_LOG_DEBUG)                                                        \
            tdd_log(TDD_LOG_DEBUG, __VA_ARGS__);                                                   \
    } while (0)

#endif
