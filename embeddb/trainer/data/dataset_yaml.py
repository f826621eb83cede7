"""Parsing the ``dataset:`` node of a job file into the parts of a
:class:`~embeddb.trainer.data.dataset.DatasetSpec` (every key checked, once).

Each mistake is a :class:`~embeddb.errors.ConfigError` whose key is the key's path
(``dataset.numeric[1].transform``) and whose message ends with where that key is in the
file (``(job.yaml:14)``, from the ``where`` callable the launcher passes).

The presets are the same mechanism: a preset is a ``dataset:`` mapping written here
(:func:`preset_node`), overlaid with the keys the user gives next to ``preset:``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from embeddb.datasets.adult import ADULT_DIR
from embeddb.datasets.adult import COLUMNS as ADULT_COLUMNS
from embeddb.datasets.adult import NUMERIC as ADULT_NUMERIC
from embeddb.errors import ConfigError

from .libsvm import FEATURES, LABEL, libsvm_spec
from .spec import ColumnSpec, CsvDialect, IDColumn, IdKind, LabelColumn, NumericColumn

__all__ = [
    "DEFAULT_SHUFFLE_ROWS",
    "FORMATS",
    "PRESETS",
    "Keys",
    "ParsedDataset",
    "SplitRule",
    "parse_dataset",
    "preset_node",
]

FORMATS = ("csv", "tsv", "parquet", "libsvm")
PRESETS = ("adult", "criteo", "movielens")
TRANSFORMS = ("none", "log1p", "standardize")
DEFAULT_SHUFFLE_ROWS = 65536
CRITEO_FILES = ("train.txt", "sample.train.txt", "sample.train")
MOVIELENS_SPLITS = ("u1", "u2", "u3", "u4", "u5", "ua", "ub")
# The batch MovieLensReader makes, as columns of an already joined record (for serving):
# the derived values (genre indexes "0|7", age bucket, zip prefix, scaled dense) are given.
MOVIELENS_COLUMNS = ColumnSpec(
    ids=(
        IDColumn("user_id", kind=IdKind.INT),
        IDColumn("item_id", kind=IdKind.INT),
        IDColumn("genres", kind=IdKind.INT, separator="|"),
        IDColumn("occupation"),
        IDColumn("gender"),
        IDColumn("age_bucket", kind=IdKind.INT),
        IDColumn("zip_prefix"),
    ),
    numeric=(NumericColumn(("age", "movie_age", "hour", "weekday"), name="dense"),),
    labels=(LabelColumn("label"),),
)
_TEXT_KEYS = ("names", "header", "delimiter", "comment", "strip", "chunk_bytes")
_KEYS = (
    "preset",
    "format",
    "train",
    "test",
    "split",
    "label",
    "ids",
    "numeric",
    "na_values",
    "shuffle",
    "data_dir",
    "train_rows",
    *_TEXT_KEYS,
)


@dataclass(frozen=True)
class Keys:
    """Key paths for error messages and where they are in the job file."""

    where: Callable[[str], str] = field(default=lambda key: "", compare=False)
    legacy: bool = False  # a preset given by the old top-level keys (dataset, data_dir, ...)

    def path(self, key: str) -> str:
        """The key path of ``dataset.KEY...`` (legacy presets: the old top-level keys)."""
        full = f"dataset.{key}" if key else "dataset"
        if self.legacy:
            head = key.split(".", 1)[0].split("[", 1)[0]
            if head in ("data_dir", "train_rows", "split"):
                return key
            if head in ("preset", ""):
                return "dataset"
        return full

    def error(self, key: str, message: str) -> ConfigError:
        """A ConfigError at ``dataset.KEY`` whose message ends with the key's file:line."""
        path = self.path(key)
        at = self.where(path)
        return ConfigError(path, f"{message} ({at})" if at else message)


