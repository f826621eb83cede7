"""The feature pipeline: how raw columns become a batch, fitted once and saved with a model.

A :class:`FeaturePipeline` is the fitted form of a dataset's columns (a
:class:`~embeddb.features.ColumnSpec` with the standardize statistics inside, the
missing-value markers, the positive class). Training writes it to ``RUN/features.json``;
``export_model`` copies it into the model directory, so serving builds the batch of a raw
record with the same code, hashing and transforms as training (no training/serving skew)::

    pipeline = DatasetSpec.from_yaml_node(...).fit()            # at validation time
    save_pipeline(pipeline, run_dir / PIPELINE_FILE)
    ...
    batch = load_pipeline(model_dir / PIPELINE_FILE).batch_from_records(
        [{"user": "u17", "tags": ["a", "b"], "price": 12.5}]
    )

The JSON document (``to_json``) lists every setting explicitly::

    {"format": "embeddb.features", "version": 1,
     "ids": [{"column": "user", "name": null, "kind": "string", "separator": null,
              "namespace": null, "missing_id": null}, ...],     (null: the default)
     "numeric": [{"columns": ["price"], "name": "price", "log1p": false, "fill": 0.0,
                  "standardize": [[12.1, 3.4]], "mean": [12.1]}, ...],
     "labels": [{"column": "clicked", "name": null, "positive": [], "threshold": null}],
     "derived": [{"name": "hour", "from": "click_time", "extract": "hour",
                  "unit": "seconds", "utc_offset": 0.0}],          (optional; [] if absent)
     "na_values": ["", "NA"], "strip": false, "positive": null, "order_threshold": null}
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import numpy as np

from embeddb.errors import ConfigError, CorruptDataError, InvalidArgumentError, NotFoundError
from embeddb.features._reader import build_block
from embeddb.features.batch import Batch
from embeddb.features.records import RecordsChunk, RecordStats, check_finite, check_keys
from embeddb.features.spec import (
    ColumnSpec,
    IDColumn,
    IdKind,
    LabelColumn,
    NumericColumn,
    check_na_values,
    derived_from_json,
    derived_to_json,
)

__all__ = ["PIPELINE_FILE", "FeaturePipeline", "load_pipeline", "save_pipeline"]

PIPELINE_FILE = "features.json"
_FORMAT = "embeddb.features"
_VERSION = 1


@dataclass(frozen=True)
class FeaturePipeline:
    """Columns -> batch, fitted (see the module docstring).

    Attributes:
        spec: ID features, numeric features (fitted statistics inside) and labels, in batch
            order.
        na_values: text values that mean missing.
        positive: the human name of the positive class (for model.json), if any.
        strip: fields are stripped of spaces and tabs (the training file's dialect).
        order_threshold: the order-by split's threshold that ``fit`` measured (the first
            test value of the order column), else None.
        means: numeric feature name -> the training mean of each of its columns, raw
            (before ``log1p`` or ``standardize``; missing values counted as their ``fill``,
            as training saw them), measured by ``fit``. Serving fills a missing value with
            it (:meth:`batch_from_records`). Pipelines saved before it was recorded have
            none: see :meth:`missing_fills` for what they fill.
        distinct_ids: ID feature name -> distinct ids it has, as ``fit`` measured them on its
            sample, for the features whose count is the whole data's (the sample read every
            row, or met no new id in its second half); sizes the ``embedding_config: auto``
            tables. Not saved (``to_json``): a loaded pipeline has none.
    """

    spec: ColumnSpec
    na_values: tuple[str, ...] = ()
    positive: str | None = None
    strip: bool = False
    order_threshold: float | str | None = None
    means: Mapping[str, tuple[float, ...]] = field(default_factory=dict, hash=False)
    distinct_ids: Mapping[str, int] = field(default_factory=dict, hash=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "na_values", check_na_values(self.na_values))
        widths = {n.name: len(n.columns) for n in self.spec.numeric}
        for name, mean in self.means.items():
            if widths.get(name) != len(mean) or not all(math.isfinite(m) for m in mean):
                raise ConfigError(
                    f"means.{name}",
                    f"must be one finite number per column of a numeric feature, got {mean!r}",
                )

    @property
    def id_features(self) -> tuple[str, ...]:
        """The ID features' names, in batch order (the order of ``forward``'s embeddings)."""
        return tuple(c.feature for c in self.spec.ids)

    @property
    def non_id(self) -> tuple[tuple[str, int], ...]:
        """``(name, width)`` of each non-ID feature, in batch order."""
        return tuple((n.name, len(n.columns)) for n in self.spec.numeric)

    def to_json(self) -> dict[str, Any]:
        """Every setting as a JSON-ready document (see the module docstring)."""
        return {
            "format": _FORMAT,
            "version": _VERSION,
            "ids": [
                {
                    "column": c.column,
                    "name": c.name,
                    "kind": c.kind.value,
                    "separator": c.separator,
                    "namespace": c.namespace,
                    "missing_id": c.missing_id,
                }
                for c in self.spec.ids
            ],
            "numeric": [
                {
                    "columns": list(n.columns),
                    "name": n.name,
                    "log1p": n.log1p,
                    "fill": n.fill,
                    "standardize": None
                    if n.standardize is None
                    else [list(p) for p in n.standardize],
                    "mean": list(self.means[n.name]) if n.name in self.means else None,
                }
                for n in self.spec.numeric
            ],
            "labels": [
                {
                    "column": lb.column,
                    "name": lb.name,
                    "positive": list(lb.positive),
                    "threshold": lb.threshold,
                }
                for lb in self.spec.labels
            ],
            "derived": [derived_to_json(d) for d in self.spec.derived],
            "na_values": list(self.na_values),
            "strip": self.strip,
            "positive": self.positive,
            "order_threshold": self.order_threshold,
        }

    @classmethod
    def from_json(cls, doc: object, source: str = PIPELINE_FILE) -> FeaturePipeline:
        """The pipeline of a :meth:`to_json` document.

        Raises:
            CorruptDataError: naming ``source``: anything missing, malformed or of another
                format or version.
        """
        try:
            return _from_json(doc)
        except (ConfigError, KeyError, TypeError, ValueError) as exc:
            detail = f"missing key {exc}" if isinstance(exc, KeyError) else str(exc)
            raise CorruptDataError(f"{source}: not a valid feature pipeline: {detail}") from None

    def batch_from_records(
        self,
        records: Sequence[Mapping[str, object]],
        *,
        requires_grad: bool = False,
        missing: Literal["mean", "fill"] = "mean",
        lenient: bool = False,
        stats: RecordStats | None = None,
    ) -> Batch:
        """The batch of raw records, built by the code that builds training batches.

        Args:
            records: one mapping per sample: column -> value (str, int, float, bool, None or,
                for ID columns, a list); a missing key, None or a missing-value marker is a
                missing value (see :mod:`embeddb.features.records`).
            requires_grad: a training batch: every record needs its labels. Otherwise the
                labels are included only when every record has them.
            missing: what a missing numeric value becomes: ``"mean"`` (serving) the
                training mean of its column (:meth:`missing_fills`), transformed like any
                value (0 after ``standardize``); ``"fill"`` the column's ``fill``, as
                training did with an empty field of the file (bit-identical to the text
                reader's batch of the same values).
            lenient: ignore keys no column reads (counted in ``stats``) instead of refusing
                them.
            stats: where to count the values filled and the unknown keys.

        Raises:
            InvalidArgumentError: no records, a record that is not a mapping, a key no column
                reads (unless ``lenient``), a value of the wrong type, that does not parse, a
                number that is not finite (or gives a non-finite input after the transforms),
                a string that is not Unicode, a missing label with ``requires_grad``; naming
                the record index and the column.
        """
        if not isinstance(records, Sequence) or isinstance(records, (str, bytes)):
            raise InvalidArgumentError("records must be a list of objects")
        if not records:
            raise InvalidArgumentError("records must hold at least one record")
        if missing not in ("mean", "fill"):
            raise InvalidArgumentError(f"missing must be 'mean' or 'fill', got {missing!r}")
        spec = self.spec
        check_keys(records, spec.columns(), lenient=lenient, stats=stats)
        if spec.labels and not requires_grad and not self._have_labels(records):
            spec = replace(spec, labels=())
        fills = self.missing_fills() if missing == "mean" else None
        try:
            with np.errstate(over="ignore", invalid="ignore"):  # refused below, with a reason
                chunk = RecordsChunk(
                    records,
                    spec,
                    na_values=self.na_values,
                    strip=self.strip,
                    fills=fills,
                    stats=stats,
                )
                block = build_block(chunk, spec, strip=self.strip, na_values=self.na_values)
        except CorruptDataError as exc:
            raise InvalidArgumentError(str(exc)) from None
        check_finite(block.dense, spec, records)
        return block.to_batch(requires_grad)

    def missing_fills(self) -> dict[str, float]:
        """Column -> the raw value a missing numeric value becomes when serving: the training
        mean (:attr:`means`); for a pipeline without recorded means (saved before they were)
        the ``standardize`` mean where the feature has one (the same number), else the
        column's ``fill`` (what training gave an empty field). Columns that are also a label
        or the source of a derived column keep the ``fill``."""
        spec = self.spec
        shared = {lb.column for lb in spec.labels} | {d.source for d in spec.derived}
        shared |= {d.name for d in spec.derived}
        fills: dict[str, float] = {}
        for numeric in spec.numeric:
            means = self.means.get(numeric.name)
            if means is None and numeric.standardize is not None:
                means = tuple(mean for mean, _ in numeric.standardize)
            for k, column in enumerate(numeric.columns):
                if column not in shared:
                    fills.setdefault(column, numeric.fill if means is None else means[k])
        return fills

    def _have_labels(self, records: Sequence[Mapping[str, object]]) -> bool:
        na = set(self.na_values) | {""}
        for record in records:
            if not isinstance(record, Mapping):
                return False  # reported by RecordsChunk
            for label in self.spec.labels:
                value = record.get(label.column)
                if value is None or (isinstance(value, str) and value in na):
                    return False
        return True


def save_pipeline(pipeline: FeaturePipeline, path: Path) -> None:
    """Write ``pipeline`` as JSON to ``path`` atomically (a temporary file, then a rename)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    text = json.dumps(pipeline.to_json(), indent=1, allow_nan=True) + "\n"
    try:
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def load_pipeline(path: Path) -> FeaturePipeline:
    """The pipeline saved at ``path``.

    Raises:
        NotFoundError: no such file.
        CorruptDataError: not JSON, or not a valid pipeline document.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise NotFoundError(f"feature pipeline {str(path)!r} does not exist") from None
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise CorruptDataError(f"{path}: not JSON: {exc}") from None
    return FeaturePipeline.from_json(doc, source=str(path))


# --------------------------------------------------------------------------------------------


def _from_json(doc: object) -> FeaturePipeline:
    d = _mapping(doc, "document")
    if d["format"] != _FORMAT or d["version"] != _VERSION:
        raise ValueError(f"format {d['format']!r} version {d['version']!r}")
    ids = tuple(
        IDColumn(
            _str(e["column"]),
            name=_opt_str(e["name"]),
            kind=IdKind(e["kind"]),
            separator=_opt_str(e["separator"]),
            namespace=_opt_str(e["namespace"]),
            missing_id=_opt_int(e["missing_id"]),
        )
        for e in map(_entry, _list(d["ids"]))
    )
    numeric = tuple(
        NumericColumn(
            tuple(_str(c) for c in _list(e["columns"])),
            name=_str(e["name"]),
            log1p=_bool(e["log1p"]),
            fill=_number(e["fill"]),
            standardize=None
            if e["standardize"] is None
            else tuple(_pair(p) for p in _list(e["standardize"])),
        )
        for e in map(_entry, _list(d["numeric"]))
    )
    means = {  # absent in pipelines saved before the training means were recorded
        _str(e["name"]): tuple(_number(v) for v in _list(e["mean"]))
        for e in map(_entry, _list(d["numeric"]))
        if e.get("mean") is not None
    }
    labels = tuple(
        LabelColumn(
            _str(e["column"]),
            name=_opt_str(e["name"]),
            positive=tuple(_str(p) for p in _list(e["positive"])),
            threshold=None if e["threshold"] is None else _number(e["threshold"]),
        )
        for e in map(_entry, _list(d["labels"]))
    )
    order = d.get("order_threshold")
    if order is not None and not isinstance(order, str):
        order = _number(order)
    derived = tuple(derived_from_json(e) for e in _list(d.get("derived", [])))
    return FeaturePipeline(
        ColumnSpec(ids, numeric, labels, derived),
        na_values=tuple(_str(v) for v in _list(d["na_values"])),
        positive=_opt_str(d["positive"]),
        strip=_bool(d["strip"]),
        order_threshold=order,
        means=means,
    )


def _mapping(value: object, what: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise TypeError(f"{what} must be an object, got {type(value).__name__}")
    return value


def _entry(value: object) -> Mapping[str, Any]:
    return _mapping(value, "an entry")


def _list(value: object) -> list[Any]:
    if not isinstance(value, list):
        raise TypeError(f"expected a list, got {value!r}")
    return value


def _str(value: object) -> str:
    if not isinstance(value, str):
        raise TypeError(f"expected a string, got {value!r}")
    return value


def _opt_str(value: object) -> str | None:
    return None if value is None else _str(value)


def _opt_int(value: object) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"expected an integer, got {value!r}")
    return value


def _bool(value: object) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"expected true or false, got {value!r}")
    return value


def _number(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"expected a number, got {value!r}")
    return float(value)


def _pair(value: object) -> tuple[float, float]:
    pair = _list(value)
    if len(pair) != 2 or not all(math.isfinite(_number(v)) for v in pair):
        raise ValueError(f"expected [mean, std], got {value!r}")
    return _number(pair[0]), _number(pair[1])
