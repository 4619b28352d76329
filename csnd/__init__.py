"""csnd: a parallel, CSN-ordered logical decoding service.

One import name.  The pipeline's stages are subpackages, in data-flow order::

    csnd.reader -> csnd.decoder -> csnd.sender -> csnd.coordinator -> csnd.consumers

beside `csnd.core` (ids, the error tree, durable files: imports nothing else of
ours), `csnd.gtm` (the CSN sequencer and the writer-side cluster kit),
`csnd.proto` (the one wire schema), the runtime that wires the stages together,
the command line (`csnd.cli`) and `csnd.testing` (throwaway servers for tests
and the demo).

Public API: each package states its own in its `__init__` (`__all__`: the
names and submodules other packages and users may import; what it does not
list is internal to it; tests/test_exports.py holds the line, and
docs/reference.md lists them).  For users: `csnd.consumers.client`
(ChangefeedClient, fetch), `csnd.consumers.spark` (the Spark source), the
changefeed's gRPC contract `csnd.proto.changefeed.v1`, and the `csnd` command.
"""

__version__ = "0.1.0"

__all__ = [
    "__version__",
    "changelog",
    "cli",
    "consumers",
    "coordinator",
    "core",
    "decoder",
    "gtm",
    "proto",
    "reader",
    "runtime",
    "sender",
    "service",
    "snapshot",
    "testing",
]