@dataclass(frozen=True)
class SplitRule:
    """How one set of files splits into train and test rows.

    Attributes:
        fraction: the test share, in (0, 1) (hash or order split).
        order_by: the column whose last ``fraction`` of values (in order) are test rows.
        seed: the hash split's seed.
        head_rows: a positional split: the first ``head_rows`` rows train, the rest test.
    """

    fraction: float | None = None
    order_by: str | None = None
    seed: int = 0
    head_rows: int | None = None


@dataclass(frozen=True)
class ParsedDataset:
    """Everything the ``dataset:`` node says (paths absolute, columns unfitted)."""

    format: str
    train: tuple[str, ...]
    test: tuple[str, ...]
    split: SplitRule | None
    columns: ColumnSpec
    standardize: tuple[str, ...]
    dialect: CsvDialect
    shuffle_rows: int
    shuffle_seed: int | None
    preset: str | None
    data_dir: Path | None
    movielens_split: str | None
    column_keys: tuple[tuple[str, str], ...]


def preset_node(name: str, data_dir: Path | None, keys: Keys) -> dict[str, Any]:
    """The ``dataset:`` mapping of a preset (``data_dir`` already absolute)."""
    if name == "adult":
        folder = data_dir or ADULT_DIR
        categorical = [c for c in ADULT_COLUMNS if c not in ADULT_NUMERIC and c != "income"]
        return {
            "format": "csv",
            "header": False,
            "names": list(ADULT_COLUMNS),
            "comment": "|",
            "strip": True,
            "train": str(folder / "adult.data"),
            "test": str(folder / "adult.test"),
            "ids": categorical,
            "numeric": [{"columns": list(ADULT_NUMERIC), "name": "dense", "transform": "log1p"}],
            "label": {"column": "income", "positive": [">50K", ">50K."]},
        }
    if data_dir is None:
        raise keys.error("data_dir", f"is required for {name} (no copy ships with embeddb)")
    if name == "criteo":
        train = next(
            (
                data_dir / n
                for n in CRITEO_FILES
                if (data_dir / n).is_file() or (data_dir / f"{n}.gz").is_file()
            ),
            data_dir / CRITEO_FILES[0],
        )
        return {
            "format": "tsv",
            "header": False,
            "names": ["label", *(f"I{i}" for i in range(1, 14)), *(f"C{i}" for i in range(1, 27))],
            "train": str(train),
            "ids": [{"column": f"C{i}", "kind": "hex"} for i in range(1, 27)],
            "numeric": [
                {"columns": [f"I{i}" for i in range(1, 14)], "name": "dense", "transform": "log1p"}
            ],
            "label": {"column": "label"},
        }
    return {"format": "movielens"}


def parse_dataset(raw: object, *, base_dir: Path, keys: Keys) -> ParsedDataset:
    """Check every key of a ``dataset:`` node (a mapping or a preset name).

    Raises:
        ConfigError: naming the key path and its file:line.
    """
    if isinstance(raw, str):
        raw = {"preset": raw}
    if not isinstance(raw, Mapping):
        raise keys.error("", f"must be a preset ({', '.join(PRESETS)}) or a mapping, got {raw!r}")
    unknown = [k for k in raw if k not in _KEYS]
    if unknown:
        raise keys.error(str(unknown[0]), f"is not a dataset setting ({', '.join(sorted(_KEYS))})")
    node = dict(raw)
    preset = node.pop("preset", None)
    data_dir = None
    if node.get("data_dir") is not None:
        data_dir = (base_dir / _string(node["data_dir"], "data_dir", keys)).resolve()
    movielens_split = None
    train_rows = node.pop("train_rows", None)
    if preset is not None:
        if preset not in PRESETS:
            raise keys.error("preset", f"must be one of {', '.join(PRESETS)}, got {preset!r}")
        base = preset_node(preset, data_dir, keys)
        if preset == "movielens":
            split = node.get("split")
            if split is not None and split not in MOVIELENS_SPLITS:
                raise keys.error(
                    "split", f"must be one of {', '.join(MOVIELENS_SPLITS)}, got {split!r}"
                )
            movielens_split = split or "u1"
            return _movielens(data_dir, movielens_split, node, keys)
        if preset == "criteo":
            if train_rows is None:
                raise keys.error("train_rows", "is required for criteo (the rest is the test)")
            base["split"] = {"head_rows": _int(train_rows, "train_rows", keys, minimum=1)}
        node = {**base, **{k: v for k, v in node.items() if k != "data_dir"}}
    elif train_rows is not None:
        raise keys.error("train_rows", "applies to the criteo preset only (use split: head_rows)")
    node.pop("data_dir", None)
    return _generic(node, preset, data_dir, base_dir, keys)


