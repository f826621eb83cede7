"""Reader of the Criteo display-advertising logs (Kaggle ``train.txt``/``test.txt``, TSV).

A line is ``label \\t I1..I13 \\t C1..C26`` (the Kaggle test set has no label)::

    0 \\t 1 \\t 1 \\t 5 \\t 0 \\t 1382 \\t ... \\t 68fd1e64 \\t 80e26c9b \\t ... \\t  \\t ...
    label  I1..I13: integer counts (empty or negative too)   C1..C26: 32-bit hex hashes

Batches have 26 ID features ``C1``..``C26`` (the hex value as the id), one non-ID feature
``dense`` of shape ``(n, 13)`` float32 (empty -> 0, then ``log(1 + max(x, 0))`` unless
``log1p=False``) and a label ``label`` of shape ``(n, 1)``.

Missing categorical values: an empty ``C`` field gives that sample no id for that feature (an
empty sample; sum pooling makes its embedding zero), rather than a reserved "missing" id. An
empty field then costs no lookup and no row, and "missing" cannot collide with a real hash; a
model that wants to learn a "missing" embedding sets ``missing_id`` (any id the data never uses,
e.g. ``2**32``, above every 32-bit hash).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from embeddb.errors import ConfigError
from embeddb.features.delimited import CsvReader
from embeddb.features.spec import (
    ColumnSpec,
    CsvDialect,
    IDColumn,
    IdKind,
    LabelColumn,
    NumericColumn,
)

__all__ = [
    "CATEGORICAL_COLUMNS",
    "DENSE_FEATURE",
    "INTEGER_COLUMNS",
    "LABEL",
    "CriteoConfig",
    "CriteoReader",
    "criteo_spec",
]

LABEL = "label"
DENSE_FEATURE = "dense"
INTEGER_COLUMNS = tuple(f"I{i}" for i in range(1, 14))
CATEGORICAL_COLUMNS = tuple(f"C{i}" for i in range(1, 27))


@dataclass(frozen=True)
class CriteoConfig:
    """How to read a Criteo file.

    Attributes:
        labelled: the file starts each line with a label (``train.txt``); false for the
            Kaggle ``test.txt`` layout (39 fields).
        log1p: transform the integer columns with ``log(1 + max(x, 0))`` (DLRM's transform).
        missing_id: the id of an empty categorical field (default: none, an empty sample).
        chunk_bytes: bytes of text parsed at a time.
    """

    labelled: bool = True
    log1p: bool = True
    missing_id: int | None = None
    chunk_bytes: int = 1 << 20

    def __post_init__(self) -> None:
        for key in ("labelled", "log1p"):
            if not isinstance(getattr(self, key), bool):
                raise ConfigError(key, f"must be true or false, got {getattr(self, key)!r}")


def criteo_spec(config: CriteoConfig | None = None) -> ColumnSpec:
    """The column spec of a Criteo file (see the module docstring)."""
    config = config or CriteoConfig()
    return ColumnSpec(
        ids=tuple(
            IDColumn(c, kind=IdKind.HEX, missing_id=config.missing_id) for c in CATEGORICAL_COLUMNS
        ),
        numeric=(NumericColumn(INTEGER_COLUMNS, name=DENSE_FEATURE, log1p=config.log1p),),
        labels=(LabelColumn(LABEL),) if config.labelled else (),
    )


class CriteoReader(CsvReader):
    """Batches of a Criteo TSV file (gzip or plain), streamed and parsed a chunk at a time.

    Args:
        path: the file.
        batch_size: samples per batch (the last batch may be shorter).
        config: layout and transforms (:class:`CriteoConfig`).
        requires_grad: training batches; pass False for an unlabelled file.
        drop_last: drop a short last batch.

    Raises:
        NotFoundError: no such file.
        InvalidArgumentError: bad ``batch_size``; ``requires_grad`` on an unlabelled file.
    """

    def __init__(
        self,
        path: str | Path,
        batch_size: int,
        config: CriteoConfig | None = None,
        *,
        requires_grad: bool = True,
        drop_last: bool = False,
    ) -> None:
        config = config or CriteoConfig()
        names = ((LABEL,) if config.labelled else ()) + INTEGER_COLUMNS + CATEGORICAL_COLUMNS
        dialect = CsvDialect(
            delimiter="\t", header=False, names=names, chunk_bytes=config.chunk_bytes
        )
        super().__init__(
            path,
            criteo_spec(config),
            batch_size,
            dialect,
            requires_grad=requires_grad,
            drop_last=drop_last,
        )
        self.config = config
