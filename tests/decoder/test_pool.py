"""The decoder pool's plumbing (its decoding is tested end to end in tests/runtime/test_replay.py)."""

from __future__ import annotations

import fcntl
import os
import signal
import struct
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from csnd.core.errors import DecodeError, RemoteTraceback, WorkerError
from csnd.core.ids import Lsn
from csnd.decoder.change import DecodedItem, DecodedRun
from csnd.decoder.feed import BatchFeed, CutBatch
from csnd.decoder.pool import PIPE_BYTES, BatchEnd, DecoderPool, _recv_message, start_worker_server
from csnd.reader import pgoutput as p
from csnd.reader.events import Event, EventStream
from csnd.reader.recorded import RecordedSource
from csnd.reader.streamfile import StreamHeader, StreamWriter
from tests.fixtures.procs import parent_of, wait_until_gone


def _pipe_max() -> int:
    with open("/proc/sys/fs/pipe-max-size") as f:
        return int(f.read())


def test_pipes_to_and_from_workers_hold_whole_batches() -> None:
    """A worker must not wait in send() for the collector to come round (see `_widen_pipe`)."""
    pool = DecoderPool("dn1", 2, binary=True)
    try:
        ends = [c.fileno() for c in pool._out] + [q._reader.fileno() for q in pool._in]
        sizes = [fcntl.fcntl(fd, fcntl.F_GETPIPE_SZ) for fd in ends]
    finally:
        pool.close()
    # where the system caps pipes lower, they keep Linux's default of 64 kB
    expected = PIPE_BYTES if _pipe_max() >= PIPE_BYTES else 1 << 16
    assert sizes == [expected] * 4


def test_runs_of_raw_frames_decode_in_order_and_every_queue_reports_depth(tmp_path: Path) -> None:
    """Three transactions of raw change runs through two workers, a batch each, so they cross workers."""
    path = tmp_path / "s.pgstream"
    with StreamWriter(str(path), StreamHeader(node="dn1", binary=True, mode="single")) as w:
        w.write_frame(
            p.encode_xlogdata(
                0, 0, 1, p.encode_relation(16384, "public", "t", "d", [p.Column(1, "id", 23, -1)])
            )
        )
        lsn = 0x100
        for xid in (700, 701, 702):
            w.write_frame(p.encode_xlogdata(lsn, lsn, 1, p.encode_begin(lsn + 0x80, 5, xid)))
            for i in range(3):
                row = struct.pack("!i", xid * 10 + i)
                w.write_frame(p.encode_xlogdata(lsn + 8 * (i + 1), lsn, 1, p.encode_insert(16384, [row])))
            w.write_frame(p.encode_xlogdata(lsn + 0x80, lsn, 1, p.encode_commit(lsn + 0x80, lsn + 0x90, 5)))
            lsn += 0x100
    pool = DecoderPool("dn1", 2, binary=True, batch_changes=2)
    runs = [
        item
        for _, item in pool.run(RecordedSource(str(path)).events(raw_changes=True))
        if isinstance(item, DecodedRun)
    ]
    ids = [int(body.rsplit('"id": ', 1)[1].rstrip("}")) for run in runs for body in run.bodies]
    assert ids == [xid * 10 + i for xid in (700, 701, 702) for i in range(3)]
    assert [lsn for run in runs for lsn in run.lsns] == [
        0x100 + 0x100 * t + 8 * (i + 1) for t in range(3) for i in range(3)
    ]
    # a run is never split: each transaction's run of 3 passes the bound of 2 and ends its batch
    assert (pool.stats.changes, pool.stats.batches) == (9, 3)
    names = [q.name for q in pool.stats.queues]
    assert names == ["decoder-dn1-0-in", "decoder-dn1-1-in", "decoder-dn1-in-flight"]
    assert all(0 < q.peak <= q.capacity for q in pool.stats.queues), pool.stats.queues


