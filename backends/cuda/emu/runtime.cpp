// runtime.cpp -- the emulated CUDA runtime, kernel execution and cuBLAS of `make emu`
// (see emu.h and emu_device.h for what is emulated and how).
//
// Devices: --emu-gpus N devices of --emu-gpu-memory bytes each. Device memory is host
// memory the daemon never sees directly: cuda.c copies it with cudaMemcpyAsync, whose kinds
// are checked against the allocation table (a host pointer passed where device memory is
// due, or the reverse, is cudaErrorInvalidValue, as it is on a GPU without managed memory).
// Fresh allocations are filled with 0xff bytes (NaN as floats): a kernel that reads what
// nobody wrote shows it. Work runs when it is enqueued, under the stream's lock, so stream
// order holds and a free from another thread waits for the kernel using the memory; streams
// run beside each other (two host threads issuing on two streams run their kernels at once).
//
// Deferred streams (TDD_EMU_DEFER=1, or tdc_emu_defer_streams): the work of a stream made by
// cudaStreamCreate* is queued and runs only when something forces it -- a synchronisation of
// the stream, of one of its events or of the device, another stream reaching a
// cudaStreamWaitEvent on its event, a device-to-host copy issued on it (pageable memory:
// the copy waits for the stream), a legacy-stream call (blocking streams only), or more than
// TDD_EMU_DEFER_DEPTH (default 1024) items queued. Streams so run out of order relative to
// each other exactly as far as CUDA allows: a missing event shows as a stale read, and a block
// freed on one stream while another still uses it is unmapped (PROT_NONE, kept from reuse
// for a while) when the free runs, so the late user faults with cudaErrorIllegalAddress.
#include <cblas.h>
#include <link.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <ucontext.h>

#include <algorithm>
#include <atomic>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "emu.h"
#include "emu_cublas.h"
#include "emu_device.h"

thread_local uint3 threadIdx;
thread_local uint3 blockIdx;
thread_local dim3 blockDim;
thread_local dim3 gridDim;

struct tdc_emu_stream {
    int device = 0;
    int id = 0;            // 0: a device's legacy stream
    bool deferred = false; // work queued until forced (TDD_EMU_DEFER)
    bool blocking = true;  // not cudaStreamNonBlocking: the legacy stream waits for it
    std::mutex m;          // eager: the work runs under it
    // deferred (under the state's dq lock): the work not run yet, positions issued and run
    std::deque<std::function<void()>> q;
    uint64_t issued = 0, done = 0;
};
struct tdc_emu_event {
    int device;
    bool recorded;
    struct timespec at;
    int stream;   // recorded on (id; 0: nothing to wait for)
    uint64_t seq; // the stream's position when recorded
};
struct tdc_emu_pool {
    int device;
};

