"""One NN worker's training (torch): what ``python -m embeddb.trainer.launcher.run`` runs once it
has
parsed its arguments. :mod:`embeddb.trainer.launcher.run` (the torch-free entry point) documents the
data loader, the step alignment across ranks, checkpoints and resumption, evaluation and how a
failing rank reports."""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from collections import deque
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from embeddb.common.evaluation import auc
from embeddb.common.progress import Progress
from embeddb.config import EmbeddingConfig
from embeddb.errors import ConfigError, UnauthenticatedError
from embeddb.features.batch import Batch
from embeddb.features.pipeline import PIPELINE_FILE, FeaturePipeline, load_pipeline
from embeddb.trainer.checkpoints.files import latest_checkpoint
from embeddb.trainer.config import TrainerConfig
from embeddb.trainer.ctx import TrainCtx, start_worker
from embeddb.trainer.embedding.worker import EmbeddingWorkerConfig
from embeddb.trainer.embedding_ctx import EmbeddingStage
from embeddb.trainer.launcher.direct import INVALID_FILE
from embeddb.trainer.launcher.job import EXIT_CONFIG_ERROR, JobConfig
from embeddb.trainer.launcher.loader import BatchStream, loader_command
from embeddb.trainer.launcher.resume import record_steps_per_epoch, resume_point
from embeddb.trainer.launcher.startup import marks_from, phases, process_started, startup_s
from embeddb.trainer.launcher.validate import (
    build_job_model,
    check_model,
    error_line,
    load_model,
    validate,
)

__all__ = ["load_model", "train", "warm_up"]

_IMPORTED = time.time()  # the start-up timeline's "rank_imports" mark (torch imported)

_PROGRESS_S = 10.0  # a plain progress line this often when stdout is not a terminal
_FIELDS_S = 0.5  # the fields (loss, AUC over the last batches) refreshed this often
_WARMUP_STEPS = 10  # left out of the steady-state rate (start-up: first lookups, row inserts)


def warm_up() -> None:
    """Import now what training imports on first use: torch's first optimizer imports
    ``torch._dynamo`` (about a second). A held rank (:mod:`embeddb.trainer.launcher.direct`)
    calls it while the launcher validates the job and starts the shards."""
    torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)


def _optimizer(job: JobConfig, model: nn.Module) -> torch.optim.Optimizer:
    kwargs = {k: v for k, v in job.optimizer.items() if k != "type"}
    kind = {"adam": torch.optim.Adam, "adagrad": torch.optim.Adagrad, "sgd": torch.optim.SGD}
    optimizer: torch.optim.Optimizer = kind[job.optimizer["type"]](model.parameters(), **kwargs)
    return optimizer


def _aligned(batches: Iterator[Batch], distributed: bool) -> Iterator[Batch]:
    """``batches`` while every rank has one: a MIN all-reduce of "I have a batch" per step."""
    while True:
        batch = next(batches, None)
        if distributed:
            flag = torch.tensor([0 if batch is None else 1], dtype=torch.int32)
            dist.all_reduce(flag, op=dist.ReduceOp.MIN)
            if not int(flag.item()):
                return
        elif batch is None:
            return
        assert batch is not None
        yield batch


class _Epochs:
    """This rank's batches of epochs ``first ..`` as one aligned stream, recording at which
    step each epoch ends (known ahead of training: the context prepares batches ahead)."""

    def __init__(
        self,
        job: JobConfig,
        job_path: Path,
        run_dir: Path,
        pipeline: FeaturePipeline,
        *,
        rank: int,
        world: int,
        first: int,
        skip: int,
        start_step: int,
    ) -> None:
        self.job, self.job_path, self.run_dir, self.pipeline = job, job_path, run_dir, pipeline
        self.rank, self.world, self.first, self.skip = rank, world, first, skip
        self.ends: dict[int, int] = {}  # step at which an epoch ends -> that epoch (0-based)
        self._step = start_step
        self._memory: list[Batch] | None = None
        self._stream: BatchStream | None = None

    def load(self) -> None:
        """Start the data loader (or, with ``in_memory``, read the rank's part now)."""
        if self.job.in_memory:
            reader = self.job.dataset_spec.reader(
                self.pipeline,
                "train",
                self.job.batch_size,
                train=True,
                rank=self.rank,
                world=self.world,
                epoch=0,
                seed=self.job.seed,
            )
            self._memory = list(reader)
        else:
            command = loader_command(
                self.job_path,
                self.run_dir,
                rank=self.rank,
                world=self.world,
                epochs=(self.first, self.job.epochs),
                batch_size=self.job.batch_size,
                skip=self.skip,
            )
            self._stream = BatchStream(command)

    def __iter__(self) -> Iterator[Batch]:
        distributed = self.world > 1
        for epoch in range(self.first, self.job.epochs):
            skip = self.skip if epoch == self.first else 0
            if self._memory is not None:
                source: Iterator[Batch] = iter(self._memory[skip:])
            else:
                assert self._stream is not None
                source = self._stream.epoch()
            for batch in _aligned(source, distributed):
                self._step += 1
                yield batch
            self.ends[self._step] = epoch
            for _ in source:  # this rank's leftover of the epoch (another rank ran out)
                pass

    def close(self) -> None:
        if self._stream is not None:
            self._stream.close()


