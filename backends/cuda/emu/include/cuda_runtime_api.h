/* The emulated build's cuda_runtime_api.h (see ../emu.h). */
#include "../emu.h"
