/*
 * csnd.changelog._frames: `encode_frames` and `walk`, compiled.
 *
 * The same functions as `encode_frames_py` and `walk_py` in
 * csnd/changelog/record.py, which are their specification and their twins:
 * tests/changelog/test_frames.py holds each pair to the same output (for any
 * run of CSNs and payloads; for any buffer of records, damaged or not).
 * Keep them in step.  `walk` is what opening the changelog spends its time
 * in: it checks every record of every segment.
 *
 * It encodes a run of records (the 32-byte head of record.py's format
 * version 2, then the payload) with one time of appending, each naming the
 * CRC of the record before it (the first: `prev_crc`), and stops before the first record
 * that may not follow: a CSN not above the one before it (or out of
 * 1..2^64-1), or a payload over the limit.  The caller appends what it got
 * and names the record it stopped at.  For a node of one-row transactions
 * this is the changelog's every record: the per-record Python of
 * `record.encode` and its loop was a tenth of `csnd serve`'s time.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#include <zlib.h>

#define FRAME_HEAD 32
static const unsigned char MARK[4] = {0xd3, 0x9c, 0x1e, 0x7a};

static void
put32(unsigned char *p, uint32_t v)
{
    p[0] = (unsigned char)(v >> 24);
    p[1] = (unsigned char)(v >> 16);
    p[2] = (unsigned char)(v >> 8);
    p[3] = (unsigned char)v;
}

static void
put64(unsigned char *p, uint64_t v)
{
    put32(p, (uint32_t)(v >> 32));
    put32(p + 4, (uint32_t)v);
}

/* The CSN of `item`, or 0 (never a valid CSN) when it is out of 1..2^64-1; -1 with an error set
   when it is no int at all. */
static int
csn_of(PyObject *item, unsigned long long *csn)
{
    if (!PyLong_Check(item)) {
        PyErr_Format(PyExc_TypeError, "a changelog csn must be an int, not %.100s", Py_TYPE(item)->tp_name);
        return -1;
    }
    *csn = PyLong_AsUnsignedLongLong(item);
    if (*csn == (unsigned long long)-1 && PyErr_Occurred()) {
        if (!PyErr_ExceptionMatches(PyExc_OverflowError))
            return -1;
        PyErr_Clear(); /* negative, or above 2^64-1: not a CSN */
        *csn = 0;
    }
    return 0;
}

static PyObject *
encode_frames(PyObject *self, PyObject *args)
{
    PyObject *csns, *payloads;
    unsigned long long time_us, last;
    Py_ssize_t most;
    unsigned long link;
    if (!PyArg_ParseTuple(args, "OOKKnk:encode_frames", &csns, &payloads, &time_us, &last, &most, &link))
        return NULL;
    PyObject *csn_seq = PySequence_Fast(csns, "encode_frames: csns must be a sequence");
    if (csn_seq == NULL)
        return NULL;
    PyObject *payload_seq = PySequence_Fast(payloads, "encode_frames: payloads must be a sequence");
    if (payload_seq == NULL) {
        Py_DECREF(csn_seq);
        return NULL;
    }
    PyObject *out = NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(csn_seq);
    if (PySequence_Fast_GET_SIZE(payload_seq) != n) {
        PyErr_Format(PyExc_ValueError, "encode_frames: %zd csns for %zd payloads", n,
                     PySequence_Fast_GET_SIZE(payload_seq));
        goto done;
    }
    out = PyList_New(0);
    if (out == NULL)
        goto done;
    PyObject **csn_items = PySequence_Fast_ITEMS(csn_seq);
    PyObject **payload_items = PySequence_Fast_ITEMS(payload_seq);
    for (Py_ssize_t i = 0; i < n; i++) {
        unsigned long long csn;
        if (csn_of(csn_items[i], &csn) < 0)
            goto fail;
        PyObject *payload = payload_items[i];
        if (!PyBytes_Check(payload)) {
            PyErr_Format(PyExc_TypeError, "a changelog payload must be bytes, not %.100s",
                         Py_TYPE(payload)->tp_name);
            goto fail;
        }
        Py_ssize_t length = PyBytes_GET_SIZE(payload);
        if (csn == 0 || csn <= last || length > most || (unsigned long long)length > 0xFFFFFFFFull)
            break; /* the caller names it */
        PyObject *frame = PyBytes_FromStringAndSize(NULL, FRAME_HEAD + length);
        if (frame == NULL)
            goto fail;
        unsigned char *p = (unsigned char *)PyBytes_AS_STRING(frame);
        memcpy(p, MARK, 4);
        put32(p + 8, (uint32_t)link);
        put32(p + 12, (uint32_t)length);
        put64(p + 16, csn);
        put64(p + 24, time_us);
        memcpy(p + FRAME_HEAD, PyBytes_AS_STRING(payload), (size_t)length);
        /* zlib's crc32 takes a uInt length: a payload is at most 2^32-1 bytes, so two calls at most */
        uLong crc = crc32(0L, p + 8, FRAME_HEAD - 8);
        const unsigned char *at = p + FRAME_HEAD;
        Py_ssize_t left = length;
        while (left > 0) {
            uInt piece = left > 0x40000000 ? 0x40000000u : (uInt)left;
            crc = crc32(crc, at, piece);
            at += piece;
            left -= piece;
        }
        put32(p + 4, (uint32_t)crc);
        link = (unsigned long)(uint32_t)crc;
        int failed = PyList_Append(out, frame);
        Py_DECREF(frame);
        if (failed < 0)
            goto fail;
        last = csn;
    }
    goto done;
fail:
    Py_CLEAR(out);
done:
    Py_DECREF(csn_seq);
    Py_DECREF(payload_seq);
    return out;
}

