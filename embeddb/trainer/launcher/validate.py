"""The job's validation step, run by ``embeddb train`` before any shard or NN worker starts:
``python -m embeddb.trainer.launcher.validate JOB.yaml --run-dir RUN``.

What it checks and writes (a job that passes has its data, features and model known good)::

    JobConfig.from_yaml(JOB)              every key (the launcher has checked them too)
    DatasetSpec.fit()                     a bounded sample of train: columns, values, labels,
                                          standardize statistics, order_by threshold
    check_label_classes()                 the first 100,000 rows of the training split hold
                                          both label classes (else: the values seen)
      -> RUN/features.json                the fitted FeaturePipeline (every rank loads it)
      -> RUN/embedding.yaml               with ``embedding_config: auto``: one table per ID
                                          feature, dim ``embedding_dim`` (auto_embedding_yaml);
                                          written by the launcher already when the job file
                                          names the features: then checked to be the fitted
                                          pipeline's (launcher.auto_embedding.check_ahead)
    the model                             builtin:NAME built for the pipeline's widths, or
                                          FILE.py:NAME / module:NAME imported and called
    forward on a sample batch             random embeddings of the config's dims; the output
                                          must be finite logits of shape (n, 1)

Any failure exits with code 2 and ONE line on stderr, ``embeddb: CONFIG ERROR: <message>``
(the message names the key and the job file's line, or the data file's line), which the
launcher raises as :class:`~embeddb.errors.ConfigError`. Imports torch (the launcher does not),
but for the model only: with ``--no-model`` (a one-worker job) it imports no torch and writes
the sample batch to ``RUN/sample-batch.bin`` (:data:`SAMPLE_FILE`, a loader frame), and the
job's held rank checks the model on it (:func:`check_model`) before it trains, writing the
same error line to ``RUN/invalid-job.txt`` (:mod:`embeddb.trainer.launcher.direct`).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from embeddb.config import EmbeddingConfig
from embeddb.errors import ConfigError, CorruptDataError, EmbeddbError
from embeddb.features.batch import Batch
from embeddb.features.pipeline import PIPELINE_FILE, FeaturePipeline, save_pipeline
from embeddb.trainer.launcher.auto_embedding import (
    auto_embedding_yaml,
    check_ahead,
    job_ram_budget,
)
from embeddb.trainer.launcher.job import CONFIG_ERROR, EMBEDDING_FILE, EXIT_CONFIG_ERROR, JobConfig
from embeddb.trainer.launcher.label_check import check_label_classes
from embeddb.trainer.launcher.loader import decode_batch, encode_batch

if TYPE_CHECKING:
    from torch import nn

__all__ = [
    "CONFIG_ERROR",
    "EXIT_CONFIG_ERROR",
    "auto_embedding_yaml",
    "build_job_model",
    "check_model",
    "error_line",
    "load_model",
    "main",
    "sample_batch",
    "sample_forward",
    "validate",
]


SAMPLE_ROWS = 64  # rows of the sample batch the model is run on
SAMPLE_FILE = "sample-batch.bin"  # RUN/: the sample batch of a --no-model step (a loader frame)


def load_model(job: JobConfig) -> nn.Module:
    """Build the job's model from ``FILE.py:NAME`` (relative to the job file) or
    ``module:NAME``, called with ``model_args``.

    Raises:
        ConfigError: naming ``model`` (and its line): no such file or module, no such name,
            a failing constructor, or something that is not a ``torch.nn.Module``.
    """
    from torch import nn

    target, name = job.model.rsplit(":", 1)
    try:
        if target.endswith(".py"):
            path = (job.base_dir / target).resolve()
            if not path.is_file():
                raise ConfigError("model", f"no such model file: {path}")
            spec = importlib.util.spec_from_file_location(f"embeddb_job_model_{path.stem}", path)
            if spec is None or spec.loader is None:
                raise ConfigError("model", f"cannot import {path}")
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
        else:
            module = importlib.import_module(target)
    except ConfigError:
        raise
    except Exception as exc:
        raise ConfigError("model", f"importing {target} failed: {_short(exc)}") from exc
    factory = getattr(module, name, None)
    if factory is None:
        known = sorted(
            k for k, v in vars(module).items() if isinstance(v, type) and issubclass(v, nn.Module)
        )
        hint = f" (its nn.Module classes: {', '.join(known)})" if known else ""
        raise ConfigError("model", f"{target} has no {name!r}{hint}")
    try:
        model = factory(**job.model_args)
    except Exception as exc:
        raise ConfigError("model_args", f"{job.model}(**model_args) failed: {_short(exc)}") from exc
    if not isinstance(model, nn.Module):
        raise ConfigError(
            "model", f"{job.model} built a {type(model).__name__}, not a torch.nn.Module"
        )
    return model


def build_job_model(
    job: JobConfig, pipeline: FeaturePipeline, embedding_config: EmbeddingConfig
) -> nn.Module:
    """The job's model: ``builtin:NAME`` built for the pipeline's non-ID widths and the
    embedding config's dims of its ID features, or :func:`load_model`.

    Raises:
        ConfigError: naming ``model`` or ``model_args``.
    """
    builtin = job.builtin_model
    if builtin is None:
        return load_model(job)
    from embeddb.trainer.models import build_model

    id_dims = [embedding_config.features[name].dim for name in pipeline.id_features]
    widths = [width for _, width in pipeline.non_id]
    try:
        return build_model(builtin, id_dims=id_dims, non_id_widths=widths, **job.model_args)
    except ConfigError:
        raise
    except Exception as exc:  # a model_arg of the wrong type reaching a torch constructor
        raise ConfigError("model_args", f"{job.model}: {_short(exc)}") from exc


def sample_forward(model: nn.Module, batch: Batch, embedding_config: EmbeddingConfig) -> None:
    """Run ``model`` on ``batch`` with random embeddings of the config's dims, as the
    training context would call it; the output must be finite ``(n, 1)`` logits.

    Raises:
        ConfigError: naming ``model``: forward failed or returned something else.
    """
    import torch

    n = batch.batch_size
    non_id = [torch.from_numpy(np.array(f.data)) for f in batch.non_id_type_features]
    embeddings: list[Any] = []
    for feature in batch.id_type_features:
        config = embedding_config.features[feature.name]
        if config.embedding_summation:
            embeddings.append(torch.randn(n, config.dim) * 0.05)
        else:
            length = config.sample_fixed_size
            mask = torch.zeros(n, length, dtype=torch.bool)
            counts = torch.from_numpy(np.minimum(feature.counts(), length))
            mask[torch.arange(length)[None, :] < counts[:, None]] = True
            embeddings.append((torch.randn(n, length, config.dim) * 0.05, mask))
    try:
        with torch.no_grad():
            output = model(non_id, embeddings)
    except Exception as exc:
        raise ConfigError("model", f"forward on a sample batch failed: {_short(exc)}") from exc
    if not isinstance(output, torch.Tensor) or tuple(output.shape) != (n, 1):
        shape = tuple(output.shape) if isinstance(output, torch.Tensor) else type(output).__name__
        raise ConfigError(
            "model", f"forward must return logits of shape ({n}, 1) for {n} samples, got {shape}"
        )
    if not torch.isfinite(output).all():
        raise ConfigError("model", "forward on a sample batch returned non-finite logits")


def validate(job: JobConfig, run_dir: Path, *, model: bool = True) -> FeaturePipeline:
    """Fit the pipeline, write ``RUN/features.json`` (and the auto ``RUN/embedding.yaml``),
    read the sample batch, build the model and run it on the sample batch (see the module
    docstring); ``model=False``: no model (:func:`check_model` later, no torch here).

    Raises:
        ConfigError: any problem, naming the key and its line or the data file's line.
    """
    try:
        pipeline = job.dataset_spec.fit()
        check_label_classes(job, pipeline)
    except CorruptDataError as exc:
        raise ConfigError("dataset", str(exc)) from exc
    run_dir.mkdir(parents=True, exist_ok=True)
    save_pipeline(pipeline, run_dir / PIPELINE_FILE)
    if job.auto_embedding:
        written = run_dir / EMBEDDING_FILE
        if written.is_file():  # by the launcher, from the job file (launcher.auto_embedding)
            ahead = written.read_text(encoding="utf-8")
            check_ahead(
                ahead,
                pipeline.id_features,
                job.embedding_dim,
                ram_budget=job_ram_budget(job),
                shards=job.shard_count,
            )
        else:  # the data seen: each table sized from its distinct ids where fit counted them
            text = auto_embedding_yaml(
                pipeline.id_features,
                job.embedding_dim,
                ram_budget=job_ram_budget(job),
                shards=job.shard_count,
                distinct=pipeline.distinct_ids,
            )
            written.write_text(text, encoding="utf-8")
    try:
        embedding_config = EmbeddingConfig.from_yaml(job.embedding_config_path(run_dir))
    except ConfigError as exc:
        raise ConfigError("embedding_config", str(exc)) from exc
    missing = [f for f in pipeline.id_features if f not in embedding_config.features]
    if missing:
        raise ConfigError(
            "embedding_config",
            f"has no feature {missing[0]!r} of the dataset's ID features "
            f"({', '.join(pipeline.id_features)}); use embedding_config: auto or add it",
        )
    if not model:  # its data errors are the step's; the rank's check reads it (no numba there)
        batch = sample_batch(job, pipeline)
        (run_dir / SAMPLE_FILE).write_bytes(b"".join(encode_batch(batch)))
        return pipeline
    built = build_job_model(job, pipeline, embedding_config)  # first: as check_model does
    sample_forward(built, sample_batch(job, pipeline), embedding_config)
    return pipeline


def sample_batch(job: JobConfig, pipeline: FeaturePipeline) -> Batch:
    """The first :data:`SAMPLE_ROWS` rows of the training split, the model's sample batch.

    Raises:
        ConfigError: the rows are unreadable, or there are none.
    """
    try:
        reader = job.dataset_spec.reader(pipeline, "train", SAMPLE_ROWS, train=True)
        batch = next(iter(reader), None)
    except CorruptDataError as exc:
        raise ConfigError("dataset", str(exc)) from exc
    if batch is None:
        raise ConfigError("dataset.train", "the training split holds no rows")
    return batch


def check_model(
    job: JobConfig,
    pipeline: FeaturePipeline,
    embedding_config: EmbeddingConfig,
    run_dir: Path | None = None,
) -> None:
    """The model part of :func:`validate` (a held rank's, :mod:`embeddb.trainer.launcher.direct`,
    when the validation step ran with ``--no-model``): build it, run it on the sample batch
    (the one the step wrote to ``RUN/sample-batch.bin``, else read here).

    Raises:
        ConfigError: naming ``model`` or ``model_args``.
    """
    built = build_job_model(job, pipeline, embedding_config)
    written = None if run_dir is None else run_dir / SAMPLE_FILE
    if written is not None and written.is_file():
        batch = decode_batch(bytearray(written.read_bytes()))
    else:
        batch = sample_batch(job, pipeline)
    sample_forward(built, batch, embedding_config)


def error_line(job: JobConfig | None, exc: EmbeddbError) -> str:
    """The message of the validation step's one error line: ``exc`` naming the job file's
    line of its key."""
    error = exc if isinstance(exc, ConfigError) or job is None else ConfigError("", str(exc))
    if job is not None and isinstance(error, ConfigError):
        from embeddb.trainer.launcher.job_yaml import Where, with_line

        if isinstance(job.where, Where):
            error = with_line(error, job.where)
    return " ".join(str(error).split())


def _short(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")


def main(argv: list[str] | None = None) -> int:
    """Validate the job; 0 when it is good, 2 (one ``CONFIG ERROR`` line on stderr) if not."""
    parser = argparse.ArgumentParser(prog="python -m embeddb.trainer.launcher.validate")
    parser.add_argument("job", type=Path, help="the training job YAML")
    parser.add_argument("--run-dir", type=Path, required=True, help="the job's run directory")
    parser.add_argument(
        "--no-model",
        action="store_true",
        help="leave the model to the job's one rank (check_model): no torch here",
    )
    args = parser.parse_args(argv)
    job: JobConfig | None = None
    try:
        job = JobConfig.from_yaml(args.job)
        validate(job, args.run_dir, model=not args.no_model)
    except EmbeddbError as exc:
        print(CONFIG_ERROR + error_line(job, exc), file=sys.stderr, flush=True)
        return EXIT_CONFIG_ERROR
    return 0


if __name__ == "__main__":
    sys.exit(main())
