"""What the client's streams received, handed out in CSN order, checked.

The client's one rule towards its caller: every transaction once, in CSN
order, across reconnects.  `Delivery` holds what arrived but is not handed
out yet, refuses a CSN that does not follow the last one handed out (a
repeat would be a bug on one side, and handing it out a duplicate), hands
each relation line out once (a reconnect sends those in force again), and
joins a large line from its pieces.  It runs on the caller's thread only.
"""

from __future__ import annotations

import logging
import operator
from collections import deque

from csnd.consumers.lines import Joining, LargeLine, Piece, Record, RelationRecord, Relations
from csnd.core.errors import ChangefeedError

log = logging.getLogger("csnd.consumers.client")


class Delivery:
    """Received lines in order; `last_csn`: the last transaction handed out (None: none yet, no start)."""

    def __init__(self, address: str, last_csn: int | None) -> None:
        self.address = address
        self.last_csn = last_csn
        self.pending: deque[tuple[int, bytes | LargeLine]] = deque()
        self._relation_lines: set[bytes] = set()  # handed out (a reconnect sends those in force again)
        self._joining: Joining | None = None  # the pieces of a large line so far
        self._handed_large: LargeLine | None = None  # closed at the next call

    def close_handed(self) -> None:
        """The caller is back: the large line handed out before is read by now."""
        if self._handed_large is not None:
            self._handed_large.close()
            self._handed_large = None

    def add_relations(self, item: Relations) -> None:
        seen = self._relation_lines
        for r in item:
            if r.line not in seen:
                seen.add(r.line)
                self.pending.append(r)

    def add_piece(self, item: Piece, spool: bool) -> bool:
        """One piece of a large line; True once it completed the line (then pending)."""
        joining = self._joining
        if joining is None:
            joining = self._joining = Joining(item.csn, spool)
        elif item.csn != joining.csn:
            self.drop_joining()
            raise ChangefeedError(
                f"{self.address} sent a piece of csn {item.csn} inside the line of csn {joining.csn}; "
                "reconnect to recover"
            )
        joining.add(item.data)
        if item.more:
            return False
        self._joining = None
        line = joining.line()
        if isinstance(line, LargeLine):
            self._handed_large = line
        self.pending.append((item.csn, line))
        return True

    def drop_joining(self) -> None:
        """A stream ended inside a large line: the next one sends it again, whole."""
        joining = self._joining
        if joining is not None:
            log.info(
                "changefeed %s: dropped %d bytes of the line of csn %d, cut short; it comes again whole",
                self.address,
                joining.size,
                joining.csn,
            )
            joining.drop()
            self._joining = None

    def close(self) -> None:
        self.drop_joining()
        if self._handed_large is not None:
            self._handed_large.close()

    def hand_out(self) -> tuple[int, bytes | LargeLine]:
        rec = self.pending.popleft()
        if type(rec) is RelationRecord:
            return rec
        csn, line = rec
        self._check_follows(csn, self.last_csn)
        self.last_csn = csn
        return csn, line

    def take_ready(self, most: int) -> list[Record]:
        """The plain lines next in order, up to `most` (ChangefeedClient.take_ready)."""
        self.close_handed()
        pending = self.pending
        run: list[Record] = []
        take, keep = pending.popleft, run.append
        while pending and len(run) < most:
            rec = pending[0]
            if type(rec) is RelationRecord or type(rec[1]) is not bytes:
                break
            keep(take())  # type: ignore[arg-type]  # (its line is bytes: tested just above)
        if run:
            csns = [csn for csn, _ in run]
            last = self.last_csn
            if (last is not None and csns[0] <= last) or not all(map(operator.lt, csns, csns[1:])):
                for csn in csns:  # (the first out of place, named as `hand_out` names it)
                    self._check_follows(csn, last)
                    last = csn
            self.last_csn = csns[-1]
        return run

    def _check_follows(self, csn: int, last: int | None) -> None:
        """Refuse `csn` unless it comes after `last`, the CSN handed out before it.

        The service sends each transaction once, in order; a repeat here would
        be a bug on one side, and handing it out a duplicate.
        """
        if last is not None and csn <= last:
            raise ChangefeedError(f"{self.address} sent csn {csn} after csn {last}; reconnect to recover")
