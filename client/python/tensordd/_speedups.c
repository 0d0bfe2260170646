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
 * Built when a compiler and Python's headers are there (python.mk, setup.py);
 * _codec.py falls back to pure Python without it. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <string.h>

#define MAGIC 0x01444454u /* "TDD" + frame version 1 (proto/frame.h) */
#define HEADER 16
#define MAX_DIMS 64

/* ------------------------------------------------------------------ encoding */

static size_t varint_len(uint64_t v)
{
    size_t n = 1;
    while (v >= 0x80) {
        v >>= 7;
        n++;
    }
    return n;
}

static char *put_varint(char *p, uint64_t v)
{
    while (v >= 0x80) {
        *p++ = (char)((v & 0x7F) | 0x80);
        v >>= 7;
    }
    *p++ = (char)v;
    return p;
}

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
    size_t ins_len = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (as_u64(items[i], &ins[i]) < 0) {
            if (ins != small)
                PyMem_Free(ins);
            Py_DECREF(seq);
            return NULL;
        }
        ins_len += varint_len(ins[i]);
    }
    Py_DECREF(seq);
    size_t out_len = varint_len(out);
    size_t body = 1 + varint_len((uint64_t)name_len) + (size_t)name_len + 1 + varint_len(ins_len) +
                  ins_len + 1 + varint_len(out_len) + out_len + (size_t)extra_len;
    size_t msg = 1 + varint_len(rid) + 1 + varint_len(body) + body;
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
    if (res == NULL) {
        if (ins != small)
            PyMem_Free(ins);
        return NULL;
    }
    if (framed)
        p = put_header(p, msg);
    *p++ = 0x08; /* Request.id */
    p = put_varint(p, rid);
    *p++ = 0x72; /* Request.op (14) */
    p = put_varint(p, body);
    *p++ = 0x0a; /* Op.op */
    p = put_varint(p, (uint64_t)name_len);
    memcpy(p, name, (size_t)name_len);
    p += name_len;
    *p++ = 0x12; /* Op.inputs, packed */
    p = put_varint(p, ins_len);
    for (Py_ssize_t i = 0; i < n; i++)
        p = put_varint(p, ins[i]);
    *p++ = 0x1a; /* Op.outputs, packed */
    p = put_varint(p, out_len);
    p = put_varint(p, out);
    if (extra_len)
        memcpy(p, extra, (size_t)extra_len);
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
    size_t body = 1 + varint_len(handle);
    size_t msg = 1 + varint_len(rid) + 1 + varint_len(body) + body;
    PyObject *res = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(HEADER + msg));
    if (res == NULL)
        return NULL;
    char *p = put_header(PyBytes_AS_STRING(res), msg);
    *p++ = 0x08;
    p = put_varint(p, rid);
    *p++ = 0x6a; /* Request.download (13) */
    p = put_varint(p, body);
    *p++ = 0x08; /* Download.handle */
    put_varint(p, handle);
    return res;
}

static PyObject *frame_release(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (!nargs_ok("frame_release", nargs, 2))
        return NULL;
    PyObject *rid_o = args[0], *handles_o = args[1];
    uint64_t rid;
    if (as_u64(rid_o, &rid) < 0)
        return NULL;
    PyObject *seq = PySequence_Fast(handles_o, "handles must be a sequence");
    if (seq == NULL)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    size_t hs_len = 0;
    for (Py_ssize_t i = 0; i < n; i++) { /* sizes first: values checked here */
        uint64_t h;
        if (as_u64(items[i], &h) < 0) {
            Py_DECREF(seq);
            return NULL;
        }
        hs_len += varint_len(h);
    }
    size_t body = n ? 1 + varint_len(hs_len) + hs_len : 0;
    size_t msg = 1 + varint_len(rid) + 1 + varint_len(body) + body;
    PyObject *res = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(HEADER + msg));
    if (res == NULL) {
        Py_DECREF(seq);
        return NULL;
    }
    char *p = put_header(PyBytes_AS_STRING(res), msg);
    *p++ = 0x08;
    p = put_varint(p, rid);
    *p++ = 0x7a; /* Request.release (15) */
    p = put_varint(p, body);
    if (n) {
        *p++ = 0x0a; /* Release.handles, packed */
        p = put_varint(p, hs_len);
        for (Py_ssize_t i = 0; i < n; i++) /* (checked above: cannot fail) */
            p = put_varint(p, (uint64_t)PyLong_AsUnsignedLongLong(items[i]));
    }
    Py_DECREF(seq);
    return res;
}

/* ------------------------------------------------------------------ decoding */

typedef struct {
    const unsigned char *p, *end;
} reader;

/* 0 and the value, or -1 on a truncated or over-long varint. */
static int get_varint(reader *r, uint64_t *out)
{
    uint64_t v = 0;
    for (int shift = 0; shift < 64 && r->p < r->end; shift += 7) {
        unsigned char b = *r->p++;
        v |= (uint64_t)(b & 0x7F) << shift;
        if (b < 0x80) {
            if (shift == 63 && b > 1)
                return -1;
            *out = v;
            return 0;
        }
    }
    return -1;
}

