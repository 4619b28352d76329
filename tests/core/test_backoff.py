"""csnd.core.backoff against a brute-force oracle (Hypothesis), and the four retry loops that use it.

The oracle recomputes every answer of `failed()` from the whole history of
events, times and draws; the policy's own state is checked after every
step.  Then the properties the callers count on, stated on their own: every
wait is within [0, cap] and below the ceiling, no wait reaches past the
give-up time, and a loop whose every attempt fails stops at the give-up
time (plus one attempt), never before it.  Last, each caller is shown to
take its waits from this policy, with its own settings.
"""

from __future__ import annotations

import os
import random
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from csnd.core.backoff import Backoff
from csnd.core.errors import ChangefeedUnavailable

EVENTS = ("connected", "flowing", "lost", "failed")
ROOT = Path(__file__).resolve().parents[2]

# (event, seconds the clock moves before it, the draw a failure gets)
scripts = st.lists(
    st.tuples(
        st.sampled_from(EVENTS),
        st.sampled_from([0.0, 0.05, 0.1, 1.0, 3.0, 7.5]),
        st.one_of(st.sampled_from([0.0, 1.0]), st.floats(0.0, 1.0)),
    ),
    max_size=60,
)


def _first_within_cap(s: dict[str, float | None]) -> bool:
    first, cap = s["first"], s["cap"]
    return first is not None and cap is not None and first <= cap


policies: st.SearchStrategy[dict[str, float | None]] = st.fixed_dictionaries(
    {
        "first": st.sampled_from([0.1, 0.25, 0.5]),
        "cap": st.sampled_from([0.5, 2.0, 5.0, 30.0]),
        "give_up": st.one_of(st.none(), st.sampled_from([0.0, 1.0, 10.0, 40.0])),
        "stable": st.one_of(st.none(), st.sampled_from([0.0, 4.0, 10.0])),
    }
).filter(_first_within_cap)


def oracle(history: list[tuple[str, float, float]], s: dict[str, float | None]) -> float | None:
    """What the last event of `history` (a failure) gets, recomputed from the start."""
    first, cap, give_up, stable = s["first"], s["cap"], s["give_up"], s["stable"]
    assert first is not None and cap is not None
    # Where the current outage began: after the last `flowing`, or at a failure that
    # ended a connection which had stayed up `stable` seconds.
    start = 0
    connected_at = None
    for i, (ev, t, _) in enumerate(history):
        if ev == "connected":
            connected_at = t
        elif ev == "flowing":
            start = i + 1
        elif ev == "failed":
            if stable is not None and connected_at is not None and t - connected_at >= stable:
                start = i
            connected_at = None
    outage = history[start:]
    down_since = next(t for ev, t, _ in outage if ev in ("lost", "failed"))
    now, draw = outage[-1][1], outage[-1][2]
    if give_up is not None and now - down_since >= give_up:
        return None
    handed = sum(
        1 for ev, t, _ in outage[:-1] if ev == "failed" and (give_up is None or t - down_since < give_up)
    )
    wait: float = draw * min(cap, first * 2**handed)
    return wait if give_up is None else max(0.0, min(wait, down_since + give_up - now))


# A 2-core shared machine: no per-example deadline.
@settings(deadline=None)
@given(policies, scripts)
def test_backoff_matches_the_oracle(
    s: dict[str, float | None], script: list[tuple[str, float, float]]
) -> None:
    now = [0.0]
    draws: list[float] = []
    b = Backoff(lambda: now[0], random=lambda: draws.pop(), **s)  # type: ignore[arg-type]
    history: list[tuple[str, float, float]] = []
    for ev, dt, draw in script:
        now[0] += dt
        history.append((ev, now[0], draw))
        if ev == "failed":
            draws.append(draw)
            ceiling = b.ceiling
            got = b.failed()
            assert got == pytest.approx(oracle(history, s), abs=1e-9), history
            if got is not None:
                assert 0.0 <= got <= ceiling <= s["cap"]  # type: ignore[operator]
                if s["give_up"] is not None:
                    assert b.down_since is not None
                    assert now[0] + got <= b.down_since + s["give_up"] + 1e-9, "a wait past the give-up time"
            draws.clear()  # (a failure that gives up draws nothing)
        else:
            getattr(b, ev)()
        b._check()