@pytest.mark.parametrize("workers", [1, 2, 3])
def test_a_relation_that_cannot_be_decoded_at_the_end_fails_the_run(tmp_path: Path, workers: int) -> None:
    """A worker reports an error in place of its next result; at the end of the stream there is none.

    The last message is a Relation of a type binary mode cannot read, after
    every change: no batch goes to any worker after it, so only the pool's
    end-of-stream sync with every worker can read the error -- the run must
    fail with it (the worker's own traceback as its cause), not end as a
    success.
    """
    path = tmp_path / "s.pgstream"
    with StreamWriter(str(path), StreamHeader(node="dn1", binary=True, mode="single")) as w:
        w.write_frame(
            p.encode_xlogdata(
                0, 0, 1, p.encode_relation(16384, "public", "t", "d", [p.Column(1, "id", 23, -1)])
            )
        )
        for t, xid in enumerate((700, 701, 702)):
            lsn = 0x100 + 0x100 * t
            w.write_frame(p.encode_xlogdata(lsn, lsn, 1, p.encode_begin(lsn + 0x80, 5, xid)))
            w.write_frame(
                p.encode_xlogdata(lsn + 8, lsn, 1, p.encode_insert(16384, [struct.pack("!i", xid)]))
            )
            w.write_frame(p.encode_xlogdata(lsn + 0x80, lsn, 1, p.encode_commit(lsn + 0x80, lsn + 0x90, 5)))
        bad = [p.Column(1, "id", 23, -1), p.Column(0, "shape", 999_999, -1)]
        # (at a known LSN: one sent as 0/0, as the walsender sends it, waits for the table's next change)
        w.write_frame(p.encode_xlogdata(0x400, 0x400, 1, p.encode_relation(16384, "public", "t", "d", bad)))
    pool = DecoderPool("dn1", workers, binary=True, batch_changes=1)
    seen: list[DecodedItem | BatchEnd] = []
    with pytest.raises(DecodeError) as ei:
        for _, item in pool.run(RecordedSource(str(path)).events(raw_changes=True)):
            seen.append(item)
    assert sum(isinstance(i, DecodedRun) for i in seen) == 3  # every change came out before the error
    err = ei.value
    assert str(err).startswith('node dn1: relation public.t (relid 16384): column "shape" has type')
    assert "text mode" in str(err)
    assert isinstance(err.__cause__, RemoteTraceback) and "Traceback" in str(err.__cause__)
    assert "decode" in str(err.__cause__)  # where the worker raised it


def test_a_dead_fork_server_is_named_its_workers_leave_and_the_next_pool_gets_a_new_one() -> None:
    """What a long-running `csnd node` needs: this process lives on, so its death cannot be the signal."""
    pool = DecoderPool("dn1", 2, binary=True)
    pids = [proc.pid for proc in pool._procs if proc.pid is not None]
    assert len(pids) == 2
    server = parent_of(pids[0])
    os.kill(server, signal.SIGKILL)
    deadline = time.monotonic() + 60  # a ceiling, not a timing goal: a busy machine is slow
    with pytest.raises(WorkerError, match="the decoder fork server died"):
        while time.monotonic() < deadline:
            pool._check_all()
            time.sleep(0.05)
    pool.close()
    wait_until_gone(pids, 10, "workers outlived their fork server")
    again = DecoderPool("dn1", 1, binary=True)
    try:
        assert again._procs[0].pid is not None and parent_of(again._procs[0].pid) != server
        assert again._procs[0].is_alive()
    finally:
        again.close()


def _report_sigint(conn: Any) -> None:
    """A forked child's first line: is Ctrl-C ignored already?"""
    conn.send(signal.getsignal(signal.SIGINT) == signal.SIG_IGN)


def test_workers_start_with_ctrl_c_ignored_even_if_a_thread_started_the_fork_server() -> None:
    """From a thread the starter cannot set the server's handler; the server's first import does."""
    code = textwrap.dedent(
        """
        import threading
        from csnd.decoder.pool import start_worker_server
        from tests.decoder.test_pool import _report_sigint

        if __name__ == "__main__":
            box = []
            starter = threading.Thread(target=lambda: box.append(start_worker_server()))
            starter.start()
            starter.join()
            r, w = box[0].Pipe(duplex=False)
            child = box[0].Process(target=_report_sigint, args=(w,))
            child.start()
            print(r.recv())
            child.join(10)
        """
    )
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=root)
    assert proc.stdout.strip() == "True", proc.stderr


