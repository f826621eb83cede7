"""The NN worker's entry point under torchrun: ``python -m embeddb.trainer.run JOB.yaml
--addresses SHARDS.txt`` (``embeddb train`` starts it; see :mod:`embeddb.trainer.launch`).

Each rank trains on every ``world_size``-th batch (each epoch cut to the same number of steps
per rank, so collectives line up), checkpoints every ``checkpoint_every`` steps (or at each
epoch's end) and, when the checkpoint directory holds a checkpoint, resumes from the latest:
after torchrun restarts the workers (one died) or when the job is started again. Rank 0 draws a
progress line (samples/s of the whole job, loss, AUC of the last batches), evaluates on the
test split, prints ``test AUC`` and ``samples/s`` and answers ``--predict K`` online
predictions (evaluation lookups: the shards change nothing).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import sys
import time
from collections import deque
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from embeddb.config import EmbeddingConfig
from embeddb.errors import UnauthenticatedError
from embeddb.evaluation import auc

from .batch import Batch
from .checkpoint import latest_checkpoint
from .config import TrainerConfig
from .ctx import TrainCtx
from .data import Reader
from .embedding_worker import EmbeddingWorkerConfig
from .job import JobConfig

__all__ = ["load_model", "main"]

_PROGRESS_S = 0.5


def load_model(job: JobConfig) -> nn.Module:
    """Build the job's model: ``FILE.py:NAME`` (relative to the job file) or ``module:NAME``."""
    target, name = job.model.rsplit(":", 1)
    if target.endswith(".py"):
        path = (job.base_dir / target).resolve()
        spec = importlib.util.spec_from_file_location(f"embeddb_job_model_{path.stem}", path)
        if spec is None or spec.loader is None or not path.is_file():
            raise FileNotFoundError(f"model file not found: {path}")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    else:
        module = importlib.import_module(target)
    model = getattr(module, name)(**job.model_args)
    if not isinstance(model, nn.Module):
        raise TypeError(f"{job.model} built a {type(model).__name__}, not a torch.nn.Module")
    return model


def _optimizer(job: JobConfig, model: nn.Module) -> torch.optim.Optimizer:
    kwargs = {k: v for k, v in job.optimizer.items() if k != "type"}
    kind = {"adam": torch.optim.Adam, "adagrad": torch.optim.Adagrad, "sgd": torch.optim.SGD}
    optimizer: torch.optim.Optimizer = kind[job.optimizer["type"]](model.parameters(), **kwargs)
    return optimizer


_POSITIVE = {"adult": "income >50K", "criteo": "click", "movielens": "rating >= 4"}


def _reader(job: JobConfig, split: str, batch_size: int, train: bool) -> Reader:
    return job.reader(split, batch_size, train=train)


def _rank_batches(
    epoch_batches: list[Batch], rank: int, world: int, epochs: int, skip: int
) -> Iterator[Batch]:
    """This rank's batches of every epoch, from its step ``skip`` on."""
    per_rank = len(epoch_batches) // world
    mine = epoch_batches[rank::world][:per_rank]
    step = 0
    for _ in range(epochs):
        for batch in mine:
            if step >= skip:
                yield batch
            step += 1


