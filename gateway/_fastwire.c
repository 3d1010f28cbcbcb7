/* gateway._fastwire: the fast path's wire mechanics in C, the compiled twin of
 * gateway/fastwire.py (whose docstring gives the wire layouts) and of
 * nfsproto.rpc.RecordReader.
 *
 * Owns: recognising a call the fast path may answer (parse_call), assembling its reply
 * records (reply_*, pad), reassembling RPC records from a TCP byte stream (RecordReader), and
 * the read-only file mappings READ data is sent from (Mapping: mmap.mmap without the file
 * descriptor mmap.mmap keeps open for each one), and the bytes an HTTP body is received into
 * (BodyBuffer: gateway.backend.http1's, whose twin is a bytearray and a copy), and reading
 * such a mapping's pages without dying of SIGBUS (copy_mapped, mapped_readable: see "Guarded
 * reads of mappings" below).
 * Every function gives the same result as its Python twin for the same arguments, byte for
 * byte: the same tuple, the same None for every record the twin declines, the same
 * exception class (and message) for the same bad argument.
 *
 * Must not: decide anything (that is gateway.fastpath's), accept a record the twin would
 * decline, read a byte it has not checked is inside the buffer (the records are hostile
 * network data), read a word through an unaligned pointer (words are assembled from bytes),
 * or import anything from the project.
 *
 * Arguments: records, attributes and handles are taken through the buffer protocol as one
 * contiguous run of bytes (PyBUF_SIMPLE): pass bytes, bytearray or a contiguous memoryview of
 * bytes. A non-contiguous memoryview raises BufferError, an object without the buffer
 * protocol TypeError, where the twin may first answer (None, or ValueError for a wrong
 * length) from len() alone.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define NFS_PROGRAM 100003u
#define GETATTR 1u
#define LOOKUP 3u
#define ACCESS 4u
#define READ 6u
#define FATTR3_SIZE 84
#define NFS3ERR_NOENT 2u
#define MAX_AUTH 400u
#define MAX_FH 64u
#define MAX_NAME 255u
#define LAST_FRAGMENT 0x80000000u
#define MAX_READ_COUNT 0x7FFFFF00LL

#define MIN_CALL 44      /* header, empty credential and verifier, a handle's length */
#define HEAD 32          /* mark, xid, REPLY, MSG_ACCEPTED, verifier (2 words), SUCCESS, status */
#define HEAD_RECORD 28   /* the head's bytes counted by the mark (all but the mark) */
#define POST_OP_ATTR (4 + FATTR3_SIZE)

/* Objects made once at import: the pads, and what the slow paths of argument conversion need. */
static PyObject *struct_error;  /* struct.error: what the twin's struct.pack raises */
static PyObject *pads;          /* (b"", b"\0\0\0", b"\0\0", b"\0"): pad(n) is pads[n & 3] */
static PyObject *int_three;
static PyObject *int_zero;
static PyObject *int_max_read;

/* ------------------------------------------------------------------------- bytes and words */

static inline uint32_t
get_u32(const uint8_t *p)
{
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) |
           (uint32_t)p[3];
}

static inline uint64_t
get_u64(const uint8_t *p)
{
    return ((uint64_t)get_u32(p) << 32) | (uint64_t)get_u32(p + 4);
}

static inline uint8_t *
put_u32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)(v >> 24);
    p[1] = (uint8_t)(v >> 16);
    p[2] = (uint8_t)(v >> 8);
    p[3] = (uint8_t)v;
    return p + 4;
}

static inline uint8_t *
put_bytes(uint8_t *p, const void *src, size_t n)
{
    if (n)
        memcpy(p, src, n);
    return p + n;
}

/* The XDR padding after n opaque bytes: 0 to 3. */
static inline size_t
xdr_pad(size_t n)
{
    return (4 - (n & 3)) & 3;
}

/* True when rec[start:end] is all zero bytes. */
static int
all_zero(const uint8_t *rec, size_t start, size_t end)
{
    for (size_t i = start; i < end; i++)
        if (rec[i])
            return 0;
    return 1;
}

/* ------------------------------------------------------------------------- arguments */

/* Positional-or-keyword arguments, as a def's: fills out[0..n) or raises TypeError. */
static int
unpack_args(const char *fname, const char *const *names, Py_ssize_t n, PyObject *const *args,
            Py_ssize_t nargs, PyObject *kwnames, PyObject **out)
{
    if (nargs > n) {
        PyErr_Format(PyExc_TypeError, "%s() takes %zd positional arguments but %zd were given",
                     fname, n, nargs);
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++)
        out[i] = i < nargs ? args[i] : NULL;
    Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    for (Py_ssize_t k = 0; k < nkw; k++) {
        PyObject *key = PyTuple_GET_ITEM(kwnames, k);
        Py_ssize_t i = 0;
        while (i < n && PyUnicode_CompareWithASCIIString(key, names[i]) != 0)
            i++;
        if (i == n) {
            PyErr_Format(PyExc_TypeError, "%s() got an unexpected keyword argument '%U'", fname,
                         key);
            return -1;
        }
        if (out[i]) {
            PyErr_Format(PyExc_TypeError, "%s() got multiple values for argument '%s'", fname,
                         names[i]);
            return -1;
        }
        out[i] = args[nargs + k];
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        if (!out[i]) {
            PyErr_Format(PyExc_TypeError, "%s() missing required argument: '%s'", fname,
                         names[i]);
            return -1;
        }
    }
    return 0;
}

/* struct.pack(">I", o)'s conversion, with its exceptions (struct.error) for the same values. */
static int
as_u32(PyObject *o, uint32_t *out)
{
    PyObject *v;
    if (PyLong_Check(o)) {
        v = Py_NewRef(o);
    }
    else if (PyIndex_Check(o)) {
        v = PyNumber_Index(o);
        if (!v)
            return -1;
    }
    else {
        PyErr_SetString(struct_error, "required argument is not an integer");
        return -1;
    }
    unsigned long x = PyLong_AsUnsignedLong(v);
    Py_DECREF(v);
    if (x == (unsigned long)-1 && PyErr_Occurred()) {
        if (PyErr_ExceptionMatches(PyExc_OverflowError))
            PyErr_SetString(struct_error, "argument out of range");
        return -1;
    }
    if (x > 0xFFFFFFFFul) {
        PyErr_SetString(struct_error, "'I' format requires 0 <= number <= 4294967295");
        return -1;
    }
    *out = (uint32_t)x;
    return 0;
}

