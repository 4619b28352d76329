"""Roles and per-consumer credentials of the changefeed, through a real gRPC server on port 0."""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Callable, Iterator

import grpc
import pytest

from csnd.changelog import Changelog
from csnd.consumers.client import Changefeed, fetch
from csnd.core.auth import ADMIN, READ, Credentials, read_credentials_file
from csnd.core.errors import ChangefeedUnauthenticated, ConfigError
from csnd.proto.changefeed.v1 import changefeed_pb2 as pb
from csnd.proto.changefeed.v1 import changefeed_pb2_grpc as pb_grpc
from csnd.service.server import _warn_if_exposed, is_loopback
from tests.service.feedkit import FAST, fill, serve, wait_for

ADMIN_TOKEN = "adm1n-t0ken"
BILLING_TOKEN = "b1lling-t0ken"
LAKE_TOKEN = "l4ke-t0ken"
OPS_TOKEN = "0ps-t0ken"


def sha(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


@pytest.fixture
def log(tmp_path: object) -> Iterator[Changelog]:
    with Changelog(os.path.join(str(tmp_path), "log")) as log:
        yield log


@pytest.fixture
def credentials_file(tmp_path: object) -> str:
    path = os.path.join(str(tmp_path), "credentials")
    with open(path, "w") as f:
        f.write(
            "# csnd credentials: NAME ROLE TOKEN-SHA256 [SUBSCRIPTION,...]\n"
            f"billing  read   {sha(BILLING_TOKEN)}  billing,billing-*\n"
            "\n"
            f"lake     read   {sha(LAKE_TOKEN).upper()}   # no named subscription\n"
            f"ops      admin  {sha(OPS_TOKEN)}\n"
        )
    return path


def md(token: str) -> tuple[tuple[str, str]]:
    return (("authorization", f"Bearer {token}"),)


def test_a_read_credential_cannot_administer(log: Changelog, credentials_file: str) -> None:
    """Today one token does everything: a consumer's token resets or deletes another's subscription."""
    fill(log, range(1, 6))
    creds = Credentials(read_credentials_file(credentials_file))
    srv = serve(log, token=ADMIN_TOKEN, credentials=creds, settings=FAST)
    try:
        with Changefeed(srv.address, name="billing", token=BILLING_TOKEN) as feed:
            assert [feed.next(timeout=30) for _ in range(5)] != [None] * 5
            feed.ack(5)
        with grpc.insecure_channel(srv.address) as ch:
            stub = pb_grpc.ChangefeedStub(ch)
            wait_for(
                lambda: (
                    stub.ListSubscriptions(
                        pb.ListSubscriptionsRequest(), metadata=md(LAKE_TOKEN)
                    ).subscriptions
                ),
                "the name",
            )
            # reading: every credential
            for token in (BILLING_TOKEN, LAKE_TOKEN, OPS_TOKEN, ADMIN_TOKEN):
                stub.Status(pb.StatusRequest(), metadata=md(token), timeout=30)
            # administering: admin credentials only
            calls: list[Callable[[tuple[tuple[str, str]]], object]] = [
                lambda m: stub.ResetSubscription(
                    pb.ResetSubscriptionRequest(name="billing", csn=2), metadata=m, timeout=30
                ),
                lambda m: stub.DeleteSubscription(
                    pb.DeleteSubscriptionRequest(name="billing"), metadata=m, timeout=30
                ),
                lambda m: stub.StartSnapshot(
                    pb.StartSnapshotRequest(tables=["public.acct"]), metadata=m, timeout=30
                ),
            ]
            for call in calls:
                for token, name in ((BILLING_TOKEN, "billing"), (LAKE_TOKEN, "lake")):
                    with pytest.raises(grpc.RpcError) as rpc:
                        call(md(token))
                    assert rpc.value.code() == grpc.StatusCode.PERMISSION_DENIED
                    assert f"credential {name!r} has role read" in str(rpc.value.details())
            got = stub.ResetSubscription(
                pb.ResetSubscriptionRequest(name="billing", csn=2), metadata=md(OPS_TOKEN), timeout=30
            )
            assert (got.acknowledged_csn, got.previous_csn) == (2, 5)
            # the --token-file token stays an admin's, as it always was
            got = stub.ResetSubscription(
                pb.ResetSubscriptionRequest(name="billing", csn=3), metadata=md(ADMIN_TOKEN), timeout=30
            )
            assert got.acknowledged_csn == 3
            stub.DeleteSubscription(
                pb.DeleteSubscriptionRequest(name="billing"), metadata=md(OPS_TOKEN), timeout=30
            )
            with pytest.raises(grpc.RpcError) as rpc:
                stub.Status(pb.StatusRequest(), metadata=md("not-a-token"), timeout=30)
            assert rpc.value.code() == grpc.StatusCode.UNAUTHENTICATED
    finally:
        srv.stop()


def test_a_consumer_cannot_take_over_another_named_subscription(
    log: Changelog, credentials_file: str
) -> None:
    fill(log, range(1, 6))
    srv = serve(log, credentials=Credentials(read_credentials_file(credentials_file)), settings=FAST)
    try:
        # billing's own names (and its pattern) are its to hold
        for name in ("billing", "billing-eu"):
            with Changefeed(srv.address, name=name, token=BILLING_TOKEN) as feed:
                assert feed.next(timeout=30) is not None
        # another consumer's name, or any name for one that holds none: refused, the name untouched
        for token, name in ((LAKE_TOKEN, "billing"), (BILLING_TOKEN, "lake"), (LAKE_TOKEN, "lake")):
            with pytest.raises(ChangefeedUnauthenticated, match=f"may not hold subscription {name!r}"):
                Changefeed(srv.address, name=name, token=token).next(timeout=30)
        # unnamed streams and Fetch need no name of their own
        with Changefeed(srv.address, token=LAKE_TOKEN) as feed:
            assert feed.next(timeout=30) is not None
        assert [c for c, _ in fetch(srv.address, token=LAKE_TOKEN)] == [1, 2, 3, 4, 5]
        # an admin holds any name (to move a consumer's mark by hand, say)
        with Changefeed(srv.address, name="lake", token=OPS_TOKEN) as feed:
            assert feed.next(timeout=30) is not None
    finally:
        srv.stop()


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("billing read abc\n", "line 1: the token's SHA-256 must be 64 hex digits"),
        (f"billing reader {sha('x')}\n", "line 1: role 'reader' is not read or admin"),
        (f"# c\nbilling read {sha('x')} a,b c\n", "line 2: 5 fields, not 3 or 4"),
        (f"-x read {sha('x')}\n", "line 1: name '-x' must be"),
        (f"a read {sha('x')} ok,no/slash\n", "line 1: subscription 'no/slash' is not a name"),
        ("# nothing\n\n", "holds no credential"),
        (f"a read {sha('x')}\na admin {sha('y')}\n", "credential 'a' is given twice"),
        (f"a read {sha('x')}\nb admin {sha('x')}\n", "has the token of another credential"),
    ],
)
def test_a_bad_credentials_file_names_its_line(tmp_path: object, text: str, error: str) -> None:
    path = os.path.join(str(tmp_path), "credentials")
    with open(path, "w") as f:
        f.write(text)
    with pytest.raises(ConfigError, match="credential") as info:
        Credentials(read_credentials_file(path))
    assert error in str(info.value)


