"""Which relation versions a released transaction is the first to carry.

Each Relation message whose rendering (`decoder.schema`, names from the Type
messages before it) differs from the table's last one is a new version,
first in force with the first transaction *released* among those that finish
after it arrived: every change of the table after the message in the stream
is of that version, and of those transactions the first released has the
smallest CSN (release is in CSN order), while one that finished before the
message -- released later or not -- wrote none of the new version.  A
transaction skipped, dropped as already durable, or aborted passes the
version on to the next one released.

Pure: the node sender's intake hands it the Type and Relation messages, its
release rule (`sender.release`) the transactions it releases.
"""

from __future__ import annotations

from csnd.decoder.schema import relation_body
from csnd.reader.pgoutput import Relation, TypeMsg
from csnd.sender.txn import FinishedTxn


class RelationVersions:
    """The tables' latest versions, and the new ones not yet given to a released transaction."""

    __slots__ = ("_type_names", "_bodies", "new")

    def __init__(self) -> None:
        self._type_names: dict[int, tuple[str, str]] = {}  # Type messages: oid -> (namespace, name)
        self._bodies: dict[int, str] = {}  # relid -> its latest version's body
        # New versions not yet given to a released transaction: (the finish count when
        # they arrived, body); a transaction released with a `seq` at or past it takes them.
        # (A list the release rule holds too: "any new?" is then one truth test per release.)
        self.new: list[tuple[int, str]] = []

    def type_message(self, m: TypeMsg) -> None:
        """A Type message: the name its OID renders as in later Relation messages."""
        self._type_names[m.type_oid] = (m.namespace, m.name)

    def relation_message(self, m: Relation, finished: int) -> None:
        """A Relation message, arrived when `finished` transactions had finished."""
        body = relation_body(m, self._type_names)
        if self._bodies.get(m.relid) != body:  # (pgoutput sends it again unchanged, often)
            self._bodies[m.relid] = body
            self.new.append((finished, body))

    def attach(self, txn: FinishedTxn) -> None:
        """Give the released `txn` the new versions it is the first to be released with."""
        new = self.new
        n = 0
        while n < len(new) and new[n][0] <= txn.seq:
            n += 1
        if n:
            txn.relations = tuple(body for _, body in new[:n])
            del new[:n]
