/* tensordd.h -- the one public header of libtensordd, the C client of tensordd.
 *
 * Contract (as libuv's): a function returning int returns 0 on success or a
 * negative TD_E* code; on failure the td_error it was given (may be NULL)
 * holds the code, a message, the failing request id and a typed detail.
 *
 * Ops are asynchronous: td_op() returns the new tensor's handle at once and
 * sends nothing the daemon must answer. A failed op poisons its outputs; the
 * session's first error is reported by the next synchronising call
 * (td_sync, td_download, td_backward, td_grad*, ...).
 *
 * Threads: a td_client is one session on one connection, and calls on it must
 * not overlap (guard it with a mutex to share it). Clients are independent of
 * each other; a thread may own one, but each is its own session, whose handles
 * the others cannot name.
 */
#ifndef TENSORDD_H
#define TENSORDD_H

#include <stddef.h>
#include <stdint.h>

#include "td_attr.h"
#include "td_dtype.h"
#include "td_error.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------ version */

/* The version of this header. The shared library's soname (libtensordd.so.N) changes
 * only on an incompatible change of its interface; tools/abi/libtensordd.symbols
 * lists what it exports (make test fails when a listed symbol disappears). */
#define TD_VERSION_MAJOR 0
#define TD_VERSION_MINOR 11
#define TD_VERSION_PATCH 0
#define TD_VERSION_HEX ((TD_VERSION_MAJOR << 16) | (TD_VERSION_MINOR << 8) | TD_VERSION_PATCH)
/* The same as text, "MAJOR.MINOR.PATCH". These three macros are the project's one version:
 * the daemon (--version, HelloReply.server), tdctl, the Python client and tensordd.pc
 * take theirs from here. */
#define TD__STR(x) #x
#define TD__XSTR(x) TD__STR(x)
#define TD_VERSION_STRING                                                                          \
    TD__XSTR(TD_VERSION_MAJOR) "." TD__XSTR(TD_VERSION_MINOR) "." TD__XSTR(TD_VERSION_PATCH)

/* The version of the library linked at run time, as TD_VERSION_HEX: compare the two
 * to find a header and a library that differ. */
unsigned int td_version(void);
/* The same as text: TD_VERSION_STRING of the library's build ("MAJOR.MINOR.PATCH"). */
const char *td_version_string(void);

/* ------------------------------------------------------------------ client */

typedef struct td_client td_client;
typedef uint64_t td_handle; /* 0 is never a valid handle */

typedef struct {
    const char *token;       /* NULL: none */
    const char *client_name; /* NULL: "libtensordd" */
    int timeout_ms;          /* per blocking call; 0: wait forever */
} td_connect_opts;

/* endpoint: "tcp://HOST:PORT", "tls://HOST:PORT" or "unix:///PATH". opts may be NULL.
 * tls:// verifies the daemon's certificate against the system's CAs (td_connect_tls
 * names others). */
int td_connect(const char *endpoint, const td_connect_opts *opts, td_client **out, td_error *err);

/* Connect options that can grow: an opaque set of named options (libcurl's and sqlite's
 * way), so that a new option is a new name, never a new field that breaks programs built
 * against an older header. td_connect_opts and td_tls_opts stay as they are (frozen).
 *
 *   td_options *o = td_options_new();
 *   td_options_set(o, "token_file", "/etc/tensordd/token", &err);
 *   td_options_set_int(o, "timeout_ms", 5000, &err);
 *   rc = td_connect_with("tcp://10.0.0.5:7070", o, &c, &err);
 *   td_options_free(o);
 *
 * Names (strings): token, token_file (the token is its first line, read at connect),
 * client_name, ca_file, cert_file, key_file (tls://, as td_tls_opts); (integers):
 * timeout_ms, no_verify, resume_window_s (as td_connect_resume). A name this library does
 * not know, or a value of the wrong kind, is TD_EINVALID_ARGUMENT from the setter: a
 * program built for a newer library finds out there, not by misbehaving. */
typedef struct td_options td_options;
/* NULL when out of memory. */
td_options *td_options_new(void);
void td_options_free(td_options *o);
/* The value is copied; NULL unsets the option. */
int td_options_set(td_options *o, const char *name, const char *value, td_error *err);
int td_options_set_int(td_options *o, const char *name, int64_t value, td_error *err);
/* td_connect_resume with the options of o (NULL: none). */
int td_connect_with(const char *endpoint, const td_options *o, td_client **out, td_error *err);

