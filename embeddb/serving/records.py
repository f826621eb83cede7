"""Pre-hashed records (JSON-shaped) → :class:`~embeddb.features.batch.Batch`, for a model's
inputs (no torch here).

A pre-hashed record carries the ids the shards store and the non-ID inputs as the dense part
reads them (the hashing and the numeric transforms already applied by the caller)::

    {"ids": {"user_id": 42, "genres": [3, 7], "item": "12345678901234567890"},
     "non_id": {"dense": [0.1, 0.2, 0.3, 0.4]}}

Ids are integers in ``[0, 2**64)``, or the same as decimal strings: 64-bit ids exceed the
integers JSON parsers of other languages keep exactly (JavaScript's end at ``2**53``), so a
client may send every id as a string. A missing ID feature is an empty sample (no id: a zero
pooled embedding); every non-ID input of the model is required, with its per-sample shape (a
single number for a one-element shape).

Raw records (column values as in the training data) are the feature pipeline's
(``embeddb.features.pipeline.FeaturePipeline.batch_from_records``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from embeddb.common.arrays import F32, U64
from embeddb.errors import InvalidArgumentError
from embeddb.features.batch import Batch, IDTypeFeature, IDTypeFeatureWithSingleID, NonIDTypeFeature
from embeddb.serving.codec import ModelInputs, NonIdInput

__all__ = ["MAX_ID", "check_records", "hashed_batch"]

MAX_ID = (1 << 64) - 1
_MAX_ID_TEXT = str(MAX_ID)
_DIGITS = "0123456789"
_RECORD_KEYS = frozenset(("ids", "non_id"))


def check_records(records: object) -> Sequence[object]:
    """``records`` if it is a non-empty list of records (of any form).

    Raises:
        InvalidArgumentError: not a list, or an empty one.
    """
    if isinstance(records, (str, bytes, Mapping)) or not isinstance(records, Sequence):
        raise InvalidArgumentError(
            f"records must be a list of records, got {type(records).__name__}"
        )
    if len(records) == 0:
        raise InvalidArgumentError("records is empty: nothing to score")
    return records


def hashed_batch(records: object, spec: ModelInputs) -> Batch:
    """A batch of pre-hashed records (see the module docstring) for the model of ``spec``.

    Every ID feature of the model is in the batch, in the model's order; every non-ID input,
    float32 ``(n, *shape)``, in the model's order.

    Raises:
        InvalidArgumentError: not a non-empty list of records, or a record with an unknown
            key, an unknown ID feature or non-ID input, an id that is not an integer (or a
            decimal string) in ``[0, 2**64)``, a missing non-ID input, or one of the wrong
            shape or type; the message names the record's index and the field.
    """
    rows = check_records(records)
    n = len(rows)
    names = tuple(spec.id_features)
    index = {name: k for k, name in enumerate(names)}
    inputs = list(spec.non_id)
    counts = np.zeros((len(names), n), dtype=np.int64)
    flat: list[list[int]] = [[] for _ in names]  # every id of a feature, in record order
    non_id_values: dict[str, list[object]] = {s.name: [] for s in inputs}
    for i, record in enumerate(rows):
        if not isinstance(record, Mapping):
            raise InvalidArgumentError(f"record {i} must be an object, got {type(record).__name__}")
        extra = record.keys() - _RECORD_KEYS
        if extra:
            raise InvalidArgumentError(
                f"record {i} has unknown keys {sorted(map(str, extra))} "
                "(a pre-hashed record has 'ids' and 'non_id')"
            )
        ids = record.get("ids", {})
        if not isinstance(ids, Mapping):
            raise InvalidArgumentError(
                f"record {i}: 'ids' must be an object of feature -> ids, got {type(ids).__name__}"
            )
        for name, value in ids.items():
            k = index.get(name)
            if k is None:
                raise InvalidArgumentError(
                    f"record {i}: ids.{name}: the model reads no such ID feature "
                    f"({', '.join(names)})"
                )
            if type(value) is int and 0 <= value <= MAX_ID:  # the common case, no numpy
                flat[k].append(value)
                counts[k, i] = 1
            elif type(value) is str and _is_id_text(value):
                flat[k].append(int(value))
                counts[k, i] = 1
            else:
                many = _ids_of(value, i, name)
                flat[k].extend(many)
                counts[k, i] = len(many)
        values = record.get("non_id", {})
        if not isinstance(values, Mapping):
            raise InvalidArgumentError(
                f"record {i}: 'non_id' must be an object of name -> values, "
                f"got {type(values).__name__}"
            )
        for name in values.keys() - non_id_values.keys():
            raise InvalidArgumentError(
                f"record {i}: non_id.{name}: the model reads no such non-ID input "
                f"({', '.join(non_id_values) or 'none'})"
            )
        for name, column in non_id_values.items():
            if name not in values:
                raise InvalidArgumentError(f"record {i}: non_id.{name} is missing")
            column.append(values[name])
    id_features: list[IDTypeFeature] = []
    for k, name in enumerate(names):
        row = counts[k]
        values_k = np.array(flat[k], dtype=np.uint64)
        if values_k.size == n and bool(np.all(row == 1)):
            id_features.append(IDTypeFeatureWithSingleID(name, values_k))
        else:
            offsets = np.zeros(n + 1, dtype=np.int64)
            np.cumsum(row, out=offsets[1:])
            id_features.append(IDTypeFeature.from_csr(name, values_k, offsets))
    non_id = [
        NonIDTypeFeature(_non_id_column(s, non_id_values[s.name]), name=s.name) for s in inputs
    ]
    return Batch(id_features, non_id, requires_grad=False)


# ---------------------------------------------------------------------- helpers
def _is_id_text(text: str) -> bool:
    """Whether ``text`` is a decimal id in ``[0, 2**64)`` (ASCII digits, at most 20)."""
    return (
        0 < len(text) <= 20
        and text.isascii()
        and text.isdigit()
        and (len(text) < 20 or text <= _MAX_ID_TEXT)
    )


def _id_texts(array: np.ndarray) -> U64 | None:
    """The ids of a 1-D array of strings, or ``None`` if one is not a decimal id in range."""
    lengths = np.char.str_len(array)
    if bool(((lengths < 1) | (lengths > 20)).any()):
        return None
    if bool((np.char.strip(array, _DIGITS) != "").any()):  # a character that is no ASCII digit
        return None
    if bool(((lengths == 20) & (array > _MAX_ID_TEXT)).any()):  # same length: text order
        return None
    ids: U64 = array.astype(np.uint64)
    return ids


def _ids_of(value: object, index: int, name: str) -> list[int]:
    """One record's ids of one feature, checked (an id or a list of ids)."""
    if isinstance(value, (int, str)) and not isinstance(value, bool):
        raise InvalidArgumentError(
            f"record {index}: ids.{name}: {_preview(value)} is not an id (integers in "
            "[0, 2**64), or the same as decimal strings)"
        )
    if isinstance(value, (list, tuple)):
        if not value:
            return []
        try:
            array = np.asarray(value)
        except (ValueError, OverflowError):
            array = np.asarray([0.5])  # ragged or out of range: reported below
        flat_ints = array.ndim == 1 and (
            array.dtype.kind == "u" or (array.dtype.kind == "i" and int(array.min()) >= 0)
        )
        if flat_ints and not _has_bool(value):  # numpy reads [true, 1] as [1, 1]
            return list(value)
        if array.ndim == 1 and array.dtype.kind == "U" and not _has_bool(value):
            texts = _id_texts(array)
            if texts is not None:
                return [int(x) for x in texts.tolist()]
        raise InvalidArgumentError(
            f"record {index}: ids.{name}: must be a flat list of ids (integers in [0, 2**64), "
            f"or decimal strings), got {_preview(value)}"
        )
    raise InvalidArgumentError(
        f"record {index}: ids.{name}: must be an id or a list of ids, got {type(value).__name__}"
    )


