/* td_dtype.h -- tensor element types and the protocol's shape limit: the vocabulary
 * the client, the protocol and every backend share (tensordd.h includes it). */
#ifndef TD_DTYPE_H
#define TD_DTYPE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define TD_PROTOCOL_VERSION 1
#define TD_MAX_NDIM 8

/* Values equal the protobuf DType. */
typedef enum {
    TD_DTYPE_INVALID = 0,
    TD_F32 = 1,
    TD_F64 = 2,
    TD_F16 = 3,
    TD_BF16 = 4,
    TD_I32 = 5,
    TD_I64 = 6,
    TD_BOOL = 7,
    TD_U8 = 8,
    TD_I8 = 9,
    TD_I16 = 10,
    TD_DTYPE_COUNT = 11
} td_dtype;

const char *td_dtype_name(td_dtype dt); /* "float32", "int64", ... (numpy's names) */
size_t td_dtype_size(td_dtype dt);      /* bytes per element; 0 if invalid */

#ifdef __cplusplus
}
#endif

#endif
