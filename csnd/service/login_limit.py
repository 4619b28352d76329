"""How many refused logins a client address may make: a sliding window per address.

    /login ─► retry_after(addr, now) ─┬─ None  ─► check the token ─► failed(addr, now) or succeeded(addr)
                                      └─ secs  ─► 429, Retry-After: secs (the token is not looked at)

The dashboard's token is the key to every figure, so a client guessing it
must not get many tries: after `max_failures` refused tokens within
`window_s` seconds, the address is refused without a look at what it sends
until the oldest of those failures leaves the window.  A refused try is not
counted (it was not checked), so a guesser who keeps trying is not held out
for longer than the window; a good token clears the address's count.

Pure: the time is an argument, so tests move it by hand.  The table is
bounded (`max_clients` addresses, the least recently failing dropped first):
an attacker with many addresses (an IPv6 /64) can push out an address's
count, never grow the memory.  Behind a reverse proxy every client is the
proxy's address; the limit then holds for all of them together.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from typing import Final

# Five refused tokens a minute: a person mistyping gets several tries and waits
# at most a minute; a guesser gets 7,200 tries a day, nothing against a random
# token (`csnd` writes 32 random bytes), everything against "admin".
MAX_FAILURES: Final = 5
WINDOW_S: Final = 60.0
# Addresses remembered at once: ~200 bytes each, ~2 MB at most.
MAX_CLIENTS: Final = 10_000


class LoginLimiter:
    """Refused logins per client address within a sliding window (see the module docstring)."""

    def __init__(
        self, max_failures: int = MAX_FAILURES, window_s: float = WINDOW_S, max_clients: int = MAX_CLIENTS
    ) -> None:
        if max_failures < 1 or window_s <= 0 or max_clients < 1:
            raise ValueError("a login limit needs max_failures >= 1, window_s > 0 and max_clients >= 1")
        self.max_failures = max_failures
        self.window_s = window_s
        self.max_clients = max_clients
        # address -> times of its recent failures, oldest first; the least recently
        # failing address first.  Only the newest `max_failures` matter.
        self._failures: OrderedDict[str, deque[float]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._failures)

    def failures(self, client: str, now: float) -> int:
        """The refused logins of `client` within the window ending at `now`."""
        times = self._failures.get(client)
        return 0 if times is None else sum(1 for t in times if t > now - self.window_s)

    def retry_after(self, client: str, now: float) -> float | None:
        """None when `client` may try a token now, else the seconds until it may."""
        times = self._failures.get(client)
        if times is None or len(times) < self.max_failures:
            return None
        # (the deque holds the newest max_failures: the oldest of them leaving the window frees a try)
        oldest = times[0]
        if oldest <= now - self.window_s:
            return None
        return oldest + self.window_s - now

    def failed(self, client: str, now: float) -> None:
        """`client` sent a token that was refused at `now`."""
        times = self._failures.pop(client, None)
        if times is None:
            times = deque(maxlen=self.max_failures)
            while len(self._failures) >= self.max_clients:
                self._failures.popitem(last=False)
        times.append(now)
        self._failures[client] = times  # (now the most recently failing)

    def succeeded(self, client: str) -> None:
        """`client` sent the token: its count starts over."""
        self._failures.pop(client, None)

    def check(self) -> None:
        """Assert every invariant (for tests)."""
        assert len(self._failures) <= self.max_clients
        for times in self._failures.values():
            assert 1 <= len(times) <= self.max_failures
            assert all(a <= b for a, b in zip(times, list(times)[1:], strict=False))