def _movielens(
    data_dir: Path | None, split: str, node: dict[str, Any], keys: Keys
) -> ParsedDataset:
    extra = sorted(set(node) - {"split", "data_dir", "shuffle"})
    if extra:
        raise keys.error(extra[0], "cannot be set for the movielens preset")
    rows, seed = _shuffle(node.get("shuffle", True), keys)
    return ParsedDataset(
        format="movielens",
        train=(),
        test=(),
        split=None,
        columns=MOVIELENS_COLUMNS,
        standardize=(),
        dialect=CsvDialect(delimiter="\t", header=False, names=("user", "item", "rating", "time")),
        shuffle_rows=rows,
        shuffle_seed=seed,
        preset="movielens",
        data_dir=data_dir,
        movielens_split=split,
        column_keys=(),
    )


def _generic(
    node: dict[str, Any], preset: str | None, data_dir: Path | None, base_dir: Path, keys: Keys
) -> ParsedDataset:
    fmt = node.get("format")
    if fmt is None:
        raise keys.error("format", f"is required: one of {', '.join(FORMATS)}")
    if fmt not in FORMATS:
        raise keys.error("format", f"must be one of {', '.join(FORMATS)}, got {fmt!r}")
    if "train" not in node:
        raise keys.error("train", "is required: a path or glob of the training files")
    train = _patterns(node["train"], "train", base_dir, keys)
    test = _patterns(node["test"], "test", base_dir, keys) if node.get("test") is not None else ()
    split = _split(node.get("split"), keys)
    if test and split is not None:
        raise keys.error("split", "give test files or a split of the train files, not both")
    if not test and split is None:
        raise keys.error("test", "is required unless split: {fraction: F} names the test rows")
    dialect = _dialect(node, fmt, keys)
    column_keys: dict[str, str] = {}
    if fmt == "libsvm":
        node = _libsvm_node(node, keys)
    ids = tuple(
        _id_column(e, f"ids[{i}]", keys, column_keys)
        for i, e in enumerate(_list(node.get("ids", []), "ids", keys))
    )
    numeric: list[NumericColumn] = []
    standardize: list[str] = []
    for i, e in enumerate(_list(node.get("numeric", []), "numeric", keys)):
        column, wanted = _numeric_column(e, f"numeric[{i}]", keys, column_keys)
        numeric.append(column)
        if wanted:
            standardize.append(column.name)
    if "label" not in node:
        raise keys.error("label", "is required: {column: NAME} (positive: [...] optional)")
    label = _label(node["label"], keys, column_keys)
    if fmt == "libsvm":
        _check_libsvm(ids, label, keys)
    if split is not None and split.order_by is not None:
        column_keys.setdefault(split.order_by, "split.order_by")
    try:
        columns = ColumnSpec(ids=ids, numeric=tuple(numeric), labels=(label,))
    except ConfigError as exc:
        raise keys.error(exc.key, _message(exc)) from None
    rows, seed = _shuffle(node.get("shuffle", True), keys)
    return ParsedDataset(
        format=fmt,
        train=train,
        test=test,
        split=split,
        columns=columns,
        standardize=tuple(standardize),
        dialect=dialect,
        shuffle_rows=rows,
        shuffle_seed=seed,
        preset=preset,
        data_dir=data_dir,
        movielens_split=None,
        column_keys=tuple(column_keys.items()),
    )


