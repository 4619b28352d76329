"""A table's compiled row reader: the decoder's hot loop, built once per Relation message.

    Relation ──► row_reader(json_columns, binary_first)
                   ├─ `_rows.c` built:  partial(read_row_c, type codes, keys, quote, builders)
                   └─ else (or CSND_IMPL=python): `_compile_row_reader`, its Python twin

    read(data, pos, end) -> (row JSON, end of the tuple) | None

A reader takes a new tuple straight off the wire and writes the row's JSON
object in one straight run of code per column.  It checks only what keeps it
inside the data and gives up (None) at anything out of the ordinary -- a
column count other than the table's, an unchanged TOAST value, an unknown
kind, a length past `end`, a value its builder refuses -- leaving the row to
the fallbacks of `decoder.rows`, which name the problem.  This module builds
readers and nothing else: what a body around the row looks like, and what
happens when a reader gives up, is `decoder.rows`'s.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from functools import lru_cache, partial
from types import CodeType
from typing import Final

from csnd.core.compiled import compiled_module
from csnd.decoder import jsontext as J
from csnd.decoder.tuples import KIND_BINARY, KIND_NULL, KIND_TEXT

__all__ = ["RowReader", "one_change_line_c", "row_reader"]

unpack_i16: Final = struct.Struct("!h").unpack_from
unpack_i32: Final = struct.Struct("!i").unpack_from

# One column of a compiled row reader (`_compile_row_reader`), column {i}: its
# kind byte, then a value of the stream's form, of the other form, or NULL.
_READ_COLUMN: Final = """\
    kind = data[pos]
{first}{second}    elif kind == {null}:
        v{i} = "null"
        pos += 1
    else:
        return None
"""
# A length-prefixed value of one form, read into local v{i} by `build`.
_READ_VALUE: Final = """\
    {keyword} kind == {kind}:
        start = pos + 5
        pos = start + unpack_i32(data, pos + 1)[0]
        if pos > end or pos < start:
            return None
        v{i} = {build}
"""
_BUILDERS: Final = {
    KIND_BINARY: "binary{i}(data[start:pos])",
    KIND_TEXT: 'text{i}(data[start:pos].decode("utf-8"))',
}

RowReader = Callable[[bytes, int, int], "tuple[str, int] | None"]


def row_reader(columns: list[tuple[str, J.BinaryJson, J.TextJson]], binary_first: bool) -> RowReader:
    """A table's row reader: the compiled one (`_rows.c`), which writes the common types itself
    and any other column through its builders.

    When it was not built, or `CSND_IMPL=python` asks for the twins, the
    reader `_compile_row_reader` compiles in Python (the compiled one's
    specification: the same results, held so by tests).
    """
    compiled = _read_row_c
    if compiled is None:
        return _compile_row_reader(columns, binary_first)
    codes, builders = J.compiled_codes(columns)
    keys = tuple(key.encode() for key, _, _ in columns)
    return partial(compiled, codes, keys, J.quote, builders)


_compiled = compiled_module("csnd.decoder._rows")
_read_row_c: Callable[..., tuple[str, int] | None] | None = None if _compiled is None else _compiled.read_row
one_change_line_c: Callable[..., str | None] | None = None if _compiled is None else _compiled.one_change_line


def _compile_row_reader(columns: list[tuple[str, J.BinaryJson, J.TextJson]], binary_first: bool) -> RowReader:
    """`decoder.rows._row_wire` for one table, unrolled: `read(data, pos, end)` -> (row JSON, end) or None.

    The decoder's hot loop is one of these per row.  Compiled from the
    table's Relation message (as `collections.namedtuple` compiles its
    class), it reads column i into local `v{i}` with column i's builders
    bound as globals, and ends with one %-format of all the values -- no
    per-column tuple unpacking, list append or join; about a tenth less
    time per wide row than the loop.  Only the column index appears in the
    generated source; names and builders come in through the namespace.
    It gives up (None) on what `_row_wire` handles or rejects: a column
    count other than the table's, an unchanged TOAST value, an unknown
    kind, a length past `end`, a value its builder refuses.
    """
    namespace: dict[str, object] = {"unpack_i32": unpack_i32, "unpack_i16": unpack_i16}
    for i, (_, binary, text) in enumerate(columns):
        namespace[f"binary{i}"] = binary
        namespace[f"text{i}"] = text
    namespace["ROW"] = "{" + ", ".join(key.replace("%", "%%") + "%s" for key, _, _ in columns) + "}"
    exec(_row_reader_code(len(columns), binary_first), namespace)  # (see above)
    return namespace["read_row"]  # type: ignore[return-value]


@lru_cache(maxsize=64)
def _row_reader_code(n_columns: int, binary_first: bool) -> CodeType:
    """The code of `_compile_row_reader` for tables of `n_columns`: compiled once per width and form.

    (Compiling costs about a tenth of a millisecond a column, which every
    decoder would pay again for every Relation message of a wide table.)
    """
    first, second = (KIND_BINARY, KIND_TEXT) if binary_first else (KIND_TEXT, KIND_BINARY)
    lines = [
        "def read_row(data, pos, end):",
        "  try:",
        f"    if pos + 2 > end or unpack_i16(data, pos)[0] != {n_columns}:",
        "        return None",
        "    pos += 2",
    ]
    for i in range(n_columns):
        forms = [
            _READ_VALUE.format(keyword=keyword, kind=kind, i=i, build=_BUILDERS[kind].format(i=i))
            for keyword, kind in (("if", first), ("elif", second))
        ]
        lines.append(_READ_COLUMN.format(first=forms[0], second=forms[1], null=KIND_NULL, i=i).rstrip("\n"))
    values = "".join(f"v{i}, " for i in range(n_columns))
    lines += [
        "  except Exception:  # any failure: the checked path raises the precise error",
        "    return None",
        f"  return ROW % ({values}), pos",
    ]
    return compile("\n".join(lines), "<csnd row reader>", "exec")
