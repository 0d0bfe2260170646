/* _speedups.c -- the optional C accelerator of the Python client's hot paths.
 *
 * The same functions as tensordd/_codec.py, with the same results (the tests hold
 * both to protobuf's own encoding and decoding):
 *   encode_op(rid, name, inputs, out)      Request{id, op{op, inputs, outputs: [out]}}
 *   frame_op(rid, name, inputs, out)       its whole frame (16-byte header first)
 *   frame_download(rid, handle)            the frame of Request{id, download{handle}}
 *   frame_release(rid, handles)            the frame of Request{id, release{handles}}
 *   append_op(wbuf, rid, name, inputs, out) frame_op's bytes appended to the bytearray
 *       wbuf; returns its new length
 *   copy_into(dest, src, pos)              copies src[pos:] (as much as fits) into the
 *       writable buffer dest; returns (bytes copied, bytes of dest left to fill)
 *   parse_tensor_reply(msg)                a plain Response{id, tensor{...}} as
 *       (id, handle, dtype, shape, backend, ordinal, requires_grad), or None for
 *       anything else (the caller then decodes it with protobuf).
 * The messages themselves are encoded and decoded by the fast codec the daemon and
 * libtensordd compile too (proto/wirecodec.h); this file moves Python objects into and
 * out of its structs. Built when a compiler and Python's headers are there (speedups.mk,
 * setup.py); _codec.py falls back to pure Python without it. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

#include <errno.h>
#include <limits.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>

/* the fast codec the daemon and libtensordd compile too, its keys generated from the .proto */
#include "wirecodec.h"

#define MAGIC 0x01444454u /* "TDD" + frame version 1 (proto/frame.h) */
#define HEADER 16
#define MAX_DIMS 64

/* ------------------------------------------------------------------ encoding */

static char *put_header(char *p, size_t msg_len)
{
    uint32_t magic = MAGIC, len = (uint32_t)msg_len;
    uint64_t payload = 0;
    /* little-endian hosts only (the wire format is little-endian): see module init */
    memcpy(p, &magic, 4);
    memcpy(p + 4, &len, 4);
    memcpy(p + 8, &payload, 8);
    return p + HEADER;
}

/* A request's id and body (its body's fields are the caller's to set). */
static void request_head(td_wire_request *w, uint64_t id, uint32_t body)
{
    w->id = id;
    w->want_reply = false;
    w->body = body;
}

/* An unsigned 64-bit value from a Python int (OverflowError when negative or too big). */
static int as_u64(PyObject *o, uint64_t *out)
{
    unsigned long long v = PyLong_AsUnsignedLongLong(o);
    if (v == (unsigned long long)-1 && PyErr_Occurred())
        return -1;
    *out = (uint64_t)v;
    return 0;
}

/* METH_FASTCALL arguments: exactly n positional ones. */
static int nargs_ok(const char *name, Py_ssize_t nargs, Py_ssize_t n)
{
    if (nargs == n)
        return 1;
    PyErr_Format(PyExc_TypeError, "%s() takes %zd arguments (%zd given)", name, n, nargs);
    return 0;
}

/* framed: 0 the message, 1 the frame as bytes, 2 the frame appended to wbuf. An
 * optional fifth argument, bytes, ends the Op message as they are (its attrs, encoded
 * and cached by the caller: field 4 follows the outputs). */
static PyObject *op_request(PyObject *const *args, Py_ssize_t nargs, int framed, PyObject *wbuf)
{
    const char *fn = framed == 2 ? "append_op" : framed ? "frame_op" : "encode_op";
    if (nargs != 5 && !nargs_ok(fn, nargs, 4))
        return NULL;
    const char *extra = NULL;
    Py_ssize_t extra_len = 0;
    if (nargs == 5) {
        if (!PyBytes_Check(args[4])) {
            PyErr_Format(PyExc_TypeError, "%s: extra must be bytes", fn);
            return NULL;
        }
        extra = PyBytes_AS_STRING(args[4]);
        extra_len = PyBytes_GET_SIZE(args[4]);
    }
    PyObject *rid_o = args[0], *name_o = args[1], *inputs_o = args[2], *out_o = args[3];
    uint64_t rid, out;
    if (as_u64(rid_o, &rid) < 0 || as_u64(out_o, &out) < 0)
        return NULL;
    Py_ssize_t name_len;
    const char *name = PyUnicode_AsUTF8AndSize(name_o, &name_len);
    if (name == NULL)
        return NULL;
    PyObject *seq = PySequence_Fast(inputs_o, "inputs must be a sequence of handles");
    if (seq == NULL)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    uint64_t small[8];
    uint64_t *ins = small;
    if (n > 8) {
        ins = PyMem_Malloc((size_t)n * sizeof *ins);
        if (ins == NULL) {
            Py_DECREF(seq);
            return PyErr_NoMemory();
        }
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        if (as_u64(items[i], &ins[i]) < 0) {
            if (ins != small)
                PyMem_Free(ins);
            Py_DECREF(seq);
            return NULL;
        }
    }
    Py_DECREF(seq);
    td_wire_request w; /* (the fields the encoder reads, one by one: see wirecodec.h) */
    request_head(&w, rid, TD_FIELD_REQUEST_OP);
    td_wire_op_clear(&w.op);
    w.op.name = name;
    w.op.name_len = (size_t)name_len;
    w.op.inputs = ins;
    w.op.n_inputs = (size_t)n;
    w.op.outputs = &out;
    w.op.n_outputs = 1;
    w.op.attrs = (const uint8_t *)extra;
    w.op.attrs_len = (size_t)extra_len;
    size_t msg = td_wire_request_size(&w);
    size_t total = msg + (framed ? HEADER : 0);
    PyObject *res;
    char *p;
    if (framed == 2) {
        Py_ssize_t old = PyByteArray_GET_SIZE(wbuf);
        if (PyByteArray_Resize(wbuf, old + (Py_ssize_t)total) < 0) {
            if (ins != small)
                PyMem_Free(ins);
            return NULL;
        }
        res = PyLong_FromSsize_t(old + (Py_ssize_t)total);
        p = PyByteArray_AS_STRING(wbuf) + old;
    } else {
        res = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)total);
        p = res ? PyBytes_AS_STRING(res) : NULL;
    }
    if (res != NULL) {
        if (framed)
            p = put_header(p, msg);
        td_wire_request_put((uint8_t *)p, &w);
    }
    if (ins != small)
        PyMem_Free(ins);
    return res;
}

static PyObject *encode_op(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    return op_request(args, nargs, 0, NULL);
}

static PyObject *frame_op(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    return op_request(args, nargs, 1, NULL);
}

static PyObject *append_op(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 6 && !nargs_ok("append_op", nargs, 5))
        return NULL;
    if (!PyByteArray_CheckExact(args[0])) {
        PyErr_SetString(PyExc_TypeError, "append_op: wbuf must be a bytearray");
        return NULL;
    }
    return op_request(args + 1, nargs - 1, 2, args[0]);
}

