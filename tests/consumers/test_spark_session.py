"""The local session's SPARK_HOME without pyspark.zip (csnd/consumers/spark/session.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from csnd.consumers.spark.session import spark_home_without_zip


def _package(root: Path) -> Path:
    pkg = root / "site-packages" / "pyspark"
    (pkg / "jars").mkdir(parents=True)
    (pkg / "jars" / "spark-core.jar").write_bytes(b"jar")
    (pkg / "bin").mkdir()
    (pkg / "python" / "lib").mkdir(parents=True)
    (pkg / "python" / "lib" / "pyspark.zip").write_bytes(b"zip")
    (pkg / "python" / "lib" / "py4j-0.10.9.9-src.zip").write_bytes(b"py4j")
    (pkg / "__init__.py").write_text("")
    return pkg


def test_the_home_links_everything_but_the_pyspark_zip(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    pkg = _package(tmp_path)
    home = spark_home_without_zip(pkg, "4.3.0")
    assert home.parent == tmp_path / "cache" / "csnd"
    assert (home / "jars" / "spark-core.jar").read_bytes() == b"jar"
    assert (home / "bin").resolve() == (pkg / "bin").resolve()
    lib = home / "python" / "lib"
    assert sorted(p.name for p in lib.iterdir()) == ["py4j-0.10.9.9-src.zip"]
    assert (lib / "py4j-0.10.9.9-src.zip").read_bytes() == b"py4j"
    # Made once: a second session gets the same directory, and no staging is left behind.
    assert spark_home_without_zip(pkg, "4.3.0") == home
    assert [p.name for p in home.parent.iterdir()] == [home.name]


def test_another_installation_or_version_gets_its_own_home(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    pkg_a = _package(tmp_path / "a")
    a = spark_home_without_zip(pkg_a, "4.3.0")
    b = spark_home_without_zip(_package(tmp_path / "b"), "4.3.0")
    c = spark_home_without_zip(pkg_a, "4.4.0")
    assert len({a, b, c}) == 3
    assert (b / "jars").resolve() == (tmp_path / "b" / "site-packages" / "pyspark" / "jars").resolve()
