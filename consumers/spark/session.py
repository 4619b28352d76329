"""A local SparkSession for tests, examples and benchmarks, set up so executors run our code.

Spark starts its Python workers with PYSPARK_PYTHON (default: `python3` on
the PATH), which would import some other csnd, or none; the session helper
points it (and the driver's) at this interpreter -- the venv's.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def local_session(app: str = "csnd", cores: int = 2, **conf: str) -> SparkSession:
    """`local[cores]`, UI off, few shuffle partitions (small data), the `csnd` format registered."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
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
