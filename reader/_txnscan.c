/*
 * csnd.reader._txnscan: `take_whole_txns`, compiled.
 *
 * The same function as `take_whole_txns_py` in reader/txnscan.py, which is
 * its specification and its twin: tests/reader/test_txnscan.py holds the two
 * to the same output for any sequence of frames.  Keep them in step.
 *
 * It reads XLogData frames with the connection's `get_copy_data(1)` and
 * returns whole one-piece transactions (Begin, row changes, Commit), the
 * frames it could not take (exactly as `get_copy_data` returned them) and
 * the highest dataStart of the transactions taken.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define HEADER 25            /* 'w', dataStart, walEnd, sendTime */
#define BEGIN_SIZE 46        /* 1 + "!QQqBQqI" */
#define COMMIT_SIZE 51       /* 1 + "!QQqBBQQq" */
#define CHANGE_MIN 34        /* 1 + "!QQqBII": a change frame is longer */

static uint64_t
be64(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v = (v << 8) | p[i];
    return v;
}

static uint32_t
be32(const unsigned char *p)
{
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}

/* A growing byte buffer for one transaction's framed changes. */
typedef struct {
    char *data;
    Py_ssize_t len, cap;
} Buffer;

static int
buffer_put(Buffer *b, const void *src, Py_ssize_t n)
{
    if (b->len + n > b->cap) {
        Py_ssize_t cap = b->cap ? b->cap : 4096;
        while (cap < b->len + n) {
            if (cap > PY_SSIZE_T_MAX / 2) {
                PyErr_NoMemory();
                return -1;
            }
            cap *= 2;
        }
        char *data = PyMem_Realloc(b->data, (size_t)cap);
        if (data == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        b->data = data;
        b->cap = cap;
    }
    memcpy(b->data + b->len, src, (size_t)n);
    b->len += n;
    return 0;
}

static PyObject *
result(PyObject *txns, PyObject *pending, uint64_t received)
{
    return Py_BuildValue("(OOK)", txns, pending, (unsigned long long)received);
}

static PyObject *
take_whole_txns(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "take_whole_txns(get_copy_data, max_frames, max_changes, stop_at)");
        return NULL;
    }
    PyObject *get_copy_data = args[0];
    Py_ssize_t max_frames = PyLong_AsSsize_t(args[1]);
    if (max_frames == -1 && PyErr_Occurred())
        return NULL;
    Py_ssize_t max_changes = PyLong_AsSsize_t(args[2]);
    if (max_changes == -1 && PyErr_Occurred())
        return NULL;
    unsigned long long stop_at = PyLong_AsUnsignedLongLong(args[3]);
    if (stop_at == (unsigned long long)-1 && PyErr_Occurred())
        return NULL;

    PyObject *one = PyLong_FromLong(1);
    PyObject *txns = PyList_New(0);
    PyObject *pending = PyList_New(0);
    PyObject *lsns = NULL;
    PyObject *out = NULL;
    Buffer buf = {NULL, 0, 0};
    uint64_t received = 0, high = 0;
    Py_ssize_t frames = 0;
    int in_txn = 0;
    /* the frame being looked at: released at the end of its turn, or at `done` on an error */
    Py_buffer view;
    int have_view = 0;
    uint64_t begin_at = 0, final_lsn = 0, xid = 0;
    int64_t begin_time = 0;
    if (one == NULL || txns == NULL || pending == NULL)
        goto done;

    for (;;) {
        if (!in_txn && (frames >= max_frames || received >= stop_at))
            break;
        PyObject *got = PyObject_CallOneArg(get_copy_data, one);
        if (got == NULL)
            goto done;
        frames++;
        int appended = PyList_Append(pending, got);
        Py_DECREF(got);
        if (appended < 0)
            goto done;
        if (!PyTuple_Check(got) || PyTuple_GET_SIZE(got) != 2) {
            PyErr_SetString(PyExc_TypeError, "get_copy_data must return (nbytes, data)");
            goto done;
        }
        long nbytes = PyLong_AsLong(PyTuple_GET_ITEM(got, 0));
        if (nbytes == -1 && PyErr_Occurred())
            goto done;
        if (nbytes <= 0)
            break;

        if (PyObject_GetBuffer(PyTuple_GET_ITEM(got, 1), &view, PyBUF_SIMPLE) < 0)
            goto done;
        have_view = 1;
        const unsigned char *p = view.buf;
        Py_ssize_t n = view.len;
        int stop = 0;
        if (n <= HEADER || p[0] != 'w') {
            stop = 1;
        } else if (!in_txn) {
            if (p[HEADER] != 'B' || n < BEGIN_SIZE) {
                stop = 1;
            } else {
                begin_at = be64(p + 1);
                final_lsn = be64(p + 26);
                begin_time = (int64_t)be64(p + 34);
                xid = be32(p + 42);
                high = begin_at;
                in_txn = 1;
            }
        } else {
            unsigned char tag = p[HEADER];
            if ((tag == 'I' || tag == 'U' || tag == 'D') && n > CHANGE_MIN) {
                if (lsns == NULL && (lsns = PyList_New(0)) == NULL) {
                    goto done;
                }
                if (PyList_GET_SIZE(lsns) >= max_changes || n > UINT32_MAX) {
                    stop = 1;
                } else {
                    uint64_t start = be64(p + 1);
                    unsigned char length[4] = {(unsigned char)(n >> 24), (unsigned char)(n >> 16),
                                               (unsigned char)(n >> 8), (unsigned char)n};
                    PyObject *lsn = PyLong_FromUnsignedLongLong(start);
                    if (lsn == NULL || PyList_Append(lsns, lsn) < 0 || buffer_put(&buf, length, 4) < 0 ||
                        buffer_put(&buf, p, n) < 0) {
                        Py_XDECREF(lsn);
                        goto done;
                    }
                    Py_DECREF(lsn);
                    if (start > high)
                        high = start;
                }
            } else if (tag != 'C' || n < COMMIT_SIZE) {
                stop = 1;
            } else {
                uint64_t commit_at = be64(p + 1);
                unsigned int flags = p[26];
                uint64_t commit_lsn = be64(p + 27), end_lsn = be64(p + 35);
                int64_t commit_time = (int64_t)be64(p + 43);
                PyObject *blob = Py_None, *run = Py_None;
                Py_INCREF(Py_None);
                Py_INCREF(Py_None);
                if (lsns != NULL && PyList_GET_SIZE(lsns) > 0) {
                    Py_DECREF(blob);
                    Py_DECREF(run);
                    blob = PyBytes_FromStringAndSize(buf.data, buf.len);
                    run = lsns;
                    lsns = NULL;
                    if (blob == NULL) {
                        Py_DECREF(run);
                        goto done;
                    }
                }
                PyObject *txn = Py_BuildValue("(KKLKNNKIKKL)", (unsigned long long)begin_at,
                                              (unsigned long long)final_lsn, (long long)begin_time,
                                              (unsigned long long)xid, blob, run,
                                              (unsigned long long)commit_at, flags,
                                              (unsigned long long)commit_lsn,
                                              (unsigned long long)end_lsn, (long long)commit_time);
                if (txn == NULL || PyList_Append(txns, txn) < 0) {
                    Py_XDECREF(txn);
                    goto done;
                }
                Py_DECREF(txn);
                if (high > received)
                    received = high;
                if (commit_at > received)
                    received = commit_at;
                in_txn = 0;
                buf.len = 0;
                Py_CLEAR(lsns);
                /* the frames taken are in `txns` now: none to hand back */
                if (PyList_SetSlice(pending, 0, PyList_GET_SIZE(pending), NULL) < 0) {
                    goto done;
                }
            }
        }
        PyBuffer_Release(&view);
        have_view = 0;
        if (stop)
            break;
    }
    out = result(txns, pending, received);

