"""The Python path made friendly: a TrainCtx script without a ``__main__`` guard fails at once
with the fix as the last line, Ctrl-C stops the embedding worker quietly, and the metrics are
public. Scripts run as real subprocesses against a real shard (in this process, port 0)."""

from __future__ import annotations

import multiprocessing.process
import os
import signal
import subprocess
import sys
import types
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from embeddb.config import EmbeddingConfig
from embeddb.trainer.embedding import spawn
from embeddb.trainer.errors import TrainerError
from tests.trainer_harness import serve_shards

ROOT = Path(__file__).resolve().parents[1]
CONFIG = "slots_config:\n  user: {dim: 4}\n"

_HEADER = f"""
import sys

import numpy as np
import torch
from torch import nn

from embeddb.config import EmbeddingConfig
from embeddb.trainer import Batch, IDTypeFeatureWithSingleID, Label, TrainCtx, TrainerConfig

CONFIG = EmbeddingConfig.from_yaml_text({CONFIG!r})


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 1)

    def forward(self, non_id: list[torch.Tensor], embeddings: list[torch.Tensor]) -> torch.Tensor:
        return self.linear(embeddings[0])


def batches():
    rng = np.random.default_rng(0)
    while True:
        ids = rng.integers(0, 100, size=64)
        labels = rng.integers(0, 2, size=(64, 1)).astype(np.float32)
        yield Batch([IDTypeFeatureWithSingleID("user", ids)], [], [Label(labels)])


def train(address: str) -> None:
    model = Model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    config = TrainerConfig(device="cpu")
    with TrainCtx(model, optimizer, CONFIG, [address], config) as ctx:
        for step, prepared in enumerate(ctx.prepare(batches())):
            output, labels = ctx.forward(prepared)
            ctx.backward(nn.functional.binary_cross_entropy_with_logits(output, labels[0]))
            if step == 3:
                print("ready", flush=True)
"""

UNGUARDED = (
    _HEADER
    + """
print("importing", flush=True)
train(sys.argv[1])
"""
)

INTERRUPTED = (
    _HEADER
    + """
if __name__ == "__main__":
    try:
        train(sys.argv[1])
    except KeyboardInterrupt:
        if sys.argv[2] == "raise":
            raise
        print("interrupted", flush=True)
        sys.exit(130)
"""
)


@pytest.fixture
def shard_address() -> Iterator[str]:
    with serve_shards(EmbeddingConfig.from_yaml_text(CONFIG), None, 1) as shards:
        yield shards.addresses[0]


def _env(tmp_path: Path) -> dict[str, str]:
    temp = tmp_path / "tmp"  # the start report's directory: empty again once the script ends
    temp.mkdir(exist_ok=True)
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path, "TMPDIR": str(temp)}


@pytest.mark.slow
def test_a_script_without_a_main_guard_fails_at_once_with_the_fix(
    tmp_path: Path, shard_address: str
) -> None:
    script = tmp_path / "unguarded.py"
    script.write_text(UNGUARDED)
    result = subprocess.run(
        [sys.executable, str(script), shard_address],
        capture_output=True,
        text=True,
        timeout=180,
        env=_env(tmp_path),
        cwd=tmp_path,
    )
    assert result.returncode != 0
    assert "ready" not in result.stdout
    assert result.stdout.count("importing") == 2  # the script, then the worker importing it
    lines = result.stderr.strip().splitlines()
    expected = (
        f'wrap the training code of {script} in `if __name__ == "__main__":` (the embedding '
        f'worker is started with multiprocessing "spawn", which imports {script} again)'
    )
    assert lines[-1] == f"embeddb.trainer.errors.EmbeddingWorkerError: {expected}"
    assert result.stderr.count("Traceback") == 1  # the script's own; the worker exits quietly
    assert "bootstrapping phase" not in result.stderr
    assert list((tmp_path / "tmp").glob("embeddb-worker-*")) == []  # the report is removed


