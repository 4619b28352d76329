"""One Subscribe stream of the client: its request queue, its responses read in a thread or on the caller's.

    inbox (bounded) ◄─ response thread ◄─ batches, relation lines, Subscribed  ◄─ service
    request queue ─────────────────────► start, acknowledgements, keepalive replies ─►

The response thread answers keepalives while the caller works, but it stops
reading when the inbox is full.  What it puts in the inbox is tagged with
the stream, so the caller can tell a stream it abandoned from the current
one; the last thing it puts is how the stream ended (a grpc.RpcError, or
STREAM_ENDED when the service ended it).

Read on the caller's thread instead (`on_caller`, csnd.consumers.callerread)
there is no response thread and no inbox: `receive` takes the next message
straight from gRPC, one wake-up a live message fewer and no queue, and
keepalives are answered when the caller next receives -- for a caller that
is always waiting for the next line (`csnd subscribe`), as soon as one comes.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Final

import grpc

from csnd.consumers.callerread import CallerReader, supported
from csnd.consumers.lines import Piece, RelationRecord, Relations
from csnd.proto.changefeed.v1 import changefeed_pb2 as pb
from csnd.proto.changefeed.v1 import changefeed_pb2_grpc as pb_grpc

_ACK: Final = object()  # (request queue marker: send the newest acknowledgement)
STREAM_ENDED: Final = object()  # (request queue: end the requests; inbox: the service ended the stream)


class Acks:
    """The newest acknowledgement asked for (the caller's thread) and the newest sent (a request stream's)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._asked = 0
        self._sent = 0

    def ask(self, csn: int) -> bool:
        """Whether `csn` is newer than every acknowledgement asked for so far (then it is the one to send)."""
        with self._lock:
            if csn <= self._asked:
                return False
            self._asked = csn
            return True

    def take(self) -> int | None:
        """For the request stream: the acknowledgement to send now, if any is new."""
        with self._lock:
            if self._asked <= self._sent:
                return None
            self._sent = self._asked
            return self._asked

    def resend(self) -> None:
        """A new stream: the service has to hear the acknowledgement again."""
        with self._lock:
            self._sent = 0


Inbox = queue.Queue[tuple["SubscribeStream", object]]


class SubscribeStream:
    """A Subscribe call started with `start`; its results go to `inbox`, its acknowledgements come from `acks`."""

    def __init__(
        self,
        stub: pb_grpc.ChangefeedStub,
        metadata: Sequence[tuple[str, str]],
        start: pb.SubscribeStart,
        inbox: Inbox,
        acks: Acks,
        on_caller: bool = False,
    ) -> None:
        self.requests: queue.Queue[object] = queue.Queue()
        self.done = threading.Event()
        self.subscribed: pb.Subscribed | None = None
        self.piecing = False  # a large line's pieces are arriving
        self._inbox = inbox
        self._acks = acks
        # When a message last came (or the response thread, held by a full inbox, could go on):
        # a stream silent for long is a dead path (`silent_for`).
        self._heard_at = time.monotonic()
        self.call = stub.Subscribe(self._request_iter(start), metadata=metadata)
        # Read on the caller's thread (`receive`) when asked and grpc allows; else in a thread.
        self.reader = CallerReader(self.call) if on_caller and supported(self.call) else None
        self.ended = False  # (on the caller's thread: `receive` returned how the stream ended)
        self.thread: threading.Thread | None = None
        if self.reader is None:
            self.thread = threading.Thread(target=self._read, name="csnd-feed-responses", daemon=True)
            self.thread.start()

    def silent_for(self) -> float:
        """Seconds since the service last sent this stream anything (keepalives too)."""
        return time.monotonic() - self._heard_at

    def running(self) -> bool:
        """Whether the stream may still deliver something (its response thread, or not ended on the caller's)."""
        if self.thread is not None:
            return self.thread.is_alive()
        return not self.ended and not self.done.is_set()

    def join(self, timeout: float) -> None:
        """Waits for the response thread, if any, to end."""
        if self.thread is not None:
            self.thread.join(timeout)

    def receive(self, timeout: float) -> object | None:
        """On the caller's thread: the next item (as `_read` puts them), None if none within `timeout`.

        The last item is how the stream ended: a grpc.RpcError, or STREAM_ENDED.
        """
        reader = self.reader
        assert reader is not None
        deadline = time.monotonic() + timeout
        while True:
            try:
                msg = reader.next_message(max(0.0, deadline - time.monotonic()))
            except StopIteration:
                self.ended = True
                return STREAM_ENDED
            except grpc.RpcError as e:
                self.ended = True
                how: object = e
                return how
            if msg is None:
                return None
            item = self._item(msg)
            if item is not None:
                return item

    def send_ack(self) -> None:
        """Send the newest acknowledgement (if it is new to this stream) at the next chance."""
        self.requests.put(_ACK)

    def end_requests(self) -> None:
        """No more requests: the service sees the request stream end (and stores the last ack)."""
        self.requests.put(STREAM_ENDED)

    def _request_iter(self, start: pb.SubscribeStart) -> Iterator[pb.SubscribeRequest]:
        yield pb.SubscribeRequest(start=start)
        while True:
            item = self.requests.get()
            if item is STREAM_ENDED:
                return
            if item is _ACK:
                csn = self._acks.take()
                if csn is not None:
                    yield pb.SubscribeRequest(ack=pb.SubscribeAck(csn=csn))
            else:
                assert isinstance(item, pb.SubscribeRequest)
                yield item

    def _put(self, item: object) -> bool:
        """Into the inbox, unless this call was abandoned meanwhile."""
        while not self.done.is_set():
            try:
                self._inbox.put((self, item), timeout=0.2)
                return True
            except queue.Full:
                continue
        return False

    def _item(self, msg: pb.SubscribeResponse) -> object | None:
        """What a message is for the caller (a keepalive is answered here: None)."""
        self._heard_at = time.monotonic()
        kind = msg.WhichOneof("body")
        if kind == "batch":
            txns = msg.batch.transactions
            if len(txns) == 1 and (txns[0].more or self.piecing):
                # A piece of a large line (alone in its batch; the last one has no `more`).
                self.piecing = txns[0].more
                return Piece(txns[0].csn, txns[0].line, txns[0].more)
            return [(t.csn, t.line) for t in txns]
        if kind == "relations":
            return Relations(RelationRecord(r.csn, r.line) for r in msg.relations.relations)
        if kind == "keepalive":
            if msg.keepalive.reply_requested:
                reply = pb.FeedKeepalive(send_time_us=int(time.time() * 1e6))
                self.requests.put(pb.SubscribeRequest(keepalive=reply))
            return None
        if kind == "subscribed":
            self.subscribed = msg.subscribed
            return msg.subscribed
        return None

    def _read(self) -> None:
        ended: object = None
        try:
            for msg in self.call:
                item = self._item(msg)
                if item is not None:
                    if not self._put(item):
                        return
                    self._heard_at = time.monotonic()  # (a full inbox held it: that was no silence)
        except grpc.RpcError as e:
            ended = e
        self._put(ended if ended is not None else STREAM_ENDED)

    def cancel(self) -> None:
        self.done.set()
        self.requests.put(STREAM_ENDED)
        self.call.cancel()
