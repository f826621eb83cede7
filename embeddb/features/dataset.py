"""A dataset described in a job file: its files, columns, split and shuffle, and its fitting.

:class:`DatasetSpec` is built from the ``dataset:`` node of a job file
(:meth:`DatasetSpec.from_yaml_node`; every key checked by :mod:`.dataset_yaml`)::

    dataset:
      format: csv                        # csv | tsv | parquet | libsvm
      train: data/train*.csv             # a path or glob (or a list), plain or .gz
      test: data/test.csv                # or split: {fraction: 0.2} | {order_by: t, fraction: 0.2}
      label: {column: clicked}           # positive: [...] optional; 1/0 and 1/-1 numbers as is
      ids: [user, {column: tags, separator: "|"}, {column: ad, kind: hex}, hour]
      numeric: [{column: price, transform: log1p}, {column: age, transform: standardize}]
      derived: {hour: {from: click_time, extract: hour}}   # hour | weekday | day | month | year
      na_values: ["NA", "null", "?"]     # besides empty fields
      header: {train: true, test: false} # or true / false for all files
      quote: '"'                         # RFC 4180 quoting (the default); false: quotes are text
      shuffle: {buffer_rows: 65536, seed: 0}   # or false

:meth:`DatasetSpec.fit` reads a bounded sample of the training files (the first
``sample_rows`` rows) and returns the fitted
:class:`~embeddb.features.pipeline.FeaturePipeline` (standardize statistics, the order
split's threshold); every problem is a :class:`~embeddb.errors.ConfigError` naming the key
and its file:line, or the data file and its line. :meth:`DatasetSpec.reader` streams a split.

Splits:

* ``test: FILES``: those files are the test split, whole.
* ``split: {fraction: F, seed: S}``: a row is a test row when the hash of its bytes (seeded)
  falls in the last ``F`` of the hash range: the same rows in every process and epoch.
* ``split: {order_by: COLUMN, fraction: F}``: the rows whose ``COLUMN`` is at or after the
  ``1 - F`` quantile (measured on the sample by ``fit``; numbers or ISO dates) are test rows.
* ``split: {head_rows: N}`` (the ``criteo`` preset's ``train_rows``): the first ``N`` rows of
  the train files, in order, train; the rest test. Every rank parses the head and keeps every
  ``world``-th chunk of it (chunk striping; ``stream.HeadRows``): positional, so it cannot
  use byte ranges; training stops reading at the end of the head.

A rank with no part of the input (fewer ``.gz`` files or Parquet row groups than ranks)
gets a reader without batches.

Text files: quoted fields follow RFC 4180 (``quote``); a line break inside a quoted field is
an error naming its file and line (every newline ends a row, so byte ranges stay exact).
``header: {train: BOOL, test: BOOL}`` when the splits differ; a headerless split without
``names`` takes the column names of the other split's header. ``derived`` columns (an hour or
weekday of a timestamp column: unix time or ISO-8601) are used by name in ``ids`` and
``numeric``; they are part of the fitted pipeline, so serving computes them from the raw
record's timestamp.

``format: libsvm`` (``label idx:val ...`` or libFM's ``label field:idx:val ...``): the label
is ``label``; ``numeric`` names indexes (``[17, {column: 3, transform: log1p}]``); the csv
keys (``names``, ``header``, ``delimiter``, ``na_values``...) are errors. ID features:
``slots: {user: {field: 0}, item: {field: 1}}`` (one per field) or ``slots: {user: {indexes:
[0, 957]}, ...}`` (one per index range) give each its own feature (its own table); without
``ids`` and ``slots``, a file of ``field:idx:val`` tokens gets one feature per field found by
``fit`` (``field_0``, ...), any other file the plain libSVM feature ``features`` (every index;
``ids: [features]`` asks for it explicitly, ``{column: features, name: apps}`` renames it).

Shuffling (on by default, ``buffer_rows`` = 65,536, documented in the README): each rank reads
its own disjoint part of the training files (byte ranges; whole files for ``.gz`` and
Parquet) in file order, and a buffer of ``buffer_rows`` rows is mixed: every batch draws its
rows at random from the buffer, refilled as it empties, seeded by ``(seed, epoch, rank)`` so
an epoch is reproducible and differs from the next. It mixes rows that are at most about
``buffer_rows`` apart in the file; it does not mix rows further apart (a file sorted by date
stays roughly in date order within the epoch) nor rows of different ranks. Sort-ordered
files should be pre-shuffled or given a larger buffer (memory grows with it:
about ``buffer_rows`` x the row's size in features). The test split is never shuffled.

Presets are the same mechanism (``dataset: adult`` or ``{preset: criteo, data_dir: ...}``):
``adult`` (the packaged copy, or ``data_dir``), ``criteo`` (TSV without header, needs
``data_dir`` and ``train_rows``), ``movielens`` (the ``ml-100k`` folder, ``split`` u1..ub;
its side tables are joined by :class:`~embeddb.features.MovieLensReader`).
"""

