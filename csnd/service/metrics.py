"""Prometheus metrics over the service's status (docs/design.md section 8 names).

The figures are read at scrape time from the same status snapshot that the
gRPC `Status` call, `/api/status` and the dashboard show (a custom collector,
as prometheus_client's docs recommend for values kept elsewhere): nothing on
the pipeline's hot path updates a metric, and no two surfaces can disagree
about a figure.

The two latency histograms are the exception: their observations are made
where a transaction becomes durable and where it is sent
(`csnd.service.latency`), and read here at scrape time.

The names are a contract -- dashboards and alerts script against them -- so
they are listed once here, and a test holds the exposition to this list.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any, Final

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from csnd.service.latency import COMMIT_TO_DURABLE, COMMIT_TO_SENT, LatencyHistogram

# name -> help text.  Counters are listed with the `_total` suffix they are exposed with.
METRICS: Final[Mapping[str, str]] = {
    "csnd_transactions_total": "Transactions appended to the changelog (a distributed one counts once).",
    "csnd_changes_total": "Row changes appended to the changelog.",
    "csnd_node_received_lsn": "Newest WAL position received from the node.",
    "csnd_node_confirmed_lsn": "Position confirmed to the node's slot (never past the durable changelog).",
    "csnd_node_watermark_csn": "The node's CSN watermark in the merge.",
    "csnd_node_lag_seconds": "Age of the node's oldest commit not yet in the changelog.",
    "csnd_node_lag_bytes": "WAL between the node's newest received position and what is confirmed.",
    "csnd_node_up": "1 while the node is streaming, 0 while it reconnects, restarts, ended or failed.",
    "csnd_slot_retained_wal_bytes": "WAL the node's slot holds back on the server (pg_replication_slots).",
    "csnd_changelog_bytes": "Size of the changelog's segments on disk.",
    "csnd_changelog_oldest_csn": "Oldest retained CSN of the changelog (0 when empty).",
    "csnd_changelog_newest_csn": "Newest CSN consumers can read: durable, and not held back by an initial "
    "snapshot being taken (0 when none).",
    "csnd_changelog_segments": "Segment files of the changelog.",
    "csnd_changelog_fsyncs_total": "Group-commit fsyncs of the changelog since the service started.",
    "csnd_changelog_fsync_seconds_total": "Seconds spent in those fsyncs (over the count: the mean latency).",
    "csnd_changelog_last_fsync_seconds": "How long the last group-commit fsync took.",
    "csnd_commit_to_durable_seconds": "Seconds from a transaction's source commit to the changelog's group "
    "commit that made it durable.",
    "csnd_commit_to_sent_seconds": "Seconds from a transaction's source commit to the changefeed handing it to "
    "a subscriber's stream (once per subscriber).",
    "csnd_subscribers": "Connected changefeed consumers.",
    "csnd_subscriber_lag_transactions": "Durable transactions after the consumer's acknowledged CSN.",
    "csnd_subscriber_acknowledged_csn": "The consumer's acknowledged CSN.",
    "csnd_snapshot_rows": "Rows of the table the initial snapshot has appended to the changelog.",
    "csnd_snapshot_rows_estimated": "Rows the table holds (by its heap pages done, else counted as it was cut, "
    "else pg_class.reltuples; 0 while unknown).",
    "csnd_snapshot_chunks_remaining": "Chunks of the table not yet in the changelog.",
    "csnd_snapshot_eta_seconds": "Seconds the table's copy is estimated to take still (-1: unknown, 0: done).",
    "csnd_snapshot_barrier_ms": "Milliseconds the GTM commit barrier of this run's initial snapshot held the GTM "
    "(GTM mode with --gtm; 0: none).",
    "csnd_incremental_snapshot_rows": "Rows of the table the latest incremental snapshot (csnd snapshot) has "
    "appended to the changelog.",
    "csnd_incremental_snapshot_eta_seconds": "Seconds the incremental snapshot of the table is estimated to take "
    "still (-1: unknown, 0: done).",
}


def _int(d: Mapping[str, Any], key: str) -> int:
    # proto3 JSON writes 64-bit integers as strings and leaves out zero values
    return int(d.get(key, 0) or 0)


def consumer_label(c: Mapping[str, Any]) -> str:
    """A stable label for a consumer: its subscription name, else its peer address."""
    return str(c.get("name") or c.get("peer") or "anonymous")


class StatusCollector(Collector):
    """Turns one status snapshot (the JSON form of `csnd.v1.StatusResponse`) into metric families."""

    def __init__(self, status: Callable[[], Mapping[str, Any]]) -> None:
        self._status = status

    def collect(self) -> Iterator[Metric]:
        s = self._status()
        totals = s.get("totals", {})
        yield CounterMetricFamily(
            "csnd_transactions", METRICS["csnd_transactions_total"], value=_int(totals, "transactions")
        )
        yield CounterMetricFamily(
            "csnd_changes", METRICS["csnd_changes_total"], value=_int(totals, "changes")
        )

        per_node = {
            "csnd_node_received_lsn": "received_lsn",
            "csnd_node_confirmed_lsn": "confirmed_lsn",
            "csnd_node_watermark_csn": "watermark_csn",
            "csnd_node_lag_bytes": "lag_bytes",
            "csnd_slot_retained_wal_bytes": "retained_wal_bytes",
        }
        nodes = s.get("nodes", [])
        for name, key in per_node.items():
            g = GaugeMetricFamily(name, METRICS[name], labels=["node"])
            for n in nodes:
                g.add_metric([n["name"]], _int(n, key))
            yield g
        lag = GaugeMetricFamily("csnd_node_lag_seconds", METRICS["csnd_node_lag_seconds"], labels=["node"])
        up = GaugeMetricFamily("csnd_node_up", METRICS["csnd_node_up"], labels=["node"])
        for n in nodes:
            lag.add_metric([n["name"]], float(n.get("lag_seconds", 0.0)))
            up.add_metric([n["name"]], 1.0 if n.get("state") == "streaming" else 0.0)
        yield lag
        yield up

        log = s.get("changelog", {})
        for name, key in (
            ("csnd_changelog_bytes", "bytes"),
            ("csnd_changelog_oldest_csn", "oldest_csn"),
            ("csnd_changelog_newest_csn", "newest_csn"),
            ("csnd_changelog_segments", "segments"),
        ):
            yield GaugeMetricFamily(name, METRICS[name], value=_int(log, key))
        yield CounterMetricFamily(
            "csnd_changelog_fsyncs", METRICS["csnd_changelog_fsyncs_total"], value=_int(log, "fsyncs")
        )
        yield CounterMetricFamily(
            "csnd_changelog_fsync_seconds",
            METRICS["csnd_changelog_fsync_seconds_total"],
            value=float(log.get("fsync_seconds_total", 0.0)),
        )
        yield GaugeMetricFamily(
            "csnd_changelog_last_fsync_seconds",
            METRICS["csnd_changelog_last_fsync_seconds"],
            value=float(log.get("last_fsync_seconds", 0.0)),
        )

        consumers = s.get("consumers", [])
        yield GaugeMetricFamily(
            "csnd_subscribers",
            METRICS["csnd_subscribers"],
            value=sum(1 for c in consumers if c.get("connected")),
        )
        lag_tx = GaugeMetricFamily(
            "csnd_subscriber_lag_transactions",
            METRICS["csnd_subscriber_lag_transactions"],
            labels=["subscriber"],
        )
        acked = GaugeMetricFamily(
            "csnd_subscriber_acknowledged_csn",
            METRICS["csnd_subscriber_acknowledged_csn"],
            labels=["subscriber"],
        )
        for c in consumers:
            label = consumer_label(c)
            lag_tx.add_metric([label], _int(c, "lag_transactions"))
            acked.add_metric([label], _int(c, "acknowledged_csn"))
        yield lag_tx
        yield acked

        # The initial snapshot (docs/design.md section 5), a gauge per table while this run takes one.
        tables = s.get("snapshot", {}).get("tables", [])
        barrier = GaugeMetricFamily("csnd_snapshot_barrier_ms", METRICS["csnd_snapshot_barrier_ms"])
        barrier.add_metric([], float(s.get("snapshot", {}).get("barrier_ms", 0.0)))
        yield barrier
        per_table: dict[str, Callable[[Mapping[str, Any]], float]] = {
            "csnd_snapshot_rows": lambda t: _int(t, "rows"),
            "csnd_snapshot_rows_estimated": lambda t: _int(t, "rows_estimated"),
            "csnd_snapshot_chunks_remaining": lambda t: _int(t, "chunks") - _int(t, "chunks_done"),
            "csnd_snapshot_eta_seconds": lambda t: float(t.get("eta_seconds", 0.0)),
        }
        incremental = s.get("incremental", {}).get("tables", [])
        per_table["csnd_incremental_snapshot_rows"] = per_table["csnd_snapshot_rows"]
        per_table["csnd_incremental_snapshot_eta_seconds"] = per_table["csnd_snapshot_eta_seconds"]
        for name, value in per_table.items():
            g = GaugeMetricFamily(name, METRICS[name], labels=["node", "table"])
            for t in incremental if name.startswith("csnd_incremental") else tables:
                g.add_metric(
                    [str(t.get("node", "")), f"{t.get('schema', '')}.{t.get('table', '')}"], value(t)
                )
            yield g
        yield from latency_families()


def latency_families(
    histograms: Mapping[str, LatencyHistogram] | None = None,
) -> Iterator[Metric]:
    """The latency histograms of this process (`csnd.service.latency`) as metric families."""
    of = histograms or {
        "csnd_commit_to_durable_seconds": COMMIT_TO_DURABLE,
        "csnd_commit_to_sent_seconds": COMMIT_TO_SENT,
    }
    for name, histogram in of.items():
        buckets, total = histogram.snapshot()
        yield HistogramMetricFamily(name, METRICS[name], buckets=buckets, sum_value=total)


def registry_for(status: Callable[[], Mapping[str, Any]]) -> CollectorRegistry:
    """A registry of its own (not the process-global one): one service, one set of figures."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StatusCollector(status))
    return registry
