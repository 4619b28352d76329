"""Command-line manners: arguments checked at parse time whatever the source, -v anywhere, one line per failure."""

from __future__ import annotations

import argparse
import ctypes
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from csnd import cli
from csnd.core.errors import TimestampError
from csnd.core.ids import PG_TIME_MAX_US, PG_TIME_MIN_US, pg_time_to_iso
from csnd.reader.pgoutput import encode_begin, encode_commit, encode_xlogdata
from csnd.reader.streamfile import StreamHeader, StreamWriter

CSND = [sys.executable, "-m", "csnd.cli"]


def _csnd(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CSND, *args], capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("gen")
    assert _csnd("generate", "--nodes", "1", "--transactions", "20", "--out", str(out)).returncode == 0
    return out / "dn1.pgstream"


def test_verbose_after_the_subcommand(small: Path) -> None:
    before = _csnd("-v", "replay", str(small), "--decoders", "1")
    after = _csnd("replay", "-v", str(small), "--decoders", "1")
    assert after.returncode == 0, after.stderr
    assert after.stdout == before.stdout and "done:" in after.stderr


def test_every_subcommand_takes_verbose_after_its_name() -> None:
    parser = cli.build_parser()
    (commands,) = (a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name, command in commands.choices.items():
        assert any("--verbose" in a.option_strings for a in command._actions), name
    assert parser.parse_args(["serve", "x.pgstream", "--changelog", "d", "-v"]).verbose is True


@pytest.mark.parametrize("n", ["0", "-1", str(cli.MAX_DECODERS + 1), "1000"])
def test_decoders_out_of_range_is_a_usage_error(small: Path, n: str) -> None:
    proc = _csnd("replay", str(small), "--decoders", n)
    assert proc.returncode == 2 and f"--decoders: must be 1 to {cli.MAX_DECODERS}" in proc.stderr
    # (the help states the rule, not this machine's number: docs/reference.md is made from it)
    assert "at most 4 per core" in " ".join(_csnd("replay", "--help").stdout.split())


def test_until_lsn_is_checked_for_files_too(small: Path) -> None:
    proc = _csnd("replay", str(small), "--until-lsn", "zzz")
    assert proc.returncode == 2 and "argument --until-lsn: invalid LSN 'zzz'" in proc.stderr


@pytest.mark.parametrize("verbose", [False, True])
def test_an_unexpected_exception_is_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], verbose: bool
) -> None:
    def broken(args: object) -> int:
        raise KeyError("boom")

    monkeypatch.setitem(cli.COMMANDS, "generate", broken)
    argv = ["generate", "--out", "x"] + (["-v"] if verbose else [])
    assert cli.main(argv) == 1
    err = capsys.readouterr().err
    assert err.strip().splitlines()[-1] == (
        "csnd generate: internal error: KeyError: 'boom' (run with -v for the traceback)"
    )
    assert ("Traceback" in err) is verbose


def test_commit_time_out_of_range_names_node_lsn_and_xid(tmp_path: Path) -> None:
    """It ended in a 20-line OverflowError traceback from the JSON head."""
    path = tmp_path / "t.pgstream"
    with StreamWriter(str(path), StreamHeader(node="dn1", binary=False, mode="single")) as w:
        for good, xid in ((True, 700), (False, 701)):
            t = 5 if good else PG_TIME_MAX_US + 1
            w.write_frame(encode_xlogdata(0x1F00 + xid, 0, 1, encode_begin(0x2000 + xid, t, xid)))
            w.write_frame(encode_xlogdata(0x2000 + xid, 0, 1, encode_commit(0x2000 + xid, 0x2008 + xid, t)))
    proc = _csnd("replay", str(path), "--decoders", "1")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == [
        f"csnd replay: error: node dn1: {path}: commit timestamp of transaction 701 is {PG_TIME_MAX_US + 1} "
        "microseconds from 2000-01-01, outside the years 1-9999 the output can write; the stream is corrupt "
        "at 0/22BD"
    ]


@pytest.mark.parametrize("us", [PG_TIME_MIN_US - 1, PG_TIME_MAX_US + 1, 2**63 - 1, -(2**63)])
def test_the_conversion_raises_a_typed_error(us: int) -> None:
    with pytest.raises(TimestampError, match="outside the years 1-9999"):
        pg_time_to_iso(us)
    assert pg_time_to_iso(PG_TIME_MAX_US).startswith("9999-12-31T23:59:59.999999")
    assert pg_time_to_iso(PG_TIME_MIN_US).startswith("0001-01-01T00:00:00")


@pytest.mark.parametrize(
    "address", ["localhost", "127.0.0.1:99999", "127.0.0.1:", "127.0.0.1:http", "host:-1"]
)
@pytest.mark.parametrize("command", ["serve --listen", "serve --http", "node --listen"])
def test_listen_addresses_are_checked_as_arguments(
    small: Path, tmp_path: Path, command: str, address: str
) -> None:
    """--listen localhost listened on port 443, :99999 wrapped to 34463 after a gRPC warning."""
    name, flag = command.split()
    proc = _csnd(name, str(small), "--changelog", str(tmp_path / "log"), flag, address, "--decoders", "1")
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == (
        f"csnd {name}: error: argument {flag}: expected HOST:PORT with PORT 0 to 65535 "
        f"(0: any free port), got {address!r}"
    )
    assert not (tmp_path / "log").exists()


def _node_agent(recording: Path, listen: str) -> subprocess.Popen[str]:
    """`csnd node RECORDING --listen LISTEN`, its stderr a pipe (its first line: the ready line)."""
    return subprocess.Popen(
        [*CSND, "node", str(recording), "--listen", listen, "--decoders", "1"],
        stderr=subprocess.PIPE,
        text=True,
    )


def test_a_node_agent_stops_on_a_sigterm_that_another_thread_receives(small: Path) -> None:
    """The kernel hands a process's SIGTERM to any thread; the agent stopped only if it was the main one.

    Its main thread slept in an untimed wait, and Python runs a handler only
    when the main thread runs bytecode: a signal taken by one of gRPC's
    threads left the agent running for good.  tgkill aims it at such a thread.
    """
    proc = _node_agent(small, "127.0.0.1:0")
    assert proc.stderr is not None
    try:
        assert "listening on" in proc.stderr.readline()
        others = [int(t) for t in os.listdir(f"/proc/{proc.pid}/task") if int(t) != proc.pid]
        assert others, "the agent has no threads besides the main one"
        assert ctypes.CDLL(None, use_errno=True).tgkill(proc.pid, others[0], signal.SIGTERM) == 0
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    assert "stopped" in err


def test_an_empty_listen_host_is_the_loopback(small: Path) -> None:
    """`--listen :PORT` is 127.0.0.1:PORT, as `--http :PORT` always was (gRPC refused an empty host)."""
    proc = _node_agent(small, ":0")
    assert proc.stderr is not None
    try:
        line = proc.stderr.readline()
    finally:
        proc.terminate()
        proc.communicate(timeout=60)
    assert line.startswith("csnd node dn1: listening on 127.0.0.1:"), line