/* A length-delimited field's bytes. */
static int get_bytes(reader *r, reader *sub)
{
    uint64_t n;
    if (get_varint(r, &n) < 0 || n > (uint64_t)(r->end - r->p))
        return -1;
    sub->p = r->p;
    sub->end = r->p + n;
    r->p += n;
    return 0;
}

typedef struct {
    uint64_t handle, ordinal;
    int64_t dtype;
    int64_t shape[MAX_DIMS];
    int ndim, requires_grad;
    const char *backend;
    size_t backend_len;
} tensor_info;

/* Device{backend = 1 (string), ordinal = 2 (uint32)}; -1: not the plain form. */
static int parse_device(reader r, tensor_info *t)
{
    int seen_b = 0, seen_o = 0;
    while (r.p < r.end) {
        uint64_t key, v;
        if (get_varint(&r, &key) < 0)
            return -1;
        if (key == 0x0a && !seen_b) {
            reader s;
            if (get_bytes(&r, &s) < 0)
                return -1;
            t->backend = (const char *)s.p;
            t->backend_len = (size_t)(s.end - s.p);
            seen_b = 1;
        } else if (key == 0x10 && !seen_o) {
            if (get_varint(&r, &v) < 0)
                return -1;
            t->ordinal = v & 0xFFFFFFFFu; /* uint32: protobuf keeps the low 32 bits */
            seen_o = 1;
        } else {
            return -1;
        }
    }
    return 0;
}

/* TensorInfo{handle 1, dtype 2, shape 3 (int64, packed or not), device 4,
 * requires_grad 5}; each scalar at most once, else -1 (protobuf decides). */
static int parse_info(reader r, tensor_info *t)
{
    int seen = 0;
    while (r.p < r.end) {
        uint64_t key, v;
        if (get_varint(&r, &key) < 0)
            return -1;
        switch (key) {
        case 0x08: /* handle */
        case 0x10: /* dtype */
        case 0x28: /* requires_grad */
        {
            int bit = 1 << (key >> 3);
            if ((seen & bit) || get_varint(&r, &v) < 0)
                return -1;
            seen |= bit;
            if (key == 0x08) {
                t->handle = v;
            } else if (key == 0x10) {
                if (v > 0x7FFFFFFFu) /* (negative or out of int32 range: protobuf's call) */
                    return -1;
                t->dtype = (int64_t)v;
            } else {
                t->requires_grad = v != 0;
            }
            break;
        }
        case 0x18: /* one shape value */
            if (t->ndim == MAX_DIMS || get_varint(&r, &v) < 0)
                return -1;
            t->shape[t->ndim++] = (int64_t)v;
            break;
        case 0x1a: { /* packed shape values */
            reader s;
            if (get_bytes(&r, &s) < 0)
                return -1;
            while (s.p < s.end) {
                if (t->ndim == MAX_DIMS || get_varint(&s, &v) < 0)
                    return -1;
                t->shape[t->ndim++] = (int64_t)v;
            }
            break;
        }
        case 0x22: { /* device */
            reader s;
            if ((seen & (1 << 4)) || get_bytes(&r, &s) < 0 || parse_device(s, t) < 0)
                return -1;
            seen |= 1 << 4;
            break;
        }
        default:
            return -1;
        }
    }
    return 0;
}

static PyObject *parse_tensor_reply(PyObject *self, PyObject *arg)
{
    (void)self;
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    reader r = {view.buf, (const unsigned char *)view.buf + view.len};
    tensor_info t;
    memset(&t, 0, sizeof t);
    t.backend = "";
    uint64_t id = 0;
    int seen_id = 0, seen_body = 0, ok = 1;
    while (ok && r.p < r.end) {
        uint64_t key;
        if (get_varint(&r, &key) < 0) {
            ok = 0;
        } else if (key == 0x08 && !seen_id) {
            ok = get_varint(&r, &id) == 0;
            seen_id = 1;
        } else if (key == 0x72 && !seen_body) { /* Response.tensor (14) */
            reader s;
            ok = get_bytes(&r, &s) == 0 && parse_info(s, &t) == 0;
            seen_body = 1;
        } else {
            ok = 0;
        }
    }
    PyObject *res = NULL;
    if (!ok || !seen_body) {
        res = Py_None;
        Py_INCREF(res);
        goto out;
    }
    PyObject *backend = PyUnicode_DecodeUTF8(t.backend, (Py_ssize_t)t.backend_len, NULL);
    if (backend == NULL) { /* not UTF-8: protobuf says what that is */
        PyErr_Clear();
        res = Py_None;
        Py_INCREF(res);
        goto out;
    }
    PyObject *shape = PyTuple_New(t.ndim);
    if (shape == NULL) {
        Py_DECREF(backend);
        goto out;
    }
    for (int i = 0; i < t.ndim; i++) {
        PyObject *d = PyLong_FromLongLong(t.shape[i]);
        if (d == NULL) {
            Py_DECREF(shape);
            Py_DECREF(backend);
            goto out;
        }
        PyTuple_SET_ITEM(shape, i, d);
    }
    res = Py_BuildValue("(KKLNNKO)", (unsigned long long)id, (unsigned long long)t.handle,
                        (long long)t.dtype, shape, backend, (unsigned long long)t.ordinal,
                        t.requires_grad ? Py_True : Py_False);
out:
    PyBuffer_Release(&view);
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
    return PyModule_Create(&module);
}