done:
    if (have_view)
        PyBuffer_Release(&view);
    PyMem_Free(buf.data);
    Py_XDECREF(lsns);
    Py_XDECREF(one);
    Py_XDECREF(txns);
    Py_XDECREF(pending);
    return out;
}

static PyMethodDef methods[] = {
    {"take_whole_txns", (PyCFunction)(void (*)(void))take_whole_txns, METH_FASTCALL,
     "take_whole_txns(get_copy_data, max_frames, max_changes, stop_at) -> (txns, handed_back, received)\n\n"
     "See csnd.reader.txnscan.take_whole_txns_py, its twin."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "csnd.reader._txnscan", "take_whole_txns, compiled (see csnd.reader.txnscan).", -1,
    methods,
};

PyMODINIT_FUNC
PyInit__txnscan(void)
{
    PyObject *m = PyModule_Create(&module);
    /* the limits above, for tests/reader/test_txnscan.py to hold to the parser's */
    if (m != NULL && (PyModule_AddIntConstant(m, "HEADER", HEADER) < 0 ||
                      PyModule_AddIntConstant(m, "BEGIN_SIZE", BEGIN_SIZE) < 0 ||
                      PyModule_AddIntConstant(m, "COMMIT_SIZE", COMMIT_SIZE) < 0 ||
                      PyModule_AddIntConstant(m, "CHANGE_MIN", CHANGE_MIN) < 0)) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