@settings(deadline=None)
@given(
    st.sampled_from([0.1, 0.2, 0.5]),
    st.sampled_from([1.0, 5.0, 30.0]),
    st.floats(0.0, 400.0),
    st.lists(st.floats(0.05, 3.0), min_size=1, max_size=50),  # (an attempt takes some time)
    # (a seeded Random: st.randoms draws Hypothesis data for every jitter, and a long
    # loop of them ran past its data limit, failing the health check one run in many)
    st.integers(0, 2**32 - 1).map(random.Random),
)
def test_a_loop_of_failures_stops_at_the_give_up_time(
    first: float, cap: float, give_up: float, attempts: list[float], rng: random.Random
) -> None:
    """Attempts that each take a while and fail: the loop stops once give_up has passed, not before, not later."""
    now = [0.0]
    b = Backoff(lambda: now[0], first=first, cap=cap, give_up=give_up, random=rng.random)
    i = 0
    waited = 0.0
    while True:
        now[0] += attempts[i % len(attempts)]  # the attempt itself
        i += 1
        wait = b.failed()
        if wait is None:
            break
        assert 0.0 <= wait <= cap
        waited += wait
        now[0] += wait
        assert i < 10_000, "the loop did not stop"
    assert b.down_since is not None
    elapsed = now[0] - b.down_since
    assert give_up <= elapsed <= give_up + max(attempts) + 1e-9, (elapsed, give_up)


def test_the_ceiling_doubles_to_the_cap_and_flowing_resets_it() -> None:
    now = [0.0]
    b = Backoff(lambda: now[0], first=0.2, cap=5.0, give_up=300.0, random=lambda: 1.0)
    assert [b.failed() for _ in range(7)] == pytest.approx([0.2, 0.4, 0.8, 1.6, 3.2, 5.0, 5.0])
    b.flowing()
    assert b.down_since is None and b.failed() == 0.2
    with pytest.raises(ValueError, match=r"random source gave 1\.5"):
        Backoff(lambda: 0.0, first=1, cap=2, give_up=None, random=lambda: 1.5).failed()
    with pytest.raises(ValueError, match="0 < first <= cap"):
        Backoff(lambda: 0.0, first=3, cap=2, give_up=None)


def test_the_waits_are_spread() -> None:
    """Full jitter: many clients that failed together do not come back in the same instant."""
    rng = random.Random(7)
    drawn = [
        Backoff(lambda: 0.0, first=1.0, cap=1.0, give_up=None, random=rng.random).failed()
        for _ in range(1000)
    ]
    waits = [w for w in drawn if w is not None]
    assert len(waits) == len(drawn)  # (no give-up time: never None)
    assert min(waits) < 0.05 and max(waits) > 0.95
    assert len({round(w, 2) for w in waits}) > 90


# --- the callers ------------------------------------------------------------------------


def _doubling_outside_core() -> list[str]:
    """Lines outside csnd/core/backoff.py that double a wait by hand (`min(x * 2, ...)`)."""
    found = []
    for top in ("csnd", "reader", "decoder", "sender", "coordinator", "consumers", "gtm"):
        for dirpath, dirnames, filenames in os.walk(ROOT / top):
            dirnames[:] = [d for d in dirnames if not os.path.islink(os.path.join(dirpath, d))]
            for name in filenames:
                path = Path(dirpath) / name
                if name.endswith(".py") and path != ROOT / "csnd" / "core" / "backoff.py":
                    for n, line in enumerate(path.read_text().splitlines(), 1):
                        if re.search(r"min\(\s*[\w.]+\s*\*\s*2\s*,", line):
                            found.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    return found


def test_no_retry_loop_doubles_its_own_wait() -> None:
    assert _doubling_outside_core() == []


