"""Fetch in Arrow: the rows the service builds once equal the rows built from the lines, for any reads.

The oracle is the lines path: the transactions `Changelog.read` returns,
cut by the subscriber's TableFilter as a line subscriber gets them, and
flattened by the Spark source's RowBuilder (itself tested against a
brute-force flattening in tests/consumers/test_spark_rows.py).
"""

from __future__ import annotations

import json
import os
import tempfile
import threading
from typing import Any

import grpc
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from csnd.changelog import Changelog
from csnd.consumers.client import WholeLines
from csnd.consumers.spark import feed
from csnd.consumers.spark.columns import flatten, source_rows, wire_rows
from csnd.consumers.spark.feed import MappedSpans
from csnd.consumers.spark.options import parse_options
from csnd.consumers.spark.source import CsnRange, read_partition
from csnd.core.errors import ChangefeedError, CsnOutOfRange
from csnd.core.hostid import host_id
from csnd.proto.changefeed.v1 import changefeed_pb2 as pb
from csnd.proto.changefeed.v1 import changefeed_pb2_grpc as pb_grpc
from csnd.service import FeedSettings, arrow_rows
from csnd.service.arrow_rows import RowBlocks, keep_tables, open_message
from csnd.service.filtering import TableFilter
from tests.service.feedkit import TABLES, fill, line, serve

FILTERS = [(), ("public.acct",), ("public.*",), ('odd."a.b"', "sales.acct"), ("nobody.none",)]


def expected(log: Changelog, after: int, until: int, specs: tuple[str, ...]) -> pa.Table:
    filt = TableFilter(specs)
    kept = [(csn, k) for csn, line_ in log.read(after, until) if (k := filt.keep(line_)) is not None]
    return pa.Table.from_batches([flatten(kept)])


def got(blocks: RowBlocks, after: int, until: int, specs: tuple[str, ...], files: bool = False) -> pa.Table:
    """The read's rows; every message holds whole transactions (no csn is in two of them)."""
    filt = TableFilter(specs)
    batches = [opened(m, filt) for m in blocks.messages(after, until, filt, files=files)]
    batches = [b for b in batches if b.num_rows]
    seen: set[int] = set()
    for b in batches:
        csns = set(b.column("csn").to_pylist())
        assert not csns & seen, f"a transaction's rows in two messages: {sorted(csns & seen)}"
        seen |= csns
    return pa.Table.from_batches(batches, schema=flatten([]).schema)


def opened(message: arrow_rows.Message, filt: TableFilter) -> pa.RecordBatch:
    """A message's rows as a reader gets them: a FileSpan's are every table's, kept as the executor keeps them."""
    if isinstance(message, bytes):
        rows = source_rows(open_message(message))  # (as an executor takes them: _ipc_batch)
        assert rows is not None
        return rows
    batch = MappedSpans(parse_options({"target": "localhost:1"}, stream=False)).batch(as_pb(message))
    assert batch is not None, message
    return keep_tables(batch, filt)


def test_rows_go_out_with_every_column_nullable_as_services_sent_them_before() -> None:
    # (a Spark source of the version before the NOT NULL columns requires exactly this schema)
    before = pa.schema(
        [
            ("csn", pa.int64()), ("gid", pa.string()), ("commit_time", pa.timestamp("us", tz="UTC")),
            ("seq", pa.int32()), ("node", pa.string()), ("xid", pa.int64()), ("cid", pa.int32()),
            ("lsn", pa.string()), ("op", pa.string()), ("schema", pa.string()), ("table", pa.string()),
            ("old", pa.string()), ("new", pa.string()), ("unchanged", pa.list_(pa.string())),
            ("key", pa.list_(pa.string())),
        ]
    )  # fmt: skip
    rows = flatten([(1, line(1, [TABLES[0], TABLES[1]]))])
    sent = open_message(arrow_rows.to_message(rows))
    assert sent.schema.equals(before) and not rows.schema.equals(before)
    assert source_rows(sent) == rows  # (the executor's: the source's flags again)
    # the rows of an incremental snapshot's chunk need the `snapshot` column appended since
    chunk = json.loads(line(2, [TABLES[0]]))
    chunk["snapshot"] = {"node": "dn1", "schema": "public", "table": "acct", "incremental": "j",
                         "chunk": 1, "last": True, "since": 1, "rows": 1, "left_out": 0}  # fmt: skip
    rows = flatten([(1, line(1, [TABLES[0]])), (2, json.dumps(chunk).encode())])
    sent = open_message(arrow_rows.to_message(rows))
    assert sent.schema.names == [*before.names, "snapshot"] and all(f.nullable for f in sent.schema)
    assert source_rows(sent) == rows and rows.column("snapshot").null_count == 1


