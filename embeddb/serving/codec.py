"""``PredictRequest`` ⇄ :class:`~embeddb.features.batch.Batch`, and merging batches for the
micro-batcher. Pure numpy (no torch, no grpc): the server, the client and the tests share it.

A request of 3 records (``embeddb/proto/embeddb/v1/model.proto``) and the batch it decodes to::

    num_records = 3
    IdFeature "user"  ids = u64[7, 9, 9, 4]  offsets = u64[0, 2, 2, 4]
                      -> IDTypeFeature.from_csr("user", [7, 9, 9, 4], [0, 2, 2, 4])
    IdFeature "item"  ids = u64[3, 3, 8]     offsets = b""  (one id per record)
                      -> IDTypeFeatureWithSingleID("item", [3, 3, 8])
    (an ID feature of the model the request leaves out -> offsets [0, 0, 0, 0]: no ids)
    NonIdFeature "numeric"  values = f32[18]  shape = [3, 6]
                      -> NonIDTypeFeature(float32 (3, 6), name="numeric")

Decoding validates everything once (docs/style.md §5): every error is an
:class:`~embeddb.errors.InvalidArgumentError` naming the feature and what is wrong, or a
:class:`~embeddb.errors.ResourceExhaustedError` for more records than allowed.

:func:`merge_batches` concatenates batches that the server decoded (every ID feature of the
model present, non-ID inputs in the model's order) into one; :func:`split_scores` cuts the
merged scores back into one array per batch. :func:`finite_scores` refuses scores with a NaN
(every frontend checks its answer with it).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np

from embeddb.common.arrays import F32
from embeddb.errors import InvalidArgumentError, ResourceExhaustedError
from embeddb.features.batch import Batch, IDTypeFeature, IDTypeFeatureWithSingleID, NonIDTypeFeature
from embeddb.v1 import model_pb2 as mpb

__all__ = [
    "ModelInputs",
    "NonIdInput",
    "batch_from_request",
    "decode_scores",
    "encode_request",
    "encode_scores",
    "finite_scores",
    "merge_batches",
    "split_scores",
]


class NonIdInput(Protocol):
    """One non-ID input of a model (an entry of model.json's ``non_id``)."""

    @property
    def name(self) -> str: ...
    @property
    def shape(self) -> Sequence[int]: ...


class ModelInputs(Protocol):
    """What decoding needs to know of a model (its ``ModelSpec``)."""

    @property
    def id_features(self) -> Sequence[str]: ...
    @property
    def non_id(self) -> Sequence[NonIdInput]: ...


def batch_from_request(request: mpb.PredictRequest, spec: ModelInputs, max_records: int) -> Batch:
    """Decode and validate ``request`` into an evaluation batch for the model of ``spec``.

    The batch holds every ID feature of the model in the model's order (a feature the request
    leaves out has no ids in any record) and every non-ID input in the model's order, as
    float32 arrays of shape ``(num_records, *per-sample dims)``.

    Raises:
        InvalidArgumentError: no records; an unknown or repeated feature; ids or offsets whose
            byte length is not a multiple of 8; offsets of the wrong length, not starting at 0,
            decreasing or not ending at the number of ids; a missing non-ID input, one of the
            wrong shape or byte length, or with NaN/Inf values.
        ResourceExhaustedError: more than ``max_records`` records.
    """
    n = int(request.num_records)
    if n < 1:
        raise InvalidArgumentError("num_records must be at least 1")
    if n > max_records:
        raise ResourceExhaustedError(
            f"{n} records in one request, more than this server accepts ({max_records}); "
            f"split the request"
        )
    id_names = list(spec.id_features)
    given: dict[str, IDTypeFeature] = {}
    for feature in request.id_features:
        name = feature.name
        if name not in id_names:
            raise InvalidArgumentError(
                f"unknown id feature {name!r}; the model's id features: {', '.join(id_names)}"
            )
        if name in given:
            raise InvalidArgumentError(f"id feature {name!r} is given twice")
        given[name] = _id_feature(feature, n)
    empty = np.zeros(n + 1, dtype=np.int64)
    ids = [
        given[name] if name in given else IDTypeFeature.from_csr(name, _NO_IDS, empty)
        for name in id_names
    ]
    inputs = {x.name: x for x in spec.non_id}
    values: dict[str, F32] = {}
    for feature in request.non_id_features:
        name = feature.name
        if name not in inputs:
            known = ", ".join(inputs) or "none"
            raise InvalidArgumentError(
                f"unknown non-ID feature {name!r}; the model's non-ID inputs: {known}"
            )
        if name in values:
            raise InvalidArgumentError(f"non-ID feature {name!r} is given twice")
        values[name] = _non_id(feature, [n, *(int(d) for d in inputs[name].shape)])
    missing = [name for name in inputs if name not in values]
    if missing:
        raise InvalidArgumentError(f"missing non-ID feature(s): {', '.join(missing)}")
    dense = [NonIDTypeFeature(values[name], name=name) for name in inputs]
    return Batch(ids, dense, requires_grad=False)


_NO_IDS = np.zeros(0, dtype=np.uint64)


def _id_feature(feature: mpb.IdFeature, n: int) -> IDTypeFeature:
    name = feature.name
    if len(feature.ids) % 8:
        raise InvalidArgumentError(
            f"id feature {name!r}: ids must be uint64 bytes (a multiple of 8), got "
            f"{len(feature.ids)} bytes"
        )
    ids = np.frombuffer(feature.ids, dtype="<u8").astype(np.uint64, copy=False)
    if not feature.offsets:
        if ids.size != n:
            raise InvalidArgumentError(
                f"id feature {name!r}: without offsets it needs one id per record ({n}), got "
                f"{ids.size}"
            )
        return IDTypeFeatureWithSingleID(name, ids)
    if len(feature.offsets) != 8 * (n + 1):
        raise InvalidArgumentError(
            f"id feature {name!r}: offsets must be {n + 1} uint64 (num_records + 1), got "
            f"{len(feature.offsets)} bytes"
        )
    offsets = np.frombuffer(feature.offsets, dtype="<u8")
    if offsets.size and int(offsets.max()) > ids.size:
        raise InvalidArgumentError(
            f"id feature {name!r}: offsets must start at 0, never decrease and end at "
            f"{ids.size} (the number of ids)"
        )
    return IDTypeFeature.from_csr(name, ids, offsets.astype(np.int64))


def _non_id(feature: mpb.NonIdFeature, want: list[int]) -> F32:
    name = feature.name
    shape = [int(d) for d in feature.shape]
    if shape != want:
        raise InvalidArgumentError(
            f"non-ID feature {name!r}: shape must be {want} (num_records, then the model's "
            f"per-sample dims), got {shape}"
        )
    items = int(np.prod(want))
    if len(feature.values) != 4 * items:
        raise InvalidArgumentError(
            f"non-ID feature {name!r}: values must be {items} float32 ({4 * items} bytes) for "
            f"shape {want}, got {len(feature.values)} bytes"
        )
    # A read-only view of the request (InferCtx copies read-only inputs before torch sees
    # them; merged micro-batches are concatenated anyway, so copying here would copy twice).
    values = np.frombuffer(feature.values, dtype="<f4")
    if not np.isfinite(values).all():
        raise InvalidArgumentError(f"non-ID feature {name!r} holds NaN or Inf")
    return values.reshape(want)


def encode_request(batch: Batch) -> mpb.PredictRequest:
    """The request scoring every sample of ``batch`` (what :class:`ModelClient` sends).

    Single-id features travel without offsets. Non-ID features travel as float32 under their
    names, which must be the model's input names; an unnamed one is ``non_id_{i}`` (the name
    ``export_model`` gives it).
    """
    request = mpb.PredictRequest(num_records=batch.batch_size)
    for f in batch.id_type_features:
        single = isinstance(f, IDTypeFeatureWithSingleID)
        request.id_features.append(
            mpb.IdFeature(
                name=f.name,
                ids=np.ascontiguousarray(f.values, dtype="<u8").tobytes(),
                offsets=b"" if single else np.ascontiguousarray(f.offsets, "<u8").tobytes(),
            )
        )
    for i, d in enumerate(batch.non_id_type_features):
        values = np.ascontiguousarray(d.data, dtype="<f4")
        request.non_id_features.append(
            mpb.NonIdFeature(
                name=d.name if d.name is not None else f"non_id_{i}",
                values=values.tobytes(),
                shape=list(values.shape),
            )
        )
    return request


def finite_scores(scores: F32) -> F32:
    """``scores``, if every one is a number: a NaN never reaches an answer (HTTP's JSON has no
    NaN; gRPC and TorchServe answer the same).

    Raises:
        InvalidArgumentError: naming the first record whose score is NaN (the model's output
            for inputs that overflow inside it, or a model that returns NaN).
    """
    bad = np.isnan(scores)
    if bad.any():
        row = int(np.argmax(bad))
        raise InvalidArgumentError(
            f"record {row}: the model's score is NaN (its inputs overflow inside the model, "
            "or the model returns NaN); the request gets no scores"
        )
    return scores


def encode_scores(scores: F32) -> mpb.PredictResponse:
    return mpb.PredictResponse(scores=np.ascontiguousarray(scores, dtype="<f4").tobytes())


def decode_scores(response: mpb.PredictResponse, n: int) -> F32:
    """The ``n`` scores of ``response``.

    Raises:
        InvalidArgumentError: the response does not hold ``n`` float32.
    """
    if len(response.scores) != 4 * n:
        raise InvalidArgumentError(
            f"the server answered {len(response.scores)} score bytes for {n} records"
        )
    return np.frombuffer(response.scores, dtype="<f4").astype(np.float32)


def merge_batches(batches: Sequence[Batch]) -> Batch:
    """One batch holding the samples of ``batches`` in order.

    Every batch must hold the same ID features (by name) and the same non-ID features in the
    same order, as :func:`batch_from_request` makes them; one batch is returned as is.
    """
    if len(batches) == 1:
        return batches[0]
    first = batches[0]
    ids: list[IDTypeFeature] = []
    for f in first.id_type_features:
        parts = [b.feature(f.name) for b in batches]
        values = np.concatenate([p.values for p in parts])
        offsets = np.zeros(sum(p.batch_size for p in parts) + 1, dtype=np.int64)
        at, base = 1, 0
        for p in parts:  # one slice per merged batch, never per id
            offsets[at : at + p.batch_size] = p.offsets[1:] + base
            at += p.batch_size
            base += int(p.offsets[-1])
        ids.append(IDTypeFeature.from_csr(f.name, values, offsets))
    dense = [
        NonIDTypeFeature(
            np.concatenate([b.non_id_type_features[j].data for b in batches]), name=d.name
        )
        for j, d in enumerate(first.non_id_type_features)
    ]
    return Batch(ids, dense, requires_grad=False)


def split_scores(scores: F32, sizes: Sequence[int]) -> list[F32]:
    """``scores`` cut into consecutive pieces of ``sizes`` (views, no copies)."""
    bounds = np.cumsum(sizes)[:-1]
    return list(np.split(scores, bounds))
