/*
 * csnd.decoder._rows: a table's row reader, compiled: the common column
 * types written here, any other through its Python builder.
 *
 * `read_row(codes, keys, quote, data, pos, end)` is the reader that
 * `rowreader._compile_row_reader` compiles in Python for the same table, which is
 * its specification and its twin: tests/decoder/test_rows_compiled.py holds
 * the two to the same result for any tuple data.  Keep them in step.  It
 * returns `(row JSON, end of the tuple)`, or None wherever the Python reader
 * gives up -- and it may also give up where that one would not (a value it
 * does not write itself, such as an integer in a form that is not
 * PostgreSQL's own): the caller then takes the checked path, which writes
 * the same text.
 *
 * `read_row(codes, keys, quote, builders, data, pos, end)`: `codes` has one
 * byte per column: 'h' int2, 'i' int4, 'q' int8, 'b' bool, 's' a string type
 * (text, varchar, bpchar, name: a JSON string of the UTF-8 value), 'N'
 * numeric (numeric_out's text, quoted), 'T' timestamptz (ISO 8601 in UTC,
 * quoted, for years 1-9999; its text form only at offset zero), 't'
 * timestamp (the same without the offset), 'd' date, 'u' uuid, 'x' bytea
 * (`\x` and lowercase hex), 'f' float8 (repr(); NaN and the infinities as
 * strings), 'F' float4 (its shortest decimal as float4out picks it, written
 * as repr() of that double; where the choice is not plain, the builder's),
 * 'C' time and 'V' interval (their text output, rendered from binary), 'a',
 * 'A' and 'L' arrays of int2, int4 and int8 (binary only: nested JSON
 * arrays; their text form through the builder), 'J' jsonb (jsonb_out's text as it is, checked only at its ends,
 * as the twin does), 'S' a type whose text form is its JSON string (its
 * binary value through the column's builder), and '?' any other type: both
 * forms through the column's builders.  `keys` holds each column's
 * `"name": ` as UTF-8 bytes, and `quote` is json.encoder.encode_basestring,
 * called for a string with a character that needs escaping (or that is not
 * ASCII), so the escapes are its own.  `builders` holds each column's
 * (binary builder, text builder) pair, the twin's own: a value the compiled
 * reader does not write itself is written by them, so that every table
 * takes this reader and only such values pay for a Python call.  A builder
 * that raises (an Exception) makes the reader give up, as the twin does.
 *
 * `one_change_line(node_key, commit_lsn, xid, commit_time, body)` is
 * csnd.core.lines.one_change_line (its twin) with the node's JSON key given:
 * the line of a lone node's transaction of one change, which a decoder
 * writes for every one-row transaction.  None when a part is not ASCII or
 * the commit time is outside years 1-9999; the twin then writes it, or
 * raises the error that names the time.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

#define KIND_NULL 'n'
#define KIND_TEXT 't'
#define KIND_BINARY 'b'

typedef struct {
    char *data;
    Py_ssize_t len, cap;
    /* Not NULL while a caller's loop runs with the GIL released (_copysplit's render_rows): every
       writer that touches a Python object or Python's allocator takes it back first (out_gil). */
    PyThreadState *released;
    /* Not NULL when data is this bytes object's own buffer (_copysplit's render_rows): grown and
       shrunk in place with _PyBytes_Resize, and handed out as the result with no copy at the end. */
    PyObject *bytes;
    char inline_[512];
} Out;

/* The GIL held again, where the caller had released it: before any Python API call. */
static inline void
out_gil(Out *o)
{
    if (o->released != NULL) {
        PyThreadState *state = o->released;
        o->released = NULL;
        PyEval_RestoreThread(state);
    }
}

