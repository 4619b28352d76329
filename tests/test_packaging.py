"""pyproject.toml's gRPC requirements: ranges that install beside other gRPC users, tools pinned to proto/."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent
GRPC_RUNTIME = ("grpcio", "grpcio-health-checking", "grpcio-reflection")


def _requirements(group: str | None = None) -> dict[str, Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    lines = project["dependencies"] if group is None else project["optional-dependencies"][group]
    return {(r := Requirement(line)).name: r for line in lines}


def _generated_version() -> Version:
    """The grpcio-tools release that wrote csnd/proto/: its stubs refuse an older grpcio at import."""
    text = (ROOT / "proto" / "changefeed" / "v1" / "changefeed_pb2_grpc.py").read_text()
    m = re.search(r"GRPC_GENERATED_VERSION = '([^']+)'", text)
    assert m is not None
    return Version(m.group(1))


def test_grpc_runtime_requirements_are_compatible_ranges() -> None:
    """Exact pins (==1.85.1) made csnd uninstallable beside anything needing another grpcio."""
    deps = _requirements()
    floor = _generated_version()
    for name in GRPC_RUNTIME:
        spec = deps[name].specifier
        assert not any(s.operator in ("==", "===") for s in spec), f"{name} is pinned: {spec}"
        assert floor in spec and Version(f"{floor.major}.{floor.minor + 1}") in spec, (name, spec)
        assert Version(f"{floor.major}.{floor.minor}") not in spec or floor.micro == 0, (name, spec)
        assert Version(f"{floor.major + 1}.0") not in spec, (name, spec)
    assert len({str(deps[n].specifier) for n in GRPC_RUNTIME}) == 1  # (one range for all three)


def test_grpcio_tools_stays_pinned_to_the_release_that_generated_proto() -> None:
    spec = _requirements("dev")["grpcio-tools"].specifier
    assert str(spec) == f"=={_generated_version()}"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gen_proto.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0 and "up to date" in proc.stdout, proc.stderr