def test_rows_an_executor_cannot_trust_are_one_clear_error() -> None:
    opts = parse_options({"target": "localhost:1"}, stream=False)
    rows = flatten([(1, line(1, [TABLES[0], TABLES[1]]))])
    sent = arrow_rows.to_message(rows)
    assert feed._ipc_batch(opts, 0, 1, sent) == rows  # (the source's flags again)
    lsn = rows.schema.get_field_index("lsn")
    holed = wire_rows(rows)
    holed = holed.set_column(lsn, holed.schema.field(lsn), pa.array(["0/1", None], pa.string()))
    with pytest.raises(ChangefeedError, match=r"csn range \(0, 1\] .*\(nulls in lsn, which are never null\)"):
        feed._ipc_batch(opts, 0, 1, arrow_rows.to_message(holed))
    other = rows.drop_columns(["key"])
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, other.schema) as writer:
        writer.write_batch(other)
    with pytest.raises(
        ChangefeedError, match=r"\(columns \['csn', .*'unchanged', 'snapshot'\]\); are the service"
    ):
        feed._ipc_batch(opts, 0, 1, sink.getvalue().to_pybytes())


def as_pb(span: arrow_rows.FileSpan) -> pb.ArrowFile:
    return pb.ArrowFile(**span._asdict())


reads = st.lists(
    st.tuples(st.integers(0, 60), st.integers(0, 60), st.sampled_from(FILTERS)), min_size=1, max_size=8
)
txn_shapes = st.lists(st.lists(st.sampled_from(TABLES), max_size=6), min_size=1, max_size=50)


@settings(max_examples=60, deadline=None)
@given(
    shapes=txn_shapes,
    gaps=st.lists(st.integers(1, 3), min_size=50, max_size=50),
    reads=reads,
    block_rows=st.integers(1, 40),
    message_bytes=st.integers(1, 6000),
    budget=st.sampled_from([1, 20_000, 1 << 30]),
    files_budget=st.sampled_from([None, 1, 30_000, 1 << 30]),
)
@example(  # a transaction's kept rows across two messages: seq goes on counting
    shapes=[[TABLES[0], TABLES[1], TABLES[0], TABLES[0]]],
    gaps=[1] * 50,
    reads=[(0, 0, ("public.acct",))],
    block_rows=40,
    message_bytes=1,
    budget=1 << 30,
    files_budget=None,
)
def test_arrow_rows_equal_the_rows_of_the_lines(
    shapes: list[list[tuple[str, str]]],
    gaps: list[int],
    reads: list[tuple[int, int, tuple[str, ...]]],
    block_rows: int,
    message_bytes: int,
    budget: int,
    files_budget: int | None,
) -> None:
    """With files_budget, every read is of files where the service has them (and bytes elsewhere)."""
    with tempfile.TemporaryDirectory() as d:
        log = Changelog(d)
        files_dir = os.path.join(d, "arrow-files") if files_budget is not None else None
        try:
            csn = 0
            for shape, gap in zip(shapes, gaps, strict=False):
                csn += gap
                log.append(csn, line(csn, shape, gid=f"g-{csn}"))
            log.sync()
            blocks = RowBlocks(
                log,
                message_bytes,
                block_rows=block_rows,
                budget_bytes=budget,
                files_dir=files_dir,
                files_budget_bytes=files_budget or 0,
            )
            for a, b, specs in reads:
                after, until = min(a, b), max(a, b) or log.visible_csn
                read = got(blocks, after, until, specs, files=files_dir is not None)
                assert read.equals(expected(log, after, until, specs)), (after, until, specs)
            assert blocks.kept_bytes <= budget
            if files_dir is not None:
                assert files_budget is not None and blocks.files_bytes <= files_budget
                on_disk = sum(e.stat().st_size for e in os.scandir(files_dir))
                assert on_disk == blocks.files_bytes  # (a forgotten or dropped block's file is gone)
        finally:
            log.close()