static int
out_put(Out *o, const char *src, Py_ssize_t n)
{
    if (o->len + n > o->cap) {
        out_gil(o);
        Py_ssize_t cap = o->cap * 2;
        while (cap < o->len + n)
            cap *= 2;
        char *data;
        if (o->bytes != NULL) {
            if (_PyBytes_Resize(&o->bytes, cap) < 0) {
                /* (it freed the object and set MemoryError: nothing is left to free) */
                o->data = o->inline_;
                o->len = 0;
                o->cap = sizeof o->inline_;
                return -1;
            }
            data = PyBytes_AS_STRING(o->bytes);
        } else if (o->data == o->inline_) {
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
    if (o->bytes != NULL)
        Py_CLEAR(o->bytes);
    else if (o->data != o->inline_)
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
    out_gil(o);
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

/* The digits below write what printf's "%lld" and "%0Nd" write, without printf: its format
   parsing was a fifth of a snapshot's rendering (integers, numeric groups, timestamps). */

/* v's decimal digits at out (no NUL); their count (1-20). */
static int
put_u64_digits(char *out, uint64_t v)
{
    char tmp[20];
    int n = 0;
    do {
        tmp[n++] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    for (int i = 0; i < n; i++)
        out[i] = tmp[n - 1 - i];
    return n;
}

/* "%lld" of v at out (no NUL); its length (at most 20). */
static int
put_i64_digits(char *out, int64_t v)
{
    if (v < 0) {
        out[0] = '-';
        return 1 + put_u64_digits(out + 1, (uint64_t)0 - (uint64_t)v);
    }
    return put_u64_digits(out, (uint64_t)v);
}

/* "%0*u" of v (v < 10^width) at out: exactly `width` digits, no NUL. */
static void
put_fixed_digits(char *out, unsigned long long v, int width)
{
    for (int i = width - 1; i >= 0; i--) {
        out[i] = (char)('0' + v % 10);
        v /= 10;
    }
}

/* Days since 1970-01-01 -> (year, month, day): Howard Hinnant's civil_from_days. */
static void
civil_from_days(int64_t z, int64_t *y, unsigned *m, unsigned *d)
{
    z += 719468;
    const int64_t era = (z >= 0 ? z : z - 146096) / 146097;
    const unsigned doe = (unsigned)(z - era * 146097);
    const unsigned yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    const unsigned doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    const unsigned mp = (5 * doy + 2) / 153;
    *d = doy - (153 * mp + 2) / 5 + 1;
    *m = mp < 10 ? mp + 3 : mp - 9;
    *y = (int64_t)yoe + era * 400 + (*m <= 2);
}

#define PG_EPOCH_UNIX_S 946684800LL /* 2000-01-01 */
#define US 1000000LL

/* `pg_time_to_iso`: microseconds since 2000-01-01 UTC as datetime.isoformat() with +00:00; 0 if out of years 1-9999. */
static int
iso_time(long long us, char *out, size_t size)
{
    long long seconds = us / US, micros = us % US;
    if (micros < 0) { /* floor, as divmod */
        micros += US;
        seconds -= 1;
    }
    long long unix_s = seconds + PG_EPOCH_UNIX_S;
    long long days = unix_s / 86400, in_day = unix_s % 86400;
    if (in_day < 0) {
        in_day += 86400;
        days -= 1;
    }
    int64_t y;
    unsigned m, d;
    civil_from_days(days, &y, &m, &d);
    if (y < 1 || y > 9999)
        return 0;
    int hh = (int)(in_day / 3600), mm = (int)(in_day / 60 % 60), ss = (int)(in_day % 60);
    /* "%04d-%02u-%02uT%02d:%02d:%02d[.%06lld]+00:00", written digit by digit */
    int len = micros ? 32 : 25;
    if (size < (size_t)len + 1)
        return 0; /* (no caller gives less: each has room for the longest) */
    char *at = out;
    put_fixed_digits(at, (unsigned long long)y, 4);
    at[4] = '-';
    put_fixed_digits(at + 5, m, 2);
    at[7] = '-';
    put_fixed_digits(at + 8, d, 2);
    at[10] = 'T';
    put_fixed_digits(at + 11, (unsigned long long)hh, 2);
    at[13] = ':';
    put_fixed_digits(at + 14, (unsigned long long)mm, 2);
    at[16] = ':';
    put_fixed_digits(at + 17, (unsigned long long)ss, 2);
    at += 19;
    if (micros) {
        *at++ = '.';
        put_fixed_digits(at, (unsigned long long)micros, 6);
        at += 6;
    }
    memcpy(at, "+00:00", 7); /* (with its NUL, as snprintf wrote) */
    return len;
}

/* numeric_send's value as numeric_out writes it (what psycopg's Decimal prints): 1 written, 0 give up.
   Gives up on anything numeric_send does not make: a length that is not its digits', a digit of
   10000 or more, a non-zero digit past the display scale, an unknown sign. */
static int
put_numeric(Out *o, const unsigned char *p, Py_ssize_t n)
{
    if (n < 8)
        return 0;
    int ndigits = (p[0] << 8) | p[1];
    int weight = (int16_t)((p[2] << 8) | p[3]);
    unsigned sign = ((unsigned)p[4] << 8) | p[5];
    int dscale = (p[6] << 8) | p[7];
    if (n != 8 + 2 * (Py_ssize_t)ndigits)
        return 0;
    const char *special = sign == 0xC000 ? "\"NaN\"" : sign == 0xD000 ? "\"Infinity\"" : sign == 0xF000 ? "\"-Infinity\"" : NULL;
    if (special != NULL)
        return ndigits == 0 && out_put(o, special, (Py_ssize_t)strlen(special)) < 0 ? -1 : ndigits == 0;
    if ((sign != 0x0000 && sign != 0x4000) || dscale > 1000 || weight > 250 || weight < -250)
        return 0;
    int nonzero = 0;
    for (int i = 0; i < ndigits; i++) {
        int d = (p[8 + 2 * i] << 8) | p[9 + 2 * i];
        if (d >= 10000)
            return 0;
        nonzero |= d != 0;
        /* the digit group i stands for 10^(4 * (weight - i)): past the scale it must be zero there */
        int last_place = 4 * (weight - i); /* the exponent of its lowest decimal digit */
        if (d != 0 && last_place < -dscale) {
            int keep = last_place + 4 + dscale; /* its digits that lie within the scale, 0..3 */
            int drop = 4 - keep, div = 1;
            for (int k = 0; k < drop; k++)
                div *= 10;
            if (keep < 0 || d % div != 0)
                return 0;
        }
    }
    char buf[4200];
    Py_ssize_t len = 0;
    buf[len++] = '"';
    if (sign == 0x4000 && nonzero)
        buf[len++] = '-';
    /* the integer part: groups of weight .. 0 (the first without its leading zeros) */
    int wrote = 0;
    for (int g = 0; g <= weight; g++) {
        int i = g; /* group index for 10^(4 * (weight - g)) */
        int d = i < ndigits ? (p[8 + 2 * i] << 8) | p[9 + 2 * i] : 0;
        if (!wrote) {
            if (d == 0)
                continue;
            len += put_u64_digits(buf + len, (uint64_t)d);
            wrote = 1;
        } else {
            put_fixed_digits(buf + len, (unsigned long long)d, 4);
            len += 4;
        }
    }
    if (!wrote)
        buf[len++] = '0';
    if (dscale > 0) {
        buf[len++] = '.';
        /* the fraction's groups: index weight + 1 + k for 10^(-4 (k + 1)) */
        for (int k = 0, place = 0; place < dscale; k++) {
            int i = weight + 1 + k;
            int d = i >= 0 && i < ndigits ? (p[8 + 2 * i] << 8) | p[9 + 2 * i] : 0;
            char four[4];
            put_fixed_digits(four, (unsigned long long)d, 4);
            for (int c = 0; c < 4 && place < dscale; c++, place++)
                buf[len++] = four[c];
        }
    }
    buf[len++] = '"';
    return out_put(o, buf, len) < 0 ? -1 : 1;
}

/* The JSON literal that starts with `first`, if any: a jsonb text starting so must be all of it. */
static const char *
json_word(unsigned char first)
{
    return first == 't' ? "true" : first == 'f' ? "false" : first == 'n' ? "null" : NULL;
}

/* jsonb_out's text (a binary value: after its version byte 1) as `_jsonb_text` takes it: checked
   only at its two ends (a literal whole), as UTF-8.  1 written, 0 give up. */
static int
put_jsonb(Out *o, const unsigned char *p, Py_ssize_t n)
{
    if (n < 1)
        return 0;
    unsigned char first = p[0], last = p[n - 1];
    char close = first == '{' ? '}' : first == '[' ? ']' : first == '"' ? '"' : 0;
    const char *word = json_word(first);
    int digit_ends = (first == '-' || (first >= '0' && first <= '9')) && last >= '0' && last <= '9';
    int whole_word = word != NULL && (size_t)n == strlen(word) && memcmp(p, word, (size_t)n) == 0;
    if (!((close && last == (unsigned char)close && n > 1) || whole_word || digit_ends))
        return 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (p[i] >= 0x80) { /* not ASCII: it must be UTF-8, as the text the twin decodes */
            out_gil(o);
            PyObject *text = PyUnicode_DecodeUTF8((const char *)p, n, "strict");
            if (text == NULL) {
                if (!PyErr_ExceptionMatches(PyExc_UnicodeDecodeError))
                    return -1;
                PyErr_Clear();
                return 0;
            }
            Py_DECREF(text);
            break;
        }
    }
    return out_put(o, (const char *)p, n) < 0 ? -1 : 1;
}

/* A builder's result (a str) written as UTF-8: 1 written, 0 give up (it raised an Exception), -1 error. */
static int
put_built(Out *o, PyObject *built)
{
    if (built == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_Exception))
            return -1; /* (KeyboardInterrupt and the like travel) */
        PyErr_Clear(); /* the twin gives up on any failure too */
        return 0;
    }
    if (!PyUnicode_Check(built)) {
        Py_DECREF(built);
        PyErr_SetString(PyExc_TypeError, "read_row: a builder must return a str");
        return -1;
    }
    Py_ssize_t size;
    const char *utf8 = PyUnicode_AsUTF8AndSize(built, &size);
    int r = utf8 == NULL ? 0 : out_put(o, utf8, size) < 0 ? -1 : 1;
    if (utf8 == NULL) /* (a lone surrogate: the checked path writes it) */
        PyErr_Clear();
    Py_DECREF(built);
    return r;
}

/* The value through the column's builder of its form (`pair`: binary, text): as put_built. */
static int
put_by_builder(Out *o, PyObject *pair, int kind, const unsigned char *p, Py_ssize_t n)
{
    out_gil(o);
    if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2) {
        PyErr_SetString(PyExc_TypeError, "read_row: each builder entry must be a (binary, text) pair");
        return -1;
    }
    PyObject *arg = kind == KIND_BINARY ? PyBytes_FromStringAndSize((const char *)p, n)
                                        : PyUnicode_DecodeUTF8((const char *)p, n, "strict");
    if (arg == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_UnicodeDecodeError))
            return -1;
        PyErr_Clear(); /* not UTF-8: the twin's decode fails the same way */
        return 0;
    }
    PyObject *built = PyObject_CallOneArg(PyTuple_GET_ITEM(pair, kind == KIND_BINARY ? 0 : 1), arg);
    Py_DECREF(arg);
    return put_built(o, built);
}