namespace
{

struct device {
    uint64_t total = 0, in_use = 0;
    std::atomic<int> sticky{cudaSuccess};
    tdc_emu_stream legacy; // the NULL stream
    int streams_made = 0;  // created on it (under dq)
    tdc_emu_pool pool;
};

// Each allocation ends at a page that faults (PROT_NONE): host code touching memory past the
// end of a buffer (rounded up to 16 bytes) faults. Kernels are held to the exact size asked
// for (req): every access they make is checked (mem_access below), as compute-sanitizer's
// memcheck does. init: one byte per byte, nonzero once written (TDD_EMU_CHECK only).
struct allocation {
    size_t size, req;
    int device;
    void *map;
    size_t map_len;
    std::shared_ptr<std::vector<uint8_t>> init;
};

struct state {
    int ndev = 0;
    device *devs = nullptr;
    std::mutex mem; // the allocation table and every device's in_use
    std::map<uintptr_t, allocation> allocs;
    uint64_t seed = 1;
    long fail_alloc = 0, sticky_launch = 0;
    bool trace = false;
    bool check = false; // TDD_EMU_CHECK: interleaving at memory accesses, races, initcheck
    int sms = 2;        // multiprocessors reported (TDD_EMU_SMS, --emu-sms)
    std::atomic<long> nalloc{0}, nlaunch{0};
    std::atomic<uint64_t> alloc_gen{0}; // bumped by every free: kernels' cached bounds go stale
    // streams
    std::atomic<bool> defer{false};
    bool defer_later = false; // TDD_EMU_DEFER=2: a device's first stream stays eager
    size_t defer_depth = 1024;
    int defer_stream = 0; // the one stream deferred (TDD_EMU_DEFER_STREAM; 0: none)
    std::atomic<bool> any_deferred{false}; // freed memory then stays unmapped a while
    std::recursive_mutex dq;               // the registry, deferred queues and their running
    std::map<int, tdc_emu_stream *> live;  // created streams by id
    int next_id = 1;
    long created = 0;
    std::deque<std::pair<void *, size_t>> quarantine; // freed mappings kept PROT_NONE
};

int cfg_gpus = 0, cfg_sms = 0;
uint64_t cfg_memory = 0;
std::once_flag once;
state *st;
bool prof_on = false; // TDD_EMU_PROFILE (below)
FILE *prof_file = nullptr;

thread_local int cur_dev = 0;
thread_local cudaError_t last_err = cudaSuccess;

uint64_t env_u64(const char *name, uint64_t def)
{
    const char *v = getenv(name);
    if (!v || !*v)
        return def;
    char *end;
    unsigned long long n = strtoull(v, &end, 10);
    uint64_t mul = 1;
    if (*end == 'K' || *end == 'k')
        mul = 1ull << 10;
    else if (*end == 'M')
        mul = 1ull << 20;
    else if (*end == 'G')
        mul = 1ull << 30;
    return (uint64_t)n * mul;
}

void install_fault_handler();

void init_once()
{
    std::call_once(once, [] {
        st = new state;
        int n = cfg_gpus > 0 ? cfg_gpus : (int)env_u64("TDD_EMU_GPUS", 0);
        uint64_t mem = cfg_memory ? cfg_memory : env_u64("TDD_EMU_GPU_MEMORY", 1ull << 30);
        st->ndev = n < 0 ? 0 : n > 64 ? 64 : n;
        st->devs = new device[st->ndev > 0 ? st->ndev : 1];
        for (int i = 0; i < st->ndev; i++) {
            st->devs[i].total = mem;
            st->devs[i].legacy.device = i;
            st->devs[i].pool.device = i;
        }
        st->seed = env_u64("TDD_EMU_SEED", 1);
        st->fail_alloc = (long)env_u64("TDD_EMU_FAIL_ALLOC", 0);
        st->sticky_launch = (long)env_u64("TDD_EMU_STICKY_LAUNCH", 0);
        st->trace = env_u64("TDD_EMU_TRACE", 0) != 0;
        st->check = env_u64("TDD_EMU_CHECK", 0) != 0;
        uint64_t sms = cfg_sms > 0 ? (uint64_t)cfg_sms : env_u64("TDD_EMU_SMS", 2);
        st->sms = sms < 1 ? 1 : sms > 1024 ? 1024 : (int)sms;
        st->defer = env_u64("TDD_EMU_DEFER", 0) != 0;
        st->defer_later = env_u64("TDD_EMU_DEFER", 0) == 2;
        st->defer_depth = (size_t)env_u64("TDD_EMU_DEFER_DEPTH", 1024);
        st->defer_stream = (int)env_u64("TDD_EMU_DEFER_STREAM", 0);
        const char *pp = getenv("TDD_EMU_PROFILE");
        if (pp && *pp) {
            prof_file = fopen(pp, "a");
            if (!prof_file)
                fprintf(stderr, "cuda emulator: TDD_EMU_PROFILE %s: cannot open\n", pp);
            prof_on = prof_file != nullptr;
        }
        if (st->defer_depth < 1)
            st->defer_depth = 1;
        install_fault_handler();
    });
}

cudaError_t fail(cudaError_t e)
{
    last_err = e;
    return e;
}

bool valid_dev(int d)
{
    init_once();
    return d >= 0 && d < st->ndev;
}

// The device's sticky error, or success.
cudaError_t sticky(int d)
{
    return valid_dev(d) ? (cudaError_t)st->devs[d].sticky.load() : cudaErrorInvalidDevice;
}

int dev_of(cudaStream_t s)
{
    return s ? s->device : cur_dev;
}

// The device of stream s in *d, and what a call on it fails with: no such device, or the
// device's sticky error (success otherwise).
cudaError_t stream_device(cudaStream_t s, int *d)
{
    *d = dev_of(s);
    return sticky(*d);
}

tdc_emu_stream *stream_of(cudaStream_t s)
{
    return s ? s : &st->devs[cur_dev].legacy;
}

// The allocation holding [p, p + n), or null.
const allocation *find(const void *p, size_t n, uintptr_t *base = nullptr)
{
    uintptr_t a = (uintptr_t)p;
    auto it = st->allocs.upper_bound(a);
    if (it == st->allocs.begin())
        return nullptr;
    --it;
    if (a + n > it->first + it->second.req || a + n < a)
        return nullptr;
    if (base)
        *base = it->first;
    return &it->second;
}

bool is_device(const void *p, size_t n)
{
    std::lock_guard<std::mutex> g(st->mem);
    return find(p, n) != nullptr;
}

cudaError_t alloc_on(int d, void **p, size_t n)
{
    if (!p)
        return fail(cudaErrorInvalidValue);
    *p = nullptr;
    if (!valid_dev(d))
        return fail(cudaErrorInvalidDevice);
    if (cudaError_t e = sticky(d))
        return fail(e);
    long k = ++st->nalloc;
    if (k == st->fail_alloc) {
        fprintf(stderr,
                "cuda emulator: allocation %ld of %zu bytes on device %d fails "
                "(TDD_EMU_FAIL_ALLOC)\n",
                k, n, d);
        return fail(cudaErrorMemoryAllocation);
    }
    size_t size = n ? (n + 15) / 16 * 16 : 16;
    std::lock_guard<std::mutex> g(st->mem);
    device &dv = st->devs[d];
    if (size > dv.total - dv.in_use)
        return fail(cudaErrorMemoryAllocation);
    const size_t page = 4096, body = (size + page - 1) / page * page;
    void *map =
        mmap(nullptr, body + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (map == MAP_FAILED)
        return fail(cudaErrorMemoryAllocation);
    mprotect((char *)map + body, page, PROT_NONE);
    char *m = (char *)map + body - size; // 16-byte aligned (cudaMalloc gives 256)
    memset(m, 0xff, size);               // NaN as floats: reading unwritten memory shows
    dv.in_use += size;
    std::shared_ptr<std::vector<uint8_t>> init;
    if (st->check)
        init = std::make_shared<std::vector<uint8_t>>(n);
    st->allocs[(uintptr_t)m] = allocation{size, n, d, map, body + page, std::move(init)};
    *p = m;
    return cudaSuccess;
}

cudaError_t free_on(void *p)
{
    if (!p)
        return cudaSuccess;
    std::lock_guard<std::mutex> g(st->mem);
    auto it = st->allocs.find((uintptr_t)p);
    if (it == st->allocs.end())
        return fail(cudaErrorInvalidDevicePointer);
    st->devs[it->second.device].in_use -= it->second.size;
    st->alloc_gen++;
    if (st->any_deferred) {
        // A late user on an unordered stream faults instead of reading reused memory.
        mprotect(it->second.map, it->second.map_len, PROT_NONE);
        st->quarantine.emplace_back(it->second.map, it->second.map_len);
        if (st->quarantine.size() > 4096) {
            munmap(st->quarantine.front().first, st->quarantine.front().second);
            st->quarantine.pop_front();
        }
    } else {
        munmap(it->second.map, it->second.map_len);
    }
    st->allocs.erase(it);
    return cudaSuccess;
}

// ------------------------------------------------------------------ stream order

// Runs a deferred stream's queued work up to position upto (under dq).
void drain(tdc_emu_stream *ts, uint64_t upto)
{
    while (ts->done < upto && !ts->q.empty()) {
        std::function<void()> fn = std::move(ts->q.front());
        ts->q.pop_front();
        fn();
        ts->done++;
    }
}

// Stream id's work up to position upto has run (a destroyed stream's has).
void force(int id, uint64_t upto)
{
    std::lock_guard<std::recursive_mutex> g(st->dq);
    auto it = st->live.find(id);
    if (it != st->live.end())
        drain(it->second, upto);
}

// Every deferred stream of device d (blocking ones only: a legacy-stream call) has run.
void drain_device(int d, bool blocking_only)
{
    std::lock_guard<std::recursive_mutex> g(st->dq);
    for (auto &kv : st->live)
        if (kv.second->device == d && (!blocking_only || kv.second->blocking))
            drain(kv.second, kv.second->issued);
}

// Runs fn in ts's order: now under the stream's lock, or queued on a deferred stream.
void submit(tdc_emu_stream *ts, std::function<void()> fn)
{
    if (!ts->deferred) {
        if (ts->id == 0 && (st->defer || st->defer_stream))
            drain_device(ts->device, true); // the legacy stream waits for blocking streams
        std::lock_guard<std::mutex> g(ts->m);
        fn();
        return;
    }
    std::lock_guard<std::recursive_mutex> g(st->dq);
    ts->q.push_back(std::move(fn));
    ts->issued++;
    if (ts->q.size() > st->defer_depth)
        drain(ts, ts->issued);
}

// Everything issued on ts so far has run.
void finish(tdc_emu_stream *ts)
{
    if (ts->deferred) {
        std::lock_guard<std::recursive_mutex> g(st->dq);
        drain(ts, ts->issued);
    } else {
        if (ts->id == 0 && (st->defer || st->defer_stream))
            drain_device(ts->device, true);
        std::lock_guard<std::mutex> g(ts->m);
    }
}

// Work that runs later finds its memory freed: the fault a GPU would take.
bool still_device(int d, const char *what, const void *p, size_t n)
{
    if (n == 0 || is_device(p, n))
        return true;
    fprintf(stderr,
            "cuda emulator: %s on device %d touches %zu bytes at %p that are not "
            "allocated when it runs (freed too early?)\n",
            what, d, n, p);
    st->devs[d].sticky = cudaErrorIllegalAddress;
    return false;
}

// ------------------------------------------------------------------ fibers

enum fstate { RUNNABLE, WAIT_BAR, WAIT_WARP, DONE };

// A fiber's saved machine context. x86-64: the stack pointer, with the callee-saved
// registers pushed on the fiber's stack by tdc_emu_switch (a function call's worth of
// state, no system call); elsewhere ucontext (glibc's swapcontext also saves the signal
// mask, a system call per switch).
#if defined(__x86_64__)
extern "C" void tdc_emu_switch(void **save_sp, void *to_sp);
extern "C" void tdc_emu_fiber_start();
asm(".text\n"
    ".globl tdc_emu_switch\n.hidden tdc_emu_switch\n.type tdc_emu_switch,@function\n"
    "tdc_emu_switch:\n"
    "  pushq %rbp\n  pushq %rbx\n  pushq %r12\n  pushq %r13\n  pushq %r14\n  pushq %r15\n"
    "  movq %rsp, (%rdi)\n  movq %rsi, %rsp\n"
    "  popq %r15\n  popq %r14\n  popq %r13\n  popq %r12\n  popq %rbx\n  popq %rbp\n"
    "  ret\n"
    ".size tdc_emu_switch,.-tdc_emu_switch\n"
    ".globl tdc_emu_fiber_start\n.hidden tdc_emu_fiber_start\n"
    ".type tdc_emu_fiber_start,@function\n"
    "tdc_emu_fiber_start:\n" // entered by tdc_emu_switch's ret: r13 = fn, r12 = its argument
    "  movq %r12, %rdi\n  callq *%r13\n  ud2\n"
    ".size tdc_emu_fiber_start,.-tdc_emu_fiber_start\n");

struct mctx {
    void *sp;
};

// A context that starts fn(nullptr) on the stack [lo, lo + size).
void ctx_make(mctx *c, void *lo, size_t size, void (*fn)(void *))
{
    uintptr_t top = ((uintptr_t)lo + size) & ~(uintptr_t)15;
    void **sp = (void **)(top - 72); // 6 registers, the return address; 16-aligned at the call
    sp[0] = nullptr;                 // r15
    sp[1] = nullptr;                 // r14
    sp[2] = (void *)fn;              // r13
    sp[3] = nullptr;                 // r12: fn's argument
    sp[4] = nullptr;                 // rbx
    sp[5] = nullptr;                 // rbp
    sp[6] = (void *)tdc_emu_fiber_start;
    c->sp = sp;
}

void ctx_switch(mctx *from, mctx *to)
{
    tdc_emu_switch(&from->sp, to->sp);
}
#else
struct mctx {
    ucontext_t uc;
};

void (*ctx_fn)(void *);
void ctx_entry()
{
    ctx_fn(nullptr);
}

void ctx_make(mctx *c, void *lo, size_t size, void (*fn)(void *))
{
    ctx_fn = fn;
    getcontext(&c->uc);
    c->uc.uc_stack.ss_sp = lo;
    c->uc.uc_stack.ss_size = size;
    c->uc.uc_link = nullptr;
    makecontext(&c->uc, ctx_entry, 0);
}

void ctx_switch(mctx *from, mctx *to)
{
    swapcontext(&from->uc, &to->uc);
}
#endif

struct fiber {
    mctx ctx;
    unsigned tid;
    int state;
    int kind, param, width; // the pending warp operation
    unsigned mask;
    uint64_t val, res;
};

constexpr size_t kStack = 64 * 1024;

struct block_run {
    int n = 0, live = 0, at_barrier = 0, cur = -1;
    fiber *f = nullptr;
    mctx main{};
    tdc_emu::thread_body body = nullptr;
    void *arg = nullptr;
    char fault[256] = {};
    cudaError_t code = cudaErrorLaunchFailure; // the sticky error a fault leaves
    uint64_t rng = 0;
    // The race detector's clocks: the block's linear index, barriers it has passed, and
    // warp operations each warp has completed.
    uint32_t blk = 0, nbar = 0, wsync[32] = {};
};

thread_local block_run *run;
struct prof_launch;
thread_local prof_launch *prof = nullptr; // the launch profiled (TDD_EMU_PROFILE)
void prof_flush();
thread_local std::vector<void *> stacks; // per host thread, reused by every block
thread_local std::vector<fiber> fibers;

uint64_t next_rand(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void *stack_at(size_t i)
{
    while (stacks.size() <= i) {
        // A guard page below each stack: an overflow faults instead of corrupting.
        size_t page = 4096;
        void *m = mmap(nullptr, kStack + page, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (m == MAP_FAILED)
            return nullptr;
        mprotect(m, page, PROT_NONE);
        stacks.push_back((char *)m + page);
    }
    return stacks[i];
}

void fiber_main(void *)
{
    block_run *r = run;
    r->body(r->arg);
    r->f[r->cur].state = DONE;
    ctx_switch(&r->f[r->cur].ctx, &r->main); // never resumed
    abort();
}

// From a fiber: back to the scheduler.
void yield()
{
    ctx_switch(&run->f[run->cur].ctx, &run->main);
}

void set_ids(const fiber &f)
{
    threadIdx.x = f.tid % blockDim.x;
    threadIdx.y = f.tid / blockDim.x % blockDim.y;
    threadIdx.z = f.tid / (blockDim.x * blockDim.y);
}

void check_barrier(block_run *r)
{
    if (r->at_barrier == 0 || r->at_barrier != r->live)
        return;
    for (int i = 0; i < r->n; i++)
        if (r->f[i].state == WAIT_BAR)
            r->f[i].state = RUNNABLE;
    r->at_barrier = 0;
    if (prof)
        prof_flush(); // every thread is here: the warp requests before it are whole
    r->nbar++;
}

// Completes the warp operations of warp w whose every named lane has arrived.
void check_warp(block_run *r, int w)
{
    int lo = w * 32, hi = std::min(r->n, lo + 32);
    unsigned present = hi - lo == 32 ? 0xffffffffu : (1u << (hi - lo)) - 1u;
    // The lanes waiting at a warp operation and those that exited, as bit masks: each
    // arrival then costs one pass over the warp, not one per lane per lane.
    unsigned waiting = 0, done = 0;
    for (int l = lo; l < hi; l++) {
        waiting |= (unsigned)(r->f[l].state == WAIT_WARP) << (l - lo);
        done |= (unsigned)(r->f[l].state == DONE) << (l - lo);
    }
    for (int l = lo; l < hi; l++) {
        fiber &a = r->f[l];
        if (!(waiting >> (l - lo) & 1u))
            continue;
        unsigned group = a.mask & present;
        if (!(a.mask >> (l - lo) & 1u)) {
            snprintf(r->fault, sizeof r->fault,
                     "thread %d: warp operation with mask 0x%08x that leaves out its own lane", l,
                     a.mask);
            return;
        }
        // The first lane of the group not waiting decides: exited is a fault, else not yet.
        unsigned missing = group & ~waiting;
        if (missing) {
            int k = __builtin_ctz(missing);
            if (done >> k & 1u) {
                snprintf(r->fault, sizeof r->fault,
                         "thread %d: warp operation with mask 0x%08x names lane %d, which has "
                         "exited",
                         l, a.mask, k);
                return;
            }
            continue;
        }
        waiting &= ~group; // released below
        unsigned votes = 0;
        for (int k = 0; k < 32; k++) {
            if (!(group >> k & 1u))
                continue;
            const fiber &b = r->f[lo + k];
            if (b.kind != a.kind) {
                snprintf(r->fault, sizeof r->fault,
                         "warp %d: lanes %d and %d meet at different warp operations", w, l - lo,
                         k);
                return;
            }
            if (b.val)
                votes |= 1u << k;
        }
        for (int k = 0; k < 32; k++) {
            if (!(group >> k & 1u))
                continue;
            fiber &b = r->f[lo + k];
            int width = b.width, src = k;
            if (width < 1 || width > 32 || (width & (width - 1))) {
                snprintf(r->fault, sizeof r->fault, "lane %d: shuffle width %d", k, width);
                return;
            }
            int base = k & ~(width - 1);
            switch (b.kind) {
            case tdc_emu::W_IDX:
                src = base + (b.param & (width - 1));
                break;
            case tdc_emu::W_UP:
                src = k - b.param >= base ? k - b.param : k;
                break;
            case tdc_emu::W_DOWN:
                src = k + b.param < base + width ? k + b.param : k;
                break;
            case tdc_emu::W_XOR:
                src = k ^ b.param;
                if (src < base || src >= base + width)
                    src = k;
                break;
            default:
                break;
            }
            if (b.kind <= tdc_emu::W_XOR && (src < 0 || src > 31 || !(group >> src & 1u))) {
                snprintf(r->fault, sizeof r->fault,
                         "lane %d of warp %d: shuffle reads lane %d, outside mask 0x%08x", k, w,
                         src, b.mask);
                return;
            }
            switch (b.kind) {
            case tdc_emu::W_BALLOT:
                b.res = votes;
                break;
            case tdc_emu::W_ANY:
                b.res = votes != 0;
                break;
            case tdc_emu::W_ALL:
                b.res = votes == group;
                break;
            case tdc_emu::W_SYNC:
                b.res = 0;
                break;
            default:
                b.res = r->f[lo + src].val;
            }
        }
        for (int k = 0; k < 32; k++)
            if (group >> k & 1u)
                r->f[lo + k].state = RUNNABLE;
        r->wsync[w]++;
    }
}

struct sigaction old_segv, old_bus;

// A memory fault inside a kernel thread (a guard page past an allocation, a null or wild
// pointer) ends the launch with cudaErrorIllegalAddress, as on a GPU: the fiber is
// abandoned and the scheduler takes over. SA_NODEFER: leaving the handler without
// returning keeps the signal unblocked. Any other fault gets the previous action.
void on_fault(int sig, siginfo_t *si, void *uc)
{
    block_run *r = run;
    if (r && r->cur >= 0) {
        snprintf(r->fault, sizeof r->fault, "thread %d: illegal address %p", r->cur, si->si_addr);
        r->code = cudaErrorIllegalAddress;
        r->f[r->cur].state = DONE;
        ctx_switch(&r->f[r->cur].ctx, &r->main); // never resumed
    }
    const struct sigaction *old = sig == SIGSEGV ? &old_segv : &old_bus;
    if (old->sa_flags & SA_SIGINFO)
        old->sa_sigaction(sig, si, uc);
    else if (old->sa_handler != SIG_IGN && old->sa_handler != SIG_DFL)
        old->sa_handler(sig);
    else
        signal(sig, SIG_DFL); // returning re-runs the access: the default action
}

void install_fault_handler()
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_fault;
    sa.sa_flags = SA_SIGINFO | SA_NODEFER;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGSEGV, &sa, &old_segv);
    sigaction(SIGBUS, &sa, &old_bus);
}

void block_started();
void launch_started();

// Runs one block to completion; false with r->fault set on a kernel fault.
bool run_block(block_run *r)
{
    for (int i = 0; i < r->n; i++) {
        fiber &f = r->f[i];
        f.tid = (unsigned)i;
        f.state = RUNNABLE;
        void *sp = stack_at((size_t)i);
        if (!sp) {
            snprintf(r->fault, sizeof r->fault, "no memory for the fibers' stacks");
            return false;
        }
        ctx_make(&f.ctx, sp, kStack, fiber_main);
    }
    r->live = r->n;
    r->at_barrier = 0;
    r->nbar = 0;
    memset(r->wsync, 0, sizeof r->wsync);
    block_started();
    std::vector<int> order;
    order.reserve((size_t)r->n);
    while (r->live > 0) {
        order.clear();
        for (int i = 0; i < r->n; i++)
            if (r->f[i].state == RUNNABLE)
                order.push_back(i);
        if (order.empty()) {
            int bar = 0, warp = 0;
            for (int i = 0; i < r->n; i++) {
                bar += r->f[i].state == WAIT_BAR;
                warp += r->f[i].state == WAIT_WARP;
            }
            snprintf(r->fault, sizeof r->fault,
                     "deadlock: %d threads wait at __syncthreads and %d at warp operations "
                     "that can never complete",
                     bar, warp);
            return false;
        }
        for (size_t i = order.size(); i > 1; i--) // Fisher-Yates, seeded
            std::swap(order[i - 1], order[next_rand(&r->rng) % i]);
        for (int i : order) {
            fiber &f = r->f[i];
            if (f.state != RUNNABLE)
                continue;
            r->cur = i;
            set_ids(f);
            ctx_switch(&r->main, &f.ctx);
            r->cur = -1; // back in the scheduler (on_fault tells the two apart)
            if (f.state == DONE) {
                r->live--;
                check_barrier(r);
                check_warp(r, i / 32);
            } else if (f.state == WAIT_BAR) {
                r->at_barrier++;
                check_barrier(r);
            } else if (f.state == WAIT_WARP) {
                check_warp(r, i / 32);
            }
            if (r->fault[0])
                return false;
        }
    }
    return true;
}

// ------------------------------------------------------------------ memory checks
//
// kernels.cu is compiled with -fsanitize=thread's instrumentation but without its run-time
// library: every load and store the kernels make calls a __tsan_readN/__tsan_writeN defined
// below, which the emulator uses as compute-sanitizer uses its own instrumentation:
//   memcheck   (always) an access outside the exact bytes an allocation asked for, or in
//              the mapping around it, is cudaErrorIllegalAddress, reported with its offset
//   race mode  (TDD_EMU_CHECK=1) a fiber may yield to another at every global or shared
//              memory access, in the seeded order; conflicting accesses (one a write) to the
//              same bytes by two threads of one launch with no barrier between them (another
//              block: nothing orders them; the same warp: a warp operation does) are a
//              kernel fault that names both; atomics are exempt
//   initcheck  (TDD_EMU_CHECK=1) a kernel reading device memory nothing wrote (no copy,
//              memset or earlier kernel store) faults
// Shared memory (__shared__ is static thread_local) is told apart as the host thread's
// static TLS block, less the kernels' built-in variables.

struct bounds_cache {
    uintptr_t lo = 0, hi = 0; // [lo, hi): the allocation's exact bytes
    uint64_t gen = ~0ull;
    uint8_t *init = nullptr; // its initcheck bytes (check mode)
};
thread_local bounds_cache bcache;

// One access as the race detector keeps it: who, and at which barrier and warp clock.
struct acc {
    uint32_t blk, tid, bar, ws;
    uint8_t mask; // the bytes of the 4-byte granule touched
};
struct shadow {
    acc w, r;
    bool has_w = false, has_r = false;
};
thread_local std::unordered_map<uintptr_t, shadow> gshadow, sshadow; // global, shared
thread_local uintptr_t tls_lo, tls_hi;
thread_local bool tls_known;

void launch_started()
{
    if (st->check)
        gshadow.clear(); // races are within a launch: the stream orders launches
}

void block_started()
{
    if (st->check)
        sshadow.clear(); // the next block's shared memory is its own
}

[[noreturn]] void kernel_fault(cudaError_t code, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
void kernel_fault(cudaError_t code, const char *fmt, ...)
{
    block_run *r = run;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->fault, sizeof r->fault, fmt, ap);
    va_end(ap);
    r->code = code;
    r->f[r->cur].state = DONE;
    ctx_switch(&r->f[r->cur].ctx, &r->main); // never resumed
    abort();
}

int tls_cb(struct dl_phdr_info *info, size_t, void *)
{
    for (int i = 0; i < info->dlpi_phnum; i++)
        if (info->dlpi_phdr[i].p_type == PT_TLS) {
            size_t al = info->dlpi_phdr[i].p_align ? info->dlpi_phdr[i].p_align : 1;
            size_t sz = (info->dlpi_phdr[i].p_memsz + al - 1) / al * al;
            uintptr_t tp = (uintptr_t)__builtin_thread_pointer();
            tls_lo = tp - sz;
            tls_hi = tp;
            return 1;
        }
    return 1; // the first object is the program: its TLS or none
}

// Whether p is __shared__ memory: in the program's static TLS (x86-64 puts it just below
// the thread pointer) and none of the built-in variables.
bool is_shared(uintptr_t a)
{
#if defined(__x86_64__)
    if (!tls_known) {
        dl_iterate_phdr(tls_cb, nullptr);
        tls_known = true;
    }
    if (a < tls_lo || a >= tls_hi)
        return false;
    auto in = [a](const void *v, size_t n) { return a >= (uintptr_t)v && a < (uintptr_t)v + n; };
    return !in(&threadIdx, sizeof threadIdx) && !in(&blockIdx, sizeof blockIdx) &&
           !in(&blockDim, sizeof blockDim) && !in(&gridDim, sizeof gridDim);
#else
    (void)a;
    return false;
#endif
}

const char *where(bool shared)
{
    return shared ? "shared" : "global";
}

// Two accesses nothing orders: another block, or the same block with no barrier (and, in
// one warp, no warp operation) since the earlier one.
bool concurrent(const acc &e, const acc &c)
{
    if (e.blk != c.blk)
        return true;
    if (e.tid == c.tid || e.bar < c.bar)
        return false;
    return !(e.tid / 32 == c.tid / 32 && e.ws < c.ws);
}

void race_check(uintptr_t a, size_t n, bool w, bool shared)
{
    block_run *r = run;
    unsigned tid = (unsigned)r->cur;
    acc c{r->blk, tid, r->nbar, r->wsync[tid / 32 % 32], 0};
    auto &map = shared ? sshadow : gshadow;
    for (uintptr_t g = a & ~(uintptr_t)3; g < a + n; g += 4) {
        uintptr_t lo = std::max(g, a), hi = std::min(g + 4, a + n);
        c.mask = (uint8_t)(((1u << (hi - lo)) - 1u) << (lo - g));
        shadow &sh = map[g];
        const acc *e = nullptr;
        const char *kind = nullptr;
        if (sh.has_w && (sh.w.mask & c.mask) && concurrent(sh.w, c)) {
            e = &sh.w;
            kind = w ? "write after write" : "read after write";
        } else if (w && sh.has_r && (sh.r.mask & c.mask) && concurrent(sh.r, c)) {
            e = &sh.r;
            kind = "write after read";
        }
        if (e)
            kernel_fault(cudaErrorLaunchFailure,
                         "race (%s) on %s memory at %p: thread %u of block %u, and thread %u "
                         "of block %u with no barrier between (an atomic missing?)",
                         kind, where(shared), (void *)lo, tid, r->blk, e->tid, e->blk);
        if (w) {
            sh.w = c;
            sh.has_w = true;
        } else {
            sh.r = c;
            sh.has_r = true;
        }
    }
}

// ------------------------------------------------------------------ profile
//
// TDD_EMU_PROFILE=path: one line per kernel launch (and per cuBLAS GEMM) appended to path,
// JSON, with what the launch asked of memory (tools/gpu_report.py reads them):
//   global loads and stores: bytes the threads asked for; per warp request (the accesses of
//   one instruction by a warp's lanes: the same code address, its Nth execution by each lane
//   since the block's last barrier) the distinct 32-byte sectors touched, and the fewest that
//   could hold the distinct bytes asked for (coalescing = ideal / sectors); the distinct
//   bytes the whole launch read and wrote (its footprint: the least traffic it could make)
//   shared memory: per warp request the wavefronts its banks take (32 banks of 4 bytes: the
//   most distinct words any bank serves) and the fewest the bytes need (128 per wavefront);
//   the difference is the bank conflicts' cost
//   flops: what the kernel counted with TDC_FLOPS (kernels.h; 0 where it counts none), or a
//   GEMM's 2*m*n*k
// Off (no path): the access hooks test one flag and do nothing more.

std::mutex prof_mu;

struct prof_access {
    uintptr_t a;
    uint32_t n;
    uint8_t w, shared;
};
struct prof_key {
    uintptr_t pc;
    uint32_t warp, occ;
    bool operator==(const prof_key &o) const
    {
        return pc == o.pc && warp == o.warp && occ == o.occ;
    }
};
struct prof_key_hash {
    size_t operator()(const prof_key &k) const
    {
        uint64_t h = (uint64_t)k.pc * 0x9e3779b97f4a7c15ull;
        h ^= ((uint64_t)k.warp << 32 | k.occ) + 0x7f4a7c159e3779b9ull + (h << 6) + (h >> 2);
        return (size_t)h;
    }
};
struct prof_launch {
    uint64_t bytes[2] = {}, sectors[2] = {}, ideal[2] = {}, requests[2] = {};
    uint64_t sh_bytes = 0, sh_requests = 0, sh_wavefronts = 0, sh_ideal = 0, flops = 0;
    uint64_t uniq[2] = {}; // footprint counted elsewhere (a GEMM's), besides foot's
    std::unordered_map<uint64_t, uint32_t> foot[2]; // sector -> the bytes touched, a bit each
    // the block's warp requests not counted yet, and each lane's executions of each address
    std::unordered_map<prof_key, std::vector<prof_access>, prof_key_hash> pending;
    std::unordered_map<uint64_t, uint32_t> occ; // (pc, thread) -> executions
    // each thread's last accesses, where a vector load or store split by the host compiler
    // into its fields (the next field, at another code address) joins the first
    struct last_access {
        std::vector<prof_access> *req = nullptr;
        size_t at = 0;
        uintptr_t pc = 0;
    };
    struct last_accesses {
        last_access a[4];
        unsigned next = 0;
    };
    std::vector<last_accesses> last;
};

// The distinct bytes a request's accesses cover.
uint64_t union_bytes(std::vector<std::pair<uintptr_t, uintptr_t>> &iv)
{
    std::sort(iv.begin(), iv.end());
    uint64_t total = 0;
    uintptr_t lo = 0, hi = 0;
    bool open = false;
    for (auto &x : iv) {
        if (open && x.first <= hi) {
            hi = std::max(hi, x.second);
            continue;
        }
        if (open)
            total += hi - lo;
        lo = x.first;
        hi = x.second;
        open = true;
    }
    return open ? total + (hi - lo) : total;
}

// Counts the block's pending warp requests (every one is complete: the block ended or all
// its threads are at a barrier).
void prof_flush()
{
    prof_launch *p = prof;
    std::vector<std::pair<uintptr_t, uintptr_t>> iv[2];
    std::vector<uintptr_t> sec[2];
    for (auto &kv : p->pending) {
        for (int i = 0; i < 2; i++) {
            iv[i].clear();
            sec[i].clear();
        }
        std::vector<std::pair<uintptr_t, uintptr_t>> shiv;
        std::unordered_map<uint32_t, std::vector<uintptr_t>> banks;
        for (const prof_access &x : kv.second) {
            if (x.shared) {
                shiv.emplace_back(x.a, x.a + x.n);
                for (uintptr_t wd = x.a >> 2; wd <= (x.a + x.n - 1) >> 2; wd++)
                    banks[(uint32_t)(wd & 31)].push_back(wd);
                p->sh_bytes += x.n;
                continue;
            }
            iv[x.w].emplace_back(x.a, x.a + x.n);
            for (uintptr_t s = x.a >> 5; s <= (x.a + x.n - 1) >> 5; s++)
                sec[x.w].push_back(s);
        }
        for (int i = 0; i < 2; i++) {
            if (iv[i].empty())
                continue;
            std::sort(sec[i].begin(), sec[i].end());
            p->sectors[i] += (uint64_t)(std::unique(sec[i].begin(), sec[i].end()) - sec[i].begin());
            p->ideal[i] += (union_bytes(iv[i]) + 31) / 32;
            p->requests[i]++;
        }
        if (!shiv.empty()) {
            uint64_t wf = 0;
            for (auto &b : banks) {
                std::sort(b.second.begin(), b.second.end());
                wf = std::max(wf, (uint64_t)(std::unique(b.second.begin(), b.second.end()) -
                                             b.second.begin()));
            }
            p->sh_wavefronts += wf;
            p->sh_ideal += (union_bytes(shiv) + 127) / 128;
            p->sh_requests++;
        }
    }
    p->pending.clear();
    p->occ.clear();
    p->last.clear();
}

void prof_access_at(const void *pc, uintptr_t a, size_t n, bool w, bool shared)
{
    prof_launch *p = prof;
    block_run *r = run;
    if (!p || !r || r->cur < 0)
        return;
    uint32_t tid = (uint32_t)r->cur;
    if (p->last.size() <= tid)
        p->last.resize((size_t)r->n);
    prof_launch::last_accesses &ls = p->last[tid];
    // A float4 (or float2) the host compiler loads field by field is one 16-byte (8-byte)
    // access on a GPU: an access from other code to the bytes right after one of the
    // thread's last four, within one aligned 16 bytes, extends it.
    prof_launch::last_access *hit = nullptr;
    for (prof_launch::last_access &la : ls.a) {
        prof_access *prev = la.req ? &(*la.req)[la.at] : nullptr;
        if (prev && la.pc != (uintptr_t)pc && prev->w == w && prev->shared == shared &&
            prev->a + prev->n == a && (a + n - 1) >> 4 == prev->a >> 4) {
            prev->n += (uint32_t)n;
            la.pc = (uintptr_t)pc;
            hit = &la;
            break;
        }
    }
    if (!hit) {
        uint64_t ok = (uint64_t)(uintptr_t)pc * 1024u + tid; // threads < 1024
        uint32_t occ = p->occ[ok]++;
        std::vector<prof_access> &req = p->pending[prof_key{(uintptr_t)pc, tid / 32, occ}];
        req.push_back(prof_access{a, (uint32_t)n, (uint8_t)w, (uint8_t)shared});
        ls.a[ls.next++ % 4] = prof_launch::last_access{&req, req.size() - 1, (uintptr_t)pc};
    }
    if (shared)
        return;
    p->bytes[w] += n;
    for (uintptr_t b = a; b < a + n;) {
        uintptr_t s = b >> 5, end = std::min(a + n, (s + 1) << 5);
        uint32_t bits =
            (uint32_t)((end - b == 32 ? 0xffffffffull : ((1ull << (end - b)) - 1)) << (b & 31));
        p->foot[w][s] |= bits;
        b = end;
    }
}

// Appends a launch's line to the profile.
void prof_write(long k, int d, const char *name, dim3 grid, dim3 block, const prof_launch &p)
{
    uint64_t uniq[2] = {p.uniq[0], p.uniq[1]};
    for (int i = 0; i < 2; i++)
        for (auto &kv : p.foot[i])
            uniq[i] += (uint64_t)__builtin_popcount(kv.second);
    std::string nm;
    for (const char *c = name; *c; c++) {
        if (*c == '"' || *c == '\\')
            nm += '\\';
        if ((unsigned char)*c >= 32)
            nm += *c;
    }
    std::lock_guard<std::mutex> g(prof_mu);
    fprintf(prof_file,
            "{\"launch\": %ld, \"device\": %d, \"kernel\": \"%s\", \"grid\": [%u, %u, %u], "
            "\"block\": [%u, %u, %u], \"read_bytes\": %llu, \"write_bytes\": %llu, "
            "\"read_sectors\": %llu, \"write_sectors\": %llu, \"read_ideal_sectors\": %llu, "
            "\"write_ideal_sectors\": %llu, \"read_requests\": %llu, \"write_requests\": %llu, "
            "\"read_unique\": %llu, \"write_unique\": %llu, \"shared_bytes\": %llu, "
            "\"shared_requests\": %llu, \"shared_wavefronts\": %llu, "
            "\"shared_ideal_wavefronts\": %llu, \"flops\": %llu}\n",
            k, d, nm.c_str(), grid.x, grid.y, grid.z, block.x, block.y, block.z,
            (unsigned long long)p.bytes[0], (unsigned long long)p.bytes[1],
            (unsigned long long)p.sectors[0], (unsigned long long)p.sectors[1],
            (unsigned long long)p.ideal[0], (unsigned long long)p.ideal[1],
            (unsigned long long)p.requests[0], (unsigned long long)p.requests[1],
            (unsigned long long)uniq[0], (unsigned long long)uniq[1],
            (unsigned long long)p.sh_bytes, (unsigned long long)p.sh_requests,
            (unsigned long long)p.sh_wavefronts, (unsigned long long)p.sh_ideal,
            (unsigned long long)p.flops);
    fflush(prof_file);
}

// Appends a host wait's line to the profile: what waited (cudaStreamSynchronize, ...) on
// which device, so tests count the synchronisations a request costs.
void prof_sync(const char *what, int d)
{
    if (!prof_on)
        return;
    std::lock_guard<std::mutex> g(prof_mu);
    fprintf(prof_file, "{\"sync\": \"%s\", \"device\": %d}\n", what, d);
    fflush(prof_file);
}

// Every kernel load and store (n bytes at p; w: a store). Host code (the launch wrappers
// in kernels.cu) runs outside any block and is not checked.
void mem_access(const void *p, size_t n, bool w, bool atomic = false, bool may_yield = true,
                const void *pc = nullptr)
{
    block_run *r = run;
    if (!r || r->cur < 0 || n == 0)
        return;
    uintptr_t a = (uintptr_t)p;
    bounds_cache &c = bcache;
    bool global = a >= c.lo && a + n <= c.hi && c.gen == st->alloc_gen.load();
    if (!global) {
        // A fault leaves the fiber for good: the lock is released before it.
        char why[160] = "";
        {
            std::lock_guard<std::mutex> g(st->mem);
            uint64_t gen = st->alloc_gen.load();
            auto it = st->allocs.upper_bound(a);
            if (it != st->allocs.end() && a >= (uintptr_t)it->second.map)
                snprintf(why, sizeof why, "%zu bytes before an allocation of %zu bytes",
                         (size_t)(it->first - a), it->second.req);
            else if (it != st->allocs.begin()) {
                --it;
                const allocation &al = it->second;
                uintptr_t base = it->first, end = base + al.req;
                if (a >= (uintptr_t)al.map + al.map_len) {
                    // not device memory
                } else if (a + n > end || a + n < a) {
                    snprintf(why, sizeof why,
                             "at byte %zu of an allocation of %zu bytes (out of bounds)",
                             (size_t)(a - base), al.req);
                } else {
                    c.lo = base;
                    c.hi = end;
                    c.gen = gen;
                    c.init = al.init ? al.init->data() : nullptr;
                    global = true;
                }
            }
        }
        if (why[0])
            kernel_fault(cudaErrorIllegalAddress, "thread %d: %zu-byte %s %s", r->cur, n,
                         w ? "store" : "load", why);
    }
    // Profiled at the address a 256-byte aligned cudaMalloc would give (the emulator's
    // allocations end at a page boundary: their start is only 16-byte aligned), so the
    // sectors counted are a GPU's.
    if (prof_on && pc && (global || is_shared(a)))
        prof_access_at(pc, global ? a - (c.lo & 4095) : a, n, w, !global);
    bool shared = !global && st->check && is_shared(a);
    if (!st->check || (!global && !shared))
        return;
    if (may_yield && next_rand(&r->rng) % 4 == 0) { // race mode: another thread may run first
        yield();
        return mem_access(p, n, w, atomic, false); // the other fibers moved the cache
    }
    if (global && c.init) {
        uint8_t *in = c.init + (a - c.lo);
        if (w) {
            memset(in, 1, n);
        } else {
            for (size_t i = 0; i < n; i++)
                if (!in[i])
                    kernel_fault(cudaErrorLaunchFailure,
                                 "thread %d: %zu-byte load at byte %zu of a %zu-byte allocation "
                                 "that nothing wrote (uninitialised)",
                                 r->cur, n, (size_t)(a - c.lo), (size_t)(c.hi - c.lo));
        }
    }
    if (!atomic)
        race_check(a, n, w, shared);
}

// Device memory [p, p + n) holds defined bytes now (a copy or memset into it).
void mark_init(const void *p, size_t n)
{
    if (!st->check || n == 0)
        return;
    std::lock_guard<std::mutex> g(st->mem);
    uintptr_t base;
    const allocation *al = find(p, n, &base);
    if (al && al->init)
        memset(al->init->data() + ((uintptr_t)p - base), 1, n);
}

} // namespace

namespace tdc_emu
{

void syncthreads()
{
    if (!run) {
        fprintf(stderr, "cuda emulator: __syncthreads outside a kernel\n");
        abort();
    }
    run->f[run->cur].state = WAIT_BAR;
    yield();
}

uint64_t warp_op(int kind, unsigned mask, uint64_t value, int param, int width)
{
    if (!run) {
        fprintf(stderr, "cuda emulator: warp operation outside a kernel\n");
        abort();
    }
    fiber &f = run->f[run->cur];
    f.kind = kind;
    f.mask = mask;
    f.val = value;
    f.param = param;
    f.width = width;
    f.state = WAIT_WARP;
    yield();
    return run->f[run->cur].res;
}

// Runs a launch's blocks one by one on this thread; a fault leaves its sticky error.
void run_grid(int d, long k, dim3 grid, dim3 block, const char *name, thread_body body, void *arg)
{
    if (sticky(d))
        return; // a fault before it: the context runs nothing more
    block_run r;
    uint64_t threads = (uint64_t)block.x * block.y * block.z;
    r.n = (int)threads;
    if (fibers.size() < threads)
        fibers.resize(threads);
    r.f = fibers.data();
    r.body = body;
    r.arg = arg;
    r.fault[0] = 0;
    r.rng = st->seed * 0x2545f4914f6cdd1dull + (uint64_t)k;
    block_run *outer = run;
    run = &r;
    launch_started();
    gridDim = grid;
    blockDim = block;
    prof_launch *outer_prof = prof;
    std::unique_ptr<prof_launch> pl(prof_on ? new prof_launch : nullptr);
    prof = pl.get();
    bool ok = true;
    for (unsigned z = 0; z < grid.z && ok; z++)
        for (unsigned y = 0; y < grid.y && ok; y++)
            for (unsigned x = 0; x < grid.x && ok; x++) {
                blockIdx = uint3{x, y, z};
                r.blk = (z * grid.y + y) * grid.x + x;
                ok = run_block(&r);
                if (prof)
                    prof_flush();
            }
    run = outer;
    if (pl && ok)
        prof_write(k, d, name, grid, block, *pl);
    prof = outer_prof;
    if (!ok) {
        fprintf(stderr,
                "cuda emulator: kernel %s <<<(%u,%u,%u), (%u,%u,%u)>>> faulted in "
                "block (%u,%u,%u): %s\n",
                name, grid.x, grid.y, grid.z, block.x, block.y, block.z, blockIdx.x, blockIdx.y,
                blockIdx.z, r.fault);
        st->devs[d].sticky = r.code;
    }
}

cudaError_t launch(dim3 grid, dim3 block, size_t shmem, cudaStream_t s, const char *name,
                   thread_body body, void *arg, void (*release)(void *))
{
    init_once();
    int d = dev_of(s);
    cudaError_t e = cudaSuccess;
    uint64_t threads = (uint64_t)block.x * block.y * block.z;
    if (!valid_dev(d))
        e = cudaErrorInvalidDevice;
    else if (cudaError_t se = sticky(d))
        e = se;
    else if (threads == 0 || threads > 1024 || block.z > 64 || grid.x == 0 || grid.y == 0 ||
             grid.z == 0 || grid.x > 0x7fffffffu || grid.y > 65535 || grid.z > 65535 ||
             shmem > 48 * 1024)
        e = cudaErrorInvalidConfiguration;
    if (e) {
        release(arg);
        return fail(e);
    }
    long k = ++st->nlaunch;
    tdc_emu_stream *ts = stream_of(s);
    if (st->trace)
        fprintf(stderr,
                "cuda emulator: launch %ld: %s <<<(%u,%u,%u), (%u,%u,%u)>>> on device %d "
                "stream %d\n",
                k, name, grid.x, grid.y, grid.z, block.x, block.y, block.z, d, ts->id);
    if (k == st->sticky_launch) {
        fprintf(stderr,
                "cuda emulator: launch %ld (%s) on device %d raises a sticky "
                "cudaErrorIllegalAddress (TDD_EMU_STICKY_LAUNCH)\n",
                k, name, d);
        st->devs[d].sticky = cudaErrorIllegalAddress;
        release(arg);
        return cudaSuccess; // as on a GPU: the fault shows at the next call
    }
    submit(ts, [=] {
        run_grid(d, k, grid, block, name, body, arg);
        release(arg);
    });
    return cudaSuccess;
}

} // namespace tdc_emu

// ------------------------------------------------------------------ runtime API

extern "C" {

void tdc_emu_configure_sms(int sms)
{
    if (sms > 0)
        cfg_sms = sms;
}

void tdc_emu_configure(int gpus, uint64_t memory_per_gpu)
{
    if (gpus > 0)
        cfg_gpus = gpus;
    if (memory_per_gpu)
        cfg_memory = memory_per_gpu;
}

uint64_t tdc_emu_bytes_in_use(int device)
{
    if (!valid_dev(device))
        return 0;
    std::lock_guard<std::mutex> g(st->mem);
    return st->devs[device].in_use;
}

void tdc_emu_raise_sticky(int device, cudaError_t e)
{
    if (valid_dev(device))
        st->devs[device].sticky = e;
}

void tdc_emu_defer_streams(int on)
{
    init_once();
    st->defer = on != 0;
}

int tdc_emu_streams_live(int device)
{
    init_once();
    std::lock_guard<std::recursive_mutex> g(st->dq);
    int n = 0;
    for (auto &kv : st->live)
        n += kv.second->device == device;
    return n;
}

long tdc_emu_streams_created(void)
{
    init_once();
    std::lock_guard<std::recursive_mutex> g(st->dq);
    return st->created;
}

cudaError_t cudaGetDeviceCount(int *count)
{
    init_once();
    *count = st->ndev;
    return st->ndev ? cudaSuccess : fail(cudaErrorNoDevice);
}

cudaError_t cudaGetDevice(int *device)
{
    *device = cur_dev;
    return cudaSuccess;
}

cudaError_t cudaSetDevice(int device)
{
    if (!valid_dev(device))
        return fail(cudaErrorInvalidDevice);
    cur_dev = device;
    if (cudaError_t e = sticky(device))
        return fail(e);
    return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *p, int device)
{
    if (!valid_dev(device))
        return fail(cudaErrorInvalidDevice);
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "tensordd CUDA emulator, device %d", device);
    p->totalGlobalMem = (size_t)st->devs[device].total;
    p->major = 9;
    p->minor = 0;
    p->multiProcessorCount = st->sms; // 2 by default: small grids (blocks run one by one)
    p->warpSize = 32;
    p->maxThreadsPerBlock = 1024;
    p->sharedMemPerBlock = 48 * 1024;
    return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int *value, enum cudaDeviceAttr attr, int device)
{
    if (!valid_dev(device))
        return fail(cudaErrorInvalidDevice);
    switch (attr) {
    case cudaDevAttrMultiProcessorCount:
        *value = st->sms;
        return cudaSuccess;
    case cudaDevAttrMemoryPoolsSupported:
        *value = 1;
        return cudaSuccess;
    }
    return fail(cudaErrorInvalidValue);
}

cudaError_t cudaDeviceSynchronize(void)
{
    if (!valid_dev(cur_dev))
        return fail(cudaErrorInvalidDevice);
    prof_sync("cudaDeviceSynchronize", cur_dev);
    drain_device(cur_dev, false);
    finish(&st->devs[cur_dev].legacy);
    if (cudaError_t e = sticky(cur_dev))
        return fail(e);
    return cudaSuccess;
}

cudaError_t cudaDeviceGetDefaultMemPool(cudaMemPool_t *pool, int device)
{
    if (!valid_dev(device))
        return fail(cudaErrorInvalidDevice);
    *pool = &st->devs[device].pool;
    return cudaSuccess;
}

cudaError_t cudaMemPoolSetAttribute(cudaMemPool_t pool, enum cudaMemPoolAttr attr, void *value)
{
    (void)value;
    return pool && attr == cudaMemPoolAttrReleaseThreshold ? cudaSuccess
                                                           : fail(cudaErrorInvalidValue);
}

cudaError_t cudaGetLastError(void)
{
    cudaError_t e = last_err;
    last_err = cudaSuccess;
    if (e == cudaSuccess && valid_dev(cur_dev))
        e = sticky(cur_dev);
    return e;
}

cudaError_t cudaPeekAtLastError(void)
{
    cudaError_t e = last_err;
    if (e == cudaSuccess && valid_dev(cur_dev))
        e = sticky(cur_dev);
    return e;
}

const char *cudaGetErrorName(cudaError_t e)
{
    switch (e) {
#define N(x)                                                                                       \
    case x:                                                                                        \
        return #x;
        N(cudaSuccess)
        N(cudaErrorInvalidValue)
        N(cudaErrorMemoryAllocation)
        N(cudaErrorInitializationError)
        N(cudaErrorInvalidConfiguration)
        N(cudaErrorInvalidDevicePointer)
        N(cudaErrorInvalidMemcpyDirection)
        N(cudaErrorInsufficientDriver)
        N(cudaErrorDevicesUnavailable)
        N(cudaErrorNoDevice)
        N(cudaErrorInvalidDevice)
        N(cudaErrorECCUncorrectable)
        N(cudaErrorInvalidResourceHandle)
        N(cudaErrorNotReady)
        N(cudaErrorIllegalAddress)
        N(cudaErrorLaunchOutOfResources)
        N(cudaErrorLaunchTimeout)
        N(cudaErrorHardwareStackError)
        N(cudaErrorIllegalInstruction)
        N(cudaErrorMisalignedAddress)
        N(cudaErrorInvalidPc)
        N(cudaErrorLaunchFailure)
        N(cudaErrorUnknown)
#undef N
    }
    return "cudaErrorUnknown";
}

const char *cudaGetErrorString(cudaError_t e)
{
    switch (e) {
    case cudaSuccess:
        return "no error";
    case cudaErrorInvalidValue:
        return "invalid argument";
    case cudaErrorMemoryAllocation:
        return "out of memory";
    case cudaErrorInvalidConfiguration:
        return "invalid configuration argument";
    case cudaErrorInvalidDevicePointer:
        return "invalid device pointer";
    case cudaErrorNoDevice:
        return "no CUDA-capable device is detected";
    case cudaErrorInvalidDevice:
        return "invalid device ordinal";
    case cudaErrorIllegalAddress:
        return "an illegal memory access was encountered";
    case cudaErrorLaunchFailure:
        return "unspecified launch failure";
    default:
        return cudaGetErrorName(e);
    }
}

cudaError_t cudaMallocAsync(void **p, size_t n, cudaStream_t s)
{
    init_once();
    return alloc_on(dev_of(s), p, n);
}

cudaError_t cudaMalloc(void **p, size_t n)
{
    return cudaMallocAsync(p, n, nullptr);
}

cudaError_t cudaFreeAsync(void *p, cudaStream_t s)
{
    init_once();
    int d = dev_of(s);
    if (!valid_dev(d))
        return fail(cudaErrorInvalidDevice);
    if (cudaError_t e = sticky(d)) {
        finish(stream_of(s));
        (void)free_on(p); // the context is gone with its memory
        return fail(e);
    }
    if (p && !is_device(p, 0))
        return fail(cudaErrorInvalidDevicePointer);
    submit(stream_of(s), [p] { (void)free_on(p); }); // after the stream's earlier work
    return cudaSuccess;
}

cudaError_t cudaFree(void *p)
{
    return cudaFreeAsync(p, nullptr);
}

cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes)
{
    if (!valid_dev(cur_dev))
        return fail(cudaErrorInvalidDevice);
    std::lock_guard<std::mutex> g(st->mem);
    *total_bytes = (size_t)st->devs[cur_dev].total;
    *free_bytes = (size_t)(st->devs[cur_dev].total - st->devs[cur_dev].in_use);
    return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind,
                            cudaStream_t s)
{
    int d;
    if (cudaError_t e = stream_device(s, &d))
        return fail(e);
    if (n == 0)
        return cudaSuccess;
    bool dd = is_device(dst, n), sd = is_device(src, n);
    bool ok = kind == cudaMemcpyHostToDevice     ? dd && !sd
              : kind == cudaMemcpyDeviceToHost   ? sd && !dd
              : kind == cudaMemcpyDeviceToDevice ? dd && sd
              : kind == cudaMemcpyHostToHost     ? !dd && !sd
                                                 : true;
    if (!ok) {
        fprintf(stderr,
                "cuda emulator: cudaMemcpy kind %d with %s destination and %s source "
                "(%zu bytes)\n",
                (int)kind, dd ? "device" : "host", sd ? "device" : "host", n);
        return fail(cudaErrorInvalidValue);
    }
    tdc_emu_stream *ts = stream_of(s);
    if (kind == cudaMemcpyDeviceToHost || (kind == cudaMemcpyDefault && sd && !dd)) {
        finish(ts); // into pageable memory: the copy waits for the stream's work
        if (cudaError_t e = sticky(d))
            return fail(e);
        if (!still_device(d, "cudaMemcpy", src, n))
            return fail(cudaErrorIllegalAddress);
        std::lock_guard<std::mutex> g(ts->m);
        memmove(dst, src, n);
        return cudaSuccess;
    }
    if (!sd && ts->deferred) { // from pageable memory: staged before the call returns
        std::shared_ptr<std::string> staged =
            std::make_shared<std::string>(static_cast<const char *>(src), n);
        submit(ts, [=] {
            if (!sticky(d) && still_device(d, "cudaMemcpy", dst, n)) {
                memmove(dst, staged->data(), n);
                mark_init(dst, n);
            }
        });
        return cudaSuccess;
    }
    submit(ts, [=] {
        if (!sticky(d) && (!dd || still_device(d, "cudaMemcpy", dst, n)) &&
            (!sd || still_device(d, "cudaMemcpy", src, n))) {
            memmove(dst, src, n);
            if (dd)
                mark_init(dst, n);
        }
    });
    return cudaSuccess;
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind)
{
    return cudaMemcpyAsync(dst, src, n, kind, nullptr);
}

