/*
 * csnd.reader._txnscan: `take_whole_txns`, compiled.
 *
 * The same function as `take_whole_txns_py` in csnd/reader/txnscan.py, which is
 * its specification and its twin: tests/reader/test_txnscan.py holds the two
 * to the same output for any sequence of frames.  Keep them in step.
 *
 * It reads XLogData frames with the connection's `get_copy_data(1)` and
 * returns whole one-piece transactions (Begin, row changes, Commit), the
 * frames it could not take (exactly as `get_copy_data` returned them) and
 * the highest dataStart of the transactions taken.
 *
 * `CopyReader(pgconn, error_class)` is `pgconn.get_copy_data` for a psycopg
 * connection, calling libpq's PQgetCopyData itself.  Handed one in place of
 * `get_copy_data`, the loop reads the frames it takes straight from libpq's
 * buffers, with no Python object per frame (psycopg makes a buffer object,
 * a memoryview and a tuple for each): on one-row transactions those were a
 * large part of the reader's time.  It uses the libpq psycopg loaded, found
 * among the process's shared objects (`bind_libpq`: exactly one must be
 * there, of the version psycopg reports).
 */
#define _GNU_SOURCE
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <dlfcn.h>
#include <link.h>
#include <stdint.h>
#include <stdio.h>
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

/* --- libpq, as psycopg loaded it ---------------------------------------------------------- */

typedef int (*get_copy_data_fn)(void *conn, char **buffer, int async);
typedef void (*freemem_fn)(void *ptr);
typedef char *(*error_message_fn)(const void *conn);
typedef int (*lib_version_fn)(void);

static get_copy_data_fn pq_get_copy_data;
static freemem_fn pq_freemem;
static error_message_fn pq_error_message;

typedef struct {
    int count;
    char path[4096];
} Found;

static int
find_libpq(struct dl_phdr_info *info, size_t size, void *data)
{
    (void)size;
    Found *found = data;
    const char *name = info->dlpi_name ? info->dlpi_name : "";
    const char *base = strrchr(name, '/');
    base = base ? base + 1 : name;
    if (strncmp(base, "libpq", 5) == 0 && (base[5] == '.' || base[5] == '-')) {
        if (found->count++ == 0)
            snprintf(found->path, sizeof found->path, "%s", name);
    }
    return 0;
}

/* bind_libpq(version) -> None when bound, else why not (a str). */
static PyObject *
bind_libpq(PyObject *module, PyObject *arg)
{
    (void)module;
    long want = PyLong_AsLong(arg);
    if (want == -1 && PyErr_Occurred())
        return NULL;
    Found found = {0, {0}};
    dl_iterate_phdr(find_libpq, &found);
    if (found.count != 1)
        return PyUnicode_FromFormat("%d libpq libraries are loaded, not one", found.count);
    void *lib = dlopen(found.path, RTLD_NOW | RTLD_NOLOAD);
    if (lib == NULL)
        return PyUnicode_FromFormat("cannot open the loaded libpq %s", found.path);
    get_copy_data_fn get = (get_copy_data_fn)dlsym(lib, "PQgetCopyData");
    freemem_fn freemem = (freemem_fn)dlsym(lib, "PQfreemem");
    error_message_fn message = (error_message_fn)dlsym(lib, "PQerrorMessage");
    lib_version_fn version = (lib_version_fn)dlsym(lib, "PQlibVersion");
    dlclose(lib); /* (NOLOAD took a reference of its own; psycopg's keeps it loaded) */
    if (get == NULL || freemem == NULL || message == NULL || version == NULL)
        return PyUnicode_FromFormat("%s lacks a function the reader needs", found.path);
    if (version() != want)
        return PyUnicode_FromFormat("%s is libpq %d, psycopg uses %ld", found.path, version(), want);
    pq_get_copy_data = get;
    pq_freemem = freemem;
    pq_error_message = message;
    Py_RETURN_NONE;
}

typedef struct {
    PyObject_HEAD
    PyObject *pgconn; /* the psycopg PGconn: its pgconn_ptr is None once it is closed */
    PyObject *error_class;
} CopyReader;

static PyTypeObject CopyReaderType;

/* The PGconn of `r`, or NULL with error_class raised when the connection is closed. */
static void *
conn_of(CopyReader *r)
{
    PyObject *ptr = PyObject_GetAttrString(r->pgconn, "pgconn_ptr");
    if (ptr == NULL)
        return NULL;
    void *conn = ptr == Py_None ? NULL : PyLong_AsVoidPtr(ptr);
    Py_DECREF(ptr);
    if (conn == NULL && !PyErr_Occurred())
        PyErr_SetString(r->error_class, "the connection is closed");
    return conn;
}

/* psycopg's error for a failed read: "receiving copy data failed: <libpq's message>". */
static void
copy_failed(CopyReader *r, void *conn)
{
    const char *message = pq_error_message(conn);
    size_t n = message ? strlen(message) : 0;
    while (n > 0 && (message[n - 1] == '\n' || message[n - 1] == ' '))
        n--;
    PyObject *text = PyUnicode_DecodeUTF8(message ? message : "", (Py_ssize_t)n, "replace");
    if (text != NULL) {
        PyErr_Format(r->error_class, "receiving copy data failed: %U", text);
        Py_DECREF(text);
    }
}

