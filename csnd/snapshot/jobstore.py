"""The incremental snapshots' jobs as stored: what each table has done, kept across restarts.

`incremental_snapshots.json` in the changelog directory, replaced atomically
(`csnd.core.durable.replace_file`) each time a chunk is done or a job
changes state, holds every job -- per table the key after which its next
chunk starts and the chunk in flight with the CSN the changelog had reached
before it -- and, per when_needed node, the tables of its publication
already covered.  `csnd.snapshot.incremental` runs the jobs; this module
only says what they are and reads and writes them.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, Final

from csnd.core.durable import replace_file
from csnd.core.errors import SnapshotError
from csnd.snapshot.plan import CHUNK_ROWS

JOBS_FILE: Final = "incremental_snapshots.json"


@dataclass(frozen=True)
class NodeAccess:
    """How a job reaches one node: what the service's live source for it says."""

    node: str
    conninfo: str
    publication: str
    binary: bool
    mode: str
    enums: Callable[[], list[tuple[int, int]]]
    # snapshot=when_needed: a table that joins the publication later is snapshotted by itself
    when_needed: bool = False
    # GTM mode: the shared GTM's server (--gtm), whose CSNs the watermarks take (None: not named)
    gtm: str | None = None


@dataclass
class TableJob:
    """One table of a job, as stored: where its next chunk starts and the chunk in flight."""

    node: str
    schema: str
    table: str
    state: str = "waiting"  # "waiting", "copying", "done"
    after: list[str] | None = None  # the last key done, as text (None: none yet)
    chunks: int = 0  # chunks done
    rows: int = 0  # rows kept (appended as reads)
    estimated: int = 0
    # the chunk in flight: {"chunk": n, "hi": [...] | None, "floor": the changelog's newest csn before it}
    pending: dict[str, Any] | None = None
    # the changelog's newest csn when the table's first chunk began: every change the stream delivers
    # of a row while the job reads the table comes after it (a consumer drops the rows it did not
    # see read or changed past it: they no longer exist)
    since: int | None = None

    @property
    def label(self) -> str:
        return f"{self.schema}.{self.table}"


@dataclass
class Job:
    id: str
    tables: list[TableJob]
    chunk_rows: int = CHUNK_ROWS
    state: str = "running"  # "queued" (behind another), "running", "complete", "failed"
    error: str = ""
    redo: int = field(default=0, repr=False)


# The tables of a when_needed node's publication already covered, as [schema, table], by node.
Known = dict[str, list[list[str]]]


def read_jobs(path: str) -> tuple[list[Job], Known]:
    """The jobs and known tables stored at `path` (none if there is no file yet)."""
    try:
        with open(path, "rb") as f:
            stored = json.loads(f.read())
    except FileNotFoundError:
        return [], {}
    except ValueError as e:
        raise SnapshotError(f"{path} is not the incremental snapshots' JSON: {e}") from None
    try:
        known = {n: [list(t) for t in ts] for n, ts in stored.get("known", {}).items()}
        jobs = [
            Job(j["id"], [TableJob(**t) for t in j["tables"]], j["chunk_rows"], j["state"], j["error"])
            for j in stored.get("jobs", [])
        ]
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise SnapshotError(
            f"{path} is not the incremental snapshots' JSON csnd writes ({type(e).__name__}: {e}); "
            "move it away to forget the jobs (a job then running is not resumed)"
        ) from None
    return jobs, known


def write_jobs(path: str, jobs: list[Job], known: Known) -> None:
    """Every job and the known tables, replacing `path` atomically (a job's redo count is not kept)."""
    doc: dict[str, Any] = {
        "jobs": [{**asdict(j), "tables": [asdict(t) for t in j.tables]} for j in jobs],
        "known": known,
    }
    for j in doc["jobs"]:
        j.pop("redo", None)
    replace_file(path, json.dumps(doc, indent=1).encode())


def shown_job(jobs: list[Job]) -> Job | None:
    """The job Status shows: the running one, else the newest that ended (else the first queued)."""
    running = [j for j in jobs if j.state == "running"]
    ended = [j for j in jobs if j.state in ("complete", "failed")]
    shown = running or ended[-1:] or [j for j in jobs if j.state == "queued"]
    return shown[0] if shown else None


def outcomes(jobs: list[Job]) -> dict[str, str]:
    """How the jobs that ended ended, by id: "complete" or "failed: <why>"."""
    return {
        j.id: j.state if j.state == "complete" else f"failed: {j.error}"
        for j in jobs
        if j.state in ("complete", "failed")
    }


def table_spec(schema: str, table: str) -> str:
    """`schema.table` as `csnd.core.tablespec` reads it back (a part with a dot, quote or space quoted)."""

    def part(name: str) -> str:
        plain = (
            name and name != "*" and not any(ch in name for ch in '."') and not any(c.isspace() for c in name)
        )
        return name if plain else '"' + name.replace('"', '""') + '"'

    return f"{part(schema)}.{part(table)}"
