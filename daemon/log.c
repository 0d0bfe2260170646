/* log.c -- leveled logging to stderr, one line per call: text ("TS LEVEL msg") or JSON
 * ({"ts", "level", "msg", "conn", "session"}); when stderr is the journal
 * ($JOURNAL_STREAM names its device and inode) each line starts with its syslog
 * priority, <3> error to <7> debug, so journald records the level. */
#include "log.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

int tdd_log_level = TDD_LOG_INFO;
static bool json;
static bool journal;
static pthread_once_t journal_once = PTHREAD_ONCE_INIT;
static _Thread_local tdd_log_ctx cur;

static const char *const names[] = {"error", "warn", "info", "debug"};
static const int syslog_prio[] = {3, 4, 6, 7}; /* LOG_ERR, LOG_WARNING, LOG_INFO, LOG_DEBUG */

int tdd_log_parse_level(const char *s)
{
    for (int i = 0; i < 4; i++)
        if (strcmp(s, names[i]) == 0)
            return i;
    return -1;
}

const char *tdd_log_level_name(int level)
{
    return level >= 0 && level < 4 ? names[level] : "?";
}

int tdd_log_set_format(const char *s)
{
    if (strcmp(s, "text") && strcmp(s, "json"))
        return -1;
    json = strcmp(s, "json") == 0;
    return 0;
}

const char *tdd_log_format_name(void)
{
    return json ? "json" : "text";
}

void tdd_log_set_ctx(tdd_log_ctx ctx, tdd_log_ctx *prev)
{
    if (prev)
        *prev = cur;
    cur = ctx;
}

bool tdd_log_is_journal(int fd)
{
    const char *js = getenv("JOURNAL_STREAM");
    unsigned long long dev, ino;
    struct stat sb;
    return js && sscanf(js, "%llu:%llu", &dev, &ino) == 2 && fstat(fd, &sb) == 0 &&
           (unsigned long long)sb.st_dev == dev && (unsigned long long)sb.st_ino == ino;
}

static void detect_journal(void)
{
    journal = tdd_log_is_journal(STDERR_FILENO);
}

/* Appends s to buf[*n..cap) as the inside of a JSON string. */
static void json_escape(char *buf, size_t cap, size_t *n, const char *s)
{
    for (; *s && *n + 8 < cap; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\') {
            buf[(*n)++] = '\\';
            buf[(*n)++] = (char)ch;
        } else if (ch < 0x20 || ch == 0x7f) {
            *n += (size_t)snprintf(buf + *n, cap - *n, "\\u%04x", ch);
        } else {
            buf[(*n)++] = (char)ch;
        }
    }
    buf[*n] = 0;
}

void tdd_log(int level, const char *fmt, ...)
{
    if (level > tdd_log_level || level < 0)
        return;
    pthread_once(&journal_once, detect_journal);
    char msg[1024], line[2400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    struct timespec ts;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    char when[64];
    snprintf(when, sizeof when, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ", tm.tm_year + 1900,
             tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000000);
    size_t n = 0;
    if (journal)
        n += (size_t)snprintf(line, sizeof line, "<%d>", syslog_prio[level]);
    if (!json) {
        n += (size_t)snprintf(line + n, sizeof line - n, "%s %-5s ", when, names[level]);
        /* control characters (a client's name may hold any) as \xNN: one record, one line */
        for (const char *p = msg; *p && n + 6 < sizeof line; p++) {
            unsigned char ch = (unsigned char)*p;
            if (ch < 0x20 || ch == 0x7f)
                n += (size_t)snprintf(line + n, sizeof line - n, "\\x%02x", ch);
            else
                line[n++] = (char)ch;
        }
        line[n++] = '\n';
        line[n] = 0;
    } else {
        n += (size_t)snprintf(line + n, sizeof line - n, "{\"ts\":\"%s\",\"level\":\"%s\"", when,
                              names[level]);
        if (cur.conn)
            n += (size_t)snprintf(line + n, sizeof line - n, ",\"conn\":%" PRIu64, cur.conn);
        if (cur.session)
            n += (size_t)snprintf(line + n, sizeof line - n, ",\"session\":%" PRIu64, cur.session);
        n += (size_t)snprintf(line + n, sizeof line - n, ",\"msg\":\"");
        json_escape(line, sizeof line - 4, &n, msg);
        snprintf(line + n, sizeof line - n, "\"}\n");
    }
    fputs(line, stderr);
}