static const char HEX[] = "0123456789abcdef";

/* uuid_send's 16 bytes as uuid_out's text, quoted. */
static int
put_uuid(Out *o, const unsigned char *p, Py_ssize_t n)
{
    if (n != 16)
        return 0;
    char buf[40];
    int len = 0;
    buf[len++] = '"';
    for (int i = 0; i < 16; i++) {
        if (i == 4 || i == 6 || i == 8 || i == 10)
            buf[len++] = '-';
        buf[len++] = HEX[p[i] >> 4];
        buf[len++] = HEX[p[i] & 15];
    }
    buf[len++] = '"';
    return out_put(o, buf, len) < 0 ? -1 : 1;
}

/* bytea: `"\\x` + lowercase hex + `"` (the JSON of `\x...`); its text form only as byteaout's hex. */
static int
put_bytea(Out *o, int kind, const unsigned char *p, Py_ssize_t n)
{
    if (kind == KIND_TEXT) {
        if (n < 2 || p[0] != '\\' || p[1] != 'x' || n % 2)
            return 0;
        for (Py_ssize_t i = 2; i < n; i++)
            if (!((p[i] >= '0' && p[i] <= '9') || (p[i] >= 'a' && p[i] <= 'f')))
                return 0;
        if (out_put(o, "\"\\\\", 3) < 0 || out_put(o, (const char *)p + 1, n - 1) < 0 || out_put(o, "\"", 1) < 0)
            return -1;
        return 1;
    }
    if (out_put(o, "\"\\\\x", 4) < 0)
        return -1;
    char buf[256];
    Py_ssize_t i = 0;
    while (i < n) {
        int len = 0;
        for (; i < n && len < (int)sizeof buf; i++) {
            buf[len++] = HEX[p[i] >> 4];
            buf[len++] = HEX[p[i] & 15];
        }
        if (out_put(o, buf, len) < 0)
            return -1;
    }
    return out_put(o, "\"", 1) < 0 ? -1 : 1;
}

