/*
 * csnd.snapshot._copysplit: binary COPY rows -> pgoutput Insert tuples, compiled.
 *
 * `split_rows(buf, pos, end)` is the row loop of
 * csnd.snapshot.copyrows.BinaryCopyRows.feed (`_split_rows_py`, its twin and
 * specification: tests/snapshot/test_copysplit.py holds the two to the same
 * result for any bytes).  From `pos`, while a whole row lies before `end`,
 * it turns each binary COPY row (int16 field count, then per field an int32
 * length, -1 for NULL, and the value) into the data of a pgoutput Insert:
 * `N`, the count, then per field `n` (NULL) or `b` + length + value.
 *
 * Returns `(rows, pos, state)`: the rows completed, where the first
 * incomplete one starts, and state 0 (more may come), 1 (the trailer was
 * read; pos is after it) or -1 (a row with a negative field count other
 * than the trailer's starts at pos: the caller names the error).
 *
 * Why compiled: an initial snapshot parses every row of every table, and
 * the twin's per-field Python loop was a quarter of its time.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

static inline int32_t
be_i32(const unsigned char *p)
{
    return (int32_t)(((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3]);
}

/* The size of row's Insert tuple from `pos`, or -1 when it does not end by `end`. */
static Py_ssize_t
tuple_size(const unsigned char *buf, Py_ssize_t pos, Py_ssize_t end, int count, Py_ssize_t *row_end)
{
    Py_ssize_t p = pos + 2, size = 1 + 2;
    for (int i = 0; i < count; i++) {
        if (p + 4 > end)
            return -1;
        int32_t n = be_i32(buf + p);
        if (n < 0) {
            size += 1;
            p += 4;
            continue;
        }
        if (p + 4 + (Py_ssize_t)n > end)
            return -1;
        size += 1 + 4 + n;
        p += 4 + n;
    }
    *row_end = p;
    return size;
}

static PyObject *
split_rows(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3) {
        PyErr_Format(PyExc_TypeError, "split_rows takes 3 arguments (%zd given)", nargs);
        return NULL;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0)
        return NULL;
    Py_ssize_t pos = PyLong_AsSsize_t(args[1]);
    Py_ssize_t end = pos == -1 && PyErr_Occurred() ? -1 : PyLong_AsSsize_t(args[2]);
    if (PyErr_Occurred()) {
        PyBuffer_Release(&view);
        return NULL;
    }
    if (pos < 0 || end > view.len || end < pos) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "split_rows: pos and end must lie in the buffer, pos <= end");
        return NULL;
    }
    const unsigned char *buf = view.buf;
    PyObject *rows = PyList_New(0);
    if (rows == NULL) {
        PyBuffer_Release(&view);
        return NULL;
    }
    int state = 0;
    while (pos + 2 <= end) {
        int count = (int16_t)((buf[pos] << 8) | buf[pos + 1]);
        if (count == -1) {
            state = 1;
            pos += 2;
            break;
        }
        if (count < 0) {
            state = -1;
            break;
        }
        Py_ssize_t row_end = 0;
        Py_ssize_t size = tuple_size(buf, pos, end, count, &row_end);
        if (size < 0)
            break;
        PyObject *row = PyBytes_FromStringAndSize(NULL, size);
        if (row == NULL)
            goto error;
        char *out = PyBytes_AS_STRING(row);
        *out++ = 'N';
        *out++ = (char)buf[pos];
        *out++ = (char)buf[pos + 1];
        Py_ssize_t p = pos + 2;
        for (int i = 0; i < count; i++) {
            int32_t n = be_i32(buf + p);
            if (n < 0) {
                *out++ = 'n';
                p += 4;
                continue;
            }
            *out++ = 'b';
            memcpy(out, buf + p, 4 + (size_t)n);
            out += 4 + n;
            p += 4 + n;
        }
        int failed = PyList_Append(rows, row);
        Py_DECREF(row);
        if (failed < 0)
            goto error;
        pos = row_end;
    }
    PyBuffer_Release(&view);
    return Py_BuildValue("(Nni)", rows, pos, state);
error:
    Py_DECREF(rows);
    PyBuffer_Release(&view);
    return NULL;
}

static PyMethodDef methods[] = {
    {"split_rows", (PyCFunction)(void (*)(void))split_rows, METH_FASTCALL,
     "split_rows(buf, pos, end) -> (rows, pos, state)\n\n"
     "Binary COPY rows as pgoutput Insert tuples (see copyrows._split_rows_py, its twin)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "csnd.snapshot._copysplit",
    "Binary COPY rows as pgoutput Insert tuples, compiled (twin in copyrows).", -1, methods,
};

PyMODINIT_FUNC
PyInit__copysplit(void)
{
    return PyModule_Create(&module);
}
