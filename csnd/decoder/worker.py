"""The body of one decoder process (see `decoder.pool`).

Kept apart from the pool so that the fork server the workers come from
(`decoder.pool.start_worker_server`) imports what decoding needs and little
else, once, before it forks them.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import signal
import traceback
from typing import Any

from csnd.core.errors import CsndError, InternalError
from csnd.core.lines import node_key, one_change_line, single_node_line
from csnd.decoder.messages import (
    LINE,
    RUN,
    TRUNCATE,
    WHOLE,
    ApplyMeta,
    DecodeBatch,
    Decoded,
    Failed,
    FromWorker,
    Stop,
    Sync,
    ToWorker,
    Wire,
)
from csnd.decoder.relations import RelationCache
from csnd.decoder.rowreader import one_change_line_c
from csnd.decoder.rows import decode_change, row_change_body
from csnd.reader.pgoutput import Truncate, iter_change_frames, one_change_frame

# How often an idle worker checks that its parent is still there.
PARENT_POLL_S = 1.0


def decode_batch(batch: list[Wire], cache: RelationCache, binary: bool, node: str = "") -> list[Any]:
    """The bodies of a batch's entries (`decoder.messages.Wire`), in order: one str per change, a list per Truncate.

    Only the bodies go back: the pool still holds each change's LSN, xid and
    kind, so sending them back would only cost pickling.  A whole
    transaction's mark, `(n, LINE, xid, commit_lsn, commit_time)` after its
    changes, turns the last n bodies into its transaction line
    (`decoder.change.WholeTxn`; single-node mode: the commit LSN is the CSN,
    and with no cid marker every change has cid 0); `(commit_lsn, WHOLE, xid,
    commit_time, blob)` is the same for a transaction whose changes are all
    in `blob`, in one tuple.
    """
    out: list[Any] = []
    append = out.append
    key = node_key(node)
    # (Any: the entry's layout follows its tag, which mypy cannot narrow a tuple's fields on)
    entry: Any
    for entry in batch:
        lsn, kind, xid, a, b = entry
        if kind == RUN:  # a run of change frames (`reader.pgoutput.ChangeFrames`): a is (in_stream, head)
            for lsn_i, kind_i, xid_i, relid, data in iter_change_frames(b, *a):
                append(row_change_body(kind_i, xid_i, relid, data, lsn_i, cache, binary))
        elif kind == WHOLE:  # a scanned whole transaction: b its run's frames (4-byte head), then its line
            one = one_change_frame(b)
            if one is not None:  # (a one-row transaction: no loop, one format)
                start, kind_i, relid, data_at = one
                body = row_change_body(kind_i, None, relid, b[data_at:], start, cache, binary)
                # (compiled, unless a part is not ASCII or the time is out of range: then the twin)
                line = None if one_change_line_c is None else one_change_line_c(key, lsn, xid, a, body)
                append(one_change_line(node, lsn, xid, a, body) if line is None else line)
                continue
            bodies = [
                row_change_body(kind_i, xid_i, relid, data, lsn_i, cache, binary)
                for lsn_i, kind_i, xid_i, relid, data in iter_change_frames(b, False)
            ]
            append(single_node_line(node, lsn, None, xid, lsn, a, 0, bodies))
        elif kind == LINE:
            bodies = out[-lsn:]
            del out[-lsn:]
            append(single_node_line(node, a, None, xid, a, b, 0, bodies))
        elif kind == TRUNCATE:
            append([r.body for r in decode_change(Truncate(xid, a, b), lsn, cache, binary)])
        else:
            append(row_change_body(kind, xid, a, b, lsn, cache, binary))
    return out


def worker_main(
    index: int,
    node: str,
    binary: bool,
    inbox: Any,
    outbox: Any,
    enums: list[tuple[int, int]] | None = None,
    types: list[tuple[int, str, int, int]] | None = None,
) -> None:
    # Ctrl-C goes to the whole process group; the parent decides how to stop.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    cache = RelationCache(binary=binary)
    for type_oid, array_oid in enums or ():
        cache.declare_enum(type_oid, array_oid)
    cache.declare_types(types or ())
    # After an error the worker decodes nothing more: it reported the error
    # (the pool reads it in place of the next result it expects from this
    # worker, or at the end-of-stream sync) and waits to be stopped.
    failed: BaseException | None = None
    # The process that started the pool (not our OS parent, the fork server):
    # its sentinel pipe reaches end-of-file when it dies, however it died.
    # And the fork server itself: if it dies, the pool can no longer see
    # whether we live, and stops, so we leave too.
    parent = mp.parent_process()
    server = os.getppid()
    # A Queue travels with both ends of its pipe.  Our copy of the write end
    # would keep the pipe open after the parent dies: a parent killed halfway
    # through putting a batch would leave us waiting forever for the rest of
    # it.  Closed, that read ends with EOFError instead (as the results pipe
    # does for the parent: DecoderPool).
    inbox._writer.close()
    while True:
        try:
            item = inbox.get(timeout=PARENT_POLL_S)
        except queue.Empty:
            if (parent is not None and not parent.is_alive()) or os.getppid() != server:
                return  # the parent was killed (SIGKILL runs no cleanup), or the server: do not linger
            continue
        except (EOFError, OSError):
            return  # the parent died with a batch half sent: there is no one to decode for
        message: ToWorker = item
        if type(message) is Stop:
            return
        if failed is not None:
            continue  # already reported; wait for the parent to stop us
        reply: FromWorker
        try:
            if type(message) is ApplyMeta:
                cache.apply(message.message, message.lsn)
                continue
            if type(message) is Sync:  # the end of the stream: every meta message before it is applied
                reply = Decoded([])
            else:
                assert type(message) is DecodeBatch
                reply = Decoded(decode_batch(message.wires, cache, binary, node))
        except CsndError as e:
            failed = e.where(node=node)
            reply = Failed(failed, traceback.format_exc())
        except Exception as e:  # (a bug: its traceback travels as the error's __cause__)
            failed = InternalError(f"decoder worker {index} crashed: {e!r}", node=node)
            reply = Failed(failed, traceback.format_exc())
        try:
            outbox.send(reply)
        except BrokenPipeError:
            return  # the parent closed our result pipe (it stopped, or was killed): there is no one to tell
