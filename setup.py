"""The compiled modules, beside pyproject.toml (which holds everything else).

`csnd.reader._txnscan` is the live reader's frame loop in C,
`csnd.decoder._rows` a decoder's row reader for tables of common column
types, `csnd.changelog._frames` the changelog's record encoding for a run
of records (it links zlib for the CRC), and `csnd.service._feedwire` a
changefeed batch's protobuf bytes.  All are optional: without a C compiler
the install goes on and csnd runs their Python twins (slower, the same
output).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension("csnd.reader._txnscan", ["csnd/reader/_txnscan.c"], optional=True),
        Extension("csnd.decoder._rows", ["csnd/decoder/_rows.c"], optional=True),
        Extension("csnd.service._feedwire", ["csnd/service/_feedwire.c"], optional=True),
        Extension(
            "csnd.snapshot._copysplit",
            ["csnd/snapshot/_copysplit.c"],
            depends=["csnd/decoder/_rows.c"],  # (compiled in: the row reader's value writers)
            optional=True,
        ),
        Extension("csnd.changelog._frames", ["csnd/changelog/_frames.c"], libraries=["z"], optional=True),
    ]
)