/* A double as repr() writes it. */
static int
put_repr(Out *o, double x)
{
    out_gil(o);
    char *r = PyOS_double_to_string(x, 'r', 0, Py_DTSF_ADD_DOT_0, NULL);
    if (r == NULL)
        return -1;
    int w = out_put(o, r, (Py_ssize_t)strlen(r));
    PyMem_Free(r);
    return w < 0 ? -1 : 1;
}

/* NaN or an infinity as the JSON strings the twins write: 1 written, -1 error. */
static int
put_nonfinite(Out *o, double x)
{
    if (isnan(x))
        return out_put(o, "\"NaN\"", 5) < 0 ? -1 : 1;
    return out_put(o, x > 0 ? "\"Infinity\"" : "\"-Infinity\"", x > 0 ? 10 : 11) < 0 ? -1 : 1;
}

/* What float_text found: a plain finite number, now in *x, for its caller to write. */
#define FLOAT_NUMBER 2

/* The text form of a float4 or float8 (float4out's, float8out's), shared by both: NaN and the
   infinities are written here (1); a value that is plainly a finite decimal number is read into
   *x (FLOAT_NUMBER); anything else is left to the twin (0), which reads it its own way. */
static int
float_text(Out *o, const unsigned char *p, Py_ssize_t n, double *x)
{
    if (n == 3 && memcmp(p, "NaN", 3) == 0)
        return out_put(o, "\"NaN\"", 5) < 0 ? -1 : 1;
    if (n == 8 && memcmp(p, "Infinity", 8) == 0)
        return out_put(o, "\"Infinity\"", 10) < 0 ? -1 : 1;
    if (n == 9 && memcmp(p, "-Infinity", 9) == 0)
        return out_put(o, "\"-Infinity\"", 11) < 0 ? -1 : 1;
    char text[64];
    if (n == 0 || n >= (Py_ssize_t)sizeof text)
        return 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        unsigned char c = p[i];
        if (!((c >= '0' && c <= '9') || c == '.' || c == 'e' || c == 'E' || c == '-' || c == '+'))
            return 0;
    }
    memcpy(text, p, (size_t)n);
    text[n] = 0;
    char *end;
    out_gil(o);
    double v = PyOS_string_to_double(text, &end, NULL);
    if (v == -1.0 && PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    if (end != text + n || !isfinite(v))
        return 0;
    *x = v;
    return FLOAT_NUMBER;
}

/* float8: repr() of the double (Python's shortest round trip), NaN and the infinities as strings.
   Its text form (float8out's) is read back first, only when it is plainly a number. */
static int
put_float8(Out *o, int kind, const unsigned char *p, Py_ssize_t n)
{
    double x;
    if (kind == KIND_BINARY) {
        if (n != 8)
            return 0;
        uint64_t bits = (uint64_t)be_signed(p, 8);
        memcpy(&x, &bits, sizeof x);
        if (!isfinite(x))
            return put_nonfinite(o, x);
        return put_repr(o, x);
    }
    int r = float_text(o, p, n, &x);
    return r == FLOAT_NUMBER ? put_repr(o, x) : r;
}

/* The decimal float4out prints for positive finite `a` (values.float4_shortest, the twin, says
   how it is chosen): the fewest significant digits strictly inside a's rounding interval, the
   nearest of them.  At each length the correctly rounded decimal is the nearest; when it lies
   inside it is the one.  Gives up (0) wherever the twin might choose otherwise: a candidate on a
   bound as far as a double can tell, or only a neighbour of the rounded decimal inside.  1: *out
   is the double of the chosen decimal. */
