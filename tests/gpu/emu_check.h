/* emu_check.h -- the emulator test programs' CHECK: counts checks and failures, prints each
 * failure with its condition and a message (emu_selftest, emu_checks, emu_profile). */
#ifndef TDD_EMU_CHECK_H
#define TDD_EMU_CHECK_H

#include <stdio.h>

static int failures, checks;
#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        checks++;                                                                                  \
        if (!(cond)) {                                                                             \
            failures++;                                                                            \
            printf("FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);                                 \
            printf(__VA_ARGS__);                                                                   \
            printf("\n");                                                                          \
        }                                                                                          \
    } while (0)

#endif
