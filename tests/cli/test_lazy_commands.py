"""A `csnd` process imports the modules of the command it runs, not every command's.

`csnd.cli` imported the service, the GTM kit, psycopg and grpc before any
command ran (~0.25 s of every `csnd` process on an idle machine, and the tests
and the demo start hundreds); `csnd --help` and a `csnd subscribe` now import
none of them.  What must not change: every command parses as it did, and
`--help` lists every command with its own help line.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import io
import json
import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from csnd import cli

# What a command that needs no server connection and no gRPC server has no use for.
HEAVY = ("psycopg", "grpc", "csnd.service", "csnd.gtm", "csnd.demo", "csnd.runtime.options")


def _subcommands(parser: argparse.ArgumentParser) -> argparse._SubParsersAction[argparse.ArgumentParser]:
    (sub,) = (a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sub


def test_every_command_has_its_own_help_line_and_runner() -> None:
    sub = _subcommands(cli.build_parser())
    assert list(sub.choices) == list(cli._HELP)
    assert {a.dest: a.help for a in sub._choices_actions} == cli._HELP
    assert set(cli.COMMANDS) == set(sub.choices)


@pytest.mark.parametrize("command", ["", *cli._HELP])
def test_a_command_built_alone_has_the_help_it_has_in_full(command: str) -> None:
    full, alone = cli.build_parser(), cli.build_parser(only=command)
    assert alone.format_help() == full.format_help()
    if command:
        assert (
            _subcommands(alone).choices[command].format_help()
            == _subcommands(full).choices[command].format_help()
        )


def _outcome(parse: object, argv: list[str]) -> tuple[str, object]:
    """What parsing argv gives: its namespace, or argparse's exit status and message."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            args = parse(argv)  # type: ignore[operator]
        except SystemExit as e:
            return "exit", (e.code, err.getvalue())
    return "args", vars(args)


_BEFORE = st.sampled_from(
    ["-v", "--verbose", "--log-format", "--log", "--lo", "--log-format=json", "json", "--"]
)
_AFTER = st.sampled_from(["-v", "--log-format", "json", "x", "--out", "--slot", "s", "dn1=f.pgstream", "--"])
_COMMANDS = st.sampled_from([*cli._HELP, "nosuch"])


_full_parser = functools.cache(
    cli.build_parser
)  # (argparse parsers are reusable: built once, not per example)


@given(st.lists(_BEFORE, max_size=4), _COMMANDS, st.lists(_AFTER, max_size=4))
def test_argv_parses_as_the_full_parser_parses_it(before: list[str], command: str, after: list[str]) -> None:
    argv = [*before, command, *after]
    assert _outcome(lambda a: cli.parse_args(a)[1], argv) == _outcome(_full_parser().parse_args, argv)


def _modules_after(code: str) -> set[str]:
    """The modules a fresh interpreter holds after running code (a `csnd` command in it)."""
    script = (
        f"import atexit, json, sys\natexit.register(lambda: print(json.dumps(sorted(sys.modules))))\n{code}"
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    return set(json.loads(proc.stdout.strip().splitlines()[-1]))


def _heavy(modules: set[str]) -> list[str]:
    return sorted(m for m in modules if any(m == h or m.startswith(h + ".") for h in HEAVY))


def test_help_imports_no_command_modules() -> None:
    modules = _modules_after("from csnd.cli import main\nmain(['--help'])")
    assert _heavy(modules) == []


def test_a_subscriber_imports_no_server_side_modules() -> None:
    """`csnd subscribe` to a port nothing listens on: it runs (and fails to connect) without them."""
    modules = _modules_after(
        "from csnd.cli import main\nsys.exit(main(['subscribe', '127.0.0.1:1', '--token-file', '/nonexistent/token']))"
    )
    assert "csnd.consumers.subscribe" in modules
    assert [m for m in _heavy(modules) if not m.startswith("grpc")] == []