static int
float4_shortest(float a, double *out)
{
    uint32_t bits, b;
    memcpy(&bits, &a, 4);
    float below_f, above_f;
    b = bits - 1;
    memcpy(&below_f, &b, 4);
    double x = a, below = below_f, above;
    if (bits == 0x7F7FFFFF) {
        above = x + (x - below);
    } else {
        b = bits + 1;
        memcpy(&above_f, &b, 4);
        above = above_f;
    }
    double lo = (x + below) / 2, hi = (x + above) / 2; /* (exact: float4 values in a double) */
    for (int p = 0; p < 9; p++) {
        char buf[64];
        snprintf(buf, sizeof buf, "%.*e", p, x);
        char *e = strchr(buf, 'e');
        if (e == NULL)
            return 0;
        int exp = atoi(e + 1);
        long long rounded = 0;
        for (char *c = buf; c < e; c++)
            if (*c >= '0' && *c <= '9')
                rounded = rounded * 10 + (*c - '0');
        int inside[3];
        double value[3];
        for (int k = 0; k < 3; k++) {
            char dec[64];
            snprintf(dec, sizeof dec, "%llde%d", rounded - 1 + k, exp - p);
            value[k] = PyOS_string_to_double(dec, NULL, NULL);
            if (value[k] == -1.0 && PyErr_Occurred()) {
                PyErr_Clear();
                return 0;
            }
            if (value[k] == lo || value[k] == hi)
                return 0; /* (on a bound as far as a double tells: the twin decides exactly) */
            inside[k] = lo < value[k] && value[k] < hi;
        }
        if (inside[1]) {
            *out = value[1];
            return 1;
        }
        if (inside[0] || inside[2])
            return 0;
    }
    return 0;
}

/* float4: as the twin: a binary value through float4_shortest, then repr() of that double; its
   text form read as a double (repr() of it), refused beyond float4's range. */
static int
put_float4(Out *o, int kind, const unsigned char *p, Py_ssize_t n)
{
    if (kind == KIND_TEXT) {
        double x;
        int r = float_text(o, p, n, &x);
        if (r != FLOAT_NUMBER)
            return r;
        if (fabs(x) >= 3.4028235e38)
            return 0; /* (at the edge of float4's range: the twin's pack decides) */
        return put_repr(o, x);
    }
    if (n != 4)
        return 0;
    uint32_t bits = (uint32_t)be_signed(p, 4);
    float f;
    memcpy(&f, &bits, 4);
    if (!isfinite(f))
        return put_nonfinite(o, f);
    double x = f; /* (0 and -0 as they are) */
    if (f != 0) {
        out_gil(o); /* (float4_shortest reads decimals with PyOS_string_to_double) */
        if (!float4_shortest(fabsf(f), &x))
            return 0;
        if (f < 0)
            x = -x;
    }
    return put_repr(o, x);
}

/* HH:MM:SS[.ffffff] with the fraction's trailing zeros dropped (AppendSeconds), hours as wide as
   they come; `us` >= 0.  Returns its length in buf. */
static int
clock_text(long long us, char *buf, size_t size)
{
    long long hours = us / 3600000000LL, rest = us % 3600000000LL;
    int minutes = (int)(rest / 60000000LL), seconds = (int)(rest / 1000000LL % 60), micros = (int)(rest % 1000000LL);
    int len = snprintf(buf, size, "%02lld:%02d:%02d", hours, minutes, seconds);
    if (micros) {
        char frac[8];
        snprintf(frac, sizeof frac, "%06d", micros);
        int keep = 6;
        while (frac[keep - 1] == '0')
            keep--;
        len += snprintf(buf + len, size - (size_t)len, ".%.*s", keep, frac);
    }
    return len;
}

/* time_send's microseconds as time_out's text, quoted. */
static int
put_time(Out *o, const unsigned char *p, Py_ssize_t n)
{
    if (n != 8)
        return 0;
    int64_t us = be_signed(p, 8);
    if (us < 0 || us > 86400000000LL)
        return 0;
    char buf[48];
    buf[0] = '"';
    int len = clock_text((long long)us, buf + 1, sizeof buf - 2);
    buf[len + 1] = '"';
    return out_put(o, buf, len + 2) < 0 ? -1 : 1;
}

/* interval_send (microseconds, days, months) as EncodeInterval's text in IntervalStyle postgres,
   quoted: `1 year 2 mons -3 days +04:05:06.7`, as temporal.interval_binary writes it. */
static int
put_interval(Out *o, const unsigned char *p, Py_ssize_t n)
{
    if (n != 16)
        return 0;
    int64_t us = be_signed(p, 8);
    long long days = (long long)be_signed(p + 8, 4), months = (long long)be_signed(p + 12, 4);
    if (us == INT64_MIN)
        return 0;
    long long years = months / 12; /* (C division truncates toward zero, as interval2itm) */
    long long values[3] = {years, months - years * 12, days};
    static const char *units[3] = {"year", "mon", "day"};
    char buf[160];
    int len = 0, is_zero = 1, is_before = 0;
    buf[len++] = '"';
    for (int i = 0; i < 3; i++) {
        long long v = values[i];
        if (!v)
            continue;
        len += snprintf(buf + len, sizeof buf - (size_t)len, "%s%s%lld %s%s", is_zero ? "" : " ",
                        is_before && v > 0 ? "+" : "", v, units[i], v == 1 ? "" : "s");
        is_before = v < 0;
        is_zero = 0;
    }
    if (is_zero || us) {
        if (!is_zero)
            buf[len++] = ' ';
        if (us < 0)
            buf[len++] = '-';
        else if (is_before)
            buf[len++] = '+';
        len += clock_text((long long)(us < 0 ? -us : us), buf + len, sizeof buf - (size_t)len - 1);
    }
    buf[len++] = '"';
    return out_put(o, buf, len) < 0 ? -1 : 1;
}

