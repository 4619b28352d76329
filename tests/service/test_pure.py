"""The changefeed's pure parts against brute-force oracles: table filters, batching, the registry."""

from __future__ import annotations

import itertools
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from csnd.core.errors import AckError, SubscriptionBusy, SubscriptionNotFound
from csnd.service.batching import BatchBuilder, record_size
from csnd.service.filtering import TableFilter, filter_line
from csnd.service.registry import ConsumerRegistry

SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# ---- filtering --------------------------------------------------------------------------------

names = st.sampled_from(["public", "acct", "a.b", 'q"t', "ünï", "orders", "x y", "]}", "changes"])
values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63) | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8,
)


@st.composite
def transactions(draw: st.DrawFn) -> dict[str, object]:
    changes = [
        {
            "node": draw(st.sampled_from(["dn1", "dn2"])),
            "cid": i,
            "lsn": "0/16B3600",
            "op": draw(st.sampled_from(["insert", "update", "delete", "truncate"])),
            "schema": draw(names),
            "table": draw(names),
            "old": draw(values),
            "new": draw(values),
        }
        for i in range(draw(st.integers(0, 6)))
    ]
    return {
        "csn": draw(st.integers(1, 2**63)),
        "gid": draw(st.none() | st.text(max_size=8)),
        "commit_time": "2026-11-22T10:00:00.123456+00:00",
        "nodes": {
            "dn1": {"xid": 745, "commit_lsn": "0/16B3748"},
            draw(names): {"xid": 1, "commit_lsn": "0/1"},
        },
        "changes": changes,
    }


def dumps(obj: object) -> bytes:
    return json.dumps(obj, ensure_ascii=False).encode()


def quote(name: str) -> str:
    return '"{}"'.format(name.replace('"', '""'))


@SETTINGS
@given(
    txn=transactions(),
    wanted=st.frozensets(st.tuples(names, names), max_size=4),
    schemas=st.frozensets(names, max_size=2),
)
def test_filter_matches_oracle(
    txn: dict[str, object], wanted: frozenset[tuple[str, str]], schemas: frozenset[str]
) -> None:
    """Cutting the line gives exactly json.dumps of the transaction with only the wanted changes."""
    line = dumps(txn)
    changes = txn["changes"]
    assert isinstance(changes, list)
    kept = [c for c in changes if (c["schema"], c["table"]) in wanted or c["schema"] in schemas]
    got = filter_line(line, wanted, schemas)
    if not kept:
        assert got is None
    else:
        assert got == dumps({**txn, "changes": kept})
        if len(kept) == len(changes):
            assert got is line
    # The cheap first test never loses a line the full filter keeps.
    specs = [f"{quote(s)}.{quote(t)}" for s, t in wanted] + [f"{quote(s)}.*" for s in schemas]
    assert TableFilter(specs).keep(line) == (got if specs else line)


def test_filter_keeps_head_bytes_and_refuses_non_transactions() -> None:
    line = b'{"csn": 5, "gid": null, "commit_time": "t", "nodes": {}, "changes": [{"schema": "a", "table": "b"}, {"schema": "c", "table": "d"}]}'
    assert filter_line(line, frozenset({("c", "d")})) == (
        b'{"csn": 5, "gid": null, "commit_time": "t", "nodes": {}, "changes": [{"schema": "c", "table": "d"}]}'
    )
    for bad in (b"[]", b'{"csn": 1}', b'{"changes": [1]}', b'{"changes": [', b"not json"):
        with pytest.raises(ValueError):
            filter_line(bad, frozenset({("a", "b")}))


