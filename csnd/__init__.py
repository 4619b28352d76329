"""csnd: a parallel, CSN-ordered logical decoding service.

This package holds what every stage shares: the id types (`csnd.ids`), the one
error tree (`csnd.errors`) and the command line (`csnd.cli`).  The pipeline
itself lives in the sibling packages, in data-flow order::

    reader/ -> decoder/ -> sender/ -> coordinator/ -> consumers/
"""

__version__ = "0.1.0"
