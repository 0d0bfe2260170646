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
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <new>
#include <stdexcept>
#include <string>
#include <thread>

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

// A context whose connections are made in two steps (tdd_gloo_prepare, tdd_gloo_finish),
// as gloo::rendezvous::Context::connectFullMesh makes them in one with a store.
class MeshContext : public gloo::Context
{
  public:
    MeshContext(int rank_, int size_) : gloo::Context(rank_, size_)
    {
    }

    // This rank's address for each peer: size entries of a 4-byte length and the bytes
    // (empty for this rank).
    std::vector<char> prepare(const std::shared_ptr<gloo::transport::Device> &dev)
    {
        auto tc = dev->createContext(rank, size);
        tc->setTimeout(getTimeout());
        std::vector<char> blob;
        for (int j = 0; j < size; j++) {
            std::vector<char> b;
            if (j != rank)
                b = tc->createPair(j)->address().bytes();
            uint32_t n = static_cast<uint32_t>(b.size());
            const char *np = reinterpret_cast<const char *>(&n);
            blob.insert(blob.end(), np, np + sizeof n);
            blob.insert(blob.end(), b.begin(), b.end());
        }
        device_ = dev;
        transportContext_ = std::move(tc);
        return blob;
    }

    // addrs[j]: rank j's address for this rank (entry `rank` of rank j's prepare()).
    void finish(const void *const *addrs, const size_t *lens)
    {
        for (int j = 0; j < size; j++) {
            if (j == rank)
                continue;
            auto &pair = transportContext_->getPair(j);
            if (lens[j] != pair->address().bytes().size())
                throw std::invalid_argument("rank " + std::to_string(j) +
                                            "'s address for this rank is not one (" +
                                            std::to_string(lens[j]) + " bytes)");
            const char *p = static_cast<const char *>(addrs[j]);
            pair->connect(std::vector<char>(p, p + lens[j]));
        }
    }
};

struct tdd_gloo {
    std::shared_ptr<gloo::Context> ctx;
    std::shared_ptr<MeshContext> mesh; // two-step formation only
    std::chrono::milliseconds timeout;
};

namespace
{

// One TCP device (and its event loop thread) for the process, made at the first group:
// every group's pairs share it.
std::mutex dev_mu;
std::shared_ptr<gloo::transport::Device> dev;
std::string dev_address;

// Closing a group's connections waits for the TCP device's event loop to let go of each
// (about 10 ms a peer here): tdd_gloo_free hands groups to this thread, so the daemon's
// loop thread never waits. Declared after dev: destroyed (drained and joined) before it.
class Reaper
{
  public:
    void push(tdd_gloo *g)
    {
        {
            std::lock_guard<std::mutex> lock(mu_);
            if (!th_.joinable())
                th_ = std::thread(&Reaper::run, this);
            q_.push_back(g);
        }
        cv_.notify_one();
    }
    ~Reaper()
    {
        {
            std::lock_guard<std::mutex> lock(mu_);
            stop_ = true;
        }
        cv_.notify_one();
        if (th_.joinable())
            th_.join();
    }

  private:
    void run()
    {
        for (;;) {
            tdd_gloo *g;
            {
                std::unique_lock<std::mutex> lock(mu_);
                cv_.wait(lock, [this] { return stop_ || !q_.empty(); });
                if (q_.empty())
                    return;
                g = q_.front();
                q_.pop_front();
            }
            try {
                delete g;
            } catch (...) {
            }
        }
    }
    std::mutex mu_;
    std::condition_variable cv_;
    std::deque<tdd_gloo *> q_;
    bool stop_ = false;
    std::thread th_;
};
Reaper reaper;

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

// The directory store with --group-timeout on every wait: Gloo's rendezvous reads the
// other ranks' keys with get(), which waits through wait(keys), whose timeout is Gloo's
// default (30 s) whatever the context's: a rank other than 0 whose rank 0 never came
// waited 30 s, not --group-timeout.
class TimedFileStore : public gloo::rendezvous::FileStore
{
  public:
    TimedFileStore(const std::string &path, std::chrono::milliseconds timeout)
        : gloo::rendezvous::FileStore(path), timeout_(timeout)
    {
    }
    using gloo::rendezvous::FileStore::wait;
    void wait(const std::vector<std::string> &keys) override
    {
        gloo::rendezvous::FileStore::wait(keys, timeout_);
    }

  private:
    std::chrono::milliseconds timeout_;
};

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
        store.reset(new TimedFileStore(dir, g->timeout));
        auto rc = std::make_shared<gloo::rendezvous::Context>(rank, size);
        g->ctx = rc;
        rc->setTimeout(g->timeout);
        rc->connectFullMesh(*store, d);
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

extern "C" tdd_gloo *tdd_gloo_prepare(const char *address, int rank, int size, long timeout_ms,
                                      void **blob, size_t *blob_len, int *code, char *msg,
                                      size_t msglen)
{
    tdd_gloo *g = nullptr;
    try {
        g = new tdd_gloo;
        g->timeout = std::chrono::milliseconds(timeout_ms);
        g->mesh = std::make_shared<MeshContext>(rank, size);
        g->mesh->setTimeout(g->timeout);
        g->ctx = g->mesh;
        std::vector<char> b = g->mesh->prepare(device_for(address));
        *blob = malloc(b.size() ? b.size() : 1);
        if (!*blob)
            throw std::bad_alloc();
        memcpy(*blob, b.data(), b.size());
        *blob_len = b.size();
        *code = 0;
        return g;
    } catch (...) {
        *code = caught(msg, msglen);
        delete g;
        return nullptr;
    }
}

extern "C" int tdd_gloo_finish(tdd_gloo *g, const void *const *addrs, const size_t *lens, char *msg,
                               size_t msglen)
{
    try {
        g->mesh->finish(addrs, lens);
        // Answered once every rank is connected, as a rendezvous through the store is.
        gloo::BarrierOptions b(g->ctx);
        b.setTimeout(g->timeout);
        gloo::barrier(b);
        return 0;
    } catch (const std::invalid_argument &e) {
        say(msg, msglen, e.what());
        return TD_EINVALID_ARGUMENT;
    } catch (...) {
        return caught(msg, msglen);
    }
}

extern "C" void tdd_gloo_free(tdd_gloo *g)
{
    if (!g)
        return;
    try {
        reaper.push(g);
    } catch (...) { // no thread: close them here
        delete g;
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
