"""`csnd replay`: the embedded pipeline over one or more sources, wired together.

    source ─► DecoderPool ─► NodeSender ─┐  (NodePipeline: one thread per node, an Outbox each)
    source ─► DecoderPool ─► NodeSender ─┼─► Merger ─► JsonLinesSink ─► confirm live slots
    node agent ══ gRPC ══► RemoteNode ───┘  (this thread)

`run_replay` checks the output against the sources (`check_output`), opens
the sources and the output (a bad path fails before any decoder starts),
runs the merger, and on the way out either commits the output
(FILE.partial renamed to FILE) or abandons it and says where the incomplete
output is.  A reader that closes the output (`| head -3`) ends the run
quietly, with exit status 0 and nothing more confirmed.

A live source's slot is confirmed as far as FILE.partial holds, and the next
run starts there.  So a live replay never writes over an earlier run's
output: it refuses to start while FILE or FILE.partial exists (the user
moves it away and keeps it), instead of truncating transactions the source
will not send again.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

from csnd.core.errors import ConfigError, CsndError, os_error_text
from csnd.runtime.inputs import NodeInput, NodePipeline
from csnd.runtime.jsonsink import JsonLinesSink, is_written_in_place
from csnd.runtime.merger import Merger
from csnd.runtime.options import ReplayConfig
from csnd.runtime.replay_progress import ReplayProgress
from csnd.runtime.sinks import OutputClosed
from csnd.runtime.sources import (
    LiveNode,
    OpenedSource,
    RecordedNode,
    SourceSpec,
    check_nodes,
    open_source,
    parse_source,
)
from csnd.runtime.stopping import ignore_stop_signals, with_partial

if TYPE_CHECKING:
    from csnd.runtime.remote import RemoteNode


def open_node(spec: SourceSpec, config: ReplayConfig, index: int) -> OpenedSource | RemoteNode:
    """A SOURCE's reader-side object: a source, or a node agent's client (a whole `NodeInput`)."""
    if spec.is_grpc:
        from csnd.runtime.remote import RemoteNode

        address = spec.target.removeprefix("grpc://").rstrip("/")
        return RemoteNode(address, name=spec.name, give_up_s=config.agent_give_up_s, dial=config.agent_dial)
    return open_source(spec, config.live, index)


def check_output(output: str | None, specs: list[SourceSpec]) -> None:
    """Refuse an output that would destroy data, before anything is opened (ConfigError)."""
    if output is None:
        return
    partial = f"{output}.partial"
    ids = {}
    for name in (output, partial):
        try:
            st = os.stat(name)
        except OSError:
            continue
        ids[(st.st_dev, st.st_ino)] = name
    for spec in specs:
        if not spec.is_file:
            continue
        try:
            st = os.stat(spec.target)
        except OSError:
            continue  # (opening it says what is wrong)
        clash = ids.get((st.st_dev, st.st_ino))
        if clash is not None:
            raise ConfigError(
                f"--output {output}: {clash} is the source {spec.target}; writing there would destroy it, "
                "so name another output file"
            )
    if not any(s.is_live or s.is_grpc for s in specs) or is_written_in_place(output):
        return
    if os.path.lexists(partial):
        raise ConfigError(
            f"{partial} exists: a live replay into {output} stopped before its end, and its slot is "
            "confirmed only as far as that file holds; move it away to keep those transactions, then run again"
        )
    if os.path.lexists(output):
        raise ConfigError(
            f"--output {output} exists: a live replay would replace it, and the transactions it holds "
            "are not sent again; move it away or name another file"
        )


def run_replay(config: ReplayConfig) -> int:
    specs = [parse_source(s) for s in config.sources]
    check_output(config.output, specs)
    opened = [open_node(spec, config, i) for i, spec in enumerate(specs)]
    check_nodes(opened)
    sink = JsonLinesSink(config.output, schemas=config.schemas)  # (before any decoder: a bad path fails now)
    try:
        # A node agent's client is a node input already.
        inputs: list[NodeInput] = [
            NodePipeline(s, config.decoders) if isinstance(s, LiveNode | RecordedNode) else s for s in opened
        ]
    except BaseException:
        sink.discard()  # nothing was written: leave no FILE.partial behind
        raise
    # Node order is name order, not command-line order: it decides the order
    # of "nodes" in the output and ties inside one cid, which should not
    # depend on how the sources were listed.
    inputs.sort(key=lambda p: p.node)
    progress = ReplayProgress(sys.stderr, inputs) if config.verbose or sys.stderr.isatty() else None
    try:
        Merger(inputs, sink, progress).run()
    except OutputClosed:  # the reader's choice: stop, confirm nothing more, say nothing
        _stop_all(inputs)
        sink.abandon()
        return 0
    except BaseException as e:
        _stop_all(inputs)
        raise _abandoned(e, sink) from None
    # Every source ended and every line is written: the run is complete, and
    # a Ctrl-C or SIGTERM now would only turn a finished output into a
    # ".partial" reported as interrupted.  (The closing fsync is short: the
    # output was written back as it grew.)
    ignore_stop_signals()
    try:
        sink.commit()
    except OutputClosed:
        sink.abandon()
        return 0
    finally:
        _stop_all(inputs)
    if progress is not None:
        progress.done(sink.transactions, sink.bytes_out)
    return 0


def _stop_all(inputs: list[NodeInput]) -> None:
    for p in inputs:
        p.stop()


def _abandoned(e: BaseException, sink: JsonLinesSink) -> BaseException:
    """The failure `e` of a run, its output abandoned, naming where the incomplete output is."""
    try:
        partial = sink.abandon()
    except CsndError:  # (the output failing too: the first error is the one to tell)
        partial = sink.partial
    if isinstance(e, KeyboardInterrupt) and partial:
        e = with_partial(e, partial)  # (for the command line's one line)
    if isinstance(e, OSError):  # not one of ours: still one line, with where the output is
        e = CsndError(os_error_text(e))
    if partial and isinstance(e, CsndError):
        e.args = (f"{e}; the incomplete output is in {partial}",)
    return e
