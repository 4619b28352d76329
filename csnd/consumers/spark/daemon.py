"""Spark's Python worker daemon, importing pyspark from the installed package instead of pyspark.zip.

Spark puts `$SPARK_HOME/python/lib/pyspark.zip` first on its workers'
PYTHONPATH.  With a pip-installed pyspark that zip holds the very same code
as the package, but Python cannot cache compiled code for a zip, so every
new worker process compiled pyspark again: measured here, 10-60 s of CPU
per query start on a busy 2-core machine.  Started as the daemon
(`spark.python.daemon.module`, set by `session.local_session`), this drops
the zips from the path, so workers import the package's cached bytecode.
"""

from __future__ import annotations

import sys

if __name__ == "__main__":
    sys.path[:] = [p for p in sys.path if not (p.endswith(".zip") and "pyspark" in p)]
    from pyspark import daemon

    daemon.manager()