/* A READ count that is not an int: the twin's `0 <= count <= MAX` then `-count & 3`, so the
 * same exceptions (TypeError from the comparison or the `&`, ValueError out of range). */
static int
read_count_slow(PyObject *o)
{
    int ok = PyObject_RichCompareBool(int_zero, o, Py_LE);
    if (ok > 0)
        ok = PyObject_RichCompareBool(o, int_max_read, Py_LE);
    if (ok < 0)
        return -1;
    if (!ok) {
        PyErr_Format(PyExc_ValueError, "bad READ count %S", o);
        return -1;
    }
    PyObject *neg = PyNumber_Negative(o);
    PyObject *low = neg ? PyNumber_And(neg, int_three) : NULL;
    Py_XDECREF(neg);
    if (!low)
        return -1;
    Py_DECREF(low);
    PyErr_Format(PyExc_TypeError, "READ count must be an int, not %.100s", Py_TYPE(o)->tp_name);
    return -1;
}

static int
as_read_count(PyObject *o, uint32_t *out)
{
    if (!PyLong_Check(o))
        return read_count_slow(o);
    int overflow;
    long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (v == -1 && PyErr_Occurred())
        return -1;
    if (overflow || v < 0 || v > MAX_READ_COUNT) {
        PyErr_Format(PyExc_ValueError, "bad READ count %S", o);
        return -1;
    }
    *out = (uint32_t)v;
    return 0;
}

/* A bytes-like argument as one contiguous run of bytes. */
static int
get_bytes(PyObject *o, Py_buffer *b)
{
    return PyObject_GetBuffer(o, b, PyBUF_SIMPLE);
}

/* A fattr3 (84 bytes), or ValueError with the twin's message. */
static int
get_attr(PyObject *o, Py_buffer *b)
{
    if (get_bytes(o, b) < 0)
        return -1;
    if (b->len != FATTR3_SIZE) {
        PyErr_Format(PyExc_ValueError, "fattr3 is %d bytes, not %zd", FATTR3_SIZE, b->len);
        PyBuffer_Release(b);
        return -1;
    }
    return 0;
}

/* ------------------------------------------------------------------------- parse_call */

/* The fields of a call that passed the common checks (header, credential, verifier, handle). */
struct call {
    uint32_t xid;
    uint32_t proc;
    size_t cred_end;  /* the credential (flavor, length, body) is rec[24:cred_end] */
    size_t args;      /* the arguments (handle first) start here */
    size_t fh_len;    /* the handle is rec[args + 4 : args + 4 + fh_len] */
    size_t tail;      /* after the handle and its padding: what follows the handle */
};

static int
fast_proc(uint32_t proc)
{
    return proc == GETATTR || proc == LOOKUP || proc == ACCESS || proc == READ;
}

/* 1 when rec[0:n] starts as a call the fast path may answer (filling c), else 0. */
static int
parse_head(const uint8_t *rec, size_t n, struct call *c)
{
    if (n < MIN_CALL)
        return 0;
    if (get_u32(rec + 4) != 0 || get_u32(rec + 8) != 2 || get_u32(rec + 12) != NFS_PROGRAM ||
        get_u32(rec + 16) != 3)
        return 0;
    c->xid = get_u32(rec);
    c->proc = get_u32(rec + 20);
    if (!fast_proc(c->proc))
        return 0;
    uint32_t flavor = get_u32(rec + 24), clen = get_u32(rec + 28);
    if (flavor > 1 || clen > MAX_AUTH)
        return 0;
    c->cred_end = 32 + (size_t)clen;  /* at most 432: no overflow below */
    size_t p = c->cred_end + xdr_pad(clen);
    if (p + 12 > n || !all_zero(rec, c->cred_end, p))
        return 0;
    uint32_t fh_len = get_u32(rec + p + 8);
    if (get_u32(rec + p) != 0 || get_u32(rec + p + 4) != 0 || fh_len > MAX_FH)
        return 0;
    c->args = p + 8;
    c->fh_len = fh_len;
    size_t fh_end = p + 12 + c->fh_len;
    c->tail = fh_end + xdr_pad(fh_len);
    return c->tail <= n && all_zero(rec, fh_end, c->tail);
}

/* (xid, proc, cred, fh, x, y); steals x and y (either may be NULL after a failure). */
static PyObject *
call_tuple(const uint8_t *rec, const struct call *c, PyObject *x, PyObject *y)
{
    PyObject *t = PyTuple_New(6);
    if (!t) {
        Py_XDECREF(x);
        Py_XDECREF(y);
        return NULL;
    }
    const char *r = (const char *)rec;
    PyTuple_SET_ITEM(t, 0, PyLong_FromUnsignedLong(c->xid));
    PyTuple_SET_ITEM(t, 1, PyLong_FromUnsignedLong(c->proc));
    PyTuple_SET_ITEM(t, 2, PyBytes_FromStringAndSize(r + 24, (Py_ssize_t)(c->cred_end - 24)));
    PyTuple_SET_ITEM(t, 3, PyBytes_FromStringAndSize(r + c->args + 4, (Py_ssize_t)c->fh_len));
    PyTuple_SET_ITEM(t, 4, x);
    PyTuple_SET_ITEM(t, 5, y);
    for (Py_ssize_t i = 0; i < 6; i++) {
        if (!PyTuple_GET_ITEM(t, i)) {
            Py_DECREF(t);  /* the tuple's dealloc skips the NULL items */
            return NULL;
        }
    }
    return t;
}

/* LOOKUP's name: length 1..255, its bytes and zero padding ending the record exactly. */
static PyObject *
lookup_call(const uint8_t *rec, size_t n, const struct call *c)
{
    size_t a = c->tail;
    if (a + 4 > n)
        Py_RETURN_NONE;
    uint32_t name_len = get_u32(rec + a);
    if (name_len == 0 || name_len > MAX_NAME)
        Py_RETURN_NONE;
    size_t name_end = a + 4 + name_len;
    if (name_end + xdr_pad(name_len) != n || !all_zero(rec, name_end, n))
        Py_RETURN_NONE;
    const char *r = (const char *)rec;
    PyObject *name = PyBytes_FromStringAndSize(r + a + 4, (Py_ssize_t)name_len);
    PyObject *args = PyBytes_FromStringAndSize(r + c->args, (Py_ssize_t)(n - c->args));
    return call_tuple(rec, c, name, args);
}