/* TLS options of a tls:// endpoint (TLS 1.2 or later). */
typedef struct {
    const char *ca_file;   /* CA certificates (PEM) the daemon's must chain to; NULL: the
                              system's */
    const char *cert_file; /* this client's certificate (PEM), for mutual TLS; NULL: none */
    const char *key_file;  /* its private key (PEM); NULL: in cert_file */
    int no_verify;         /* 1: do not check the daemon's certificate (testing only) */
} td_tls_opts;

/* td_connect with TLS options (tls may be NULL; given with another scheme it is
 * TD_EINVALID_ARGUMENT). A refused certificate (the daemon's here, or ours there) is
 * TD_EUNAUTHENTICATED; TLS to a plaintext listener, or plaintext to a TLS one,
 * TD_EPROTOCOL_ERROR. */
int td_connect_tls(const char *endpoint, const td_connect_opts *opts, const td_tls_opts *tls,
                   td_client **out, td_error *err);
/* td_connect_tls with a resume window (docs/protocol.md, section 7 "Resume"): the daemon
 * holds the session resume_window_s seconds (at most its --max-resume-window) after the
 * connection drops, and a call that finds the connection lost (TD_ECLOSED, TD_EIO)
 * reconnects, resumes the session and sends again what the daemon had not applied (a
 * few tries with backoff, within the window); only when that fails is it
 * TD_ECONNECTION_LOST. Every request is kept, payload included, until a response shows
 * the daemon applied it. 0: as td_connect_tls. */
int td_connect_resume(const char *endpoint, const td_connect_opts *opts, const td_tls_opts *tls,
                      unsigned resume_window_s, td_client **out, td_error *err);
/* How many times c resumed its session on a new connection. */
unsigned td_resume_count(const td_client *c);
/* Says Goodbye, closes the connection; the daemon frees everything the session held. */
void td_close(td_client *c);
/* Text the daemon sent with Hello (e.g. that it serves CPU backends only). */
const char *td_server_note(const td_client *c);
uint64_t td_session_id(const td_client *c);

typedef struct {
    td_device device;
    char name[64];
    uint64_t memory_total, memory_used;
    int failed;      /* a fault (a sticky CUDA error) took the device out of service */
    char status[96]; /* why it failed; "" while it serves */
} td_device_info;

/* Fills up to cap entries, sets *n to the number of devices (may exceed cap). */
int td_list_devices(td_client *c, td_device_info *out, size_t cap, size_t *n, td_error *err);

/* Parses "cpu:0" / "ref" / "cuda:1". Returns TD_EINVALID_ARGUMENT on bad text. */
int td_device_parse(const char *text, td_device *out);
/* Writes "cpu:0". */
void td_device_format(const td_device *d, char *buf, size_t len);

/* Tensor metadata. */
typedef struct {
    td_dtype dtype;
    int ndim;
    int64_t shape[TD_MAX_NDIM];
    td_device device;
    int requires_grad;
} td_tensor_info;

/* Uploads data (C order, numel*itemsize bytes) to a new tensor on device.
 * Asynchronous: errors surface at the next synchronising call. */
int td_upload(td_client *c, const td_device *device, td_dtype dtype, int ndim, const int64_t *shape,
              const void *data, int requires_grad, td_handle *out, td_error *err);

/* Downloads a tensor into buf (cap bytes). Synchronising. info may be NULL. */
int td_download(td_client *c, td_handle h, void *buf, size_t cap, td_tensor_info *info,
                td_error *err);

/* Same-host zero copy (a unix:// connection to a daemon with --max-conn-fds > 0): the
 * tensor's bytes (C order) are in memfd fd from byte offset on (a multiple of 64), sealed
 * with F_SEAL_SHRINK|F_SEAL_WRITE. The fd travels over the socket (SCM_RIGHTS) and the
 * daemon maps it copy-on-write as the tensor's storage: no copy. fd stays the caller's.
 * Asynchronous as td_upload: a refused fd (not a sealed memfd, too small) poisons the
 * handle and surfaces at the next synchronising call; on a TCP or TLS connection, or a
 * resumable session, the call itself fails with TD_EINVALID_ARGUMENT. */
