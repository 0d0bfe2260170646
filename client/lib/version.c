/* version.c -- the library's version, fixed when it is built from tensordd.h's macros. */
#include "tensordd.h"

unsigned int td_version(void)
{
    return TD_VERSION_HEX;
}

const char *td_version_string(void)
{
    return TD_VERSION_STRING;
}
