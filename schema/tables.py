"""Writing result tables: CSV and Parquet through Arrow (fast, and without a copy of the data).

CSV cells hold the shortest text that reads back as the same number; missing
values are empty cells; strings are quoted.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

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


class TableWriter:
    """A table written chunk by chunk (``write``), then ``close``d: to a CSV or Parquet file,
    or kept in memory (``frame()``). The chunks make the same table as one ``write`` of
    their concatenation."""

    def write(self, frame: pd.DataFrame) -> None:
        raise NotImplementedError

    def close(self) -> None:
        """Ends the table (a file gets its header even when no row came)."""


class MemoryTable(TableWriter):
    """Keeps the chunks; ``frame()`` concatenates them."""

    def __init__(self) -> None:
        self._chunks: list[pd.DataFrame] = []

    def write(self, frame: pd.DataFrame) -> None:
        self._chunks.append(frame)

    def frame(self) -> pd.DataFrame:
        """The table; a categorical column takes the last chunk's categories (each chunk's
        extend the one's before)."""
        if len(self._chunks) == 1:
            return self._chunks[0]
        last = self._chunks[-1]
        categorical = [c for c in last.columns if isinstance(last[c].dtype, pd.CategoricalDtype)]
        for chunk in self._chunks[:-1]:
            for c in categorical:
                chunk[c] = chunk[c].cat.set_categories(last[c].cat.categories)
        out = pd.concat(self._chunks, ignore_index=True)
        self._chunks = [out]
        return out


class NoTable(TableWriter):
    """Drops the chunks (a table not asked for)."""

    def write(self, frame: pd.DataFrame) -> None:
        pass


class TeeTable(TableWriter):
    """Each chunk to both writers."""

    def __init__(self, first: TableWriter, second: TableWriter) -> None:
        self.first, self.second = first, second

    def write(self, frame: pd.DataFrame) -> None:
        self.first.write(frame)
        self.second.write(frame)

    def close(self) -> None:
        self.first.close()
        self.second.close()


class FileTable(TableWriter):
    """A file written chunk by chunk; its writer opens with the first chunk's schema."""

    plain_strings = True  # categorical columns written as their strings

    def __init__(self, path: Path) -> None:
        self.path = path
        self._writer: Any = None

    def _open(self, frame: pd.DataFrame, schema: Any) -> Any:
        raise NotImplementedError

    def _append(self, table: Any) -> None:
        self._writer.write_table(table)

    def write(self, frame: pd.DataFrame) -> None:
        table: Any = _arrow_table(frame, plain_strings=self.plain_strings)
        if self._writer is None:
            self._writer = self._open(frame, table.schema)
        self._append(table)

    def close(self) -> None:
        if self._writer is None:
            raise RuntimeError(f"{self.path}: no chunk was written (not even an empty one)")
        self._writer.close()


class CsvTable(FileTable):
    """``path`` as CSV, written as the chunks come (``write_csv``'s cells)."""

    def _open(self, frame: pd.DataFrame, schema: Any) -> Any:
        import pyarrow.csv as pcsv

        return pcsv.CSVWriter(self.path, schema)


class ParquetTable(FileTable):
    """``path`` as Parquet (``write_parquet``'s encoding), a row group at a time."""

    plain_strings = False

    def _open(self, frame: pd.DataFrame, schema: Any) -> Any:
        import pyarrow.parquet as pq

        categorical = [c for c in frame.columns if isinstance(frame[c].dtype, pd.CategoricalDtype)]
        return pq.ParquetWriter(self.path, schema, use_dictionary=categorical, compression="zstd")

    def _append(self, table: Any) -> None:
        self._writer.write_table(table, row_group_size=PARQUET_ROW_GROUP)

    def close(self) -> None:
        import pyarrow as pa

        super().close()
        pa.default_memory_pool().release_unused()


def table_writer(fmt: str, path: Path) -> TableWriter:
    """A writer of ``path`` in ``fmt`` (one of ``STEP_FORMATS``; ``none`` writes nothing)."""
    if fmt == "csv":
        return CsvTable(path)
    if fmt == "parquet":
        return ParquetTable(path)
    if fmt == "none":
        return NoTable()
    raise ValueError(f"unknown table format {fmt!r}; known: {list(STEP_FORMATS)}")