int td_upload_fd(td_client *c, const td_device *device, td_dtype dtype, int ndim,
                 const int64_t *shape, int fd, uint64_t offset, int requires_grad, td_handle *out,
                 td_error *err);

/* Downloads tensor h as a sealed memfd: *fd (the caller's to close) holds its bytes from
 * *offset on; mmap it. The daemon's own memfd when it has one for the tensor (an untouched
 * td_upload_fd, or a tensor it made in a memfd because this session passed one: sealed,
 * no copy), else one it wrote once; for tensors it answers with a payload
 * (device memory, strided views), a memfd this library wrote. Synchronising. */
int td_download_fd(td_client *c, td_handle h, int *fd, uint64_t *offset, td_tensor_info *info,
                   td_error *err);

/* Shape, dtype and device of a tensor: a round trip, answered at once (it neither waits for
 * queued work nor reports the session's pending error). */
int td_describe(td_client *c, td_handle h, td_tensor_info *info, td_error *err);

/* ---- ops */

/* Convenience constructors. */
td_attr td_attr_int(const char *name, int64_t v);
td_attr td_attr_float(const char *name, double v);
td_attr td_attr_bool(const char *name, int v);
td_attr td_attr_ints(const char *name, const int64_t *v, size_t n);
td_attr td_attr_floats(const char *name, const double *v, size_t n);
td_attr td_attr_str(const char *name, const char *v);

typedef struct {
    const td_device *device; /* creation ops; NULL: cpu:0 */
    td_dtype dtype;          /* creation ops, cast; 0: default */
    int requires_grad;
    const td_attr *attrs;
    size_t nattrs;
    int want_reply; /* wait for the daemon's verdict (synchronous) */
} td_op_opts;

/* Runs op `name` (PyTorch's names) on inputs; writes n_out new handles.
 * Asynchronous unless opts->want_reply. opts may be NULL. */
int td_op(td_client *c, const char *name, const td_handle *inputs, size_t n_in,
          const td_op_opts *opts, td_handle *outputs, size_t n_out, td_error *err);
/* One-output shorthand: returns the new handle, or 0 if the call failed locally. */
td_handle td_op1(td_client *c, const char *name, const td_handle *inputs, size_t n_in,
                 const td_op_opts *opts, td_error *err);

/* Copies a tensor to another device (keeps the autodiff graph). */
int td_to_device(td_client *c, td_handle h, const td_device *device, td_handle *out, td_error *err);

/* Daemon-to-daemon transfers: a tensor copied from one daemon (the source) straight into
 * another (the target), the client sending two small requests. td_transfer_accept asks
 * the target for a one-time capability to receive a tensor of dtype and shape into a new
 * handle (*out) of its session, on device (NULL: cpu:0; a host-memory device); the
 * handle is bound once the bytes arrived, and the capability expires after the target's
 * --transfer-window. td_transfer_send has the source push tensor h there: endpoint is where
 * the source reaches the target (tcp://HOST:PORT or tls://HOST:PORT), token the target's.
 * Synchronising: returns once the target bound the tensor, else the error that stopped it
 * (TD_EUNAUTHENTICATED: the token; TD_EINVALID_ARGUMENT: a capability spent already;
 * TD_ETIMEOUT: expired; TD_EIO: the target could not be reached or went away). */
#define TD_CAPABILITY_SIZE 16
int td_transfer_accept(td_client *target, const td_device *device, td_dtype dtype, int ndim,
                       const int64_t *shape, uint8_t capability[TD_CAPABILITY_SIZE], td_handle *out,
                       td_error *err);
int td_transfer_send(td_client *source, td_handle h, const char *endpoint, const char *token,
                     const uint8_t capability[TD_CAPABILITY_SIZE], td_error *err);
/* Both for a tensor h of source: its dtype and shape asked (td_describe), a capability
 * from target, the push from source; *out is the new handle in target's session. */
int td_transfer(td_client *source, td_handle h, td_client *target, const char *endpoint,
                const char *token, const td_device *device, td_handle *out, td_error *err);