def _one_row_stream(path: Path, xids: tuple[int, ...]) -> list[Event]:
    with StreamWriter(str(path), StreamHeader(node="dn1", binary=True, mode="single")) as w:
        w.write_frame(
            p.encode_xlogdata(
                0, 0, 1, p.encode_relation(16384, "public", "t", "d", [p.Column(1, "id", 23, -1)])
            )
        )
        for t, xid in enumerate(xids):
            lsn = 0x100 + 0x100 * t
            w.write_frame(p.encode_xlogdata(lsn, lsn, 1, p.encode_begin(lsn + 0x80, 5, xid)))
            w.write_frame(
                p.encode_xlogdata(lsn + 8, lsn, 1, p.encode_insert(16384, [struct.pack("!i", xid)]))
            )
            w.write_frame(p.encode_xlogdata(lsn + 0x80, lsn, 1, p.encode_commit(lsn + 0x80, lsn + 0x90, 5)))
    return list(RecordedSource(str(path)).events(raw_changes=True))


@pytest.mark.parametrize("pause", ["drained", "keepalive", "keepalive from a source that reports pauses"])
def test_a_paused_stream_hands_on_the_batch_it_was_gathering(tmp_path: Path, pause: str) -> None:
    """A live source that pauses (its PauseListener told), or a keepalive while the decoders are idle,
    ends the batch: the transaction read so far comes out without waiting for more of the stream."""
    events = _one_row_stream(tmp_path / "s.pgstream", (700, 701))
    first, second = events[:4], events[4:]  # (Relation, Begin, Insert, Commit) and the next transaction
    pool = DecoderPool("dn1", 2, binary=True)  # (a batch bound far above this stream)
    resume = threading.Event()
    timed_out: list[bool] = []

    def stream() -> EventStream:
        yield from first
        if pause == "drained":
            pool.drained()  # (as LiveSource calls it: in the reader thread, between two events)
        else:
            yield first[-1][0], p.Keepalive(Lsn(first[-1][0]), 0, False)
        if not resume.wait(30):
            timed_out.append(True)
        yield from second

    commits = []
    # (without reported pauses a keepalive cuts while the decoders are idle)
    for _, item in pool.run(stream(), reports_pauses=pause != "keepalive"):
        if isinstance(item, p.Commit):
            commits.append(item)
            resume.set()  # (the first commit came out while the stream was paused)
    assert not timed_out, "the first transaction waited for the rest of the stream"
    assert len(commits) == 2


class _Cuts:
    """A `FeedOutlet` that keeps what a `BatchFeed` cuts: each batch's skeleton, as message type names."""

    def __init__(self) -> None:
        self.batches: list[list[str]] = []

    def put_work(self, worker: int, message: object) -> None:
        pass

    def put_skeleton(self, batch: CutBatch) -> None:
        self.batches.append([type(m).__name__ for _, m in batch.events])

    def batches_waiting(self) -> int:
        return 0

    def batches_decoding(self) -> int:
        return 0

    def stopping(self) -> bool:
        return False


@pytest.mark.parametrize("gated", [True, False], ids=["reports pauses", "recorded"])
def test_a_keepalive_alone_goes_on_with_what_follows_it(tmp_path: Path, gated: bool) -> None:
    """Live, the walsender sends a keepalive ahead of about every other lone transaction, in the same read:
    cut on its own, it cost the transaction behind it a pass through the pool and the sender.  From a source
    that reports its pauses it goes on in the transaction's batch, which the keepalive after it cuts; a lone
    one goes at the pause.  A recorded stream's keepalives cut as before."""
    relation, *txn = _one_row_stream(tmp_path / "s.pgstream", (700,))
    lsn = txn[-1][0]
    keepalive = (lsn, p.Keepalive(lsn, 0, False))
    out = _Cuts()
    BatchFeed(out, 1, 2048, False, gated).run([relation, keepalive, keepalive, *txn, keepalive])
    first = ["Relation", "Keepalive"]  # (a keepalive after something else cuts, as ever)
    txn_batch = ["Begin", "RunSlot", "Commit", "Keepalive"]
    if gated:
        assert out.batches == [first, ["Keepalive", *txn_batch]]
    else:
        assert out.batches == [first, ["Keepalive"], txn_batch]

    out.batches.clear()
    lone = BatchFeed(out, 1, 2048, False, gated)
    seen: list[list[list[str]]] = []

    def paused() -> EventStream:
        yield keepalive
        seen.append(list(out.batches))  # (what was cut before the pause)
        lone.cut_drained()  # (the pause, as LiveSource reports it: between two events)
        seen.append(list(out.batches))

    lone.run(paused())
    assert seen == ([[], [["Keepalive"]]] if gated else [[["Keepalive"]], [["Keepalive"]]])
    assert out.batches == [["Keepalive"]]