def train(
    job: JobConfig,
    job_path: Path,
    addresses: Path | Sequence[str],
    run_dir: Path | None,
    predict: int,
    *,
    finished: bool = False,
    check: bool = False,
) -> dict[str, Any]:
    """Train ``job`` on the shards of the address file; rank 0 returns the final metrics.

    ``run_dir``: where ``embeddb train``'s validation step wrote ``features.json`` (and the
    auto ``embedding.yaml``); ``None`` (torchrun started by hand, Kubernetes): this rank fits
    them itself into a private temporary directory (the fit is deterministic, so every rank
    gets the same pipeline). ``finished``: the launcher found the job finished
    (:func:`embeddb.trainer.launcher.resume.finished`): load the latest checkpoint, export and
    predict
    as the job asks, train and evaluate nothing (one rank). ``check``: check the model first,
    as the validation step would have (a held rank, :mod:`embeddb.trainer.launcher.direct`):
    its error goes to ``RUN/invalid-job.txt`` and the process exits with code 2.
    """
    if run_dir is None:
        with tempfile.TemporaryDirectory(prefix="embeddb-rank-") as own:
            validate(job, Path(own))
            return train(job, job_path, addresses, Path(own), predict, finished=finished)
    marks = marks_from(os.environ)  # the launcher's start-up marks (launcher.startup)
    marks.update(rank_process=process_started(), rank_imports=_IMPORTED)
    pipeline = load_pipeline(run_dir / PIPELINE_FILE)
    embedding_config = EmbeddingConfig.from_yaml(job.embedding_config_path(run_dir))
    config = TrainerConfig(
        mode=job.mode,  # type: ignore[arg-type]
        torch_threads=job.threads,  # None: the core budget (OMP_NUM_THREADS from the launcher)
        embedding_stage=job.embedding_stage,
        worker=EmbeddingWorkerConfig(
            max_staleness=job.max_staleness,
            metrics_port=job.metrics_port,
            token=job.read_token(),
            network=job.network(),
        ),
    )
    # The embedding worker starts first, in a thread: its spawn (about a second) overlaps the
    # model's check and construction, the optimizer's and the data loader's start.
    began = time.perf_counter()  # warm-up: the embedding worker's start + warm-up steps
    starting = None if finished else _start_worker(embedding_config, addresses, config)
    try:
        return _build_and_train(
            job, job_path, addresses, run_dir, predict, marks, pipeline, embedding_config,
            config, starting, began, finished=finished, check=check,
        )  # fmt: skip
    finally:
        if starting is not None:
            _close_started(starting)  # closed already when a context took it: idempotent


def _start_worker(
    embedding_config: EmbeddingConfig, addresses: Path | Sequence[str], config: TrainerConfig
) -> Future[EmbeddingStage]:
    """The embedding worker's start (:func:`embeddb.trainer.ctx.start_worker`) in a thread."""
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="embedding-worker-start")
    try:
        return pool.submit(start_worker, embedding_config, addresses, config)
    finally:
        pool.shutdown(wait=False)


def _close_started(starting: Future[EmbeddingStage]) -> None:
    """Close the worker ``starting`` started (once started); nothing when its start failed
    (that error is raised where the training context awaits it)."""
    try:
        worker = starting.result()
    except BaseException:
        return
    worker.close()


