"""Who is subscribed, how far each consumer got, and which named offsets must be stored.

Pure bookkeeping (no I/O, no clock: times are passed in), shared by the
changefeed's streams under the servicer's lock and read by Status:

    connect ──► Consumer(id, peer, name, tables, acked, sent)
    sent(id, csn)   the stream read the changelog through csn (sent or filtered out)
    ack(id, csn)    the client has processed everything through csn
    heard(id, now)  any message from the client (keepalive replies included)
    disconnect(id)

A named subscription's acknowledged CSN is a high-water mark kept per name
(`named`), seeded from the SubscriptionStore, and so is its table filter
(`filters`): a stream that names tables sets it, one that names none gets
it.  `unstored()` lists the names whose mark or filter changed since they
were last stored, and `stored()` records a write.  Only one stream holds a
name at a time: a new connection with the name takes it over (the old
stream is usually a dead connection the server has not noticed yet) and the
old one learns it is `superseded` and ends.  An operator may `reset` a
name's mark (back, to read again; or forward, to skip) or `delete` the name,
but only while no stream holds it: its consumer would otherwise carry on
from where it is and acknowledge over the change.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from csnd.core.errors import AckError, SubscriptionBusy, SubscriptionNotFound


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


Stored = tuple[int, tuple[str, ...]]  # a name's acknowledged CSN and table filter


@dataclass
class ConsumerRegistry:
    named: dict[str, int] = field(default_factory=dict)  # name -> acknowledged CSN (high-water mark)
    filters: dict[str, tuple[str, ...]] = field(default_factory=dict)  # name -> its filter (absent: all)
    _stored: dict[str, Stored] = field(default_factory=dict)  # name -> what the store holds
    consumers: dict[int, Consumer] = field(default_factory=dict)
    _by_name: dict[str, int] = field(default_factory=dict)
    _next_id: int = 1

    @classmethod
    def from_store(
        cls, stored: Mapping[str, int], filters: Mapping[str, Iterable[str]] | None = None
    ) -> ConsumerRegistry:
        kept = {n: tuple(t) for n, t in (filters or {}).items() if n in stored and t}
        return cls(
            named=dict(stored),
            filters=kept,
            _stored={n: (csn, kept.get(n, ())) for n, csn in stored.items()},
        )

    def tables_for(self, name: str, asked: Iterable[str]) -> tuple[str, ...]:
        """The filter a new stream gets: the tables it asked for, else (named) its name's stored ones."""
        tables = tuple(asked)
        return tables if tables or not name else self.filters.get(name, ())

    def connect(self, peer: str, name: str, tables: Iterable[str], after: int, now: float) -> Consumer:
        """A new stream that starts after `after`; a named one takes its name over, and its tables become the name's.

        A new name's mark is `after` until its first acknowledgement: a
        reconnect before then resumes where this stream started.
        """
        cid = self._next_id
        self._next_id += 1
        tables = tuple(tables)
        if name:
            old = self._by_name.pop(name, None)
            if old is not None:
                del self.consumers[old]  # superseded: its stream ends at its next look
            acked = self.named.setdefault(name, after)  # (a new name: where its stream starts)
            self._by_name[name] = cid
            if tables:
                self.filters[name] = tables
            else:
                self.filters.pop(name, None)
        else:
            acked = after
        c = Consumer(cid, peer, name, tables, acked, after, now, now)
        self.consumers[cid] = c
        return c

    def holder(self, name: str) -> Consumer | None:
        """The stream that holds `name` now, if any."""
        cid = self._by_name.get(name)
        return None if cid is None else self.consumers[cid]

    def reset(self, name: str, csn: int) -> int:
        """Set a stored name's mark to `csn` (back or forward); returns the mark it had."""
        before = self._changeable(name)
        self.named[name] = csn
        return before

    def delete(self, name: str) -> Stored:
        """Forget a name, mark and filter (the caller removes it from the store); returns what it held."""
        before = self._changeable(name)
        del self.named[name]
        tables = self.filters.pop(name, ())
        self._stored.pop(name, None)
        return before, tables

    def _changeable(self, name: str) -> int:
        if name not in self.named:
            raise SubscriptionNotFound(f"no subscription is named {name!r}")
        c = self.holder(name)
        if c is not None:
            raise SubscriptionBusy(
                f"subscription {name!r} is connected (from {c.peer}): stop its consumer first, or it "
                "would go on from where it is and acknowledge over the change"
            )
        return self.named[name]

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

    def unstored(self) -> dict[str, Stored]:
        """Named marks or filters that changed since they were last stored."""
        out = {n: (csn, self.filters.get(n, ())) for n, csn in self.named.items()}
        return {n: v for n, v in out.items() if self._stored.get(n) != v}

    def stored(self, name: str, csn: int, tables: tuple[str, ...] = ()) -> None:
        if name in self.named:  # (not one deleted since the write was planned)
            self._stored[name] = (csn, tables)

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
            assert self.consumers[cid].tables == self.filters.get(name, ()), "a name's filter is its stream's"
        assert set(self._stored) <= set(self.named)
        assert set(self.filters) <= set(self.named) and all(self.filters.values())
