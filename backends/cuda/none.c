/* none.c -- the cuda backend's stand-in when the build found no nvcc. */
#include <stdio.h>

#include "backend.h"

_Thread_local uint64_t tdd_backend_session;

static int none_init(const tdd_backend_config *cfg, void **ctx, char *why, size_t why_len)
{
    *ctx = NULL;
    if (cfg && cfg->emu_gpus > 0)
        fprintf(stderr, "tensordd: --emu-gpus: emulated GPUs are the `make emu` build's "
                        "(build/emu/tensordd); ignored here\n");
    if (why)
        snprintf(why, why_len, "built without CUDA (no usable CUDA toolkit at build time)");
    return 0;
}

const tdd_backend tdd_backend_cuda = {.name = "cuda", .init = none_init};
