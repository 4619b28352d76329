"""`csnd snapshot HOST:PORT TABLE...`: start an incremental snapshot in a running service and follow it.

The service reads each table in key-range chunks while the stream goes on
(docs/design.md section 5, "Incremental snapshots"); its rows enter the
changelog as `read` changes.  This command asks for it (StartSnapshot) and,
unless `--no-wait`, prints each table's progress on stderr until the job is
complete (exit 0) or failed (its error, exit 1).  Stopping this command
does not stop the snapshot: the service runs it, and resumes it after a
restart.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any, Final

# How long the service may take to answer once connected (nothing listening fails at once), and how long
# StartSnapshot may take (it connects to each node and checks the tables first).
CALL_TIMEOUT_S: Final = 10.0
START_TIMEOUT_S: Final = 60.0
# How often the progress is polled and printed.
POLL_S: Final = 2.0
# Rows a chunk at most: its rows are one changelog record, held in the service's memory.
MAX_CHUNK_ROWS: Final = 1_000_000


def _rows(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 1 <= value <= MAX_CHUNK_ROWS:
        raise argparse.ArgumentTypeError(
            f"expected a number of rows from 1 to {MAX_CHUNK_ROWS}, got {text!r}"
        )
    return value


def add_snapshot_parser(sub: Any) -> None:
    p = sub.add_parser(
        "snapshot",
        help="take an incremental snapshot of tables in a running service",
        description="Ask a running `csnd serve` to read TABLEs (schema.table) in key-range chunks and "
        "put their rows in its changelog as reads, between the stream's transactions, without stopping "
        "the stream or locking the tables (DBLog's watermarks: a row a transaction changes while its "
        "chunk is read comes from the stream instead). For a table added to the publication later, or "
        "one a consumer must read again. Each table needs a primary key; the node must run in single "
        "mode. Prints progress on stderr until the snapshot is complete; the service resumes it after "
        "a restart. HOST:PORT is the service's --listen address.",
    )
    p.add_argument("target", metavar="HOST:PORT", help="the service's address")
    p.add_argument("tables", nargs="+", metavar="TABLE", help="schema.table (double-quote a part with a dot)")
    p.add_argument("--node", default="", help="only this node (default: every node publishing the table)")
    p.add_argument(
        "--chunk-rows",
        type=_rows,
        default=0,
        metavar="N",
        help="rows a chunk (default: [snapshot] chunk_rows)",
    )
    p.add_argument("--no-wait", action="store_true", help="start it and return; Status shows its progress")
    p.add_argument("--token-file", metavar="F", help="file holding the service's bearer token")
    p.add_argument("--tls-ca", metavar="FILE", help="CA certificate (PEM) of a service that uses TLS")


def progress_line(status: Any) -> str:
    """One line of a job's progress (a `csnd.changefeed.v1.SnapshotStatus`)."""
    parts = []
    for t in status.tables:
        eta = f", eta {t.eta_seconds:.0f}s" if t.eta_seconds >= 0 and t.state != "done" else ""
        total = str(t.rows_estimated) if t.rows_estimated or t.state == "done" else "?"  # (0: unknown)
        parts.append(f"{t.node} {t.schema}.{t.table} {t.state} {t.rows}/{total} rows{eta}")
    return f"snapshot {status.job} {status.state}: " + "; ".join(parts)


def cmd_snapshot(args: argparse.Namespace) -> int:
    import grpc

    from csnd.consumers.subscriptions_cmd import operator_stub
    from csnd.core.errors import SnapshotError
    from csnd.proto.changefeed.v1 import changefeed_pb2 as pb

    with operator_stub(args, CALL_TIMEOUT_S) as (stub, kw, address):
        request = pb.StartSnapshotRequest(tables=args.tables, node=args.node, chunk_rows=args.chunk_rows)
        try:
            stub.Status(pb.StatusRequest(), **kw)  # (there at all? a wrong address fails in seconds)
            status = stub.StartSnapshot(request, **{**kw, "timeout": START_TIMEOUT_S})
        except grpc.RpcError as e:
            if e.code() == grpc.StatusCode.INVALID_ARGUMENT:
                raise SnapshotError(f"cannot snapshot {', '.join(args.tables)}: {e.details()}") from None
            raise _error(e, address) from None
        print(progress_line(status), file=sys.stderr, flush=True)
        if args.no_wait:
            return 0
        job, last = status.job, ""
        while True:
            time.sleep(POLL_S)
            try:
                status = stub.Status(pb.StatusRequest(), **kw).incremental
            except grpc.RpcError as e:
                if e.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                    continue  # (a restarting service resumes the job: follow it there)
                raise _error(e, address) from None
            if status.job != job:
                if job in status.queued:  # (queued behind another job: its turn comes)
                    continue
                outcome = status.ended.get(job)
                if outcome == "complete":
                    print(f"snapshot {job} complete", file=sys.stderr, flush=True)
                    return 0
                if outcome:
                    raise SnapshotError(f"snapshot {job} {outcome}")
                raise SnapshotError(f"the service no longer shows snapshot {job}")
            line = progress_line(status)
            if line != last:
                print(line, file=sys.stderr, flush=True)
                last = line
            if status.state == "complete":
                return 0
            if status.state == "failed":
                raise SnapshotError(f"snapshot {job} failed: {status.error}")


def _error(e: Any, address: str) -> Exception:
    """The csnd error for a failed call: one line naming the service."""
    import grpc

    from csnd.consumers.subscriptions_cmd import rpc_error
    from csnd.core.errors import SnapshotError

    what = "cannot take the snapshot"
    return rpc_error(
        e,
        address,
        what,
        {grpc.StatusCode.FAILED_PRECONDITION: lambda text: SnapshotError(f"{what} at {address}: {text}")},
        unimplemented="takes no incremental snapshots",
    )
