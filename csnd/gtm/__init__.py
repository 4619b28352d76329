"""gtm: the GTM side of a GaussDB-style cluster -- the CSN sequencer and its writers.

    Gtm (sequencer) ── current() / next() ──┬─► writer.GlobalTransaction ─► live PostgreSQL nodes
                                            │     (csn markers via pg_logical_emit_message,
                                            │      PREPARE / COMMIT PREPARED)
                                            │
                                            └─► generate_cluster ─► DIR/dn1..dnK.pgstream
                                                  (synthetic cluster,   DIR/expected.jsonl
                                                   emulated walsenders)

Live clusters: `PgGtm` (pggtm) is the shared, durable sequencer and commit
log on a designated server; `recover_in_doubt` (recovery) finishes what dead
writers left; `Ticker` (ticker) writes flushed watermarks; `csnd workload`
(liveload, commands) runs concurrent writer processes.

Both writers follow the same commit protocol (docs/design.md section 2): `committing`
with the GTM's current CSN on every node, then a new CSN from the GTM, then the
transactional `commit` marker and the commit on every node; `abort` when a
transaction that logged `committing` fails; `tick` watermarks.  The marker
texts and their grammar live in `csnd.core.markers`, shared with the reader.

Public API (for the command line, the demo, the tests and bench/): the names
in `__all__`, and the modules `barrier` (the commit barrier a GTM-aware
snapshot waits on), `commands` (the cluster kit's subcommands),
`generate`, `liveload` and `pgtypes` (the PostgreSQL types the generators
write).  The rest is the kit's own.
"""

from csnd.core.errors import CommitIncomplete, CommitInDoubt
from csnd.gtm.generate import generate_cluster
from csnd.gtm.generate_options import GenerateOptions, GenerateSummary
from csnd.gtm.pggtm import PgGtm
from csnd.gtm.recovery import RecoveryReport, recover_in_doubt
from csnd.gtm.sequencer import Gtm, Sequencer
from csnd.gtm.ticker import Ticker
from csnd.gtm.writer import GlobalTransaction, tick

__all__ = [
    "CommitInDoubt",
    "CommitIncomplete",
    "GenerateOptions",
    "GenerateSummary",
    "GlobalTransaction",
    "Gtm",
    "PgGtm",
    "RecoveryReport",
    "Sequencer",
    "Ticker",
    "barrier",
    "commands",
    "generate",
    "generate_cluster",
    "liveload",
    "pgtypes",
    "recover_in_doubt",
    "tick",
]
