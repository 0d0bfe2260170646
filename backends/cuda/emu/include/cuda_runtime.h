/* The emulated build's cuda_runtime.h: the runtime API and, for C++, the device side. */
#include "../emu.h"
#ifdef __cplusplus
#include "../emu_device.h"
#endif