def _build_and_train(
    job: JobConfig,
    job_path: Path,
    addresses: Path | Sequence[str],
    run_dir: Path,
    predict: int,
    marks: dict[str, float],
    pipeline: FeaturePipeline,
    embedding_config: EmbeddingConfig,
    config: TrainerConfig,
    starting: Future[EmbeddingStage] | None,
    began: float,
    *,
    finished: bool,
    check: bool,
) -> dict[str, Any]:
    """:func:`train` once the pipeline and the embedding config are read."""
    if finished:
        model, optimizer = _model(job, run_dir, pipeline, embedding_config, marks, check=check)
        with _started(job, model, optimizer, embedding_config, addresses, config) as ctx:
            _resume(job, ctx)
            if ctx.dist_env.rank == 0:
                _export(ctx, job, pipeline, trained=False)
                if predict:
                    with ctx.eval_ctx() as ev:
                        _predict(ev, job, pipeline, predict)
        return {}
    # The data loader starts first: it warms up while the model is checked and built and the
    # embedding worker starts.
    last = latest_checkpoint(job.checkpoint_dir) if job.checkpoint_dir is not None else None
    start_step = last.step if last is not None else 0
    first, skip = resume_point(job, start_step)
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    epochs = _Epochs(
        job,
        job_path,
        run_dir,
        pipeline,
        rank=rank,
        world=world,
        first=first,
        skip=skip,
        start_step=start_step,
    )
    try:
        epochs.load()
        marks["loader_started"] = time.time()
        model, optimizer = _model(job, run_dir, pipeline, embedding_config, marks, check=check)
        with _started(job, model, optimizer, embedding_config, addresses, config, starting) as ctx:
            marks["embedding_worker"] = time.time()
            return _train(job, ctx, epochs, pipeline, predict, began, marks)
    finally:
        epochs.close()


def _model(
    job: JobConfig,
    run_dir: Path,
    pipeline: FeaturePipeline,
    embedding_config: EmbeddingConfig,
    marks: dict[str, float],
    *,
    check: bool,
) -> tuple[nn.Module, torch.optim.Optimizer]:
    """The job's model (seeded) and optimizer; ``check``: the model checked first (see
    :func:`train`)."""
    if check:  # before the seed: the trained model is the one it would be without the check
        try:
            check_model(job, pipeline, embedding_config, run_dir)
        except ConfigError as exc:
            (run_dir / INVALID_FILE).write_text(error_line(job, exc), encoding="utf-8")
            raise SystemExit(EXIT_CONFIG_ERROR) from None
        marks["model_checked"] = time.time()
    torch.manual_seed(job.seed)
    model = build_job_model(job, pipeline, embedding_config)
    optimizer = _optimizer(job, model)
    marks["model_built"] = time.time()
    return model, optimizer


def _started(
    job: JobConfig,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    embedding_config: EmbeddingConfig,
    addresses: Path | Sequence[str],
    config: TrainerConfig,
    starting: Future[EmbeddingStage] | None = None,
) -> TrainCtx:
    """The training context (its embedding worker started, or the one ``starting`` starts),
    a refused token explained."""
    try:
        worker = starting.result() if starting is not None else None
        return TrainCtx(model, optimizer, embedding_config, addresses, config, worker=worker)
    except UnauthenticatedError as exc:
        hint = (
            "the shards require a bearer token; set token_file in the job: a private file "
            "holding a read-write token"
            if job.token_file is None
            else f"the shards refused the token of token_file {job.token_file}"
        )
        raise UnauthenticatedError(f"{exc}. {hint}") from exc


def _resume(job: JobConfig, ctx: TrainCtx) -> None:
    """Load the latest checkpoint of ``checkpoint_dir``, if any."""
    if job.checkpoint_dir is not None and latest_checkpoint(job.checkpoint_dir) is not None:
        info = ctx.load_checkpoint(job.checkpoint_dir)
        if ctx.dist_env.rank == 0:
            print(f"resumed from checkpoint {info.checkpoint_id} (step {info.step})", flush=True)


