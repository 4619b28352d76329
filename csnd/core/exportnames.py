"""The names of `csnd serve --parquet-dir`'s files, which say the CSN range each holds.

    csn-<after>-<last>.parquet   (20 digits each: the names sort by CSN)

A file holds every change of the transactions with after < csn <= last, and
the ranges follow one another (docs/design.md section 8, `--parquet-dir`).  Here because
both sides use it: the export that writes the files, and a consumer that
checks the files it read leave no gap.
"""

from __future__ import annotations

import re
from typing import Final, NamedTuple

_NAME_RE: Final = re.compile(r"^csn-(\d{20})-(\d{20})\.parquet$")


class ParquetFile(NamedTuple):
    name: str
    after_csn: int  # the range is after_csn < csn <= last_csn
    last_csn: int


def file_name(after_csn: int, last_csn: int) -> str:
    return f"csn-{after_csn:020d}-{last_csn:020d}.parquet"


def parse_name(name: str) -> ParquetFile | None:
    """The file's range, None for a name that is not an export file's."""
    m = _NAME_RE.match(name)
    return None if m is None else ParquetFile(name, int(m.group(1)), int(m.group(2)))
