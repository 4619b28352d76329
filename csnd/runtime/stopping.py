"""Ctrl-C, SIGTERM and SIGHUP for the commands that run until stopped or their sources end.

All stop a run the same way -- as KeyboardInterrupt in the main thread, so
the pipelines stop, the output is abandoned and one line says where it is --
SIGTERM and SIGHUP as `Terminated` (exit 143, Ctrl-C 130; `csnd serve`
stops cleanly on any of them, exit 0).  A node agent handles its
own signals (`csnd.runtime.agent`).
"""

from __future__ import annotations

import signal
import threading


class Interrupted(KeyboardInterrupt):
    """A run stopped by Ctrl-C (exit status 130), and where its incomplete output is, once it says.

    `partial`: the output file a run abandoned (`with_partial`), which the
    command line names in its one line; "" when there is none.
    """

    partial: str = ""


class Terminated(Interrupted):
    """SIGTERM (a service manager, `kill`): stopped as Ctrl-C stops a run, exit status 143."""


def with_partial(e: KeyboardInterrupt, partial: str) -> Interrupted:
    """`e` as an Interrupted naming the incomplete output `partial` (a Terminated stays one).

    A KeyboardInterrupt that did not come through our handlers (none were
    installed) becomes an Interrupted, so the command line reads the path
    from a declared field instead of probing the exception for one.
    """
    stopped = e if isinstance(e, Interrupted) else Interrupted(*e.args)
    stopped.partial = partial
    return stopped


def install_stop_handlers() -> None:
    # Without them SIGTERM killed the process where it stood: no cleanup of
    # the decoder pool, no word about the incomplete output, and the
    # multiprocessing resource tracker's warnings about leaked semaphores.
    signal.signal(signal.SIGTERM, _terminate)
    signal.signal(signal.SIGINT, _interrupt)
    # SIGHUP (the terminal closed, a service manager's reload or stop) is a
    # stop as SIGTERM is: its default action killed `csnd serve` (exit 129,
    # the same warnings).  A process started ignoring it (nohup) keeps doing so.
    if signal.getsignal(signal.SIGHUP) is not signal.SIG_IGN:
        signal.signal(signal.SIGHUP, _terminate)


def ignore_stop_signals() -> None:
    """From now on Ctrl-C and SIGTERM do nothing (a stop is under way, or the run is complete)."""
    if threading.current_thread() is threading.main_thread():  # (only it may set handlers)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)


def _terminate(signum: int, frame: object) -> None:
    # One stop is enough: a second signal landing inside the cleanup (say,
    # between a dead worker's inbox and its feeder thread being cancelled)
    # could leave the exit waiting forever.  The cleanup is bounded anyway.
    ignore_stop_signals()
    raise Terminated


def _interrupt(signum: int, frame: object) -> None:
    ignore_stop_signals()
    raise Interrupted
