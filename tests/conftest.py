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

PostgreSQL version: every test server of a run is the version
`CSND_PG_VERSION` names (15 unless set; `make test` runs the live modules a
second time on 18).  The run's header names it, and so does every failure's
report and the run's last line, so a failure says which version it was on.
"""

import signal
import sys
from collections.abc import Generator, Iterator

import pluggy
import pytest
from hypothesis import HealthCheck, settings

from csnd.testing.pgserver import default_version, pg_bin_dir

settings.register_profile("csnd", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("csnd")

_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


@pytest.fixture(autouse=True)
def _stop_signals_as_they_were() -> Iterator[None]:
    saved = {s: signal.getsignal(s) for s in _STOP_SIGNALS}
    yield
    for s, handler in saved.items():
        signal.signal(s, handler)


@pytest.fixture(autouse=True)
def _no_created_slots_carried_over() -> Iterator[None]:
    """A slot a test made in this process is not the next test's: a `csnd` run names the slots it created."""
    yield
    sourcecheck = sys.modules.get("csnd.reader.sourcecheck")
    if sourcecheck is not None:
        sourcecheck.CREATED_SLOTS.clear()


def pytest_configure(config: pytest.Config) -> None:
    try:
        default_version()
    except RuntimeError as e:  # (a bad CSND_PG_VERSION: one line, not a traceback per worker)
        raise pytest.UsageError(str(e)) from None


def pytest_report_header(config: pytest.Config) -> str:
    version = default_version()
    return (
        f"csnd: test servers are PostgreSQL {version} ({pg_bin_dir(version)}; CSND_PG_VERSION picks 15 or 18)"
    )


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pluggy.Result[pytest.TestReport], None]:
    outcome = yield
    report = outcome.get_result()
    if report.failed:
        report.sections.append(("csnd", f"failed against PostgreSQL {default_version()} test servers"))


@pytest.hookimpl(trylast=True)
def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    terminalreporter.write_line(
        f"csnd: this run's test servers were PostgreSQL {default_version()} "
        "(tests that take the `pg18` fixture or start_server(version=18) ran on 18)"
    )
