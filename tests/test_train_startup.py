"""``embeddb train``'s start-up (issue 25): a one-worker job's rank started without torchrun and
held while the job is validated, the shards started during the validation step, and an
invalid job stopping everything it started. The figures are benchmarks/_train_startup.py's."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from embeddb.errors import ConfigError
from embeddb.trainer import DistEnv
from embeddb.trainer.launcher.auto_embedding import auto_embedding_yaml, check_ahead, config_ahead
from embeddb.trainer.launcher.direct import CHECK_FLAG, HOLD_FLAG, rank_command, rank_variables
from embeddb.trainer.launcher.job import EMBEDDING_FILE, JobConfig
from embeddb.trainer.launcher.launch import _Attempts, _shards_while_validating
from embeddb.trainer.launcher.loader import decode_batch
from embeddb.trainer.launcher.validate import SAMPLE_FILE, sample_batch, validate
from tests.test_trainer_launch import (
    MODEL,
    ROOT,
    assert_all_gone,
    descendants,
    start,
    watch,
    write_job,
)

BAD_MODEL = """
import torch
from torch import nn


class TwoLogits(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.bias = nn.Parameter(torch.zeros(2))

    def forward(self, non_id, embeddings):
        return self.bias.expand(non_id[0].shape[0], 2)
"""

# a generic dataset naming its ID features (the second renamed)
NAMED = (
    "{format: csv, train: t.csv, test: t.csv, label: {column: y}, ids: [a, {column: b, name: bee}]}"
)


def test_a_one_worker_rank_gets_torchruns_variables_and_no_torchrun(tmp_path: Path) -> None:
    command = rank_command(tmp_path / "job.yaml", tmp_path / "a.txt", tmp_path, predict=3)
    assert command[1:5] == ["-u", "-m", "embeddb.trainer.launcher.run", str(tmp_path / "job.yaml")]
    assert "torch.distributed.run" not in command and HOLD_FLAG not in command
    assert command[command.index("--addresses") + 1] == f"@{tmp_path / 'a.txt'}"
    assert command[-2:] == ["--predict", "3"]
    held = rank_command(tmp_path / "j", tmp_path / "a", tmp_path, finished=True, hold=True)
    assert held[-2:] == ["--finished", HOLD_FLAG]
    checking = rank_command(tmp_path / "j", tmp_path / "a", tmp_path, hold=True, check=True)
    assert checking[-2:] == [HOLD_FLAG, CHECK_FLAG]
    variables = rank_variables()
    env = DistEnv.from_environ(variables)
    assert (env.rank, env.world_size, env.local_rank, env.distributed) == (0, 1, 0, False)
    assert env.attempt is None  # no torchrun agent store to key a group by
    assert variables["LOCAL_WORLD_SIZE"] == "1" and 0 < int(variables["MASTER_PORT"]) < 65536


def test_shards_start_during_validation_unless_they_need_it_or_write_data(
    tmp_path: Path,
) -> None:
    def job(**settings: object) -> JobConfig:
        return JobConfig.from_yaml(write_job(tmp_path, **settings))

    assert _shards_while_validating(job())  # a preset's config, ephemeral shards
    assert not _shards_while_validating(job(checkpoint_dir="ckpt"))  # a data directory
    assert _shards_while_validating(job(addresses="[127.0.0.1:1]", embedding_config="auto"))
    # auto: the launcher writes the config when the job file names the ID features
    assert _shards_while_validating(job(embedding_config="auto"))  # the preset's columns
    assert _shards_while_validating(job(embedding_config="auto", dataset=NAMED))
    fields = "{format: libsvm, train: t.txt, test: t.txt}"  # fields: found by the step
    assert not _shards_while_validating(job(embedding_config="auto", dataset=fields))
    assert not _shards_while_validating(job(embedding_config="auto", checkpoint_dir="ckpt"))


def test_the_held_rank_checks_the_model_unless_a_failure_would_leave_a_data_directory(
    tmp_path: Path,
) -> None:
    """With ``auto`` too: the rank runs after the step wrote RUN/embedding.yaml."""

    def checks(**settings: object) -> bool:
        job = JobConfig.from_yaml(write_job(tmp_path, **settings))
        return _Attempts(
            tmp_path / "job.yaml", job, tmp_path / "a", tmp_path, print, None
        ).checks_model

    assert checks() and checks(embedding_config="auto")
    assert checks(embedding_config="auto", dataset="{format: libsvm, train: t.txt, test: t.txt}")
    assert checks(checkpoint_dir="ckpt", addresses="[127.0.0.1:1]")  # the shards' own dirs
    assert not checks(checkpoint_dir="ckpt") and not checks(
        checkpoint_dir="c", embedding_config="auto"
    )


def test_the_auto_config_written_ahead_is_the_steps_and_is_checked_against_the_fitted_features(
    tmp_path: Path,
) -> None:
    job = JobConfig.from_yaml(write_job(tmp_path, embedding_config="auto", dataset=NAMED))
    ahead = config_ahead(job)
    assert ahead == auto_embedding_yaml(("a", "bee"), job.embedding_dim)  # the step's text
    check_ahead(ahead, ("a", "bee"), job.embedding_dim)  # the same features: passes
    ahead_error = r"embedding_config: auto: the dataset's ID features \(a, c\) are not those"
    with pytest.raises(ConfigError, match=ahead_error + r" of the job file \(a, bee\) the shards"):
        check_ahead(ahead, ("a", "c"), job.embedding_dim)
    assert config_ahead(JobConfig.from_yaml(write_job(tmp_path))) is None  # a preset config
    fields = "{format: libsvm, train: t.txt, test: t.txt}"
    assert config_ahead(JobConfig.from_yaml(write_job(tmp_path, embedding_config="auto",
                                                      dataset=fields))) is None  # fmt: skip


@pytest.mark.slow  # a fit: about a second
def test_the_validation_step_fails_when_the_fitted_features_are_not_those_written_ahead(
    tmp_path: Path,
) -> None:
    """Cannot happen from a job file today (fit keeps the named ID features): the step
    checks it all the same, so that no job trains with tables the shards lack."""
    (tmp_path / "t.csv").write_text("a,b,y\n1,2,0\n3,4,1\n5,6,0\n7,8,1\n")
    csv = "{format: csv, train: t.csv, label: {column: y}, ids: [a, b], split: {fraction: 0.5}}"
    job = JobConfig.from_yaml(write_job(tmp_path, embedding_config="auto", dataset=csv))
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / EMBEDDING_FILE).write_text(auto_embedding_yaml(("a", "c"), job.embedding_dim))
    with pytest.raises(
        ConfigError, match=r"features \(a, b\) are not those of the job file \(a, c\)"
    ):
        validate(job, run_dir, model=False)
    (run_dir / EMBEDDING_FILE).write_text(config_ahead(job) or "")
    pipeline = validate(job, run_dir, model=False)
    assert pipeline.id_features == ("a", "b")
    # the sample batch, for the held rank's check of the model (no data reading there)
    written = decode_batch(bytearray((run_dir / SAMPLE_FILE).read_bytes()))
    read = sample_batch(job, pipeline)
    assert written.batch_size == read.batch_size > 0
    for mine, theirs in zip(written.id_type_features, read.id_type_features, strict=True):
        assert mine.name == theirs.name and mine.values.tolist() == theirs.values.tolist()


@pytest.mark.slow
def test_a_held_rank_whose_launcher_closes_its_stdin_exits_having_started_nothing(
    tmp_path: Path,
) -> None:
    job = write_job(tmp_path)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    command = rank_command(job, tmp_path / "missing.txt", run_dir, hold=True)
    done = subprocess.run(
        command, stdin=subprocess.DEVNULL, capture_output=True, text=True, cwd=ROOT, timeout=120
    )
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")
    assert list(run_dir.iterdir()) == []  # no failure record, no loader, no worker


def run_sampled(job: Path) -> tuple[str, set[bytes], set[int]]:
    """Run ``embeddb train`` on ``job`` to its successful end; its output, the command lines
    of the processes sampled under it while it ran, and their pids."""
    proc = start(job)
    seen: set[int] = set()
    commands: set[bytes] = set()

    def sample() -> bool:
        for pid in descendants(proc.pid):
            with contextlib.suppress(OSError):
                commands.add(Path(f"/proc/{pid}/cmdline").read_bytes())
        return False

    watch(proc, seen, "the job to end", 300, sample)
    out = job.with_suffix(".out").read_text()
    proc.wait(timeout=60)
    assert proc.returncode == 0, out
    return out, commands, seen


@pytest.mark.slow
@pytest.mark.parametrize("settings", [{}, {"embedding_config": "auto", "model": "builtin:dnn"}])
def test_a_one_worker_job_trains_without_torchrun_its_rank_started_while_validating(
    tmp_path: Path, settings: dict[str, object]
) -> None:
    """The rank checks the model (``model_checked``), an ``auto`` job's too: the validation
    step imports no torch."""
    job = write_job(tmp_path, metrics_file="metrics.jsonl", **settings)
    out, commands, seen = run_sampled(job)
    assert "NN worker: python -u -m embeddb.trainer.launcher.run " in out
    assert "torchrun" not in out and not [c for c in commands if b"torch.distributed.run" in c]
    assert [c for c in commands if b"embeddb.trainer.launcher.run" in c]  # sampled: the rank
    metrics = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[-1])
    phases = metrics["startup_phases_s"]
    order = list(phases)
    assert order[0] == "command" and order[-1] == "first_step"
    # the rank starts first, and trains once the job is valid and the shards are up
    assert order.index("rank_launched") < order.index("validated") < order.index("released")
    assert order.index("shards_up") < order.index("released") < order.index("model_checked")
    assert order.index("model_checked") < order.index("model_built")
    assert "torchrun" not in phases
    assert metrics["startup_s"] == pytest.approx(sum(phases.values()))
    assert_all_gone(seen)


@pytest.mark.slow
@pytest.mark.parametrize(
    "settings",
    [{}, {"embedding_config": "auto"}, {"checkpoint_dir": "ckpt"}, {"workers": 2}],
)
def test_an_invalid_model_fails_before_training_and_leaves_nothing_behind(
    tmp_path: Path, settings: dict[str, object]
) -> None:
    """The validation step's one error line (from the held rank's check of the model for one
    worker, else from the step), whatever had started meanwhile (the held rank, the shards);
    no process, no shard data directory, no run directory left."""
    (tmp_path / "bad.py").write_text(BAD_MODEL)
    job = write_job(tmp_path, **settings)
    job.write_text(job.read_text().replace(f"{MODEL}:AdultModel", "bad.py:TwoLogits"))
    temp = tmp_path / "temp"  # the launcher's run directory goes here
    temp.mkdir()
    with open(job.with_suffix(".out"), "w") as output:
        proc = subprocess.Popen(
            [sys.executable, "-m", "embeddb.cli", "train", str(job)],
            stdout=output,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=ROOT,
            env={**os.environ, "TMPDIR": str(temp)},
        )
    seen: set[int] = set()
    watch(proc, seen, "the job to fail", 300)
    proc.wait(timeout=60)
    out = job.with_suffix(".out").read_text()
    errors = [line for line in out.splitlines() if line.startswith("Error: ")]
    assert proc.returncode == 1, out
    assert errors == [
        "Error: model: forward must return logits of shape (64, 1) for 64 samples, got (64, 2) "
        f"({job}:1)"
    ], out
    assert "samples/s" not in out and "Traceback" not in out, out  # nothing trained
    assert not (tmp_path / "ckpt").exists()
    assert list(temp.glob("embeddb-*")) == []  # no run directory (torch may cache there)
    assert_all_gone(seen)


@pytest.mark.slow
def test_the_validation_step_without_the_model_imports_no_torch(tmp_path: Path) -> None:
    """A one-worker job's held rank checks the model; the step's torch import is saved."""
    (tmp_path / "bad.py").write_text(BAD_MODEL)
    job = write_job(tmp_path)
    job.write_text(job.read_text().replace(f"{MODEL}:AdultModel", "bad.py:TwoLogits"))
    script = (
        "import sys\n"
        "from embeddb.trainer.launcher.validate import main\n"
        f"code = main([{str(job)!r}, '--run-dir', {str(tmp_path / 'run')!r}, *sys.argv[1:]])\n"
        "print(code, 'torch' in sys.modules)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, "--no-model"], capture_output=True, text=True, timeout=120
    )
    assert done.stdout.split() == ["0", "False"], done.stderr
    assert (tmp_path / "run" / "features.json").is_file()
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert done.stdout.split() == ["2", "True"], done.stderr
    assert "forward must return logits of shape (64, 1)" in done.stderr


@pytest.mark.slow
def test_an_embedding_worker_started_ahead_in_a_thread_is_the_contexts_and_closes_with_it() -> None:
    """What a rank does: the worker's start in a thread while the model is built, then the
    context takes it (no second worker) and stops it when it closes."""
    from concurrent.futures import ThreadPoolExecutor

    import torch

    from embeddb.trainer.ctx import TrainCtx, start_worker
    from tests.test_trainer_ctx import FAST, step
    from tests.trainer_harness import adult, adult_config, adult_model, serve_shards

    with serve_shards(adult_config(), None, 1) as shards, ThreadPoolExecutor(1) as pool:
        starting = pool.submit(start_worker, adult_config(), shards.addresses, FAST)
        model = adult_model()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        worker = starting.result()
        assert worker.alive
        with TrainCtx(
            model, optimizer, adult_config(), shards.addresses, FAST, worker=worker
        ) as ctx:
            assert ctx._worker is worker
            step(ctx, next(iter(ctx.prepare(adult("train").batches(128)))))
            assert ctx.step == 1
        assert not worker.alive


@pytest.mark.slow
@pytest.mark.parametrize("stage", ["thread", "process"])
def test_the_job_key_embedding_stage_picks_where_the_embedding_stage_runs(
    tmp_path: Path, stage: str
) -> None:
    job = write_job(tmp_path, embedding_stage=stage, metrics_file="metrics.jsonl")
    _, commands, seen = run_sampled(job)
    assert [c for c in commands if b"embeddb.trainer.launcher.run" in c]  # sampled: the rank
    spawned = [c for c in commands if b"spawn_main" in c]  # multiprocessing's spawn children
    assert bool(spawned) == (stage == "process"), commands
    metrics = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[-1])
    assert metrics["test_auc"] > 0.8
    assert_all_gone(seen)
