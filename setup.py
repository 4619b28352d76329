"""The compiled modules, beside pyproject.toml (which holds everything else).

`csnd.reader._txnscan` is the live reader's frame loop in C, and
`csnd.changelog._frames` the changelog's record encoding for a run of
records (it links zlib for the CRC).  Both are optional: without a C compiler
the install goes on and `csnd.reader.txnscan` and `csnd.changelog.record`
run their Python twins (slower, the same output).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension("csnd.reader._txnscan", ["reader/_txnscan.c"], optional=True),
        Extension("csnd.changelog._frames", ["csnd/changelog/_frames.c"], libraries=["z"], optional=True),
    ]
)