static PyObject *copy_into(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (!nargs_ok("copy_into", nargs, 3))
        return NULL;
    Py_ssize_t pos = PyLong_AsSsize_t(args[2]);
    if (pos == -1 && PyErr_Occurred())
        return NULL;
    Py_buffer dest, src;
    /* (no format asked: numpy then skips building one) */
    if (PyObject_GetBuffer(args[0], &dest, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) {
        if (PyErr_ExceptionMatches(PyExc_BufferError)) {
            PyErr_Clear();
            PyErr_SetString(PyExc_ValueError,
                            "payload buffer must be a writable C-contiguous buffer");
        }
        return NULL;
    }
    if (PyObject_GetBuffer(args[1], &src, PyBUF_SIMPLE) < 0) {
        PyBuffer_Release(&dest);
        return NULL;
    }
    Py_ssize_t avail = pos >= 0 && pos < src.len ? src.len - pos : 0;
    Py_ssize_t n = avail < dest.len ? avail : dest.len;
    if (n > 0)
        memcpy(dest.buf, (const char *)src.buf + pos, (size_t)n);
    Py_ssize_t left = dest.len - n;
    PyBuffer_Release(&src);
    PyBuffer_Release(&dest);
    return Py_BuildValue("(nn)", n, left);
}

static PyObject *frame_download(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (!nargs_ok("frame_download", nargs, 2))
        return NULL;
    PyObject *rid_o = args[0], *handle_o = args[1];
    uint64_t rid, handle;
    if (as_u64(rid_o, &rid) < 0 || as_u64(handle_o, &handle) < 0)
        return NULL;
    td_wire_request w;
    request_head(&w, rid, TD_FIELD_REQUEST_DOWNLOAD);
    w.handle = handle;
    size_t msg = td_wire_request_size(&w);
    PyObject *res = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(HEADER + msg));
    if (res == NULL)
        return NULL;
    char *p = put_header(PyBytes_AS_STRING(res), msg);
    td_wire_request_put((uint8_t *)p, &w);
    return res;
}

/* The handles of a Python sequence as uint64s: in small (nsmall of them) when they fit, else
 * in PyMem_Malloc'd memory (free with free_u64s); NULL with an exception set. */
static uint64_t *u64s(PyObject *o, const char *what, uint64_t *small, size_t nsmall, size_t *n)
{
    PyObject *seq = PySequence_Fast(o, what);
    if (seq == NULL)
        return NULL;
    Py_ssize_t len = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    uint64_t *a = (size_t)len <= nsmall ? small : PyMem_Malloc((size_t)len * sizeof *a);
    if (a == NULL) {
        Py_DECREF(seq);
        PyErr_NoMemory();
        return NULL;
    }
    for (Py_ssize_t i = 0; i < len; i++) {
        if (as_u64(items[i], &a[i]) < 0) {
            if (a != small)
                PyMem_Free(a);
            Py_DECREF(seq);
            return NULL;
        }
    }
    Py_DECREF(seq);
    *n = (size_t)len;
    return a;
}

static void free_u64s(uint64_t *a, const uint64_t *small)
{
    if (a != small)
        PyMem_Free(a);
}

static PyObject *frame_release(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (!nargs_ok("frame_release", nargs, 2))
        return NULL;
    uint64_t rid, small[16];
    if (as_u64(args[0], &rid) < 0)
        return NULL;
    td_wire_request w;
    request_head(&w, rid, TD_FIELD_REQUEST_RELEASE);
    uint64_t *hs = u64s(args[1], "handles must be a sequence", small, 16, &w.n_handles);
    if (hs == NULL)
        return NULL;
    w.handles = hs;
    size_t msg = td_wire_request_size(&w);
    PyObject *res = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(HEADER + msg));
    if (res != NULL)
        td_wire_request_put((uint8_t *)put_header(PyBytes_AS_STRING(res), msg), &w);
    free_u64s(hs, small);
    return res;
}

/* ------------------------------------------------------------------ decoding */

typedef struct {
    td_wire_tensor w;
    int64_t shape[MAX_DIMS];
} tensor_info;

/* 1 when msg is a plain Response{id, tensor{...}} (its id and fields in *id, *t), else 0. */
static int parse_reply(const unsigned char *p, size_t len, uint64_t *id, tensor_info *t)
{
    return td_wire_response_get(p, len, id, &t->w, t->shape, MAX_DIMS) == TD_FIELD_RESPONSE_TENSOR;
}

static PyObject *parse_tensor_reply(PyObject *self, PyObject *arg)
{
    (void)self;
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    tensor_info t;
    uint64_t id;
    int plain = parse_reply(view.buf, (size_t)view.len, &id, &t);
    PyObject *res = NULL;
    if (!plain) {
        res = Py_None;
        Py_INCREF(res);
        goto out;
    }
    PyObject *backend =
        PyUnicode_DecodeUTF8(t.w.device.backend, (Py_ssize_t)t.w.device.backend_len, NULL);
    if (backend == NULL) { /* not UTF-8: protobuf says what that is */
        PyErr_Clear();
        res = Py_None;
        Py_INCREF(res);
        goto out;
    }
    PyObject *shape = PyTuple_New(t.w.ndim);
    if (shape == NULL) {
        Py_DECREF(backend);
        goto out;
    }
    for (int i = 0; i < t.w.ndim; i++) {
        PyObject *d = PyLong_FromLongLong(t.shape[i]);
        if (d == NULL) {
            Py_DECREF(shape);
            Py_DECREF(backend);
            goto out;
        }
        PyTuple_SET_ITEM(shape, i, d);
    }
    res =
        Py_BuildValue("(KKLNNKO)", (unsigned long long)id, (unsigned long long)t.w.handle,
                      (long long)t.w.dtype, shape, backend, (unsigned long long)t.w.device.ordinal,
                      t.w.requires_grad ? Py_True : Py_False);
out:
    PyBuffer_Release(&view);
    return res;
}

/* ------------------------------------------------------------------ download */

/* download(conn, rid, handle, release_rid, release_handles): Session._download's round
 * trip on a plain blocking socket (tcp:// or unix://, no resume journal, no fd passing,
 * nothing buffered unread): the queued requests, then Release{release_handles} as
 * request release_rid (when it is not 0) and Download{handle} as request rid, go out in
 * one writev; the answer is read from the socket with the GIL released. Returns
 *   None       nothing was done (not such a socket): the caller takes its own path;
 *   True       the requests went out and what came back is left in conn._rbuf for
 *              conn.read_frame_head (anything but a plain tensor answer to rid whose
 *              payload fits its dtype and shape: errors, odd frames, the stream's end);
 *   (array, dtype, shape, backend, ordinal, requires_grad)  the answer, its payload
 *              read straight into a new numpy array.
 * Socket errors raise OSError as the socket module does (EAGAIN: BlockingIOError; the
 * caller turns it into a timeout); the end of the stream inside a payload raises
 * ConnectionResetError, as _wire does. set_download_types must have run. */

