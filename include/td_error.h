/* td_error.h -- the error codes (one X-macro list), devices and the typed error every
 * layer fills and the wire carries (tensordd.h includes it). */
#ifndef TD_ERROR_H
#define TD_ERROR_H

#include <stdarg.h>

#include "td_dtype.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The error list. Numbers equal the protobuf ErrorCode values; a unit test
 * fails if the two drift. XX(name, number, message) */
#define TD_ERRNO_MAP(XX)                                                                           \
    XX(INVALID_ARGUMENT, 1, "invalid argument")                                                    \
    XX(UNKNOWN_HANDLE, 2, "unknown handle")                                                        \
    XX(WRONG_HANDLE_KIND, 3, "handle is of the wrong kind")                                        \
    XX(BACKEND_MISMATCH, 4, "tensors are on different backends")                                   \
    XX(DEVICE_MISMATCH, 5, "tensors are on different devices")                                     \
    XX(DTYPE_MISMATCH, 6, "tensors have different dtypes")                                         \
    XX(SHAPE_MISMATCH, 7, "tensor shapes do not match")                                            \
    XX(NOT_TRACKED, 8, "tensor is not tracked by autodiff")                                        \
    XX(UNSUPPORTED_OP, 9, "operation not supported")                                               \
    XX(UNSUPPORTED_DTYPE, 10, "dtype not supported")                                               \
    XX(DEVICE_UNAVAILABLE, 11, "device unavailable")                                               \
    XX(RESOURCE_EXHAUSTED, 12, "resource exhausted")                                               \
    XX(POISONED, 13, "input was produced by a failed request")                                     \
    XX(PROTOCOL_ERROR, 14, "protocol error")                                                       \
    XX(FRAME_TOO_LARGE, 15, "frame too large")                                                     \
    XX(VERSION_MISMATCH, 16, "protocol version mismatch")                                          \
    XX(UNAUTHENTICATED, 17, "unauthenticated")                                                     \
    XX(INTERNAL, 18, "internal error")                                                             \
    XX(HANDLE_IN_USE, 19, "handle id already in use")                                              \
    XX(IO, 20, "i/o error")                                                                        \
    XX(TIMEOUT, 21, "timed out")                                                                   \
    XX(CLOSED, 22, "connection closed")                                                            \
    XX(DEVICE_ERROR, 23, "device error")                                                           \
    XX(CONNECTION_LOST, 24, "connection lost")

typedef enum {
    TD_OK = 0,
#define TD__ERR_ENUM(name, num, msg) TD_E##name = -(num),
    TD_ERRNO_MAP(TD__ERR_ENUM)
#undef TD__ERR_ENUM
        TD_ERRNO_COUNT = 25 /* one past the largest number */
} td_errno;

/* "SHAPE_MISMATCH" for TD_ESHAPE_MISMATCH; "UNKNOWN" for anything else. */
const char *td_err_name(int code);
/* A one-line English description of the code. */
const char *td_strerror(int code);

/* Handle kinds, as in the protobuf HandleKind. */
typedef enum {
    TD_HANDLE_NONE = 0,
    TD_HANDLE_TENSOR = 1,
    TD_HANDLE_GRADIENTS = 2,
    TD_HANDLE_OPTIMIZER = 3,
    TD_HANDLE_GRAPH = 4,
    TD_HANDLE_GROUP = 5
} td_handle_kind;

typedef struct {
    char backend[16];
    uint32_t ordinal;
} td_device;

/* Which member of td_error.detail is meaningful. */
typedef enum {
    TD_DETAIL_NONE = 0,
    TD_DETAIL_DEVICES,     /* BACKEND_MISMATCH, DEVICE_MISMATCH */
    TD_DETAIL_DTYPES,      /* DTYPE_MISMATCH */
    TD_DETAIL_SHAPES,      /* SHAPE_MISMATCH */
    TD_DETAIL_HANDLE,      /* UNKNOWN_HANDLE */
    TD_DETAIL_HANDLE_KIND, /* WRONG_HANDLE_KIND */
    TD_DETAIL_POISONED,    /* POISONED */
    TD_DETAIL_RESOURCE,    /* RESOURCE_EXHAUSTED */
    TD_DETAIL_VERSION,     /* VERSION_MISMATCH */
    TD_DETAIL_ARGUMENT     /* INVALID_ARGUMENT naming the attribute */
} td_detail_kind;

typedef struct {
    int code;            /* TD_E*, 0 if none */
    uint64_t request_id; /* the request that failed; 0 if local */
    char message[256];
    td_detail_kind detail_kind;
    union {
        struct {
            td_device target, grad; /* grad_replace: target tensor, offered gradient */
            uint32_t target_index, grad_index;
        } devices;
        struct {
            td_dtype target, grad;
        } dtypes;
        struct {
            int expected_ndim, got_ndim;
            int64_t expected[TD_MAX_NDIM], got[TD_MAX_NDIM];
        } shapes;
        struct {
            uint64_t handle;
        } handle;
        struct {
            uint64_t handle;
            td_handle_kind expected, got;
        } handle_kind;
        struct {
            uint64_t handle, origin_request;
            int origin_code; /* TD_E* */
        } poisoned;
        struct {
            char resource[32];
            uint64_t requested, available;
        } resource;
        struct {
            uint32_t server_min, server_max;
        } version;
        struct {
            char argument[32];
        } argument;
    } detail;
} td_error;

#ifdef __cplusplus
}
#endif

#endif
