"""Every shell example in README.md and docs/*.md is checked, so the docs cannot drift from csnd.

A reader copies these lines verbatim.  Each example -- a ```sh, ```bash or
```console block, or a `$ `-prefixed line in any block -- must:

* parse as shell (`bash -n`);
* quote every URL holding `?` or `&` (unquoted, the shell backgrounds the
  command at the `&` and globs at the `?`);
* parse, for every `csnd ...` command in it, against csnd's own argparse
  parser (a usage error fails the test, naming the file and line);
* point its clients (`csnd subscribe`, `subscriptions`, `snapshot`, the
  Spark examples' `--target` and `.option("target", ...)`) at a port that a
  `csnd serve` of the docs listens on (7070 by default), so an example
  followed verbatim reaches the service.

Placeholders that stand for something the reader fills in are expanded to
a concrete value by PLACEHOLDERS below, deliberately: an example with any
other placeholder fails.
"""

from __future__ import annotations

import contextlib
import io
import re
import shlex
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from csnd.cli import build_parser
from csnd.service.config import DEFAULT_LISTEN

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

SHELL_LANGUAGES = ("sh", "bash", "console")

# Placeholders an example may hold, and the value each is checked as.
PLACEHOLDERS = {
    "postgresql://…": "postgresql://csnd@db1/shop",
    "HOST:PORT": "127.0.0.1:7070",
}

# The commands whose first positional argument is the service's gRPC address.
CLIENT_COMMANDS = ("subscribe", "subscriptions", "snapshot")

_FENCE = re.compile(r"^(\s*)```(\S*)\s*$")
_PORT = re.compile(r"(?:^|[/@])(?:[\w.-]+|\[[0-9a-f:]+\])?:(\d+)$")
_SPARK_TARGET = re.compile(r"""\.option\(\s*["']target["']\s*,\s*["']([^"']+)["']""")


@dataclass(frozen=True)
class Example:
    """A piece of shell from a doc: the file, the line it starts on, its text, and the block's language."""

    path: Path
    line: int
    text: str
    language: str


@dataclass(frozen=True)
class Block:
    path: Path
    line: int  # the first line inside the fence
    language: str
    lines: tuple[str, ...]


def fenced_blocks(path: Path) -> Iterator[Block]:
    """The fenced code blocks of a Markdown file, each with its indentation taken off."""
    lines = path.read_text().splitlines()
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, language = len(m.group(1)), m.group(2)
        start = i + 1
        i = start
        while i < len(lines) and not _FENCE.match(lines[i]):
            i += 1
        body = tuple(line[indent:] if line[:indent].strip() == "" else line for line in lines[start:i])
        yield Block(path, start + 1, language, body)
        i += 1


def examples(paths: list[Path]) -> list[Example]:
    """The shell of every doc: whole sh/bash blocks, and each `$ ` command (with its continuations) elsewhere."""
    found = []
    for path in paths:
        for block in fenced_blocks(path):
            if block.language in ("sh", "bash"):
                found.append(Example(path, block.line, "\n".join(block.lines), block.language))
                continue
            i = 0
            while i < len(block.lines):
                line = block.lines[i]
                if not line.startswith("$ "):
                    i += 1
                    continue
                command, first = [line[2:]], i
                while command[-1].endswith("\\") and i + 1 < len(block.lines):
                    i += 1
                    command.append(block.lines[i])
                found.append(Example(path, block.line + first, "\n".join(command), block.language))
                i += 1
    return found


def logical_lines(text: str) -> Iterator[tuple[int, str]]:
    """The example's lines with backslash continuations joined, each with its offset in the example."""
    lines = text.split("\n")
    i = 0
    while i < len(lines):
        first, line = i, lines[i]
        while line.endswith("\\") and i + 1 < len(lines):
            i += 1
            line = line[:-1] + " " + lines[i]
        yield first, line
        i += 1


def expand(text: str) -> str:
    for placeholder, value in PLACEHOLDERS.items():
        text = text.replace(placeholder, value)
    return text