static PyObject *
parse_record(const uint8_t *rec, size_t n)
{
    struct call c;
    if (!parse_head(rec, n, &c))
        Py_RETURN_NONE;
    size_t a = c.tail;
    switch (c.proc) {
    case GETATTR:
        if (a != n)
            Py_RETURN_NONE;
        return call_tuple(rec, &c, PyLong_FromLong(0), PyLong_FromLong(0));
    case ACCESS:
        if (a + 4 != n)
            Py_RETURN_NONE;
        return call_tuple(rec, &c, PyLong_FromUnsignedLong(get_u32(rec + a)), PyLong_FromLong(0));
    case READ:
        if (a + 12 != n)
            Py_RETURN_NONE;
        return call_tuple(rec, &c, PyLong_FromUnsignedLongLong(get_u64(rec + a)),
                          PyLong_FromUnsignedLong(get_u32(rec + a + 8)));
    default:
        return lookup_call(rec, n, &c);
    }
}

PyDoc_STRVAR(parse_call_doc,
             "parse_call($module, /, record)\n--\n\n"
             "``record`` (one RPC record, without its mark) as a fast-path call, or None.");

static PyObject *
parse_call(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs,
           PyObject *kwnames)
{
    static const char *const names[] = {"record"};
    PyObject *arg[1];
    Py_buffer b;
    if (unpack_args("parse_call", names, 1, args, nargs, kwnames, arg) < 0)
        return NULL;
    if (get_bytes(arg[0], &b) < 0)
        return NULL;
    PyObject *res = parse_record(b.buf, (size_t)b.len);
    PyBuffer_Release(&b);
    return res;
}

/* ------------------------------------------------------------------------- replies */

/* The record mark and the accepted-reply header; `length` is the NFS result's bytes after
 * the status (and, for READ, the data the caller sends after the record's head). */
static uint8_t *
put_head(uint8_t *p, uint32_t length, uint32_t xid, uint32_t status)
{
    p = put_u32(p, LAST_FRAGMENT | (HEAD_RECORD + length));
    p = put_u32(p, xid);
    p = put_u32(p, 1);            /* REPLY */
    memset(p, 0, 16);             /* MSG_ACCEPTED, verifier AUTH_NONE of length 0, SUCCESS */
    return put_u32(p + 16, status);
}

/* post_op_attr with attributes: TRUE, then the fattr3. */
static uint8_t *
put_attr(uint8_t *p, const Py_buffer *attr)
{
    return put_bytes(put_u32(p, 1), attr->buf, FATTR3_SIZE);
}

/* A new bytes object of n bytes, with *p at its start. */
static PyObject *
new_reply(size_t n, uint8_t **p)
{
    PyObject *r = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)n);
    if (r)
        *p = (uint8_t *)PyBytes_AS_STRING(r);
    return r;
}

PyDoc_STRVAR(reply_getattr_doc,
             "reply_getattr($module, /, xid, attr)\n--\n\n"
             "GETATTR3res, NFS3_OK: the attributes.");

static PyObject *
reply_getattr(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs,
              PyObject *kwnames)
{
    static const char *const names[] = {"xid", "attr"};
    PyObject *arg[2], *res = NULL;
    Py_buffer attr;
    uint32_t xid;
    uint8_t *p;
    if (unpack_args("reply_getattr", names, 2, args, nargs, kwnames, arg) < 0)
        return NULL;
    if (get_attr(arg[1], &attr) < 0)
        return NULL;
    if (as_u32(arg[0], &xid) == 0 && (res = new_reply(HEAD + FATTR3_SIZE, &p))) {
        p = put_head(p, FATTR3_SIZE, xid, 0);
        put_bytes(p, attr.buf, FATTR3_SIZE);
    }
    PyBuffer_Release(&attr);
    return res;
}

PyDoc_STRVAR(reply_access_doc,
             "reply_access($module, /, xid, attr, access)\n--\n\n"
             "ACCESS3res, NFS3_OK: post_op_attr and the bits allowed.");

static PyObject *
reply_access(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs,
             PyObject *kwnames)
{
    static const char *const names[] = {"xid", "attr", "access"};
    PyObject *arg[3], *res = NULL;
    Py_buffer attr;
    uint32_t xid, access;
    uint8_t *p;
    if (unpack_args("reply_access", names, 3, args, nargs, kwnames, arg) < 0)
        return NULL;
    if (get_attr(arg[1], &attr) < 0)
        return NULL;
    if (as_u32(arg[0], &xid) == 0 && as_u32(arg[2], &access) == 0 &&
        (res = new_reply(HEAD + POST_OP_ATTR + 4, &p))) {
        p = put_head(p, POST_OP_ATTR + 4, xid, 0);
        put_u32(put_attr(p, &attr), access);
    }
    PyBuffer_Release(&attr);
    return res;
}

/* LOOKUP3res NFS3_OK after the head: the handle, then both post_op_attrs. */
static PyObject *
lookup_ok(uint32_t xid, const Py_buffer *fh, const Py_buffer *attr, const Py_buffer *dir_attr)
{
    size_t n = (size_t)fh->len, pad = xdr_pad(n);
    size_t body = 4 + n + pad + 2 * POST_OP_ATTR;
    uint8_t *p;
    PyObject *res = new_reply(HEAD + body, &p);
    if (!res)
        return NULL;
    p = put_head(p, (uint32_t)body, xid, 0);
    p = put_bytes(put_u32(p, (uint32_t)n), fh->buf, n);
    memset(p, 0, pad);
    put_attr(put_attr(p + pad, attr), dir_attr);
    return res;
}

PyDoc_STRVAR(reply_lookup_doc,
             "reply_lookup($module, /, xid, fh, attr, dir_attr)\n--\n\n"
             "LOOKUP3res, NFS3_OK: the handle, the object's and the directory's post_op_attr.");

static PyObject *
reply_lookup(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs,
             PyObject *kwnames)
{
    static const char *const names[] = {"xid", "fh", "attr", "dir_attr"};
    PyObject *arg[4], *res = NULL;
    Py_buffer attr, dir_attr, fh;
    uint32_t xid;
    if (unpack_args("reply_lookup", names, 4, args, nargs, kwnames, arg) < 0)
        return NULL;
    if (get_attr(arg[2], &attr) < 0)
        return NULL;
    if (get_attr(arg[3], &dir_attr) < 0)
        goto release_attr;
    if (get_bytes(arg[1], &fh) < 0)
        goto release_dir;
    if (fh.len > (Py_ssize_t)MAX_FH)
        PyErr_Format(PyExc_ValueError, "a handle is at most %u bytes, not %zd", MAX_FH, fh.len);
    else if (as_u32(arg[0], &xid) == 0)
        res = lookup_ok(xid, &fh, &attr, &dir_attr);
    PyBuffer_Release(&fh);
release_dir:
    PyBuffer_Release(&dir_attr);
release_attr:
    PyBuffer_Release(&attr);
    return res;
}

