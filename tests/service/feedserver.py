"""A changefeed server process over a changelog directory, for the tests that kill it.

    python -m tests.service.feedserver DIR PORT TOTAL

Serves DIR on 127.0.0.1:PORT (0: any) and appends transactions csn 1..TOTAL
to it (continuing after what DIR already holds), a few every 20 ms, so a
subscriber is mid-stream whenever the process is killed.  Prints
`listening on PORT` once it serves.  Runs until killed.
"""

from __future__ import annotations

import sys
import time

from csnd.changelog import Changelog
from csnd.service import FeedSettings
from tests.service.feedkit import line, serve, txn_tables


def main() -> None:
    directory, port, total = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    log = Changelog(directory, segment_bytes=64 << 10)
    srv = serve(log, listen=f"127.0.0.1:{port}", settings=FeedSettings(keepalive_s=0.5, client_timeout_s=10))
    print(f"listening on {srv.port}", flush=True)
    csn = log.durable_csn
    while True:
        if csn < total:
            upto = min(csn + 5, total)
            for c in range(csn + 1, upto + 1):
                log.append(c, line(c, txn_tables(c), gid=f"g-{c}"))
            log.sync()
            csn = upto
        time.sleep(0.02)


if __name__ == "__main__":
    main()
