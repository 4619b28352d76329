"""Random column values with the edge cases decoders get wrong.

Each generator draws from the one seeded `random.Random` of a run, so a seed
fixes every value.  The distributions lean on what docs/design.md section 9 lists as
observed trouble: numeric scale and NaN, int8 beyond 2^53, timestamps before
2000 and at +-infinity, zero fractions that `isoformat()` drops, float8 -0,
5e-324, NaN and Infinity, unicode and escapes in text, jsonb and arrays,
NULL everywhere a column allows it, and big TOAST values.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from decimal import Decimal
from random import Random
from typing import Any, Final
from uuid import UUID

from csnd.gtm import pgtypes as T
from csnd.gtm.pgtypes import Cell, PgType
from csnd.gtm.shapes import ColumnDef

# A value this large (estimated heap bytes) is stored out of line, so an
# update that does not touch it sends 'u' (unchanged TOAST).  PostgreSQL's
# TOAST_TUPLE_THRESHOLD is about 2 kB.
TOAST_THRESHOLD: Final = 2000

WORDS: Final = (
    "ann",
    "bo",
    "Zoë",
    "naïve café",
    "日本語テキスト",
    "emoji 🚀✨",
    'quote "x"',
    "back\\slash",
    "tab\there",
    "new\nline",
    "Ελληνικά",
    "русский",
    "NULL",
    "null",
    "a,b",
    "{braces}",
    " spaced ",
    "O'Brien",
    "ℕ ⊆ ℤ",  # noqa: RUF001 (symbols that look like letters, on purpose)
    "e\u0301",  # combining accent
    "",
)
ASCII_WORDS: Final = ("alpha", "beta", "gamma", "delta", "omega", "kappa", "sigma", "tau")
JSON_KEYS: Final = ("a", "b", "id", "kind", "tags", "nested", "n", "név", "ключ", "x y", "", "aa")

FLOAT_SPECIALS: Final = (
    0.0,
    -0.0,
    5e-324,
    1e300,
    -1e-300,
    math.nan,
    math.inf,
    -math.inf,
    0.1,
    1 / 3,
    1e15,
    1e16,
    123456789012345.0,
    42.0,
    1.5e-7,
    -2.5e-5,
)
INT8_SPECIALS: Final = ((1 << 63) - 1, -(1 << 63), (1 << 53) + 1, -(1 << 53) - 3, 0, -1)
INT4_SPECIALS: Final = ((1 << 31) - 1, -(1 << 31), 0, -1)

# 1990-01-01 .. 2040-01-01 in microseconds since 2000-01-01.
_TS_LO: Final = -315_619_200_000_000
_TS_HI: Final = 1_262_304_000_000_000


class Values:
    """Generates Python values and turns them into cells for one wire mode."""

    def __init__(self, rng: Random, binary: bool, toast_bytes: int) -> None:
        self.rng = rng
        self.binary = binary
        self.text_cell = self._cell_fn(T.TEXT)
        # A pool of big out-of-line values, shared between rows: the realism is
        # in the size and the 'u' markers, not in every value being different,
        # and sharing keeps a long run's memory flat.
        self.big_pool: list[Cell] = []
        for i in range(24):
            n = toast_bytes + rng.randrange(toast_bytes)
            parts = [f"[{i}]"]
            size = 0
            while size < n:
                w = rng.choice(WORDS) or "-"
                parts.append(w)
                size += len(w.encode("utf-8")) + 1
            self.big_pool.append(self.text_cell(" ".join(parts)))

    def _cell_fn(self, t: PgType) -> Callable[[Any], Cell]:
        enc, js, size = (t.binary if self.binary else t.text), t.json, t.size

        def cell(v: Any) -> Cell:
            if v is None:
                return T.NULL_CELL
            return (enc(v), js(v), size(v))

        return cell

    # --- plain values ---------------------------------------------------------

    def short_text(self, max_len: int = 60) -> str:
        r = self.rng
        s = " ".join(r.choice(WORDS) for _ in range(r.randint(1, 3)))
        return s[:max_len]

    def int4(self) -> int:
        r = self.rng.random()
        if r < 0.05:
            return self.rng.choice(INT4_SPECIALS)
        return self.rng.randint(-1000, 100000)

    def int8(self) -> int:
        r = self.rng.random()
        if r < 0.1:
            return self.rng.choice(INT8_SPECIALS)
        if r < 0.4:
            return self.rng.randint(1 << 53, (1 << 62))
        return self.rng.randint(-(10**9), 10**12)

    def numeric(self, typmod: int) -> Decimal:
        r = self.rng
        if r.random() < 0.04:
            return Decimal("NaN")
        if typmod >= 4:
            precision, scale = (typmod - 4) >> 16, (typmod - 4) & 0xFFFF
            bound = 10 ** (precision - 1) - 1
            return Decimal(r.randint(-bound, bound)).scaleb(-scale)
        scale = r.choice((0, 0, 1, 2, 3, 5, 8))
        digits = r.choice((1, 3, 6, 12, 20, 28))
        return Decimal(r.randint(-(10**digits), 10**digits)).scaleb(-scale)

    def timestamptz(self) -> int:
        r = self.rng.random()
        if r < 0.02:
            return T.TIMESTAMP_INFINITY if r < 0.01 else T.TIMESTAMP_NEG_INFINITY
        us = self.rng.randint(_TS_LO, _TS_HI)
        if r < 0.25:
            us -= us % 1_000_000  # a zero fraction: isoformat() leaves it out
        return us

    def date(self) -> int:
        r = self.rng.random()
        if r < 0.02:
            return T.DATE_INFINITY if r < 0.01 else T.DATE_NEG_INFINITY
        return self.rng.randint(-4000, 15000)

    def float8(self) -> float:
        r = self.rng
        if r.random() < 0.3:
            return r.choice(FLOAT_SPECIALS)
        return r.uniform(-1e6, 1e6) * 10.0 ** r.randint(-8, 8)

    def jsonb(self, depth: int = 0) -> Any:
        r = self.rng
        k = r.random()
        if depth == 0 and k < 0.08:
            return r.choice(("scalar ✓", 7, True, T.JSONB_NULL, (1 << 60) + 1, 'esc \u0001"\\/'))
        if depth < 2 and k < 0.7:
            keys = T.jsonb_key_order(r.sample(JSON_KEYS, r.randint(0, 4)))
            return {key: self.jsonb(depth + 1) for key in keys}
        if depth < 2 and k < 0.85:
            return [self.jsonb(depth + 1) for _ in range(r.randint(0, 3))]
        return r.choice((r.randint(-(10**6), 10**6), self.short_text(20), True, False, None, (1 << 55) + 3))

    def int4_array(self) -> list[Any]:
        r = self.rng
        k = r.random()
        if k < 0.1:
            return []
        if k < 0.25:
            w = r.randint(1, 3)
            return [[r.choice((None, r.randint(-50, 50))) for _ in range(w)] for _ in range(2)]
        return [None if r.random() < 0.1 else r.randint(-(2**31), 2**31 - 1) for _ in range(r.randint(1, 6))]

    def text_array(self) -> list[Any]:
        r = self.rng
        if r.random() < 0.1:
            return []
        return [None if r.random() < 0.1 else r.choice(WORDS) for _ in range(r.randint(1, 5))]

    def uuid(self) -> UUID:
        return UUID(int=self.rng.getrandbits(128))

    def bytea(self) -> bytes:
        return self.rng.randbytes(self.rng.choice((0, 1, 8, 33)))

    # --- cells per column -----------------------------------------------------

    def generator(self, col: ColumnDef, toast: bool) -> Callable[[], Cell]:
        """A cell factory for a non-key column: its type's distribution, NULL sometimes."""
        r = self.rng
        if toast:
            pool, text_cell = self.big_pool, self.text_cell

            def toast_cell() -> Cell:
                k = r.random()
                if k < 0.15:
                    return T.NULL_CELL
                if k < 0.45:
                    return text_cell(self.short_text())
                return r.choice(pool)

            return toast_cell
        t = col.type
        make = self._cell_fn(t)
        plain: dict[str, Callable[[], Any]] = {
            "int4": self.int4,
            "int8": self.int8,
            "numeric": lambda: self.numeric(col.typmod),
            "timestamptz": self.timestamptz,
            "date": self.date,
            "text": lambda: self.short_text(40),
            "varchar": lambda: self.short_text(40),
            "float8": self.float8,
            "jsonb": self.jsonb,
            "_int4": self.int4_array,
            "_text": self.text_array,
            "bool": lambda: r.random() < 0.5,
            "uuid": self.uuid,
            "bytea": self.bytea,
        }
        value = plain[t.name]

        def cell() -> Cell:
            return T.NULL_CELL if r.random() < 0.06 else make(value())

        return cell

    def cell_of(self, t: PgType, v: Any) -> Cell:
        return t.cell(v, self.binary)