PyDoc_STRVAR(reply_lookup_noent_doc,
             "reply_lookup_noent($module, /, xid, dir_attr)\n--\n\n"
             "LOOKUP3res, NFS3ERR_NOENT: the directory's post_op_attr.");

static PyObject *
reply_lookup_noent(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs,
                   PyObject *kwnames)
{
    static const char *const names[] = {"xid", "dir_attr"};
    PyObject *arg[2], *res = NULL;
    Py_buffer dir_attr;
    uint32_t xid;
    uint8_t *p;
    if (unpack_args("reply_lookup_noent", names, 2, args, nargs, kwnames, arg) < 0)
        return NULL;
    if (get_attr(arg[1], &dir_attr) < 0)
        return NULL;
    if (as_u32(arg[0], &xid) == 0 && (res = new_reply(HEAD + POST_OP_ATTR, &p)))
        put_attr(put_head(p, POST_OP_ATTR, xid, NFS3ERR_NOENT), &dir_attr);
    PyBuffer_Release(&dir_attr);
    return res;
}

PyDoc_STRVAR(reply_read_head_doc,
             "reply_read_head($module, /, xid, attr, count, eof)\n--\n\n"
             "READ3res, NFS3_OK, up to the data: post_op_attr, count, eof and the data's length.\n"
             "The record's mark counts the ``count`` data bytes and their padding, which the\n"
             "caller sends after it (``pad(count)``).");

static PyObject *
reply_read_head(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs,
                PyObject *kwnames)
{
    static const char *const names[] = {"xid", "attr", "count", "eof"};
    PyObject *arg[4], *res = NULL;
    Py_buffer attr;
    uint32_t xid, count;
    int eof;
    uint8_t *p;
    if (unpack_args("reply_read_head", names, 4, args, nargs, kwnames, arg) < 0)
        return NULL;
    if (get_attr(arg[1], &attr) < 0)
        return NULL;
    if (as_read_count(arg[2], &count) == 0 && as_u32(arg[0], &xid) == 0 &&
        (eof = PyObject_IsTrue(arg[3])) >= 0 && (res = new_reply(HEAD + POST_OP_ATTR + 12, &p))) {
        /* count <= 0x7FFFFF00: the body and the mark's length stay below 2**31 */
        uint32_t body = POST_OP_ATTR + 12 + count + (uint32_t)xdr_pad(count);
        p = put_attr(put_head(p, body, xid, 0), &attr);
        put_u32(put_u32(put_u32(p, count), (uint32_t)eof), count);
    }
    PyBuffer_Release(&attr);
    return res;
}

PyDoc_STRVAR(pad_doc,
             "pad($module, /, n)\n--\n\n"
             "The XDR padding after ``n`` opaque bytes.");

static PyObject *
pad(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    static const char *const names[] = {"n"};
    PyObject *arg[1];
    if (unpack_args("pad", names, 1, args, nargs, kwnames, arg) < 0)
        return NULL;
    if (PyLong_Check(arg[0])) {
        int overflow;
        long long v = PyLong_AsLongLongAndOverflow(arg[0], &overflow);
        if (v == -1 && PyErr_Occurred())
            return NULL;
        if (!overflow)
            return Py_NewRef(PyTuple_GET_ITEM(pads, (Py_ssize_t)((unsigned long long)v & 3u)));
    }
    /* a huge int or another type: the twin's `_PAD[n & 3]`, with its exceptions */
    PyObject *low = PyNumber_And(arg[0], int_three);
    if (!low)
        return NULL;
    PyObject *res = PyObject_GetItem(pads, low);
    Py_DECREF(low);
    return res;
}

/* ------------------------------------------------------------------------- RecordReader */

typedef struct {
    PyObject_HEAD
    Py_ssize_t max_record;
    PyObject *error;   /* the exception class raised for a record over max_record */
    PyObject *rec;     /* bytearray: the record being reassembled (all its fragments), or NULL */
    int64_t left;      /* bytes still due in the current fragment; -1: a mark is due */
    uint8_t hdr[4];    /* a record mark split across feeds */
    uint8_t nhdr;
    uint8_t last;      /* the current fragment ends the record */
} RecordReader;

static PyObject *
reader_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *names[] = {"max_record", "error_class", NULL};
    Py_ssize_t max_record;
    PyObject *error;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "nO:RecordReader", names, &max_record, &error))
        return NULL;
    if (!PyExceptionClass_Check(error)) {
        PyErr_Format(PyExc_TypeError, "error_class must be an exception class, not %.100s",
                     Py_TYPE(error)->tp_name);
        return NULL;
    }
    RecordReader *self = (RecordReader *)type->tp_alloc(type, 0);
    if (!self)
        return NULL;
    self->max_record = max_record;
    self->error = Py_NewRef(error);
    self->rec = NULL;
    self->left = -1;
    self->nhdr = 0;
    self->last = 0;
    return (PyObject *)self;
}

static int
reader_traverse(RecordReader *self, visitproc visit, void *arg)
{
    Py_VISIT(self->error);
    Py_VISIT(self->rec);
    return 0;
}

static int
reader_clear(RecordReader *self)
{
    Py_CLEAR(self->error);
    Py_CLEAR(self->rec);
    return 0;
}

