"""Errors that name the cause: what a newcomer gets wrong first, each said in one line that says why.

A taken or unknown listen address, a host that does not resolve, a port
nothing listens on, a file where a directory belongs, a misspelt CSND_*
variable, a CSN given as an LSN or past the newest one, a key=value
conninfo, an empty list of subscriptions.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from csnd import cli
from csnd.service.config import build_config
from tests.service.servekit import Served, start_serve, subscribe, wait_for

CSND = [sys.executable, "-m", "csnd.cli"]
# A name no resolver knows (RFC 6761: .invalid never resolves).
NO_SUCH_HOST = "no-such-host.invalid"


def _csnd(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("CSND_")}
    environ.update(env or {})
    return subprocess.run([*CSND, *args], capture_output=True, text=True, timeout=120, env=environ)


def _failed(proc: subprocess.CompletedProcess[str], status: int = 1) -> str:
    """The one error line of a command that failed with `status`, and nothing of gRPC's own logging."""
    assert proc.returncode == status, proc.stderr
    assert "Traceback" not in proc.stderr and "internal error" not in proc.stderr, proc.stderr
    assert ".cc:" not in proc.stderr, proc.stderr  # (gRPC C-core's log lines: `E1128 ... add_port.cc:83]`)
    return proc.stderr.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def dn1(tmp_path_factory: pytest.TempPathFactory) -> str:
    out = tmp_path_factory.mktemp("gen")
    assert _csnd("generate", "--transactions", "20", "--out", str(out)).returncode == 0
    return str(out / "dn1.pgstream")


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A port something listens on for the whole test."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


