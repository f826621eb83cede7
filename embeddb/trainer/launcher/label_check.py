"""The validation step's look at the label: a sample of the training split must hold both classes.

A label that is one class throughout trains to nothing (the loss falls to zero, the AUC is
undefined): most often a ``positive:`` value that matches no value of the column (``yes``
where the file says ``Y``), a ``threshold`` above every value, or a 0/1 column that is all 0.
:func:`check_label_classes` reads the first :data:`LABEL_SAMPLE_ROWS` rows of the training
split as the job would train on them and refuses one class, naming the values the column holds
(read as text from the first training file: CSV/TSV and Parquet)::

    label column 'y': every sampled row is negative (1,000 rows of the training split);
    positive: ['yes'] matched none; values seen in data/train.csv: 'Y' (812), 'N' (188)

A rare positive class is not refused: one positive in the sample is enough.
"""

from __future__ import annotations

import csv
import gzip
import io
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from embeddb.errors import ConfigError
from embeddb.features.pipeline import FeaturePipeline
from embeddb.features.spec import LabelColumn
from embeddb.trainer.launcher.job import JobConfig

__all__ = ["LABEL_SAMPLE_ROWS", "check_label_classes"]

LABEL_SAMPLE_ROWS = 100_000
_SHOWN = 6  # distinct values named in the message
_GZIP_MAGIC = b"\x1f\x8b"


def check_label_classes(
    job: JobConfig, pipeline: FeaturePipeline, rows: int = LABEL_SAMPLE_ROWS
) -> None:
    """Refuse a training split whose first ``rows`` rows hold one label class.

    Raises:
        ConfigError: naming ``dataset.label``, the class, the label's rule and the values seen.
    """
    if not pipeline.spec.labels:
        return
    label = pipeline.spec.labels[0]
    seen = positives = 0
    for batch in job.dataset_spec.reader(pipeline, "train", 8192, train=False):
        if not batch.labels:
            return
        classes = np.asarray(batch.labels[0].data).ravel()
        seen += classes.size
        positives += int(np.count_nonzero(classes > 0.5))
        if 0 < positives < seen or seen >= rows:
            break
    if seen == 0 or 0 < positives < seen:
        return
    side = "negative" if positives == 0 else "positive"
    parts = [
        f"label column {label.column!r}: every sampled row is {side} "
        f"({seen:,} rows of the training split)",
        _rule(label, matched=positives > 0),
    ]
    values = _values_seen(job, label.column, seen)
    if values:
        parts.append(values)
    raise ConfigError("dataset.label", "; ".join(parts))


def _rule(label: LabelColumn, *, matched: bool) -> str:
    """What made every row one class."""
    if label.positive:
        return f"positive: {list(label.positive)} matched {'every value' if matched else 'none'}"
    if label.threshold is not None:
        where = "at or above" if matched else "below"
        return f"every value is {where} threshold: {label.threshold:g}"
    return (
        "without positive: or threshold:, 1 (or +1) is positive and 0 or -1 negative; name the "
        "positive values with positive: [...] or set a threshold"
    )


def _values_seen(job: JobConfig, column: str, rows: int) -> str | None:
    """``values seen in FILE: 'Y' (812), 'N' (188)`` over the first ``rows`` rows of the first
    training file (CSV/TSV and Parquet; None for other formats or an unreadable file)."""
    spec = job.dataset_spec
    try:
        files = spec.train_files()
    except ConfigError:
        return None
    if not files or spec.preset is not None:
        return None
    path = files[0]
    try:
        if spec.format in ("csv", "tsv"):
            counts = Counter(_delimited_values(job, path, column, rows))
        elif spec.format == "parquet":
            counts = Counter(_parquet_values(path, column, rows))
        else:
            return None
    except (OSError, ValueError, ImportError, csv.Error):
        return None
    if not counts:
        return None
    shown = ", ".join(f"{value!r} ({n:,})" for value, n in counts.most_common(_SHOWN))
    more = len(counts) - _SHOWN
    if more > 0:
        shown += f" and {more:,} more"
    return f"values seen in {path.name}: {shown}"


def _delimited_values(job: JobConfig, path: Path, column: str, rows: int) -> Iterator[str]:
    """The text of ``column`` in the first ``rows`` data rows of a CSV/TSV file (the job's
    dialect: delimiter, quote, header or names, comment lines, strip)."""
    dialect = job.dataset_spec.parsed.dialect
    quote = getattr(dialect, "quote", '"')
    with open(path, "rb") as probe:
        gzipped = probe.read(2) == _GZIP_MAGIC
    raw = gzip.open(path, "rb") if gzipped else open(path, "rb")  # noqa: SIM115
    with raw, io.TextIOWrapper(raw, encoding="utf-8", errors="replace", newline="") as text:
        lines = (
            line
            for line in text
            if line.strip() and not (dialect.comment and line.startswith(dialect.comment))
        )
        reader = csv.reader(
            lines,
            delimiter=dialect.delimiter,
            quotechar=quote or '"',
            quoting=csv.QUOTE_MINIMAL if quote else csv.QUOTE_NONE,
        )
        names = list(dialect.names) if dialect.names is not None else None
        if dialect.header:
            header = next(reader, None)
            if header is None:
                return
            if names is None:
                names = [h.strip() for h in header] if dialect.strip else header
        if names is None or column not in names:
            return
        index = names.index(column)
        for n, row in enumerate(reader):
            if n >= rows:
                return
            if index < len(row):
                yield row[index].strip() if dialect.strip else row[index]


def _parquet_values(path: Path, column: str, rows: int) -> Iterator[str]:
    """The values of ``column`` in the first ``rows`` rows of a Parquet file, as text."""
    import pyarrow.parquet as pq

    left = rows
    for batch in pq.ParquetFile(path).iter_batches(batch_size=min(rows, 65536), columns=[column]):
        for value in batch.column(0).to_pylist()[:left]:
            yield "" if value is None else str(value)
        left -= batch.num_rows
        if left <= 0:
            return