@SETTINGS
@given(txn=transactions(), wanted=st.frozensets(st.tuples(names, names), max_size=4))
def test_filter_of_a_line_written_otherwise_keeps_its_bytes(
    txn: dict[str, object], wanted: frozenset[tuple[str, str]]
) -> None:
    """A line not in json.dumps's exact form (other spacing, numbers like 1.50) is cut, not re-encoded."""
    changes = txn["changes"]
    assert isinstance(changes, list)
    pieces = [json.dumps(c, ensure_ascii=False).replace('"cid": ', '"cid":  ') + " " for c in changes]
    pieces = [p.replace('"lsn"', '"n": 1.50, "lsn"') for p in pieces]
    head = json.dumps({k: v for k, v in txn.items() if k != "changes"}, ensure_ascii=False)[:-1]
    line = f'{head}, "changes": [ {",".join(pieces)}] }}'.encode()
    kept = [p for p, c in zip(pieces, changes, strict=True) if (c["schema"], c["table"]) in wanted]
    got = filter_line(line, wanted)
    if not kept:
        assert got is None
    elif len(kept) == len(changes):
        assert got is line
    else:
        assert got == f'{head}, "changes": [{", ".join(p.rstrip() for p in kept)}] }}'.encode()


# ---- batching ---------------------------------------------------------------------------------


def greedy(sizes: list[int], bound: int) -> list[list[int]]:
    """The oracle: indices cut greedily, a batch closed when the next one would pass the bound."""
    out: list[list[int]] = []
    cur: list[int] = []
    total = 0
    for i, s in enumerate(sizes):
        if cur and total + s > bound:
            out.append(cur)
            cur, total = [], 0
        cur.append(i)
        total += s
    if cur:
        out.append(cur)
    return out


@SETTINGS
@given(
    lengths=st.lists(st.integers(0, 300), max_size=60),
    bound=st.integers(1, 1000),
    flushes=st.sets(st.integers(0, 60)),
)
def test_batches_match_greedy_oracle(lengths: list[int], bound: int, flushes: set[int]) -> None:
    """Every record once, in order; each batch under the bound or alone; flushes cut where asked."""
    b = BatchBuilder(bound)
    got: list[list[int]] = []
    for i, n in enumerate(lengths):
        if i in flushes and (done := b.flush()):
            got.append([c for c, _ in done])
        b._check()
        if (done := b.add(i, b"x" * n)) is not None:
            got.append([c for c, _ in done])
        b._check()
    if done := b.flush():
        got.append([c for c, _ in done])
    # Between two flushes the cut is the greedy one.
    expect: list[list[int]] = []
    cuts = sorted({0, *(f for f in flushes if f < len(lengths)), len(lengths)})
    for lo, hi in itertools.pairwise(cuts):
        sizes = [record_size(b"x" * n) for n in lengths[lo:hi]]
        expect += [[lo + i for i in part] for part in greedy(sizes, bound)]
    assert got == expect
    for batch in got:
        assert len(batch) == 1 or sum(record_size(b"x" * lengths[i]) for i in batch) <= bound


# ---- the consumer registry --------------------------------------------------------------------


