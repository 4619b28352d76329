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
 *
 * `render_rows(codes, keys, quote, builders, buf, pos, end, prefix)` does
 * split_rows and the table's compiled row reader in one pass, writing a
 * chunk's change objects straight to UTF-8: for each whole row,
 * `prefix` + the row's JSON + "}", ", " between rows -- what
 * csnd.snapshot.render.chunk_changes writes from split_rows' tuples (its
 * twin: tests/snapshot/test_copysplit.py holds the two equal).  The value
 * writers are the row reader's own (csnd/decoder/_rows.c, compiled in
 * here), so a value's text is the stream's by construction.  Returns
 * `(text, rows, pos, state)` as split_rows does, text None where the row
 * reader gives up (the caller takes the checked path).  No Python object
 * is made a row: the per-row tuple, str, list entry, join and encode were
 * most of the snapshot's rendering time; the text is written straight into
 * the bytes object returned (`Out.bytes`), not copied into it at the end.  The row loop runs with the GIL
 * released, so copier threads of one process render in parallel: a value
 * written through Python (a builder, a string to escape) takes the GIL
 * back for itself (`out_gil` in _rows.c), and a table with a column whose
 * binary values always are (a '?', 'S', 'f' or 'F' code) keeps it held.
 *
 * `read_copy(pgconn, get_copy_data, free_mem)` reads a COPY TO STDOUT's
 * data to its end in one call, the GIL released: `pgconn` is libpq's
 * PGconn pointer, the others libpq's PQgetCopyData and PQfreemem, as
 * addresses (of the libpq the connection was made with: see
 * csnd.snapshot.copyread).  Returns `(data, status)`: status -1 the COPY
 * ended (its result is next), -2 an error (PQgetResult says which).
 * psycopg's per-message loop cost about 1 us a row; this, a memcpy.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* The row reader's value writers (put_value, Out, ...): the very code the stream renders with. */
#include "../decoder/_rows.c"

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

/* `buffer` as a simple buffer and pos..end a span within it, as split_rows and render_rows
   take them.  0, or -1 with an exception naming `fn` (the buffer released). */
static int
get_span(PyObject *buffer, PyObject *pos_arg, PyObject *end_arg, const char *fn, Py_buffer *view,
         Py_ssize_t *pos, Py_ssize_t *end)
{
    if (PyObject_GetBuffer(buffer, view, PyBUF_SIMPLE) < 0)
        return -1;
    *pos = PyLong_AsSsize_t(pos_arg);
    *end = *pos == -1 && PyErr_Occurred() ? -1 : PyLong_AsSsize_t(end_arg);
    if (PyErr_Occurred()) {
        PyBuffer_Release(view);
        return -1;
    }
    if (*pos < 0 || *end > view->len || *end < *pos) {
        PyBuffer_Release(view);
        PyErr_Format(PyExc_ValueError, "%s: pos and end must lie in the buffer, pos <= end", fn);
        return -1;
    }
    return 0;
}

static PyObject *
split_rows(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3) {
        PyErr_Format(PyExc_TypeError, "split_rows takes 3 arguments (%zd given)", nargs);
        return NULL;
    }
    Py_buffer view;
    Py_ssize_t pos, end;
    if (get_span(args[0], args[1], args[2], "split_rows", &view, &pos, &end) < 0)
        return NULL;
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

/* A column's `"name": `, read from its bytes object before the GIL is released. */
typedef struct {
    const char *text;
    Py_ssize_t len;
} Key;

/* Whether a value of type code `c` in binary form may be written with the GIL released: every
   code but those whose binary values always go through Python (a builder, repr() of a float).
   A table with such a column renders with the GIL held, as before (a release a row would cost
   more than it frees). */
static int
writes_without_gil(char c)
{
    return c != '?' && c != 'S' && c != 'f' && c != 'F';
}

/* One binary COPY row from `pos` as the row reader's JSON, appended to `o`: 1 written (*row_end
   set), 0 the row does not end by `end`, 2 the reader gives up, -1 error.  As read_row on the row's
   split_rows tuple: a negative length is NULL, every other value is a binary one. */
