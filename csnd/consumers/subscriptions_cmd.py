"""`csnd subscriptions list|reset|delete HOST:PORT ...`: a service's named subscriptions (docs/design.md section 8).

Named subscriptions are the service's consumer offsets: each name's
acknowledged CSN and table filter, stored in the changelog directory.  This
is the operator's side of them, over the changefeed's gRPC calls
(ListSubscriptions, ResetSubscription, DeleteSubscription), with the token
and TLS options of `csnd subscribe`:

    list    one tab-separated line per name: name, acknowledged csn, lag in
            transactions (`N+`: at least N), `connected PEER` or `idle`, and
            the table filter (`*`: every table); none: stdout stays empty and
            stderr says `csnd subscriptions: no named subscriptions`
    reset   set a name's acknowledged csn (back: its consumer reads again
            from there; forward: it skips); its filter stays
    delete  forget a name: Status and /metrics stop listing it

A reset or delete of a name a stream holds is refused (stop the consumer
first); one of a name the service does not store is refused too.  What the
service says is one line on stderr and exit 1; a usage error is exit 2.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Callable, Iterator
from typing import Any, Final

# How long a call may take once connected (nothing listening fails at once).
CALL_TIMEOUT_S: Final = 10.0


def _csn(text: str) -> int:
    from csnd.core.ids import csn_from_str

    try:
        return csn_from_str(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def add_subscriptions_parser(sub: Any) -> None:
    p = sub.add_parser(
        "subscriptions",
        help="list, reset or delete a csnd service's named subscriptions",
        description="The named subscriptions of a running `csnd serve` (those of `csnd subscribe --name`, "
        "the Spark source, the Python client): list them with their acknowledged csn, lag and table "
        "filter; reset one to a csn; delete one. Reset and delete are refused while a consumer holds "
        "the name. HOST:PORT is the service's --listen address (grpc://HOST:PORT also works).",
    )
    actions = p.add_subparsers(dest="action", metavar="{list,reset,delete}", required=True)

    def common(q: argparse.ArgumentParser) -> None:
        q.add_argument("target", metavar="HOST:PORT", help="the service's address")
        q.add_argument("--token-file", metavar="F", help="file holding the service's bearer token")
        q.add_argument("--tls-ca", metavar="FILE", help="CA certificate (PEM) of a service that uses TLS")
        q.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS, help="log progress")

    ls = actions.add_parser(
        "list",
        help="the named subscriptions, one tab-separated line each",
        description="One tab-separated line per named subscription: name, acknowledged csn, lag in "
        "transactions (N+: at least N), 'connected PEER' or 'idle', and its table filter "
        "(comma-separated; * for every table).",
    )
    common(ls)
    reset = actions.add_parser(
        "reset",
        help="set a subscription's acknowledged csn",
        description="Set a named subscription's acknowledged csn: its consumer's next stream starts after "
        "X (0: the oldest retained). Back reads again, forward skips; the table filter stays. Refused "
        "while a consumer holds the name, for an unknown name, and for a csn past the newest durable "
        "one or before what retention kept.",
    )
    common(reset)
    reset.add_argument("name", metavar="NAME", help="the subscription")
    reset.add_argument("--csn", type=_csn, required=True, metavar="X", help="the new acknowledged csn")
    delete = actions.add_parser(
        "delete",
        help="forget a subscription",
        description="Forget a named subscription, its acknowledged csn and table filter: Status and "
        "/metrics stop listing it. Refused while a consumer holds the name, and for an unknown name.",
    )
    common(delete)
    delete.add_argument("name", metavar="NAME", help="the subscription")


@contextlib.contextmanager
def operator_stub(args: argparse.Namespace, timeout: float) -> Iterator[tuple[Any, dict[str, Any], str]]:
    """(a Changefeed stub, the keyword arguments of its calls, the address) for an operator's command:
    `args.target`, `args.token_file` and `args.tls_ca` as `csnd subscriptions` and `csnd snapshot` take them."""
    from csnd.consumers.connection import call_metadata, open_channel, parse_target
    from csnd.core.tokens import read_token_file
    from csnd.proto.changefeed.v1 import changefeed_pb2_grpc as pb_grpc

    address = parse_target(args.target)
    md = call_metadata(read_token_file(args.token_file) if args.token_file else None)
    channel = open_channel(address, args.tls_ca)
    try:
        yield (
            pb_grpc.ChangefeedStub(channel),
            # (not waiting for a connection: nothing listening is said at once, not after `timeout`)
            {"metadata": md, "timeout": timeout, "wait_for_ready": False},
            address,
        )
    finally:
        channel.close()


def cmd_subscriptions(args: argparse.Namespace) -> int:
    import grpc

    from csnd.proto.changefeed.v1 import changefeed_pb2 as pb

    with operator_stub(args, CALL_TIMEOUT_S) as (stub, kw, address):
        try:
            if args.action == "list":
                got = stub.ListSubscriptions(pb.ListSubscriptionsRequest(), **kw)
                for s in got.subscriptions:
                    print(list_line(s))
                if not got.subscriptions:  # (said on stderr: stdout stays the list, empty)
                    print("csnd subscriptions: no named subscriptions", file=sys.stderr)
            elif args.action == "reset":
                info = stub.ResetSubscription(pb.ResetSubscriptionRequest(name=args.name, csn=args.csn), **kw)
                print(
                    f"reset subscription {info.name} to csn {info.acknowledged_csn} (it was at csn "
                    f"{info.previous_csn})",
                    file=sys.stderr,
                )
            else:
                info = stub.DeleteSubscription(pb.DeleteSubscriptionRequest(name=args.name), **kw)
                print(
                    f"deleted subscription {info.name} (it was at csn {info.acknowledged_csn})",
                    file=sys.stderr,
                )
        except grpc.RpcError as e:
            raise call_error(e, address, args.action, vars(args).get("name")) from None
    return 0


def list_line(s: Any) -> str:
    """One subscription as `csnd subscriptions list` prints it (a `csnd.changefeed.v1.SubscriptionInfo`)."""
    lag = f"{s.lag_transactions}+" if s.lag_at_least else str(s.lag_transactions)
    state = f"connected {s.peer}" if s.connected else "idle"
    tables = ",".join(s.tables) or "*"
    return "\t".join((s.name, str(s.acknowledged_csn), lag, state, tables))


def call_error(e: Any, address: str, action: str, name: str | None) -> Exception:
    """The csnd error for a failed subscription call: one line naming the service (and the subscription)."""
    import grpc

    from csnd.core.errors import CsnOutOfRange, SubscriptionError, SubscriptionNotFound

    what = f"cannot {action} subscription {name!r}" if name else "cannot list the subscriptions"
    return rpc_error(
        e,
        address,
        what,
        {
            grpc.StatusCode.NOT_FOUND: lambda text: SubscriptionNotFound(
                f"{what} at {address}: {text} (csnd subscriptions list shows them)"
            ),
            grpc.StatusCode.FAILED_PRECONDITION: lambda text: SubscriptionError(
                f"{what} at {address}: {text}"
            ),
            grpc.StatusCode.OUT_OF_RANGE: lambda text: CsnOutOfRange(f"{what} at {address}: {text}"),
        },
        unimplemented="does not manage subscriptions",
    )


def rpc_error(
    e: Any,
    address: str,
    what: str,
    by_code: dict[Any, Callable[[str], Exception]],
    *,
    unimplemented: str,
) -> Exception:
    """The csnd error for a failed operator call (`what`: "cannot ..."): unreachable, refused and
    unimplemented the same for every command; `by_code` the command's own codes, given the details."""
    import grpc

    from csnd.consumers.connection import NOTHING_THERE, rpc_code, why_unreachable
    from csnd.core.errors import (
        ChangefeedError,
        ChangefeedRejected,
        ChangefeedUnauthenticated,
        ChangefeedUnavailable,
    )

    code = rpc_code(e)
    text = str(e.details() if isinstance(e, grpc.Call) else e).strip()
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
        why = why_unreachable(address)
        if why == NOTHING_THERE:
            why = f"nothing listens on {address} (is csnd serve running? HOST:PORT is its --listen address)"
        return ChangefeedUnavailable(f"{what}: {why}")
    if code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
        return ChangefeedUnauthenticated(f"{what}: {address} refused us: {text}")
    if code in by_code:
        return by_code[code](text)
    if code == grpc.StatusCode.UNIMPLEMENTED:
        return ChangefeedRejected(f"{what}: the service at {address} {unimplemented} (an older csnd)")
    return ChangefeedError(f"{what} at {address}: {text}")
