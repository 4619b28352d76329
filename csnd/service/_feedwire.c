/*
 * csnd.service._feedwire: a changefeed batch's protobuf bytes, written directly.
 *
 * `batch_message(records)` is the serialized SubscribeResponse (or
 * FetchResponse: both carry the TransactionBatch as field 1) of a batch of
 * whole transactions, `(csn, line)` each -- byte for byte what protobuf's
 * `SerializeToString` gives for the message built from them, which is its
 * specification: tests/service/test_feedwire.py holds the two to the same
 * bytes.  Building a Transaction message per record and serializing the
 * batch cost the changefeed about half a microsecond a record in the
 * service's interpreter; this is one pass to size the message and one to
 * copy the lines into it.
 *
 *   message Transaction { uint64 csn = 1; bytes line = 2; bool more = 3; }
 *   message TransactionBatch { repeated Transaction transactions = 1; }
 *
 * proto3 leaves out a field at its default (csn 0, an empty line); `more`
 * is never set on a whole transaction.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define TAG_LEN1 0x0A   /* field 1, length-delimited */
#define TAG_VARINT1 0x08 /* field 1, varint */
#define TAG_LEN2 0x12   /* field 2, length-delimited */

static Py_ssize_t
varint_size(uint64_t v)
{
    Py_ssize_t n = 1;
    while (v >= 0x80) {
        v >>= 7;
        n++;
    }
    return n;
}

static unsigned char *
put_varint(unsigned char *p, uint64_t v)
{
    while (v >= 0x80) {
        *p++ = (unsigned char)(v | 0x80);
        v >>= 7;
    }
    *p++ = (unsigned char)v;
    return p;
}

/* The record at `item`: its csn and line, or -1 with an error set. */
static int
record_of(PyObject *item, uint64_t *csn, const char **line, Py_ssize_t *length)
{
    if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) != 2 || !PyBytes_Check(PyTuple_GET_ITEM(item, 1))) {
        PyErr_SetString(PyExc_TypeError, "batch_message: each record must be a (csn, line bytes) tuple");
        return -1;
    }
    unsigned long long v = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(item, 0));
    if (v == (unsigned long long)-1 && PyErr_Occurred())
        return -1;
    *csn = v;
    *line = PyBytes_AS_STRING(PyTuple_GET_ITEM(item, 1));
    *length = PyBytes_GET_SIZE(PyTuple_GET_ITEM(item, 1));
    return 0;
}

static Py_ssize_t
transaction_size(uint64_t csn, Py_ssize_t length)
{
    return (csn ? 1 + varint_size(csn) : 0) + (length ? 1 + varint_size((uint64_t)length) + length : 0);
}

static PyObject *
batch_message(PyObject *module, PyObject *records)
{
    (void)module;
    PyObject *seq = PySequence_Fast(records, "batch_message: records must be a sequence");
    if (seq == NULL)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    PyObject *out = NULL;
    uint64_t csn;
    const char *line;
    Py_ssize_t length, batch = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (record_of(items[i], &csn, &line, &length) < 0)
            goto done;
        Py_ssize_t inner = transaction_size(csn, length);
        batch += 1 + varint_size((uint64_t)inner) + inner;
    }
    if (n == 0) { /* (no batch set: the message is empty, as protobuf writes it) */
        out = PyBytes_FromStringAndSize(NULL, 0);
        goto done;
    }
    out = PyBytes_FromStringAndSize(NULL, 1 + varint_size((uint64_t)batch) + batch);
    if (out == NULL)
        goto done;
    unsigned char *p = (unsigned char *)PyBytes_AS_STRING(out);
    *p++ = TAG_LEN1;
    p = put_varint(p, (uint64_t)batch);
    for (Py_ssize_t i = 0; i < n; i++) {
        record_of(items[i], &csn, &line, &length); /* (checked in the first pass) */
        *p++ = TAG_LEN1;
        p = put_varint(p, (uint64_t)transaction_size(csn, length));
        if (csn) {
            *p++ = TAG_VARINT1;
            p = put_varint(p, csn);
        }
        if (length) {
            *p++ = TAG_LEN2;
            p = put_varint(p, (uint64_t)length);
            memcpy(p, line, (size_t)length);
            p += length;
        }
    }
done:
    Py_DECREF(seq);
    return out;
}

static PyMethodDef methods[] = {
    {"batch_message", batch_message, METH_O,
     "batch_message(records) -> bytes\n\n"
     "The serialized SubscribeResponse / FetchResponse of a batch of (csn, line) records."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "csnd.service._feedwire",
    "A changefeed batch's protobuf bytes, written directly (specification: protobuf's own).", -1, methods,
};

PyMODINIT_FUNC
PyInit__feedwire(void)
{
    return PyModule_Create(&module);
}