_HALF_SENT_PARENT = """
import os, signal, struct, sys
from csnd.decoder.pool import DecoderPool
pool = DecoderPool("dn1", 1, binary=True)
print(pool._procs[0].pid, flush=True)
sys.stdin.readline()  # (the test has the pid: now die halfway through sending a batch)
# A message's length says 1,000 bytes and only 10 follow, as when a parent is
# killed while its queue's feeder thread writes a batch.
os.write(pool._in[0]._writer.fileno(), struct.pack("!i", 1000) + b"x" * 10)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_worker_leaves_when_its_parent_dies_halfway_through_sending_a_batch() -> None:
    """The worker must not hold the inbox pipe's write end: the rest of the batch would never come, nor EOF."""
    parent = subprocess.Popen(
        [sys.executable, "-c", _HALF_SENT_PARENT],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert parent.stdout is not None and parent.stdin is not None
    worker = int(parent.stdout.readline())
    parent.stdin.write("\n")
    parent.stdin.flush()
    assert parent.wait(timeout=60) == -signal.SIGKILL
    wait_until_gone([worker], 30, "the worker waited for the rest of a batch its dead parent never sent")
    # (the worker and the fork server share the parent's stderr: end of file once both are gone)
    stderr = parent.stderr.read() if parent.stderr is not None else ""
    assert "Traceback" not in stderr, stderr


# --- reading results ------------------------------------------------------------------------


def _never_idle() -> None:
    raise AssertionError("waited for bytes that were already written")


@settings(max_examples=40, deadline=None)
@given(size=st.one_of(st.integers(0, 20_000), st.sampled_from([16_380, 16_384, 16_385, 3 * PIPE_BYTES])))
def test_a_result_reads_back_as_the_worker_sent_it(size: int) -> None:
    """Connection.send frames small and large messages differently (one write or two); both read back whole."""
    reader, writer = start_worker_server().Pipe(duplex=False)
    os.set_blocking(reader.fileno(), False)
    sent = ("ok", [b"r" * size, "line"])
    sender = threading.Thread(target=writer.send, args=(sent,))  # (larger than the pipe: it waits for us)
    sender.start()
    try:
        got = _recv_message(reader.fileno(), lambda: None if sender.is_alive() else _never_idle())
    finally:
        sender.join(timeout=30)
        reader.close()
        writer.close()
    assert got == sent


def test_a_result_cut_off_by_end_of_file_is_an_eof_error() -> None:
    reader, writer = start_worker_server().Pipe(duplex=False)
    os.set_blocking(reader.fileno(), False)
    os.write(writer.fileno(), struct.pack("!i", 1000) + b"x" * 10)
    writer.close()
    try:
        with pytest.raises(EOFError, match="after 10 of 1000 bytes"):
            _recv_message(reader.fileno(), _never_idle)
    finally:
        reader.close()


def test_a_result_half_written_when_the_fork_server_died_fails_the_run_instead_of_hanging() -> None:
    """A worker stopped halfway through writing a result larger than the pipe's free room never finishes it.

    `csnd replay` hung so when its workers were paused mid-write and their
    fork server killed: the collector waited, without a timeout, for the rest.
    Here the result pipe is one whose write end the test holds, so the half
    message is placed exactly.
    """
    pool = DecoderPool("dn1", 1, binary=True)
    reader, writer = start_worker_server().Pipe(duplex=False)
    os.set_blocking(reader.fileno(), os.get_blocking(pool._out[0].fileno()))  # as the pool set its own
    real_out, pool._out[0] = pool._out[0], reader
    worker = pool._procs[0].pid
    assert worker is not None
    outcome: list[BaseException | None] = []

    def collect() -> None:
        try:
            pool._result(0)
            outcome.append(None)
        except BaseException as e:
            outcome.append(e)

    try:
        os.write(writer.fileno(), struct.pack("!i", 1000) + b"x" * 10)
        os.kill(parent_of(worker), signal.SIGKILL)
        collector = threading.Thread(target=collect, daemon=True)
        collector.start()
        collector.join(timeout=60)  # a ceiling, not a timing goal
        assert not collector.is_alive(), "the collector still waits for the rest of a result that never comes"
        (err,) = outcome
        assert isinstance(err, WorkerError) and "the decoder fork server died" in str(err), err
    finally:
        pool.close()
        real_out.close()
        writer.close()
    wait_until_gone([worker], 30, "the worker outlived its fork server")
