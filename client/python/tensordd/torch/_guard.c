/* The device guard of torch's PrivateUse1 device type, for tensordd.torch.
 *
 * Torch's autograd engine (AccumulateGrad, its per-device ready queues) and Python
 * indexing ask c10 for the DeviceGuardImpl of a tensor's device type, and torch 1.13
 * registers none for PrivateUse1 ("PyTorch is not linked with support for
 * privateuseone devices"); its C++ headers are not installed here (no libtorch-dev).
 * tensordd's device has no current-device state and no streams (the daemon orders a
 * session's requests), so a no-op guard is exact: this one is Meta's no-op guard with
 * the slots that name the device type (type, exchangeDevice, getDevice, getStream,
 * exchangeStream) and deviceCount replaced. tensordd/torch/_guard.py checks the
 * vtable's layout (torch 1.13's 19 slots) before calling tdd_guard_register. Plain C:
 * c10::Device is {int8 type, int8 index} and c10::Stream {Device, int64 id}, both
 * trivially copyable, so they pass and return in registers as these structs do.
 */
#include <stdint.h>
#include <string.h>

enum { SLOTS = 19, TDD_MAX_DEVICES = 16 };

struct tdd_device {
    int8_t type;
    int8_t index;
};

struct tdd_stream {
    struct tdd_device device;
    int64_t id;
};

static int8_t pu1_type;
typedef void (*slot_fn)(void);

static slot_fn vtable[2 + SLOTS];
static struct {
    slot_fn *vptr;
} guard;

static int8_t g_type(const void *self)
{
    (void)self;
    return pu1_type;
}

static struct tdd_device g_device(const void *self)
{
    (void)self;
    return (struct tdd_device){pu1_type, -1};
}

static struct tdd_device g_exchange_device(const void *self, struct tdd_device d)
{
    (void)d;
    return g_device(self);
}

static struct tdd_stream g_stream(const void *self, struct tdd_device d)
{
    (void)self;
    (void)d;
    return (struct tdd_stream){{pu1_type, -1}, 0};
}

static struct tdd_stream g_exchange_stream(const void *self, struct tdd_stream s)
{
    (void)s;
    return g_stream(self, s.device);
}

static int8_t g_device_count(const void *self)
{
    (void)self;
    return TDD_MAX_DEVICES;
}

int tdd_guard_max_devices(void);
int tdd_guard_register(void **registry, int meta_type, int type);

int tdd_guard_max_devices(void)
{
    return TDD_MAX_DEVICES;
}

/* Registers the guard in c10's device_guard_impl_registry (registry) at type, from
 * the Meta guard at meta_type. 1: registered; 0: one was there already; -1: no Meta
 * guard to copy. */
int tdd_guard_register(void **registry, int meta_type, int type)
{
    void *meta = __atomic_load_n(&registry[meta_type], __ATOMIC_SEQ_CST);
    if (!meta)
        return -1;
    if (__atomic_load_n(&registry[type], __ATOMIC_SEQ_CST))
        return 0;
    pu1_type = (int8_t)type;
    slot_fn *meta_vptr;
    memcpy(&meta_vptr, meta, sizeof meta_vptr);
    memcpy(vtable, meta_vptr - 2, sizeof vtable); /* offset-to-top, typeinfo, slots */
    slot_fn *slots = vtable + 2;
    slots[0] = (slot_fn)g_type;
    slots[1] = (slot_fn)g_exchange_device;
    slots[2] = (slot_fn)g_device;
    slots[5] = (slot_fn)g_stream;
    slots[8] = (slot_fn)g_exchange_stream;
    slots[13] = (slot_fn)g_device_count;
    guard.vptr = slots;
    void *self = &guard;
    __atomic_store_n(&registry[type], self, __ATOMIC_SEQ_CST);
    return 1;
}
