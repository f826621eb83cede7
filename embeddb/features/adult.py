"""Reader of UCI Adult (census income): the copy shipped in :mod:`embeddb.datasets.adult` or
another directory holding ``adult.data``/``adult.test`` (gzip or plain).

Batches have one ID feature per categorical column (``workclass``, ``education``,
``marital_status``, ``occupation``, ``relationship``, ``race``, ``gender``, ``native_country``;
one id per sample, the hash of the string in the feature's namespace; the ``?`` of a missing
value is a category of its own), one non-ID feature ``dense`` of shape ``(n, 6)`` float32 (age,
fnlwgt, education_num, capital_gain, capital_loss, hours_per_week, each ``log(1 + x)``) and a
label ``income`` of shape ``(n, 1)``: 1 for ``>50K`` (``>50K.`` in the test split).
"""

from __future__ import annotations

from pathlib import Path

from embeddb.datasets.adult import ADULT_DIR, COLUMNS, NUMERIC
from embeddb.errors import InvalidArgumentError
from embeddb.features.delimited import CsvReader
from embeddb.features.spec import ColumnSpec, CsvDialect, IDColumn, LabelColumn, NumericColumn

__all__ = ["ADULT_CATEGORICAL", "ADULT_NUMERIC", "ADULT_SPEC", "AdultReader"]

ADULT_NUMERIC: tuple[str, ...] = NUMERIC
ADULT_CATEGORICAL: tuple[str, ...] = tuple(c for c in COLUMNS if c not in NUMERIC and c != "income")
ADULT_SPEC = ColumnSpec(
    ids=tuple(IDColumn(c) for c in ADULT_CATEGORICAL),
    numeric=(NumericColumn(ADULT_NUMERIC, name="dense", log1p=True),),
    labels=(LabelColumn("income", positive=(">50K", ">50K.")),),
)
_FILES = {"train": "adult.data", "test": "adult.test"}


class AdultReader(CsvReader):
    """Batches of one Adult split.

    Args:
        batch_size: samples per batch (the last batch may be shorter).
        split: ``"train"`` (adult.data, 32,561 rows) or ``"test"`` (adult.test, 16,281 rows).
        directory: where the files are (default: the shipped copy); ``NAME`` or ``NAME.gz``.
        requires_grad: training batches.
        drop_last: drop a short last batch.

    Raises:
        InvalidArgumentError: unknown split or bad ``batch_size``.
        NotFoundError: the directory lacks the split's file.
    """

    def __init__(
        self,
        batch_size: int,
        split: str = "train",
        directory: str | Path | None = None,
        *,
        requires_grad: bool = True,
        drop_last: bool = False,
    ) -> None:
        if split not in _FILES:
            raise InvalidArgumentError(f"split must be 'train' or 'test', got {split!r}")
        folder = Path(directory) if directory is not None else ADULT_DIR
        name = _FILES[split]
        path = folder / name if (folder / name).is_file() else folder / f"{name}.gz"
        dialect = CsvDialect(delimiter=",", header=False, names=COLUMNS, comment="|", strip=True)
        super().__init__(
            path, ADULT_SPEC, batch_size, dialect, requires_grad=requires_grad, drop_last=drop_last
        )
        self.split = split
