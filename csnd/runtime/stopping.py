"""Ctrl-C and SIGTERM for the commands that run until their sources end (replay, record).

Both stop a run the same way -- as KeyboardInterrupt in the main thread, so
the pipelines stop, the output is abandoned and one line says where it is --
SIGTERM as `Terminated` (exit 143, Ctrl-C 130).  A node agent handles its
own signals (`csnd.runtime.agent`).
"""

from __future__ import annotations

import signal
import threading


class Terminated(KeyboardInterrupt):
    """SIGTERM (a service manager, `kill`): stopped as Ctrl-C stops a run, exit status 143."""


def install_stop_handlers() -> None:
    # Without them SIGTERM killed the process where it stood: no cleanup of
    # the decoder pool, no word about the incomplete output, and the
    # multiprocessing resource tracker's warnings about leaked semaphores.
    signal.signal(signal.SIGTERM, _terminate)
    signal.signal(signal.SIGINT, _interrupt)


def ignore_stop_signals() -> None:
    """From now on Ctrl-C and SIGTERM do nothing (a stop is under way, or the run is complete)."""
    if threading.current_thread() is threading.main_thread():  # (only it may set handlers)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)


def _terminate(signum: int, frame: object) -> None:
    # One stop is enough: a second signal landing inside the cleanup (say,
    # between a dead worker's inbox and its feeder thread being cancelled)
    # could leave the exit waiting forever.  The cleanup is bounded anyway.
    ignore_stop_signals()
    raise Terminated


def _interrupt(signum: int, frame: object) -> None:
    ignore_stop_signals()
    raise KeyboardInterrupt