def train(job: JobConfig, addresses: Path, predict: int) -> dict[str, Any]:
    """Train ``job`` on the shards of the address file; rank 0 returns the final metrics."""
    torch.set_num_threads(job.threads)
    torch.manual_seed(job.seed)
    model = load_model(job)
    optimizer = _optimizer(job, model)
    embedding_config = EmbeddingConfig.from_yaml(job.embedding_config_path())
    config = TrainerConfig(
        mode=job.mode,  # type: ignore[arg-type]
        worker=EmbeddingWorkerConfig(
            max_staleness=job.max_staleness,
            metrics_port=job.metrics_port,
            token=job.read_token(),
        ),
    )
    loss_fn = nn.BCEWithLogitsLoss()
    epoch_batches = list(_reader(job, "train", job.batch_size, True))
    try:
        started_ctx = TrainCtx(model, optimizer, embedding_config, addresses, config)
    except UnauthenticatedError as exc:
        hint = (
            "the shards require a bearer token; set token_file in the job: a private file "
            "holding a read-write token"
            if job.token_file is None
            else f"the shards refused the token of token_file {job.token_file}"
        )
        raise UnauthenticatedError(f"{exc}. {hint}") from exc
    with started_ctx as ctx:
        env = ctx.dist_env
        lead = env.rank == 0
        per_epoch = len(epoch_batches) // env.world_size
        total = per_epoch * job.epochs
        every = job.checkpoint_every or per_epoch
        if job.checkpoint_dir is not None and latest_checkpoint(job.checkpoint_dir) is not None:
            info = ctx.load_checkpoint(job.checkpoint_dir)
            if lead:
                print(
                    f"resumed from checkpoint {info.checkpoint_id} (step {info.step})", flush=True
                )
        start_step = ctx.step
        scores: deque[np.ndarray] = deque(maxlen=20)
        truth: deque[np.ndarray] = deque(maxlen=20)
        started = last_print = time.perf_counter()
        samples = 0
        batches = _rank_batches(epoch_batches, env.rank, env.world_size, job.epochs, start_step)
        for prepared in ctx.prepare(batches):
            output, labels = ctx.forward(prepared)
            loss = loss_fn(output, labels[0])
            ctx.backward(loss)
            samples += prepared.batch.batch_size
            if job.checkpoint_dir is not None and ctx.step % every == 0 and ctx.step < total:
                ctx.save_checkpoint(job.checkpoint_dir)
            if lead:
                scores.append(output.detach().numpy().ravel())
                truth.append(labels[0].numpy().ravel())
                now = time.perf_counter()
                if now - last_print >= _PROGRESS_S or ctx.step == total:
                    last_print = now
                    rate = samples * env.world_size / (now - started)
                    epoch = min(ctx.step // max(per_epoch, 1) + 1, job.epochs)
                    print(
                        f"\repoch {epoch}/{job.epochs}  step {ctx.step}/{total}  "
                        f"{rate:,.0f} samples/s  loss {loss.item():.4f}  "
                        f"AUC {_window_auc(scores, truth):.4f}",
                        end="",
                        flush=True,
                    )
        ctx.flush()
        elapsed = time.perf_counter() - started
        if job.checkpoint_dir is not None:
            last = latest_checkpoint(job.checkpoint_dir)
            if last is None or last.step < ctx.step:
                ctx.save_checkpoint(job.checkpoint_dir)
        if job.export_dir is not None:
            ctx.dense.flush()  # every rank: async mode's pending dense updates
        if not lead:
            return {}
        print(flush=True)
        if job.export_dir is not None:
            exported = ctx.export_model(
                job.export_dir, positive=_POSITIVE.get(job.dataset), overwrite=True
            )
            print(f"exported model to {exported}", flush=True)
        with ctx.eval_ctx() as ev:
            test = _reader(job, "test", job.eval_batch_size, False)
            outputs, targets = [], []
            for prepared in ev.prepare(test):
                output, labels = ev.forward(prepared)
                outputs.append(output.numpy().ravel())
                targets.append(labels[0].numpy().ravel())
            test_auc = auc(np.concatenate(outputs), np.concatenate(targets))
            rate = samples * env.world_size / max(elapsed, 1e-9)
            print(
                f"test AUC {test_auc:.4f}  |  {rate:,.0f} samples/s  "
                f"({job.mode}, {env.world_size} NN workers, {ctx.step} steps of "
                f"{job.batch_size} per worker)",
                flush=True,
            )
            if predict:
                _predict(ev, job, predict)
    metrics = {
        "dataset": job.dataset,
        "mode": job.mode,
        "test_auc": test_auc,
        "samples_per_s": rate,
        "steps": total,
        "workers": env.world_size,
    }
    if job.metrics_file is not None:
        with open(job.metrics_file, "a") as fh:
            fh.write(json.dumps(metrics) + "\n")
    return metrics


def _window_auc(scores: deque[np.ndarray], truth: deque[np.ndarray]) -> float:
    """AUC of the last batches (NaN while they hold one class only)."""
    labels = np.concatenate(truth)
    if not 0 < labels.sum() < len(labels):
        return float("nan")
    return auc(np.concatenate(scores), labels)


def _predict(ev: Any, job: JobConfig, count: int) -> None:
    """Score the first ``count`` test rows online (evaluation lookups on the shards)."""
    batch = next(iter(_reader(job, "test", count, False)))
    for prepared in ev.prepare([batch]):
        output, labels = ev.forward(prepared)
        probs = torch.sigmoid(output).numpy().ravel()
        for i, (p, y) in enumerate(zip(probs, labels[0].numpy().ravel(), strict=True)):
            print(f"prediction {i}: P({_POSITIVE[job.dataset]}) = {p:.3f}  (label {int(y)})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m embeddb.trainer.run", description=__doc__)
    parser.add_argument("job", type=Path, help="the training job YAML")
    parser.add_argument("--addresses", type=Path, required=True, help="the shards' address file")
    parser.add_argument("--predict", type=int, default=0, help="online predictions at the end")
    args = parser.parse_args(argv)
    job = JobConfig.from_yaml(args.job)
    train(job, args.addresses, args.predict)
    return 0


if __name__ == "__main__":
    sys.exit(main())
