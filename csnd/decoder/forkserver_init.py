"""Imported first by the decoder workers' fork server, and by nothing else.

The fork server gives each worker it forks the signal dispositions it had
after its preloaded imports.  Ctrl-C, SIGTERM and SIGHUP go to a whole
process group (a terminal's Ctrl-C or hang-up, a service manager stopping
the group), and the parent decides how to stop: it closes the pool, which
stops its workers itself (`DecoderPool.close`), and a worker or server whose
parent is gone leaves by itself.  A fork server killed by the group's
SIGTERM while the parent was starting a pool made that start fail with
`EOFError` -- a clean stop reported as a crash -- so all three are ignored
here, however the server was started: also when multiprocessing (re)starts
it from a thread other than the main one, where the starter cannot set them.

`start_worker_server` starts the server with SIGTERM and SIGHUP blocked (a
spawned process inherits the mask), so one that lands before this import is
held; ignoring a pending signal discards it, and then they are unblocked.
"""

import signal

for _stop in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
    signal.signal(_stop, signal.SIG_IGN)
signal.pthread_sigmask(signal.SIG_UNBLOCK, (signal.SIGTERM, signal.SIGHUP))