@pytest.mark.slow
@pytest.mark.parametrize("handling", ["catch", "raise"])
def test_ctrl_c_stops_the_embedding_worker_quietly(
    tmp_path: Path, shard_address: str, handling: str
) -> None:
    script = tmp_path / "interrupted.py"
    script.write_text(INTERRUPTED)
    process = subprocess.Popen(
        [sys.executable, str(script), shard_address, handling],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(tmp_path),
        cwd=tmp_path,
        start_new_session=True,  # its own process group, as a terminal's foreground job
    )
    try:
        assert process.stdout is not None
        assert process.stdout.readline().strip() == "ready"
        os.killpg(process.pid, signal.SIGINT)  # Ctrl-C: the whole group, worker included
        out, err = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert "embeddb-embedding-worker" not in err  # multiprocessing's "Process NAME:" header
    assert "[embedding worker" not in err and "asyncio" not in err  # its log lines, its loop
    if handling == "catch":
        assert process.returncode == 130
        assert "interrupted" in out
        assert "Traceback" not in err
    else:  # the script's own KeyboardInterrupt traceback, and nothing else
        assert process.returncode == -signal.SIGINT
        assert err.count("Traceback") == 1
        assert err.strip().splitlines()[-1] == "KeyboardInterrupt"


def test_the_main_guard_check_in_a_spawn_child(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spawn.check_main_guard()  # pytest's process is no spawn child: nothing happens
    main = types.ModuleType("__mp_main__")
    main.__file__ = "/jobs/train.py"
    monkeypatch.setitem(sys.modules, "__mp_main__", main)
    monkeypatch.setattr(
        multiprocessing.process.current_process(), "_inheriting", True, raising=False
    )
    monkeypatch.delenv(spawn.REPORT_ENV, raising=False)
    with pytest.raises(TrainerError, match=r"wrap the training code of /jobs/train\.py in"):
        spawn.check_main_guard()  # a spawn child of someone else's pool: raised
    report = tmp_path / "report"
    monkeypatch.setenv(spawn.REPORT_ENV, str(report))
    with pytest.raises(SystemExit):
        spawn.check_main_guard()  # the embedding worker being started: reported, then quiet
    assert report.read_text().startswith("wrap the training code of /jobs/train.py in `if __")


def test_the_start_report_round_trip(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr("tempfile.tempdir", None)  # re-read TMPDIR
    report = spawn.StartReport()
    assert report.path.parent == tmp_path and report.read() is None
    with report.starting():
        assert os.environ[spawn.REPORT_ENV] == str(report.path)
        assert spawn.report_failure("the embedding worker could not start:\n  boom")
    assert spawn.REPORT_ENV not in os.environ
    assert report.read() == "the embedding worker could not start: boom"
    report.close()
    report.close()
    assert list(tmp_path.iterdir()) == []


def test_auc_and_logloss_are_public() -> None:
    from embeddb.common import evaluation
    from embeddb.trainer import auc, logloss

    labels = np.array([0, 0, 1, 1], dtype=np.float32)
    assert auc(labels=labels, scores=np.array([0.1, 0.4, 0.35, 0.8])) == pytest.approx(0.75)
    assert logloss(labels=labels, scores=np.full(4, 0.5)) == pytest.approx(np.log(2.0))
    assert evaluation.log_loss is evaluation.logloss


def test_auc_and_logloss_refuse_positional_arguments() -> None:
    # scikit-learn's roc_auc_score takes (y_true, y_score); the earlier auc took (scores, labels).
    # A swapped positional call returned a plausible wrong number (1 - AUC); now it cannot be made.
    from embeddb.trainer import auc, logloss

    labels = np.array([0, 0, 1, 1], dtype=np.float32)
    scores = np.array([0.1, 0.4, 0.35, 0.8])
    with pytest.raises(TypeError, match="positional"):
        auc(labels, scores)  # type: ignore[misc]
    with pytest.raises(TypeError, match="positional"):
        logloss(labels, scores)  # type: ignore[misc]
    assert auc(scores=scores, labels=labels) == auc(labels=labels, scores=scores)
