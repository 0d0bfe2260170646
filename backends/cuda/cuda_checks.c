/* cuda_checks.c -- kernels' value checks read at the next synchronising point
 * (cuda_checks.h). Runs under the slot's issue lock, except tdc_checks_unread. */
#include "cuda_checks.h"

#include <string.h>

static void count(tdc_checks *k)
{
    atomic_store(&k->unread, k->taken + k->nfound);
}

void tdc_checks_open(tdc_checks *k, tdc_dev *kd)
{
    memset(k->host, 0, sizeof k->host);
    k->taken = k->named = k->nfound = 0;
    atomic_store(&k->unread, 0);
    k->dev = NULL; /* made by the slot's first checking kernel (kernels.cu, with_flag) */
    kd->flags = &k->dev;
    kd->flags_taken = &k->taken;
    kd->flags_cap = TDC_CHECKS_CAP;
}

void tdc_checks_close(tdc_checks *k, tdc_dev *kd, cudaStream_t after)
{
    if (k->dev)
        (void)cudaFreeAsync(k->dev, after);
    k->dev = NULL;
    kd->flags = NULL;
    k->taken = k->named = k->nfound = 0;
    count(k);
}

void tdc_checks_name(tdc_checks *k, uint64_t session, tdd_op op)
{
    for (; k->named < k->taken; k->named++)
        k->owner[k->named] = (tdc_check_owner){.session = session, .op = op};
    count(k);
}

cudaError_t tdc_checks_sync(tdc_checks *k, cudaStream_t s)
{
    int n = k->taken;
    size_t bytes = sizeof(int) * (size_t)n;
    cudaError_t e = cudaSuccess;
    if (n > 0) {
        e = cudaMemcpyAsync(k->host, k->dev, bytes, cudaMemcpyDeviceToHost, s);
        if (e == cudaSuccess)
            e = cudaMemsetAsync(k->dev, 0, bytes, s);
    }
    if (e == cudaSuccess)
        e = cudaStreamSynchronize(s);
    if (e != cudaSuccess || n == 0)
        return e;
    for (int i = 0; i < n; i++) {
        if (!k->host[i])
            continue;
        tdc_check_owner o = i < k->named ? k->owner[i] : (tdc_check_owner){0};
        bool seen = false; /* one per op and session is enough to tell */
        for (int j = 0; j < k->nfound && !seen; j++)
            seen = k->found[j].session == o.session && k->found[j].op == o.op;
        if (!seen && k->nfound < TDC_CHECKS_FOUND)
            k->found[k->nfound++] = o;
    }
    k->taken = k->named = 0;
    count(k);
    return e;
}

bool tdc_checks_take(tdc_checks *k, uint64_t session, tdd_op *op)
{
    for (int j = 0; j < k->nfound; j++) {
        if (k->found[j].session != session)
            continue;
        *op = k->found[j].op;
        memmove(&k->found[j], &k->found[j + 1], sizeof k->found[0] * (size_t)(k->nfound - j - 1));
        k->nfound--;
        count(k);
        return true;
    }
    return false;
}

bool tdc_checks_unread(const tdc_checks *k)
{
    return atomic_load(&k->unread) > 0;
}