static void
reader_dealloc(RecordReader *self)
{
    PyObject_GC_UnTrack(self);
    reader_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static Py_ssize_t
reader_have(const RecordReader *self)
{
    return self->rec ? PyByteArray_GET_SIZE(self->rec) : 0;
}

/* The next record mark, from the partial one held and data[*pos:n]: 0 when data ends first
 * (the bytes it had are kept for the next feed). */
static int
take_mark(RecordReader *self, const uint8_t *data, size_t n, size_t *pos, uint32_t *mark)
{
    if (self->nhdr == 0 && n - *pos >= 4) {
        *mark = get_u32(data + *pos);
        *pos += 4;
        return 1;
    }
    size_t take = 4u - self->nhdr;
    if (take > n - *pos)
        take = n - *pos;
    memcpy(self->hdr + self->nhdr, data + *pos, take);
    self->nhdr = (uint8_t)(self->nhdr + take);
    *pos += take;
    if (self->nhdr < 4)
        return 0;
    self->nhdr = 0;
    *mark = get_u32(self->hdr);
    return 1;
}

/* The record's bytes so far plus a fragment of `len`, against max_record. */
static int
check_size(RecordReader *self, uint32_t len)
{
    uint64_t total = (uint64_t)reader_have(self) + len;  /* < 2**63 + 2**31: no overflow */
    if (self->max_record >= 0 && total <= (uint64_t)self->max_record)
        return 0;
    PyErr_Format(self->error, "record of at least %llu bytes exceeds the maximum of %zd",
                 (unsigned long long)total, self->max_record);
    return -1;
}

/* Appends view[start:start + len] to out, making the memoryview of data at the first use. */
static int
append_slice(PyObject *out, PyObject *data, PyObject **view, size_t start, size_t len)
{
    if (!*view) {
        *view = PyMemoryView_Check(data) ? Py_NewRef(data) : PyMemoryView_FromObject(data);
        if (!*view)
            return -1;
    }
    PyObject *s = PySequence_GetSlice(*view, (Py_ssize_t)start, (Py_ssize_t)(start + len));
    if (!s)
        return -1;
    int r = PyList_Append(out, s);
    Py_DECREF(s);
    return r;
}

/* Copies data[*pos:] into the record, up to what the current fragment still owes. */
static int
take_payload(RecordReader *self, const uint8_t *data, size_t n, size_t *pos)
{
    size_t take = n - *pos;
    if ((uint64_t)take > (uint64_t)self->left)
        take = (size_t)self->left;
    if (take == 0)
        return 0;
    Py_ssize_t have = PyByteArray_GET_SIZE(self->rec);
    if (PyByteArray_Resize(self->rec, have + (Py_ssize_t)take) < 0)
        return -1;
    memcpy(PyByteArray_AS_STRING(self->rec) + have, data + *pos, take);
    *pos += take;
    self->left -= (int64_t)take;
    return 0;
}

/* A record mark just read: a whole single-fragment record in data becomes a slice of it,
 * anything else starts (or continues) the record being reassembled. */
static int
start_fragment(RecordReader *self, PyObject *out, PyObject *data, PyObject **view,
               size_t n, size_t *pos, uint32_t mark)
{
    uint32_t len = mark & ~LAST_FRAGMENT;
    int last = (mark & LAST_FRAGMENT) != 0;
    if (check_size(self, len) < 0)
        return -1;
    if (last && !self->rec && n - *pos >= len) {
        if (append_slice(out, data, view, *pos, len) < 0)
            return -1;
        *pos += len;
        return 0;
    }
    if (!self->rec && !(self->rec = PyByteArray_FromStringAndSize(NULL, 0)))
        return -1;
    self->left = len;
    self->last = (uint8_t)last;
    return 0;
}

/* The current fragment is complete: the record too when it was the last fragment. */
static int
end_fragment(RecordReader *self, PyObject *out)
{
    self->left = -1;
    if (!self->last)
        return 0;
    PyObject *rec = self->rec;
    self->rec = NULL;
    int r = PyList_Append(out, rec);
    Py_DECREF(rec);
    return r;
}

static int
feed_bytes(RecordReader *self, PyObject *out, PyObject *data, PyObject **view,
           const uint8_t *buf, size_t n)
{
    size_t pos = 0;
    while (pos < n) {
        if (self->left < 0) {
            uint32_t mark;
            if (!take_mark(self, buf, n, &pos, &mark))
                break;
            if (start_fragment(self, out, data, view, n, &pos, mark) < 0)
                return -1;
            if (self->left < 0)
                continue;  /* a whole record, sliced */
        }
        if (take_payload(self, buf, n, &pos) < 0)
            return -1;
        if (self->left == 0 && end_fragment(self, out) < 0)
            return -1;
    }
    return 0;
}

PyDoc_STRVAR(reader_feed_doc,
             "feed($self, data, /)\n--\n\n"
             "The records completed by ``data``: a whole single-fragment record as a memoryview\n"
             "slice of ``data``, any other as a bytearray.");

static PyObject *
reader_feed(RecordReader *self, PyObject *data)
{
    Py_buffer b;
    PyObject *view = NULL;
    if (get_bytes(data, &b) < 0)
        return NULL;
    PyObject *out = PyList_New(0);
    if (out && feed_bytes(self, out, data, &view, b.buf, (size_t)b.len) < 0)
        Py_CLEAR(out);
    Py_XDECREF(view);
    PyBuffer_Release(&b);
    return out;
}

PyDoc_STRVAR(reader_pending_doc,
             "pending_bytes($self, /)\n--\n\n"
             "Bytes held of a record not complete yet: a partial mark, or, once a record's first\n"
             "mark is read, that mark and the payload received so far (0 only between records).");

static PyObject *
reader_pending_bytes(RecordReader *self, PyObject *Py_UNUSED(ignored))
{
    Py_ssize_t n = self->nhdr + (self->rec ? reader_have(self) + 4 : 0);
    return PyLong_FromSsize_t(n);
}

static PyMethodDef reader_methods[] = {
    {"feed", (PyCFunction)reader_feed, METH_O, reader_feed_doc},
    {"pending_bytes", (PyCFunction)reader_pending_bytes, METH_NOARGS, reader_pending_doc},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef reader_members[] = {
    {"max_record", T_PYSSIZET, offsetof(RecordReader, max_record), 0,
     "A record (all of its fragments) larger than this raises the error class."},
    {NULL, 0, 0, 0, NULL},
};

PyDoc_STRVAR(reader_doc,
             "RecordReader(max_record, error_class)\n--\n\n"
             "Reassembles RPC records from a TCP byte stream (RFC 5531 section 11), as\n"
             "nfsproto.rpc.RecordReader does; a record over ``max_record`` raises\n"
             "``error_class`` as soon as its mark says so.");

static PyTypeObject RecordReaderType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "gateway._fastwire.RecordReader",
    .tp_basicsize = sizeof(RecordReader),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = reader_doc,
    .tp_new = reader_new,
    .tp_traverse = (traverseproc)reader_traverse,
    .tp_clear = (inquiry)reader_clear,
    .tp_dealloc = (destructor)reader_dealloc,
    .tp_methods = reader_methods,
    .tp_members = reader_members,
};

/* ------------------------------------------------------------------------- Mapping */

/* A read-only MAP_SHARED mapping of ``size`` bytes of a file from ``offset`` (a multiple of
 * the page size, as mmap requires: EINVAL otherwise), exported through the buffer protocol;
 * unmapped when the last reference (a memoryview of it included) goes. It keeps no file
 * descriptor: the kernel holds the file for the mapping. Map only what is read: a fault
 * may map a whole large folio of the page cache, as far as the mapping reaches. */
typedef struct {
    PyObject_HEAD
    void *addr;
    Py_ssize_t size;
} Mapping;

static PyObject *
mapping_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"fd", "size", "offset", NULL};
    int fd;
    Py_ssize_t size;
    Py_ssize_t offset = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "in|n:Mapping", kwlist, &fd, &size, &offset))
        return NULL;
    if (fd < 0 || size <= 0 || offset < 0) {
        PyErr_SetString(PyExc_ValueError,
                        "Mapping needs a file descriptor, a size > 0 and an offset >= 0");
        return NULL;
    }
    struct stat st;
    if (fstat(fd, &st) < 0)
        return PyErr_SetFromErrno(PyExc_OSError);
    if (!S_ISREG(st.st_mode) || (long long)size > (long long)st.st_size - (long long)offset) {
        /* Pages past the end of the file would raise SIGBUS when read. */
        PyErr_SetString(PyExc_ValueError, "Mapping: not a regular file, or size past its end");
        return NULL;
    }
    void *addr;
    Py_BEGIN_ALLOW_THREADS
    addr = mmap(NULL, (size_t)size, PROT_READ, MAP_SHARED, fd, (off_t)offset);
    Py_END_ALLOW_THREADS
    if (addr == MAP_FAILED)
        return PyErr_SetFromErrno(PyExc_OSError);
    Mapping *self = (Mapping *)type->tp_alloc(type, 0);
    if (!self) {
        munmap(addr, (size_t)size);
        return NULL;
    }
    self->addr = addr;
    self->size = size;
    return (PyObject *)self;
}

