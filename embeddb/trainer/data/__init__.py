"""Training data: streaming readers that yield :class:`~embeddb.trainer.batch.Batch` objects,
deterministic string hashing, and Criteo-shaped synthetic data with a known best AUC.

numpy only (no torch, no pandas): the embedding worker and tools without torch use it.

Readers (each an iterable of batches; every ``iter()`` is one pass over the data):

* :class:`CriteoReader`: Criteo TSV (gzip or plain): ``C1``..``C26`` ids, ``dense`` (n, 13).
* :class:`AdultReader`: UCI Adult, the shipped copy or a directory.
* :class:`MovieLensReader`: MovieLens 100K ratings (any official split) joined with users
  and movies; ``genres`` is ragged.
* :class:`CsvReader` / :class:`ParquetReader`: any table, driven by a :class:`ColumnSpec`
  (Parquet needs the ``parquet`` extra: pyarrow).
* :class:`SyntheticCriteo`: ``.batches(n, batch_size, split)`` and ``.best_auc()``.
* :class:`RowRange`: rows ``start:stop`` of another reader (a positional train/test split).

Text is parsed a chunk at a time with whole-array operations (8 bytes per ``uint64``
operation for hex and decimal fields); no Python code runs per row. Strings become ids
through :func:`hash_strings` (SplitMix64 chained over the bytes, seeded by a namespace):
the same in every process and run.
"""

from __future__ import annotations

from ._reader import Reader, RowRange
from .adult import AdultReader
from .criteo import CriteoConfig, CriteoReader, criteo_spec
from .delimited import CsvReader
from .hashing import hash_strings, namespace_seed
from .movielens import MovieLensConfig, MovieLensReader
from .parquet import ParquetReader
from .spec import (
    ColumnSpec,
    CsvDialect,
    IDColumn,
    IdKind,
    LabelColumn,
    NumericColumn,
)
from .synthetic import (
    SyntheticCriteo,
    SyntheticCriteoConfig,
    SyntheticSamples,
    ZipfSampler,
)

__all__ = [
    "AdultReader",
    "ColumnSpec",
    "CriteoConfig",
    "CriteoReader",
    "CsvDialect",
    "CsvReader",
    "IDColumn",
    "IdKind",
    "LabelColumn",
    "MovieLensConfig",
    "MovieLensReader",
    "NumericColumn",
    "ParquetReader",
    "Reader",
    "RowRange",
    "SyntheticCriteo",
    "SyntheticCriteoConfig",
    "SyntheticSamples",
    "ZipfSampler",
    "criteo_spec",
    "hash_strings",
    "namespace_seed",
]
