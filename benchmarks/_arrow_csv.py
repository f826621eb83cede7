"""A CSV/TSV reader on pyarrow's streaming CSV reader (``pyarrow.csv.open_csv``): the variant
that ``data.py`` measures against embeddb's own reader (:class:`~embeddb.features.CsvReader`).

It is a prototype kept for the comparison, not a product reader: it reads whole files (no
byte ranges), and what it cannot keep of the own reader's behaviour is listed in
``docs/own-data.md`` ("Why the CSV reader is our own").

Every column the spec reads is converted to an Arrow string column (``column_types``), so
fields go through the same parsers and hashes as the own reader's (the same ids and values,
and parse errors naming the column); the Arrow record batches become
:class:`~embeddb.features.parquet.ArrowChunk` s, built into blocks by the same
:func:`~embeddb.features._reader.build_block`. ``typed=True`` lets pyarrow convert the
numeric columns itself (``float64``; ids stay text): the fastest form it offers.
"""

from __future__ import annotations

import functools
import importlib
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

from embeddb.features import (
    ColumnSpec,
    CsvDialect,
    CsvReader,
    IDColumn,
    LabelColumn,
    NumericColumn,
    Reader,
)
from embeddb.features._block import Block
from embeddb.features._parts import PartsReader, Source
from embeddb.features._reader import build_block
from embeddb.features.parquet import ArrowChunk
from embeddb.features.stream import FilterableChunk, Part


class ArrowCsvReader(PartsReader):
    """Batches from delimited text files through ``pyarrow.csv.open_csv``.

    Args:
        path: the file or files (whole; gzip is decompressed by pyarrow when named ``.gz``).
        spec: which columns are ID features, numeric features and labels.
        batch_size: samples per batch.
        dialect: delimiter, quote and ``chunk_bytes`` (pyarrow's ``block_size``) are used.
        typed: pyarrow converts the numeric feature and label columns (else all text).
        use_threads: pyarrow parses and converts with its thread pool.
    """

    def __init__(
        self,
        path: Source,
        spec: ColumnSpec,
        batch_size: int,
        dialect: CsvDialect | None = None,
        *,
        typed: bool = False,
        use_threads: bool = True,
        requires_grad: bool = True,
    ) -> None:
        super().__init__(path, batch_size, requires_grad=requires_grad)
        self.spec = spec
        self.dialect = dialect or CsvDialect()
        numeric = {c for n in spec.numeric for c in n.columns} | {
            lb.column for lb in spec.labels if not lb.positive
        }
        self._types = {
            c: pa.float64() if typed and c in numeric else pa.large_string() for c in spec.columns()
        }
        self._read = pacsv.ReadOptions(block_size=self.dialect.chunk_bytes, use_threads=use_threads)
        self._parse = pacsv.ParseOptions(
            delimiter=self.dialect.delimiter,
            quote_char=self.dialect.quote or False,
            double_quote=True,
            newlines_in_values=False,
            ignore_empty_lines=True,
        )
        self._convert = pacsv.ConvertOptions(
            column_types=self._types,
            include_columns=list(self._types),
            strings_can_be_null=False,
            quoted_strings_can_be_null=False,
            null_values=[""],
        )

    def _part_chunks(
        self, part: Part, columns: Sequence[str] | None
    ) -> Iterator[Callable[[], FilterableChunk]]:
        reader: Any = pacsv.open_csv(
            part.path,
            read_options=self._read,
            parse_options=self._parse,
            convert_options=self._convert,
        )
        first_row = 0
        for batch in reader:
            yield functools.partial(ArrowChunk, pa, pc, batch, part.path, first_row)
            first_row += batch.num_rows

    def _build(self, chunk: FilterableChunk) -> Block:
        return build_block(chunk, self.spec)


# ------------------------------------------------------------------------------------------
# The measured comparison (benchmarks/data.py)
# ------------------------------------------------------------------------------------------

CLICKS_SPEC = ColumnSpec(
    ids=(
        IDColumn("user"),
        IDColumn("item"),
        IDColumn("city"),
        IDColumn("device"),
        IDColumn("tags", separator="|"),
    ),
    numeric=(NumericColumn(("price", "age")),),
    labels=(LabelColumn("clicked"),),
)  # data.py's job: the same columns (its transforms apply after reading)