def _train(
    job: JobConfig,
    ctx: TrainCtx,
    epochs: _Epochs,
    pipeline: FeaturePipeline,
    predict: int,
    began: float,
    marks: dict[str, float] | None = None,
) -> dict[str, Any]:
    """Train every epoch; rank 0 evaluates, reports and returns the metrics. ``marks``: the
    start-up timeline (:mod:`embeddb.trainer.launcher.startup`), ``first_step`` added here."""
    marks = marks if marks is not None else {}
    loss_fn = nn.BCEWithLogitsLoss()
    env = ctx.dist_env
    lead = env.rank == 0
    _resume(job, ctx)
    first = epochs.first
    scores: deque[np.ndarray] = deque(maxlen=20)
    truth: deque[np.ndarray] = deque(maxlen=20)
    samples = 0
    started = last_print = time.perf_counter()
    warm: tuple[int, float] | None = None  # (samples, time) after the warm-up steps
    # rank 0's stdout is the launcher's: a bar on a terminal, plain lines in a log
    progress = Progress(
        "train", unit="steps", stream=sys.stdout, enabled=None if lead else False,
        interval_s=_PROGRESS_S,
    )  # fmt: skip
    for prepared in ctx.prepare(epochs):
        output, labels = ctx.forward(prepared)
        loss = loss_fn(output, labels[0])
        ctx.backward(loss)
        if not samples:
            marks["first_step"] = time.time()
        samples += prepared.batch.batch_size
        if warm is None and samples >= _WARMUP_STEPS * job.batch_size:
            warm = (samples, time.perf_counter())
        epoch_end = epochs.ends.get(ctx.step)
        if epoch_end is not None:
            _epoch_ended(job, ctx, lead, epoch_end)
        elif (
            job.checkpoint_dir is not None
            and job.checkpoint_every
            and ctx.step % job.checkpoint_every == 0
        ):
            ctx.save_checkpoint(job.checkpoint_dir)
        if lead:
            scores.append(output.detach().numpy().ravel())
            truth.append(labels[0].numpy().ravel())
            now = time.perf_counter()
            if now - last_print >= _FIELDS_S:  # the loss, the AUC: not on every step
                last_print = now
                rate = _steady(samples, warm, now, started)[0] * env.world_size
                done = len([s for s in epochs.ends if s <= ctx.step])
                fields: dict[str, object] = {
                    "epoch": f"{min(first + done + 1, job.epochs)}/{job.epochs}",
                    "step": ctx.step,
                    "rate": f"{rate:,.0f} samples/s" if warm else "warming up",
                    "loss": f"{loss.item():.4f}",
                    "AUC": f"{_window_auc(scores, truth):.4f}",
                }
                progress.update(1, **fields)
            else:
                progress.update(1)
    progress.update(0, step=ctx.step)  # the last line names the last step
    progress.close()
    ctx.flush()
    elapsed = time.perf_counter() - started
    checkpoint_s = ctx.checkpoint_s  # the checkpoints taken while training: in ``elapsed``
    if job.checkpoint_dir is not None:
        last = latest_checkpoint(job.checkpoint_dir)
        if last is None or last.step < ctx.step:
            ctx.save_checkpoint(job.checkpoint_dir)
    if job.export_dir is not None:
        ctx.dense.flush()  # every rank: async mode's pending dense updates
    if not lead:
        return {}
    _export(ctx, job, pipeline, trained=samples > 0)
    rate = samples * env.world_size / max(elapsed, 1e-9)
    steady, warm_s = _steady(samples, warm, started + elapsed, started)
    warmup = started - began + warm_s
    startup = startup_s(marks)
    with ctx.eval_ctx() as ev:
        test_auc = _test_auc(ev, job, pipeline)
        saving = (
            f", checkpoints included: {checkpoint_s:.1f} s, "
            f"{samples * env.world_size / max(elapsed - checkpoint_s, 1e-9):,.0f} samples/s "
            "without"
            if checkpoint_s
            else ""
        )
        print(
            f"test AUC {test_auc:.4f}  |  {rate:,.0f} samples/s  "
            f"({job.mode}, {env.world_size} NN workers, {ctx.step} steps of "
            f"{job.batch_size} per worker{saving})",
            flush=True,
        )
        print(
            f"steady state {steady * env.world_size:,.0f} samples/s (after the first "
            f"{_WARMUP_STEPS} steps)  |  start-up {_seconds(startup)} (command start to the "
            f"first step)  |  warm-up {warmup:.1f} s (embedding worker start and the first "
            f"{_WARMUP_STEPS} steps)",
            flush=True,
        )
        if predict:
            _predict(ev, job, pipeline, predict)
    metrics = {
        "dataset": job.dataset_name,
        "mode": job.mode,
        "test_auc": test_auc,
        "samples_per_s": rate,  # checkpoint time included
        "checkpoint_s": checkpoint_s,  # in samples_per_s; the final one after it is not:
        "final_checkpoint_s": ctx.checkpoint_s - checkpoint_s,
        "steady_samples_per_s": steady * env.world_size,
        "startup_s": startup,
        "startup_phases_s": phases(marks),
        "warmup_s": warmup,
        "steps": ctx.step,
        "workers": env.world_size,
        "in_memory": job.in_memory,
    }
    if job.metrics_file is not None:
        with open(job.metrics_file, "a") as fh:
            fh.write(json.dumps(metrics) + "\n")
    return metrics


