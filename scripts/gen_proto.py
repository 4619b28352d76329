"""Generates csnd/proto/*_pb2*.py from csnd/proto/*.proto; `--check` fails if they are stale.

Generated code is never edited by hand.  The check regenerates
into a temporary directory and compares, so CI catches a .proto edited without
regenerating, or a grpcio-tools upgrade that changes the output.
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


def generate(out_dir: str) -> list[str]:
    protos = sorted(glob.glob(os.path.join(PROTO_DIR, "*.proto")))
    include = os.path.join(os.path.dirname(protoc.__file__), "_proto")
    args = [
        "protoc",
        f"-I{ROOT}",
        f"-I{include}",
        f"--python_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        f"--pyi_out={out_dir}",
    ]
    # Named from the root (csnd/proto/...) so the stubs import `csnd.proto.csnd_pb2`.
    rc = protoc.main([*args, *(os.path.relpath(p, ROOT) for p in protos)])
    if rc != 0:
        sys.exit(f"gen_proto: protoc failed with status {rc}")
    return sorted(glob.glob(os.path.join(out_dir, "csnd", "proto", "*_pb2*.py*")))


def main() -> None:
    check = "--check" in sys.argv[1:]
    with tempfile.TemporaryDirectory() as tmp:
        files = generate(tmp)
        stale = []
        for f in files:
            target = os.path.join(PROTO_DIR, os.path.basename(f))
            if check:
                if not os.path.exists(target) or not filecmp.cmp(f, target, shallow=False):
                    stale.append(os.path.basename(f))
            else:
                with open(f, "rb") as src, open(target, "wb") as dst:
                    dst.write(src.read())
        if stale:
            sys.exit(f"gen_proto: generated code is stale ({', '.join(stale)}); run `make proto` and commit")
    print("gen_proto: generated code is up to date" if check else f"gen_proto: wrote {len(files)} files")


if __name__ == "__main__":
    main()
