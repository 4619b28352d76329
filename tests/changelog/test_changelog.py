"""Changelog: round trips, reads from every CSN against the oracle, rolls, index rebuilds, retention, lock."""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from csnd.changelog import Changelog, SubscriptionStore
from csnd.changelog import record as rec
from csnd.core.errors import ChangelogCorrupt, ConfigError, CsndError, CsnOutOfRange
from tests.changelog.helpers import (
    FakeClock,
    Records,
    expected,
    payload,
    record_lists,
    segments,
    write_log,
)

SETTINGS = settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def probes(records: Records) -> list[int]:
    """0, every record's csn, the csns either side of each, and past the end."""
    out = {0}
    for c, _ in records:
        out.update((c - 1, c, c + 1))
    out.add(records[-1][0] + 1000)
    return sorted(x for x in out if x >= 0)


def test_empty_log(tmp_path: Path) -> None:
    with Changelog(str(tmp_path)) as log:
        assert (log.durable_csn, log.oldest_csn, log.newest_csn, log.segment_count) == (0, 0, 0, 0)
        assert list(log.read(0)) == [] and list(log.read(5)) == []
        assert log.sync() == 0
        assert log.wait_durable(0, 0.01) is False
        log._check()


def test_round_trip_and_reads_from_every_csn(tmp_path: Path) -> None:
    records = [(c, payload(c)) for c in range(10, 3000, 7)]
    log = write_log(str(tmp_path), records, segment_bytes=4096, index_interval=512)
    assert log.segment_count > 5
    assert (log.oldest_csn, log.durable_csn, log.newest_csn) == (10, records[-1][0], records[-1][0])
    assert log.size_bytes == sum(os.path.getsize(tmp_path / n) for n in segments(str(tmp_path)))
    for after in probes(records):
        assert list(log.read(after)) == expected(records, after), after
    for after, until in [(0, 10), (10, 10), (11, 500), (500, 2000), (0, 5), (2990, 10**9)]:
        assert list(log.read(after, until)) == expected(records, after, until)
    log.close()
    with Changelog(str(tmp_path), segment_bytes=4096, index_interval=512) as log:
        log._check()
        assert list(log.read(0)) == records
        assert list(log.read(1500)) == expected(records, 1500)


