"""The core every stage shares, importing nothing else of csnd's.

ids          Lsn / Csn / Xid and their text forms
errors       the one error tree
durable      fsync of names, the writeback hint
markers      the grammar of GTM mode's csn markers
modes        the two CSN modes, gtm and single, and which sets of nodes can be merged
tablespec    the `schema.table` syntax of table filters
addresses    HOST:PORT addresses to listen on
listening    a listen address checked before a server binds it
backoff      when a retry loop tries again and when it stops (exponential, full jitter)
tokens       bearer tokens in files
auth         bearer tokens with roles, checked by a gRPC server interceptor
tls          the one builder of TLS credentials, server and channel
reflection   gRPC server reflection under v1 and v1alpha
appname      PostgreSQL application_name for every connection csnd opens
compiled     loading a C module beside its Python twin
hostid       this host's identity (its Linux boot id)
exportnames  the names of the Parquet export's files
lines        the text of a section 7 line, shared by the merge and the snapshot

Public API: every module above (all of them: the core is what the stages
share).  Nothing is imported here, so importing one costs that module only
(`from csnd.core.ids import Lsn`).
"""

__all__ = [
    "addresses",
    "appname",
    "auth",
    "backoff",
    "compiled",
    "durable",
    "errors",
    "exportnames",
    "hostid",
    "ids",
    "lines",
    "listening",
    "markers",
    "modes",
    "reflection",
    "tablespec",
    "tls",
    "tokens",
]
