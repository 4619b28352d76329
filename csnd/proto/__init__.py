"""The wire schemas, in versioned packages; their code is generated (scripts/gen_proto.py), never edited.

    changefeed.v1   csnd.changefeed.v1: the changefeed consumers call -- THE PUBLIC CONTRACT,
                    documented field by field in changefeed/v1/changefeed.proto
    agent.v1        csnd.agent.v1: node agent <-> merge, internal to csnd (both ends one release)
    legacy          the services under their names before the versioned packages
                    (csnd.v1.Changefeed, csnd.v1.NodeAgent): deprecated, still served

Public API for users: `changefeed` (and the .proto itself, for clients in other
languages).  `agent` is for csnd's runtime and merge only; `legacy` for its servers.
"""

__all__ = ["agent", "changefeed", "legacy"]