cudaError_t cudaMemsetAsync(void *p, int value, size_t n, cudaStream_t s)
{
    int d;
    if (cudaError_t e = stream_device(s, &d))
        return fail(e);
    if (n && !is_device(p, n))
        return fail(cudaErrorInvalidValue);
    submit(stream_of(s), [=] {
        if (!sticky(d) && still_device(d, "cudaMemset", p, n)) {
            memset(p, value, n);
            mark_init(p, n);
        }
    });
    return cudaSuccess;
}

cudaError_t cudaMemset(void *p, int value, size_t n)
{
    return cudaMemsetAsync(p, value, n, nullptr);
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags)
{
    if (!valid_dev(cur_dev))
        return fail(cudaErrorInvalidDevice);
    if (cudaError_t e = sticky(cur_dev))
        return fail(e);
    tdc_emu_stream *ts = new tdc_emu_stream;
    ts->device = cur_dev;
    ts->blocking = !(flags & cudaStreamNonBlocking);
    std::lock_guard<std::recursive_mutex> g(st->dq);
    ts->id = st->next_id++;
    bool first = st->devs[cur_dev].streams_made++ == 0;
    ts->deferred = (st->defer && !(st->defer_later && first)) || ts->id == st->defer_stream;
    if (ts->deferred)
        st->any_deferred = true;
    st->live[ts->id] = ts;
    st->created++;
    if (st->trace)
        fprintf(stderr, "cuda emulator: stream %d created on device %d (%zu live)\n", ts->id,
                ts->device, st->live.size());
    *s = ts;
    return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t *s)
{
    return cudaStreamCreateWithFlags(s, cudaStreamDefault);
}