def _has_bool(values: Sequence[object]) -> bool:
    return any(isinstance(v, bool) for v in values)


def _non_id_column(spec: NonIdInput, column: list[object]) -> F32:
    """``(n, *spec.shape)`` float32 from one value per record; a precise error otherwise."""
    n = len(column)
    shape = tuple(int(d) for d in spec.shape)
    scalar = int(np.prod(shape)) == 1
    try:
        with np.errstate(over="ignore"):  # out of float32's range: inf, refused below
            array = np.asarray(column, dtype=np.float32)
    except (TypeError, ValueError, OverflowError):
        array = None
    if array is not None:
        if array.shape == (n, *shape):
            pass
        elif scalar and array.shape == (n,):
            array = array.reshape(n, *shape)
        else:
            array = None
    if array is not None and bool(np.isfinite(array).all()):
        return array
    for i, value in enumerate(column):  # the slow path, only to name the bad record
        if isinstance(value, bool) or not _is_numeric(value):
            raise InvalidArgumentError(
                f"record {i}: non_id.{spec.name}: must be numbers, got {_preview(value)}"
            )
        try:
            one = np.asarray(value, dtype=np.float64)
        except OverflowError:  # an integer beyond float64
            one = np.asarray(np.inf)
        if one.shape != shape and not (scalar and one.size == 1):
            raise InvalidArgumentError(
                f"record {i}: non_id.{spec.name}: must have shape {list(shape)}, got "
                f"{list(one.shape)}"
            )
        with np.errstate(over="ignore"):
            finite = bool(np.isfinite(one.astype(np.float32)).all())
        if not finite:
            raise InvalidArgumentError(
                f"record {i}: non_id.{spec.name}: must be finite numbers within float32's "
                f"range, got {_preview(value)}"
            )
    raise InvalidArgumentError(f"non_id.{spec.name}: values of mixed shapes")


def _is_numeric(value: object) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, (int, float)):
        return True
    if isinstance(value, (list, tuple)):
        return all(_is_numeric(v) for v in value)
    return False


def _preview(value: object, limit: int = 60) -> str:
    if isinstance(value, int) and value.bit_length() > 200:  # no 4,000-digit repr
        return f"an integer of {len(str(value))} digits"
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
