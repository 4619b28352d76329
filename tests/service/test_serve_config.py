"""`csnd serve`'s settings as a user gives them: flags, CSND_* variables, a TOML file.

The contract is docs/design.md section 8.

Precedence is flags > environment > config file > defaults.  A value of the
wrong type is one line naming the flag, variable or key and the type it
takes: exit 2 for the command line and the environment (a usage error, as
argparse's), 1 for the file (a configuration error); never "internal error".
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from csnd.core.errors import ConfigError, UsageError
from csnd.service.config import build_config
from csnd.service.settings import SETTINGS
from tests.service.servekit import start_serve

CSND = [sys.executable, "-m", "csnd.cli"]


def _csnd(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("CSND_")}
    environ.update(env or {})
    return subprocess.run([*CSND, *args], capture_output=True, text=True, timeout=120, env=environ)


def _one_line(proc: subprocess.CompletedProcess[str], status: int) -> str:
    assert proc.returncode == status, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert "Traceback" not in proc.stderr and "internal error" not in proc.stderr, proc.stderr
    return lines[-1]


@pytest.fixture(scope="module")
def dn1(tmp_path_factory: pytest.TempPathFactory) -> str:
    out = tmp_path_factory.mktemp("gen")
    assert _csnd("generate", "--transactions", "5", "--out", str(out)).returncode == 0
    return str(out / "dn1.pgstream")


@pytest.mark.parametrize(
    ("toml", "line"),
    [
        ('decoders = "two"', 'decoders: expected a whole number >= 1, got "two"'),
        ("decoders = true", "decoders: expected a whole number >= 1, got true"),
        ("decoders = 2.5", "decoders: expected a whole number >= 1, got 2.5"),
        ("retention_hours = -1", "retention_hours: expected a number > 0, got -1"),
        ("give_up = [1]", "give_up: expected a number > 0, got [1]"),
        (
            'listen = "localhost"',
            'listen: expected HOST:PORT with PORT 0 to 65535 (0: any free port), got "localhost"',
        ),
        ("token_file = 5", "token_file: expected a string, got 5"),
        ('[defaults]\nmode = "paxos"', '[defaults]: mode: expected single or gtm, got "paxos"'),
        ('[defaults]\ncreate_slot = "maybe"', '[defaults]: create_slot: expected true or false, got "maybe"'),
        ('[[source]]\ntarget = "x"\nslot = 5', "[[source]] #1: slot: expected a string, got 5"),
        ('source = "x"', 'source: expected [[source]] tables, got "x"'),
        (
            "[dashboard]\nlag_seconds_red = false",
            "[dashboard]: lag_seconds_red: expected a number >= 0, got false",
        ),
        ('[defaults]\nslots = "s"', "[defaults]: unknown setting 'slots'"),
        ("[snapshot]\nsplit = 5", "[snapshot]: split: expected a string, got 5"),
        ('[snapshot]\nsplit = "pages"', '[snapshot]: split must be "key" or "ctid", not \'pages\''),
    ],
)
def test_a_wrong_type_in_the_file_names_the_key(dn1: str, tmp_path: Path, toml: str, line: str) -> None:
    config = tmp_path / "c.toml"
    config.write_text(f'changelog = "{tmp_path / "log"}"\n{toml}\n')
    proc = _csnd("serve", dn1, "--config", str(config))
    assert _one_line(proc, 1).startswith(f"csnd serve: error: --config {config}: {line}")
    assert not (tmp_path / "log").exists()


@pytest.mark.parametrize(
    ("env", "line"),
    [
        ({"CSND_DECODERS": "two"}, "CSND_DECODERS: expected a whole number >= 1, got 'two'"),
        ({"CSND_LISTEN": "127.0.0.1:99999"}, "CSND_LISTEN: expected HOST:PORT with PORT 0 to 65535"),
        ({"CSND_GIVE_UP": "soon"}, "CSND_GIVE_UP: expected a number > 0, got 'soon'"),
        ({"CSND_CREATE_SLOT": "maybe"}, "CSND_CREATE_SLOT: expected true or false, got 'maybe'"),
    ],
)
def test_a_wrong_environment_variable_is_a_usage_error(
    dn1: str, tmp_path: Path, env: dict[str, str], line: str
) -> None:
    proc = _csnd("serve", dn1, "--changelog", str(tmp_path / "log"), env=env)
    assert _one_line(proc, 2).startswith(f"csnd serve: error: {line}")
    assert not (tmp_path / "log").exists()


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["serve", "--decoders", "two"], "argument --decoders: expected a whole number >= 1, got 'two'"),
        (["serve", "--retention-bytes", "1.5"], "argument --retention-bytes: expected a whole number >= 1"),
        (["replay", "--decoders", "abc"], "argument --decoders: expected a whole number from 1 to"),
        (["replay", "--give-up", "soon"], "argument --give-up: expected a number of seconds > 0, got 'soon'"),
        (["subscribe", "h:1", "--limit", "x"], "argument --limit: expected a whole number >= 1, got 'x'"),
        (
            ["subscribe", "h:1", "--from-csn", "-"],
            "argument --from-csn: expected a csn (a whole number >= 0)",
        ),
    ],
)
def test_a_wrong_flag_is_a_usage_error(dn1: str, args: list[str], line: str) -> None:
    proc = _csnd(*args, dn1)
    assert _one_line(proc, 2).startswith(f"csnd {args[0]}: error: {line}")
    assert "invalid" not in proc.stderr


def test_a_config_file_named_by_the_environment_is_named_so(dn1: str, tmp_path: Path) -> None:
    proc = _csnd("serve", dn1, env={"CSND_CONFIG": str(tmp_path / "no.toml")})
    assert (
        _one_line(proc, 1)
        == f"csnd serve: error: CSND_CONFIG {tmp_path / 'no.toml'}: No such file or directory"
    )
    (tmp_path / "c.toml").write_text("decoders = 0\n")
    proc = _csnd(
        "serve", dn1, "--changelog", str(tmp_path / "log"), env={"CSND_CONFIG": str(tmp_path / "c.toml")}
    )
    line = _one_line(proc, 1)
    assert (
        line
        == f"csnd serve: error: CSND_CONFIG {tmp_path / 'c.toml'}: decoders: expected a whole number >= 1, got 0"
    )


def test_precedence_flags_environment_file_defaults(tmp_path: Path) -> None:
    file = {
        "changelog": "file",
        "listen": "127.0.0.1:1",
        "decoders": 3,
        "give_up": 10,
        "defaults": {"slot": "f"},
    }
    env = {"CSND_CHANGELOG": "env", "CSND_LISTEN": "127.0.0.1:2", "CSND_SLOT": "e"}
    flags = {"changelog": "flag"}
    url = "postgresql://h/db?publication=p"
    c = build_config(file, flags, [url], environ=env)
    assert (c.changelog, c.listen, c.decoders, c.give_up_s) == ("flag", "127.0.0.1:2", 3, 10.0)
    assert c.sources[0].live.slot == "e"
    c = build_config({}, {}, [url], environ={"CSND_CHANGELOG": "env", "CSND_DECODERS": "4", "CSND_HTTP": ""})
    assert (c.changelog, c.listen, c.decoders, c.http) == ("env", "127.0.0.1:7070", 4, None)
    with pytest.raises(UsageError, match="CSND_TEXT: expected true or false, got 'sure'"):
        build_config({}, {"changelog": "x"}, [url], environ={"CSND_TEXT": "sure"})
    with pytest.raises(ConfigError, match=r"--config c\.toml: decoders: expected a whole number >= 1, got 0"):
        build_config({"decoders": 0}, {"changelog": "x"}, [url], environ={}, where="--config c.toml")


def test_the_export_and_the_arrow_files_are_set_in_the_file_too() -> None:
    """Every flag has its key in the file: parquet_dir, documented there, was refused as unknown."""
    url = "postgresql://h/db?publication=p"
    c = build_config(
        {"changelog": "x", "parquet_dir": "/data/p", "arrow_files_bytes": 0}, {}, [url], environ={}
    )
    assert (c.parquet_dir, c.arrow_files_bytes) == ("/data/p", 0)
    c = build_config({"changelog": "x"}, {}, [url], environ={"CSND_ARROW_FILES_BYTES": "4096"})
    assert (c.parquet_dir, c.arrow_files_bytes) == (None, 4096)
    with pytest.raises(ConfigError, match=r"arrow_files_bytes: expected a whole number >= 0, got -1"):
        build_config({"changelog": "x", "arrow_files_bytes": -1}, {}, [url], environ={})


def test_the_snapshot_split_is_set_in_the_file() -> None:
    url = "postgresql://h/db?publication=p"
    c = build_config({"changelog": "x", "snapshot": {"split": "ctid"}}, {}, [url], environ={})
    assert c.snapshot_split == "ctid"
    assert build_config({"changelog": "x"}, {}, [url], environ={}).snapshot_split is None


def test_the_environment_is_documented_in_help_and_docs() -> None:
    help_text = _csnd("serve", "--help").stdout
    docs = (Path(__file__).parents[2] / "docs" / "reference.md").read_text()
    for s in SETTINGS:
        assert s.env in help_text and s.env in docs, s.env
    assert "CSND_CONFIG" in help_text and "flags > environment > config file > defaults" in help_text


def test_each_variable_stands_apart_from_its_flag_in_help() -> None:
    """The longest variable ran into its flag: `CSND_HEALTH_NEEDS_TOKEN=true|false--health-needs-token`."""
    help_text = _csnd("serve", "--help").stdout
    for s in SETTINGS:
        assert re.search(rf"^  {s.env}=\S+ +{s.flag}$", help_text, re.MULTILINE), s.env


def test_the_environment_reaches_a_running_service(dn1: str, tmp_path: Path) -> None:
    """CSND_CONFIG names the file, CSND_CHANGELOG beats the file's changelog, --listen beats CSND_LISTEN."""
    config = tmp_path / "c.toml"
    config.write_text(f'changelog = "{tmp_path / "from-file"}"\ndecoders = 1\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith("CSND_")}
    env.update(CSND_CONFIG=str(config), CSND_CHANGELOG=str(tmp_path / "from-env"), CSND_LISTEN="127.0.0.2:0")
    proc = subprocess.Popen(
        [*CSND, "serve", dn1, "--listen", "127.0.0.1:0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert proc.stdout is not None
    try:
        line = proc.stdout.readline()
        assert line.startswith("csnd serve: listening on 127.0.0.1:"), proc.communicate(timeout=60)
    finally:
        proc.terminate()
        _out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert (tmp_path / "from-env").is_dir() and not (tmp_path / "from-file").exists()


def test_the_runtime_configs_check_their_values() -> None:
    """What an embedding service builds for itself gets the command line's checks."""
    from csnd.runtime.options import LiveSourceConfig, NodeAgentConfig, ReplayConfig

    with pytest.raises(ConfigError, match="mode: expected gtm or single, got 'paxos'"):
        LiveSourceConfig(mode="paxos")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="give_up: expected a number of seconds > 0, got 0"):
        LiveSourceConfig(give_up_s=0)
    with pytest.raises(ConfigError, match="decoders: expected a whole number >= 1, got 0"):
        ReplayConfig(sources=("x",), decoders=0)
    with pytest.raises(ConfigError, match="decoders: expected a whole number >= 1, got '2'"):
        NodeAgentConfig(source="x", listen="127.0.0.1:0", decoders="2")  # type: ignore[arg-type]


def test_health_needs_the_token_only_when_told(dn1: str, tmp_path: Path) -> None:
    """With a token, a probe without it gets health; CSND_HEALTH_NEEDS_TOKEN (or the flag) closes it."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    token = tmp_path / "token"
    token.write_text("s3cret\n")
    for env in ({}, {"CSND_HEALTH_NEEDS_TOKEN": "true"}):
        served = start_serve([dn1], str(tmp_path / f"log{len(env)}"), "--token-file", str(token), env=env)
        try:
            with grpc.insecure_channel(served.address) as channel:
                check = health_pb2_grpc.HealthStub(channel).Check
                if env:
                    with pytest.raises(grpc.RpcError) as rpc:
                        check(health_pb2.HealthCheckRequest(), timeout=30)
                    assert rpc.value.code() == grpc.StatusCode.UNAUTHENTICATED
                else:
                    answer = check(health_pb2.HealthCheckRequest(service="csnd.v1.Changefeed"), timeout=30)
                    assert answer.status == health_pb2.HealthCheckResponse.SERVING
        finally:
            code, err = served.terminate()
        assert code == 0, err
    config = tmp_path / "c.toml"
    config.write_text("health_needs_token = 1\n")
    proc = _csnd("serve", dn1, "--changelog", str(tmp_path / "log9"), "--config", str(config))
    assert _one_line(proc, 1).endswith("health_needs_token: expected true or false, got 1")