static PyObject *socket_type, *np_empty, *np_dtypes;
static PyObject *s_journal, *s_want_fds, *s_sock, *s_wbuf, *s_rbuf, *s_rpos, *s_timeout, *s_fileno;

static PyObject *conn_methods[6]; /* the Connection methods download stands for */

#define MAX_MESSAGE (64u << 20) /* _wire.MAX_MESSAGE */
#define INBUF 16384

static PyObject *set_download_types(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (!nargs_ok("set_download_types", nargs, 3))
        return NULL;
    if (!PyType_Check(args[0]) || !PyDict_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "set_download_types(socket type, empty, dict)");
        return NULL;
    }
    Py_INCREF(args[0]);
    Py_INCREF(args[1]);
    Py_INCREF(args[2]);
    Py_XSETREF(socket_type, args[0]);
    Py_XSETREF(np_empty, args[1]);
    Py_XSETREF(np_dtypes, args[2]);
    Py_RETURN_NONE;
}

/* An attribute of conn that must be there. */
static PyObject *conn_attr(PyObject *conn, PyObject *name)
{
    return PyObject_GetAttr(conn, name);
}

/* Puts data[0:n] in conn._rbuf (read from position 0): the bytes read and not used. */
static int stash(PyObject *conn, const char *data, size_t n)
{
    PyObject *buf = PyByteArray_FromStringAndSize(data, (Py_ssize_t)n);
    if (buf == NULL)
        return -1;
    int rc = PyObject_SetAttr(conn, s_rbuf, buf);
    Py_DECREF(buf);
    if (rc == 0) {
        PyObject *zero = PyLong_FromLong(0);
        if (zero == NULL)
            return -1;
        rc = PyObject_SetAttr(conn, s_rpos, zero);
        Py_DECREF(zero);
    }
    return rc;
}

/* writev until every byte is out; 0, or -1 with errno (EINTR handled: a signal
 * handler's exception returns -2 with it set). */
static int send_all(int fd, struct iovec *iov, int cnt)
{
    while (cnt > 0) {
        ssize_t n;
        Py_BEGIN_ALLOW_THREADS n = writev(fd, iov, cnt);
        Py_END_ALLOW_THREADS if (n < 0)
        {
            if (errno == EINTR) {
                if (PyErr_CheckSignals() < 0)
                    return -2;
                continue;
            }
            return -1;
        }
        size_t left = (size_t)n;
        while (cnt > 0 && left >= iov->iov_len) {
            left -= iov->iov_len;
            iov++;
            cnt--;
        }
        if (cnt > 0) {
            iov->iov_base = (char *)iov->iov_base + left;
            iov->iov_len -= left;
        }
    }
    return 0;
}

/* recv of up to n bytes (at least one); >= 0 bytes (0: the end of the stream), -1
 * with errno, -2 with a signal handler's exception set. */
static Py_ssize_t recv_some(int fd, char *buf, size_t n)
{
    for (;;) {
        ssize_t got;
        Py_BEGIN_ALLOW_THREADS got = recv(fd, buf, n, 0);
        Py_END_ALLOW_THREADS if (got >= 0) return (Py_ssize_t)got;
        if (errno != EINTR)
            return -1;
        if (PyErr_CheckSignals() < 0)
            return -2;
    }
}

/* The file descriptor of conn's socket when download can use it (a plain blocking
 * socket.socket, no resume journal, no fd passing, nothing buffered unread), -1 when it
 * cannot, -2 on an error. */
static int conn_fd(PyObject *conn)
{
    /* (a debugger's trace function sees the Python path's calls, as without this) */
    if (PyThreadState_Get()->c_tracefunc != NULL)
        return -1;
    /* (a method replaced on the instance, a test's counter or fault: its own path) */
    PyObject *d = PyObject_GenericGetDict(conn, NULL);
    if (d == NULL)
        return -2;
    int patched = 0;
    for (size_t i = 0; i < sizeof conn_methods / sizeof *conn_methods && !patched; i++) {
        patched = PyDict_GetItemWithError(d, conn_methods[i]) != NULL;
        if (!patched && PyErr_Occurred()) {
            Py_DECREF(d);
            return -2;
        }
    }
    Py_DECREF(d);
    if (patched)
        return -1;
    /* ---- the socket must be a plain blocking one, nothing tracked or buffered */
    PyObject *o = conn_attr(conn, s_journal);
    if (o == NULL)
        return -2;
    int plain = o == Py_None;
    Py_DECREF(o);
    if (plain) {
        o = conn_attr(conn, s_want_fds);
        if (o == NULL)
            return -2;
        plain = PyObject_IsTrue(o) == 0;
        Py_DECREF(o);
    }
    PyObject *sock = plain ? conn_attr(conn, s_sock) : NULL;
    if (plain && sock == NULL)
        return -2;
    int fd = -1;
    if (plain && Py_IS_TYPE(sock, (PyTypeObject *)socket_type)) {
        o = PyObject_GetAttr(sock, s_timeout);
        if (o == NULL) {
            Py_DECREF(sock);
            return -2;
        }
        int blocking = o == Py_None;
        Py_DECREF(o);
        o = blocking ? PyObject_CallMethodNoArgs(sock, s_fileno) : NULL;
        if (blocking && o == NULL) {
            Py_DECREF(sock);
            return -2;
        }
        if (o != NULL) {
            long v = PyLong_AsLong(o);
            Py_DECREF(o);
            if (v == -1 && PyErr_Occurred()) {
                Py_DECREF(sock);
                return -2;
            }
            fd = v >= 0 && v <= INT_MAX ? (int)v : -1;
        }
    }
    Py_XDECREF(sock);
    if (fd < 0)
        return -1;
    PyObject *rbuf = conn_attr(conn, s_rbuf);
    if (rbuf == NULL)
        return -2;
    o = conn_attr(conn, s_rpos);
    if (o == NULL) {
        Py_DECREF(rbuf);
        return -2;
    }
    Py_ssize_t rpos = PyLong_AsSsize_t(o);
    Py_DECREF(o);
    int drained = PyByteArray_CheckExact(rbuf) && rpos == PyByteArray_GET_SIZE(rbuf);
    Py_DECREF(rbuf);
    if (rpos == -1 && PyErr_Occurred())
        return -2;
    PyObject *wbuf = conn_attr(conn, s_wbuf);
    if (wbuf == NULL)
        return -2;
    int ok = drained && PyByteArray_CheckExact(wbuf);
    Py_DECREF(wbuf);
    return ok ? fd : -1;
}

