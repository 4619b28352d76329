"""The one compiled module, beside pyproject.toml (which holds everything else).

`csnd.reader._txnscan` is the live reader's frame loop in C; it is optional:
without a C compiler the install goes on and `csnd.reader.txnscan` runs its
Python twin (slower, the same output).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension("csnd.reader._txnscan", ["reader/_txnscan.c"], optional=True),
    ]
)