class RegistryMachine(RuleBasedStateMachine):
    """The registry against a model: per stream (name, acked, sent), per name a high-water mark and a filter."""

    def __init__(self) -> None:
        super().__init__()
        self.reg = ConsumerRegistry.from_store({"kept": 7}, {"kept": ["public.acct"]})
        self.marks = {"kept": 7}  # model: name -> mark
        # model: name -> its table filter (absent: every table)
        self.filters: dict[str, tuple[str, ...]] = {"kept": ("public.acct",)}
        self.stored: dict[str, tuple[int, tuple[str, ...]]] = {"kept": (7, ("public.acct",))}
        self.live: dict[int, list[object]] = {}  # id -> [name, acked, sent]
        self.holder: dict[str, int] = {}
        self.now = 0.0

    @rule(
        name=st.sampled_from(["", "", "kept", "other"]),
        after=st.integers(0, 50),
        tables=st.sampled_from([(), ("public.acct",), ("s.*", "public.b")]),
    )
    def connect(self, name: str, after: int, tables: tuple[str, ...]) -> None:
        self.now += 1
        effective = tables or (self.filters.get(name, ()) if name else ())
        assert self.reg.tables_for(name, tables) == effective
        c = self.reg.connect("peer", name, effective, after, self.now)
        assert c.tables == effective
        if name:
            old = self.holder.get(name)
            if old is not None:
                del self.live[old]  # taken over
            self.holder[name] = c.id
            self.marks.setdefault(name, after)  # (a new name's mark: where its stream starts)
            if effective:
                self.filters[name] = effective
        self.live[c.id] = [name, self.marks[name] if name else after, after]
        assert c.acked == self.live[c.id][1]

    @rule(name=st.sampled_from(["kept", "other", "never"]), csn=st.integers(0, 120))
    def reset(self, name: str, csn: int) -> None:
        if name not in self.marks:
            with pytest.raises(SubscriptionNotFound):
                self.reg.reset(name, csn)
        elif name in self.holder:
            with pytest.raises(SubscriptionBusy, match="connected"):
                self.reg.reset(name, csn)
        else:
            assert self.reg.reset(name, csn) == self.marks[name]
            self.marks[name] = csn

    @rule(name=st.sampled_from(["kept", "other", "never"]))
    def delete(self, name: str) -> None:
        if name not in self.marks:
            with pytest.raises(SubscriptionNotFound):
                self.reg.delete(name)
        elif name in self.holder:
            with pytest.raises(SubscriptionBusy):
                self.reg.delete(name)
        else:
            assert self.reg.delete(name) == (self.marks.pop(name), self.filters.pop(name, ()))
            self.stored.pop(name, None)

    @precondition(lambda self: self.live)
    @rule(data=st.data(), step=st.integers(0, 20), count=st.integers(0, 3))
    def send(self, data: st.DataObject, step: int, count: int) -> None:
        cid = data.draw(st.sampled_from(sorted(self.live)))
        rec = self.live[cid]
        rec[2] = int(rec[2]) + step  # type: ignore[call-overload]
        self.reg.sent(cid, int(rec[2]), count)  # type: ignore[call-overload]

    @precondition(lambda self: self.live)
    @rule(data=st.data(), csn=st.integers(0, 120))
    def ack(self, data: st.DataObject, csn: int) -> None:
        cid = data.draw(st.sampled_from(sorted(self.live)))
        name, acked, sent = self.live[cid]
        assert isinstance(acked, int) and isinstance(sent, int) and isinstance(name, str)
        if csn > sent:
            with pytest.raises(AckError):
                self.reg.ack(cid, csn)
            return
        moved = self.reg.ack(cid, csn)
        assert moved == (csn > acked)
        if moved:
            self.live[cid][1] = csn
            if name:
                self.marks[name] = csn

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def disconnect(self, data: st.DataObject) -> None:
        cid = data.draw(st.sampled_from(sorted(self.live)))
        name = self.live.pop(cid)[0]
        if name and self.holder.get(name) == cid:  # type: ignore[call-overload]
            del self.holder[name]  # type: ignore[arg-type]
        self.reg.disconnect(cid)
        assert not self.reg.is_current(cid)

    @rule()
    def store(self) -> None:
        for name, (csn, tables) in self.reg.unstored().items():
            self.reg.stored(name, csn, tables)
            self.stored[name] = (csn, tables)

    @invariant()
    def agrees(self) -> None:
        self.reg._check()
        assert self.reg.named == self.marks
        assert set(self.reg.consumers) == set(self.live)
        for cid, (name, acked, sent) in self.live.items():
            c = self.reg.consumers[cid]
            assert (c.name, c.acked, c.sent) == (name, acked, sent)
        assert self.reg.filters == self.filters
        now = {n: (m, self.filters.get(n, ())) for n, m in self.marks.items()}
        assert self.reg.unstored() == {n: v for n, v in now.items() if self.stored.get(n) != v}
        assert self.reg.idle_names() == {n: m for n, m in self.marks.items() if n not in self.holder}


RegistryMachine.TestCase.settings = settings(SETTINGS, max_examples=150, stateful_step_count=40)
test_registry = RegistryMachine.TestCase