def _export(ctx: TrainCtx, job: JobConfig, pipeline: FeaturePipeline, *, trained: bool) -> None:
    """Rank 0: export the model to ``export_dir``, if the job has one. A job that trained no
    step here (resumed at its end) gives the first test batch as the example batch."""
    if job.export_dir is None:
        return
    example = None if trained else _first_batch(job, pipeline, job.batch_size)
    exported = ctx.export_model(
        job.export_dir, example=example, positive=pipeline.positive, pipeline=pipeline,
        lenient_records=job.lenient_records, overwrite=True,
    )  # fmt: skip
    print(f"exported model to {exported}", flush=True)


def _first_batch(job: JobConfig, pipeline: FeaturePipeline, rows: int) -> Batch:
    """The first ``rows`` rows of the test split (of the training split if it has none)."""
    for split in ("test", "train"):
        batch = next(iter(job.dataset_spec.reader(pipeline, split, rows, train=False)), None)
        if batch is not None:
            return batch
    raise ConfigError("dataset", "the dataset holds no rows")


def _test_auc(ev: Any, job: JobConfig, pipeline: FeaturePipeline) -> float:
    """AUC of the model on the test split (streamed).

    Raises:
        ConfigError: the test split is empty or holds one class only (no AUC exists).
    """
    test = job.dataset_spec.reader(pipeline, "test", job.eval_batch_size, train=False)
    outputs, targets = [], []
    for prepared in ev.prepare(test):
        output, labels = ev.forward(prepared)
        outputs.append(output.numpy().ravel())
        targets.append(labels[0].numpy().ravel())
    if not outputs:
        raise ConfigError("dataset.test", "the test split holds no rows")
    truth = np.concatenate(targets)
    positives = int(np.count_nonzero(truth > 0.5))
    if positives in (0, truth.size):
        side = "negative" if positives == 0 else "positive"
        raise ConfigError(
            "dataset.test",
            f"every one of the {truth.size} rows of the test split is {side}: a test AUC needs "
            "both classes (check the test files or the split)",
        )
    return auc(labels=truth, scores=np.concatenate(outputs))


def _steady(
    samples: int, warm: tuple[int, float] | None, now: float, started: float
) -> tuple[float, float]:
    """``(samples/s after the warm-up steps, seconds the warm-up steps took)``; before the
    warm-up ends (or a run shorter than it), the rate of everything so far."""
    if warm is None or now <= warm[1] or samples <= warm[0]:
        return samples / max(now - started, 1e-9), now - started
    return (samples - warm[0]) / (now - warm[1]), warm[1] - started


def _epoch_ended(job: JobConfig, ctx: TrainCtx, lead: bool, epoch: int) -> None:
    """At the end of an epoch: remember the steps per epoch (resume), checkpoint when the
    job checkpoints at epoch ends."""
    if job.checkpoint_dir is None:
        return
    if lead and epoch == 0 and ctx.step > 0:
        record_steps_per_epoch(job.checkpoint_dir, ctx.step)
    if job.checkpoint_every:
        if ctx.step % job.checkpoint_every == 0:
            ctx.save_checkpoint(job.checkpoint_dir)
    elif epoch < job.epochs - 1:  # the last epoch's checkpoint is the final one
        ctx.save_checkpoint(job.checkpoint_dir)


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} s"


def _window_auc(scores: deque[np.ndarray], truth: deque[np.ndarray]) -> float:
    """AUC of the last batches (NaN while they hold one class only)."""
    labels = np.concatenate(truth)
    if not 0 < labels.sum() < len(labels):
        return float("nan")
    return auc(labels=labels, scores=np.concatenate(scores))


def _predict(ev: Any, job: JobConfig, pipeline: FeaturePipeline, count: int) -> None:
    """Score the first ``count`` test rows online (evaluation lookups on the shards)."""
    batch = _first_batch(job, pipeline, count)
    positive = pipeline.positive or "positive"
    for prepared in ev.prepare([batch]):
        output, labels = ev.forward(prepared)
        probs = torch.sigmoid(output).numpy().ravel()
        for i, (p, y) in enumerate(zip(probs, labels[0].numpy().ravel(), strict=True)):
            print(f"prediction {i}: P({positive}) = {p:.3f}  (label {int(y)})")
