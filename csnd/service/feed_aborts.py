"""How the changefeed's calls end with an error: each cause its gRPC status and its message.

One place maps the changelog's damage (DATA_LOSS: the consumer stops, it
does not retry), retention that dropped what a reader needed (OUT_OF_RANGE,
naming the subscription and the reset that goes on), a bad table filter
or format (INVALID_ARGUMENT) and a refused change of a named subscription
(NOT_FOUND, FAILED_PRECONDITION), so every call says the same thing for the
same cause.  Each helper aborts the call: it never returns.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import NoReturn

import grpc

from csnd.core.errors import ChangelogCorrupt, CsnOutOfRange, SubscriptionBusy, SubscriptionNotFound
from csnd.service.debezium import ColumnTypesUnknown
from csnd.service.filtering import TableFilter
from csnd.service.knowntables import KnownTables

log = logging.getLogger("csnd.changefeed")


def abort(context: grpc.ServicerContext, code: grpc.StatusCode, details: str) -> NoReturn:
    context.abort(code, details)
    raise AssertionError("unreachable: context.abort raises")  # (for the type checker)


def refuse(context: grpc.ServicerContext, e: SubscriptionNotFound | SubscriptionBusy) -> NoReturn:
    code = (
        grpc.StatusCode.NOT_FOUND
        if isinstance(e, SubscriptionNotFound)
        else grpc.StatusCode.FAILED_PRECONDITION
    )
    abort(context, code, str(e))


def table_filter(specs: Iterable[str], context: grpc.ServicerContext) -> TableFilter:
    """The filter of `specs`; INVALID_ARGUMENT for a malformed one."""
    try:
        return TableFilter(specs)
    except ValueError as e:
        abort(context, grpc.StatusCode.INVALID_ARGUMENT, str(e))


def refuse_unknown(known: KnownTables, specs: Iterable[str], context: grpc.ServicerContext) -> None:
    """INVALID_ARGUMENT naming the filter's tables that no source publishes (a typo must not read nothing)."""
    unknown = known.unknown(specs)
    if unknown:
        abort(
            context,
            grpc.StatusCode.INVALID_ARGUMENT,
            f"no published table is named {', '.join(unknown)}: the service knows no such table (its "
            "sources' publications and the changelog's tables); check the spelling (SCHEMA.TABLE, "
            "SCHEMA.*), or add it to the publication first",
        )


def out_of_range(context: grpc.ServicerContext, after: int, e: CsnOutOfRange, name: str = "") -> NoReturn:
    """OUT_OF_RANGE; for a named subscription, naming it, where it is and what the operator can do."""
    if not name:
        abort(context, grpc.StatusCode.OUT_OF_RANGE, str(e))
    oldest = e.oldest_csn
    abort(
        context,
        grpc.StatusCode.OUT_OF_RANGE,
        f"subscription {name!r} is at csn {after}, but retention dropped the records after it "
        f"(it held them only up to retention_hold_bytes/retention_hold_hours): the oldest retained csn is "
        f"{oldest}, so its consumer would miss the ones in between; to go on from the oldest retained, "
        f"reset it: csnd subscriptions reset HOST:PORT {name} --csn {max((oldest or 1) - 1, 0)}",
    )


def damaged(context: grpc.ServicerContext, e: ChangelogCorrupt) -> NoReturn:
    """DATA_LOSS with the line `csnd changelog --check` gives: the consumer stops, it does not retry.

    Logged once here as a line, not a traceback: the damage is the
    operator's to repair (the message says how), and nothing after it is served.
    """
    log.error("changefeed: %s; the consumer %s was told DATA_LOSS", e, context.peer())
    abort(context, grpc.StatusCode.DATA_LOSS, str(e))


def bad_line(context: grpc.ServicerContext, csn: int, e: ValueError) -> NoReturn:
    """A stored line a filter or format cannot read: DATA_LOSS, or FAILED_PRECONDITION for missing types."""
    if isinstance(e, ColumnTypesUnknown):  # (the line is fine: the format cannot be made of it)
        abort(context, grpc.StatusCode.FAILED_PRECONDITION, str(e))
    abort(
        context,
        grpc.StatusCode.DATA_LOSS,
        f"the changelog's record of csn {csn} is not a transaction line ({e}); it cannot be filtered: "
        "check the changelog (csnd changelog DIR) and report this",
    )