static uint32_t
get32(const unsigned char *p)
{
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | (uint32_t)p[3];
}

static uint64_t
get64(const unsigned char *p)
{
    return ((uint64_t)get32(p) << 32) | (uint64_t)get32(p + 4);
}

static int
append_u64(PyObject *list, unsigned long long v)
{
    PyObject *o = PyLong_FromUnsignedLongLong(v);
    if (o == NULL)
        return -1;
    int failed = PyList_Append(list, o);
    Py_DECREF(o);
    return failed;
}

/* walk(buf, start, last_csn, link, version) -> (end, csns, offsets, times, last_crc): the twin of
   record.walk_py.  The whole, CRC-right, in-order (and, in version 2, linked) records from `start`,
   stopping at the first that is not; `link` -1 checks no link for the first one. */
static PyObject *
walk(PyObject *self, PyObject *args)
{
    Py_buffer view;
    Py_ssize_t off;
    unsigned long long last;
    long long link;
    int version;
    if (!PyArg_ParseTuple(args, "y*nKLi:walk", &view, &off, &last, &link, &version))
        return NULL;
    const unsigned char *b = (const unsigned char *)view.buf;
    Py_ssize_t size = view.len;
    Py_ssize_t head = version >= 2 ? 32 : 28;
    long long last_crc = -1;
    PyObject *csns = PyList_New(0), *offsets = PyList_New(0), *times = PyList_New(0);
    if (csns == NULL || offsets == NULL || times == NULL)
        goto fail;
    if (off < 0)
        off = size; /* (no walk from before the buffer) */
    while (off <= size - head) {
        const unsigned char *p = b + off;
        if (memcmp(p, MARK, 4) != 0)
            break;
        uint32_t crc = get32(p + 4), prev = 0, length;
        uint64_t csn, t;
        if (version >= 2) {
            prev = get32(p + 8);
            length = get32(p + 12);
            csn = get64(p + 16);
            t = get64(p + 24);
        } else {
            length = get32(p + 8);
            csn = get64(p + 12);
            t = get64(p + 20);
        }
        if ((uint64_t)(size - off - head) < (uint64_t)length)
            break;
        uLong c = 0;
        const unsigned char *at = p + 8;
        uint64_t left = (uint64_t)(head - 8) + length;
        while (left > 0) {
            uInt piece = left > 0x40000000u ? 0x40000000u : (uInt)left;
            c = crc32(c, at, piece);
            at += piece;
            left -= piece;
        }
        if ((uint32_t)c != crc || csn <= last || (version >= 2 && link >= 0 && prev != (uint32_t)link))
            break;
        if (append_u64(csns, csn) < 0 || append_u64(offsets, (unsigned long long)off) < 0 ||
            append_u64(times, t) < 0)
            goto fail;
        last = csn;
        last_crc = crc;
        if (version >= 2)
            link = crc;
        off += head + (Py_ssize_t)length;
    }
    PyBuffer_Release(&view);
    return Py_BuildValue("(nNNNL)", off, csns, offsets, times, last_crc);
fail:
    PyBuffer_Release(&view);
    Py_XDECREF(csns);
    Py_XDECREF(offsets);
    Py_XDECREF(times);
    return NULL;
}

static PyMethodDef methods[] = {
    {"encode_frames", encode_frames, METH_VARARGS,
     "encode_frames(csns, payloads, time_us, after_csn, max_payload, prev_crc) -> list of record bytes\n\n"
     "The records of a run, stopping before the first that may not follow (see record.encode_frames_py)."},
    {"walk", walk, METH_VARARGS,
     "walk(buf, start, last_csn, link, version) -> (end, csns, offsets, times, last_crc)\n\n"
     "The whole records of a segment from start, up to the first that is not (see record.walk_py)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "csnd.changelog._frames",
    "The changelog's record encoding for a run of records, compiled (twin: record.encode_frames_py).", -1,
    methods,
};

PyMODINIT_FUNC
PyInit__frames(void)
{
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    if (PyModule_AddIntConstant(m, "FRAME_HEAD", FRAME_HEAD) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