/* The round trip of download on conn's socket fd (see download). */
static PyObject *roundtrip(PyObject *conn, int fd, uint64_t rid, uint64_t handle, uint64_t rrid,
                           PyObject *rel)
{
    PyObject *wbuf = conn_attr(conn, s_wbuf);
    if (wbuf == NULL)
        return NULL;
    /* ---- the Release and Download frames, after what is queued */
    uint64_t hsmall[16], *hs = NULL;
    td_wire_request rw, dw;
    request_head(&rw, rrid, TD_FIELD_REQUEST_RELEASE);
    rw.handles = NULL;
    rw.n_handles = 0;
    request_head(&dw, rid, TD_FIELD_REQUEST_DOWNLOAD);
    dw.handle = handle;
    if (rrid) {
        hs = u64s(rel, "release handles must be a sequence", hsmall, 16, &rw.n_handles);
        if (hs == NULL) {
            Py_DECREF(wbuf);
            return NULL;
        }
        rw.handles = hs;
    }
    size_t rel_msg = rrid ? td_wire_request_size(&rw) : 0, dl_msg = td_wire_request_size(&dw);
    size_t flen = (rrid ? HEADER + rel_msg : 0) + HEADER + dl_msg;
    char small[1024];
    char *frames = flen <= sizeof small ? small : PyMem_Malloc(flen);
    if (frames == NULL) {
        if (hs)
            free_u64s(hs, hsmall);
        Py_DECREF(wbuf);
        return PyErr_NoMemory();
    }
    char *p = frames;
    if (rrid) {
        p = (char *)td_wire_request_put((uint8_t *)put_header(p, rel_msg), &rw);
        free_u64s(hs, hsmall);
    }
    td_wire_request_put((uint8_t *)put_header(p, dl_msg), &dw);
    /* ---- out in one writev; the write buffer is emptied whatever happens (as flush) */
    Py_buffer wv;
    if (PyObject_GetBuffer(wbuf, &wv, PyBUF_SIMPLE) < 0) { /* (holds it while unlocked) */
        if (frames != small)
            PyMem_Free(frames);
        Py_DECREF(wbuf);
        return NULL;
    }
    struct iovec iov[2];
    int cnt = 0;
    if (wv.len) {
        iov[cnt].iov_base = wv.buf;
        iov[cnt++].iov_len = (size_t)wv.len;
    }
    iov[cnt].iov_base = frames;
    iov[cnt++].iov_len = flen;
    int rc = send_all(fd, iov, cnt);
    int err = errno;
    PyBuffer_Release(&wv);
    if (frames != small)
        PyMem_Free(frames);
    if (PyByteArray_Resize(wbuf, 0) < 0) {
        Py_DECREF(wbuf);
        return NULL;
    }
    Py_DECREF(wbuf);
    if (rc == -2)
        return NULL;
    if (rc < 0) {
        errno = err;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    /* ---- the answer's header and message */
    char in[INBUF];
    size_t have = 0, need = HEADER;
    uint32_t magic = 0, msg_len = 0;
    uint64_t payload_len = 0;
    for (int head_read = 0;; head_read = 1) {
        while (have < need) {
            Py_ssize_t got = recv_some(fd, in + have, sizeof in - have);
            if (got <= 0) {
                err = errno;
                if (stash(conn, in, have) < 0)
                    return NULL;
                if (got == -2)
                    return NULL;
                if (got == 0) /* (conn.read_frame_head meets the end and says so) */
                    Py_RETURN_TRUE;
                errno = err;
                return PyErr_SetFromErrno(PyExc_OSError);
            }
            have += (size_t)got;
        }
        if (head_read)
            break;
        memcpy(&magic, in, 4);
        memcpy(&msg_len, in + 4, 4);
        memcpy(&payload_len, in + 8, 8);
        if (magic != MAGIC || msg_len > sizeof in - HEADER) /* (bad, or large: Python's) */
            goto leave_to_python;
        need = HEADER + msg_len;
    }
    tensor_info t;
    uint64_t id;
    if (!parse_reply((const unsigned char *)in + HEADER, msg_len, &id, &t) || id != rid)
        goto leave_to_python;
    PyObject *key = PyLong_FromLongLong((long long)t.w.dtype);
    if (key == NULL)
        return NULL;
    PyObject *dtype = PyDict_GetItemWithError(np_dtypes, key); /* (borrowed) */
    Py_DECREF(key);
    if (dtype == NULL) {
        if (PyErr_Occurred())
            return NULL;
        goto leave_to_python; /* (a dtype not met yet: Python adds it) */
    }
    PyObject *backend =
        PyUnicode_DecodeUTF8(t.w.device.backend, (Py_ssize_t)t.w.device.backend_len, NULL);
    if (backend == NULL) {
        PyErr_Clear();
        goto leave_to_python;
    }
    PyObject *shape = PyTuple_New(t.w.ndim);
    if (shape == NULL) {
        Py_DECREF(backend);
        return NULL;
    }
    for (int i = 0; i < t.w.ndim; i++) {
        PyObject *d = PyLong_FromLongLong(t.shape[i]);
        if (d == NULL) {
            Py_DECREF(shape);
            Py_DECREF(backend);
            return NULL;
        }
        PyTuple_SET_ITEM(shape, i, d);
    }
    PyObject *eargs[2] = {shape, dtype};
    PyObject *arr = PyObject_Vectorcall(np_empty, eargs, 2, NULL);
    Py_buffer av;
    if (arr == NULL) { /* (a shape numpy refuses: Python's path says so) */
        PyErr_Clear();
    } else if (PyObject_GetBuffer(arr, &av, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) {
        PyErr_Clear();
        Py_CLEAR(arr);
    } else if ((uint64_t)av.len != payload_len) {
        PyBuffer_Release(&av);
        Py_CLEAR(arr);
    }
    if (arr == NULL) {
        Py_DECREF(shape);
        Py_DECREF(backend);
        goto leave_to_python;
    }
    /* ---- the payload: what came with the message, then straight into the array */
    size_t extra = have - need;
    size_t first = extra < payload_len ? extra : (size_t)payload_len;
    if (first)
        memcpy(av.buf, in + need, first);
    size_t got_total = first;
    int fail = 0;
    while (got_total < payload_len) {
        Py_ssize_t got = recv_some(fd, (char *)av.buf + got_total, (size_t)payload_len - got_total);
        if (got <= 0) {
            if (got == 0)
                PyErr_SetString(PyExc_ConnectionResetError,
                                "connection closed by the daemon during a payload");
            else if (got == -1)
                PyErr_SetFromErrno(PyExc_OSError);
            fail = 1;
            break;
        }
        got_total += (size_t)got;
    }
    PyBuffer_Release(&av);
    if (!fail && extra > first && stash(conn, in + need + first, extra - first) < 0)
        fail = 1;
    if (fail) {
        Py_DECREF(arr);
        Py_DECREF(shape);
        Py_DECREF(backend);
        return NULL;
    }
    return Py_BuildValue("(NLNNKO)", arr, (long long)t.w.dtype, shape, backend,
                         (unsigned long long)t.w.device.ordinal,
                         t.w.requires_grad ? Py_True : Py_False);
leave_to_python:
    if (stash(conn, in, have) < 0)
        return NULL;
    return Py_NewRef(Py_True);
}

static PyObject *download(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (!nargs_ok("download", nargs, 5))
        return NULL;
    if (socket_type == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "download: set_download_types() first");
        return NULL;
    }
    uint64_t rid, handle, rrid;
    if (as_u64(args[1], &rid) < 0 || as_u64(args[2], &handle) < 0 || as_u64(args[3], &rrid) < 0)
        return NULL;
    int fd = conn_fd(args[0]);
    if (fd == -2)
        return NULL;
    if (fd == -1)
        Py_RETURN_NONE;
    return roundtrip(args[0], fd, rid, handle, rrid, args[4]);
}

/* ------------------------------------------------------------------ op */

/* ------------------------------------------------------------------ session state */

/* SessionState: the bookkeeping of a session that the fast paths below (op, numpy) and the
 * Python Session share, owned here: the Session keeps one (Session._state) and its
 * attributes of these names (_open, _pending_release, ...) delegate to it, so this file reads
 * and writes the fields of its own struct instead of a Python object's private attributes.
 * tensordd/_state.py is its pure-Python twin (the same FIELDS, the same defaults), which the
 * client uses without this accelerator; tests/python/test_session_state.py holds one to the
 * other. */
#define STATE_FIELDS(X)                                                                            \
    X(F_OPEN, "open", "the session is usable (only True counts)")                                  \
    X(F_CAPTURING, "capturing", "a graph is being recorded: releases wait")                        \
    X(F_BUSY, "busy", "inside a round trip")                                                       \
    X(F_MEMFD, "memfd", "downloads may come as a memfd")                                           \
    X(F_DEFERRED, "deferred", "asynchronous failures, raised by the next synchronising call")      \
    X(F_IDS, "ids", "the request id counter (an iterator)")                                        \
    X(F_HANDLES, "handles", "the handle counter (an iterator)")                                    \
    X(F_CALLS, "calls", "request id -> what it was")                                               \
    X(F_PENDING_RELEASE, "pending_release", "handles to release with the next request")            \
    X(F_CONN, "conn", "the Connection")
#define FIELD_ENUM(e, name, doc) e,
enum { STATE_FIELDS(FIELD_ENUM) N_FIELDS };
#undef FIELD_ENUM
#define FIELD_NAME(e, name, doc) name,
static const char *const field_names[N_FIELDS] = {STATE_FIELDS(FIELD_NAME)};
#undef FIELD_NAME

typedef struct {
    PyObject_HEAD PyObject *f[N_FIELDS];
} state_object;

static PyTypeObject state_type;
static PyObject *count_fn; /* itertools.count */

/* A field (a new reference); AttributeError when Python deleted it. */
static PyObject *st_get(PyObject *st, int i)
{
    PyObject *v = ((state_object *)st)->f[i];
    if (v == NULL) {
        PyErr_Format(PyExc_AttributeError, "SessionState has no %s", field_names[i]);
        return NULL;
    }
    return Py_NewRef(v);
}

static void st_set(PyObject *st, int i, PyObject *v)
{
    Py_XSETREF(((state_object *)st)->f[i], Py_NewRef(v));
}

/* 1: the field is exactly True; 0: it is not; -1: deleted. */
static int st_true(PyObject *st, int i)
{
    PyObject *v = ((state_object *)st)->f[i];
    if (v == NULL) {
        PyErr_Format(PyExc_AttributeError, "SessionState has no %s", field_names[i]);
        return -1;
    }
    return v == Py_True;
}

/* next() of a counter field (StopIteration would be a bug: RuntimeError). */
static PyObject *st_next(PyObject *st, int i)
{
    PyObject *it = st_get(st, i);
    if (it == NULL)
        return NULL;
    PyObject *v = PyIter_Next(it);
    Py_DECREF(it);
    if (v == NULL && !PyErr_Occurred())
        PyErr_SetString(PyExc_RuntimeError, "an id counter ran out");
    return v;
}

/* The defaults (as _state.py's): closed, nothing pending, both counters at 1. */
static PyObject *state_new(PyTypeObject *tp, PyObject *args, PyObject *kw)
{
    if ((args && PyTuple_GET_SIZE(args)) || (kw && PyDict_GET_SIZE(kw))) {
        PyErr_SetString(PyExc_TypeError, "SessionState() takes no arguments");
        return NULL;
    }
    state_object *st = (state_object *)tp->tp_alloc(tp, 0);
    if (st == NULL)
        return NULL;
    PyObject *one = PyLong_FromLong(1);
    st->f[F_OPEN] = Py_NewRef(Py_False);
    st->f[F_CAPTURING] = Py_NewRef(Py_False);
    st->f[F_BUSY] = Py_NewRef(Py_False);
    st->f[F_MEMFD] = Py_NewRef(Py_False);
    st->f[F_DEFERRED] = PyList_New(0);
    st->f[F_IDS] = one ? PyObject_CallOneArg(count_fn, one) : NULL;
    st->f[F_HANDLES] = one ? PyObject_CallOneArg(count_fn, one) : NULL;
    st->f[F_CALLS] = PyDict_New();
    st->f[F_PENDING_RELEASE] = PyList_New(0);
    st->f[F_CONN] = Py_NewRef(Py_None);
    Py_XDECREF(one);
    for (int i = 0; i < N_FIELDS; i++)
        if (st->f[i] == NULL) {
            Py_DECREF(st);
            return NULL;
        }
    return (PyObject *)st;
}

static int state_traverse(PyObject *o, visitproc visit, void *arg)
{
    for (int i = 0; i < N_FIELDS; i++)
        Py_VISIT(((state_object *)o)->f[i]);
    return 0;
}

static int state_clear(PyObject *o)
{
    for (int i = 0; i < N_FIELDS; i++)
        Py_CLEAR(((state_object *)o)->f[i]);
    return 0;
}

static void state_dealloc(PyObject *o)
{
    PyObject_GC_UnTrack(o);
    state_clear(o);
    Py_TYPE(o)->tp_free(o);
}

#define FIELD_MEMBER(e, name, doc)                                                                 \
    {name, T_OBJECT_EX, offsetof(state_object, f) + (e) * sizeof(PyObject *), 0, doc},
static PyMemberDef state_members[N_FIELDS + 1] = {STATE_FIELDS(FIELD_MEMBER){NULL, 0, 0, 0, NULL}};
#undef FIELD_MEMBER

static PyTypeObject state_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "tensordd._speedups.SessionState",
    .tp_basicsize = sizeof(state_object),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "A session's bookkeeping that the accelerator and the Python Session share.",
    .tp_new = state_new,
    .tp_traverse = state_traverse,
    .tp_clear = state_clear,
    .tp_dealloc = state_dealloc,
    .tp_members = state_members,
};

