"""What `csnd replay` makes of a damaged recording: an error, the right output, or a silently wrong one.

    python -m bench.stream_damage [--transactions 200] [--trials 50] [--seed 1] [--format 1|2]

Generates a one-node cluster (`csnd generate`), then damages its recording
`--trials` times for each of four kinds -- one byte anywhere in the file set
to another value, a frame written twice, a frame and the next one swapped, a
frame removed -- and replays each damaged copy (`csnd replay --decoders 1`).
Each replay is an error (exit status not 0), the same output as the
undamaged file, or a wrong output with exit 0: the case a CRC is there to
rule out.  `--format 1` rewrites the recording in format 1 first (no CRCs),
to measure what format 2 changed.  Not part of `make bench`: each replay
is a process start, a few seconds each on a shared machine.
"""

from __future__ import annotations

import argparse
import os
import random
import struct
import subprocess
import sys
import tempfile
from collections import Counter

from csnd.reader.streamfile import MAGIC, StreamFileReader, StreamWriter

CSND = [sys.executable, "-m", "csnd.cli"]
KINDS = ("flip", "dup", "swap", "delete")


def frame_spans(raw: bytes) -> list[tuple[int, int]]:
    """(start, end) of every frame of a recording, either format (see csnd/reader/streamfile.py)."""
    (n,) = struct.unpack_from("!I", raw, 8)
    head = 8 if raw.startswith(MAGIC) else 4
    pos = 12 + n + (4 if head == 8 else 0)
    spans = []
    while pos < len(raw):
        (k,) = struct.unpack_from("!I", raw, pos)
        spans.append((pos, pos + head + k))
        pos += head + k
    return spans


def damage(raw: bytes, spans: list[tuple[int, int]], kind: str, rng: random.Random) -> bytes:
    if kind == "flip":
        i = rng.randrange(len(raw))
        return raw[:i] + bytes([(raw[i] + rng.randrange(1, 256)) % 256]) + raw[i + 1 :]
    i = rng.randrange(len(spans) - 1)
    (a, b), (c, d) = spans[i], spans[i + 1]
    if kind == "dup":
        return raw[:b] + raw[a:b] + raw[b:]
    if kind == "delete":
        return raw[:a] + raw[b:]
    assert kind == "swap"
    return raw[:a] + raw[c:d] + raw[a:b] + raw[d:]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--transactions", type=int, default=200)
    ap.add_argument("--trials", type=int, default=50)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--format", type=int, choices=(1, 2), default=2)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory() as tmp:
        gen = os.path.join(tmp, "gen")
        subprocess.run(
            [*CSND, "generate", "--nodes", "1", "--transactions", str(args.transactions), "--out", gen],
            check=True,
            capture_output=True,
        )
        path = os.path.join(gen, "dn1.pgstream")
        if args.format == 1:
            old = path + ".2"
            os.rename(path, old)
            with StreamFileReader(old) as r, StreamWriter(path, r.header, version=1) as w:
                for _, payload in r:
                    w.write_frame(payload)
        with open(path, "rb") as f:
            raw = f.read()
        with open(os.path.join(gen, "expected.jsonl"), "rb") as f:
            want = f.read()
        spans = frame_spans(raw)
        bad, out = os.path.join(tmp, "bad.pgstream"), os.path.join(tmp, "out.jsonl")
        total: Counter[str] = Counter()
        for kind in KINDS:
            seen: Counter[str] = Counter()
            for _ in range(args.trials):
                with open(bad, "wb") as f:
                    f.write(damage(raw, spans, kind, rng))
                if os.path.exists(out):
                    os.unlink(out)
                proc = subprocess.run(
                    [*CSND, "replay", bad, "--output", out, "--decoders", "1"],
                    capture_output=True,
                    timeout=600,
                )
                if proc.returncode != 0:
                    seen["error"] += 1
                else:
                    with open(out, "rb") as f:
                        seen["same" if f.read() == want else "wrong"] += 1
            print(f"{kind}: {dict(seen)}", flush=True)
            total.update(seen)
    n = sum(total.values())
    print(
        f"format {args.format}, all kinds: {dict(total)}; silently wrong {total['wrong']}/{n} = {total['wrong'] / n:.1%}"
    )


if __name__ == "__main__":
    main()