/* array_send of int2 / int4 / int8 elements (`size` bytes, element type `elem_oid`) as nested JSON
   arrays, `null` for a NULL element; gives up on anything the twin would not write alike. */
static int
put_int_array(Out *o, const unsigned char *p, Py_ssize_t n, int size, uint32_t elem_oid)
{
    if (n < 12)
        return 0;
    int64_t ndim = be_signed(p, 4);
    if ((uint32_t)be_signed(p + 8, 4) != elem_oid)
        return 0;
    if (ndim == 0)
        return n == 12 ? (out_put(o, "[]", 2) < 0 ? -1 : 1) : 0;
    if (ndim < 1 || ndim > 6 || n < 12 + 8 * ndim)
        return 0;
    int64_t dims[6], count = 1;
    for (int d = 0; d < ndim; d++) {
        dims[d] = be_signed(p + 12 + 8 * d, 4);
        if (dims[d] <= 0 || dims[d] > 100000000)
            return 0;
        count *= dims[d];
        if (count > 100000000)
            return 0;
    }
    Py_ssize_t pos = 12 + 8 * (Py_ssize_t)ndim;
    char digits[32];
    for (int d = 0; d < ndim; d++)
        if (out_put(o, "[", 1) < 0)
            return -1;
    for (int64_t i = 0; i < count; i++) {
        if (i > 0) {
            /* close and reopen the dimensions this element starts anew */
            int64_t span = 1;
            int closes = 0;
            for (int d = (int)ndim - 1; d > 0; d--) {
                span *= dims[d];
                if (i % span == 0)
                    closes++;
                else
                    break;
            }
            for (int c = 0; c < closes; c++)
                if (out_put(o, "]", 1) < 0)
                    return -1;
            if (out_put(o, ", ", 2) < 0)
                return -1;
            for (int c = 0; c < closes; c++)
                if (out_put(o, "[", 1) < 0)
                    return -1;
        }
        if (pos + 4 > n)
            return 0;
        int32_t len = (int32_t)be_signed(p + pos, 4);
        pos += 4;
        if (len < 0) {
            if (out_put(o, "null", 4) < 0)
                return -1;
            continue;
        }
        if (len != size || pos + len > n)
            return 0;
        int w = put_i64_digits(digits, be_signed(p + pos, size));
        pos += len;
        if (out_put(o, digits, w) < 0)
            return -1;
    }
    if (pos != n)
        return 0;
    for (int d = 0; d < ndim; d++)
        if (out_put(o, "]", 1) < 0)
            return -1;
    return 1;
}

static int
is_digits(const unsigned char *p, Py_ssize_t n)
{
    for (Py_ssize_t i = 0; i < n; i++)
        if (p[i] < '0' || p[i] > '9')
            return 0;
    return 1;
}

/* date: binary days from 2000 as `"YYYY-MM-DD"` for years 0-9999 and the infinities; the text form
   as it is when it is `YYYY-MM-DD` or an infinity (the twin's own shortcut). */
static int
put_date(Out *o, PyObject *quote, int kind, const unsigned char *p, Py_ssize_t n)
{
    if (kind == KIND_TEXT) {
        if ((n == 10 && p[4] == '-' && p[7] == '-') || (n == 8 && memcmp(p, "infinity", 8) == 0) ||
            (n == 9 && memcmp(p, "-infinity", 9) == 0))
            return put_string(o, quote, p, n);
        return 0;
    }
    if (n != 4)
        return 0;
    int64_t days = be_signed(p, 4);
    if (days == INT32_MAX)
        return out_put(o, "\"infinity\"", 10) < 0 ? -1 : 1;
    if (days == INT32_MIN)
        return out_put(o, "\"-infinity\"", 11) < 0 ? -1 : 1;
    int64_t y;
    unsigned m, d;
    civil_from_days(days + 10957, &y, &m, &d);
    if (y < 0 || y > 9999)
        return 0;
    char buf[32];
    int len = snprintf(buf, sizeof buf, "\"%04d-%02u-%02u\"", (int)y, m % 100, d % 100);
    return out_put(o, buf, len) < 0 ? -1 : 1;
}

/* timestamp(tz) text in DateStyle ISO, the twin's common case: `YYYY-MM-DD HH:MM:SS[.f{1,6}]`, then
   for timestamptz an offset of zero (`+00`, `-00`, `+00:00`, `+00:00:00`); written as isoformat(). */