/* op and numpy take one as their first argument. */
static int is_state(PyObject *o, const char *fn)
{
    if (Py_IS_TYPE(o, &state_type))
        return 1;
    PyErr_Format(PyExc_TypeError, "%s: the first argument must be a SessionState", fn);
    return 0;
}

/* ------------------------------------------------------------------ op */

/* op(state, session, name, inputs[, extra]): Session._op_fast's common case in one call:
 * when the session is open, no Release batch is due, the connection keeps no resume journal
 * and the frame leaves its write buffer under the high-water mark, the op's frame is
 * appended to it (request and handle ids from the state's counters, the call remembered in
 * state.calls as (name, inputs, out)) and the new Tensor(session, out) is returned; else
 * None and nothing is done (the caller's own path). state is the session's SessionState;
 * set_op_types must have run. */

static PyObject *tensor_type;
static Py_ssize_t release_batch, high_water;

/* Tensor.__init__(session, handle) without running it, where Tensor's attributes are
 * all __slots__ (set_op_types checks): the slots' offsets, and the value of _grad. */
static const char *const tensor_slots[] = {"_session", "_handle",        "_shape", "_dtype",
                                           "_device",  "_requires_grad", "_leaf",  "_grad"};
#define N_TENSOR_SLOTS (sizeof tensor_slots / sizeof *tensor_slots)
static Py_ssize_t slot_offset[N_TENSOR_SLOTS];
static PyObject *grad_unset;

