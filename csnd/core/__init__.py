"""The core every stage shares, importing nothing else of csnd's.

ids      Lsn / Csn / Xid and their text forms
errors   the one error tree
durable  fsync of names, the writeback hint
markers  the grammar of GTM mode's csn markers
modes    the two CSN modes, gtm and single
"""