static void
mapping_dealloc(Mapping *self)
{
    if (self->addr)
        munmap(self->addr, (size_t)self->size);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int
mapping_getbuffer(Mapping *self, Py_buffer *view, int flags)
{
    return PyBuffer_FillInfo(view, (PyObject *)self, self->addr, self->size, 1, flags);
}

static Py_ssize_t
mapping_length(Mapping *self)
{
    return self->size;
}

static PyBufferProcs mapping_as_buffer = {
    .bf_getbuffer = (getbufferproc)mapping_getbuffer,
};

static PySequenceMethods mapping_as_sequence = {
    .sq_length = (lenfunc)mapping_length,
};

PyDoc_STRVAR(mapping_doc,
             "Mapping(fd, size)\n--\n\n"
             "The first ``size`` bytes of the file open on ``fd``, mapped read-only and\n"
             "shared (the page cache's pages), as a read-only buffer; ``fd`` may be closed\n"
             "at once. OSError when the kernel refuses the mapping.");

static PyTypeObject MappingType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "gateway._fastwire.Mapping",
    .tp_basicsize = sizeof(Mapping),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = mapping_doc,
    .tp_new = mapping_new,
    .tp_dealloc = (destructor)mapping_dealloc,
    .tp_as_buffer = &mapping_as_buffer,
    .tp_as_sequence = &mapping_as_sequence,
};

/* ---------------------------------------------------------------------- BodyBuffer */

/* A bytes object filled in place (an HTTP body received straight into it, gateway.backend.http1):
 * BodyBuffer(size) holds a new bytes object of ``size`` bytes whose contents are not
 * initialised (bytearray(size) zeroes them first: 8 MiB of memset for a pack's group, for
 * bytes the receive overwrites anyway), exported writable through the buffer protocol so
 * recv_into writes into it; seal() returns the bytes, after which no buffer is exported
 * again. The bytes object is not reachable from Python before seal(), so nothing can hash it
 * or see it change; the caller seals only once every byte was written (a short body is
 * dropped unsealed) and does not write through a view it took before sealing. */
typedef struct {
    PyObject_HEAD
    PyObject *bytes;
    int sealed;
} BodyBuffer;

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23 /* Linux 5.14 */
#endif
#define BODY_PAGE 4096
#define BODY_POPULATE_MIN (1 << 20)

static PyObject *
body_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"size", NULL};
    Py_ssize_t size;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "n:BodyBuffer", kwlist, &size))
        return NULL;
    if (size <= 0) {
        PyErr_SetString(PyExc_ValueError, "BodyBuffer needs a size > 0");
        return NULL;
    }
    PyObject *b = PyBytes_FromStringAndSize(NULL, size); /* not initialised */
    if (!b)
        return NULL;
    if (size >= BODY_POPULATE_MIN) {
        /* Fault the body's pages in with one call rather than one fault per 4 KiB page as
         * recv_into reaches it (~30 % less CPU for 8 MiB of fresh memory on this VM); the
         * contents are not touched. Best effort: a kernel without it (before Linux 5.14)
         * says EINVAL, and the pages fault in as they are written. */
        uintptr_t page = (uintptr_t)BODY_PAGE;
        uintptr_t lo = ((uintptr_t)PyBytes_AS_STRING(b) + page - 1) & ~(page - 1);
        uintptr_t hi = ((uintptr_t)PyBytes_AS_STRING(b) + (uintptr_t)size) & ~(page - 1);
        if (hi > lo)
            (void)madvise((void *)lo, (size_t)(hi - lo), MADV_POPULATE_WRITE);
    }
    BodyBuffer *self = (BodyBuffer *)type->tp_alloc(type, 0);
    if (!self) {
        Py_DECREF(b);
        return NULL;
    }
    self->bytes = b;
    self->sealed = 0;
    return (PyObject *)self;
}