/* 1 when every name of tensor_slots is an object slot of type tp (offsets filled). */
static int find_slots(PyTypeObject *tp)
{
    for (size_t i = 0; i < N_TENSOR_SLOTS; i++) {
        PyObject *d = PyDict_GetItemString(tp->tp_dict, tensor_slots[i]);
        if (d == NULL || !Py_IS_TYPE(d, &PyMemberDescr_Type))
            return 0;
        PyMemberDef *m = ((PyMemberDescrObject *)d)->d_member;
        if (m->type != T_OBJECT_EX || (m->flags & READONLY))
            return 0;
        slot_offset[i] = m->offset;
    }
    return 1;
}

/* A new Tensor(session, handle), as its __init__ leaves it. */
static PyObject *new_tensor(PyObject *session, PyObject *handle)
{
    if (grad_unset == NULL) {
        PyObject *targs[2] = {session, handle};
        return PyObject_Vectorcall(tensor_type, targs, 2, NULL);
    }
    PyTypeObject *tp = (PyTypeObject *)tensor_type;
    PyObject *t = tp->tp_alloc(tp, 0);
    if (t == NULL)
        return NULL;
    PyObject *values[N_TENSOR_SLOTS] = {session, handle,  Py_None, Py_None,
                                        Py_None, Py_None, Py_None, grad_unset};
    for (size_t i = 0; i < N_TENSOR_SLOTS; i++)
        *(PyObject **)((char *)t + slot_offset[i]) = Py_NewRef(values[i]);
    return t;
}

static PyObject *set_op_types(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 4 && !nargs_ok("set_op_types", nargs, 3))
        return NULL;
    Py_ssize_t batch = PyLong_AsSsize_t(args[1]);
    if (batch == -1 && PyErr_Occurred())
        return NULL;
    Py_ssize_t high = PyLong_AsSsize_t(args[2]);
    if (high == -1 && PyErr_Occurred())
        return NULL;
    Py_INCREF(args[0]);
    Py_XSETREF(tensor_type, args[0]);
    release_batch = batch;
    high_water = high;
    /* (with the value of an unset _grad: Tensors made without running __init__) */
    Py_CLEAR(grad_unset);
    if (nargs == 4 && PyType_Check(args[0]) && find_slots((PyTypeObject *)args[0]))
        grad_unset = Py_NewRef(args[3]);
    return Py_NewRef(Py_None);
}

static PyObject *op_new(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if ((nargs != 5 && !nargs_ok("op", nargs, 4)) || !is_state(args[0], "op"))
        return NULL;
    if (tensor_type == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "op: set_op_types() first");
        return NULL;
    }
    PyObject *st = args[0], *session = args[1], *name = args[2], *inputs = args[3];
    PyObject *extra = nargs == 5 ? args[4] : NULL;
    if (extra != NULL && (!PyBytes_Check(extra) || PyBytes_GET_SIZE(extra) == 0))
        extra = NULL; /* (b"": none) */
    int r = st_true(st, F_OPEN);
    if (r <= 0)
        return r < 0 ? NULL : Py_NewRef(Py_None);
    PyObject *pending = st_get(st, F_PENDING_RELEASE);
    if (pending == NULL)
        return NULL;
    Py_ssize_t npending = PyList_Check(pending) ? PyList_GET_SIZE(pending) : release_batch;
    Py_DECREF(pending);
    if (npending >= release_batch)
        Py_RETURN_NONE;
    PyObject *conn = st_get(st, F_CONN);
    if (conn == NULL)
        return NULL;
    PyObject *journal = PyObject_GetAttr(conn, s_journal);
    PyObject *wbuf = journal == NULL ? NULL : PyObject_GetAttr(conn, s_wbuf);
    Py_DECREF(conn);
    if (wbuf == NULL) {
        Py_XDECREF(journal);
        return NULL;
    }
    int usable = journal == Py_None && PyByteArray_CheckExact(wbuf) && PyUnicode_Check(name) &&
                 PyList_CheckExact(inputs) && PyList_GET_SIZE(inputs) > 0 &&
                 PyList_GET_SIZE(inputs) <= 8;
    Py_DECREF(journal);
    /* (a bound on the frame: 16 + 2 * 11 + name + 3 * 11 + 11 per input + extra) */
    Py_ssize_t name_len = 0;
    if (usable && PyUnicode_AsUTF8AndSize(name, &name_len) == NULL) {
        Py_DECREF(wbuf);
        return NULL;
    }
    if (usable) {
        Py_ssize_t bound = 16 + 22 + name_len + 33 + 11 * PyList_GET_SIZE(inputs) +
                           (extra ? PyBytes_GET_SIZE(extra) + 11 : 0);
        usable = PyByteArray_GET_SIZE(wbuf) + bound < high_water;
    }
    if (!usable) {
        Py_DECREF(wbuf);
        Py_RETURN_NONE;
    }
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(inputs); i++) { /* (checked before ids go) */
        uint64_t h;
        if (as_u64(PyList_GET_ITEM(inputs, i), &h) < 0) {
            Py_DECREF(wbuf);
            return NULL;
        }
    }
    PyObject *out = NULL, *rid = NULL, *call = NULL, *calls = NULL, *t = NULL;
    if ((out = st_next(st, F_HANDLES)) == NULL || (rid = st_next(st, F_IDS)) == NULL)
        goto done;
    call = PyTuple_Pack(3, name, inputs, out);
    calls = call ? st_get(st, F_CALLS) : NULL;
    if (calls == NULL || PyObject_SetItem(calls, rid, call) < 0)
        goto done;
    PyObject *fargs[5] = {rid, name, inputs, out, extra};
    PyObject *len = op_request(fargs, extra ? 5 : 4, 2, wbuf);
    if (len == NULL)
        goto done;
    Py_DECREF(len);
    t = new_tensor(session, out);
done:
    Py_XDECREF(calls);
    Py_XDECREF(call);
    Py_XDECREF(rid);
    Py_XDECREF(out);
    Py_DECREF(wbuf);
    return t;
}

