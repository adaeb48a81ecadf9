"""Writing result tables: CSV and Parquet through Arrow (fast, and without a copy of the data).

CSV cells hold the shortest text that reads back as the same number; missing
values are empty cells; strings are quoted.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

STEP_FORMATS = ("csv", "parquet", "none")
"""How ``sim replay`` writes the step table: ``steps.csv``, ``steps.parquet``, or not at all."""
PARQUET_ROW_GROUP = 1 << 16
"""Rows per Parquet row group: the writer holds one group's buffers at a time."""


def _arrow_table(frame: pd.DataFrame, plain_strings: bool) -> object:
    import pyarrow as pa

    if plain_strings:
        categorical = [c for c in frame.columns if isinstance(frame[c].dtype, pd.CategoricalDtype)]
        frame = frame.astype({c: str for c in categorical})
    return pa.Table.from_pandas(frame, preserve_index=False)


def write_csv(frame: pd.DataFrame, path: Path) -> None:
    """``frame`` as CSV with a header row."""
    import pyarrow.csv as pcsv

    pcsv.write_csv(_arrow_table(frame, plain_strings=True), path)


def write_parquet(frame: pd.DataFrame, path: Path) -> None:
    """``frame`` as Parquet (zstd); categorical columns become dictionary columns.

    Only those are dictionary-encoded: dictionaries for every column of a
    million-row table hold tens of MB of hash tables while it is written.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    categorical = [c for c in frame.columns if isinstance(frame[c].dtype, pd.CategoricalDtype)]
    pq.write_table(
        _arrow_table(frame, plain_strings=False),
        path,
        row_group_size=PARQUET_ROW_GROUP,
        use_dictionary=categorical,
        compression="zstd",
    )
    pa.default_memory_pool().release_unused()
