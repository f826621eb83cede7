"""Parsing the ``dataset:`` node of a job file into the parts of a
:class:`~embeddb.features.dataset.DatasetSpec` (every key checked, once).

Each mistake is a :class:`~embeddb.errors.ConfigError` whose key is the key's path
(``dataset.numeric[1].transform``) and whose message ends with where that key is in the
file (``(job.yaml:14)``, from the ``where`` callable the launcher passes).

The presets are the same mechanism: a preset is a ``dataset:`` mapping written here
(:func:`preset_node`), overlaid with the keys the user gives next to ``preset:``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from embeddb.datasets.adult import ADULT_DIR
from embeddb.datasets.adult import COLUMNS as ADULT_COLUMNS
from embeddb.datasets.adult import NUMERIC as ADULT_NUMERIC
from embeddb.errors import ConfigError
from embeddb.features._yaml_columns import (
    check_libsvm,
    derived_columns,
    id_column,
    label_column,
    libsvm_node,
    libsvm_slots,
    numeric_column,
)
from embeddb.features._yaml_keys import Keys, as_bool, as_int, as_list, as_string, message_of
from embeddb.features.spec import (
    ColumnSpec,
    CsvDialect,
    DerivedColumn,
    IDColumn,
    IdKind,
    LabelColumn,
    NumericColumn,
)

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
_TEXT_KEYS = ("names", "header", "delimiter", "quote", "comment", "strip", "chunk_bytes")
_KEYS = (
    "preset",
    "format",
    "train",
    "test",
    "split",
    "label",
    "ids",
    "slots",
    "numeric",
    "derived",
    "na_values",
    "shuffle",
    "data_dir",
    "train_rows",
    *_TEXT_KEYS,
)


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
    """Everything the ``dataset:`` node says (paths absolute, columns unfitted).

    ``dialect`` is the text layout shared by the splits; ``train_header`` and ``test_header``
    say whether each split's files have a header line (``header: {train: true, test:
    false}``; a headerless split without ``names`` takes the other split's header names).
    ``auto_slots``: a libSVM dataset with neither ``ids`` nor ``slots``, whose ID features
    ``fit`` picks from the data (one per field of ``field:index:value`` files, else
    ``features``).
    """

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
    train_header: bool = True
    test_header: bool = True
    auto_slots: bool = False


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
        data_dir = (base_dir / as_string(node["data_dir"], "data_dir", keys)).resolve()
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
            base["split"] = {"head_rows": as_int(train_rows, "train_rows", keys, minimum=1)}
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
    dialect, train_header, test_header = _dialect(node, fmt, keys)
    if not test and not train_header and dialect.names is None:
        raise keys.error("names", "a file without a header needs its column names (the train "
                         "files have no header line and there are no test files)")  # fmt: skip
    if not test and isinstance(node.get("header"), Mapping) and "test" in node["header"]:
        raise keys.error("header.test", "there are no test files (the split takes test rows "
                         "from the train files)")  # fmt: skip
    column_keys: dict[str, str] = {}
    auto_slots = fmt == "libsvm" and "ids" not in node and "slots" not in node
    if fmt == "libsvm":
        node = libsvm_node(node, keys)
    elif "slots" in node:
        raise keys.error("slots", "applies to libsvm files (csv columns are ids: entries)")
    ids = tuple(
        id_column(e, f"ids[{i}]", keys, column_keys)
        for i, e in enumerate(as_list(node.get("ids", []), "ids", keys))
    )
    numeric: list[NumericColumn] = []
    standardize: list[str] = []
    for i, e in enumerate(as_list(node.get("numeric", []), "numeric", keys)):
        column, wanted = numeric_column(e, f"numeric[{i}]", keys, column_keys)
        numeric.append(column)
        if wanted:
            standardize.append(column.name)
    if "label" not in node:
        raise keys.error("label", "is required: {column: NAME} (positive: [...] optional)")
    label = label_column(node["label"], keys, column_keys)
    if fmt == "libsvm":
        check_libsvm(ids, label, keys)
        if "slots" in node:
            ids += tuple(libsvm_slots(node["slots"], keys))
    derived = _derived(node, fmt, keys, column_keys)
    if split is not None and split.order_by is not None:
        column_keys.setdefault(split.order_by, "split.order_by")
    try:
        columns = ColumnSpec(ids=ids, numeric=tuple(numeric), labels=(label,), derived=derived)
    except ConfigError as exc:
        raise keys.error(exc.key, message_of(exc)) from None
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
        train_header=train_header,
        test_header=test_header,
        auto_slots=auto_slots,
    )


def _derived(
    node: Mapping[str, Any], fmt: str, keys: Keys, column_keys: dict[str, str]
) -> tuple[DerivedColumn, ...]:
    """The ``derived:`` columns; ``column_keys`` then names their sources, not them."""
    if "derived" not in node:
        return ()
    if fmt == "libsvm":
        raise keys.error("derived", "applies to csv, tsv and parquet files, not libsvm")
    derived = derived_columns(node["derived"], keys)
    for d in derived:
        column_keys.pop(d.name, None)
        column_keys.setdefault(d.source, f"derived.{d.name}.from")
    return derived


def _patterns(value: object, key: str, base_dir: Path, keys: Keys) -> tuple[str, ...]:
    items = value if isinstance(value, list) else [value]
    if not items:
        raise keys.error(key, "must name at least one path or glob")
    return tuple(
        str(base_dir / as_string(v, f"{key}[{i}]" if isinstance(value, list) else key, keys))
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
        return SplitRule(head_rows=as_int(value["head_rows"], "split.head_rows", keys, minimum=1))
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
        order_by = as_string(order_by, "split.order_by", keys)
        if "seed" in value:
            raise keys.error("split.seed", "applies to a hash split only, not order_by")
    seed = as_int(value.get("seed", 0), "split.seed", keys, minimum=0)
    return SplitRule(fraction=float(fraction), order_by=order_by, seed=seed)


def _dialect(node: Mapping[str, Any], fmt: str, keys: Keys) -> tuple[CsvDialect, bool, bool]:
    """The text layout and whether the train and the test files have a header line.

    ``header`` is true, false, or ``{train: BOOL, test: BOOL}`` (a split left out: true, or
    false when ``names`` are given); ``quote`` is a character or false (quotes are text).
    """
    given = [k for k in _TEXT_KEYS if k in node]
    if fmt == "libsvm" and "na_values" in node:
        given.append("na_values")
    if fmt in ("parquet", "libsvm") and given:
        raise keys.error(given[0], f"applies to csv and tsv files, not {fmt}")
    kwargs: dict[str, Any] = {"delimiter": "\t" if fmt == "tsv" else ","}
    if "names" in node:
        names = as_list(node["names"], "names", keys)
        kwargs["names"] = tuple(as_string(n, f"names[{i}]", keys) for i, n in enumerate(names))
    train_header, test_header = _headers(node, keys)
    if "strip" in node:
        kwargs["strip"] = as_bool(node["strip"], "strip", keys)
    for key in ("delimiter", "comment"):
        if key in node:
            kwargs[key] = node[key]
    if "quote" in node:
        quote = node["quote"]
        if quote is True:
            raise keys.error("quote", "must be a character (default '\"') or false, got true")
        kwargs["quote"] = None if quote is False or quote is None else quote
    if "chunk_bytes" in node:
        kwargs["chunk_bytes"] = as_int(node["chunk_bytes"], "chunk_bytes", keys, minimum=1)
    if not (train_header or test_header) and "names" not in node:
        raise keys.error("names", "a file without a header needs its column names (neither "
                         "the train nor the test files have a header line)")  # fmt: skip
    # A headerless split without names takes the other's header names (DatasetSpec.dialect).
    kwargs["header"] = train_header or "names" not in node
    kwargs["na_values"] = node.get("na_values", ())
    try:
        return CsvDialect(**kwargs), train_header, test_header
    except ConfigError as exc:
        raise keys.error(exc.key, message_of(exc)) from None


def _headers(node: Mapping[str, Any], keys: Keys) -> tuple[bool, bool]:
    default = "names" not in node
    value = node.get("header", default)
    if not isinstance(value, Mapping):
        both = as_bool(value, "header", keys)
        return both, both
    unknown = sorted(str(k) for k in set(value) - {"train", "test"})
    if unknown:
        raise keys.error(
            f"header.{unknown[0]}", "is not a split: header: {train: BOOL, test: BOOL}"
        )
    train = as_bool(value.get("train", default), "header.train", keys)
    return train, as_bool(value.get("test", default), "header.test", keys)


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
    rows = as_int(value.get("buffer_rows", DEFAULT_SHUFFLE_ROWS), "shuffle.buffer_rows", keys, 0)
    seed = value.get("seed")
    return rows, None if seed is None else as_int(seed, "shuffle.seed", keys, minimum=0)
