/* sizes.c -- prints the size of each public struct of tensordd.h, one "size NAME BYTES"
 * line each, for tools/abi/check_abi.py: a public struct that changes size changes the
 * library's ABI (programs allocate it), and the soname must then be bumped. */
#include <stdio.h>

#include "tensordd.h"

#define SIZE(t) printf("size %s %zu\n", #t, sizeof(t))

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
    return 0;
}
