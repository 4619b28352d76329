"""Tunables of the synthetic cluster generator, and what a run reports.

Every field of `GenerateOptions` is a knob with a trade-off, stated beside it;
the defaults give a mixed workload in which every feature of section 2.3 of
the design shows up within a few hundred transactions.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class GenerateOptions:
    """Workload tunables; each states what it trades."""

    # Global txns in flight at once: more means more interleaving and more
    # out-of-CSN-order commits, and more memory for buffered expected output.
    concurrency: int = 8
    # Share of ordinary txns touching 2-3 nodes (with K > 1).
    distributed_ratio: float = 0.4
    # Share of txns that fail (plain rollback, or abort after committing).
    abort_ratio: float = 0.1
    # Share of large txns, and their size in changes (about; +-40%).  They are
    # what gets streamed; bigger means longer streams and fewer txns per MB.
    large_ratio: float = 0.03
    large_txn_changes: int = 300
    statements: tuple[int, int] = (1, 5)
    ops_per_statement: tuple[int, int] = (1, 3)
    savepoint_ratio: float = 0.15
    # A cluster-wide ALTER TABLE / a TRUNCATE every this many txns (0: never);
    # runs of 8 txns or more always get at least one of each.
    ddl_every: int = 150
    truncate_every: int = 200
    # Row width: filler columns added to `wide`, and the size of big values.
    extra_columns: int = 0
    toast_bytes: int = 2500
    # logical_decoding_work_mem of the emulated walsender: smaller streams more.
    work_mem: int = 64 * 1024
    # Rows per table and node before the recording starts, and the soft cap
    # that turns inserts into updates/deletes (bounds the generator's memory).
    initial_rows: int = 40
    max_rows: int = 400
    # Mean scheduler steps between a tick / a keepalive / a WAL gap on some node.
    tick_every: int = 20
    keepalive_every: int = 30
    gap_every: int = 50

    def __post_init__(self) -> None:
        bad = []
        if self.concurrency < 1:
            bad.append(f"concurrency must be >= 1, got {self.concurrency}")
        for name in ("distributed_ratio", "abort_ratio", "large_ratio", "savepoint_ratio"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                bad.append(f"{name} must be within [0, 1], got {getattr(self, name)}")
        for name in ("statements", "ops_per_statement"):
            lo, hi = getattr(self, name)
            if not 1 <= lo <= hi:
                bad.append(f"{name} must be (lo, hi) with 1 <= lo <= hi, got {(lo, hi)}")
        for name in ("large_txn_changes", "work_mem", "toast_bytes", "max_rows"):
            if getattr(self, name) < 1:
                bad.append(f"{name} must be >= 1, got {getattr(self, name)}")
        if min(self.extra_columns, self.initial_rows, self.ddl_every, self.truncate_every) < 0:
            bad.append("extra_columns, initial_rows, ddl_every and truncate_every must be >= 0")
        if bad:
            raise ValueError("invalid generate options: " + "; ".join(bad))


@dataclass
class GenerateSummary:
    out_dir: str
    files: list[str]
    expected: str | None
    nodes: int
    transactions: int
    committed: int = 0
    aborted: int = 0
    changes: int = 0
    frames: int = 0
    bytes: int = 0  # of all stream files
    expected_bytes: int = 0
    stream_blocks: int = 0
    last_csn: int = 0
    per_node_frames: dict[str, int] = field(default_factory=dict)