static int
render_row(Out *o, const char *code, const Key *keys, PyObject *quote, PyObject *builders, Py_ssize_t n,
           const unsigned char *buf, Py_ssize_t pos, Py_ssize_t end, int count, Py_ssize_t *row_end)
{
    if (count != n) {
        /* (read_row gives up on another count; first make sure the row is whole, as split_rows would) */
        return tuple_size(buf, pos, end, count, row_end) < 0 ? 0 : 2;
    }
    Py_ssize_t p = pos + 2;
    if (out_put(o, "{", 1) < 0)
        return -1;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (i > 0 && out_put(o, ", ", 2) < 0)
            return -1;
        if (out_put(o, keys[i].text, keys[i].len) < 0)
            return -1;
        if (p + 4 > end)
            return 0;
        int32_t len = be_i32(buf + p);
        if (len < 0) {
            if (out_put(o, "null", 4) < 0)
                return -1;
            p += 4;
            continue;
        }
        if (p + 4 + (Py_ssize_t)len > end)
            return 0;
        int r = put_value(o, quote, PyTuple_GET_ITEM(builders, i), code[i], KIND_BINARY, buf + p + 4, len);
        if (r < 0)
            return -1;
        if (r == 0) /* (the rest of the row must still be whole for split_rows' answer) */
            return tuple_size(buf, pos, end, count, row_end) < 0 ? 0 : 2;
        p += 4 + len;
    }
    if (out_put(o, "}}", 2) < 0) /* (the row's, then its change object's) */
        return -1;
    *row_end = p;
    return 1;
}

static PyObject *
render_rows(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 8) {
        PyErr_Format(PyExc_TypeError, "render_rows takes 8 arguments (%zd given)", nargs);
        return NULL;
    }
    PyObject *codes = args[0], *keys = args[1], *quote = args[2], *builders = args[3], *prefix = args[7];
    if (check_reader_args(codes, keys, builders, "render_rows") < 0)
        return NULL;
    if (!PyBytes_Check(prefix)) {
        PyErr_SetString(PyExc_TypeError, "render_rows: prefix must be bytes");
        return NULL;
    }
    Py_ssize_t n = PyBytes_GET_SIZE(codes);
    for (Py_ssize_t i = 0; i < n; i++) {
        if (!PyBytes_Check(PyTuple_GET_ITEM(keys, i))) {
            PyErr_SetString(PyExc_TypeError, "render_rows: each key must be bytes");
            return NULL;
        }
    }
    Py_buffer view;
    Py_ssize_t pos, end;
    if (get_span(args[4], args[5], args[6], "render_rows", &view, &pos, &end) < 0)
        return NULL;
    const unsigned char *buf = view.buf;
    const char *code = PyBytes_AS_STRING(codes);
    const char *prefix_text = PyBytes_AS_STRING(prefix);
    Py_ssize_t prefix_len = PyBytes_GET_SIZE(prefix);
    Key *key = PyMem_Malloc(sizeof(Key) * (size_t)(n > 0 ? n : 1));
    if (key == NULL) {
        PyBuffer_Release(&view);
        return PyErr_NoMemory();
    }
    int release = 1;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *k = PyTuple_GET_ITEM(keys, i);
        key[i].text = PyBytes_AS_STRING(k);
        key[i].len = PyBytes_GET_SIZE(k);
        release &= writes_without_gil(code[i]);
    }
    Out o;
    o.data = o.inline_;
    o.len = 0;
    o.cap = sizeof o.inline_;
    o.released = NULL;
    /* The text is written straight into the bytes object returned: grown (the GIL taken for it)
       and finally shrunk, never copied out of a buffer (a chunk is megabytes, and that copy was
       about a seventh of the client's CPU in a snapshot).  Room for the usual text at once: 3.6
       times the COPY's bytes for the bench's rows. */
    Py_ssize_t room = (end - pos) * 4 + 4096;
    o.bytes = PyBytes_FromStringAndSize(NULL, room);
    if (o.bytes == NULL) {
        PyMem_Free(key);
        PyBuffer_Release(&view);
        return NULL;
    }
    o.data = PyBytes_AS_STRING(o.bytes);
    o.cap = room;
    Py_ssize_t rows = 0;
    int state = 0, gave_up = 0;
    /* The loop runs with the GIL released (copier threads in one process render in parallel):
       a writer that needs Python takes it back (out_gil), and the next row releases it again. */
    while (pos + 2 <= end) {
        if (release && o.released == NULL)
            o.released = PyEval_SaveThread();
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
        Py_ssize_t mark = o.len, row_end = 0;
        if ((rows > 0 && out_put(&o, ", ", 2) < 0) || out_put(&o, prefix_text, prefix_len) < 0)
            goto error;
        int r = gave_up ? 2 : render_row(&o, code, key, quote, builders, n, buf, pos, end, count, &row_end);
        if (gave_up && tuple_size(buf, pos, end, count, &row_end) < 0)
            r = 0;
        if (r < 0)
            goto error;
        if (r == 0) {
            o.len = mark; /* (the row is not whole yet: it starts the next call) */
            break;
        }
        if (r == 2) {
            gave_up = 1; /* (no text, but split_rows' pos and state still) */
            o.len = 0;
        }
        rows++;
        pos = row_end;
    }
    out_gil(&o);
    PyObject *text;
    if (gave_up) {
        text = Py_NewRef(Py_None);
    } else {
        /* (a realloc that shrinks in place; if it fails it freed the object and set MemoryError,
           and o.bytes is NULL) */
        text = _PyBytes_Resize(&o.bytes, o.len) == 0 ? o.bytes : NULL;
        o.bytes = NULL;
        o.data = o.inline_; /* (the text is the caller's now: nothing is left to free) */
    }
    out_free(&o);
    PyMem_Free(key);
    PyBuffer_Release(&view);
    if (text == NULL)
        return NULL;
    return Py_BuildValue("(Nnni)", text, rows, pos, state);