/* Waits until every earlier request has run; reports the session's first error. */
int td_sync(td_client *c, td_error *err);

/* Releases handles (batched; sent with the next request). */
int td_release(td_client *c, const td_handle *hs, size_t n, td_error *err);

/* Sends buffered requests now. */
int td_flush(td_client *c, td_error *err);

/* Round trip with no work (Sync of an idle session); for tdctl ping. */
int td_ping(td_client *c, td_error *err);

/* Progress of one large payload transfer (upload or download): done of total bytes.
 * Called from inside td_upload/td_download on the caller's thread. */
typedef void (*td_progress_fn)(void *arg, uint64_t done, uint64_t total);
/* Installs (or with NULL removes) the progress callback for this client. */
void td_set_progress(td_client *c, td_progress_fn fn, void *arg);

/* The id of the most recent request this client sent or buffered (0: none):
 * an asynchronous error's td_error.request_id can be matched against it. */
uint64_t td_last_request_id(const td_client *c);

/* ---- several daemons */

typedef struct td_multi td_multi;

/* One client over several daemons (Python's tensordd.connect_many): a session with each,
 * and their devices named "ALIAS/cpu:0" or "ENDPOINT/cpu:0" ("a/cuda:0",
 * "tcp://10.0.0.2:7070/cpu:0"). A tensor lives in one daemon's session; td_multi_move
 * copies it to another daemon daemon to daemon (td_transfer). A name that is malformed or
 * names no daemon of the set is TD_EINVALID_ARGUMENT, detail.argument saying which
 * ("device", "name", "src"). The td_client pointers it hands out belong to it: use them as
 * any client (one thread at a time each), never td_close them.
 *
 * td_multi_connect opens a session with each of the n endpoints, in order (td_connect_tls,
 * with opts for every one; tls, which may be NULL, for the tls:// ones). aliases (NULL, or
 * n entries each NULL or a name without '/' or ':') name the daemons besides their
 * endpoints; no two aliases or endpoints may be equal. peer_endpoints (NULL, or n entries,
 * NULL meaning the endpoint itself) are where the daemons reach each other when that
 * differs from where this client reaches them (a proxy, NAT, a Kubernetes Service).
 * opts->token is passed to the target of each move. If one session cannot be opened, the
 * others are closed and its error returned, its message naming the endpoint. */
int td_multi_connect(const char *const *endpoints, const char *const *aliases,
                     const char *const *peer_endpoints, size_t n, const td_connect_opts *opts,
                     const td_tls_opts *tls, td_multi **out, td_error *err);
/* Closes every session (td_close) and frees m. m may be NULL. */
void td_multi_close(td_multi *m);
/* The number of daemons, and the session with the i-th (connect order; NULL past the end). */
size_t td_multi_count(const td_multi *m);
td_client *td_multi_at(const td_multi *m, size_t i);
/* The session with the daemon named name (an alias or an endpoint). */
int td_multi_client(const td_multi *m, const char *name, td_client **out, td_error *err);
/* How this client names c's daemon: its alias, else its endpoint; NULL when c is not
 * one of m's sessions. */
const char *td_multi_name(const td_multi *m, const td_client *c);
/* Splits a device name ("a/cpu:0", "tcp://h:p/cpu:0"; the daemon is everything before
 * the last '/') into the daemon's session (*client) and the device (*dev). Either output
 * may be NULL. */
int td_multi_resolve(const td_multi *m, const char *device_name, td_client **client, td_device *dev,
                     td_error *err);
/* 0 when device names a and b are the same device of the same daemon; else
 * TD_EDEVICE_MISMATCH, whose message names both (as "ALIAS/cpu:0") and says whether the
 * daemons or only the devices differ, with the two devices in detail.devices (target: a,
 * grad: b): what an op on inputs from both would meet. */
int td_multi_check_same(const td_multi *m, const char *a, const char *b, td_error *err);
/* Copies tensor h of session src to device to_device ("b/cpu:0") as a new handle *out of
 * that daemon's session. Between daemons, daemon to daemon (td_transfer to the target's
 * peer endpoint; a tensor off host memory goes through its daemon's cpu:0, and one for a
 * device off host memory lands in the target's cpu:0 first); the client sends small
 * requests only. Within one daemon, td_to_device. Synchronising between daemons. */
