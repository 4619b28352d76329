"""A transaction line read in pieces: its head, then each change, then its tail (pure: no I/O).

A large transaction's line (docs/design.md section 5, "Large transactions")
comes from the changelog in pieces; a table filter or a format conversion
needs its changes one at a time, not the whole line:

    pieces ─► UTF-8 decoder ─► text buffer ─► head  `{"csn": 7, ..., "changes": [`
                                          ├─► each change, parsed (json's own C scanner)
                                          └─► tail  `]}`

The buffer holds what is not yet consumed: about one change and a piece.
A value is parsed when the buffer may hold it whole; one cut short by the
buffer's end is tried again only once the buffer has doubled, so a change
larger than a piece is parsed a few times, not once per piece.  Whitespace
and key order are anything JSON allows; the head is everything up to and
including the `[` of `"changes"`, the tail everything from its `]`.
"""

from __future__ import annotations

import codecs
import json
from collections.abc import Iterable, Iterator
from typing import Any, Final

_scan: Final = json.JSONDecoder().raw_decode
_SPACE: Final = " \t\n\r"
# A parse error this close to the buffer's end may be the buffer's end (a
# literal or escape cut short): read on before calling the line malformed.
_NEAR_END: Final = 16


def _bad(why: str) -> ValueError:
    return ValueError(f"not a transaction line: {why}")


class LineScanner:
    """Reads one transaction line from `pieces`: `head()`, then `changes()`, then `tail()`, in that order.

    ValueError (naming what is wrong) for anything that is not a
    transaction line: not UTF-8, not JSON, no `changes` array of objects.
    """

    __slots__ = ("_buf", "_pos", "_pieces", "_decode", "_eof", "_hold", "_head")

    def __init__(self, pieces: Iterable[bytes]) -> None:
        self._pieces = iter(pieces)
        self._decode = codecs.getincrementaldecoder("utf-8")().decode
        self._buf = ""
        self._pos = 0
        self._eof = False
        self._hold = True  # (the head is kept whole: it is handed out as text)
        self._head = ""

    def _more(self) -> bool:
        """Appends the next piece (dropping what was consumed, unless held); False at the end."""
        if self._eof:
            return False
        piece = next(self._pieces, None)
        try:
            text = self._decode(b"" if piece is None else piece, final=piece is None)
        except UnicodeDecodeError as e:
            raise _bad(f"not UTF-8 ({e.reason})") from None
        self._eof = piece is None
        if self._hold:
            self._buf += text
        else:
            self._buf = self._buf[self._pos :] + text
            self._pos = 0
        return not self._eof or bool(text)

    def _char(self) -> str:
        """The next character that is not whitespace, not consumed ('' at the end)."""
        while True:
            buf, i, n = self._buf, self._pos, len(self._buf)
            while i < n and buf[i] in _SPACE:
                i += 1
            self._pos = i
            if i < n:
                return buf[i]
            if not self._more():
                return ""

    def _value(self) -> tuple[Any, str]:
        """The JSON value next (after whitespace) and its text, consumed."""
        if not self._char():
            raise _bad("it ends inside its object")
        while True:
            buf, i = self._buf, self._pos
            try:
                obj, end = _scan(buf, i)
                # (a number or literal at the buffer's end may go on in the next piece)
                if end < len(buf) or self._eof:
                    self._pos = end
                    return obj, buf[i:end]
            except json.JSONDecodeError as e:
                cut_short = e.msg.startswith("Unterminated string") or e.pos >= len(buf) - _NEAR_END
                if self._eof or not cut_short:
                    raise _bad(f"{e.msg} at character {e.pos - i} of a value") from None
            left = len(buf) - i
            while len(self._buf) - self._pos <= 2 * left and self._more():
                pass

    def _expect(self, char: str, where: str) -> None:
        got = self._char()
        if got != char:
            raise _bad(f"{where}: expected {char!r}, found {got or 'the end'!r}")
        self._pos += 1

    def head(self) -> tuple[str, dict[str, Any]]:
        """The text up to and including `"changes": [`, and the keys before it as an object."""
        self._expect("{", "its start")
        while True:
            if self._char() == "}":
                raise _bad("it has no changes array")
            key, _ = self._value()
            if not isinstance(key, str):
                raise _bad("a key is not a string")
            self._expect(":", f"after key {key!r}")
            if key == "changes":
                self._expect("[", "changes")
                break
            self._value()
            if self._char() != "}":
                self._expect(",", f"after the value of {key!r}")
        self._head = self._buf[: self._pos]
        self._hold = False
        try:
            obj = json.loads(self._head + "]}")
        except ValueError as e:
            raise _bad(str(e)) from None
        obj.pop("changes", None)
        return self._head, obj

    def changes(self) -> Iterator[tuple[str, dict[str, Any]]]:
        """Each change: its text and the object it holds."""
        if self._char() == "]":
            return
        while True:
            obj, text = self._value()
            if not isinstance(obj, dict):
                raise _bad("a change is not an object")
            yield text, obj
            if self._char() == "]":
                return
            self._expect(",", "between changes")

    def tail(self) -> str:
        """The text from the `]` that closes the changes to the end (checked to close the object)."""
        while self._more():
            pass
        tail = self._buf[self._pos :]
        try:
            obj = json.loads(self._head + tail)
        except ValueError as e:
            raise _bad(f"after its changes: {e}") from None
        if not isinstance(obj, dict):
            raise _bad("not a JSON object")
        return tail


def scan_changes(pieces: Iterable[bytes]) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every change of a line read in pieces (the whole line checked, head and tail too)."""
    scanner = LineScanner(pieces)
    scanner.head()
    yield from scanner.changes()
    scanner.tail()
