"""The changefeed in Spark: `CsndDataSource`, a PySpark 4 Python data source named `csnd`.

    from csnd.consumers.spark import CsndDataSource
    spark.dataSource.register(CsndDataSource)
    df = spark.readStream.format("csnd").option("target", "HOST:PORT").load()

    options.py  the options, checked once when the query starts
    ranges.py   offsets (CSNs), micro-batch ends and partition cuts (pure)
    columns.py  transaction lines -> Arrow rows, one per change (pure)
    feed.py     the calls to the service (Status, Fetch, acknowledgements)
    source.py   the DataSource and its batch and stream readers

Rows: SCHEMA_DDL (docs/design.md section 8).  Needs the `spark` extra
(pip install 'csnd[spark]'): pyspark, pyarrow and pandas.

Public API: the names in `__all__`, and `columns` (the service builds the
same Arrow rows with it for Fetch's arrow format).  The other modules are
the source's own.
"""

from csnd.consumers.spark.columns import ARROW_SCHEMA, SCHEMA_DDL, RowBuilder, flatten
from csnd.consumers.spark.source import CsndBatchReader, CsndDataSource, CsndStreamReader, CsnRange

__all__ = [
    "ARROW_SCHEMA",
    "SCHEMA_DDL",
    "CsnRange",
    "CsndBatchReader",
    "CsndDataSource",
    "CsndStreamReader",
    "RowBuilder",
    "columns",
    "flatten",
]