static int
put_timestamp_text(Out *o, int utc, const unsigned char *p, Py_ssize_t n)
{
    if (n < 19 || !is_digits(p, 4) || p[4] != '-' || !is_digits(p + 5, 2) || p[7] != '-' || !is_digits(p + 8, 2) ||
        p[10] != ' ' || !is_digits(p + 11, 2) || p[13] != ':' || !is_digits(p + 14, 2) || p[16] != ':' ||
        !is_digits(p + 17, 2))
        return 0;
    Py_ssize_t i = 19, frac_at = 0, frac_len = 0;
    if (i < n && p[i] == '.') {
        frac_at = ++i;
        while (i < n && p[i] >= '0' && p[i] <= '9')
            i++;
        frac_len = i - frac_at;
        if (frac_len < 1 || frac_len > 6)
            return 0;
    }
    if (utc) {
        if (i + 3 > n || (p[i] != '+' && p[i] != '-') || p[i + 1] != '0' || p[i + 2] != '0')
            return 0;
        i += 3;
        for (int group = 0; group < 2 && i < n; group++) {
            if (i + 3 > n || p[i] != ':' || p[i + 1] != '0' || p[i + 2] != '0')
                return 0;
            i += 3;
        }
    }
    if (i != n)
        return 0;
    char buf[48];
    int len = 0;
    buf[len++] = '"';
    memcpy(buf + len, p, 10);
    len += 10;
    buf[len++] = 'T';
    memcpy(buf + len, p + 11, 8);
    len += 8;
    if (frac_len) {
        buf[len++] = '.';
        for (Py_ssize_t k = 0; k < 6; k++)
            buf[len++] = k < frac_len ? (char)p[frac_at + k] : '0';
    }
    if (utc) {
        memcpy(buf + len, "+00:00", 6);
        len += 6;
    }
    buf[len++] = '"';
    return out_put(o, buf, len) < 0 ? -1 : 1;
}

/* timestamp(tz) binary: microseconds from 2000 as isoformat() in years 1-9999, or an infinity. */
static int
put_timestamp_binary(Out *o, int utc, const unsigned char *p, Py_ssize_t n)
{
    if (n != 8)
        return 0;
    int64_t us = be_signed(p, 8);
    if (us == INT64_MAX)
        return out_put(o, "\"infinity\"", 10) < 0 ? -1 : 1;
    if (us == INT64_MIN)
        return out_put(o, "\"-infinity\"", 11) < 0 ? -1 : 1;
    char digits[48];
    digits[0] = '"';
    int len = iso_time((long long)us, digits + 1, sizeof digits - 2);
    if (len <= 0)
        return 0;
    if (!utc)
        len -= 6; /* (without its "+00:00") */
    digits[len + 1] = '"';
    return out_put(o, digits, len + 2) < 0 ? -1 : 1;
}

/* One value of column code `code`, of form `kind`, at p[0:n]: 1 written, 0 give up, -1 error. */
static int
put_value(Out *o, PyObject *quote, PyObject *pair, char code, int kind, const unsigned char *p, Py_ssize_t n)
{
    char digits[48];
    switch (code) {
    case '?':
        return put_by_builder(o, pair, kind, p, n);
    case 'S':
        return kind == KIND_TEXT ? put_string(o, quote, p, n) : put_by_builder(o, pair, kind, p, n);
    case 'u':
        return kind == KIND_TEXT ? put_string(o, quote, p, n) : put_uuid(o, p, n);
    case 'x':
        return put_bytea(o, kind, p, n);
    case 'f':
        return put_float8(o, kind, p, n);
    case 'F':
        return put_float4(o, kind, p, n);
    case 'C':
        return kind == KIND_TEXT ? put_string(o, quote, p, n) : put_time(o, p, n);
    case 'V':
        return kind == KIND_TEXT ? put_string(o, quote, p, n) : put_interval(o, p, n);
    case 'a':
    case 'A':
    case 'L':
        if (kind == KIND_TEXT)
            return put_by_builder(o, pair, kind, p, n);
        return code == 'a' ? put_int_array(o, p, n, 2, 21)
             : code == 'A' ? put_int_array(o, p, n, 4, 23)
                           : put_int_array(o, p, n, 8, 20);
    case 'd':
        return put_date(o, quote, kind, p, n);
    case 't':
    case 'T':
        if (kind == KIND_TEXT) {
            if ((n == 8 && memcmp(p, "infinity", 8) == 0) || (n == 9 && memcmp(p, "-infinity", 9) == 0))
                return put_string(o, quote, p, n);
            return put_timestamp_text(o, code == 'T', p, n);
        }
        return put_timestamp_binary(o, code == 'T', p, n);
    }
    if (code == 's' || (code == 'N' && kind == KIND_TEXT)) /* (numeric's text form: numeric_out's, quoted) */
        return put_string(o, quote, p, n);
    if (code == 'N')
        return put_numeric(o, p, n);
    if (code == 'J') {
        if (kind == KIND_BINARY && (n < 1 || p[0] != 1))
            return 0; /* (jsonb_send: version 1, then jsonb_out's text) */
        return kind == KIND_BINARY ? put_jsonb(o, p + 1, n - 1) : put_jsonb(o, p, n);
    }
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
    int len = put_i64_digits(digits, be_signed(p, size));
    return out_put(o, digits, len) < 0 ? -1 : 1;
}

/* A table's compiled row reader, as read_row and _copysplit's render_rows take it: `codes`
   bytes, one type code a column; `keys` and `builders` tuples of as many entries, the keys
   bytes.  0, or -1 with a TypeError naming `fn`. */
