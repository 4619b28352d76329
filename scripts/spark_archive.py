"""Make the class-data archive that the tests' and the demo's Spark drivers start from.

A Spark driver spends most of its start-up loading and verifying some twelve
thousand classes from its jars: 9-13 s on this 2-core machine when it is
otherwise idle, in every test that starts one.  The JVM can keep those
classes in a class-data sharing archive, written by one run as it exits
(`-XX:ArchiveClassesAtExit`) and mapped by every later JVM with the same
class path (`-XX:SharedArchiveFile`).  This writes that archive for the
driver `csnd.consumers.spark.session.local_session` starts, with the JVM
options the Makefile gives those drivers (`SPARK_SUBMIT_OPTS`).  A JVM whose
class path, Java or options do not match an archive ignores it silently and
starts as it would without, so a stale archive costs speed, never a failure.

    python scripts/spark_archive.py PATH [JVM-OPTION ...]
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

# The driver: a session and one job, then the process exits.  The JVM is its child
# and sees the end of its stdin (pyspark's rule), runs its shutdown hooks and writes
# the archive; it holds the pipe on our side open until then.
_DRIVER = """
from csnd.consumers.spark.session import local_session
spark = local_session("csnd-class-archive")
spark.range(10).count()
spark.stop()
"""


def main(argv: list[str]) -> int:
    if not argv or argv[0].startswith("-"):
        print(__doc__.rsplit("\n\n", 1)[-1].strip(), file=sys.stderr)
        return 2
    path, options = os.path.abspath(argv[0]), argv[1:]
    partial = path + ".partial"
    if os.path.exists(partial):
        os.unlink(partial)
    env = dict(os.environ, SPARK_SUBMIT_OPTS=" ".join([*options, f"-XX:ArchiveClassesAtExit={partial}"]))
    started = time.monotonic()
    try:
        # (the output is the JVM's note on each class it cannot archive: thousands of lines)
        done = subprocess.run(
            [sys.executable, "-c", _DRIVER], env=env, stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=600,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        return _skipped("the driver did not end in 600 s")
    if done.returncode != 0 or not os.path.isfile(partial):
        tail = done.stdout.decode(errors="replace").strip().splitlines()[-3:]
        return _skipped(f"the driver exited with {done.returncode} and no archive: {' | '.join(tail)}")
    os.replace(partial, path)
    size = os.path.getsize(path) >> 20
    print(f"spark_archive: {path}: {size} MiB in {time.monotonic() - started:.0f} s", file=sys.stderr)
    return 0


def _skipped(why: str) -> int:
    """No archive: the drivers start without one, only slower; a failing Spark shows in its tests."""
    print(f"spark_archive: no archive ({why}); Spark drivers will start without it", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
