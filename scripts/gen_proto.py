"""Generates csnd/proto/**/*_pb2*.py from csnd/proto/**/*.proto; `--check` fails if they are stale.

Generated code is never edited by hand.  The check regenerates
into a temporary directory and compares, so CI catches a .proto edited without
regenerating, a grpcio-tools upgrade that changes the output, or generated
code left behind by a .proto that was moved or removed.

The protos live in versioned packages, one directory each:
csnd/proto/changefeed/v1 (the public contract), csnd/proto/agent/v1 (internal),
csnd/proto/legacy (the earlier service names, deprecated).
"""

from __future__ import annotations

import filecmp
import glob
import os
import sys
import tempfile

from grpc_tools import protoc

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROTO_DIR = os.path.join(ROOT, "csnd", "proto")
GENERATED = ("*_pb2.py", "*_pb2.pyi", "*_pb2_grpc.py")


def generated_under(directory: str) -> list[str]:
    """The generated files under `directory`, relative to it."""
    found = set()
    for pattern in GENERATED:
        for path in glob.glob(os.path.join(directory, "**", pattern), recursive=True):
            found.add(os.path.relpath(path, directory))
    return sorted(found)


def generate(out_dir: str) -> list[str]:
    """Runs protoc on every .proto; returns the generated files relative to csnd/proto."""
    protos = sorted(glob.glob(os.path.join(PROTO_DIR, "**", "*.proto"), recursive=True))
    include = os.path.join(os.path.dirname(protoc.__file__), "_proto")
    args = [
        "protoc",
        f"-I{ROOT}",
        f"-I{include}",
        f"--python_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        f"--pyi_out={out_dir}",
    ]
    # Named from the root (csnd/proto/...) so the stubs import `csnd.proto.changefeed.v1...`.
    rc = protoc.main([*args, *(os.path.relpath(p, ROOT) for p in protos)])
    if rc != 0:
        sys.exit(f"gen_proto: protoc failed with status {rc}")
    return generated_under(os.path.join(out_dir, "csnd", "proto"))


def main() -> None:
    check = "--check" in sys.argv[1:]
    with tempfile.TemporaryDirectory() as tmp:
        files = generate(tmp)
        out = os.path.join(tmp, "csnd", "proto")
        stale = []
        for rel in files:
            target = os.path.join(PROTO_DIR, rel)
            if check:
                if not os.path.exists(target) or not filecmp.cmp(
                    os.path.join(out, rel), target, shallow=False
                ):
                    stale.append(rel)
            else:
                os.makedirs(os.path.dirname(target), exist_ok=True)
                with open(os.path.join(out, rel), "rb") as src, open(target, "wb") as dst:
                    dst.write(src.read())
        orphans = sorted(set(generated_under(PROTO_DIR)) - set(files))
        if check:
            stale.extend(f"{rel} (no .proto generates it)" for rel in orphans)
        else:
            for rel in orphans:
                os.remove(os.path.join(PROTO_DIR, rel))
        if stale:
            sys.exit(f"gen_proto: generated code is stale ({', '.join(stale)}); run `make proto` and commit")
    print("gen_proto: generated code is up to date" if check else f"gen_proto: wrote {len(files)} files")


if __name__ == "__main__":
    main()
