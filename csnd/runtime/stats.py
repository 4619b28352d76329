"""One node's statistics: the single object every report of a node reads.

The stages keep their own counters -- the source its received and confirmed
LSNs, the decoder pool its changes and inbox depths, the sender what it
released and what waits on committing dependencies or spilled, a node
agent's client what it received.  `NodeInput.stats()` gathers them into one
`NodeStats` snapshot (the merge adds how many of the node's batches wait in
it), and every report is made from that snapshot alone: the
progress line of `csnd replay` (`progress_text`), and in `csnd serve` the
Status call, `/api/status`, the dashboard and `/metrics` (through
`csnd.service.nodes.NodeWatch`, which adds what only the service knows: the
slot on the server, restarts, lag).  None of them reads a stage directly, so
they cannot disagree.

A snapshot is taken from another thread than the pipeline's: it reads
counters (single attribute reads under the GIL), never waits on a stage.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class NodeStats:
    node: str
    mode: str = ""
    received_lsn: int = 0  # newest WAL position a live source has sent
    confirmed_lsn: int = 0  # confirmed to the source's slot
    read_fraction: float | None = None  # of a recorded file; None: live, a pipe or an agent
    reconnecting: bool = False  # a live source is between connections
    decoded_changes: int = 0
    inboxes: tuple[tuple[int, int], ...] = ()  # (depth, capacity) of each decoder's inbox
    released: int = 0  # transactions released in CSN order (received, for an agent)
    dropped_resumed: int = 0  # re-sent after a restart and already held downstream
    watermark_csn: int = 0
    waiting_committing: int = 0  # committing markers without their commit or abort yet
    waiting_commit: int = 0  # committed, held back by a smaller committing CSN
    spill_bytes: int = 0
    waiting_merge: int = 0  # batches of this node waiting in the merge (set by whoever runs the merge)
    agent: str = ""  # a node agent's address: its pipeline runs there

    def progress_text(self) -> str:
        """`read 42%, 512,000 changes decoded, decoder inboxes 4/4 3/4`: a few words for progress lines."""
        if self.agent:
            return f"agent {self.agent}, {self.released:,} transactions received"
        parts = []
        if self.read_fraction is not None:
            parts.append(f"read {self.read_fraction * 100:.0f}%")
        listed = " ".join(f"{depth}/{capacity}" for depth, capacity in self.inboxes)
        parts.append(f"{self.decoded_changes:,} changes decoded, decoder inboxes {listed}")
        return ", ".join(parts)
