/* itest.h -- shared pieces of the integration suite (a real daemon driven through libtensordd). */
#ifndef ITEST_H
#define ITEST_H

#include <check.h>
#include <stddef.h>
#include <stdint.h>

#include "../support/daemon.h"
#include "tensordd.h"

/* The daemon most tests share: --cpu-devices 2, started by main(). */
extern tdt_daemon it_daemon;

td_client *it_client(const char *name);
td_device it_dev(const char *text);
td_handle it_upload_f32(td_client *c, const char *dev, int ndim, const int64_t *shape,
                        const float *data);
void it_download_f32(td_client *c, td_handle h, float *out, size_t n);
/* Deterministic pseudo-random numbers (xorshift64*), no libc state. */
uint64_t it_rand(uint64_t *s);
float it_randf(uint64_t *s, float lo, float hi);
/* A raw connection that has said Hello (version 1); -1 on failure. */
int it_raw_session(void);

Suite *it_data_suite(void);
Suite *it_error_suite(void);
Suite *it_autograd_suite(void);
Suite *it_double_backward_suite(void);
Suite *it_ops_wire_suite(void);
Suite *it_failed_binds_suite(void);
Suite *it_resume_suite(void);
Suite *it_tls_suite(void);
Suite *it_memfd_suite(void);
Suite *it_handles_suite(void);
Suite *it_pipeline_step_suite(void);
Suite *it_transfer_suite(void);
Suite *it_multi_suite(void);

#endif
