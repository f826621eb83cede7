"""Where a job with a ``checkpoint_dir`` stands: the step to resume at, and whether it is done.

A checkpoint records the step it was taken at; the first epoch's end records the steps per
epoch in ``CHECKPOINT_DIR/epochs.json`` (every epoch has as many: each rank reads the same part
of the training data every epoch, in another order). Together they say where a job resumes
(:func:`resume_point`) and whether it has trained every epoch (:func:`finished`): then
``embeddb train`` says so and trains nothing::

    job.yaml is finished: checkpoint ckpt-000000127 (ckpt/) is at step 127, the end of
    epoch 1 of 1. To train more, raise epochs or set a new checkpoint_dir.

torch-free: the launcher reads it.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from embeddb.trainer.checkpoints.files import CheckpointInfo, latest_checkpoint
from embeddb.trainer.launcher.job import JobConfig

__all__ = ["EPOCHS_FILE", "Finished", "finished", "resume_point", "steps_per_epoch"]

EPOCHS_FILE = "epochs.json"


def steps_per_epoch(checkpoint_dir: Path) -> int | None:
    """The steps of one epoch, once the first epoch of the job has ended (else None)."""
    try:
        steps = int(json.loads((checkpoint_dir / EPOCHS_FILE).read_text())["steps"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return steps if steps > 0 else None


def record_steps_per_epoch(checkpoint_dir: Path, steps: int) -> None:
    """Write :data:`EPOCHS_FILE` (atomically) at the end of the first epoch."""
    checkpoint_dir.mkdir(parents=True, exist_ok=True)
    path = checkpoint_dir / EPOCHS_FILE
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"steps": steps}))
    os.replace(tmp, path)


def resume_point(job: JobConfig, step: int) -> tuple[int, int]:
    """``(epoch, batches to skip in it)`` of a job resumed at ``step``; the epoch is
    ``job.epochs`` for a finished job."""
    if step == 0 or job.checkpoint_dir is None:
        return 0, step
    per_epoch = steps_per_epoch(job.checkpoint_dir)
    if per_epoch is None:
        return 0, step  # the first epoch never ended: the step lies in it
    first, skip = divmod(step, per_epoch)
    if first >= job.epochs:
        return job.epochs, 0
    return first, skip


@dataclass(frozen=True)
class Finished:
    """A job whose latest checkpoint is at (or past) the end of its last epoch.

    Attributes:
        checkpoint: the latest checkpoint.
        steps_per_epoch: from :data:`EPOCHS_FILE`.
        epochs: the job's ``epochs``.
    """

    checkpoint: CheckpointInfo
    steps_per_epoch: int
    epochs: int

    def message(self, job_file: Path, checkpoint_dir: Path) -> str:
        """One line: which checkpoint, where it stands, how to train more."""
        step = self.checkpoint.step
        done = step // self.steps_per_epoch
        where = (
            f"the end of epoch {done} of {self.epochs}"
            if done == self.epochs
            else f"{done} epochs trained (the job asks for {self.epochs})"
        )
        return (
            f"{job_file.name} is finished: checkpoint {self.checkpoint.checkpoint_id} "
            f"({checkpoint_dir}) is at step {step}, {where}. To train more, raise epochs "
            f"above {done} or set a new checkpoint_dir."
        )


def finished(job: JobConfig) -> Finished | None:
    """The job's state when its latest checkpoint has trained every epoch, else None (no
    ``checkpoint_dir``, no checkpoint, or epochs left)."""
    if job.checkpoint_dir is None:
        return None
    last = latest_checkpoint(job.checkpoint_dir)
    if last is None:
        return None
    per_epoch = steps_per_epoch(job.checkpoint_dir)
    if per_epoch is None or last.step < per_epoch * job.epochs:
        return None
    return Finished(checkpoint=last, steps_per_epoch=per_epoch, epochs=job.epochs)
