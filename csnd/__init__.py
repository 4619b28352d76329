"""csnd: a parallel, CSN-ordered logical decoding service.

One import name.  The pipeline's stages are subpackages, in data-flow order::

    csnd.reader -> csnd.decoder -> csnd.sender -> csnd.coordinator -> csnd.consumers

beside `csnd.core` (ids, the error tree, durable files: imports nothing else of
ours), `csnd.gtm` (the CSN sequencer and the writer-side cluster kit),
`csnd.proto` (the one wire schema), the runtime that wires the stages together,
the command line (`csnd.cli`) and `csnd.testing` (throwaway servers for tests
and the demo).
"""

__version__ = "0.1.0"