def _libsvm_node(node: dict[str, Any], keys: Keys) -> dict[str, Any]:
    """A libSVM ``dataset:`` node with its defaults: ``label`` is the label column,
    ``ids: [features]`` (every index present, as int ids), and ``numeric:`` index numbers
    (``17``) as the column names ``"17"`` (see :mod:`.libsvm`)."""
    base = libsvm_spec()
    out = dict(node)
    out.setdefault("label", {"column": LABEL})
    ids = []
    for i, entry in enumerate(_list(node.get("ids", [FEATURES]), "ids", keys)):
        if isinstance(entry, Mapping):
            if "separator" in entry:
                raise keys.error(f"ids[{i}].separator", "does not apply to a libsvm file")
            entry = {"kind": base.ids[0].kind.value, **entry}
        elif entry == FEATURES:
            entry = {"column": FEATURES, "kind": base.ids[0].kind.value}
        ids.append(entry)
    out["ids"] = ids
    numeric = []
    for i, entry in enumerate(_list(node.get("numeric", []), "numeric", keys)):
        key = f"numeric[{i}]"
        if isinstance(entry, Mapping):
            entry = dict(entry)
            if "column" in entry:
                entry["column"] = _index(entry["column"], f"{key}.column", keys)
            if "columns" in entry:
                cols = _list(entry["columns"], f"{key}.columns", keys)
                entry["columns"] = [
                    _index(c, f"{key}.columns[{j}]", keys) for j, c in enumerate(cols)
                ]
        else:
            entry = _index(entry, key, keys)
        numeric.append(entry)
    out["numeric"] = numeric
    return out