@SETTINGS
@given(records=record_lists(max_size=40), seg=st.sampled_from([60, 300, 1 << 20]), every=st.integers(1, 5))
def test_reads_match_oracle(
    tmp_path_factory: pytest.TempPathFactory, records: Records, seg: int, every: int
) -> None:
    """Random records, segment sizes and sync points: every read equals the brute-force filter."""
    d = str(tmp_path_factory.mktemp("log"))
    with write_log(d, records, sync_every=every, segment_bytes=seg, index_interval=64) as log:
        for after in probes(records):
            assert list(log.read(after)) == expected(records, after)
        mid = records[len(records) // 2][0]
        assert list(log.read(0, mid)) == expected(records, 0, mid)
    with Changelog(d, segment_bytes=seg, index_interval=64) as log:
        log._check()
        assert list(log.read(0)) == records


@SETTINGS
@given(
    records=record_lists(max_size=60),
    cuts=st.lists(st.integers(1, 12), min_size=1, max_size=20),
    seg=st.sampled_from([60, 300, 1000, 1 << 20]),
    interval=st.sampled_from([1, 40, 64, 500]),
)
def test_runs_appended_together_write_the_index_a_rebuild_would(
    tmp_path_factory: pytest.TempPathFactory, records: Records, cuts: list[int], seg: int, interval: int
) -> None:
    """Runs of records flushed together: every segment's index is `record.sparse` of its records."""
    d = str(tmp_path_factory.mktemp("log"))
    with Changelog(d, segment_bytes=seg, index_interval=interval, tail_bytes=0) as log:
        at, k = 0, 0
        while at < len(records):
            run = records[at : at + cuts[k % len(cuts)]]
            log.append_many([c for c, _ in run], [p for _, p in run])
            at, k = at + len(run), k + 1
            if k % 3 == 0:
                log.sync()
        log.sync()
        log._check()
        assert list(log.read(0)) == records
        for name in segments(d):
            buf = (Path(d) / name).read_bytes()
            header = rec.decode_header(buf)
            assert isinstance(header, rec.SegmentHeader)
            found = rec.scan(buf, rec.SEGMENT_HEAD, header.prev_csn)
            assert found.damage is None and found.end == len(buf)
            want = rec.sparse(found.csns, found.offsets, interval)
            index = (Path(d) / rec.index_name(name)).read_bytes()
            assert rec.decode_index(index, header.first_csn, len(buf)) == want


def test_records_are_invisible_until_sync(tmp_path: Path) -> None:
    with Changelog(str(tmp_path)) as log:
        log.append(5, b"a")
        log.append(6, b"b")
        assert log.durable_csn == 0 and list(log.read(0)) == []
        assert log.sync() == 6
        assert list(log.read(0)) == [(5, b"a"), (6, b"b")]
        it = log.read(0)  # the durable end is the one at read() time
        log.append(7, b"c")
        log.sync()
        assert [c for c, _ in it] == [5, 6]
        log._check()


def test_append_refuses_csns_not_increasing(tmp_path: Path) -> None:
    with Changelog(str(tmp_path)) as log:
        log.append(5, b"a")
        for bad in (5, 4, 0, -1):
            with pytest.raises(ValueError, match="not increasing"):
                log.append(bad, b"x")
        log.sync()
    with Changelog(str(tmp_path)) as log, pytest.raises(ValueError):
        log.append(5, b"again")


def test_segment_rolls_and_names(tmp_path: Path) -> None:
    records = [(c, b"y" * 100) for c in range(1000, 1100)]
    with write_log(str(tmp_path), records, segment_bytes=1000) as log:
        names = segments(str(tmp_path))
        assert log.segment_count == len(names) > 1
        assert names[0] == "0000000000000001-00000000000003e8.log"
        for i, n in enumerate(names):
            seq, first = rec.parse_segment_name(n)  # type: ignore[misc]
            assert seq == i + 1
            size = os.path.getsize(tmp_path / n)
            # a segment passes segment_bytes by at most one record before the next starts
            assert i == len(names) - 1 or 1000 <= size < 1000 + rec.FRAME_HEAD + 100
            assert os.path.exists(tmp_path / (n[:-4] + ".idx"))
            assert log.read(first - 1).__next__()[0] == first


@pytest.mark.parametrize("damage", ["delete", "garbage", "truncate", "wrong_entry", "empty"])
def test_index_rebuilt_when_missing_or_damaged(tmp_path: Path, damage: str) -> None:
    records = [(c, payload(c)) for c in range(1, 800)]
    write_log(str(tmp_path), records, sync_every=100, segment_bytes=8192, index_interval=256).close()
    names = segments(str(tmp_path))
    for n in names:
        idx = tmp_path / (n[:-4] + ".idx")
        data = idx.read_bytes()
        if damage == "delete":
            idx.unlink()
        elif damage == "garbage":
            idx.write_bytes(data[:8] + bytes(b ^ 0x5A for b in data[8:]))
        elif damage == "truncate":
            idx.write_bytes(data[:-5])
        elif damage == "empty":
            idx.write_bytes(b"")
        else:  # plausible but wrong: an entry moved to another record's offset
            entries = data[8:]
            csn, off = int.from_bytes(entries[16:24], "big"), int.from_bytes(entries[24:32], "big")
            wrong = entries[:16] + (csn).to_bytes(8, "big") + (off + 40).to_bytes(8, "big") + entries[32:]
            idx.write_bytes(data[:8] + wrong)
    with Changelog(str(tmp_path), segment_bytes=8192, index_interval=256) as log:
        for after in (0, 1, 55, 300, 555, 798, 799):
            assert list(log.read(after)) == expected(records, after)
        for after in range(800):  # a seek through every index entry
            assert list(log.read(after, after + 2)) == expected(records, after, after + 2)
        log._check()
    with Changelog(str(tmp_path), segment_bytes=8192, index_interval=256) as log:
        for n in names:  # rebuilt on disk too: the next open reads it as is
            name = rec.parse_segment_name(n)
            assert name is not None
            got = rec.decode_index((tmp_path / (n[:-4] + ".idx")).read_bytes(), name[1], 10**9)
            assert got is not None
        assert list(log.read(400)) == expected(records, 400)


def test_read_seeks_with_the_index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A read from the middle starts at the index entry before its CSN, never at the start of the log."""
    from csnd.changelog import segment as sg

    records = [(c, payload(c)) for c in range(1, 5000)]
    with write_log(str(tmp_path), records, sync_every=500, segment_bytes=1 << 16, index_interval=1024) as log:
        starts: list[tuple[str, int]] = []
        real = sg.read_records

        def spy(path: str, start: int, *a: object) -> object:
            starts.append((os.path.basename(path), start))
            return real(path, start, *a)  # type: ignore[arg-type]

        monkeypatch.setattr(sg, "read_records", spy)
        it = log.read(3000)
        assert next(it)[0] == 3001
        ((name, start),) = starts
        seg_first = rec.parse_segment_name(name)[1]  # type: ignore[index]
        assert seg_first <= 3000 and start > rec.SEGMENT_HEAD
        # the bytes skipped before 3001 are less than one index interval
        skipped = sum(rec.FRAME_HEAD + len(p) for c, p in records if c < 3001 and c >= seg_first)
        assert skipped - (start - rec.SEGMENT_HEAD) < 1024 + rec.FRAME_HEAD + 200


def test_retention_by_size(tmp_path: Path) -> None:
    records = [(c, b"z" * 200) for c in range(1, 301)]
    log = write_log(str(tmp_path), records, segment_bytes=2000, retention_bytes=5000)
    total_before, count_before = log.size_bytes, log.segment_count
    freed = log.apply_retention()
    log._check()
    assert freed > 0 and log.size_bytes == total_before - freed <= 5000
    assert log.segment_count < count_before and len(segments(str(tmp_path))) == log.segment_count
    oldest = log.oldest_csn
    assert oldest > 1 and list(log.read(0)) == expected(records, oldest - 1)
    assert list(log.read(oldest - 1)) == expected(records, oldest - 1)  # nothing was dropped after it
    with pytest.raises(CsnOutOfRange, match=f"oldest retained csn is {oldest}") as e:
        log.read(oldest - 2)
    assert e.value.oldest_csn == oldest and e.value.csn == oldest - 2
    with pytest.raises(CsnOutOfRange):
        log.read(1)
    assert list(log.read(oldest + 5)) == expected(records, oldest + 5)
    log.close()
    with Changelog(str(tmp_path), segment_bytes=2000) as log:  # the bound holds after a restart too
        assert log.oldest_csn == oldest
        with pytest.raises(CsnOutOfRange):
            log.read(1)


def test_retention_by_age_and_never_the_active_segment(tmp_path: Path) -> None:
    clock = FakeClock()
    t0 = clock.now
    records = [(c, b"w" * 150) for c in range(1, 41)]
    log = Changelog(str(tmp_path), segment_bytes=1000, retention_hours=1.0, clock=clock, monotonic=clock)
    for c, line in records:  # four groups of ten, half an hour apart
        log.append(c, line)
        if c % 10 == 0:
            log.sync()
            clock.now += 1800
    # now = t0 + 2 h: a segment is older than 1 h when its newest record is from the first two groups
    firsts = [rec.parse_segment_name(n)[1] for n in segments(str(tmp_path))]  # type: ignore[index]
    lasts = [f - 1 for f in firsts[1:]] + [40]
    keep = next(i for i, last in enumerate(lasts) if last > 20)
    assert keep > 0 and clock.now - t0 == 7200
    freed = log.apply_retention()
    log._check()
    assert freed > 0 and log.oldest_csn == firsts[keep] and log.segment_count == len(firsts) - keep
    assert log.apply_retention() == 0  # nothing else is old yet
    clock.now += 10 * 3600  # everything is old now: all but the active segment go
    assert log.apply_retention() > 0
    log._check()
    assert log.segment_count == 1 and log.durable_csn == 40 and len(segments(str(tmp_path))) == 1
    assert list(log.read(0)) == expected(records, log.oldest_csn - 1)
    with pytest.raises(CsnOutOfRange):
        log.read(1)
    log.close()


def test_retention_by_age_keeps_young_segments(tmp_path: Path) -> None:
    clock = FakeClock()
    with Changelog(
        str(tmp_path), segment_bytes=500, retention_hours=2.0, clock=clock, monotonic=clock
    ) as log:
        for c in range(1, 31):
            log.append(c, b"v" * 200)
            log.sync()
            clock.now += 600  # ten minutes per record
        # now = start + 300 min; records older than 120 min: csn <= 12 (appended at start + (c-1)*10 min)
        log.apply_retention()
        log._check()
        newest_dropped = log.oldest_csn - 1
        assert newest_dropped >= 1
        assert clock.now - (newest_dropped - 1) * 600 - 1_700_000_000 > 2 * 3600  # dropped ones were old
        assert (
            clock.now - (log.oldest_csn + 1) * 600 - 1_700_000_000 <= 2 * 3600 + 1200
        )  # whole segments only


def test_second_open_is_refused(tmp_path: Path) -> None:
    with Changelog(str(tmp_path)), pytest.raises(ConfigError, match="in use by another csnd") as e:
        Changelog(str(tmp_path))
    assert str(os.getpid()) in str(e.value) and str(tmp_path) in str(e.value)
    with Changelog(str(tmp_path)):  # released by close
        pass
    (tmp_path / "file").write_bytes(b"")
    with pytest.raises(ConfigError, match=r"cannot use .* as a changelog directory"):
        Changelog(str(tmp_path / "file"))


def test_errors_are_csnd_errors_and_pickle(tmp_path: Path) -> None:
    e = ChangelogCorrupt("bad record crc", path="/d/x.log", offset=1234)
    assert isinstance(e, CsndError) and str(e) == "/d/x.log: bad record crc (at byte offset 1234)"
    e2 = pickle.loads(pickle.dumps(e))
    assert str(e2) == str(e) and (e2.path, e2.offset) == ("/d/x.log", 1234)
    o = pickle.loads(pickle.dumps(CsnOutOfRange("gone", csn=3, oldest_csn=9)))
    assert isinstance(o, CsnOutOfRange) and isinstance(o, CsndError) and (o.csn, o.oldest_csn) == (3, 9)


def test_subscription_store_survives_reopen(tmp_path: Path) -> None:
    s = SubscriptionStore(str(tmp_path))
    assert s.get("a") is None and s.all() == {}
    s.set("a", 10)
    s.set("b", 0)
    s.set("a", 12)
    s._check()
    assert SubscriptionStore(str(tmp_path)).all() == {"a": 12, "b": 0}
    (tmp_path / "subscriptions.json.tmp").write_bytes(b"half a wri")  # an unfinished set()
    s2 = SubscriptionStore(str(tmp_path))
    assert s2.get("a") == 12 and not (tmp_path / "subscriptions.json.tmp").exists()
    with pytest.raises(ValueError):
        s2.set("", 1)
    with pytest.raises(ValueError):
        s2.set("c", -1)
    (tmp_path / "subscriptions.json").write_bytes(b"{not json")
    with pytest.raises(ChangelogCorrupt, match=r"subscriptions\.json"):
        SubscriptionStore(str(tmp_path))


def test_subscription_store_keeps_filters_and_forgets_deleted_names(tmp_path: Path) -> None:
    s = SubscriptionStore(str(tmp_path))
    s.set("a", 10, ["public.acct", "s.*"])
    s.set("b", 3)
    s.set("a", 12)  # (None: the filter stays)
    assert SubscriptionStore(str(tmp_path)).tables() == {"a": ("public.acct", "s.*")}
    doc = json.loads((tmp_path / "subscriptions.json").read_bytes())
    assert doc == {"subscriptions": {"a": 12, "b": 3}, "tables": {"a": ["public.acct", "s.*"]}, "version": 1}
    s.set("a", 12, [])  # (empty: every table)
    assert "tables" not in json.loads((tmp_path / "subscriptions.json").read_bytes())
    s.set("b", 3, ["x.y"])
    assert s.delete("b") and not s.delete("b")
    s._check()
    again = SubscriptionStore(str(tmp_path))
    assert (again.all(), again.tables()) == ({"a": 12}, {})
    # a file of the first format (no "tables") reads as names without filters
    (tmp_path / "subscriptions.json").write_bytes(b'{"subscriptions": {"old": 5}, "version": 1}\n')
    old = SubscriptionStore(str(tmp_path))
    assert (old.all(), old.tables()) == ({"old": 5}, {})
    (tmp_path / "subscriptions.json").write_bytes(
        b'{"subscriptions": {}, "tables": {"x": ["a.b"]}, "version": 1}'
    )
    with pytest.raises(ChangelogCorrupt):  # (a filter of a name that has no csn)
        SubscriptionStore(str(tmp_path))