def test_a_range_is_built_once_and_only_what_is_durable() -> None:
    with tempfile.TemporaryDirectory() as d:
        log = Changelog(d)
        try:
            fill(log, range(1, 101))
            blocks = RowBlocks(log, 1 << 20, block_rows=50)
            whole = got(blocks, 0, 100, ())
            built = blocks.built_rows
            assert built == whole.num_rows > 0
            assert got(blocks, 10, 90, ()).equals(expected(log, 10, 90, ()))
            assert got(blocks, 0, 100, ("public.acct",)).equals(expected(log, 0, 100, ("public.acct",)))
            assert blocks.built_rows == built  # (every read after the first is of kept blocks)
            # Past the durable end nothing is built: a later transaction is not left out of a block.
            assert got(blocks, 90, 200, ()).equals(expected(log, 90, 100, ()))
            log.append(150, line(150, [TABLES[0]]))
            log.sync()
            assert got(blocks, 90, 200, ()).equals(expected(log, 90, 150, ()))
        finally:
            log.close()


def test_retention_is_out_of_range_as_for_lines() -> None:
    with tempfile.TemporaryDirectory() as d:
        log = Changelog(d, segment_bytes=4096, retention_bytes=8192)
        try:
            fill(log, range(1, 201))
            blocks = RowBlocks(log, 1 << 20, block_rows=7)
            got(blocks, 0, 200, ())
            log.apply_retention()
            assert log.oldest_csn > 2
            with pytest.raises(CsnOutOfRange):
                list(blocks.messages(1, 200, TableFilter()))
            assert got(blocks, 0, 200, ()).equals(expected(log, 0, 200, ()))
        finally:
            log.close()


def test_keep_tables_renumbers_seq_per_transaction() -> None:
    batch = flatten([(1, line(1, [TABLES[1], TABLES[0], TABLES[2], TABLES[0]])), (2, line(2, [TABLES[0]]))])
    kept = keep_tables(batch, TableFilter(["public.acct"]))
    assert kept.column("csn").to_pylist() == [1, 1, 2]
    assert kept.column("seq").to_pylist() == [0, 1, 0]
    assert kept.column("cid").to_pylist() == [1, 3, 0]
    # A transaction whose kept rows began in the batch before goes on from there.
    assert keep_tables(batch.slice(3), TableFilter(["public.acct"]), (1, 0)).column("seq").to_pylist() == [
        1,
        0,
    ]


def _fetch(address: str, **kw: Any) -> list[pb.FetchResponse]:
    with grpc.insecure_channel(address) as channel:
        return list(pb_grpc.ChangefeedStub(channel).Fetch(pb.FetchRequest(**kw)))


def test_fetch_over_grpc_and_the_spark_source_take_the_service_rows(tmp_path: Any) -> None:
    log = Changelog(os.path.join(str(tmp_path), "log"))
    fill(log, range(1, 301))
    srv = serve(log)
    try:
        msgs = _fetch(srv.address, after_csn=20, until_csn=250, tables=["public.*"], format="arrow")
        assert msgs and all(m.arrow and not m.batch.transactions for m in msgs)
        rows = pa.Table.from_batches([source_rows(open_message(m.arrow)) for m in msgs])
        assert rows.equals(expected(log, 20, 250, ("public.*",)))
        for built_by in ("service", "executor"):
            opts = parse_options(
                {"target": srv.address, "tables": "sales.acct", "rowsBuiltBy": built_by}, stream=False
            )
            table = pa.Table.from_batches(list(read_partition(opts, CsnRange(3, 300))))
            assert table.equals(expected(log, 3, 300, ("sales.acct",))), built_by
        with pytest.raises(grpc.RpcError) as e:
            _fetch(srv.address, format="csv")
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "unknown fetch format 'csv'" in (e.value.details() or "")
    finally:
        srv.stop()
        log.close()


