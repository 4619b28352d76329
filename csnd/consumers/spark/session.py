"""A local SparkSession for tests, examples and benchmarks, set up so executors run our code.

Spark starts its Python workers with PYSPARK_PYTHON (default: `python3` on
the PATH), which would import some other csnd, or none; the session helper
points it (and the driver's) at this interpreter -- the venv's.

Spark also puts `$SPARK_HOME/python/lib/pyspark.zip` first on every Python
process's path.  With a pip-installed pyspark the zip holds the same code as
the package, but Python keeps no compiled code for a zip, so each process
compiles pyspark again: the streaming source's planner process, started for
every query, spent 0.4 s of its 0.7 s start-up on it (the executors' workers
avoid it through daemon.py).  The helper therefore points SPARK_HOME at a
copy of the package's layout made of symbolic links, without that zip: every
Python process then imports the installed package and its cached bytecode.
"""

from __future__ import annotations

import hashlib
import os
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def local_session(app: str = "csnd", cores: int = 2, **conf: str) -> SparkSession:
    """`local[cores]`, UI off, few shuffle partitions (small data), the `csnd` format registered."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    import pyspark

    if "SPARK_HOME" not in os.environ:  # (a real installation's home is left alone)
        try:
            home = spark_home_without_zip(Path(pyspark.__file__).parent, pyspark.__version__)
        except OSError:  # (no cache directory: the package's own home, only slower to start)
            pass
        else:
            os.environ["SPARK_HOME"] = str(home)
    from pyspark.sql import SparkSession

    from csnd.consumers.spark.source import CsndDataSource

    builder = (
        SparkSession.builder.master(f"local[{cores}]")
        .appName(app)
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", str(cores))
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.memory", "1g")
        .config("spark.ui.showConsoleProgress", "false")
        # Workers import pyspark's cached bytecode, not the zip (see csnd.consumers.spark.daemon).
        .config("spark.python.daemon.module", "csnd.consumers.spark.daemon")
    )
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(CsndDataSource)
    return spark


def spark_home_without_zip(package: Path, version: str) -> Path:
    """A SPARK_HOME for the pip-installed pyspark at `package` whose python/lib lacks pyspark.zip.

    Made once per installation, under the user's cache directory, of
    symbolic links to the package's own folders; made under a temporary name
    and renamed, so concurrent sessions never see half of one.
    """
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "csnd"
    key = hashlib.sha1(str(package.resolve()).encode(), usedforsecurity=False).hexdigest()[:12]
    home = cache / f"spark-home-{version}-{key}"
    if home.is_dir():
        return home
    cache.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".spark-home-", dir=cache))
    for entry in package.iterdir():
        if entry.name != "python":
            (staging / entry.name).symlink_to(entry)
    lib = staging / "python" / "lib"
    lib.mkdir(parents=True)
    for archive in (package / "python" / "lib").glob("*.zip"):
        if archive.name != "pyspark.zip":
            (lib / archive.name).symlink_to(archive)
    try:
        staging.rename(home)
    except OSError:  # (another session made it first)
        for link in sorted(staging.rglob("*"), key=lambda p: len(p.parts), reverse=True):
            link.unlink() if link.is_symlink() or link.is_file() else link.rmdir()
        staging.rmdir()
    return home