cudaError_t cudaStreamDestroy(cudaStream_t s)
{
    if (!s)
        return fail(cudaErrorInvalidResourceHandle);
    std::lock_guard<std::recursive_mutex> g(st->dq);
    if (!st->live.count(s->id))
        return fail(cudaErrorInvalidResourceHandle);
    finish(s); // queued work still completes, as it does on a GPU
    st->live.erase(s->id);
    if (st->trace)
        fprintf(stderr, "cuda emulator: stream %d destroyed on device %d (%zu live)\n", s->id,
                s->device, st->live.size());
    delete s;
    return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t s)
{
    init_once();
    int d = dev_of(s);
    if (!valid_dev(d))
        return fail(cudaErrorInvalidDevice);
    prof_sync("cudaStreamSynchronize", d);
    finish(stream_of(s));
    if (cudaError_t e = sticky(d))
        return fail(e);
    return cudaSuccess;
}

cudaError_t cudaStreamQuery(cudaStream_t s)
{
    int d;
    if (cudaError_t e = stream_device(s, &d))
        return fail(e);
    tdc_emu_stream *ts = stream_of(s);
    if (ts->deferred) {
        std::lock_guard<std::recursive_mutex> g(st->dq);
        if (ts->done < ts->issued)
            return cudaErrorNotReady; // not an error: nothing is recorded
    } else {
        finish(ts);
    }
    return cudaSuccess;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags)
{
    (void)flags;
    if (!e)
        return fail(cudaErrorInvalidResourceHandle);
    int d = dev_of(s);
    if (!valid_dev(d))
        return fail(cudaErrorInvalidDevice);
    if (!e->recorded || e->stream == 0)
        return cudaSuccess; // nothing recorded, or recorded where work runs at once
    int id = e->stream;
    uint64_t seq = e->seq; // the record at the time of the call, as CUDA takes it
    submit(stream_of(s), [id, seq] { force(id, seq); });
    return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned flags)
{
    (void)flags;
    *e = new tdc_emu_event{cur_dev, false, {0, 0}, 0, 0};
    return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t *e)
{
    return cudaEventCreateWithFlags(e, cudaEventDefault);
}