def test_readers_at_once_with_a_small_budget_see_the_same_rows() -> None:
    with tempfile.TemporaryDirectory() as d:
        log = Changelog(d)
        try:
            fill(log, range(1, 401))
            blocks = RowBlocks(log, 3000, block_rows=13, budget_bytes=30_000)
            ranges = [(0, 400, ()), (50, 350, ("public.acct",)), (199, 400, ("sales.*",)), (0, 222, ())]
            want = {r: expected(log, *r) for r in ranges}
            failures: list[str] = []

            def reader(k: int) -> None:
                for i in range(12):
                    r = ranges[(k + i) % len(ranges)]
                    if not got(blocks, *r).equals(want[r]):
                        failures.append(f"reader {k}, range {r}")

            threads = [threading.Thread(target=reader, args=(k,)) for k in range(4)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            assert failures == []
            assert blocks.kept_bytes <= 30_000
        finally:
            log.close()


def test_rows_held_back_from_readers_are_not_built() -> None:
    with tempfile.TemporaryDirectory() as d:
        log = Changelog(d)
        try:
            fill(log, range(1, 51))
            log.hold_readers(at=20)
            blocks = RowBlocks(log, 1 << 20)
            assert got(blocks, 0, 50, ()).equals(expected(log, 0, 20, ()))
            log.release_readers()
            assert got(blocks, 0, 50, ()).equals(expected(log, 0, 50, ()))
        finally:
            log.close()


def test_a_line_that_is_not_utf8_names_its_csn() -> None:
    bad = line(7, [TABLES[0]]).replace(b'"f": 1.5e-07', b'"f": "\xff"')
    with pytest.raises(ValueError, match="csn 7"):
        flatten([(6, line(6, [TABLES[1]])), (7, bad)])


def test_a_commit_time_that_is_not_a_time_names_its_csn() -> None:
    bad = line(8, [TABLES[0]]).replace(b"2026-11-22T10", b"2026-99-22T10")
    with pytest.raises(ValueError, match="csn 8: commit_time '2026-99-22"):
        flatten([(6, line(6, [TABLES[1]])), (8, bad)])


def test_pieces_are_joined_and_a_piece_of_another_csn_is_refused() -> None:
    batch = pb.TransactionBatch(
        transactions=[
            pb.Transaction(csn=3, line=b"whole"),
            pb.Transaction(csn=4, line=b"a", more=True),
            pb.Transaction(csn=4, line=b"b", more=True),
        ]
    )
    whole = WholeLines("the service")
    assert list(whole.of(batch)) == [(3, b"whole")]
    assert list(whole.of(pb.TransactionBatch(transactions=[pb.Transaction(csn=4, line=b"c")]))) == [
        (4, b"abc")
    ]
    assert (
        list(whole.of(pb.TransactionBatch(transactions=[pb.Transaction(csn=5, line=b"x", more=True)]))) == []
    )
    with pytest.raises(ChangefeedError, match="the service sent csn 6 before the last piece of csn 5"):
        list(whole.of(pb.TransactionBatch(transactions=[pb.Transaction(csn=6, line=b"y")])))


def test_an_unknown_format_is_refused_even_from_an_empty_changelog(tmp_path: Any) -> None:
    log = Changelog(os.path.join(str(tmp_path), "log"))
    srv = serve(log)
    try:
        with pytest.raises(grpc.RpcError) as e:
            _fetch(srv.address, format="csv")
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    finally:
        srv.stop()
        log.close()


def test_a_transaction_too_large_for_arrow_is_refused_and_read_as_lines(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(arrow_rows, "RECORD_LIMIT", 4000)
    log = Changelog(os.path.join(str(tmp_path), "log"))
    fill(log, range(1, 11))
    log.append(11, line(11, [TABLES[0]] * 40))  # (about 9 kB: in pieces on a 2,000-byte batch bound)
    fill(log, range(12, 21))
    srv = serve(log, settings=FeedSettings(max_batch_bytes=2000))
    try:
        with pytest.raises(grpc.RpcError) as e:
            _fetch(srv.address, format="arrow")
        assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "transaction csn 11 is" in (e.value.details() or "")
        assert "rowsBuiltBy=executor" in (e.value.details() or "")
        opts = parse_options({"target": srv.address, "rowsBuiltBy": "executor"}, stream=False)
        table = pa.Table.from_batches(list(read_partition(opts, CsnRange(0, 20))))
        assert table.equals(expected(log, 0, 20, ()))
        assert table.filter(pc.equal(table.column("csn"), 11)).num_rows == 40
    finally:
        srv.stop()
        log.close()


def _spans(address: str, after: int, until: int) -> list[pb.ArrowFile]:
    msgs = _fetch(address, after_csn=after, until_csn=until, format="arrow", client_host=host_id())
    return [m.arrow_file for m in msgs if m.HasField("arrow_file")]


def _read(address: str, lo: int, hi: int, **options: str) -> pa.Table:
    opts = parse_options({"target": address, **options}, stream=False)
    return pa.Table.from_batches(list(read_partition(opts, CsnRange(lo, hi))), schema=flatten([]).schema)


def test_a_reader_on_the_services_host_maps_the_rows_from_files(tmp_path: Any) -> None:
    log = Changelog(os.path.join(str(tmp_path), "log"))
    files_dir = os.path.join(log.directory, "arrow-files")
    os.makedirs(files_dir)
    stale = os.path.join(files_dir, "1-9-abcd.arrows")
    mine = os.path.join(files_dir, "notes.txt")  # (not ours: left alone)
    for path in (stale, mine):
        with open(path, "w") as f:
            f.write("x")
    fill(log, range(1, 301))
    srv = serve(log, settings=FeedSettings(arrow_message_bytes=4000))
    try:
        want = expected(log, 0, 300, ())
        assert _read(srv.address, 0, 300, localFiles="false").equals(want)  # (builds and keeps the rows)
        spans = _spans(srv.address, 0, 300)
        assert len(spans) > 3 and not os.path.exists(stale) and os.path.exists(mine)
        assert {os.path.dirname(s.path) for s in spans} == {files_dir}
        assert all(os.stat(s.path).st_mode & 0o077 == 0 for s in spans)  # (the changelog's rows: ours only)
        assert [s.after_csn for s in spans] == sorted({s.after_csn for s in spans})
        assert _read(srv.address, 0, 300).equals(want)
        assert _read(srv.address, 17, 250).equals(expected(log, 17, 250, ()))
        # With tables, the whole messages are still files (of every table's rows): the reader keeps its own.
        msgs = _fetch(srv.address, tables=["public.acct"], format="arrow", client_host=host_id())
        assert msgs and all(m.HasField("arrow_file") for m in msgs)
        for specs in (("public.acct",), ("sales.*", 'odd."a.b"'), ("nobody.none",)):
            read = _read(srv.address, 11, 290, tables=",".join(specs))
            assert read.equals(expected(log, 11, 290, specs)), specs
        # A client that names no host, or another one, gets bytes (it could not read the files).
        for other in ("", "another-host-boot-id"):
            msgs = _fetch(srv.address, format="arrow", client_host=other)
            assert msgs and not any(m.HasField("arrow_file") for m in msgs)
    finally:
        srv.stop()
        log.close()


@pytest.mark.parametrize("spoil", ["removed", "a-directory-here", "truncated", "another-range"])
def test_a_file_that_cannot_be_read_here_is_fetched_as_bytes_from_where_it_begins(
    tmp_path: Any, spoil: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The second block's file is spoiled: the rows before it come from files, the rest as bytes, each once."""
    monkeypatch.setattr(arrow_rows, "BLOCK_ROWS", 150)
    log = Changelog(os.path.join(str(tmp_path), "log"))
    fill(log, range(1, 301))
    srv = serve(log, settings=FeedSettings(arrow_message_bytes=4000))
    try:
        want = expected(log, 0, 300, ())
        _read(srv.address, 0, 300)  # (builds the rows and writes the files)
        spans = _spans(srv.address, 0, 300)
        paths = list(dict.fromkeys(s.path for s in spans))
        assert len(paths) >= 2, "the rows fit one block; make the blocks smaller"
        victim = paths[1]
        if spoil == "removed":
            os.unlink(victim)
        elif spoil == "a-directory-here":  # (what another host may have at that path)
            os.unlink(victim)
            os.mkdir(victim)
        elif spoil == "truncated":
            os.truncate(victim, os.path.getsize(victim) // 2)
        else:  # (the file holds other rows than the span says: its first message moved on)
            with open(victim, "r+b") as f:
                data = f.read()
                f.seek(0)
                f.write(data[spans[[s.path for s in spans].index(victim) + 1].offset :])
        with caplog.at_level("INFO", logger="csnd.consumers.spark"):
            assert _read(srv.address, 0, 300).equals(want)
            # With tables: the spans before it kept here, the rest filtered by the service.
            assert _read(srv.address, 0, 300, tables="public.acct").equals(
                expected(log, 0, 300, ("public.acct",))
            )
        assert victim in caplog.text
    finally:
        srv.stop()
        log.close()


def test_files_go_with_their_blocks_and_stay_within_their_budget() -> None:
    with tempfile.TemporaryDirectory() as d:
        log = Changelog(d)
        try:
            fill(log, range(1, 401))
            files_dir = os.path.join(d, "arrow-files")
            blocks = RowBlocks(log, 2000, block_rows=40, files_dir=files_dir, files_budget_bytes=60_000)
            first = [m for m in blocks.messages(0, 400, TableFilter(), files=True)]
            assert any(isinstance(m, arrow_rows.FileSpan) for m in first)
            assert 0 < blocks.files_bytes <= 60_000
            assert sum(e.stat().st_size for e in os.scandir(files_dir)) == blocks.files_bytes
            # Every whole message came from a file; the least recently read lost theirs first.
            assert all(isinstance(m, arrow_rows.FileSpan) for m in first)
            paths = list(dict.fromkeys(m.path for m in first if isinstance(m, arrow_rows.FileSpan)))
            left = [os.path.exists(p) for p in paths]
            assert left[-1] and not left[0] and left == sorted(left)
            # A block larger than the whole budget has no file: its messages go as bytes.
            small = RowBlocks(log, 2000, block_rows=400, files_dir=files_dir, files_budget_bytes=100)
            assert all(isinstance(m, bytes) for m in small.messages(0, 400, TableFilter(), files=True))
            assert os.listdir(files_dir) == []  # (the second RowBlocks cleared the first's files)
            # A block retention drops takes its file with it.
            blocks = RowBlocks(log, 2000, block_rows=40, files_dir=files_dir)
            list(blocks.messages(0, 400, TableFilter(), files=True))
            before = len(os.listdir(files_dir))
            blocks._drop_before(200)
            assert 0 < len(os.listdir(files_dir)) < before
            assert sum(e.stat().st_size for e in os.scandir(files_dir)) == blocks.files_bytes
        finally:
            log.close()


def test_a_file_that_cannot_be_written_leaves_the_rows_as_bytes(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A full disk: each block's file is tried once, its rows go as bytes, and the read is whole."""
    tried: list[int] = []

    def full(directory: str, block: arrow_rows.Block, budget: int) -> arrow_rows.BlockFile:
        tried.append(block.after)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(arrow_rows.BlockFile, "write", full)
    with tempfile.TemporaryDirectory() as d:
        log = Changelog(d)
        try:
            fill(log, range(1, 201))
            blocks = RowBlocks(log, 2000, block_rows=40, files_dir=os.path.join(d, "arrow-files"))
            for _ in range(2):
                with caplog.at_level("WARNING", logger="csnd.changefeed"):
                    assert got(blocks, 0, 200, (), files=True).equals(expected(log, 0, 200, ()))
            assert tried and len(tried) == len(set(tried))  # (once a block)
            assert "No space left on device" in caplog.text
            assert blocks.files_bytes == 0
        finally:
            log.close()


def test_no_files_when_their_budget_is_zero(tmp_path: Any) -> None:
    """--arrow-files-bytes 0: every reader gets bytes, and the service writes no file."""
    log = Changelog(os.path.join(str(tmp_path), "log"))
    fill(log, range(1, 101))
    srv = serve(log, settings=FeedSettings(arrow_files_bytes=0))
    try:
        msgs = _fetch(srv.address, format="arrow", client_host=host_id())
        assert msgs and all(m.arrow and not m.HasField("arrow_file") for m in msgs)
        assert _read(srv.address, 0, 100).equals(expected(log, 0, 100, ()))
        assert not os.path.exists(os.path.join(log.directory, "arrow-files"))
    finally:
        srv.stop()
        log.close()


def test_a_file_cut_short_by_a_failing_disk_leaves_nothing_behind(monkeypatch: pytest.MonkeyPatch) -> None:
    """A write that fails at its end (here the rename; a full disk shows at the close) removes its
    temporary file, and the block, marked as having none, is not tried again when files are evicted."""

    def refused(src: str, dst: str) -> None:
        raise OSError(28, "No space left on device")

    with tempfile.TemporaryDirectory() as d:
        log = Changelog(d)
        try:
            fill(log, range(1, 201))
            files_dir = os.path.join(d, "arrow-files")
            blocks = RowBlocks(log, 2000, block_rows=40, files_dir=files_dir, files_budget_bytes=40_000)
            with monkeypatch.context() as m:
                m.setattr(os, "rename", refused)
                assert got(blocks, 0, 40, (), files=True).equals(expected(log, 0, 40, ()))
            assert os.listdir(files_dir) == []
            tried: list[int] = []
            write = arrow_rows.BlockFile.write

            def counted(directory: str, block: arrow_rows.Block, budget: int) -> arrow_rows.BlockFile:
                tried.append(block.after)
                return write(directory, block, budget)

            monkeypatch.setattr(arrow_rows.BlockFile, "write", staticmethod(counted))
            for _ in range(3):  # (the other blocks' files evict one another; the marked one stays marked)
                assert got(blocks, 0, 200, (), files=True).equals(expected(log, 0, 200, ()))
            assert 0 not in tried
            assert sum(e.stat().st_size for e in os.scandir(files_dir)) == blocks.files_bytes <= 40_000
        finally:
            log.close()
