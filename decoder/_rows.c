/*
 * csnd.decoder._rows: a table's row reader, compiled, for tables whose
 * columns are all of a few common types.
 *
 * `read_row(codes, keys, quote, data, pos, end)` is the reader that
 * `rows._compile_row_reader` compiles in Python for the same table, which is
 * its specification and its twin: tests/decoder/test_rows_compiled.py holds
 * the two to the same result for any tuple data.  Keep them in step.  It
 * returns `(row JSON, end of the tuple)`, or None wherever the Python reader
 * gives up -- and it may also give up where that one would not (a value it
 * does not write itself, such as an integer in a form that is not
 * PostgreSQL's own): the caller then takes the checked path, which writes
 * the same text.
 *
 * `codes` has one byte per column: 'h' int2, 'i' int4, 'q' int8, 'b' bool,
 * 's' a string type (text, varchar, bpchar, name: a JSON string of the UTF-8
 * value).  `keys` holds each column's `"name": ` as UTF-8 bytes, and `quote`
 * is json.encoder.encode_basestring, called for a string with a character
 * that needs escaping (or that is not ASCII), so the escapes are its own.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#define KIND_NULL 'n'
#define KIND_TEXT 't'
#define KIND_BINARY 'b'

typedef struct {
    char *data;
    Py_ssize_t len, cap;
    char inline_[512];
} Out;

static int
out_put(Out *o, const char *src, Py_ssize_t n)
{
    if (o->len + n > o->cap) {
        Py_ssize_t cap = o->cap * 2;
        while (cap < o->len + n)
            cap *= 2;
        char *data;
        if (o->data == o->inline_) {
            data = PyMem_Malloc((size_t)cap);
            if (data != NULL)
                memcpy(data, o->inline_, (size_t)o->len);
        } else {
            data = PyMem_Realloc(o->data, (size_t)cap);
        }
        if (data == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        o->data = data;
        o->cap = cap;
    }
    memcpy(o->data + o->len, src, (size_t)n);
    o->len += n;
    return 0;
}

static void
out_free(Out *o)
{
    if (o->data != o->inline_)
        PyMem_Free(o->data);
}

static int64_t
be_signed(const unsigned char *p, Py_ssize_t size)
{
    uint64_t v = 0;
    for (Py_ssize_t i = 0; i < size; i++)
        v = (v << 8) | p[i];
    if (size < 8 && (v >> (size * 8 - 1)) & 1) /* sign-extend */
        v |= ~(uint64_t)0 << (size * 8);
    return (int64_t)v;
}

/* PostgreSQL's own text of an integer: -?(0|[1-9][0-9]*), what `str(int(text))` gives back unchanged. */
static int
canonical_int(const unsigned char *p, Py_ssize_t n)
{
    Py_ssize_t i = 0;
    if (n > 0 && p[0] == '-')
        i = 1;
    if (i == n || n - i > 19)
        return 0;
    if (p[i] == '0')
        return n == 1; /* "0"; "-0" and "007" are not it */
    for (; i < n; i++)
        if (p[i] < '0' || p[i] > '9')
            return 0;
    return 1;
}

/* 1 written, 0 give up (None), -1 error. */
static int
put_string(Out *o, PyObject *quote, const unsigned char *p, Py_ssize_t n)
{
    Py_ssize_t i = 0;
    while (i < n && p[i] >= 0x20 && p[i] < 0x7f && p[i] != '"' && p[i] != '\\')
        i++;
    if (i == n) {
        if (out_put(o, "\"", 1) < 0 || out_put(o, (const char *)p, n) < 0 || out_put(o, "\"", 1) < 0)
            return -1;
        return 1;
    }
    PyObject *text = PyUnicode_DecodeUTF8((const char *)p, n, "strict");
    if (text == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_UnicodeDecodeError))
            return -1;
        PyErr_Clear(); /* not UTF-8: the checked path names the column */
        return 0;
    }
    PyObject *quoted = PyObject_CallOneArg(quote, text);
    Py_DECREF(text);
    if (quoted == NULL)
        return -1;
    Py_ssize_t size;
    const char *utf8 = PyUnicode_Check(quoted) ? PyUnicode_AsUTF8AndSize(quoted, &size) : NULL;
    int r = utf8 == NULL ? -1 : out_put(o, utf8, size);
    if (utf8 == NULL && !PyErr_Occurred())
        PyErr_SetString(PyExc_TypeError, "quote must return a str");
    Py_DECREF(quoted);
    return r < 0 ? -1 : 1;
}

