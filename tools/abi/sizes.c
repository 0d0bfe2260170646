/* sizes.c -- prints what of tensordd.h's ABI a symbol list cannot show, for
 * tools/abi/check_abi.py: the size of each public struct ("size NAME BYTES": programs
 * allocate them, so one that grows or shrinks breaks them) and the value of each public
 * enum constant and limit ("value NAME N": compiled into programs, so a renumbering
 * breaks them). Either change needs the soname bumped. */
#include <stdio.h>

#include "tensordd.h"

#define SIZE(t) printf("size %s %zu\n", #t, sizeof(t))
#define VALUE(v) printf("value %s %lld\n", #v, (long long)(v))

int main(void)
{
    SIZE(td_attr);
    SIZE(td_device);
    SIZE(td_error);
    SIZE(td_connect_opts);
    SIZE(td_tls_opts);
    SIZE(td_device_info);
    SIZE(td_tensor_info);
    SIZE(td_op_opts);
    SIZE(td_stats);

    VALUE(TD_PROTOCOL_VERSION);
    VALUE(TD_MAX_NDIM);
    VALUE(TD_F32);
    VALUE(TD_F64);
    VALUE(TD_F16);
    VALUE(TD_BF16);
    VALUE(TD_I32);
    VALUE(TD_I64);
    VALUE(TD_BOOL);
    VALUE(TD_OK);
#define TD__VALUE(name, num, msg) VALUE(TD_E##name);
    TD_ERRNO_MAP(TD__VALUE)
#undef TD__VALUE
    VALUE(TD_HANDLE_NONE);
    VALUE(TD_HANDLE_TENSOR);
    VALUE(TD_HANDLE_GRADIENTS);
    VALUE(TD_HANDLE_OPTIMIZER);
    VALUE(TD_HANDLE_GRAPH);
    VALUE(TD_HANDLE_GROUP);
    VALUE(TD_DETAIL_NONE);
    VALUE(TD_DETAIL_DEVICES);
    VALUE(TD_DETAIL_DTYPES);
    VALUE(TD_DETAIL_SHAPES);
    VALUE(TD_DETAIL_HANDLE);
    VALUE(TD_DETAIL_HANDLE_KIND);
    VALUE(TD_DETAIL_POISONED);
    VALUE(TD_DETAIL_RESOURCE);
    VALUE(TD_DETAIL_VERSION);
    VALUE(TD_DETAIL_ARGUMENT);
    VALUE(TD_ATTR_INT);
    VALUE(TD_ATTR_FLOAT);
    VALUE(TD_ATTR_BOOL);
    VALUE(TD_ATTR_INTS);
    VALUE(TD_ATTR_FLOATS);
    VALUE(TD_ATTR_STR);
    VALUE(TD_BACKWARD_RETAIN_GRAPH);
    VALUE(TD_BACKWARD_CREATE_GRAPH);
    VALUE(TD_BACKWARD_PIPELINED);
    VALUE(TD_STEP_PIPELINED);
    return 0;
}
