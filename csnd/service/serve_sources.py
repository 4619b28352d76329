"""The service's sources, opened: live nodes for their slots, and each pipeline run's node inputs.

    ServeConfig.sources ─► live_sources() ─► LiveSource per live node   (slots, snapshots: serve_snapshot)
                       └─► open_inputs()  ─► OpenedInput per node       (one pipeline run: serve_pipeline)
                                               input: NodePipeline | RemoteNode
                                               shown_as, slot: what Status shows of it (serve_status)

A live node is opened here and nowhere else in the service (`live_sources`),
so its name (dn<i> when unnamed), its options and its mode are the same for
the slot's preparation, an initial snapshot taken again and the incremental
snapshots.  What Status shows of a node (where it reads from, which slot to
watch) is taken from the source as it is opened, of its kind: nothing asks
a node input later what it has.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from csnd.core.ids import Csn
from csnd.runtime.inputs import NodeInput, NodePipeline
from csnd.runtime.sources import OpenedSource, SourceSpec, check_nodes, open_live, open_source
from csnd.service.config import ServeConfig, ServedSource

if TYPE_CHECKING:
    from csnd.reader.live import LiveSource


@dataclass(frozen=True)
class SlotAddress:
    """A live node's replication slot, for the monitor that reads it (csnd.service.nodes.SlotMonitor)."""

    conninfo: str
    slot: str


@dataclass(frozen=True)
class OpenedInput:
    """One node input of a pipeline run, with what Status shows of it."""

    input: NodeInput
    shown_as: str  # where it reads from, never a password ("" when nothing names it)
    slot: SlotAddress | None  # a live node's slot to watch (None: a file, a node agent)


@dataclass(frozen=True)
class LiveEntry:
    """A live source of the configuration, opened (not connected)."""

    index: int  # its place among the configuration's sources (an unnamed one is dn<index+1>)
    config: ServedSource
    source: LiveSource


def live_sources(sources: Sequence[ServedSource]) -> list[LiveEntry]:
    """Each live source's `LiveSource`, fresh (the one place the service opens one), in configuration order."""
    return [
        LiveEntry(i, src, open_live(SourceSpec(src.name, src.target), src.live, f"dn{i + 1}"))
        for i, src in enumerate(sources)
        if src.is_live
    ]


def open_inputs(config: ServeConfig, resume_csn: int) -> list[OpenedInput]:
    """Fresh node inputs over every source for one pipeline run, resuming after `resume_csn`, by node name."""
    from csnd.runtime.remote import RemoteNode  # (only a service with node agents needs grpc's client side)

    resume = Csn(resume_csn) if resume_csn else None
    sources: list[RemoteNode | OpenedSource] = []  # (a node agent's client is a node input already)
    for i, src in enumerate(config.sources):
        if src.is_agent:
            address = src.target.removeprefix("grpc://").rstrip("/")
            remote = RemoteNode(address, name=src.name, give_up_s=config.give_up_s, dial=config.agent_dial)
            if resume_csn:
                remote.resume_after(resume_csn)
            sources.append(remote)
        else:
            # (slots are made before the ready line; a pipeline restart never makes one
            # anew, which would skip silently what a dropped one held)
            live = dataclasses.replace(src.live, give_up_s=config.give_up_s, create_slot=False)
            sources.append(open_source(SourceSpec(src.name, src.target), live, i))
    check_nodes(sources)  # before any decoder starts
    opened: list[OpenedInput] = []
    for src, source in zip(config.sources, sources, strict=True):
        if isinstance(source, RemoteNode):
            opened.append(OpenedInput(source, shown_as(src), None))
            continue
        pipeline = NodePipeline(
            source,
            config.decoders,
            resume_csn=resume,
            spill_dir=config.spill_dir,
            spill_bytes=config.spill_bytes,
        )
        opened.append(OpenedInput(pipeline, shown_as(src), slot_of(src)))
    opened.sort(key=lambda o: o.input.node)
    return opened


def shown_as(src: ServedSource) -> str:
    """Where Status says a node reads from: a named source as configured (never a password), a file by its path.

    (An unnamed live node or node agent shows none: its name, dn<i> or the
    agent's, says which it is.)
    """
    if src.name or not (src.is_live or src.is_agent):
        return safe_target(src)
    return ""


def slot_of(src: ServedSource) -> SlotAddress | None:
    """A live source's slot, which Status watches (None: a file or a node agent, or no slot named)."""
    if not src.is_live:
        return None
    options = src.live.options(src.target)
    return SlotAddress(options.conninfo, options.slot) if options.slot else None


def safe_target(src: ServedSource) -> str:
    """The source as Status shows it: never a password."""
    if src.is_live and "://" not in src.target:  # (a key=value conninfo)
        from csnd.runtime.slot_cmd import shown_conninfo

        return shown_conninfo(src.target)
    if src.is_live:
        return shown_source_url(src.target)
    return src.target


# The URL parameters Status shows: where the node is, never a password or a key's path.
_SHOWN_PARAMETERS: Final = ("host", "hostaddr", "port")


def shown_source_url(target: str) -> str:
    """A postgresql:// URL without its password and with only the parameters that say where it points.

    The netloc is taken apart by hand, not by `urlsplit().port`: libpq's
    failover form `u@a:p1,b:p2` names several hosts and ports there, which
    `urllib` cannot read as one port.
    """
    from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

    url = urlsplit(target)
    userinfo, at, hosts = url.netloc.rpartition("@")
    user = userinfo.partition(":")[0]
    netloc = f"{user}@{hosts}" if at and user else hosts
    query = [(k, v) for k, v in parse_qsl(url.query, keep_blank_values=True) if k in _SHOWN_PARAMETERS]
    return urlunsplit(url._replace(netloc=netloc, query=urlencode(query, safe=",", quote_via=quote)))


def node_databases(sources: Sequence[ServedSource], env: Mapping[str, str] | None = None) -> dict[str, str]:
    """Each live node's database name, as libpq resolves it: the conninfo's, else PGDATABASE, else the user's.

    (For the Debezium formats' `source.db`; a file or agent source names none.)
    """
    import getpass

    from psycopg.conninfo import conninfo_to_dict

    env = os.environ if env is None else env
    out = {}
    for i, src in enumerate(sources):
        if not src.is_live:
            continue
        try:
            params = conninfo_to_dict(src.target)
        except Exception:  # (a bad conninfo is the reader's error to report, with its cause)
            continue
        user = params.get("user") or env.get("PGUSER") or getpass.getuser()
        out[src.name or f"dn{i + 1}"] = str(params.get("dbname") or env.get("PGDATABASE") or user)
    return out
