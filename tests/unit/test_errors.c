/* test_errors.c -- the C error list and the protobuf ErrorCode enum must not drift. */
#include <check.h>
#include <string.h>

#include "tensordd.h"
#include "tensordd.pb-c.h"

Suite *errors_suite(void);

/* Every TD_E* has a proto value of the same name and number. */
START_TEST(test_c_to_proto)
{
    const ProtobufCEnumDescriptor *d = &tensordd__v1__error_code__descriptor;
#define XX(name, num, msg)                                                                         \
    do {                                                                                           \
        const ProtobufCEnumValue *v = protobuf_c_enum_descriptor_get_value_by_name(d, #name);      \
        ck_assert_msg(v != NULL, "proto ErrorCode lacks %s", #name);                               \
        ck_assert_int_eq(v->value, num);                                                           \
        ck_assert_int_eq(TD_E##name, -(num));                                                      \
        ck_assert_str_eq(td_err_name(TD_E##name), #name);                                          \
        ck_assert(strlen(td_strerror(TD_E##name)) > 0);                                            \
    } while (0);
    TD_ERRNO_MAP(XX)
#undef XX
}
END_TEST

/* Every proto value (but OK) is in the C list: a code added to the proto
 * alone fails here. */
START_TEST(test_proto_to_c)
{
    const ProtobufCEnumDescriptor *d = &tensordd__v1__error_code__descriptor;
    for (unsigned i = 0; i < d->n_values; i++) {
        const ProtobufCEnumValue *v = &d->values[i];
        if (v->value == 0)
            continue;
        ck_assert_msg(v->value < TD_ERRNO_COUNT, "proto %s=%d beyond TD_ERRNO_COUNT", v->name,
                      v->value);
        ck_assert_str_eq(td_err_name(-v->value), v->name);
    }
    int n = 0;
#define XX(name, num, msg) n++;
    TD_ERRNO_MAP(XX)
#undef XX
    ck_assert_int_eq((int)d->n_values, n + 1);
    ck_assert_int_eq(TD_ERRNO_COUNT, n + 1);
}
END_TEST

START_TEST(test_unknown_code)
{
    ck_assert_str_eq(td_err_name(-999), "UNKNOWN");
    ck_assert_str_eq(td_err_name(0), "OK");
}
END_TEST

/* td_dtype mirrors the proto DType. */
START_TEST(test_dtypes)
{
    const ProtobufCEnumDescriptor *d = &tensordd__v1__dtype__descriptor;
    ck_assert_int_eq((int)d->n_values, TD_DTYPE_COUNT);
    ck_assert_int_eq(TENSORDD__V1__DTYPE__DTYPE_F32, TD_F32);
    ck_assert_int_eq(TENSORDD__V1__DTYPE__DTYPE_F64, TD_F64);
    ck_assert_int_eq(TENSORDD__V1__DTYPE__DTYPE_F16, TD_F16);
    ck_assert_int_eq(TENSORDD__V1__DTYPE__DTYPE_BF16, TD_BF16);
    ck_assert_int_eq(TENSORDD__V1__DTYPE__DTYPE_I32, TD_I32);
    ck_assert_int_eq(TENSORDD__V1__DTYPE__DTYPE_I64, TD_I64);
    ck_assert_int_eq(TENSORDD__V1__DTYPE__DTYPE_BOOL, TD_BOOL);
    ck_assert_uint_eq(td_dtype_size(TD_F32), 4);
    ck_assert_uint_eq(td_dtype_size(TD_BF16), 2);
    ck_assert_uint_eq(td_dtype_size(TD_DTYPE_INVALID), 0);
    ck_assert_str_eq(td_dtype_name(TD_I64), "int64");
}
END_TEST

Suite *errors_suite(void)
{
    Suite *s = suite_create("errors");
    TCase *tc = tcase_create("table");
    tcase_add_test(tc, test_c_to_proto);
    tcase_add_test(tc, test_proto_to_c);
    tcase_add_test(tc, test_unknown_code);
    tcase_add_test(tc, test_dtypes);
    suite_add_tcase(s, tc);
    return s;
}