/* One value of column code `code`, of form `kind`, at p[0:n]: 1 written, 0 give up, -1 error. */
static int
put_value(Out *o, PyObject *quote, char code, int kind, const unsigned char *p, Py_ssize_t n)
{
    char digits[24];
    if (code == 's')
        return put_string(o, quote, p, n);
    if (kind == KIND_TEXT) {
        if (code == 'b') {
            if (n != 1 || (p[0] != 't' && p[0] != 'f'))
                return 0;
            return out_put(o, p[0] == 't' ? "true" : "false", p[0] == 't' ? 4 : 5) < 0 ? -1 : 1;
        }
        if (!canonical_int(p, n))
            return 0;
        return out_put(o, (const char *)p, n) < 0 ? -1 : 1;
    }
    if (code == 'b') {
        if (n != 1 || p[0] > 1)
            return 0;
        return out_put(o, p[0] ? "true" : "false", p[0] ? 4 : 5) < 0 ? -1 : 1;
    }
    Py_ssize_t size = code == 'h' ? 2 : code == 'i' ? 4 : 8;
    if (n != size)
        return 0;
    int len = snprintf(digits, sizeof digits, "%lld", (long long)be_signed(p, size));
    return out_put(o, digits, len) < 0 ? -1 : 1;
}

static PyObject *
read_row(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 6) {
        PyErr_Format(PyExc_TypeError, "read_row takes 6 arguments (%zd given)", nargs);
        return NULL;
    }
    PyObject *codes = args[0], *keys = args[1], *quote = args[2], *data = args[3];
    if (!PyBytes_Check(codes) || !PyTuple_Check(keys) || PyTuple_GET_SIZE(keys) != PyBytes_GET_SIZE(codes)) {
        PyErr_SetString(PyExc_TypeError, "read_row: codes must be bytes and keys a tuple of as many bytes");
        return NULL;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(data, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    Py_ssize_t pos = PyLong_AsSsize_t(args[4]);
    Py_ssize_t end = pos == -1 && PyErr_Occurred() ? -1 : PyLong_AsSsize_t(args[5]);
    if (PyErr_Occurred()) {
        PyBuffer_Release(&view);
        return NULL;
    }
    const unsigned char *buf = view.buf;
    Py_ssize_t size = view.len, n = PyBytes_GET_SIZE(codes);
    const char *code = PyBytes_AS_STRING(codes);
    PyObject *result = NULL;
    Out o;
    o.data = o.inline_;
    o.len = 0;
    o.cap = sizeof o.inline_;
    int give_up = 1;
    /* As the Python reader: the column count is a signed 16-bit number read while pos + 2 <= end;
       each column's kind byte is read wherever pos is in the data (not checked against end);
       a value's 4-byte length must lie in the data, and the value must end by `end`. */
    if (pos < 0 || pos + 2 > end || pos + 2 > size || (int16_t)((buf[pos] << 8) | buf[pos + 1]) != n)
        goto done;
    pos += 2;
    if (out_put(&o, "{", 1) < 0)
        goto error;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (i > 0 && out_put(&o, ", ", 2) < 0)
            goto error;
        PyObject *key = PyTuple_GET_ITEM(keys, i);
        if (!PyBytes_Check(key)) {
            PyErr_SetString(PyExc_TypeError, "read_row: each key must be bytes");
            goto error;
        }
        if (out_put(&o, PyBytes_AS_STRING(key), PyBytes_GET_SIZE(key)) < 0)
            goto error;
        if (pos >= size)
            goto done;
        int kind = buf[pos];
        if (kind == KIND_NULL) {
            if (out_put(&o, "null", 4) < 0)
                goto error;
            pos += 1;
            continue;
        }
        if ((kind != KIND_BINARY && kind != KIND_TEXT) || pos + 5 > size)
            goto done;
        int32_t length = (int32_t)(((uint32_t)buf[pos + 1] << 24) | ((uint32_t)buf[pos + 2] << 16) |
                                   ((uint32_t)buf[pos + 3] << 8) | buf[pos + 4]);
        Py_ssize_t start = pos + 5;
        pos = start + length;
        if (pos > end || pos < start)
            goto done;
        int r = put_value(&o, quote, code[i], kind, buf + start, length);
        if (r < 0)
            goto error;
        if (r == 0)
            goto done;
    }
    if (out_put(&o, "}", 1) < 0)
        goto error;
    give_up = 0;
done:
    if (give_up) {
        result = Py_NewRef(Py_None);
    } else {
        PyObject *text = PyUnicode_DecodeUTF8(o.data, o.len, "strict");
        if (text != NULL) {
            result = Py_BuildValue("(Nn)", text, pos);
        }
    }
    out_free(&o);
    PyBuffer_Release(&view);
    return result;
error:
    out_free(&o);
    PyBuffer_Release(&view);
    return NULL;
}

static PyMethodDef methods[] = {
    {"read_row", (PyCFunction)(void (*)(void))read_row, METH_FASTCALL,
     "read_row(codes, keys, quote, data, pos, end) -> (row JSON, end of the tuple) or None\n\n"
     "A table's compiled row reader (see rows._compile_row_reader, its twin)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "csnd.decoder._rows",
    "A table's row reader for common column types, compiled (twin: rows._compile_row_reader).", -1, methods,
};

PyMODINIT_FUNC
PyInit__rows(void)
{
    return PyModule_Create(&module);
}