int td_multi_move(td_multi *m, td_client *src, td_handle h, const char *to_device, td_handle *out,
                  td_error *err);
/* td_sync on every session; the first error after all were asked. */
int td_multi_sync(td_multi *m, td_error *err);

/* ---- daemon statistics */

/* td_stats.errors' entries: the codes up to DEVICE_ERROR (the layout of libtensordd.so.0);
 * the codes added since (CONNECTION_LOST) are the client's own, never counted by the daemon. */
#define TD_STATS_ERRORS 24

typedef struct {
    uint64_t sessions, handles, bytes_received, bytes_sent, requests, tensors_alive, uptime_ms;
    uint64_t errors[TD_STATS_ERRORS]; /* by number (index = -code) */
    size_t ndevices;
    struct {
        td_device device;
        uint64_t bytes_in_use, peak_bytes;
    } memory[16];
    size_t nsessions; /* may exceed the 64 listed */
    struct {
        uint64_t session_id, handles, bytes_in_use, requests;
        char peer[64], client_name[64];
    } session_list[64];
} td_stats;

int td_stats_get(td_client *c, td_stats *out, td_error *err);

/* One session, as td_stats_sessions reports it. The record may grow at its end in a later
 * version: the caller passes the size it was compiled with, and the library writes no
 * more of each entry than that. */
typedef struct {
    uint64_t session_id, handles, bytes_in_use, requests;
    uint64_t memory_limit; /* its quota (--session-memory when it opened); 0: none */
    char peer[64], client_name[64];
} td_session_info;

/* Every session of the daemon, without td_stats' limit of 64: fills up to cap entries of
 * entry_size bytes each (sizeof(td_session_info)) and sets *n to the number of sessions
 * (may exceed cap: call again with room for *n). */
int td_stats_sessions(td_client *c, td_session_info *out, size_t cap, size_t entry_size, size_t *n,
                      td_error *err);

/* ---- autodiff */

/* Runs the backward pass of loss in the daemon; *grads is a Gradients handle.
 * grad_output 0: loss must be a single element and its gradient is 1. */
int td_backward(td_client *c, td_handle loss, td_handle grad_output, int retain_graph,
                td_handle *grads, td_error *err);
/* td_backward_ex's flags. */
enum { TD_BACKWARD_RETAIN_GRAPH = 1, TD_BACKWARD_CREATE_GRAPH = 2, TD_BACKWARD_PIPELINED = 4 };
/* td_backward with flags and, for n_inputs > 0, only the gradients of inputs[0..n_inputs)
 * (tracked tensors, leaves or not: torch.autograd.grad's inputs), through the part of the
 * graph that leads to them. TD_BACKWARD_RETAIN_GRAPH keeps the graph for another pass;
 * TD_BACKWARD_CREATE_GRAPH records the pass itself, so the gradients td_grad reads are
 * tracked tensors that another pass differentiates again (gradient penalties,
 * Hessian-vector products); it does not imply TD_BACKWARD_RETAIN_GRAPH.
 * TD_BACKWARD_PIPELINED sends it without waiting for an answer (*grads is set at once):
 * its error, or an earlier one, is reported by the next synchronising call, and a step
 * with the gradients of a failed pass changes nothing. */
int td_backward_ex(td_client *c, td_handle loss, td_handle grad_output, unsigned flags,
                   const td_handle *inputs, size_t n_inputs, td_handle *grads, td_error *err);
/* A new tensor handle holding t's gradient in grads. */
int td_grad(td_client *c, td_handle grads, td_handle t, td_handle *out, td_error *err);
/* Takes t's gradient out of grads and returns it as a new handle. */
int td_grad_remove(td_client *c, td_handle grads, td_handle t, td_handle *out, td_error *err);
/* Installs g as t's gradient after checking grads, tracking, backend, device, dtype, shape. */
int td_grad_replace(td_client *c, td_handle grads, td_handle t, td_handle g, td_error *err);
/* Enables or disables graph recording for the session (no-grad mode). */
int td_set_grad_enabled(td_client *c, int enabled, td_error *err);