static int
check_reader_args(PyObject *codes, PyObject *keys, PyObject *builders, const char *fn)
{
    if (!PyBytes_Check(codes) || !PyTuple_Check(keys) || PyTuple_GET_SIZE(keys) != PyBytes_GET_SIZE(codes) ||
        !PyTuple_Check(builders) || PyTuple_GET_SIZE(builders) != PyBytes_GET_SIZE(codes)) {
        PyErr_Format(PyExc_TypeError,
                     "%s: codes must be bytes, and keys and builders tuples of as many entries", fn);
        return -1;
    }
    return 0;
}

static PyObject *
read_row(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 7) {
        PyErr_Format(PyExc_TypeError, "read_row takes 7 arguments (%zd given)", nargs);
        return NULL;
    }
    PyObject *codes = args[0], *keys = args[1], *quote = args[2], *builders = args[3], *data = args[4];
    if (check_reader_args(codes, keys, builders, "read_row") < 0)
        return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(data, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    Py_ssize_t pos = PyLong_AsSsize_t(args[5]);
    Py_ssize_t end = pos == -1 && PyErr_Occurred() ? -1 : PyLong_AsSsize_t(args[6]);
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
    o.released = NULL;
    o.bytes = NULL;
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
        int r = put_value(&o, quote, PyTuple_GET_ITEM(builders, i), code[i], kind, buf + start, length);
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

static PyObject *
one_change_line(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 5) {
        PyErr_Format(PyExc_TypeError, "one_change_line takes 5 arguments (%zd given)", nargs);
        return NULL;
    }
    PyObject *key = args[0], *body = args[4];
    if (!PyUnicode_Check(key) || !PyUnicode_Check(body)) {
        PyErr_SetString(PyExc_TypeError, "one_change_line: the node key and the body must be str");
        return NULL;
    }
    unsigned long long lsn = PyLong_AsUnsignedLongLong(args[1]);
    if (lsn == (unsigned long long)-1 && PyErr_Occurred()) {
        if (!PyErr_ExceptionMatches(PyExc_OverflowError))
            return NULL;
        PyErr_Clear(); /* (no LSN: the twin writes whatever it is) */
        Py_RETURN_NONE;
    }
    int overflow, time_overflow;
    long long xid = PyLong_AsLongLongAndOverflow(args[2], &overflow);
    if (xid == -1 && PyErr_Occurred())
        return NULL;
    long long commit_time = PyLong_AsLongLongAndOverflow(args[3], &time_overflow);
    if (commit_time == -1 && PyErr_Occurred())
        return NULL;
    char when[48];
    if (overflow || time_overflow || commit_time > 9223372036854775807LL - US || commit_time < -9223372036854775807LL + US ||
        !PyUnicode_IS_ASCII(key) || !PyUnicode_IS_ASCII(body) || !iso_time(commit_time, when, sizeof when))
        Py_RETURN_NONE; /* the twin writes it, or names the bad time */
    char head[256];
    int head_len = snprintf(head, sizeof head, "{\"csn\": %llu, \"gid\": null, \"commit_time\": \"%s\", \"nodes\": {",
                            lsn, when);
    char mid[160];
    int mid_len = snprintf(mid, sizeof mid, ": {\"xid\": %lld, \"commit_lsn\": \"%llX/%llX\"}}, \"changes\": [{\"node\": ",
                           xid, lsn >> 32, lsn & 0xFFFFFFFFull);
    static const char cid[] = ", \"cid\": 0, ";
    static const char tail[] = "}]}";
    Py_ssize_t key_len = PyUnicode_GET_LENGTH(key), body_len = PyUnicode_GET_LENGTH(body);
    Py_ssize_t total = head_len + key_len + mid_len + key_len + (Py_ssize_t)(sizeof cid - 1) + body_len +
                       (Py_ssize_t)(sizeof tail - 1);
    PyObject *line = PyUnicode_New(total, 127);
    if (line == NULL)
        return NULL;
    char *at = (char *)PyUnicode_DATA(line);
    memcpy(at, head, (size_t)head_len);
    at += head_len;
    memcpy(at, PyUnicode_DATA(key), (size_t)key_len);
    at += key_len;
    memcpy(at, mid, (size_t)mid_len);
    at += mid_len;
    memcpy(at, PyUnicode_DATA(key), (size_t)key_len);
    at += key_len;
    memcpy(at, cid, sizeof cid - 1);
    at += sizeof cid - 1;
    memcpy(at, PyUnicode_DATA(body), (size_t)body_len);
    at += body_len;
    memcpy(at, tail, sizeof tail - 1);
    return line;
}

static PyMethodDef methods[] = {
    {"read_row", (PyCFunction)(void (*)(void))read_row, METH_FASTCALL,
     "read_row(codes, keys, quote, builders, data, pos, end) -> (row JSON, end of the tuple) or None\n\n"
     "A table's compiled row reader (see rowreader._compile_row_reader, its twin)."},
    {"one_change_line", (PyCFunction)(void (*)(void))one_change_line, METH_FASTCALL,
     "one_change_line(node_key, commit_lsn, xid, commit_time, body) -> str or None\n\n"
     "csnd.core.lines.one_change_line with the node's JSON key given; None: let the twin write it."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "csnd.decoder._rows",
    "A table's row reader and a one-change line, compiled (twins in Python).", -1,
    methods,
};

PyMODINIT_FUNC
PyInit__rows(void)
{
    return PyModule_Create(&module);
}
