"""``model.json``: what an exported model reads and returns (no torch here).

Example (the Adult example's model)::

    {"format": "embeddb-model/1", "snapshot_id": "ckpt-000000300", "created": 1767225600.0,
     "id_features": ["workclass", "education", ...],        # the batch order of embeddings
     "non_id": [{"name": "dense", "shape": [6], "dtype": "float32"}],
     "output": "logit", "torch": "2.13.0", "positive": "income >50K",
     "pooling": {},                                          # per-feature pooling overrides
     "pipeline": "features.json",                            # the feature pipeline, or null
     "lenient_records": false}                               # ignore unknown keys of raw records

``pooling`` is optional (an addition to the issue-6 contract): the trainer's per-feature
overrides of the config's pooling (``TrainerConfig.pooling``, e.g. ``{"title": "mean"}``),
which ``embedding.yaml`` cannot express.

``pipeline`` is optional too (issue 13; absent or null in older models, which stay readable):
the file of the model directory holding the feature pipeline
(:class:`~embeddb.features.pipeline.FeaturePipeline`) that turns raw records into batches
exactly as training did. A model with one scores raw records; one without, pre-hashed records.

``lenient_records`` is optional (issue 22; absent means false): a raw record with a key that
no column of the pipeline reads (a misspelt ``"pirce"``) is refused (400 / INVALID_ARGUMENT,
naming the key) unless the model was exported with ``lenient_records=True``; then such keys
are ignored. Either way they are counted. Set it in an existing ``model.json`` to make an
older model lenient.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from embeddb.errors import CorruptDataError, InvalidArgumentError, NotFoundError
from embeddb.trainer.pooling import Pooling

__all__ = [
    "DENSE_FILE",
    "EMBEDDING_FILE",
    "FORMAT",
    "MODEL_FILE",
    "ModelSpec",
    "NonIdSpec",
    "PipelineInputs",
    "check_pipeline",
    "load_model_spec",
]

FORMAT = "embeddb-model/1"
MODEL_FILE = "model.json"
DENSE_FILE = "dense.pt"
EMBEDDING_FILE = "embedding.yaml"
_DTYPES = ("float32",)


class PipelineInputs(Protocol):
    """What :func:`check_pipeline` reads of a
    :class:`~embeddb.features.pipeline.FeaturePipeline`."""

    @property
    def id_features(self) -> tuple[str, ...]: ...
    @property
    def non_id(self) -> tuple[tuple[str, int], ...]: ...


@dataclass(frozen=True)
class NonIdSpec:
    """One non-ID input: its name and per-sample shape (``[]``: one number per sample)."""

    name: str
    shape: tuple[int, ...]
    dtype: str = "float32"

    @property
    def size(self) -> int:
        """Numbers per sample."""
        return math.prod(self.shape)


@dataclass(frozen=True)
class ModelSpec:
    """The parsed ``model.json`` of a model directory (see the module docstring).

    Attributes:
        id_features: ID feature names in the order the dense part receives their embeddings.
        non_id: the non-ID inputs in the order the dense part receives them.
        snapshot_id: the checkpoint (shard snapshot) the dense part was exported with, if any.
        positive: a human label of the positive class, or ``None``.
        output: always ``"logit"``: the dense part returns ``(n, 1)`` logits.
        created: unix time of the export.
        torch: the torch version that exported it.
        pooling: per-feature pooling overrides (feature -> :class:`Pooling`).
        pipeline: the file name of the feature pipeline in the model directory, or ``None``
            (the model reads pre-hashed records only).
        lenient_records: raw records may hold keys no column reads (ignored); false: such a
            record is refused.
        format: ``embeddb-model/1``.
    """

    id_features: tuple[str, ...]
    non_id: tuple[NonIdSpec, ...]
    snapshot_id: str | None = None
    positive: str | None = None
    output: str = "logit"
    created: float = 0.0
    torch: str = ""
    pooling: dict[str, Pooling] = field(default_factory=dict)
    pipeline: str | None = None
    lenient_records: bool = False
    format: str = FORMAT

    def to_json(self) -> dict[str, Any]:
        """The ``model.json`` document."""
        return {
            "format": self.format,
            "snapshot_id": self.snapshot_id,
            "id_features": list(self.id_features),
            "non_id": [
                {"name": s.name, "shape": list(s.shape), "dtype": s.dtype} for s in self.non_id
            ],
            "output": self.output,
            "created": self.created,
            "torch": self.torch,
            "positive": self.positive,
            "pooling": {name: p.value for name, p in self.pooling.items()},
            "pipeline": self.pipeline,
            "lenient_records": self.lenient_records,
        }

    @classmethod
    def from_json(cls, doc: object, source: str = "model.json") -> ModelSpec:
        """Validate a parsed ``model.json``.

        Raises:
            CorruptDataError: a missing or malformed field, or another format.
        """

        def bad(why: str) -> CorruptDataError:
            return CorruptDataError(f"{source}: {why}")

        if not isinstance(doc, dict):
            raise bad("must be a JSON object")
        if doc.get("format") != FORMAT:
            raise bad(f"format must be {FORMAT!r}, got {doc.get('format')!r}")
        ids = doc.get("id_features")
        if not isinstance(ids, list) or not all(isinstance(n, str) and n for n in ids):
            raise bad("id_features must be a list of feature names")
        if len(set(ids)) != len(ids):
            raise bad(f"id_features names a feature twice: {ids}")
        raw_non_id = doc.get("non_id")
        if not isinstance(raw_non_id, list):
            raise bad("non_id must be a list of {name, shape, dtype}")
        non_id: list[NonIdSpec] = []
        for i, item in enumerate(raw_non_id):
            if not (isinstance(item, dict) and isinstance(item.get("name"), str)):
                raise bad(f"non_id[{i}] needs a name")
            shape = item.get("shape")
            if not isinstance(shape, list) or not all(
                isinstance(d, int) and not isinstance(d, bool) and d >= 1 for d in shape
            ):
                raise bad(f"non_id[{i}].shape must be a list of positive integers, got {shape!r}")
            dtype = item.get("dtype", "float32")
            if dtype not in _DTYPES:
                raise bad(f"non_id[{i}].dtype must be one of {_DTYPES}, got {dtype!r}")
            non_id.append(NonIdSpec(item["name"], tuple(shape), dtype))
        if len({s.name for s in non_id}) != len(non_id):
            raise bad("non_id names an input twice")
        if not ids and not non_id:
            raise bad("the model reads no input (id_features and non_id are empty)")
        if doc.get("output", "logit") != "logit":
            raise bad(f"output must be 'logit', got {doc.get('output')!r}")
        snapshot_id = doc.get("snapshot_id")
        positive = doc.get("positive")
        pipeline = doc.get("pipeline")
        for key, value in (
            ("snapshot_id", snapshot_id),
            ("positive", positive),
            ("pipeline", pipeline),
        ):
            if value is not None and not isinstance(value, str):
                raise bad(f"{key} must be a string or null, got {value!r}")
        if pipeline is not None and (
            pipeline in ("", ".", "..") or "/" in pipeline or "\\" in pipeline
        ):
            raise bad(f"pipeline must be a file name in the model directory, got {pipeline!r}")
        lenient = doc.get("lenient_records", False)
        if not isinstance(lenient, bool):
            raise bad(f"lenient_records must be true or false, got {lenient!r}")
        created = doc.get("created", 0.0)
        if not isinstance(created, (int, float)) or isinstance(created, bool):
            raise bad(f"created must be a unix time, got {created!r}")
        raw_pooling = doc.get("pooling") or {}
        try:
            pooling = {str(k): Pooling(v) for k, v in dict(raw_pooling).items()}
        except (TypeError, ValueError) as exc:
            raise bad(f"pooling: {exc}") from exc
        return cls(
            id_features=tuple(ids),
            non_id=tuple(non_id),
            snapshot_id=snapshot_id,
            positive=positive,
            created=float(created),
            torch=str(doc.get("torch", "")),
            pooling=pooling,
            pipeline=pipeline,
            lenient_records=lenient,
        )


def load_model_spec(model_dir: str | os.PathLike[str]) -> ModelSpec:
    """Read and validate ``model_dir/model.json``.

    Raises:
        NotFoundError: no such directory, or no ``model.json`` in it (not an exported model,
            or an export that did not finish).
        CorruptDataError: ``model.json`` is not valid JSON or not a valid model description.
    """
    directory = Path(model_dir)
    if not directory.is_dir():
        raise NotFoundError(f"model directory {directory} does not exist")
    path = directory / MODEL_FILE
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise NotFoundError(
            f"{path} does not exist: {directory} is not an exported model (or its export did "
            "not finish)"
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise CorruptDataError(f"cannot read {path}: {exc}") from exc
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise CorruptDataError(f"{path} is not valid JSON: {exc}") from exc
    return ModelSpec.from_json(doc, str(path))


def check_pipeline(pipeline: PipelineInputs, spec: ModelSpec, where: str = "") -> None:
    """Check that ``pipeline`` builds the batches the model of ``spec`` reads.

    Args:
        pipeline: the feature pipeline.
        spec: the model's inputs (``model.json``).
        where: a prefix of the error message (the model directory), or empty.

    Raises:
        InvalidArgumentError: the pipeline's ID features are not the model's (names and
            order), or its non-ID features are not the model's inputs (names, widths, order:
            each input a vector of the pipeline's width).
    """
    prefix = f"{where}: " if where else ""
    ids = tuple(pipeline.id_features)
    if ids != tuple(spec.id_features):
        raise InvalidArgumentError(
            f"{prefix}the feature pipeline's ID features {list(ids)} are not the model's "
            f"{list(spec.id_features)} (names and order)"
        )
    built = [(str(name), (int(width),)) for name, width in pipeline.non_id]
    reads = [(s.name, tuple(s.shape)) for s in spec.non_id]
    if built != reads:
        raise InvalidArgumentError(
            f"{prefix}the feature pipeline's non-ID features {built} (name, shape) are not "
            f"the model's inputs {reads}"
        )