/* kind: "sgd", "adam", "adamw", "rmsprop", "adagrad"; attrs, torch.optim's names: lr,
 * weight_decay, maximize, foreach; sgd: momentum, dampening, nesterov; adam, adamw: beta1,
 * beta2 (or betas, two floats), eps, amsgrad (a third state buffer); rmsprop: alpha, eps,
 * momentum, centered; adagrad: lr_decay, initial_accumulator_value, eps. A parameter group
 * with its own options is an optimizer of its own. */
int td_optimizer_create(td_client *c, const char *kind, const td_handle *params, size_t n,
                        const td_attr *attrs, size_t nattrs, td_handle *out, td_error *err);
int td_optimizer_step(td_client *c, td_handle optimizer, td_handle grads, td_error *err);
/* td_optimizer_step after changing the options in attrs (as td_optimizer_create's: an lr
 * schedule, a new momentum), for this step and later ones; the state is kept. A refused
 * option changes nothing and steps nothing. */
int td_optimizer_step_attrs(td_client *c, td_handle optimizer, td_handle grads,
                            const td_attr *attrs, size_t nattrs, td_error *err);
/* td_optimizer_step_ex's flags: TD_STEP_PIPELINED sends the step without waiting for its
 * answer; its error (or an earlier one) is reported by the next synchronising call. A
 * training step of td_backward_ex and td_optimizer_step_ex, both pipelined, and a
 * td_download of the loss is one write and one read. */
enum { TD_STEP_PIPELINED = 1 };
/* td_optimizer_step_attrs with flags (TD_STEP_*). */
int td_optimizer_step_ex(td_client *c, td_handle optimizer, td_handle grads, const td_attr *attrs,
                         size_t nattrs, unsigned flags, td_error *err);
/* An optimizer's state (torch.optim's state_dict()["state"]) for its n parameters, in
 * the order td_optimizer_create named them: steps[i], and buffer k of parameter i in
 * bufs[3 * i + k] (0: none) -- sgd: 0 momentum_buffer; adam, adamw: 0 exp_avg,
 * 1 exp_avg_sq, 2 max_exp_avg_sq (amsgrad). td_optimizer_state binds the buffers to new
 * tensor handles (views of the optimizer's own, which its next step updates: download
 * them first; release them after). td_optimizer_load_state replaces the state with
 * copies of the tensors named; the daemon checks everything first (each buffer of its
 * parameter's shape, dtype and device; exactly the buffers kept when steps[i] > 0, none
 * when 0) and changes nothing on an error. Both synchronising. */
int td_optimizer_state(td_client *c, td_handle optimizer, size_t n, int64_t *steps, td_handle *bufs,
                       td_error *err);
int td_optimizer_load_state(td_client *c, td_handle optimizer, size_t n, const int64_t *steps,
                            const td_handle *bufs, td_error *err);

/* Graphs: a sequence of requests recorded once and replayed with new inputs in one
 * message (docs/protocol.md, "Graphs"). td_graph_begin starts recording what this client
 * sends next (each request also runs as usual); inputs are the tensors a replay replaces.
 * td_graph_end stops and binds the recording to *graph (synchronising: it fails with the
 * session's pending error, or INVALID_ARGUMENT when a request that cannot be recorded,
 * such as td_upload, was sent). td_replay runs the graph again with inputs[i] in place of
 * td_graph_begin's inputs[i] (same dtype, shape and device), not waited for: the handles
 * the recorded requests bound then name the replay's values, and a failure is the
 * session's pending error. Releases (td_release) are held back while recording. */
int td_graph_begin(td_client *c, const td_handle *inputs, size_t n, td_error *err);
int td_graph_end(td_client *c, td_handle *graph, td_error *err);
/* td_graph_end naming more inputs, found while recording: tensors made before
 * td_graph_begin that the recorded requests read. td_replay then takes td_graph_begin's
 * inputs followed by these, and may be given a handle the recording bound in the place of
 * one (the previous replay's updated state). INVALID_ARGUMENT when the recording binds
 * one of them or one is named twice. */
int td_graph_end_with(td_client *c, td_handle *graph, const td_handle *inputs, size_t n,
                      td_error *err);
int td_replay(td_client *c, td_handle graph, const td_handle *inputs, size_t n, td_error *err);

#ifdef __cplusplus
}
#endif
#endif /* TENSORDD_H */