/* (n, bytes) as psycopg's get_copy_data returns it (bytes for its memoryview); frees `raw`. */
static PyObject *
copy_item(int n, char *raw)
{
    PyObject *item = raw ? Py_BuildValue("(iy#)", n, raw, (Py_ssize_t)n) : Py_BuildValue("(iy#)", n, "", (Py_ssize_t)0);
    if (raw)
        pq_freemem(raw);
    return item;
}

static PyObject *
CopyReader_call(PyObject *self, PyObject *args, PyObject *kwargs)
{
    CopyReader *r = (CopyReader *)self;
    int async_;
    if (kwargs != NULL || !PyArg_ParseTuple(args, "i:get_copy_data", &async_)) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "get_copy_data takes one positional argument");
        return NULL;
    }
    void *conn = conn_of(r);
    if (conn == NULL)
        return NULL;
    char *raw = NULL;
    int n = pq_get_copy_data(conn, &raw, async_);
    if (n == -2) {
        copy_failed(r, conn);
        return NULL;
    }
    return copy_item(n, raw);
}

static PyObject *
CopyReader_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    PyObject *pgconn, *error_class;
    static char *names[] = {"pgconn", "error_class", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO:CopyReader", names, &pgconn, &error_class))
        return NULL;
    if (pq_get_copy_data == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "libpq is not bound (bind_libpq)");
        return NULL;
    }
    if (!PyExceptionClass_Check(error_class)) {
        PyErr_SetString(PyExc_TypeError, "error_class must be an exception class");
        return NULL;
    }
    CopyReader *r = (CopyReader *)type->tp_alloc(type, 0);
    if (r == NULL)
        return NULL;
    r->pgconn = Py_NewRef(pgconn);
    r->error_class = Py_NewRef(error_class);
    return (PyObject *)r;
}

static void
CopyReader_dealloc(PyObject *self)
{
    CopyReader *r = (CopyReader *)self;
    Py_XDECREF(r->pgconn);
    Py_XDECREF(r->error_class);
    Py_TYPE(self)->tp_free(self);
}

static PyTypeObject CopyReaderType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "csnd.reader._txnscan.CopyReader",
    .tp_basicsize = sizeof(CopyReader),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "CopyReader(pgconn, error_class): pgconn.get_copy_data through libpq directly.",
    .tp_new = CopyReader_new,
    .tp_dealloc = CopyReader_dealloc,
    .tp_call = CopyReader_call,
};

/* The frames of the open transaction read by a CopyReader: libpq's own buffers, freed once it
   is taken, or handed back as (n, bytes) items when the loop stops inside it. */
typedef struct {
    char **raw;
    int *len;
    Py_ssize_t n, cap;
} Held;

