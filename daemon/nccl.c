/* nccl.c -- what NCCL would offer process groups on cuda devices: a probe, run when the
 * first such group forms, that loads libnccl with dlopen and looks for a CUDA driver. The
 * daemon builds and runs where NCCL is missing (most CI machines). Collectives on cuda
 * devices run staged through host memory over Gloo (group.c) whatever the probe finds;
 * NCCL is not called yet, and the probe's line says so in the log. */
#include "nccl.h"

#include <dlfcn.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

/* Where the toolkit puts it when the loader's path does not say. */
static const char *const nccl_paths[] = {"libnccl.so.2", "libnccl.so",
                                         "/usr/local/cuda/lib64/libnccl.so.2",
                                         "/usr/local/cuda/lib/libnccl.so.2"};
/* What collectives over it would need (the C API of nccl.h, looked up by name). */
static const char *const nccl_symbols[] = {
    "ncclGetVersion", "ncclGetUniqueId", "ncclCommInitRank", "ncclCommDestroy",
    "ncclAllReduce",  "ncclBroadcast",   "ncclAllGather",    "ncclGetErrorString"};

static bool tried;
static bool usable;
static char reason[400];

static void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static void say(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(reason, sizeof reason, fmt, ap);
    va_end(ap);
}

static void probe(void)
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
    if (!lib) {
        say("NCCL not used: libnccl.so.2 cannot be loaded (%s)", err);
        return;
    }
    for (size_t i = 0; i < sizeof nccl_symbols / sizeof nccl_symbols[0]; i++)
        if (!dlsym(lib, nccl_symbols[i])) {
            say("NCCL not used: the one in %s lacks %s (too old)", from, nccl_symbols[i]);
            dlclose(lib);
            return;
        }
    int v = 0;
    int (*get_version)(int *) = NULL;
    void *sym = dlsym(lib, "ncclGetVersion");
    memcpy(&get_version, &sym, sizeof get_version);
    get_version(&v);
    char ver[64];
    snprintf(ver, sizeof ver, "NCCL %d.%d.%d (%s)", v / 10000, v / 100 % 100, v % 100, from);
    dlclose(lib);
    void *drv = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
    if (!drv) {
        const char *e = dlerror();
        say("NCCL not used: %s loads, but there is no CUDA driver (%s)", ver,
            e ? e : "libcuda.so.1 not found");
        return;
    }
    dlclose(drv);
    usable = true;
    say("NCCL not used: %s and a CUDA driver are here, but this daemon does not run "
        "collectives on NCCL yet",
        ver);
}

bool tdd_nccl_probe(char *why, size_t wn)
{
    if (!tried) {
        tried = true;
        probe();
    }
    snprintf(why, wn, "%s", reason);
    return usable;
}