def _dead_port() -> int:
    """A port nothing listens on (bound and closed again, never listened on)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


def _logged(line: str) -> str:
    """A log line without its timestamp (`TIME csnd: MESSAGE`)."""
    return line.split(" ", 1)[1]


# --- listening ---------------------------------------------------------------------------


def test_a_taken_grpc_port_names_the_cause(dn1: str, tmp_path: Path, taken_port: int) -> None:
    proc = _csnd("serve", dn1, "--changelog", str(tmp_path / "log"), "--listen", f"127.0.0.1:{taken_port}")
    assert _failed(proc) == (
        f"csnd serve: error: cannot listen on 127.0.0.1:{taken_port}: the address is in use "
        "(another csnd serve, or another program, listens there); stop it or choose another --listen port"
    )


def test_a_taken_node_agent_port_names_the_cause(dn1: str, taken_port: int) -> None:
    proc = _csnd("node", dn1, "--listen", f"127.0.0.1:{taken_port}")
    line = _failed(proc)
    assert line.startswith(
        f"csnd node: error: cannot listen on 127.0.0.1:{taken_port}: the address is in use"
    )


def test_an_unknown_listen_host_names_the_cause(dn1: str, tmp_path: Path) -> None:
    proc = _csnd("serve", dn1, "--changelog", str(tmp_path / "log"), "--listen", f"{NO_SUCH_HOST}:0")
    line = _failed(proc)
    assert line.startswith(
        f"csnd serve: error: cannot listen on {NO_SUCH_HOST}:0: the host {NO_SUCH_HOST} is not known here"
    ), line


# --- reaching a service ------------------------------------------------------------------


@pytest.mark.parametrize("command", [["subscriptions", "list"], ["snapshot"]])
def test_a_dead_port_says_nothing_listens(command: list[str]) -> None:
    port = _dead_port()
    tables = ["public.t"] if command == ["snapshot"] else []
    line = _failed(_csnd(*command, f"127.0.0.1:{port}", *tables))
    assert f"nothing listens on 127.0.0.1:{port}" in line, line


@pytest.mark.parametrize("command", [["subscriptions", "list"], ["subscribe"]])
def test_an_unknown_host_is_not_called_a_closed_port(command: list[str]) -> None:
    line = _failed(
        _csnd(*command, f"{NO_SUCH_HOST}:7070", *(["--limit", "1"] if command == ["subscribe"] else []))
    )
    assert f"the host {NO_SUCH_HOST} is not known" in line and "accepts connections" not in line, line


# --- settings ----------------------------------------------------------------------------


def test_a_changelog_that_is_a_file_is_named_so(dn1: str, tmp_path: Path) -> None:
    (tmp_path / "log").write_text("")
    line = _failed(_csnd("serve", dn1, "--changelog", str(tmp_path / "log")))
    assert line == (
        f"csnd serve: error: --changelog {tmp_path / 'log'} is a file, not a directory: name a directory "
        "(csnd serve creates it when it does not exist)"
    )


def test_a_misspelt_variable_is_warned_about_once(dn1: str, tmp_path: Path) -> None:
    (tmp_path / "log").write_text("")  # (then the service stops at once, after the warning)
    proc = _csnd(
        "serve", dn1, "--changelog", str(tmp_path / "log"), env={"CSND_LISTN": "127.0.0.1:0", "CSND_IMPL": ""}
    )
    warnings = [_logged(line) for line in proc.stderr.splitlines() if "CSND_LISTN" in line]
    assert warnings == [
        "csnd: the environment variable CSND_LISTN is not a setting of csnd and is ignored "
        "(did you mean CSND_LISTEN?)"
    ], proc.stderr
    assert "CSND_IMPL" not in proc.stderr  # (read elsewhere: known, though not a setting of serve)


@pytest.mark.parametrize("command", [["changelog", "d"], ["subscribe", "h:1"]])
def test_from_csn_takes_an_lsn(command: list[str]) -> None:
    """In single mode a CSN is the commit LSN: 0/7B7A998 is csn 129477016."""
    args = cli.build_parser().parse_args([*command, "--from-csn", "0/7B7A998"])
    assert args.from_csn == 0x7B7A998
    got = cli.build_parser().parse_args(["subscriptions", "reset", "h:1", "x", "--csn", "1/0"])
    assert got.csn == 1 << 32
    proc = _csnd(*command, "--from-csn", "0/zz")
    assert (
        proc.returncode == 2
        and "expected a csn (a whole number >= 0) or an LSN like 0/16B3748" in proc.stderr
    )


def test_serve_takes_a_key_value_conninfo() -> None:
    """`csnd slot` took one; serve made its first word a node name and the rest a file."""
    conninfo = "host=127.0.0.1 port=5432 dbname=shop user=csnd"
    (plain,) = build_config({}, {"changelog": "x", "slot": "s"}, [conninfo], environ={}).sources
    assert plain.is_live and plain.name is None and plain.target == conninfo and plain.live.slot == "s"
    (named,) = build_config({}, {"changelog": "x"}, [f"dn7={conninfo}"], environ={}).sources
    assert named.is_live and named.name == "dn7" and named.target == conninfo
    (recorded,) = build_config({}, {"changelog": "x"}, ["dn1=dn1.pgstream"], environ={}).sources
    assert not recorded.is_live and recorded.name == "dn1"


# --- a running service -------------------------------------------------------------------


@pytest.fixture
def served(dn1: str, tmp_path: Path) -> Iterator[Served]:
    srv = start_serve([dn1], str(tmp_path / "log"))
    try:
        wait_for(lambda: srv.newest_csn() > 0, "the recording in the changelog")
        yield srv
    finally:
        srv.terminate()


def test_an_empty_subscription_list_says_so_on_stderr(served: Served) -> None:
    got = _csnd("subscriptions", "list", served.address)
    assert got.returncode == 0, got.stderr
    assert got.stdout == "" and got.stderr == "csnd subscriptions: no named subscriptions\n"


def test_a_start_past_the_newest_csn_is_said_once(served: Served, dn1: str, tmp_path: Path) -> None:
    newest = json.loads((Path(dn1).parent / "expected.jsonl").read_text().splitlines()[-1])["csn"]
    wait_for(lambda: served.newest_csn() == newest, "the whole recording in the changelog")
    got = subscribe(served.address, "--from-csn", str(newest + 1000), "--idle-timeout", "1")
    assert got.returncode == 0 and got.stdout == "", got.stderr
    said = [_logged(line) for line in got.stderr.splitlines() if "past the newest" in line]
    assert said == [
        f"csnd: changefeed {served.address}: csn {newest + 1000} is past the newest csn {newest}: "
        "nothing comes until transactions after it are committed"
    ], got.stderr
    assert served.terminate()[0] == 0
    got = _csnd("changelog", str(tmp_path / "log"), "--from-csn", str(newest + 1000))
    assert got.returncode == 0 and got.stdout == ""
    assert got.stderr == (
        f"csnd changelog: --from-csn {newest + 1000} is past the newest csn {newest}: nothing to print\n"
    )