def test_credentials_are_found_by_their_token(credentials_file: str) -> None:
    creds = Credentials.of(ADMIN_TOKEN, credentials_file)
    assert creds is not None
    found = {t: creds.identify(md(t)) for t in (ADMIN_TOKEN, BILLING_TOKEN, LAKE_TOKEN, OPS_TOKEN)}
    assert {t: (c.name, c.role) for t, c in found.items() if c is not None} == {
        ADMIN_TOKEN: ("token-file", ADMIN),
        BILLING_TOKEN: ("billing", READ),
        LAKE_TOKEN: ("lake", READ),
        OPS_TOKEN: ("ops", ADMIN),
    }
    for bad in (
        (),
        (("authorization", "Bearer"),),
        (("authorization", BILLING_TOKEN),),
        md(BILLING_TOKEN + "x"),
    ):
        assert creds.identify(bad) is None
    billing = found[BILLING_TOKEN]
    assert billing is not None
    assert [billing.may_hold(n) for n in ("billing", "billing-1", "billingx", "lake")] == [
        True,
        True,
        False,
        False,
    ]


def test_plaintext_beyond_loopback_is_warned_about(log: Changelog, caplog: pytest.LogCaptureFixture) -> None:
    assert [is_loopback(h) for h in ("127.0.0.1", "127.8.0.1", "localhost", "[::1]", "::1")] == [True] * 5
    assert [is_loopback(h) for h in ("0.0.0.0", "", "[::]", "10.0.0.7", "db1.example")] == [False] * 5
    with caplog.at_level(logging.WARNING, logger="csnd.changefeed"):
        srv = serve(log)  # (127.0.0.1: nothing to say)
        srv.stop()
        assert not caplog.records
        _warn_if_exposed("0.0.0.0", 7070, tls=True, authenticated=True)
        assert not caplog.records
        _warn_if_exposed("0.0.0.0", 7070, tls=False, authenticated=True)
        _warn_if_exposed("10.0.0.7", 7070, tls=True, authenticated=False)
    first, second = (r.getMessage() for r in caplog.records)
    assert "changefeed on 0.0.0.0:7070 is served in plaintext beyond loopback" in first
    assert "changefeed on 10.0.0.7:7070 takes calls from anyone" in second


def test_serve_takes_a_credentials_file(tmp_path: object, credentials_file: str) -> None:
    from csnd.service.config import build_config

    url = "postgresql://u@h/db?slot=s&publication=p"
    c = build_config({"changelog": "x", "credentials_file": credentials_file}, {}, [url], environ={})
    assert c.credentials_file == credentials_file and (c.max_streams, c.max_streams_per_peer) == (256, 64)
    c = build_config(
        {"changelog": "x"},
        {},
        [url],
        environ={"CSND_MAX_STREAMS": "9", "CSND_CREDENTIALS_FILE": credentials_file},
    )
    assert (c.max_streams, c.credentials_file) == (9, credentials_file)