error:
    out_gil(&o); /* (a writer that failed set its exception with the GIL held: out_gil is a no-op) */
    out_free(&o);
    PyMem_Free(key);
    PyBuffer_Release(&view);
    return NULL;
}

typedef int (*get_copy_data_fn)(void *conn, char **buffer, int async);
typedef void (*free_mem_fn)(void *ptr);

static PyObject *
read_copy(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3) {
        PyErr_Format(PyExc_TypeError, "read_copy takes 3 arguments (%zd given)", nargs);
        return NULL;
    }
    void *conn = PyLong_AsVoidPtr(args[0]);
    get_copy_data_fn get_copy_data = (get_copy_data_fn)PyLong_AsVoidPtr(args[1]);
    free_mem_fn free_mem = (free_mem_fn)PyLong_AsVoidPtr(args[2]);
    if (PyErr_Occurred())
        return NULL;
    if (conn == NULL || get_copy_data == NULL || free_mem == NULL) {
        PyErr_SetString(PyExc_ValueError, "read_copy: null connection or function");
        return NULL;
    }
    /* The data is read straight into the bytes object returned, not into a buffer copied into
       it at the end (a chunk's COPY is most of a megabyte): grown, rarely, with the GIL taken
       for Python's allocator, and finally shrunk. */
    Py_ssize_t len = 0, cap = 1 << 20;
    PyObject *bytes = PyBytes_FromStringAndSize(NULL, cap);
    if (bytes == NULL)
        return NULL;
    int status = 0, oom = 0;
    PyThreadState *released = PyEval_SaveThread();
    for (;;) {
        char *msg = NULL;
        int got = get_copy_data(conn, &msg, 0);
        if (got < 0) {
            status = got;
            break;
        }
        if (!oom && len + got > cap) {
            Py_ssize_t grown = cap * 2;
            while (grown < len + got)
                grown *= 2;
            PyEval_RestoreThread(released);
            if (_PyBytes_Resize(&bytes, grown) < 0)
                oom = 1; /* (MemoryError set, bytes freed; the rest of the COPY is read and dropped:
                            the connection stays usable) */
            else
                cap = grown;
            released = PyEval_SaveThread();
        }
        if (!oom) {
            memcpy(PyBytes_AS_STRING(bytes) + len, msg, (size_t)got);
            len += got;
        }
        free_mem(msg);
    }
    PyEval_RestoreThread(released);
    if (oom || _PyBytes_Resize(&bytes, len) < 0)
        return NULL;
    return Py_BuildValue("(Ni)", bytes, status);
}

static PyMethodDef copysplit_methods[] = {
    {"split_rows", (PyCFunction)(void (*)(void))split_rows, METH_FASTCALL,
     "split_rows(buf, pos, end) -> (rows, pos, state)\n\n"
     "Binary COPY rows as pgoutput Insert tuples (see copyrows._split_rows_py, its twin)."},
    {"render_rows", (PyCFunction)(void (*)(void))render_rows, METH_FASTCALL,
     "render_rows(codes, keys, quote, builders, buf, pos, end, prefix) -> (text or None, rows, pos, state)\n\n"
     "Binary COPY rows as a chunk's change objects in UTF-8 (see render.chunk_changes, its twin)."},
    {"read_copy", (PyCFunction)(void (*)(void))read_copy, METH_FASTCALL,
     "read_copy(pgconn, get_copy_data, free_mem) -> (data, status)\n\n"
     "A COPY TO STDOUT's data to its end, through libpq's PQgetCopyData (addresses given)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef copysplit_module = {
    PyModuleDef_HEAD_INIT, "csnd.snapshot._copysplit",
    "Binary COPY rows as pgoutput Insert tuples or a chunk's text, and a COPY read in one call, compiled.", -1,
    copysplit_methods,
};

PyMODINIT_FUNC
PyInit__copysplit(void)
{
    return PyModule_Create(&copysplit_module);
}
