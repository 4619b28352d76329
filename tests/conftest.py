"""Settings every test shares.

Hypothesis: no per-example deadline and no "too slow" health check.  The
suite runs on a shared 2-core machine beside real servers, a JVM and its own
subprocesses; an example that takes 300 ms there is load, not a defect, and
timing goals are benchmarks in bench/, never assertions in tests.  A test's
own `@settings` still sets its example counts.

Signals: a test that runs a command or the service in this process
(`cli.main(...)`, `Service(...).run()`) leaves Ctrl-C, SIGTERM and SIGHUP as
the run leaves them at its end -- ignored, as a process about to exit wants.
An ignored signal survives exec, so every process a later test of the same
worker started inherited SIGHUP ignored: a `csnd serve` took itself for one
run under nohup and never stopped on SIGHUP (the SIGHUP test timed out in
full runs whenever it followed test_serve_ready's in-process stop, which
gave back SIGTERM and SIGINT but not SIGHUP).  Each test gets all three back
as they were before it.
"""

import signal
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile("csnd", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("csnd")

_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


@pytest.fixture(autouse=True)
def _stop_signals_as_they_were() -> Iterator[None]:
    saved = {s: signal.getsignal(s) for s in _STOP_SIGNALS}
    yield
    for s, handler in saved.items():
        signal.signal(s, handler)
