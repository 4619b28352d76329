"""Imported first by the decoder workers' fork server, and by nothing else.

The fork server gives each worker it forks the Ctrl-C handler it had after
its preloaded imports.  Ignoring Ctrl-C here makes that "ignore" however the
server was started -- also when multiprocessing (re)starts it from a thread
other than the main one, where the starter cannot set it -- so no worker
between its fork and its first line dies of a KeyboardInterrupt with a
traceback on the terminal: Ctrl-C goes to the whole process group, and the
parent decides how to stop.
"""

import signal

signal.signal(signal.SIGINT, signal.SIG_IGN)
