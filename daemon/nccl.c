/* nccl.c -- NCCL for process groups on cuda devices, loaded with dlopen when a group first
 * asks for one: the daemon builds and runs where NCCL is missing (most CI machines), and
 * says why a cuda group cannot form instead of failing to start. */
#include "nccl.h"

#include <dlfcn.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "td_error.h"

/* Where the toolkit puts it when the loader's path does not say. */
static const char *const nccl_paths[] = {"libnccl.so.2", "libnccl.so",
                                         "/usr/local/cuda/lib64/libnccl.so.2",
                                         "/usr/local/cuda/lib/libnccl.so.2"};
/* What a collective needs of it (the C API of nccl.h, looked up by name). */
static const char *const nccl_symbols[] = {
    "ncclGetVersion", "ncclGetUniqueId", "ncclCommInitRank", "ncclCommDestroy",
    "ncclAllReduce",  "ncclBroadcast",   "ncclAllGather",    "ncclGetErrorString"};

static bool tried;
static int verdict;
static char reason[400];

static int decide(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static int decide(int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(reason, sizeof reason, fmt, ap);
    va_end(ap);
    verdict = code;
    return code;
}

static int load(void)
{
    void *lib = NULL;
    const char *from = NULL, *err = "";
    for (size_t i = 0; i < sizeof nccl_paths / sizeof nccl_paths[0] && !lib; i++) {
        lib = dlopen(nccl_paths[i], RTLD_NOW | RTLD_LOCAL);
        if (lib)
            from = nccl_paths[i];
        else if (i == 0) {
            const char *e = dlerror();
            err = e ? e : "not found";
        }
    }
    if (!lib)
        return decide(TD_EUNSUPPORTED_OP,
                      "collectives on cuda devices need NCCL, and libnccl.so.2 cannot be loaded "
                      "(%s); groups run on host-memory devices (cpu, ref)",
                      err);
    for (size_t i = 0; i < sizeof nccl_symbols / sizeof nccl_symbols[0]; i++)
        if (!dlsym(lib, nccl_symbols[i]))
            return decide(TD_EUNSUPPORTED_OP, "NCCL from %s lacks %s: too old for this daemon",
                          from, nccl_symbols[i]);
    int v = 0;
    int (*get_version)(int *) = NULL;
    void *sym = dlsym(lib, "ncclGetVersion");
    memcpy(&get_version, &sym, sizeof get_version);
    get_version(&v);
    char ver[64];
    snprintf(ver, sizeof ver, "NCCL %d.%d.%d (%s)", v / 10000, v / 100 % 100, v % 100, from);
    void *drv = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
    if (!drv) {
        const char *e = dlerror();
        return decide(TD_EUNSUPPORTED_OP,
                      "%s loaded, but there is no CUDA driver (%s): NCCL runs on real GPUs "
                      "only; groups run on host-memory devices (cpu, ref)",
                      ver, e ? e : "libcuda.so.1 not found");
    }
    dlclose(drv);
    /* The library and a driver are here; the collectives over them are not written yet. */
    return decide(TD_EUNSUPPORTED_OP,
                  "%s and a CUDA driver are here, but this daemon does not run collectives on "
                  "cuda devices yet; groups run on host-memory devices (cpu, ref)",
                  ver);
}

int tdd_nccl_load(char *why, size_t wn)
{
    if (!tried) {
        tried = true;
        load();
    }
    snprintf(why, wn, "%s", reason);
    return verdict;
}
