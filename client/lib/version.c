/* version.c -- the library's version, fixed when it is built from tensordd.h's macros. */
#include "tensordd.h"

#define TD__STR(x) #x
#define TD__XSTR(x) TD__STR(x)

unsigned int td_version(void)
{
    return TD_VERSION_HEX;
}

const char *td_version_string(void)
{
    return TD__XSTR(TD_VERSION_MAJOR) "." TD__XSTR(TD_VERSION_MINOR) "." TD__XSTR(TD_VERSION_PATCH);
}
