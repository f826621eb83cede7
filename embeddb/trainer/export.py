"""Export a trained dense model as a model directory (see :mod:`embeddb.serving`).

The dense part is compiled with ``torch.jit.script``; a model TorchScript cannot compile
(``[*a, *b]``, ``list[Any]`` annotations, Python control flow on values) is traced with
``torch.jit.trace`` instead, on example inputs: an example batch's non-ID features and random
embeddings of the config's dims. Either way the compiled module is checked against the eager
model on those inputs before anything is written.

With a feature pipeline (``pipeline=``, the :class:`~embeddb.features.pipeline.FeaturePipeline`
that built the training batches) the directory also holds it (``features.json``), and the
served model scores raw records through it; its ID features and non-ID inputs must be the
example batch's, in the same order.

Written atomically: the files go to a temporary sibling directory, ``model.json`` last, which
is then renamed into place. An existing complete model directory (one with ``model.json``) is
replaced only with ``overwrite=True``; an incomplete one (no ``model.json``) is replaced.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import json
import logging
import os
import shutil
import time
import uuid
import warnings
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
import yaml
from torch import nn

from embeddb.config import EmbeddingConfig
from embeddb.errors import InvalidArgumentError
from embeddb.features.batch import Batch
from embeddb.trainer.model_spec import (
    DENSE_FILE,
    EMBEDDING_FILE,
    MODEL_FILE,
    ModelSpec,
    NonIdSpec,
    check_pipeline,
)
from embeddb.trainer.pooling import Pooling, PoolingSpec

if TYPE_CHECKING:
    from embeddb.features.pipeline import FeaturePipeline

__all__ = ["export_model"]

logger = logging.getLogger(__name__)

_EXAMPLE_ROWS = 4  # rows of the synthetic example when no example batch is given


@contextlib.contextmanager
def quiet_jit() -> Iterator[None]:
    """Silence TorchScript's deprecation warnings (torch >= 2.10 warns on script, trace, save
    and load; TorchScript stays the format TorchServe and C++ runtimes load)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r".*torch\.jit", category=DeprecationWarning)
        yield