def test_the_live_reader_reconnects_by_it() -> None:
    from csnd.reader.live import LiveOptions, LiveSource
    from csnd.reader.reconnect import RECONNECT_FIRST_S, RECONNECT_MAX_S, RECONNECT_STABLE_S

    source = LiveSource("dn1", LiveOptions("host=127.0.0.1 port=1", "s", "p", reconnect_give_up_s=42.0))
    b = source.backoff
    assert isinstance(b, Backoff)
    assert (b.first, b.cap, b.give_up, b.stable) == (
        RECONNECT_FIRST_S,
        RECONNECT_MAX_S,
        42.0,
        RECONNECT_STABLE_S,
    )


def test_the_service_restarts_its_pipeline_by_it(tmp_path: Path) -> None:
    from csnd.service.config import ServeConfig, ServedSource
    from csnd.service.serve import RESTART_FIRST_S, RESTART_MAX_S, Service

    service = Service(ServeConfig(sources=(ServedSource("x.pgstream"),), changelog=str(tmp_path)))
    b = service.restart_backoff
    assert isinstance(b, Backoff)
    assert (b.first, b.cap, b.give_up) == (RESTART_FIRST_S, RESTART_MAX_S, None)  # (its window gives up)


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[str]:
    from csnd.gtm import generate_cluster

    generate_cluster(str(tmp_path), 1, 20, seed=3, binary=True)
    proc = subprocess.Popen(
        [sys.executable, "-m", "csnd.cli", "node", str(tmp_path / "dn1.pgstream"), "--listen", "127.0.0.1:0"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proc.stderr is not None
    line = proc.stderr.readline()
    m = re.search(r"listening on (127\.0\.0\.1:\d+)", line)
    assert m, f"the agent did not start: {line!r}"
    try:
        yield m.group(1)
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_the_node_agent_client_reconnects_by_it(agent: str) -> None:
    from csnd.runtime.remote import BACKOFF_FIRST_S, BACKOFF_MAX_S, RemoteNode

    node = RemoteNode(agent, give_up_s=12.0)
    try:
        b = node.backoff
        assert isinstance(b, Backoff)
        assert (b.first, b.cap, b.give_up) == (BACKOFF_FIRST_S, BACKOFF_MAX_S, 12.0)
        assert b.down_since is None  # (the agent answered: no outage)
    finally:
        node.channel.close()


def test_the_changefeed_client_reconnects_by_it(tmp_path: Path) -> None:
    """Its waits are the policy's draws; the connect timeout is its give-up; a stream resets it."""
    from csnd.changelog import Changelog
    from csnd.consumers.client import BACKOFF_FIRST_S, BACKOFF_MAX_S, Changefeed
    from csnd.testing.pgserver import free_port
    from tests.service.feedkit import fill, serve

    port = free_port()
    feed = Changefeed(f"127.0.0.1:{port}", connect_timeout=1.0, give_up=60.0)
    b = feed.backoff
    assert isinstance(b, Backoff) and (b.first, b.cap, b.give_up) == (BACKOFF_FIRST_S, BACKOFF_MAX_S, 1.0)
    draws: list[float] = []

    def draw() -> float:
        draws.append(0.5)
        return 0.5

    b.random = draw
    with pytest.raises(ChangefeedUnavailable, match="does not answer within 1 s"):
        feed.next(timeout=30)
    assert draws, "the client never asked the policy for a wait"

    with Changelog(str(tmp_path / "log")) as log:
        fill(log, range(1, 4))
        srv = serve(log, listen=f"127.0.0.1:{port}")
        try:
            feed = Changefeed(f"127.0.0.1:{port}", connect_timeout=30.0, give_up=60.0)
            feed.backoff.random = draw
            assert [feed.next(timeout=30)[0] for _ in range(3)] == [1, 2, 3]  # type: ignore[index]
            # the stream worked: no outage, the ceiling back at the start, the reconnect give-up in force
            assert feed.backoff.down_since is None and feed.backoff.ceiling == BACKOFF_FIRST_S
            assert feed.backoff.give_up == 60.0
            feed.close()
        finally:
            srv.stop()
