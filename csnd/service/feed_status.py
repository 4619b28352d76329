"""The changefeed's consumers as Status shows them: connected streams, then idle names.

Its part of the Status answer (csnd.service.status.build_status puts it
together with the changelog's figures and what `csnd serve` adds).  The
consumers are read under their lock for one consistent view; the lag of
each is counted outside it (Changelog.count_after may read the CSN index).
"""

from __future__ import annotations

import time

from csnd.proto.changefeed.v1 import changefeed_pb2 as pb
from csnd.service.feed_admin import Lag
from csnd.service.feed_consumers import FeedConsumers


class ConsumerStatuses:
    """Every consumer now, as `pb.ConsumerStatus` (csnd.service.status.ConsumerFigures)."""

    def __init__(self, consumers: FeedConsumers, lag: Lag) -> None:
        self.consumers = consumers
        self.lag = lag

    def consumer_statuses(self, wall: float) -> list[pb.ConsumerStatus]:
        """Each consumer now; `wall` (time.time()) dates the connected ones' `connected_since_us`."""
        mono = time.monotonic()
        statuses = []
        for c in self.consumers.views():
            lag, at_least = self.lag(c.acked)
            if c.connected:
                statuses.append(
                    pb.ConsumerStatus(
                        peer=c.peer,
                        name=c.name,
                        acknowledged_csn=c.acked,
                        sent_csn=c.sent,
                        lag_transactions=lag,
                        lag_at_least=at_least,
                        connected=True,
                        tables=c.tables,
                        transactions_sent=c.transactions_sent,
                        connected_since_us=int((wall - (mono - c.connected_since)) * 1e6),
                    )
                )
            else:
                statuses.append(
                    pb.ConsumerStatus(
                        name=c.name,
                        acknowledged_csn=c.acked,
                        lag_transactions=lag,
                        lag_at_least=at_least,
                        tables=c.tables,
                    )
                )
        return statuses