/* ------------------------------------------------------------------ numpy */

/* numpy(state, session, t): Tensor.numpy's whole download in one call, Session._download's
 * bookkeeping included, in state, the session's SessionState (the Release of pending handles
 * and the Download get the next request ids, both remembered in state.calls; t's shape, dtype,
 * device and requires_grad are set from the answer; bfloat16 is widened). Returns the array; the
 * request id (an int) when the Download went out but its answer is for Python's path
 * (Session._download_answer); None when nothing was done (a closed session, a pending
 * deferred error, a memfd-sized download, a connection download cannot use).
 * set_numpy_types must have run. */

static PyObject *dtype_names, *dtype_name_fn, *devices, *device_fn, *widen_fn;
static Py_ssize_t call_trim;
static long bf16_wire;
static PyObject *s_forget, *s_handle, *s_shape, *s_dtype, *s_device, *s_rgrad, *s_release,
    *s_download;

static PyObject *set_numpy_types(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (!nargs_ok("set_numpy_types", nargs, 7))
        return NULL;
    if (!PyDict_Check(args[0]) || !PyDict_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "set_numpy_types: dtype names and devices are dicts");
        return NULL;
    }
    Py_ssize_t trim = PyLong_AsSsize_t(args[4]);
    long bf16 = PyLong_AsLong(args[5]);
    if (PyErr_Occurred())
        return NULL;
    Py_INCREF(args[0]);
    Py_INCREF(args[1]);
    Py_INCREF(args[2]);
    Py_INCREF(args[3]);
    Py_INCREF(args[6]);
    Py_XSETREF(dtype_names, args[0]);
    Py_XSETREF(dtype_name_fn, args[1]);
    Py_XSETREF(devices, args[2]);
    Py_XSETREF(device_fn, args[3]);
    Py_XSETREF(widen_fn, args[6]);
    call_trim = trim;
    bf16_wire = bf16;
    Py_RETURN_NONE;
}

/* The value of dict[key], else fn(*args) (a new reference). */
static PyObject *lookup_or_call(PyObject *dict, PyObject *key, PyObject *fn, PyObject *const *args,
                                size_t n)
{
    PyObject *v = PyDict_GetItemWithError(dict, key);
    if (v != NULL)
        return Py_NewRef(v);
    if (PyErr_Occurred())
        return NULL;
    return PyObject_Vectorcall(fn, args, n, NULL);
}

static PyObject *tensor_numpy(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (!nargs_ok("numpy", nargs, 3) || !is_state(args[0], "numpy"))
        return NULL;
    if (socket_type == NULL || dtype_names == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "numpy: set_download_types() and "
                                            "set_numpy_types() first");
        return NULL;
    }
    PyObject *st = args[0], *session = args[1], *t = args[2];
    int r = st_true(st, F_OPEN);
    if (r <= 0)
        return r < 0 ? NULL : Py_NewRef(Py_None);
    PyObject *o = st_get(st, F_DEFERRED);
    if (o == NULL)
        return NULL;
    int none_deferred = PyList_CheckExact(o) && PyList_GET_SIZE(o) == 0;
    Py_DECREF(o);
    if (!none_deferred)
        Py_RETURN_NONE;
    if ((r = st_true(st, F_MEMFD)) != 0) { /* (a size known: maybe a memfd's) */
        if (r < 0)
            return NULL;
        o = PyObject_GetAttr(t, s_shape);
        if (o == NULL)
            return NULL;
        Py_DECREF(o);
        if (o != Py_None)
            Py_RETURN_NONE;
    }
    PyObject *conn = st_get(st, F_CONN);
    if (conn == NULL)
        return NULL;
    int fd = conn_fd(conn);
    PyObject *h = fd >= 0 ? PyObject_GetAttr(t, s_handle) : NULL;
    uint64_t handle = 0;
    if (fd < 0 || h == NULL || as_u64(h, &handle) < 0) {
        Py_XDECREF(h);
        Py_DECREF(conn);
        if (fd == -1)
            Py_RETURN_NONE;
        return NULL;
    }
    /* ---- from here on as Session._download: ids, the calls remembered */
    PyObject *rel = NULL, *rrid = NULL, *rid = NULL, *calls = NULL, *call = NULL, *res = NULL;
    PyObject *pending = st_get(st, F_PENDING_RELEASE);
    if (pending == NULL)
        goto done;
    int capturing = st_true(st, F_CAPTURING);
    if (capturing < 0)
        goto done;
    calls = st_get(st, F_CALLS);
    if (calls == NULL)
        goto done;
    if (PyObject_IsTrue(pending) == 1 && !capturing) {
        PyObject *fresh = PyList_New(0);
        if (fresh == NULL)
            goto done;
        st_set(st, F_PENDING_RELEASE, fresh);
        Py_DECREF(fresh);
        rel = pending;
        pending = NULL;
        if ((rrid = st_next(st, F_IDS)) == NULL ||
            (call = PyTuple_Pack(2, s_release, rel)) == NULL ||
            PyObject_SetItem(calls, rrid, call) < 0)
            goto done;
        Py_CLEAR(call);
    }
    if ((rid = st_next(st, F_IDS)) == NULL)
        goto done;
    PyObject *hs = PyTuple_Pack(1, h);
    if (hs == NULL)
        goto done;
    call = PyTuple_Pack(2, s_download, hs);
    Py_DECREF(hs);
    if (call == NULL || PyObject_SetItem(calls, rid, call) < 0)
        goto done;
    uint64_t rid_v, rrid_v = 0;
    if (as_u64(rid, &rid_v) < 0 || (rrid && as_u64(rrid, &rrid_v) < 0))
        goto done;
    st_set(st, F_BUSY, Py_True);
    PyObject *got = roundtrip(conn, fd, rid_v, handle, rrid_v, rel ? rel : Py_None);
    st_set(st, F_BUSY, Py_False); /* (cannot fail: the exception, if any, stays set) */
    if (got == NULL)
        goto done;
    if (got == Py_True) { /* (the answer is Python's to read) */
        Py_DECREF(got);
        res = Py_NewRef(rid);
        goto done;
    }
    /* ---- (array, dtype, shape, backend, ordinal, requires_grad): t's metadata */
    PyObject *arr = PyTuple_GET_ITEM(got, 0), *wire = PyTuple_GET_ITEM(got, 1);
    PyObject *dev_args[2] = {PyTuple_GET_ITEM(got, 3), PyTuple_GET_ITEM(got, 4)};
    PyObject *name = lookup_or_call(dtype_names, wire, dtype_name_fn, &wire, 1);
    PyObject *key = name ? PyTuple_Pack(2, dev_args[0], dev_args[1]) : NULL;
    PyObject *dev = key ? lookup_or_call(devices, key, device_fn, dev_args, 2) : NULL;
    Py_XDECREF(key);
    if (dev == NULL || PyObject_SetAttr(t, s_shape, PyTuple_GET_ITEM(got, 2)) < 0 ||
        PyObject_SetAttr(t, s_dtype, name) < 0 || PyObject_SetAttr(t, s_device, dev) < 0 ||
        PyObject_SetAttr(t, s_rgrad, PyTuple_GET_ITEM(got, 5)) < 0) {
        Py_XDECREF(name);
        Py_XDECREF(dev);
        Py_DECREF(got);
        goto done;
    }
    Py_DECREF(name);
    Py_DECREF(dev);
    if (PyDict_Check(calls) && PyDict_GET_SIZE(calls) >= call_trim) {
        PyObject *x = PyObject_CallMethodNoArgs(session, s_forget);
        if (x == NULL) {
            Py_DECREF(got);
            goto done;
        }
        Py_DECREF(x);
    }
    long w = PyLong_AsLong(wire);
    if (w == bf16_wire)
        res = PyObject_CallOneArg(widen_fn, arr);
    else
        res = Py_NewRef(arr);
    Py_DECREF(got);