def export_model(
    model: nn.Module,
    directory: str | os.PathLike[str],
    *,
    embedding_config: EmbeddingConfig,
    example: Batch | None,
    snapshot_id: str | None = None,
    positive: str | None = None,
    non_id_shapes: Mapping[str, Sequence[int]] | None = None,
    pooling: Mapping[str, Pooling] | None = None,
    pipeline: FeaturePipeline | None = None,
    lenient_records: bool = False,
    overwrite: bool = False,
) -> Path:
    """Write ``model`` (its dense part) with its embedding config as a model directory.

    Args:
        model: the dense model, ``forward(non_id, embeddings) -> (n, 1)`` logits; left
            unchanged (a copy on the CPU, in eval mode, is compiled).
        directory: the model directory to write.
        embedding_config: the job's embedding config (written as ``embedding.yaml``).
        example: a batch as the model is trained on: it fixes the order of the ID features
            and the names and shapes of the non-ID inputs. ``None``: the ID features in the
            config's order and ``non_id_shapes``.
        snapshot_id: the shard snapshot (checkpoint id) the dense part goes with.
        positive: a human label of the positive class.
        non_id_shapes: name -> per-sample shape of each non-ID input, in order (when there is
            no ``example``).
        pooling: the trainer's per-feature pooling overrides (``TrainerConfig.pooling``).
        pipeline: the feature pipeline that built the training batches, written as
            ``features.json``: the served model then scores raw records through it.
        lenient_records: the served model ignores keys of raw records that no column reads
            (counted) instead of refusing the record (``model.json``'s ``lenient_records``).
        overwrite: replace an existing complete model directory.

    Returns:
        The model directory.

    Raises:
        InvalidArgumentError: ``directory`` holds a model and ``overwrite`` is false; neither
            ``example`` nor ``non_id_shapes``; an ID feature the config lacks; a sequence
            feature (not supported: the dense part takes one tensor per feature); the model
            can be neither scripted nor traced, or its output is not ``(n, 1)``; a
            ``pipeline`` whose ID features or non-ID inputs (names, widths, order) are not
            the example's; ``lenient_records`` without a ``pipeline``.
    """
    target = Path(directory)
    if (target / MODEL_FILE).exists() and not overwrite:
        raise InvalidArgumentError(
            f"{target} already holds an exported model; pass overwrite=True to replace it"
        )
    overrides = {str(k): Pooling(v) for k, v in dict(pooling or {}).items()}
    spec = _spec(embedding_config, example, non_id_shapes, snapshot_id, positive, overrides)
    if pipeline is not None:
        from embeddb.features.pipeline import PIPELINE_FILE

        check_pipeline(pipeline, spec)
        spec = dataclasses.replace(spec, pipeline=PIPELINE_FILE, lenient_records=lenient_records)
    elif lenient_records:
        raise InvalidArgumentError(
            "lenient_records applies to raw records: export the model with its pipeline"
        )
    non_id, embeddings = _example_inputs(spec, embedding_config, example)
    eager = copy.deepcopy(model).to("cpu").eval()
    compiled, how = _compile(eager, non_id, embeddings)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = target.parent / f".{target.name}.tmp-{uuid.uuid4().hex[:8]}"
    staging.mkdir()
    try:
        with quiet_jit():
            torch.jit.save(compiled, str(staging / DENSE_FILE))
        text = yaml.safe_dump(embedding_config.to_dict(), sort_keys=False)
        (staging / EMBEDDING_FILE).write_text(text, encoding="utf-8")
        if pipeline is not None and spec.pipeline is not None:
            from embeddb.features.pipeline import save_pipeline

            save_pipeline(pipeline, staging / spec.pipeline)
        _write_json(staging / MODEL_FILE, spec.to_json())  # last: the directory is complete
        _replace(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    logger.info("exported the model (%s) to %s", how, target)
    return target


def _spec(
    config: EmbeddingConfig,
    example: Batch | None,
    non_id_shapes: Mapping[str, Sequence[int]] | None,
    snapshot_id: str | None,
    positive: str | None,
    pooling: dict[str, Pooling],
) -> ModelSpec:
    if example is not None:
        id_features = tuple(f.name for f in example.id_type_features)
        non_id = tuple(
            NonIdSpec(f.name or f"non_id_{i}", tuple(int(d) for d in f.data.shape[1:]))
            for i, f in enumerate(example.non_id_type_features)
        )
    elif non_id_shapes is not None:
        id_features = tuple(config.features)
        non_id = tuple(
            NonIdSpec(str(name), tuple(int(d) for d in shape))
            for name, shape in non_id_shapes.items()
        )
    else:
        raise InvalidArgumentError(
            "export needs an example batch or non_id_shapes (the non-ID inputs' shapes)"
        )
    for name in id_features:
        feature = config.features.get(name)
        if feature is None:
            raise InvalidArgumentError(f"ID feature {name!r} is not in the embedding config")
        if PoolingSpec.of(feature, pooling.get(name)).sequence:
            raise InvalidArgumentError(
                f"feature {name!r} is a sequence feature (embedding_summation: false); "
                "exported models support pooled features only"
            )
    for s in non_id:
        if any(d < 1 for d in s.shape):
            raise InvalidArgumentError(f"non-ID input {s.name!r} has an empty shape {s.shape}")
    if len({s.name for s in non_id}) != len(non_id):
        raise InvalidArgumentError(f"non-ID inputs need distinct names: {non_id}")
    return ModelSpec(
        id_features=id_features,
        non_id=non_id,
        snapshot_id=snapshot_id,
        positive=positive,
        created=time.time(),
        torch=torch.__version__,
        pooling={k: v for k, v in pooling.items() if k in id_features},
    )


def _example_inputs(
    spec: ModelSpec, config: EmbeddingConfig, example: Batch | None
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Non-ID inputs (the example's first rows, else zeros) and random embeddings."""
    rows = _EXAMPLE_ROWS if example is None else max(1, min(example.batch_size, 64))
    if example is not None:
        non_id = [
            torch.from_numpy(np.ascontiguousarray(f.data[:rows], dtype=np.float32))
            for f in example.non_id_type_features
        ]
    else:
        non_id = [torch.zeros((rows, *s.shape)) for s in spec.non_id]
    generator = torch.Generator().manual_seed(0)
    embeddings = [
        0.1 * torch.randn(rows, config.features[name].dim, generator=generator)
        for name in spec.id_features
    ]
    return non_id, embeddings


def _compile(
    model: nn.Module, non_id: list[torch.Tensor], embeddings: list[torch.Tensor]
) -> tuple[torch.jit.ScriptModule, str]:
    with torch.no_grad():
        expected = model(non_id, embeddings)
    rows = _rows(non_id, embeddings)
    if not isinstance(expected, torch.Tensor) or expected.shape != (rows, 1):
        shape = tuple(expected.shape) if isinstance(expected, torch.Tensor) else type(expected)
        raise InvalidArgumentError(f"the model must return (n, 1) logits, got {shape}")
    compiled: torch.jit.ScriptModule | None = None
    how = "script"
    errors: list[str] = []
    with quiet_jit():
        try:
            compiled = torch.jit.script(model)
        except Exception as exc:  # TorchScript's frontend raises many types
            errors.append(f"script: {type(exc).__name__}: {str(exc).strip().splitlines()[0]}")
            logger.info("torch.jit.script failed (%s); tracing instead", errors[-1])
        if compiled is not None and not _agrees(compiled, non_id, embeddings, expected):
            errors.append("script: the scripted module disagrees with the eager model")
            compiled = None
        if compiled is None:
            how = "trace"
            try:
                compiled = torch.jit.trace(  # type: ignore[no-untyped-call]
                    model, (non_id, embeddings), check_trace=False
                )
            except Exception as exc:
                errors.append(f"trace: {type(exc).__name__}: {exc}")
                raise InvalidArgumentError(
                    "the model can be neither scripted nor traced: " + "; ".join(errors)
                ) from exc
            if not _agrees(compiled, non_id, embeddings, expected):
                raise InvalidArgumentError(
                    "the traced module disagrees with the eager model on the example "
                    "(data-dependent control flow?); " + "; ".join(errors)
                )
    assert compiled is not None
    return compiled, how


def _rows(non_id: list[torch.Tensor], embeddings: list[torch.Tensor]) -> int:
    return int((non_id or embeddings)[0].shape[0])


def _agrees(
    compiled: torch.jit.ScriptModule,
    non_id: list[torch.Tensor],
    embeddings: list[torch.Tensor],
    expected: torch.Tensor,
) -> bool:
    try:
        with torch.no_grad():
            got = compiled(non_id, embeddings)
    except Exception:
        return False
    return isinstance(got, torch.Tensor) and bool(
        got.shape == expected.shape and torch.allclose(got, expected, rtol=1e-4, atol=1e-5)
    )


def _write_json(path: Path, doc: object) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(doc, fh, indent=2)
        fh.write("\n")
        fh.flush()
        os.fsync(fh.fileno())


def _replace(staging: Path, target: Path) -> None:
    """Rename ``staging`` to ``target``; an existing ``target`` is moved aside first and
    removed after (there is a moment without ``target``, never one with half a model)."""
    if not target.exists():
        os.replace(staging, target)
        return
    aside = target.parent / f".{target.name}.old-{uuid.uuid4().hex[:8]}"
    os.replace(target, aside)
    try:
        os.replace(staging, target)
    except BaseException:
        os.replace(aside, target)
        raise
    shutil.rmtree(aside, ignore_errors=True)