static int
held_push(Held *h, char *raw, int len)
{
    if (h->n == h->cap) {
        Py_ssize_t cap = h->cap ? h->cap * 2 : 16;
        char **r = PyMem_Realloc(h->raw, (size_t)cap * sizeof *r);
        if (r != NULL)
            h->raw = r;
        int *l = r ? PyMem_Realloc(h->len, (size_t)cap * sizeof *l) : NULL;
        if (l != NULL)
            h->len = l;
        if (r == NULL || l == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        h->cap = cap;
    }
    h->raw[h->n] = raw;
    h->len[h->n] = len;
    h->n++;
    return 0;
}

static void
held_free(Held *h)
{
    for (Py_ssize_t i = 0; i < h->n; i++)
        pq_freemem(h->raw[i]);
    h->n = 0;
}

/* The held frames onto `pending`, in order, as get_copy_data would have returned them. */
static int
held_hand_back(Held *h, PyObject *pending)
{
    int failed = 0;
    for (Py_ssize_t i = 0; i < h->n; i++) {
        PyObject *item = failed ? NULL : Py_BuildValue("(iy#)", h->len[i], h->raw[i], (Py_ssize_t)h->len[i]);
        if (item == NULL || PyList_Append(pending, item) < 0)
            failed = 1;
        Py_XDECREF(item);
        pq_freemem(h->raw[i]);
    }
    h->n = 0;
    return failed ? -1 : 0;
}

/* The class of a scanned transaction, `csnd.reader.pgoutput.ScannedTxn`: a NamedTuple of
 * TXN_FIELDS fields, bound once by csnd/reader/txnscan.py (`bind_txn_type`).  Its instances
 * are made as the interpreter makes a tuple subclass's (tp_alloc, then the items), with no
 * call of its Python-level __new__. */
#define TXN_FIELDS 11
static PyTypeObject *txn_type = NULL;

static PyObject *
bind_txn_type(PyObject *module, PyObject *cls)
{
    if (!PyType_Check(cls) || !PyType_IsSubtype((PyTypeObject *)cls, &PyTuple_Type) ||
        ((PyTypeObject *)cls)->tp_basicsize != PyTuple_Type.tp_basicsize) {
        PyErr_SetString(PyExc_TypeError, "bind_txn_type: a tuple subclass without fields of its own (a NamedTuple)");
        return NULL;
    }
    Py_INCREF(cls);
    Py_XSETREF(txn_type, (PyTypeObject *)cls);
    Py_RETURN_NONE;
}

/* A ScannedTxn of the given items; steals the references to `blob` and `run`. */
static PyObject *
new_txn(uint64_t begin_at, uint64_t final_lsn, int64_t begin_time, uint64_t xid, PyObject *blob, PyObject *run,
        uint64_t commit_at, unsigned int flags, uint64_t commit_lsn, uint64_t end_lsn, int64_t commit_time)
{
    PyObject *txn = txn_type->tp_alloc(txn_type, TXN_FIELDS);
    if (txn == NULL) {
        Py_DECREF(blob);
        Py_DECREF(run);
        return NULL;
    }
    PyObject *items[TXN_FIELDS] = {
        PyLong_FromUnsignedLongLong(begin_at), PyLong_FromUnsignedLongLong(final_lsn),
        PyLong_FromLongLong(begin_time),       PyLong_FromUnsignedLongLong(xid),
        blob,                                  run,
        PyLong_FromUnsignedLongLong(commit_at), PyLong_FromUnsignedLong(flags),
        PyLong_FromUnsignedLongLong(commit_lsn), PyLong_FromUnsignedLongLong(end_lsn),
        PyLong_FromLongLong(commit_time),
    };
    int failed = 0;
    for (int i = 0; i < TXN_FIELDS; i++) {
        if (items[i] == NULL)
            failed = 1;
        PyTuple_SET_ITEM(txn, i, items[i]); /* (a NULL item is allowed in a tuple being freed) */
    }
    if (failed) {
        Py_DECREF(txn);
        return NULL;
    }
    return txn;
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
    if (txn_type == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "take_whole_txns: no ScannedTxn class bound (bind_txn_type)");
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
    CopyReader *direct = Py_IS_TYPE(get_copy_data, &CopyReaderType) ? (CopyReader *)get_copy_data : NULL;
    void *conn = NULL;
    Held held = {NULL, NULL, 0, 0};
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
    if (direct != NULL && (conn = conn_of(direct)) == NULL)
        goto done;

    for (;;) {
        if (!in_txn && (frames >= max_frames || received >= stop_at))
            break;
        const unsigned char *p;
        Py_ssize_t n;
        if (direct != NULL) { /* libpq's buffer itself: held until its transaction is taken */
            char *raw = NULL;
            int got_n = pq_get_copy_data(conn, &raw, 1);
            if (got_n == -2) {
                copy_failed(direct, conn);
                goto done;
            }
            frames++;
            if (got_n <= 0 || raw == NULL) {
                PyObject *item = held_hand_back(&held, pending) < 0 ? NULL : copy_item(got_n, raw);
                if (item == NULL || PyList_Append(pending, item) < 0) {
                    Py_XDECREF(item);
                    goto done;
                }
                Py_DECREF(item);
                break;
            }
            if (held_push(&held, raw, got_n) < 0) {
                pq_freemem(raw);
                goto done;
            }
            p = (const unsigned char *)raw;
            n = got_n;
        } else {
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
            p = view.buf;
            n = view.len;
        }
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
                PyObject *txn = new_txn(begin_at, final_lsn, begin_time, xid, blob, run, commit_at, flags,
                                        commit_lsn, end_lsn, commit_time);
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
                held_free(&held);
                if (PyList_SetSlice(pending, 0, PyList_GET_SIZE(pending), NULL) < 0) {
                    goto done;
                }
            }
        }
        if (have_view) {
            PyBuffer_Release(&view);
            have_view = 0;
        }
        if (stop)
            break;
    }
    if (held_hand_back(&held, pending) == 0)
        out = result(txns, pending, received);

done:
    if (have_view)
        PyBuffer_Release(&view);
    held_free(&held);
    PyMem_Free(held.raw);
    PyMem_Free(held.len);
    PyMem_Free(buf.data);
    Py_XDECREF(lsns);
    Py_XDECREF(one);
    Py_XDECREF(txns);
    Py_XDECREF(pending);
    return out;
}

static PyMethodDef methods[] = {
    {"bind_libpq", bind_libpq, METH_O,
     "bind_libpq(version) -> None, or why the loaded libpq cannot be used (a str)\n\n"
     "Finds the one libpq the process loaded (psycopg's), of libpq version `version`, for CopyReader."},
    {"bind_txn_type", bind_txn_type, METH_O,
     "bind_txn_type(cls) -> None\n\n"
     "The class take_whole_txns makes each transaction of: csnd.reader.pgoutput.ScannedTxn."},
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
    if (PyType_Ready(&CopyReaderType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m != NULL && PyModule_AddType(m, &CopyReaderType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
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