VARIANTS: dict[str, Callable[[Path], Reader]] = {
    "own": lambda path: CsvReader(path, CLICKS_SPEC, 4096),
    "pyarrow": lambda path: ArrowCsvReader(path, CLICKS_SPEC, 4096),
    "pyarrow_typed": lambda path: ArrowCsvReader(path, CLICKS_SPEC, 4096, typed=True),
}


def read_all(reader: Reader) -> tuple[int, float]:
    """Rows read (blocks built, as a training job builds them) and the seconds it took."""
    started = time.perf_counter()
    rows = sum(block.size for block in reader._blocks())
    return rows, time.perf_counter() - started


def same_blocks(path: Path, variant: str) -> bool:
    """The variant's first blocks hold the own reader's ids, numbers and labels."""
    own = next(iter(VARIANTS["own"](path)._blocks()))
    other = next(iter(VARIANTS[variant](path)._blocks()))
    n = min(own.size, other.size)
    a, b = own.slice(0, n), other.slice(0, n)
    return (
        all(
            np.array_equal(a.ids[k].values, b.ids[k].values)
            and np.array_equal(a.ids[k].full_offsets(), b.ids[k].full_offsets())
            for k in a.ids
        )
        and all(np.array_equal(a.dense[k], b.dense[k]) for k in a.dense)
        and all(np.array_equal(a.labels[k], b.labels[k]) for k in a.labels)
    )


def compare_readers(path: Path, repeats: int) -> dict[str, Any]:
    """Rows/s and MB/s of every variant over ``path``: the best of ``repeats`` rounds, the
    variants interleaved within each round (a shared machine's noise hits them alike)."""
    size = path.stat().st_size
    best: dict[str, float] = {}
    rows: dict[str, int] = {}
    for _ in range(repeats):
        for name, make in VARIANTS.items():
            rows[name], seconds = read_all(make(path))
            best[name] = min(best.get(name, float("inf")), seconds)
    if len(set(rows.values())) != 1:
        raise SystemExit(f"the CSV readers read different row counts: {rows}")
    out: dict[str, Any] = {"csv_bench_rows": rows["own"], "csv_bench_bytes": size}
    for name, seconds in best.items():
        out[f"csv_rows_per_s_{name}"] = rows[name] / seconds
        out[f"csv_mb_per_s_{name}"] = size / seconds / 1e6
    out["csv_pyarrow_vs_own"] = best["own"] / best["pyarrow"]
    out["csv_pyarrow_typed_vs_own"] = best["own"] / best["pyarrow_typed"]
    out["csv_pyarrow_same_blocks"] = same_blocks(path, "pyarrow")
    out["csv_pyarrow_typed_same_blocks"] = same_blocks(path, "pyarrow_typed")
    return out


def import_cost_ms() -> dict[str, float]:
    """Cold import of ``pyarrow.csv`` after numpy (``python -X importtime``, which embeddb
    already imports), summed over its top-level imports; best of 3 fresh interpreters."""
    best = float("inf")
    for _ in range(3):
        proc = subprocess.run(
            [sys.executable, "-X", "importtime", "-c", "import numpy; import pyarrow.csv"],
            capture_output=True,
            text=True,
            check=True,
        )
        total, after_numpy = 0, False
        for line in proc.stderr.splitlines():
            if not line.startswith("import time:") or "|" not in line:
                continue
            _, cumulative, name = line.split("|")
            if name.startswith("  "):  # nested: counted in its top-level import
                continue
            if name.strip() == "numpy":
                after_numpy = True
            elif after_numpy:
                total += int(cumulative)
        best = min(best, total / 1e3)
    return {"pyarrow_csv_import_ms": best, "pyarrow_install_mb": _installed_mb("pyarrow")}


def _installed_mb(package: str) -> float:
    """The size on disk of an installed package's files (what a base dependency adds)."""
    root = Path(importlib.import_module(package).__file__ or "").parent
    libs = root.parent / f"{package}.libs"
    files = [f for d in (root, libs) if d.is_dir() for f in d.rglob("*") if f.is_file()]
    return sum(f.stat().st_size for f in files) / 2**20
