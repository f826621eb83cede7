"""Features: the batch data model (:mod:`.batch`), streaming readers that yield
:class:`~embeddb.features.batch.Batch` objects, the feature pipeline (raw records to batches,
shared by training and serving), deterministic string hashing, and Criteo-shaped synthetic
data with a known best AUC.

numpy only (no torch, no pandas): the embedding worker and tools without torch use it. May
import :mod:`embeddb.common`, :mod:`embeddb.datasets`, :mod:`embeddb.errors`; never the
client, the engine, the transport, training or serving (the ``features`` contract).

Readers (each an iterable of batches; every ``iter()`` is one pass over the data):

* :class:`CriteoReader`: Criteo TSV (gzip or plain): ``C1``..``C26`` ids, ``dense`` (n, 13).
* :class:`AdultReader`: UCI Adult, the shipped copy or a directory.
* :class:`MovieLensReader`: MovieLens 100K ratings (any official split) joined with users
  and movies; ``genres`` is ragged.
* :class:`CsvReader` / :class:`ParquetReader`: any table, driven by a :class:`ColumnSpec`
  (RFC 4180 quoted fields in text; Parquet needs the ``parquet`` extra: pyarrow), with
  derived columns (:class:`DerivedColumn`: the hour or weekday of a timestamp column).
* :class:`LibsvmReader`: libSVM / libFM text (``label idx:val ...``, ``label field:idx:val
  ...``): the ragged id feature ``features``, one ID feature per field or index range
  (slots), and indexes as numeric columns (:func:`libsvm_spec`).
* :class:`DatasetSpec`: the reader of a job file's ``dataset:`` (below).
* :class:`SyntheticCriteo`: ``.batches(n, batch_size, split)`` and ``.best_auc()``.
* :class:`RowRange`: rows ``start:stop`` of another reader (a positional train/test split).

Streaming at any size (:mod:`.stream`): :func:`partition` gives each rank its disjoint
:class:`Part` list of the files (byte ranges; whole ``.gz`` files, Parquet row groups);
a :class:`RowFilter` (:class:`HashSplit`, :class:`OrderSplit` with :func:`order_threshold`,
:class:`HeadRows`) keeps a split's rows; :func:`shuffled` mixes rows in a bounded buffer.
The table readers take ``parts=``, ``row_filter=`` and ``stripe=(rank, world)``.

Datasets of a job file and serving:

* :class:`DatasetSpec`: the ``dataset:`` node of a job (files, columns, split, shuffle,
  presets); ``fit()`` returns a :class:`FeaturePipeline`, ``reader()`` streams a split.
* :class:`FeaturePipeline`: the fitted columns; ``batch_from_records`` builds the batch of raw
  JSON-shaped records with the code that builds training batches (:func:`save_pipeline`,
  :func:`load_pipeline`, :data:`PIPELINE_FILE`).

Text is parsed a chunk at a time with whole-array operations (8 bytes per ``uint64``
operation for hex and decimal fields); no Python code runs per row. Strings become ids
through :func:`hash_strings` (SplitMix64 chained over the bytes, seeded by a namespace):
the same in every process and run.
"""

from __future__ import annotations

from embeddb.features._reader import Reader, RowRange
from embeddb.features.adult import AdultReader
from embeddb.features.criteo import CriteoConfig, CriteoReader, criteo_spec
from embeddb.features.dataset import DatasetSpec
from embeddb.features.delimited import CsvReader
from embeddb.features.hashing import hash_strings, namespace_seed
from embeddb.features.libsvm import LibsvmReader, libsvm_spec
from embeddb.features.movielens import MovieLensConfig, MovieLensReader
from embeddb.features.parquet import ParquetReader
from embeddb.features.pipeline import PIPELINE_FILE, FeaturePipeline, load_pipeline, save_pipeline
from embeddb.features.spec import (
    ColumnSpec,
    CsvDialect,
    DerivedColumn,
    IDColumn,
    IdKind,
    LabelColumn,
    NumericColumn,
)
from embeddb.features.stream import (
    HashSplit,
    HeadRows,
    OrderSplit,
    Part,
    RowFilter,
    order_threshold,
    partition,
    shuffled,
)
from embeddb.features.synthetic import (
    SyntheticCriteo,
    SyntheticCriteoConfig,
    SyntheticSamples,
    ZipfSampler,
)

__all__ = [
    "PIPELINE_FILE",
    "AdultReader",
    "ColumnSpec",
    "CriteoConfig",
    "CriteoReader",
    "CsvDialect",
    "CsvReader",
    "DatasetSpec",
    "DerivedColumn",
    "FeaturePipeline",
    "HashSplit",
    "HeadRows",
    "IDColumn",
    "IdKind",
    "LabelColumn",
    "LibsvmReader",
    "MovieLensConfig",
    "MovieLensReader",
    "NumericColumn",
    "OrderSplit",
    "ParquetReader",
    "Part",
    "Reader",
    "RowFilter",
    "RowRange",
    "SyntheticCriteo",
    "SyntheticCriteoConfig",
    "SyntheticSamples",
    "ZipfSampler",
    "criteo_spec",
    "hash_strings",
    "libsvm_spec",
    "load_pipeline",
    "namespace_seed",
    "order_threshold",
    "partition",
    "save_pipeline",
    "shuffled",
]
