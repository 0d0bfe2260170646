// gloo_shim.cc -- Gloo behind a C interface (gloo_shim.h): rendezvous through a
// FileStore, a full mesh of TCP pairs, and Gloo's allreduce, broadcast and allgather.
// Exceptions stop here: each becomes a TD_E* code and a message.
#include "gloo_shim.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <memory>
#include <mutex>
#include <new>
#include <string>

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/transport/tcp/device.h>

#include "td_error.h"

struct tdd_gloo {
    std::shared_ptr<gloo::rendezvous::Context> ctx;
    std::chrono::milliseconds timeout;
};

namespace
{

// One TCP device (and its event loop thread) for the process, made at the first group:
// every group's pairs share it.
std::mutex dev_mu;
std::shared_ptr<gloo::transport::Device> dev;
std::string dev_address;

void say(char *msg, size_t n, const char *what)
{
    if (msg && n)
        snprintf(msg, n, "%s", what);
}

// The exception being handled, as a code and a message. Gloo's IoException is a
// peer that closed or did not answer in time.
int caught(char *msg, size_t n)
{
    try {
        throw;
    } catch (const gloo::IoException &e) {
        say(msg, n, e.what());
        return TD_ETIMEOUT;
    } catch (const std::bad_alloc &) {
        say(msg, n, "out of host memory");
        return TD_ERESOURCE_EXHAUSTED;
    } catch (const std::exception &e) {
        say(msg, n, e.what());
        return TD_EINTERNAL;
    } catch (...) {
        say(msg, n, "an unknown exception");
        return TD_EINTERNAL;
    }
}

std::shared_ptr<gloo::transport::Device> device_for(const char *address)
{
    std::lock_guard<std::mutex> lock(dev_mu);
    if (!dev) {
        gloo::transport::tcp::attr attr(address);
        dev = gloo::transport::tcp::CreateDevice(attr);
        dev_address = address;
    } else if (dev_address != address) {
        throw std::runtime_error("the group address changed: " + dev_address + " is in use");
    }
    return dev;
}

template <typename T> gloo::AllreduceOptions::Func reducer(tdd_gloo_op op)
{
    using fn_t = void (*)(void *, const void *, const void *, size_t);
    fn_t mx = &gloo::max<T>, sm = &gloo::sum<T>;
    return op == TDD_GLOO_MAX ? mx : sm;
}

template <typename T> void allreduce_as(tdd_gloo *g, void *buf, size_t count, tdd_gloo_op op)
{
    gloo::AllreduceOptions o(g->ctx);
    o.setOutput(static_cast<T *>(buf), count);
    o.setReduceFunction(reducer<T>(op));
    o.setTimeout(g->timeout);
    gloo::allreduce(o);
}

} // namespace

// Removes this rank's keys from the store's directory, and the directory once empty.
static void forget_keys(gloo::rendezvous::FileStore *store, const char *dir)
{
    if (!store)
        return;
    for (const std::string &p : store->getAllKeyFilePaths())
        unlink(p.c_str());
    rmdir(dir); // the last rank's succeeds
}

extern "C" tdd_gloo *tdd_gloo_connect(const char *address, const char *dir, int rank, int size,
                                      long timeout_ms, int *code, char *msg, size_t msglen)
{
    tdd_gloo *g = nullptr;
    std::unique_ptr<gloo::rendezvous::FileStore> store;
    try {
        if (mkdir(dir, 0700) && errno != EEXIST) {
            std::string why = std::string("cannot create ") + dir + ": " + strerror(errno);
            throw std::runtime_error(why);
        }
        g = new tdd_gloo;
        g->timeout = std::chrono::milliseconds(timeout_ms);
        auto d = device_for(address);
        store.reset(new gloo::rendezvous::FileStore(dir));
        g->ctx = std::make_shared<gloo::rendezvous::Context>(rank, size);
        g->ctx->setTimeout(g->timeout);
        g->ctx->connectFullMesh(*store, d);
        // Every rank has read every address once all are past this: the keys can go.
        gloo::BarrierOptions b(g->ctx);
        b.setTimeout(g->timeout);
        gloo::barrier(b);
        forget_keys(store.get(), dir);
        *code = 0;
        return g;
    } catch (...) {
        *code = caught(msg, msglen);
        // A failed group leaves nothing behind: its name can be used again.
        try {
            forget_keys(store.get(), dir);
        } catch (...) {
        }
        delete g;
        return nullptr;
    }
}

extern "C" void tdd_gloo_free(tdd_gloo *g)
{
    try {
        delete g;
    } catch (...) {
    }
}

extern "C" int tdd_gloo_allreduce(tdd_gloo *g, void *buf, size_t count, tdd_gloo_dtype dt,
                                  tdd_gloo_op op, char *msg, size_t msglen)
{
    if (count == 0)
        return 0;
    try {
        switch (dt) {
        case TDD_GLOO_F32:
            allreduce_as<float>(g, buf, count, op);
            break;
        case TDD_GLOO_F64:
            allreduce_as<double>(g, buf, count, op);
            break;
        case TDD_GLOO_I32:
            allreduce_as<int32_t>(g, buf, count, op);
            break;
        case TDD_GLOO_I64:
            allreduce_as<int64_t>(g, buf, count, op);
            break;
        }
        return 0;
    } catch (...) {
        return caught(msg, msglen);
    }
}

extern "C" int tdd_gloo_broadcast(tdd_gloo *g, void *buf, size_t nbytes, int root, char *msg,
                                  size_t msglen)
{
    if (nbytes == 0)
        return 0;
    try {
        gloo::BroadcastOptions o(g->ctx);
        o.setOutput(static_cast<char *>(buf), nbytes);
        o.setRoot(root);
        o.setTimeout(g->timeout);
        gloo::broadcast(o);
        return 0;
    } catch (...) {
        return caught(msg, msglen);
    }
}

extern "C" int tdd_gloo_allgather(tdd_gloo *g, const void *in, void *out, size_t nbytes, char *msg,
                                  size_t msglen)
{
    if (nbytes == 0)
        return 0;
    try {
        gloo::AllgatherOptions o(g->ctx);
        o.setInput(const_cast<char *>(static_cast<const char *>(in)), nbytes);
        o.setOutput(static_cast<char *>(out), nbytes * static_cast<size_t>(g->ctx->size));
        o.setTimeout(g->timeout);
        gloo::allgather(o);
        return 0;
    } catch (...) {
        return caught(msg, msglen);
    }
}
