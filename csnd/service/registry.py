"""Who is subscribed, how far each consumer got, and which named offsets must be stored.

Pure bookkeeping (no I/O, no clock: times are passed in), shared by the
changefeed's streams under the servicer's lock and read by Status:

    connect ──► Consumer(id, peer, name, tables, acked, sent)
    sent(id, csn)   the stream read the changelog through csn (sent or filtered out)
    ack(id, csn)    the client has processed everything through csn
    heard(id, now)  any message from the client (keepalive replies included)
    disconnect(id)

A named subscription's acknowledged CSN is a high-water mark kept per name
(`named`), seeded from the SubscriptionStore; `unstored()` lists the names
whose mark moved since it was last stored, and `stored()` records a write.
Only one stream holds a name at a time: a new connection with the name takes
it over (the old stream is usually a dead connection the server has not
noticed yet) and the old one learns it is `superseded` and ends.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from csnd.core.errors import AckError


@dataclass
class Consumer:
    id: int
    peer: str
    name: str  # "" for an anonymous consumer
    tables: tuple[str, ...]
    acked: int  # everything through this CSN is processed (named: the name's mark)
    sent: int  # the stream read the changelog through this CSN
    connected_since: float
    last_heard: float
    transactions_sent: int = 0


@dataclass
class ConsumerRegistry:
    named: dict[str, int] = field(default_factory=dict)  # name -> acknowledged CSN (high-water mark)
    _stored: dict[str, int] = field(default_factory=dict)  # name -> what the store holds
    consumers: dict[int, Consumer] = field(default_factory=dict)
    _by_name: dict[str, int] = field(default_factory=dict)
    _next_id: int = 1

    @classmethod
    def from_store(cls, stored: Mapping[str, int]) -> ConsumerRegistry:
        return cls(named=dict(stored), _stored=dict(stored))

    def connect(self, peer: str, name: str, tables: Iterable[str], after: int, now: float) -> Consumer:
        """A new stream that starts after `after`; a named one takes its name over."""
        cid = self._next_id
        self._next_id += 1
        if name:
            old = self._by_name.pop(name, None)
            if old is not None:
                del self.consumers[old]  # superseded: its stream ends at its next look
            acked = self.named.setdefault(name, 0)
            self._by_name[name] = cid
        else:
            acked = after
        c = Consumer(cid, peer, name, tuple(tables), acked, after, now, now)
        self.consumers[cid] = c
        return c

    def is_current(self, cid: int) -> bool:
        """False once the consumer disconnected or another stream took its name over."""
        return cid in self.consumers

    def heard(self, cid: int, now: float) -> None:
        c = self.consumers.get(cid)
        if c is not None:
            c.last_heard = max(c.last_heard, now)

    def sent(self, cid: int, csn: int, transactions: int = 0) -> None:
        c = self.consumers.get(cid)
        if c is not None:
            if csn < c.sent:
                raise ValueError(f"consumer {cid}: read position went back from {c.sent} to {csn}")
            c.sent = csn
            c.transactions_sent += transactions

    def ack(self, cid: int, csn: int) -> bool:
        """Records an acknowledgement; True when the consumer's mark moved."""
        c = self.consumers.get(cid)
        if c is None:
            return False
        if csn > c.sent:
            raise AckError(f"acknowledged csn {csn}, but the newest transaction sent is csn {c.sent}")
        if csn <= c.acked:
            return False  # (an old or repeated acknowledgement; a mark never moves back)
        c.acked = csn
        if c.name:
            self.named[c.name] = csn
        return True

    def disconnect(self, cid: int) -> None:
        c = self.consumers.pop(cid, None)
        if c is not None and c.name and self._by_name.get(c.name) == cid:
            del self._by_name[c.name]

    def silent(self, now: float, timeout: float) -> list[int]:
        """Consumers that sent nothing for longer than `timeout`."""
        return [c.id for c in self.consumers.values() if now - c.last_heard > timeout]

    def unstored(self) -> dict[str, int]:
        """Named marks that moved since they were last stored."""
        return {n: csn for n, csn in self.named.items() if self._stored.get(n) != csn}

    def stored(self, name: str, csn: int) -> None:
        self._stored[name] = csn

    def idle_names(self) -> dict[str, int]:
        """Named subscriptions with no stream connected now, and their marks."""
        return {n: csn for n, csn in self.named.items() if n not in self._by_name}

    def _check(self) -> None:
        for cid, c in self.consumers.items():
            assert c.id == cid and 0 < cid < self._next_id
            assert c.last_heard >= c.connected_since
            if c.name:
                assert self._by_name[c.name] == cid, "a named consumer holds its name"
                assert c.acked == self.named[c.name], "a named consumer's mark is its name's mark"
        for name, cid in self._by_name.items():
            assert self.consumers[cid].name == name
        assert set(self._stored) <= set(self.named)