cudaError_t cudaEventDestroy(cudaEvent_t e)
{
    delete e; // a wait already issued keeps its own copy of the record
    return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s)
{
    if (!e)
        return fail(cudaErrorInvalidResourceHandle);
    int d;
    if (cudaError_t err = stream_device(s, &d))
        return fail(err);
    tdc_emu_stream *ts = stream_of(s);
    e->device = d;
    e->recorded = true;
    if (ts->deferred) {
        std::lock_guard<std::recursive_mutex> g(st->dq);
        e->stream = ts->id;
        e->seq = ts->issued;
    } else {
        std::lock_guard<std::mutex> g(ts->m); // after the stream's earlier work
        e->stream = 0;
        e->seq = 0;
    }
    clock_gettime(CLOCK_MONOTONIC, &e->at);
    return cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t e)
{
    if (!e)
        return fail(cudaErrorInvalidResourceHandle);
    prof_sync("cudaEventSynchronize", e->device);
    if (e->recorded && e->stream)
        force(e->stream, e->seq);
    return sticky(e->device);
}

cudaError_t cudaEventQuery(cudaEvent_t e)
{
    if (!e)
        return fail(cudaErrorInvalidResourceHandle);
    if (cudaError_t err = sticky(e->device))
        return err;
    if (e->recorded && e->stream) {
        std::lock_guard<std::recursive_mutex> g(st->dq);
        auto it = st->live.find(e->stream);
        if (it != st->live.end() && it->second->done < e->seq)
            return cudaErrorNotReady;
    }
    return cudaSuccess;
}

cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b)
{
    if (!a || !b || !a->recorded || !b->recorded)
        return fail(cudaErrorInvalidResourceHandle);
    *ms = (float)((double)(b->at.tv_sec - a->at.tv_sec) * 1e3 +
                  (double)(b->at.tv_nsec - a->at.tv_nsec) * 1e-6);
    return cudaSuccess;
}

// ------------------------------------------------------------------ cuBLAS on OpenBLAS

struct cublasContext {
    int device;
    cudaStream_t stream;
    bool tf32; // cublasSetMathMode(CUBLAS_TF32_TENSOR_OP_MATH): float GEMMs in TF32
};

cublasStatus_t tdc_emu_cublas_create(cublasHandle_t *h)
{
    if (!valid_dev(cur_dev))
        return CUBLAS_STATUS_NOT_INITIALIZED;
    *h = new cublasContext{cur_dev, nullptr, false};
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t tdc_emu_cublas_destroy(cublasHandle_t h)
{
    delete h;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t tdc_emu_cublas_set_stream(cublasHandle_t h, cudaStream_t s)
{
    if (!h)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    h->stream = s;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t tdc_emu_cublas_set_math_mode(cublasHandle_t h, cublasMath_t mode)
{
    if (!h)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    if (mode != CUBLAS_DEFAULT_MATH && mode != CUBLAS_TF32_TENSOR_OP_MATH)
        return CUBLAS_STATUS_INVALID_VALUE;
    h->tf32 = mode == CUBLAS_TF32_TENSOR_OP_MATH;
    return CUBLAS_STATUS_SUCCESS;
}

const char *tdc_emu_cublas_status_string(cublasStatus_t s)
{
    switch (s) {
    case CUBLAS_STATUS_SUCCESS:
        return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED:
        return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED:
        return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE:
        return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_EXECUTION_FAILED:
        return "CUBLAS_STATUS_EXECUTION_FAILED";
    default:
        return "CUBLAS_STATUS_INTERNAL_ERROR";
    }
}

} // extern "C"

namespace
{
// Elements a column-major rows x cols operand at leading dimension ld spans.
size_t span(int rows, int cols, int ld)
{
    return rows == 0 || cols == 0 ? 0 : (size_t)ld * (size_t)(cols - 1) + (size_t)rows;
}

// cuBLAS's argument checks, and every operand in device memory.
cublasStatus_t gemm_check(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m,
                          int n, int k, const void *a, int lda, long long sa, const void *b,
                          int ldb, long long sb, const void *c, int ldc, long long sc, int batch,
                          size_t ea = 4, size_t eb = 4, size_t ec = 4)
{
    if (!h)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    int ar = ta == CUBLAS_OP_N ? m : k, ac = ta == CUBLAS_OP_N ? k : m;
    int br = tb == CUBLAS_OP_N ? k : n, bc = tb == CUBLAS_OP_N ? n : k;
    if (m < 0 || n < 0 || k < 0 || batch < 0 || lda < std::max(1, ar) || ldb < std::max(1, br) ||
        ldc < std::max(1, m))
        return CUBLAS_STATUS_INVALID_VALUE;
    for (int i = 0; i < (batch > 0 ? 1 : 0) + (batch > 1 ? 1 : 0); i++) {
        long long at = i ? (long long)(batch - 1) : 0; // the first and last matrices
        if (!is_device((const char *)a + at * sa * (long long)ea, span(ar, ac, lda) * ea) ||
            !is_device((const char *)b + at * sb * (long long)eb, span(br, bc, ldb) * eb) ||
            !is_device((const char *)c + at * sc * (long long)ec, span(m, n, ldc) * ec)) {
            fprintf(stderr, "cuda emulator: cuBLAS GEMM operand outside device memory\n");
            return CUBLAS_STATUS_EXECUTION_FAILED;
        }
    }
    return CUBLAS_STATUS_SUCCESS;
}

CBLAS_TRANSPOSE tr(cublasOperation_t o)
{
    return o == CUBLAS_OP_N ? CblasNoTrans : CblasTrans;
}

// Element sizes and conversions of the types GemmEx takes (f16 and bf16 rounded to
// nearest even, as the tensor cores' epilogue rounds).
size_t type_size(cudaDataType t)
{
    return t == CUDA_R_32F ? 4 : t == CUDA_R_16F || t == CUDA_R_16BF ? 2 : 0;
}

float load_as_float(const void *p, size_t i, cudaDataType t)
{
    if (t == CUDA_R_32F)
        return ((const float *)p)[i];
    uint16_t h = ((const uint16_t *)p)[i];
    uint32_t b;
    if (t == CUDA_R_16BF) {
        b = (uint32_t)h << 16;
    } else {
        uint32_t s = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
        if (e == 0) {
            float v = (float)m * (1.0f / 16777216.0f);
            return s ? -v : v;
        }
        b = e == 31 ? s | 0x7f800000u | (m << 13) : s | ((e + 112u) << 23) | (m << 13);
    }
    float f;
    memcpy(&f, &b, sizeof f);
    return f;
}

void store_from_float(void *p, size_t i, cudaDataType t, float f)
{
    if (t == CUDA_R_32F) {
        ((float *)p)[i] = f;
        return;
    }
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    uint16_t out;
    if (t == CUDA_R_16BF) {
        if ((x & 0x7fffffffu) > 0x7f800000u)
            out = (uint16_t)((x >> 16) | 0x40u);
        else
            out = (uint16_t)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
    } else {
        uint32_t sign = (x >> 16) & 0x8000u, ax = x & 0x7fffffffu, h;
        if (ax >= 0x7f800000u) {
            h = ax > 0x7f800000u ? 0x7e00u : 0x7c00u;
        } else if (ax >= 0x477ff000u) {
            h = 0x7c00u;
        } else if (ax < 0x38800000u) {
            float a;
            memcpy(&a, &ax, sizeof a);
            h = (uint32_t)lrintf(a * 16777216.0f);
        } else {
            uint32_t mm = ax & 0x7fffffu, rest = mm & 0x1fffu;
            h = (((ax >> 23) - 112u) << 10) | (mm >> 13);
            if (rest > 0x1000u || (rest == 0x1000u && (h & 1u)))
                h++;
        }
        out = (uint16_t)(sign | h);
    }
    ((uint16_t *)p)[i] = out;
}

// TF32 as the tensor cores take a float: 10 mantissa bits, to nearest, ties away from zero.
float to_tf32(float f)
{
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    if ((x & 0x7f800000u) != 0x7f800000u) { // finite
        x += 0x1000u;
        x &= 0xffffe000u;
    }
    memcpy(&f, &x, sizeof f);
    return f;
}

// A column-major rows x cols operand (leading dimension ld) of type t as dense floats (the
// transpose flag still applies; ld becomes rows), TF32-rounded when asked.
std::vector<float> widen(const void *p, cudaDataType t, int rows, int cols, int ld, bool tf32)
{
    std::vector<float> w((size_t)rows * (size_t)cols);
    for (int j = 0; j < cols; j++)
        for (int i = 0; i < rows; i++) {
            float v = load_as_float(p, (size_t)j * (size_t)ld + (size_t)i, t);
            w[(size_t)j * (size_t)rows + (size_t)i] = tf32 ? to_tf32(v) : v;
        }
    return w;
}

// One GEMM of any of the types, accumulated in float (OpenBLAS's sgemm) and stored once.
void gemm_one(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, float al,
              const void *a, cudaDataType at, int lda, const void *b, cudaDataType bt, int ldb,
              float be, void *c, cudaDataType ct, int ldc, bool tf32)
{
    int ar = ta == CUBLAS_OP_N ? m : k, ac = ta == CUBLAS_OP_N ? k : m;
    int br = tb == CUBLAS_OP_N ? k : n, bc = tb == CUBLAS_OP_N ? n : k;
    if (at == CUDA_R_32F && bt == CUDA_R_32F && ct == CUDA_R_32F && !tf32) {
        cblas_sgemm(CblasColMajor, tr(ta), tr(tb), m, n, k, al, (const float *)a, lda,
                    (const float *)b, ldb, be, (float *)c, ldc);
        return;
    }
    std::vector<float> wa = widen(a, at, ar, ac, lda, tf32), wb = widen(b, bt, br, bc, ldb, tf32),
                       wc((size_t)m * (size_t)n, 0.0f);
    if (be != 0.0f)
        wc = widen(c, ct, m, n, ldc, false);
    cblas_sgemm(CblasColMajor, tr(ta), tr(tb), m, n, k, al, wa.data(), ar > 0 ? ar : 1, wb.data(),
                br > 0 ? br : 1, be, wc.data(), m > 0 ? m : 1);
    for (int j = 0; j < n; j++)
        for (int i = 0; i < m; i++)
            store_from_float(c, (size_t)j * (size_t)ldc + (size_t)i, ct,
                             wc[(size_t)j * (size_t)m + (size_t)i]);
}
} // namespace

extern "C" cublasStatus_t
tdc_emu_cublas_sgemm_strided_batched(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb,
                                     int m, int n, int k, const float *alpha, const float *a,
                                     int lda, long long sa, const float *b, int ldb, long long sb,
                                     const float *beta, float *c, int ldc, long long sc, int batch)
{
    init_once();
    cublasStatus_t s = gemm_check(h, ta, tb, m, n, k, a, lda, sa, b, ldb, sb, c, ldc, sc, batch);
    if (s != CUBLAS_STATUS_SUCCESS)
        return s;
    if (sticky(h->device))
        return CUBLAS_STATUS_EXECUTION_FAILED;
    tdc_emu_stream *ts = h->stream ? h->stream : &st->devs[h->device].legacy;
    float al = *alpha, be = *beta; // host pointer mode: read at the call
    int d = h->device;
    submit(ts, [=] {
        if (sticky(d))
            return;
        // operands freed before a deferred GEMM runs: the fault a GPU would take
        if (gemm_check(h, ta, tb, m, n, k, a, lda, sa, b, ldb, sb, c, ldc, sc, batch) !=
            CUBLAS_STATUS_SUCCESS) {
            fprintf(stderr, "cuda emulator: deferred cuBLAS GEMM on freed memory\n");
            st->devs[d].sticky = cudaErrorIllegalAddress;
            return;
        }
        for (int i = 0; i < batch; i++)
            gemm_one(ta, tb, m, n, k, al, a + i * sa, CUDA_R_32F, lda, b + i * sb, CUDA_R_32F, ldb,
                     be, c + i * sc, CUDA_R_32F, ldc, h->tf32);
        for (int i = 0; i < batch; i++)
            mark_init(c + i * sc, span(m, n, ldc) * sizeof(float));
        if (prof_on) { // cuBLAS's traffic taken as the least its operands need
            prof_launch p;
            uint64_t b = (uint64_t)batch * 4, rd = b * ((uint64_t)m * k + (uint64_t)k * n),
                     wr = b * (uint64_t)m * n;
            if (be != 0.0f)
                rd += wr;
            p.bytes[0] = p.uniq[0] = rd;
            p.bytes[1] = p.uniq[1] = wr;
            p.sectors[0] = p.ideal[0] = (rd + 31) / 32;
            p.sectors[1] = p.ideal[1] = (wr + 31) / 32;
            p.flops = (uint64_t)batch * (uint64_t)m * n * (2 * (uint64_t)k + (be != 0.0f));
            prof_write(0, d, h->tf32 ? "cublasSgemm (TF32)" : "cublasSgemm", dim3(), dim3(), p);
        }
    });
    return CUBLAS_STATUS_SUCCESS;
}

// GemmEx: f32, f16 and bf16 operands (A and B of one type), C of A's type or f32, computed
// in f32 (CUBLAS_COMPUTE_32F; _FAST_TF32 rounds the inputs to TF32 first, as does a handle
// in TF32 math mode for f32 operands).
extern "C" cublasStatus_t tdc_emu_cublas_gemm_strided_batched_ex(
    cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
    const void *alpha, const void *a, cudaDataType at, int lda, long long sa, const void *b,
    cudaDataType bt, int ldb, long long sb, const void *beta, void *c, cudaDataType ct, int ldc,
    long long sc, int batch, cublasComputeType_t compute, cublasGemmAlgo_t algo)
{
    init_once();
    (void)algo;
    size_t ea = type_size(at), eb = type_size(bt), ec = type_size(ct);
    if (!ea || at != bt || (ct != at && ct != CUDA_R_32F) ||
        (compute != CUBLAS_COMPUTE_32F && compute != CUBLAS_COMPUTE_32F_FAST_TF32))
        return CUBLAS_STATUS_NOT_SUPPORTED;
    cublasStatus_t s =
        gemm_check(h, ta, tb, m, n, k, a, lda, sa, b, ldb, sb, c, ldc, sc, batch, ea, eb, ec);
    if (s != CUBLAS_STATUS_SUCCESS)
        return s;
    if (sticky(h->device))
        return CUBLAS_STATUS_EXECUTION_FAILED;
    tdc_emu_stream *ts = h->stream ? h->stream : &st->devs[h->device].legacy;
    float al = *(const float *)alpha, be = *(const float *)beta;
    bool tf32 = at == CUDA_R_32F && (compute == CUBLAS_COMPUTE_32F_FAST_TF32 || h->tf32);
    int d = h->device;
    submit(ts, [=] {
        if (sticky(d))
            return;
        if (gemm_check(h, ta, tb, m, n, k, a, lda, sa, b, ldb, sb, c, ldc, sc, batch, ea, eb, ec) !=
            CUBLAS_STATUS_SUCCESS) {
            fprintf(stderr, "cuda emulator: deferred cuBLAS GEMM on freed memory\n");
            st->devs[d].sticky = cudaErrorIllegalAddress;
            return;
        }
        for (int i = 0; i < batch; i++)
            gemm_one(ta, tb, m, n, k, al, (const char *)a + i * sa * (long long)ea, at, lda,
                     (const char *)b + i * sb * (long long)eb, bt, ldb, be,
                     (char *)c + i * sc * (long long)ec, ct, ldc, tf32);
        for (int i = 0; i < batch; i++)
            mark_init((char *)c + i * sc * (long long)ec, span(m, n, ldc) * ec);
        if (prof_on) {
            prof_launch p;
            uint64_t bt_ = (uint64_t)batch,
                     rd = bt_ * ((uint64_t)m * k * ea + (uint64_t)k * n * eb),
                     wr = bt_ * (uint64_t)m * n * ec;
            if (be != 0.0f)
                rd += wr;
            p.bytes[0] = p.uniq[0] = rd;
            p.bytes[1] = p.uniq[1] = wr;
            p.sectors[0] = p.ideal[0] = (rd + 31) / 32;
            p.sectors[1] = p.ideal[1] = (wr + 31) / 32;
            p.flops = bt_ * (uint64_t)m * n * (2 * (uint64_t)k + (be != 0.0f));
            prof_write(0, d, tf32 ? "cublasGemmEx (TF32)" : "cublasGemmEx", dim3(), dim3(), p);
        }
    });
    return CUBLAS_STATUS_SUCCESS;
}

extern "C" cublasStatus_t
tdc_emu_cublas_gemm_ex(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n,
                       int k, const void *alpha, const void *a, cudaDataType at, int lda,
                       const void *b, cudaDataType bt, int ldb, const void *beta, void *c,
                       cudaDataType ct, int ldc, cublasComputeType_t compute, cublasGemmAlgo_t algo)
{
    return tdc_emu_cublas_gemm_strided_batched_ex(h, ta, tb, m, n, k, alpha, a, at, lda, 0, b, bt,
                                                  ldb, 0, beta, c, ct, ldc, 0, 1, compute, algo);
}

extern "C" cublasStatus_t tdc_emu_cublas_sgemm(cublasHandle_t h, cublasOperation_t ta,
                                               cublasOperation_t tb, int m, int n, int k,
                                               const float *alpha, const float *a, int lda,
                                               const float *b, int ldb, const float *beta, float *c,
                                               int ldc)
{
    return tdc_emu_cublas_sgemm_strided_batched(h, ta, tb, m, n, k, alpha, a, lda, 0, b, ldb, 0,
                                                beta, c, ldc, 0, 1);
}

namespace tdc_emu
{
void atomic_access(const void *p, size_t n)
{
    mem_access(p, n, true, true, true, __builtin_return_address(0));
}

void flops(uint64_t n)
{
    if (prof)
        prof->flops += n;
}
} // namespace tdc_emu

// The instrumentation's entry points (kernels.cu is compiled with -fsanitize=thread, linked
// without its library): each load and store of the kernels, checked by mem_access.
extern "C" {
#define TDC_EMU_ACCESS(n)                                                                          \
    void __tsan_read##n(void *p)                                                                   \
    {                                                                                              \
        mem_access(p, n, false, false, true, __builtin_return_address(0));                         \
    }                                                                                              \
    void __tsan_write##n(void *p)                                                                  \
    {                                                                                              \
        mem_access(p, n, true, false, true, __builtin_return_address(0));                          \
    }                                                                                              \
    void __tsan_unaligned_read##n(void *p)                                                         \
    {                                                                                              \
        mem_access(p, n, false, false, true, __builtin_return_address(0));                         \
    }                                                                                              \
    void __tsan_unaligned_write##n(void *p)                                                        \
    {                                                                                              \
        mem_access(p, n, true, false, true, __builtin_return_address(0));                          \
    }
TDC_EMU_ACCESS(1)
TDC_EMU_ACCESS(2)
TDC_EMU_ACCESS(4)
TDC_EMU_ACCESS(8)
TDC_EMU_ACCESS(16)
#undef TDC_EMU_ACCESS
void __tsan_read_range(void *p, size_t n)
{
    mem_access(p, n, false, false, true, __builtin_return_address(0));
}
void __tsan_write_range(void *p, size_t n)
{
    mem_access(p, n, true, false, true, __builtin_return_address(0));
}
void __tsan_init(void)
{
}
void __tsan_func_entry(void *)
{
}
void __tsan_func_exit(void)
{
}
void __tsan_vptr_update(void **, void *)
{
}
void __tsan_vptr_read(void **)
{
}
}