static void
body_dealloc(BodyBuffer *self)
{
    Py_XDECREF(self->bytes);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int
body_getbuffer(BodyBuffer *self, Py_buffer *view, int flags)
{
    if (self->sealed) {
        view->obj = NULL;
        PyErr_SetString(PyExc_BufferError, "BodyBuffer: sealed");
        return -1;
    }
    return PyBuffer_FillInfo(view, (PyObject *)self, PyBytes_AS_STRING(self->bytes),
                             PyBytes_GET_SIZE(self->bytes), 0, flags);
}

static Py_ssize_t
body_length(BodyBuffer *self)
{
    return PyBytes_GET_SIZE(self->bytes);
}

static PyObject *
body_seal(BodyBuffer *self, PyObject *Py_UNUSED(ignored))
{
    self->sealed = 1;
    return Py_NewRef(self->bytes);
}

static PyMethodDef body_methods[] = {
    {"seal", (PyCFunction)body_seal, METH_NOARGS,
     "seal()\n--\n\nThe bytes (every byte written by now); no buffer is exported after."},
    {NULL, NULL, 0, NULL},
};

static PyBufferProcs body_as_buffer = {
    .bf_getbuffer = (getbufferproc)body_getbuffer,
};

static PySequenceMethods body_as_sequence = {
    .sq_length = (lenfunc)body_length,
};

PyDoc_STRVAR(body_doc,
             "BodyBuffer(size)\n--\n\n"
             "A bytes object of ``size`` (> 0) bytes, not initialised, exported as a\n"
             "writable buffer until ``seal()`` returns it.");

static PyTypeObject BodyBufferType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "gateway._fastwire.BodyBuffer",
    .tp_basicsize = sizeof(BodyBuffer),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = body_doc,
    .tp_new = body_new,
    .tp_dealloc = (destructor)body_dealloc,
    .tp_methods = body_methods,
    .tp_as_buffer = &body_as_buffer,
    .tp_as_sequence = &body_as_sequence,
};

/* ------------------------------------------------------------- Guarded reads of mappings */

/* A page of a MAP_SHARED file mapping that the file no longer covers (truncated by another
 * program) or that the kernel cannot read back (an I/O error) raises SIGBUS in the thread
 * that touches it from user space; its default action kills the process. A kernel-side copy
 * (send, writev) of such a page fails with EFAULT instead. The two functions here read a
 * mapping's pages from user space under a guard: a SIGBUS handler (SA_SIGINFO) installed
 * only while at least one guarded read runs (a count under a mutex; the previous handler is
 * put back when the last one ends), and per thread the range being read and a sigjmp_buf.
 * The handler jumps back into the guarded read only for a fault (si_code > 0) at an address
 * inside that thread's range; anything else goes to the previous disposition: its handler
 * is called, or (default or ignore) it is put back and the fault happens again under it (a
 * signal sent with kill is raised again). The jump abandons a memcpy or a loop of loads,
 * which hold no lock and allocate nothing; the GIL is not held inside the guarded region
 * (for large reads) or held throughout (small ones): it is never taken or dropped there. */

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22 /* Linux 5.14 */
#endif
#define GUARD_RELEASE_GIL 65536 /* below this a copy costs less than the GIL hand-off */

struct guard {
    uintptr_t lo, hi;  /* the pages being read: [lo, hi) */
    sigjmp_buf env;
};

/* initial-exec: the handler reads it without a TLS allocation (async-signal-safe). */
static _Thread_local struct guard *guard_current __attribute__((tls_model("initial-exec")));
static pthread_mutex_t guard_lock = PTHREAD_MUTEX_INITIALIZER;
static int guard_users;
static struct sigaction guard_prev;

static void
guard_handler(int sig, siginfo_t *si, void *ctx)
{
    struct guard *g = guard_current;
    uintptr_t addr = (uintptr_t)si->si_addr;
    if (g && si->si_code > 0 && addr >= g->lo && addr < g->hi)
        siglongjmp(g->env, 1);
    struct sigaction prev = guard_prev;
    if ((prev.sa_flags & SA_SIGINFO) && prev.sa_sigaction) {
        prev.sa_sigaction(sig, si, ctx);
        return;
    }
    if (!(prev.sa_flags & SA_SIGINFO) && prev.sa_handler != SIG_DFL &&
        prev.sa_handler != SIG_IGN) {
        prev.sa_handler(sig);
        return;
    }
    /* The default (or ignore): put it back; a fault repeats when the handler returns. */
    sigaction(SIGBUS, &prev, NULL);
    if (si->si_code <= 0)
        raise(sig);
}

static int
guard_enter(void)
{
    int r = 0;
    pthread_mutex_lock(&guard_lock);
    if (guard_users == 0) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_sigaction = guard_handler;
        sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
        sigemptyset(&sa.sa_mask);
        r = sigaction(SIGBUS, &sa, &guard_prev);
    }
    if (r == 0)
        guard_users++;
    pthread_mutex_unlock(&guard_lock);
    return r;
}

static void
guard_leave(void)
{
    pthread_mutex_lock(&guard_lock);
    if (--guard_users == 0)
        sigaction(SIGBUS, &guard_prev, NULL);
    pthread_mutex_unlock(&guard_lock);
}

static void
touch_pages(const volatile uint8_t *p, size_t n, size_t page)
{
    uint8_t sink = 0;
    for (size_t i = 0; i < n; i += page)
        sink ^= p[i];
    sink ^= p[n - 1];
    (void)sink;
}

/* Reads the n (> 0) bytes at src under the guard: copies them to dst, or (dst NULL) loads
 * one byte of each page. 0 when every byte was read, 1 when a page faulted, -1 when the
 * handler could not be installed (errno set). */
static int
guarded_read(uint8_t *dst, const uint8_t *src, size_t n)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    struct guard g;
    g.lo = (uintptr_t)src & ~(uintptr_t)(page - 1);
    g.hi = ((uintptr_t)src + n + page - 1) & ~(uintptr_t)(page - 1);
    if (guard_enter() < 0)
        return -1;
    int faulted = 1;
    guard_current = &g;
    if (sigsetjmp(g.env, 1) == 0) {
        if (dst)
            memcpy(dst, src, n);
        else
            touch_pages(src, n, page);
        faulted = 0;
    }
    guard_current = NULL;
    guard_leave();
    return faulted;
}

PyDoc_STRVAR(copy_mapped_doc,
             "copy_mapped($module, /, data)\n--\n\n"
             "A copy of ``data`` (a buffer: a file mapping, or a slice of one) as bytes, read\n"
             "under a SIGBUS guard: None when one of its pages cannot be read (the file was\n"
             "truncated under the mapping, or an I/O error), where a plain copy would kill\n"
             "the process.");

