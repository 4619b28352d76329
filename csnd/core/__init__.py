"""The core every stage shares, importing nothing else of csnd's.

ids        Lsn / Csn / Xid and their text forms
errors     the one error tree
durable    fsync of names, the writeback hint
markers    the grammar of GTM mode's csn markers
modes      the two CSN modes, gtm and single, and which sets of nodes can be merged
tablespec  the `schema.table` syntax of table filters
addresses  HOST:PORT addresses to listen on
backoff    when a retry loop tries again and when it stops (exponential, full jitter)
tokens     bearer tokens in files
"""
