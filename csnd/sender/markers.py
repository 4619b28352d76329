"""The node sender's reading of logical messages: GTM csn markers, a stream's start, snapshot watermarks.

    LogicalMessage ──► MarkerReader.message ──► committing / abort / tick ─► Releaser
                                             ├► cid / commit ─► the open transaction
                                             ├► csnd.start <token> ─► Releaser.settle
                                             └► csnd.snapshot (transactional) ─► txn.watermark

The grammar is `csnd.core.markers`' (`parse_fields`); what each marker means
for the order is docs/design.md section 3.  A marker on a single-node stream
is an error: markers mean a GTM cluster.
"""

from __future__ import annotations

from csnd.core.errors import MarkerError
from csnd.core.ids import Lsn
from csnd.core.markers import PREFIX as MARKER_PREFIX
from csnd.core.markers import (
    START_PREFIX,
    TRANSACTIONAL,
    WATERMARK_PREFIX,
    Marker,
    check_transactional,
    parse_fields,
)
from csnd.reader.pgoutput import LogicalMessage
from csnd.sender.opentxn import OpenTxn
from csnd.sender.release import Releaser
from csnd.sender.txn import FinishedTxn


class MarkerReader:
    """What one node's logical messages say, applied to its open transaction and its release rule.

    `start_token`: the stream starts mid-way and its own `csnd.start`
    message carries this token; `resumed`: the stream was restarted from a
    confirmed position.  Either way an `abort` for a gid never seen
    committing is accepted: its `committing` may lie before the start.
    """

    def __init__(
        self, node: str, gtm: bool, release: Releaser, start_token: str | None, resumed: bool
    ) -> None:
        self.node = node
        self._gtm = gtm
        self._release = release
        self._start_content = None if start_token is None else start_token.encode("ascii")
        self._unseen_abort_ok = resumed or start_token is not None

    def message(self, lsn: Lsn, m: LogicalMessage, txn: OpenTxn | None) -> list[FinishedTxn]:
        """Logical message `m` at `lsn`, inside open transaction `txn` (None: outside any); what it releases."""
        if m.prefix != MARKER_PREFIX:
            if m.prefix == START_PREFIX:
                return self._start_message(m)
            if m.prefix == WATERMARK_PREFIX and m.transactional and txn is not None:
                txn.watermark = True
            return []
        if not self._gtm:
            raise MarkerError(
                f"csn marker {m.content[:80]!r}"
                + (f" in transaction {txn.xid}" if txn is not None else "")
                + " on a node in single-node mode; markers mean a gtm cluster: "
                "run this node in gtm mode (stream header / --mode)",
                node=self.node,
                lsn=m.lsn or lsn or None,
                xid=txn.xid if txn is not None else m.xid,
            )
        where = m.lsn or lsn
        kind, gid, value = parse_fields(m.content, self.node, where or None, m.xid)
        if m.transactional is not TRANSACTIONAL[kind]:
            check_transactional(
                Marker(kind, gid, value), m.transactional, node=self.node, lsn=where or None, xid=m.xid
            )
        release = self._release
        if kind == "committing":
            assert gid is not None and value is not None
            release.committing(gid, value, where)
            return []
        if kind == "abort":
            assert gid is not None
            return release.abort(gid, where, self._unseen_abort_ok)
        if kind == "tick":
            assert value is not None
            release.tick(value)
            return []
        if txn is None:
            raise MarkerError(
                f"transactional csn marker {m.content.decode('ascii', 'replace')!r} outside any "
                "transaction; the stream is corrupt",
                node=self.node,
                lsn=where or None,
                xid=m.xid,
            )
        assert value is not None
        if kind == "cid":
            if value < txn.cid:
                raise MarkerError(
                    f"cid marker {value} after cid {txn.cid} in transaction {txn.xid}; command ids "
                    "never decrease within a transaction",
                    node=self.node,
                    lsn=where or None,
                    xid=txn.xid,
                )
            txn.cid = value
            return []
        # commit
        assert gid is not None
        if txn.gid is not None:
            raise MarkerError(
                f"second commit marker in transaction {txn.xid}: 'commit {gid} {value}' after "
                f"'commit {txn.gid} {txn.csn}'; a local transaction belongs to one global transaction",
                node=self.node,
                lsn=where or None,
                xid=txn.xid,
            )
        txn.gid, txn.csn, txn.marker_sub = gid, value, m.xid
        return []

    def _start_message(self, m: LogicalMessage) -> list[FinishedTxn]:
        """A `csnd.start` message: this stream's own (its token) settles it; another start's is nothing."""
        if self._release.orderer.settling and not m.transactional and m.content == self._start_content:
            return self._release.settle()
        return []