done:
    Py_XDECREF(pending);
    Py_XDECREF(rel);
    Py_XDECREF(rrid);
    Py_XDECREF(rid);
    Py_XDECREF(calls);
    Py_XDECREF(call);
    Py_DECREF(h);
    Py_DECREF(conn);
    return res;
}

/* ------------------------------------------------------------------ module */

static PyMethodDef methods[] = {
    {"encode_op", (PyCFunction)(void (*)(void))encode_op, METH_FASTCALL,
     "The encoded Request of an op (see _codec.py)."},
    {"frame_op", (PyCFunction)(void (*)(void))frame_op, METH_FASTCALL,
     "The whole frame of an op request."},
    {"frame_download", (PyCFunction)(void (*)(void))frame_download, METH_FASTCALL,
     "The whole frame of a Download."},
    {"frame_release", (PyCFunction)(void (*)(void))frame_release, METH_FASTCALL,
     "The whole frame of a Release."},
    {"append_op", (PyCFunction)(void (*)(void))append_op, METH_FASTCALL,
     "frame_op's bytes appended to a bytearray; its new length."},
    {"copy_into", (PyCFunction)(void (*)(void))copy_into, METH_FASTCALL,
     "Copies src[pos:] into dest as far as it fits: (bytes copied, bytes left to fill)."},
    {"set_download_types", (PyCFunction)(void (*)(void))set_download_types, METH_FASTCALL,
     "set_download_types(socket.socket, numpy.empty, {wire dtype: numpy dtype}) for download."},
    {"download", (PyCFunction)(void (*)(void))download, METH_FASTCALL,
     "download(conn, rid, handle, release_rid, release_handles): a Download's round trip "
     "on a plain socket; None, True or (array, dtype, shape, backend, ordinal, "
     "requires_grad) (see the source)."},
    {"set_op_types", (PyCFunction)(void (*)(void))set_op_types, METH_FASTCALL,
     "set_op_types(Tensor, release batch, write high-water mark) for op."},
    {"op", (PyCFunction)(void (*)(void))op_new, METH_FASTCALL,
     "op(state, session, name, inputs[, extra]): Session._op_fast's common case; the new "
     "Tensor, or None (see the source)."},
    {"set_numpy_types", (PyCFunction)(void (*)(void))set_numpy_types, METH_FASTCALL,
     "set_numpy_types(dtype names, dtype_name, devices, device, call trim, bf16 wire, "
     "widen) for numpy."},
    {"numpy", (PyCFunction)(void (*)(void))tensor_numpy, METH_FASTCALL,
     "numpy(state, session, t): Tensor.numpy's download in one call; the array, a request id "
     "whose answer is Python's to read, or None (see the source)."},
    {"parse_tensor_reply", parse_tensor_reply, METH_O,
     "(id, handle, dtype, shape, backend, ordinal, requires_grad) of a plain tensor "
     "Response; None for anything else."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    "tensordd._speedups",
    "The Python client's optional accelerator.",
    -1,
    methods,
    NULL,
    NULL,
    NULL,
    NULL,
};

PyMODINIT_FUNC PyInit__speedups(void);

PyMODINIT_FUNC PyInit__speedups(void)
{
    const uint16_t one = 1;
    if (*(const unsigned char *)&one != 1) { /* a big-endian host: the pure-Python path */
        PyErr_SetString(PyExc_ImportError, "tensordd._speedups: little-endian hosts only");
        return NULL;
    }
    s_journal = PyUnicode_InternFromString("_journal");
    s_want_fds = PyUnicode_InternFromString("want_fds");
    s_sock = PyUnicode_InternFromString("sock");
    s_wbuf = PyUnicode_InternFromString("_wbuf");
    s_rbuf = PyUnicode_InternFromString("_rbuf");
    s_rpos = PyUnicode_InternFromString("_rpos");
    s_timeout = PyUnicode_InternFromString("timeout");
    s_fileno = PyUnicode_InternFromString("fileno");
    static const char *const names[] = {"read_frame_head", "read_into", "send_frame",
                                        "write_frame",     "flush",     "_fill"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++)
        if ((conn_methods[i] = PyUnicode_InternFromString(names[i])) == NULL)
            return NULL;
    s_forget = PyUnicode_InternFromString("_forget_calls");
    s_handle = PyUnicode_InternFromString("_handle");
    s_shape = PyUnicode_InternFromString("_shape");
    s_dtype = PyUnicode_InternFromString("_dtype");
    s_device = PyUnicode_InternFromString("_device");
    s_rgrad = PyUnicode_InternFromString("_requires_grad");
    s_release = PyUnicode_InternFromString("release");
    s_download = PyUnicode_InternFromString("download");
    if (!s_forget || !s_handle || !s_shape || !s_dtype || !s_device || !s_rgrad || !s_release ||
        !s_download)
        return NULL;
    if (!s_journal || !s_want_fds || !s_sock || !s_wbuf || !s_rbuf || !s_rpos || !s_timeout ||
        !s_fileno)
        return NULL;
    PyObject *itertools = PyImport_ImportModule("itertools");
    count_fn = itertools ? PyObject_GetAttrString(itertools, "count") : NULL;
    Py_XDECREF(itertools);
    if (count_fn == NULL || PyType_Ready(&state_type) < 0)
        return NULL;
    PyObject *fields = PyTuple_New(N_FIELDS);
    if (fields == NULL)
        return NULL;
    for (int i = 0; i < N_FIELDS; i++) {
        PyObject *f = PyUnicode_InternFromString(field_names[i]);
        if (f == NULL) {
            Py_DECREF(fields);
            return NULL;
        }
        PyTuple_SET_ITEM(fields, i, f);
    }
    int rc = PyDict_SetItemString(state_type.tp_dict, "FIELDS", fields);
    Py_DECREF(fields);
    if (rc < 0)
        return NULL;
    PyType_Modified(&state_type);
    PyObject *m = PyModule_Create(&module);
    if (m == NULL || PyModule_AddObjectRef(m, "SessionState", (PyObject *)&state_type) < 0) {
        Py_XDECREF(m);
        return NULL;
    }
    return m;
}
