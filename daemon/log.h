/* log.h -- leveled logging to stderr. */
#ifndef TDD_LOG_H
#define TDD_LOG_H

enum { TDD_LOG_ERROR = 0, TDD_LOG_WARN, TDD_LOG_INFO, TDD_LOG_DEBUG };

extern int tdd_log_level;

/* "error", "warn", "info", "debug" -> level; -1 if unknown. */
int tdd_log_parse_level(const char *s);
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