from __future__ import annotations

import glob
import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from embeddb.errors import (
    ConfigError,
    CorruptDataError,
    InvalidArgumentError,
    NotFoundError,
)
from embeddb.features import stream
from embeddb.features._block import Block
from embeddb.features._parts import PartsReader
from embeddb.features._reader import Reader
from embeddb.features._wrappers import DistinctIds, Empty, Head, Moments, Shuffled, Striped
from embeddb.features.dataset_yaml import Keys, ParsedDataset, SplitRule, parse_dataset
from embeddb.features.delimited import CsvReader, header_names
from embeddb.features.libsvm import LibsvmReader, field_column, sample_fields
from embeddb.features.movielens import MovieLensReader
from embeddb.features.parquet import ParquetReader
from embeddb.features.pipeline import FeaturePipeline
from embeddb.features.spec import ColumnSpec, CsvDialect, IDColumn

__all__ = ["DatasetSpec"]

logger = logging.getLogger(__name__)

_SPLITS = ("train", "test")


@dataclass(frozen=True)
class DatasetSpec:
    """A dataset: files, columns, split, shuffle (see the module docstring).

    Build it with :meth:`from_yaml_node` or :meth:`from_legacy`; ``parsed`` holds every
    checked setting.
    """

    parsed: ParsedDataset
    keys: Keys = field(default_factory=Keys)

    # ------------------------------------------------------------------------------------
    # Construction
    # ------------------------------------------------------------------------------------

    @classmethod
    def from_yaml_node(
        cls, raw: object, *, base_dir: Path, where: Callable[[str], str] = lambda key: ""
    ) -> DatasetSpec:
        """The dataset of a job file's ``dataset:`` value.

        Args:
            raw: a mapping, a preset name, or ``{preset: NAME, ...overrides}``.
            base_dir: relative paths are relative to this (the job file's folder).
            where: ``key path -> "job.yaml:12"`` for error messages.

        Raises:
            ConfigError: naming the key path; the message ends with ``(where(key))``.
        """
        keys = Keys(where=where)
        return cls(parse_dataset(raw, base_dir=Path(base_dir), keys=keys), keys)

    @classmethod
    def from_legacy(
        cls,
        dataset: str,
        data_dir: Path | str | None = None,
        split: str | None = None,
        train_rows: int | None = None,
        *,
        base_dir: Path = Path("."),
        where: Callable[[str], str] = lambda key: "",
    ) -> DatasetSpec:
        """A preset from the old top-level job keys ``dataset``, ``data_dir``, ``split`` and
        ``train_rows``; errors name those keys.

        Raises:
            ConfigError: unknown preset, a missing ``data_dir`` or ``train_rows``, bad split.
        """
        raw: dict[str, Any] = {"preset": dataset}
        for key, value in (("data_dir", data_dir), ("split", split), ("train_rows", train_rows)):
            if value is not None:
                raw[key] = str(value) if isinstance(value, Path) else value
        keys = Keys(where=where, legacy=True)
        return cls(parse_dataset(raw, base_dir=Path(base_dir), keys=keys), keys)

    # ------------------------------------------------------------------------------------
    # Properties
    # ------------------------------------------------------------------------------------

    @property
    def format(self) -> str:
        return self.parsed.format

    @property
    def preset(self) -> str | None:
        return self.parsed.preset

    @property
    def shuffle_rows(self) -> int:
        """Rows in the training shuffle buffer; 0: no shuffle (default 65,536)."""
        return self.parsed.shuffle_rows

    @property
    def columns(self) -> ColumnSpec:
        """The unfitted column spec (no standardize statistics)."""
        return self.parsed.columns

    @property
    def named_id_features(self) -> tuple[str, ...] | None:
        """The ID features' names as the dataset names them, in batch order: those of the
        pipeline :meth:`fit` returns; ``None`` when ``fit`` finds them in the data (a libSVM
        dataset without ``ids`` or ``slots``)."""
        if self.parsed.auto_slots:
            return None
        return tuple(c.feature for c in self.parsed.columns.ids)

    def train_files(self) -> list[Path]:
        """The training files (globs expanded, sorted; ``NAME`` or ``NAME.gz``).

        Raises:
            ConfigError: ``dataset.train``: a pattern matches no file.
        """
        return self._files(self.parsed.train, "train")

    def test_files(self) -> list[Path]:
        """The test files (empty when a split rule makes the test rows).

        Raises:
            ConfigError: ``dataset.test``: a pattern matches no file.
        """
        return self._files(self.parsed.test, "test")

    def _files(self, patterns: Sequence[str], key: str) -> list[Path]:
        found: list[Path] = []
        for pattern in patterns:
            if glob.has_magic(pattern):
                matches = sorted(Path(p) for p in glob.glob(pattern) if Path(p).is_file())
            else:
                path = Path(pattern)
                gz = path.with_name(path.name + ".gz")
                matches = [path] if path.is_file() else [gz] if gz.is_file() else []
            if not matches:
                preset = self.parsed.preset
                at = "data_dir" if preset is not None and self.parsed.data_dir else key
                raise self.keys.error(at, f"no file matches {pattern!r}")
            found += [m for m in matches if m not in found]
        return found

    # ------------------------------------------------------------------------------------
    # Fitting
    # ------------------------------------------------------------------------------------

    def fit(self, *, sample_rows: int = 100_000) -> FeaturePipeline:
        """Check the data against the spec on a bounded sample and fit the pipeline.

        Reads at most ``sample_rows`` rows of the training files (streamed, a chunk at a
        time): the columns exist, every value parses, the label is not empty throughout;
        measures mean and standard deviation of the ``standardize`` columns (a constant
        column gets std 1); the order split's threshold comes from one streamed pass over
        that column alone (bounded too).

        Raises:
            ConfigError: naming the key (a missing column, no file) or the data file and
                line of a value that does not parse.
        """
        if sample_rows < 1:
            raise InvalidArgumentError(f"sample_rows must be >= 1, got {sample_rows}")
        p = self.parsed
        if p.preset == "movielens":
            return self._fit_movielens()
        train = self.train_files()
        for split, files in (("train", train), ("test", self.test_files())):
            for path in files:
                self._check_columns(path, split)
        columns = self._libsvm_slots(train, sample_rows) if p.auto_slots else p.columns
        # every numeric feature's moments: the standardize statistics, and the raw means a
        # server fills missing values with (log1p off in the sample: the mean before it)
        stats = Moments({n.name: None for n in columns.numeric})
        raw = tuple(
            n if n.name in p.standardize else replace(n, log1p=False) for n in columns.numeric
        )
        rows = 0
        distinct = DistinctIds(tuple(c.feature for c in columns.ids), sample_rows)
        try:
            for block in self._sample_blocks(train, replace(columns, numeric=raw), sample_rows):
                stats.add(block)
                distinct.add(block)
                rows += block.size
        except CorruptDataError as exc:
            if "label column" in str(exc) and "is empty" in str(exc):
                self._check_label_not_all_empty(train, sample_rows)
            raise self.keys.error("train", str(exc)) from None
        if rows == 0:
            raise self.keys.error("train", f"the training files hold no rows: {train}")
        numeric = tuple(
            replace(n, standardize=stats.result(n.name)) if n.name in p.standardize else n
            for n in columns.numeric
        )
        spec = replace(columns, numeric=numeric)
        label = spec.labels[0] if spec.labels else None
        threshold = None
        if p.split is not None and p.split.order_by is not None:
            threshold = self._order_threshold(train, p.split, sample_rows)
        logger.info("fitted the dataset on %d sampled rows of %d file(s)", rows, len(train))
        return FeaturePipeline(
            spec,
            na_values=p.dialect.na_values,
            positive=label.positive[0] if label is not None and label.positive else None,
            strip=p.dialect.strip,
            order_threshold=threshold,
            means={
                n.name: tuple(mean for mean, _ in result)
                for n in columns.numeric
                if (result := stats.result(n.name)) is not None
            },
            distinct_ids=distinct.result(),
        )

    def _fit_movielens(self) -> FeaturePipeline:
        try:
            batch = next(iter(self._movielens_reader("train", 64, train=True)))
        except (NotFoundError, CorruptDataError, InvalidArgumentError) as exc:
            raise self.keys.error("data_dir", str(exc)) from None
        if batch.batch_size < 1:
            raise self.keys.error("data_dir", "the training file holds no rows")
        return FeaturePipeline(self.parsed.columns)

    def _libsvm_slots(self, files: Sequence[Path], sample_rows: int) -> ColumnSpec:
        """The columns of a libSVM dataset without ``ids`` or ``slots``: one ID feature per
        field (``field_3``) when the sampled rows hold ``field:index:value`` tokens, else
        ``features`` (the plain libSVM reading)."""
        try:
            fields, _ = sample_fields(files, sample_rows)
        except CorruptDataError as exc:
            raise self.keys.error("train", str(exc)) from None
        if not fields:
            return self.parsed.columns
        kind = self.parsed.columns.ids[0].kind
        ids = tuple(IDColumn(field_column(f), name=f"field_{f}", kind=kind) for f in fields)
        logger.info("libsvm: one ID feature per field of the sampled rows: %s", fields)
        return replace(self.parsed.columns, ids=ids)

    def _check_columns(self, path: Path, split: str) -> None:
        """Every column the spec reads is in ``path`` (else a ConfigError at its key), and no
        derived column has a file column's name."""
        have = self._file_columns(path, split)
        if have is None:
            return
        for column, key in self.parsed.column_keys:
            if column not in have:
                raise self.keys.error(
                    key,
                    f"column {column!r} is not in {path}; it has {list(have)}",
                )
        for d in self.parsed.columns.derived:
            if d.name in have:
                message = f"{path} has a column {d.name!r} already: name the derived one apart"
                raise self.keys.error(f"derived.{d.name}", message)

    def dialect(self, split: str) -> CsvDialect:
        """The text layout of the ``"train"`` or ``"test"`` files (their own ``header``; a
        headerless split without ``names`` takes the column names of the other's header).

        Raises:
            ConfigError: the other split's files are missing or have no header line.
        """
        p = self.parsed
        d = p.dialect
        header = p.train_header if split == "train" else p.test_header
        if header or d.names is not None:
            return d if header == d.header else replace(d, header=header)
        other = self.test_files() if split == "train" else self.train_files()
        try:
            names = header_names(other[0], replace(d, header=True))
        except CorruptDataError as exc:
            raise self.keys.error("header", str(exc)) from None
        return replace(d, header=False, names=names)

    def _file_columns(self, path: Path, split: str) -> tuple[str, ...] | None:
        p, d = self.parsed, self.dialect(split)
        if p.format == "parquet":
            try:
                pq = __import__("pyarrow.parquet", fromlist=["ParquetFile"])
            except ImportError as exc:
                raise self.keys.error(
                    "format", "parquet needs pyarrow: pip install 'embeddb[parquet]'"
                ) from exc
            try:
                return tuple(pq.ParquetFile(path).schema_arrow.names)
            except Exception as exc:  # pyarrow raises its own types for a broken file
                raise self.keys.error("train", f"{path}: not a Parquet file: {exc}") from None
        if p.format == "libsvm":
            return None
        if not d.header:
            return d.names
        try:
            names = header_names(path, d)
        except CorruptDataError as exc:
            raise self.keys.error(split, str(exc)) from None
        if d.names is not None:
            if len(d.names) != len(names):
                raise self.keys.error(
                    "names", f"{len(d.names)} names for {len(names)} columns of {path}"
                )
            return d.names
        return names

    def _sample_blocks(
        self, files: Sequence[Path], spec: ColumnSpec, sample_rows: int
    ) -> Iterator[Block]:
        """The first ``sample_rows`` rows of ``files``, in order, as blocks."""
        left = sample_rows
        for path in files:
            for block in self._file_reader(path, spec, sample_rows, train=False)._blocks():
                if block.size >= left:
                    yield block.slice(0, left)
                    return
                left -= block.size
                yield block

    def _check_label_not_all_empty(self, files: Sequence[Path], sample_rows: int) -> None:
        label = self.parsed.columns.labels[0]
        probe = ColumnSpec(ids=(IDColumn(label.column, name="label_probe"),))
        seen = present = 0
        for block in self._sample_blocks(files, probe, sample_rows):
            ids = block.ids["label_probe"]
            seen += block.size
            present += block.size if ids.offsets is None else int(ids.offsets[-1])
        if seen and not present:
            raise self.keys.error(
                "label",
                f"column {label.column!r} is empty in all {seen} sampled rows of "
                f"{', '.join(str(f) for f in files)}",
            )

    def _order_threshold(
        self, files: Sequence[Path], split: SplitRule, sample_rows: int
    ) -> float | str:
        """The order split's threshold: one streamed pass over the order column of ``files``
        (a uniform sample of at most ``sample_rows`` values; ``stream.order_threshold``)."""
        assert split.order_by is not None and split.fraction is not None
        spec = ColumnSpec(ids=(IDColumn(split.order_by, name="order_by"),))
        source = self._parts_reader(stream.partition(files, 0, 1), spec, 4096, False, None)
        try:
            threshold = stream.order_threshold(
                source,
                split.order_by,
                split.fraction,
                max_sample=sample_rows,
            )
        except (ConfigError, CorruptDataError) as exc:
            message = str(exc).removeprefix(f"{getattr(exc, 'key', '')}: ")
            raise self.keys.error("split.order_by", message) from None
        return threshold

    # ------------------------------------------------------------------------------------
    # Reading
    # ------------------------------------------------------------------------------------

    def reader(
        self,
        pipeline: FeaturePipeline,
        split: str,
        batch_size: int,
        *,
        train: bool,
        rank: int = 0,
        world: int = 1,
        epoch: int = 0,
        seed: int = 0,
    ) -> Reader:
        """A streaming reader of the ``"train"`` or ``"test"`` split, memory bounded.

        Args:
            pipeline: the fitted pipeline (:meth:`fit`, or loaded from ``features.json``).
            split: ``"train"`` (this rank's part, shuffled) or ``"test"`` (whole, in order).
            batch_size: samples per batch.
            train: training batches (they need labels).
            rank, world: this reader's part of the training files (``0 <= rank < world``).
            epoch, seed: seed the shuffle with ``(shuffle seed or seed, epoch, rank)``.

        Raises:
            InvalidArgumentError: unknown split, bad rank or world.
            ConfigError: no file matches a pattern.
        """
        if split not in _SPLITS:
            raise InvalidArgumentError(f"split must be 'train' or 'test', got {split!r}")
        if not 0 <= rank < world:
            raise InvalidArgumentError(f"need 0 <= rank < world, got rank {rank}, world {world}")
        p = self.parsed
        source: Reader
        if p.preset == "movielens":
            source = self._movielens_reader(split, batch_size, train=train)
            if split == "train" and world > 1:
                source = Striped(source, rank, world)
        else:
            source = self._split_reader(pipeline, split, batch_size, train, rank, world)
        if split == "train" and p.shuffle_rows > 0:
            base_seed = seed if p.shuffle_seed is None else p.shuffle_seed
            rng = np.random.default_rng([base_seed, epoch, rank])
            source = Shuffled(source, p.shuffle_rows, rng)
        return source

    def _split_reader(
        self,
        pipeline: FeaturePipeline,
        split: str,
        batch_size: int,
        train: bool,
        rank: int,
        world: int,
    ) -> Reader:
        """The rows of ``split`` that this rank reads: byte ranges (whole ``.gz`` files,
        Parquet row groups) of the files, or every ``world``-th chunk of the whole input for
        a head-rows split; a rank with nothing to read gets an empty reader."""
        p = self.parsed
        test_rows = split == "test"
        row_filter: stream.RowFilter | None = None
        if p.split is None:
            files = self.test_files() if test_rows else self.train_files()
        else:
            files = self.train_files()
            if p.split.head_rows is not None:
                row_filter = stream.HeadRows(p.split.head_rows, test=test_rows)
            elif p.split.order_by is not None:
                if pipeline.order_threshold is None:
                    raise InvalidArgumentError(
                        "the pipeline has no order_by threshold: fit it with this dataset"
                    )
                row_filter = stream.OrderSplit(
                    p.split.order_by, pipeline.order_threshold, test=test_rows
                )
            else:
                assert p.split.fraction is not None  # parse_dataset: a split has one rule
                row_filter = stream.HashSplit(p.split.fraction, p.split.seed, test=test_rows)
        positional = row_filter is not None and row_filter.positional
        if test_rows or positional:
            parts = stream.partition(files, 0, 1)
            stripe = (rank, world) if not test_rows else (0, 1)
        elif world > 1 and not all(stream.partition(files, r, world) for r in range(world)):
            # Fewer .gz files / row groups than ranks: an idle rank would end every epoch at
            # once (steps stay aligned), so every rank parses all and keeps every world-th row.
            logger.info("%d ranks, fewer whole-file parts: every rank keeps its rows", world)
            parts, stripe = stream.partition(files, 0, 1), (0, 1)
            mine = stream.RowStripe(rank, world)
            row_filter = mine if row_filter is None else stream.AllOf((row_filter, mine))
        else:
            parts, stripe = stream.partition(files, rank, world), (0, 1)
        if not parts:  # no input at all
            logger.info("rank %d of %d has no part of the %s files", rank, world, split)
            return Empty(batch_size, requires_grad=train)
        of = "test" if test_rows and p.split is None else "train"  # whose files (dialect)
        reader = self._parts_reader(
            parts, pipeline.spec, batch_size, train, row_filter, stripe, files_of=of
        )
        if positional and not test_rows:
            assert p.split is not None and p.split.head_rows is not None
            return Head(reader, p.split.head_rows)
        return reader

    def _parts_reader(
        self,
        parts: Sequence[stream.Part],
        spec: ColumnSpec,
        batch_size: int,
        train: bool,
        row_filter: stream.RowFilter | None,
        stripe: tuple[int, int] = (0, 1),
        *,
        files_of: str = "train",
    ) -> PartsReader:
        """Byte ranges / whole files of several files (the ``files_of`` split's), filtered
        and striped."""
        p = self.parsed
        if p.format in ("csv", "tsv"):
            return CsvReader(
                None,
                spec,
                batch_size,
                self.dialect(files_of),
                parts=parts,
                row_filter=row_filter,
                stripe=stripe,
                requires_grad=train,
            )
        reader: type[ParquetReader | LibsvmReader] = (
            ParquetReader if p.format == "parquet" else LibsvmReader
        )
        return reader(
            None,
            spec,
            batch_size,
            parts=parts,
            row_filter=row_filter,
            stripe=stripe,
            requires_grad=train,
        )

    def _file_reader(self, path: Path, spec: ColumnSpec, batch_size: int, train: bool) -> Reader:
        """One whole training file, in order (fit)."""
        p = self.parsed
        if p.format in ("csv", "tsv"):
            return CsvReader(path, spec, batch_size, self.dialect("train"), requires_grad=train)
        if p.format == "parquet":
            return ParquetReader(path, spec, batch_size, requires_grad=train)
        return LibsvmReader(path, spec, batch_size, requires_grad=train)

    def _movielens_reader(self, split: str, batch_size: int, *, train: bool) -> Reader:
        p = self.parsed
        assert p.data_dir is not None and p.movielens_split is not None
        name = f"{p.movielens_split}.{'base' if split == 'train' else 'test'}"
        return MovieLensReader(p.data_dir, batch_size, name, requires_grad=train)
