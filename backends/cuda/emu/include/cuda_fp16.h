/* The emulated build's cuda_fp16.h: __half and __nv_bfloat16 are in ../emu_device.h. */
#include "../emu_device.h"