static PyObject *
copy_mapped(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs,
            PyObject *kwnames)
{
    static const char *const names[] = {"data"};
    PyObject *arg[1];
    Py_buffer b;
    if (unpack_args("copy_mapped", names, 1, args, nargs, kwnames, arg) < 0)
        return NULL;
    if (get_bytes(arg[0], &b) < 0)
        return NULL;
    PyObject *res = PyBytes_FromStringAndSize(NULL, b.len);
    if (res && b.len > 0) {
        uint8_t *dst = (uint8_t *)PyBytes_AS_STRING(res);
        int r;
        if (b.len >= GUARD_RELEASE_GIL) {
            Py_BEGIN_ALLOW_THREADS
            r = guarded_read(dst, b.buf, (size_t)b.len);
            Py_END_ALLOW_THREADS
        }
        else {
            r = guarded_read(dst, b.buf, (size_t)b.len);
        }
        if (r != 0) {
            Py_CLEAR(res);
            if (r < 0)
                PyErr_SetFromErrno(PyExc_OSError);
            else
                res = Py_NewRef(Py_None);
        }
    }
    PyBuffer_Release(&b);
    return res;
}

PyDoc_STRVAR(mapped_readable_doc,
             "mapped_readable($module, /, data)\n--\n\n"
             "Whether every page of ``data`` (a file mapping, or a slice of one) can be read\n"
             "now: the kernel populates them (madvise MADV_POPULATE_READ, which answers EFAULT\n"
             "where a touch would raise SIGBUS), else, on a kernel without it, one byte of\n"
             "each page is loaded under the SIGBUS guard. False for a file truncated under\n"
             "the mapping or a page the kernel cannot read back.");

static PyObject *
mapped_readable(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs,
                PyObject *kwnames)
{
    static const char *const names[] = {"data"};
    PyObject *arg[1];
    Py_buffer b;
    if (unpack_args("mapped_readable", names, 1, args, nargs, kwnames, arg) < 0)
        return NULL;
    if (get_bytes(arg[0], &b) < 0)
        return NULL;
    int r = 0;
    if (b.len > 0) {
        uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
        uintptr_t lo = (uintptr_t)b.buf & ~(page - 1);
        uintptr_t hi = ((uintptr_t)b.buf + (uintptr_t)b.len + page - 1) & ~(page - 1);
        Py_BEGIN_ALLOW_THREADS
        r = madvise((void *)lo, (size_t)(hi - lo), MADV_POPULATE_READ) == 0 ? 0 : errno;
        if (r == EINVAL || r == EINTR || r == EAGAIN || r == ENOMEM)
            /* not this kernel's (EINVAL before 5.14), or not decided: look under the guard */
            r = guarded_read(NULL, b.buf, (size_t)b.len) == 0 ? 0 : 1;
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&b);
    return PyBool_FromLong(r == 0);
}

/* ------------------------------------------------------------------------- module */

#define FASTCALL(f) (PyCFunction)(void (*)(void))(f), METH_FASTCALL | METH_KEYWORDS

static PyMethodDef module_methods[] = {
    {"parse_call", FASTCALL(parse_call), parse_call_doc},
    {"reply_getattr", FASTCALL(reply_getattr), reply_getattr_doc},
    {"reply_access", FASTCALL(reply_access), reply_access_doc},
    {"reply_lookup", FASTCALL(reply_lookup), reply_lookup_doc},
    {"reply_lookup_noent", FASTCALL(reply_lookup_noent), reply_lookup_noent_doc},
    {"reply_read_head", FASTCALL(reply_read_head), reply_read_head_doc},
    {"pad", FASTCALL(pad), pad_doc},
    {"copy_mapped", FASTCALL(copy_mapped), copy_mapped_doc},
    {"mapped_readable", FASTCALL(mapped_readable), mapped_readable_doc},
    {NULL, NULL, 0, NULL},
};

PyDoc_STRVAR(module_doc,
             "The fast path's wire mechanics in C: the compiled twin of gateway.fastwire\n"
             "(and RecordReader of nfsproto.rpc.RecordReader), giving the same results.");

static struct PyModuleDef fastwire_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "_fastwire",
    .m_doc = module_doc,
    .m_size = -1,
    .m_methods = module_methods,
};

static int
make_globals(void)
{
    PyObject *st = PyImport_ImportModule("struct");
    if (!st)
        return -1;
    struct_error = PyObject_GetAttrString(st, "error");
    Py_DECREF(st);
    pads = Py_BuildValue("(y#y#y#y#)", "", (Py_ssize_t)0, "\0\0\0", (Py_ssize_t)3, "\0\0",
                         (Py_ssize_t)2, "\0", (Py_ssize_t)1);
    int_three = PyLong_FromLong(3);
    int_zero = PyLong_FromLong(0);
    int_max_read = PyLong_FromLongLong(MAX_READ_COUNT);
    return struct_error && pads && int_three && int_zero && int_max_read ? 0 : -1;
}

static int
add_constants(PyObject *m)
{
    static const struct {
        const char *name;
        long long value;
    } constants[] = {
        {"NFS_PROGRAM", NFS_PROGRAM},
        {"GETATTR", GETATTR},
        {"LOOKUP", LOOKUP},
        {"ACCESS", ACCESS},
        {"READ", READ},
        {"FATTR3_SIZE", FATTR3_SIZE},
        {"NFS3ERR_NOENT", NFS3ERR_NOENT},
        {"MAX_AUTH", MAX_AUTH},
        {"MAX_FH", MAX_FH},
        {"MAX_NAME", MAX_NAME},
        {"LAST_FRAGMENT", LAST_FRAGMENT},
    };
    for (size_t i = 0; i < sizeof constants / sizeof constants[0]; i++) {
        PyObject *v = PyLong_FromLongLong(constants[i].value);
        if (!v || PyModule_AddObject(m, constants[i].name, v) < 0) {
            Py_XDECREF(v);
            return -1;
        }
    }
    return 0;
}

PyMODINIT_FUNC
PyInit__fastwire(void)
{
    if (make_globals() < 0 || PyType_Ready(&RecordReaderType) < 0 ||
        PyType_Ready(&MappingType) < 0 || PyType_Ready(&BodyBufferType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&fastwire_module);
    if (!m)
        return NULL;
    if (add_constants(m) < 0 ||
        PyModule_AddObjectRef(m, "RecordReader", (PyObject *)&RecordReaderType) < 0 ||
        PyModule_AddObjectRef(m, "Mapping", (PyObject *)&MappingType) < 0 ||
        PyModule_AddObjectRef(m, "BodyBuffer", (PyObject *)&BodyBufferType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