def commands(line: str) -> Iterator[list[str]]:
    """The simple commands of one shell line: its words, split at `|`, `&&`, `;`, `&`, without redirections.

    A line shlex cannot split (an unclosed quote) yields nothing: `bash -n` reports it.
    """
    lexer = shlex.shlex(expand(line), posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    lexer.commenters = "#"
    try:
        tokens = list(lexer)
    except ValueError:
        return
    words: list[str] = []
    redirect = False
    for token in tokens:
        if token and all(c in "();<>|&" for c in token):
            if "<" in token or ">" in token:  # (2>&1, > FILE: the target is not an argument)
                if words and words[-1].isdigit():
                    words.pop()
                redirect = True
                continue
            if words:
                yield words
            words = []
        elif redirect:
            redirect = False
        else:
            words.append(token)
    if words:
        yield words


def csnd_argv(words: list[str]) -> list[str] | None:
    """The arguments of a `csnd` command (`csnd`, `.venv/bin/csnd`, after VAR=value words), else None."""
    while words and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", words[0]):
        words = words[1:]
    if words and Path(words[0]).name == "csnd":
        return words[1:]
    return None


def unquoted_url_metachars(line: str) -> list[str]:
    """Words of a shell line that hold a URL (`://`) with `?` or `&` outside quotes."""
    bad, word, flagged = [], "", False
    quote = ""
    i = 0
    while i < len(line):
        c = line[i]
        if quote:
            if c == quote:
                quote = ""
            elif c == "\\" and quote == '"':
                i += 1
            word += c
        elif c in "'\"":
            quote = c
            word += c
        elif c == "\\":
            word += line[i : i + 2]
            i += 1
        elif c.isspace() or c in ";|()<>" or (c == "&" and "://" not in word):
            if flagged:
                bad.append(word)
            word, flagged = "", False
        elif c == "#" and not word:
            break
        else:
            if c in "?&" and "://" in word:
                flagged = True
            word += c
        i += 1
    if flagged:
        bad.append(word)
    return bad


def parse_csnd(argv: list[str]) -> str | None:
    """None if csnd's parser takes `argv`, else what it said (a usage error)."""
    err, out = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
            build_parser().parse_args(argv)
    except SystemExit as e:
        if e.code not in (0, None):
            return err.getvalue().strip().splitlines()[-1]
    return None


def port_of(address: str) -> int | None:
    m = _PORT.search(address.removeprefix("grpc://"))
    return int(m.group(1)) if m else None


def serve_ports(found: list[Example]) -> set[int]:
    """The ports the docs' `csnd serve` examples listen on (the default when they do not say)."""
    ports = set()
    for ex in found:
        for _, line in logical_lines(ex.text):
            for words in commands(line):
                argv = csnd_argv(words)
                if not argv or argv[0] != "serve" or parse_csnd(argv) is not None:
                    continue
                env = dict(w.split("=", 1) for w in words[: len(words) - len(argv) - 1])
                listen = build_parser().parse_args(argv).listen or env.get("CSND_LISTEN") or DEFAULT_LISTEN
                port = port_of(listen)
                assert port is not None, f"{ex.path}:{ex.line}: serve listens on {listen!r}"
                ports.add(port)
    return ports


def problems(paths: list[Path], root: Path = ROOT) -> list[str]:
    """Every way the shell examples of `paths` would fail a reader who follows them verbatim."""
    found = examples(paths)
    out = []
    for ex in found:
        script = "\n".join(expand(t) for t in ex.text.split("\n"))
        checked = subprocess.run(["bash", "-n"], input=script, capture_output=True, text=True)
        if checked.returncode != 0:
            out.append(f"{ex.path.relative_to(root)}:{ex.line}: bash -n: {checked.stderr.strip()}")
        for offset, line in logical_lines(ex.text):
            where = f"{ex.path.relative_to(root)}:{ex.line + offset}"
            for word in unquoted_url_metachars(line):
                out.append(f"{where}: the URL {word} holds ? or & outside quotes (the shell cuts it there)")
            for words in commands(line):
                argv = csnd_argv(words)
                if argv is not None:
                    said = parse_csnd(argv)
                    if said is not None:
                        out.append(f"{where}: csnd {' '.join(argv)}: {said}")
    ports = serve_ports(found) or {int(DEFAULT_LISTEN.rsplit(":", 1)[1])}
    for ex in found:
        for offset, line in logical_lines(ex.text):
            where = f"{ex.path.relative_to(root)}:{ex.line + offset}"
            for words in commands(line):
                for target in client_targets(words):
                    if port_of(target) not in ports:
                        out.append(
                            f"{where}: {target} is not where csnd serve listens (ports {sorted(ports)})"
                        )
    for path in paths:
        for block in fenced_blocks(path):
            for i, line in enumerate(block.lines):
                for target in _SPARK_TARGET.findall(expand(line)):
                    if port_of(target) not in ports:
                        out.append(
                            f"{path.relative_to(root)}:{block.line + i}: Spark target {target} is not where "
                            f"csnd serve listens (ports {sorted(ports)})"
                        )
    return out


def client_targets(words: list[str]) -> list[str]:
    """The service addresses a command dials: a csnd client's HOST:PORT, or an example's --target."""
    argv = csnd_argv(words)
    if argv is not None:
        positional = [w for w in argv if not w.startswith("-")]
        if positional and positional[0] in CLIENT_COMMANDS:
            rest = positional[1:]
            if positional[0] == "subscriptions":
                rest = rest[1:]  # (list, reset, delete)
            return rest[:1]
        return []
    if "--target" in words[:-1]:
        return [words[words.index("--target") + 1]]
    return []


def test_the_docs_have_shell_examples() -> None:
    found = examples(DOCS)
    assert len(found) >= 5
    assert any("csnd serve" in ex.text for ex in found)


def test_every_shell_example_parses_and_reaches_the_service() -> None:
    said = problems(DOCS)
    assert said == [], "\n".join(said)


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("csnd serve dn1=postgresql://h/db?slot=s&publication=p --changelog d", "holds ? or &"),
        ("csnd subscribe 127.0.0.1:7000", "not where csnd serve listens"),
        ("csnd serve --changelog d --no-such-flag", "unrecognized arguments: --no-such-flag"),
        ("csnd serve --changelog d --listen nowhere", "argument --listen"),
        ("csnd replay a.pgstream 'unclosed", "bash -n"),
        ("$ csnd subscriptions reset 127.0.0.1:7070 billing", "--csn"),
    ],
)
def test_a_broken_example_is_caught(tmp_path: Path, text: str, why: str) -> None:
    """The checks themselves: each kind of drift the docs once had is reported, naming the line."""
    doc = tmp_path / "doc.md"
    language = "console" if text.startswith("$ ") else "sh"
    doc.write_text(f"# doc\n\n```{language}\n{text}\n```\n")
    said = problems([doc], tmp_path)
    assert any(why in s and "doc.md:4" in s for s in said), said