def _index(value: object, key: str, keys: Keys) -> str:
    """A libSVM feature index (``17`` or ``"17"``) as its column name ``"17"``."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return str(value)
    if isinstance(value, str) and value.isascii() and value.isdigit():
        return str(int(value))
    raise keys.error(key, f"must be a libsvm feature index (an integer >= 0), got {value!r}")


def _check_libsvm(ids: Sequence[IDColumn], label: LabelColumn, keys: Keys) -> None:
    """The columns a libSVM file has: ``features`` for ids, ``label`` as is."""
    for i, column in enumerate(ids):
        if column.column != FEATURES:
            raise keys.error(
                f"ids[{i}]",
                f"a libsvm file has one id column, {FEATURES!r} (every index present), "
                f"not {column.column!r}",
            )
    if label.column != LABEL:
        message = f"a libsvm file's label column is {LABEL!r}, not {label.column!r}"
        raise keys.error("label.column", message)
    if label.positive or label.threshold is not None:
        message = "a libsvm label is 1/+1 (positive) or 0/-1: no positive or threshold"
        raise keys.error("label", message)


def _message(exc: ConfigError) -> str:
    text = str(exc)
    prefix = f"{exc.key}: "
    return text[len(prefix) :] if text.startswith(prefix) else text


def _patterns(value: object, key: str, base_dir: Path, keys: Keys) -> tuple[str, ...]:
    items = value if isinstance(value, list) else [value]
    if not items:
        raise keys.error(key, "must name at least one path or glob")
    return tuple(
        str(base_dir / _string(v, f"{key}[{i}]" if isinstance(value, list) else key, keys))
        for i, v in enumerate(items)
    )


def _split(value: object, keys: Keys) -> SplitRule | None:
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise keys.error(
            "split",
            f"must be {{fraction: F}}, {{order_by: COLUMN, fraction: F}} or {{head_rows: N}}, "
            f"got {value!r}",
        )
    unknown = sorted(set(value) - {"fraction", "order_by", "seed", "head_rows"})
    if unknown:
        raise keys.error(f"split.{unknown[0]}", "is not a split setting (fraction, order_by, "
                         "seed, head_rows)")  # fmt: skip
    if "head_rows" in value:
        if set(value) != {"head_rows"}:
            raise keys.error("split.head_rows", "is a split of its own (no fraction or order_by)")
        return SplitRule(head_rows=_int(value["head_rows"], "split.head_rows", keys, minimum=1))
    fraction = value.get("fraction")
    if (
        isinstance(fraction, bool)
        or not isinstance(fraction, (int, float))
        or not 0 < fraction < 1
        or not math.isfinite(fraction)
    ):
        raise keys.error("split.fraction", f"must be a number in (0, 1), got {fraction!r}")
    order_by = value.get("order_by")
    if order_by is not None:
        order_by = _string(order_by, "split.order_by", keys)
        if "seed" in value:
            raise keys.error("split.seed", "applies to a hash split only, not order_by")
    seed = _int(value.get("seed", 0), "split.seed", keys, minimum=0)
    return SplitRule(fraction=float(fraction), order_by=order_by, seed=seed)


def _dialect(node: Mapping[str, Any], fmt: str, keys: Keys) -> CsvDialect:
    given = [k for k in _TEXT_KEYS if k in node]
    if fmt == "libsvm" and "na_values" in node:
        given.append("na_values")
    if fmt in ("parquet", "libsvm") and given:
        raise keys.error(given[0], f"applies to csv and tsv files, not {fmt}")
    kwargs: dict[str, Any] = {"delimiter": "\t" if fmt == "tsv" else ","}
    if "names" in node:
        names = _list(node["names"], "names", keys)
        kwargs["names"] = tuple(_string(n, f"names[{i}]", keys) for i, n in enumerate(names))
    for key in ("header", "strip"):
        if key in node:
            kwargs[key] = _bool(node[key], key, keys)
    for key in ("delimiter", "comment"):
        if key in node:
            kwargs[key] = node[key]
    if "chunk_bytes" in node:
        kwargs["chunk_bytes"] = _int(node["chunk_bytes"], "chunk_bytes", keys, minimum=1)
    if "header" not in node and "names" in node:
        kwargs["header"] = False
    kwargs["na_values"] = node.get("na_values", ())
    try:
        return CsvDialect(**kwargs)
    except ConfigError as exc:
        raise keys.error(exc.key, _message(exc)) from None


def _id_column(entry: object, key: str, keys: Keys, column_keys: dict[str, str]) -> IDColumn:
    if isinstance(entry, str):
        entry = {"column": entry}
    if not isinstance(entry, Mapping):
        raise keys.error(key, f"must be a column name or a mapping, got {entry!r}")
    allowed = {"column", "name", "kind", "separator", "namespace", "missing_id"}
    unknown = sorted(set(entry) - allowed)
    if unknown:
        raise keys.error(
            f"{key}.{unknown[0]}", f"is not an id setting ({', '.join(sorted(allowed))})"
        )
    if "column" not in entry:
        raise keys.error(f"{key}.column", "is required")
    kind = entry.get("kind", "string")
    if kind not in [k.value for k in IdKind]:
        raise keys.error(f"{key}.kind", f"must be string, int or hex, got {kind!r}")
    try:
        column = IDColumn(
            entry["column"],
            name=entry.get("name"),
            kind=IdKind(kind),
            separator=entry.get("separator"),
            namespace=entry.get("namespace"),
            missing_id=entry.get("missing_id"),
        )
    except ConfigError as exc:
        raise keys.error(f"{key}.{exc.key}", _message(exc)) from None
    column_keys.setdefault(column.column, key)
    return column


def _numeric_column(
    entry: object, key: str, keys: Keys, column_keys: dict[str, str]
) -> tuple[NumericColumn, bool]:
    if isinstance(entry, str):
        entry = {"column": entry}
    if not isinstance(entry, Mapping):
        raise keys.error(key, f"must be a column name or a mapping, got {entry!r}")
    allowed = {"column", "columns", "name", "transform", "fill"}
    unknown = sorted(set(entry) - allowed)
    if unknown:
        raise keys.error(
            f"{key}.{unknown[0]}", f"is not a numeric setting ({', '.join(sorted(allowed))})"
        )
    if ("column" in entry) == ("columns" in entry):
        raise keys.error(key, "needs column: NAME or columns: [NAME, ...] (one of them)")
    columns: tuple[str, ...]
    if "column" in entry:
        columns = (_string(entry["column"], f"{key}.column", keys),)
        name = entry.get("name", columns[0])
    else:
        cols = _list(entry["columns"], f"{key}.columns", keys)
        columns = tuple(_string(c, f"{key}.columns[{i}]", keys) for i, c in enumerate(cols))
        if "name" not in entry:
            raise keys.error(f"{key}.name", "is required with columns: [...]")
        name = entry["name"]
    transform = entry.get("transform", "none")
    if transform not in TRANSFORMS:
        raise keys.error(
            f"{key}.transform", f"must be one of {', '.join(TRANSFORMS)}, got {transform!r}"
        )
    fill = entry.get("fill", 0.0)
    if isinstance(fill, bool) or not isinstance(fill, (int, float)):
        raise keys.error(f"{key}.fill", f"must be a number, got {fill!r}")
    try:
        column = NumericColumn(columns, name=name, log1p=transform == "log1p", fill=float(fill))
    except ConfigError as exc:
        raise keys.error(f"{key}.{exc.key}", _message(exc)) from None
    for c in columns:
        column_keys.setdefault(c, key)
    return column, transform == "standardize"


def _label(entry: object, keys: Keys, column_keys: dict[str, str]) -> LabelColumn:
    if isinstance(entry, str):
        entry = {"column": entry}
    if not isinstance(entry, Mapping):
        raise keys.error("label", f"must be {{column: NAME}} or a column name, got {entry!r}")
    allowed = {"column", "name", "positive", "threshold"}
    unknown = sorted(set(entry) - allowed)
    if unknown:
        raise keys.error(
            f"label.{unknown[0]}", f"is not a label setting ({', '.join(sorted(allowed))})"
        )
    if "column" not in entry:
        raise keys.error("label.column", "is required")
    positive = entry.get("positive", ())
    if isinstance(positive, (str, int, float)) and not isinstance(positive, bool):
        positive = [positive]
    positive = _list(positive, "label.positive", keys)
    threshold = entry.get("threshold")
    if threshold is not None and (
        isinstance(threshold, bool) or not isinstance(threshold, (int, float))
    ):
        raise keys.error("label.threshold", f"must be a number, got {threshold!r}")
    try:
        label = LabelColumn(
            entry["column"],
            name=entry.get("name"),
            positive=tuple(str(p) for p in positive),
            threshold=None if threshold is None else float(threshold),
        )
    except ConfigError as exc:
        raise keys.error(f"label.{exc.key}", _message(exc)) from None
    column_keys.setdefault(label.column, "label")
    return label


def _shuffle(value: object, keys: Keys) -> tuple[int, int | None]:
    if value is True:
        return DEFAULT_SHUFFLE_ROWS, None
    if value is False or value is None:
        return 0, None
    if not isinstance(value, Mapping):
        raise keys.error(
            "shuffle", f"must be false, true or {{buffer_rows: N, seed: S}}, got {value!r}"
        )
    unknown = sorted(set(value) - {"buffer_rows", "seed"})
    if unknown:
        raise keys.error(f"shuffle.{unknown[0]}", "is not a shuffle setting (buffer_rows, seed)")
    rows = _int(value.get("buffer_rows", DEFAULT_SHUFFLE_ROWS), "shuffle.buffer_rows", keys, 0)
    seed = value.get("seed")
    return rows, None if seed is None else _int(seed, "shuffle.seed", keys, minimum=0)


def _list(value: object, key: str, keys: Keys) -> Sequence[Any]:
    if not isinstance(value, (list, tuple)):
        raise keys.error(key, f"must be a list, got {value!r}")
    return value


def _string(value: object, key: str, keys: Keys) -> str:
    if not isinstance(value, str) or not value:
        raise keys.error(key, f"must be a non-empty string, got {value!r}")
    return value


def _bool(value: object, key: str, keys: Keys) -> bool:
    if not isinstance(value, bool):
        raise keys.error(key, f"must be true or false, got {value!r}")
    return value


def _int(value: object, key: str, keys: Keys, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise keys.error(key, f"must be an integer >= {minimum}, got {value!r}")
    return value
