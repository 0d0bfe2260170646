/* none.c -- the cuda backend's stand-in when the build found no nvcc. */
#include <stdio.h>

#include "backend.h"

static int none_init(const tdd_backend_config *cfg, void **ctx, char *why, size_t why_len)
{
    (void)cfg;
    *ctx = NULL;
    if (why)
        snprintf(why, why_len, "built without CUDA (no usable CUDA toolkit at build time)");
    return 0;
}

const tdd_backend tdd_backend_cuda = {.name = "cuda", .init = none_init};