def test_quoted_urls_and_a_backgrounded_command_pass(tmp_path: Path) -> None:
    doc = tmp_path / "doc.md"
    doc.write_text(
        "```sh\n"
        "csnd serve 'dn1=postgresql://h/db?slot=s&publication=p' --changelog d &\n"
        'csnd subscribe "127.0.0.1:7070" --name a 2>&1 | head -3   # a comment: x://y?z&w\n'
        "```\n"
    )
    assert problems([doc], tmp_path) == []


def _anchor(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_every_relative_link_resolves() -> None:
    """Sections moved out of the README are linked; a link to a file or heading that is not there fails."""
    broken = []
    for doc in DOCS:
        for target in re.findall(r"\]\(([^)\s]+)\)", doc.read_text()):
            if "://" in target or target.startswith("mailto:"):
                continue
            file, _, anchor = target.partition("#")
            path = (doc.parent / file).resolve() if file else doc
            if not path.exists():
                broken.append(f"{doc.name}: {target}: no such file")
            elif anchor and path.suffix == ".md":
                headings = re.findall(r"^#+ (.+)$", path.read_text(), re.MULTILINE)
                if anchor not in {_anchor(h) for h in headings}:
                    broken.append(f"{doc.name}: {target}: no such heading in {path.name}")
    assert broken == [], "\n".join(broken)
