"""The operators' side of named subscriptions: ListSubscriptions, ResetSubscription, DeleteSubscription.

`csnd subscriptions` calls these.  A reset or delete is refused while a
stream holds the name (its consumer would go on from where it is and
acknowledge over the change), and is durable before it is answered
(csnd.service.feed_marks holds the store's lock throughout, so a periodic
store of the old mark cannot land after it).  A reset to a start that
retention dropped is refused, OUT_OF_RANGE, as a stream's start would be.
"""

from __future__ import annotations

import grpc

from csnd.core.errors import SubscriptionBusy, SubscriptionNotFound
from csnd.proto.changefeed.v1 import changefeed_pb2 as pb
from csnd.service.feed_aborts import abort, refuse
from csnd.service.feed_consumers import FeedConsumers
from csnd.service.feed_marks import MarkKeeper
from csnd.service.feed_ports import AdminLog, LagCounter, MarkStore
from csnd.service.feed_reading import open_at


class Lag:
    """Durable transactions after a mark, counted up to `cap` (Changelog.count_after), then "at least"."""

    def __init__(self, log: LagCounter, cap: int) -> None:
        self.log = log
        self.cap = cap

    def __call__(self, acked: int) -> tuple[int, bool]:
        """(count, count is a lower bound)."""
        return self.log.count_after(acked, self.cap)


class SubscriptionAdmin:
    """List, reset and delete named subscriptions (FAILED_PRECONDITION when the service keeps none)."""

    def __init__(
        self, log: AdminLog, consumers: FeedConsumers, marks: MarkKeeper, lag: Lag, max_batch_bytes: int
    ) -> None:
        self.log = log
        self.consumers = consumers
        self.marks = marks
        self.lag = lag
        self.max_batch_bytes = max_batch_bytes

    def list(
        self, request: pb.ListSubscriptionsRequest, context: grpc.ServicerContext
    ) -> pb.ListSubscriptionsResponse:
        self._store_or_abort(context)
        infos = [info for name in self.consumers.names() if (info := self._info(name)) is not None]
        return pb.ListSubscriptionsResponse(subscriptions=infos)

    def reset(
        self, request: pb.ResetSubscriptionRequest, context: grpc.ServicerContext
    ) -> pb.SubscriptionInfo:
        store = self._store_or_abort(context)
        name, csn = request.name, request.csn or self.log.oldest_after_csn  # (0: the oldest retained)
        newest = self.log.durable_csn
        if csn > newest:
            abort(
                context,
                grpc.StatusCode.OUT_OF_RANGE,
                f"cannot reset subscription {name!r} to csn {csn}: the newest durable csn is {newest}",
            )
        open_at(
            self.log, csn, self.max_batch_bytes, context
        )  # (a start that retention dropped: OUT_OF_RANGE)
        try:
            before, tables = self.marks.reset(store, name, csn)
        except (SubscriptionNotFound, SubscriptionBusy) as e:
            refuse(context, e)
        info = self._info(name) or pb.SubscriptionInfo(name=name, acknowledged_csn=csn, tables=tables)
        info.previous_csn = before
        return info

    def delete(
        self, request: pb.DeleteSubscriptionRequest, context: grpc.ServicerContext
    ) -> pb.SubscriptionInfo:
        store = self._store_or_abort(context)
        name = request.name
        info = self._info(name)
        try:
            csn, tables = self.marks.delete(store, name)
        except (SubscriptionNotFound, SubscriptionBusy) as e:
            refuse(context, e)
        return info or pb.SubscriptionInfo(name=name, acknowledged_csn=csn, tables=tables)

    def _store_or_abort(self, context: grpc.ServicerContext) -> MarkStore:
        if self.marks.store is None:
            abort(context, grpc.StatusCode.FAILED_PRECONDITION, "this service keeps no named subscriptions")
        return self.marks.store

    def _info(self, name: str) -> pb.SubscriptionInfo | None:
        """A named subscription as it is now (None: no such name)."""
        view = self.consumers.named(name)
        if view is None:
            return None
        lag, at_least = self.lag(view.acked)
        return pb.SubscriptionInfo(
            name=name,
            acknowledged_csn=view.acked,
            tables=view.tables,
            connected=view.connected,
            peer=view.peer,
            lag_transactions=lag,
            lag_at_least=at_least,
        )
