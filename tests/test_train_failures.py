"""``embeddb train`` when things end otherwise than "trained": a job that is finished already, a
label with one class, a rank's deterministic error (never restarted), a crash's record, Ctrl-C
on the terminal's process group, and ``--log-format json`` (every line a JSON object)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from embeddb.cli import main as cli
from embeddb.errors import ConfigError, UnavailableError
from embeddb.trainer.errors import EmbeddingWorkerError, GradientPushFailedError
from embeddb.trainer.launcher.failures import (
    StderrFilter,
    first_failure,
    is_transient,
    read_failures,
    write_failure,
)
from embeddb.trainer.launcher.job import JobConfig
from embeddb.trainer.launcher.label_check import check_label_classes
from tests.test_trainer_launch import MODEL, ROOT, assert_all_gone, descendants

CSV_JOB = """\
dataset:
  format: csv
  train: train.csv
  test: test.csv
  label: {column: y, positive: [Y]}
  ids: [user, item]
model: builtin:dnn
embedding_config: auto
embedding_dim: 4
epochs: 1
batch_size: 64
"""


def write_rows(path: Path, rows: int, label: Any = None) -> None:
    """``user,item,y`` rows: y is ``Y`` for about a third of them (``label(i)`` instead)."""
    lines = ["user,item,y\n"]
    for i in range(rows):
        user, item = i * 7 % 23, i * 11 % 31
        y = label(i) if label is not None else ("Y" if (user + item) % 3 == 0 else "N")
        lines.append(f"u{user},i{item},{y}\n")
    path.write_text("".join(lines))


def csv_job(folder: Path, extra: str = "", *, test_label: Any = None) -> Path:
    """A small job (300 training rows, 100 test rows) in ``folder``."""
    write_rows(folder / "train.csv", 300)
    write_rows(folder / "test.csv", 100, test_label)
    path = folder / "job.yaml"
    path.write_text(CSV_JOB + extra)
    return path


def run_train(job: Path, *args: str, json_logs: bool = False) -> subprocess.CompletedProcess[str]:
    prefix = ["--log-format", "json"] if json_logs else []
    return subprocess.run(
        [sys.executable, "-m", "embeddb", *prefix, "train", str(job), *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=240,
        check=False,
    )


def json_records(text: str) -> list[dict[str, Any]]:
    """Every line of ``text`` as a JSON object (fails on a line that is not one)."""
    records = []
    for line in text.splitlines():
        doc = json.loads(line)
        assert isinstance(doc, dict), line
        records.append(doc)
    return records


# ------------------------------------------------------------------------ a finished job
@pytest.mark.slow
def test_a_finished_job_says_so_exits_0_and_still_exports_and_predicts(tmp_path: Path) -> None:
    job = csv_job(tmp_path, "checkpoint_dir: ckpt\nexport_dir: model\n")
    first = run_train(job, json_logs=True)
    assert first.returncode == 0, first.stdout + first.stderr
    messages = [r["message"] for r in json_records(first.stdout) + json_records(first.stderr)]
    assert any(m.startswith("test AUC") for m in messages), messages
    (tmp_path / "model" / "model.json").unlink()

    again = run_train(job, "--predict", "2")
    out = again.stdout + again.stderr
    assert again.returncode == 0, out
    finished = [line for line in out.splitlines() if "is finished" in line]
    assert finished == [
        "job.yaml is finished: checkpoint ckpt-000000005 "
        f"({tmp_path / 'ckpt'}) is at step 5, the end of epoch 1 of 1. "
        "To train more, raise epochs above 1 or set a new checkpoint_dir."
    ], out
    assert (tmp_path / "model" / "model.json").is_file()  # exported again, from the checkpoint
    assert out.count("prediction ") == 2
    assert "example=" not in out and "crashed" not in out and "train: " not in out

    plain = tmp_path / "plain.yaml"  # the same job without export: nothing starts
    plain.write_text(job.read_text().replace("export_dir: model\n", ""))
    result = run_train(plain)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.splitlines() == [finished[0].replace("job.yaml", "plain.yaml")]
    assert result.stderr == ""


# ------------------------------------------------------------------------ one label class
@pytest.mark.slow
def test_a_label_with_one_class_in_the_sample_is_refused_naming_the_values_seen(
    tmp_path: Path,
) -> None:
    job = csv_job(tmp_path)
    job.write_text(job.read_text().replace("positive: [Y]", "positive: ['yes']"))
    result = CliRunner().invoke(cli, ["train", str(job)])
    assert result.exit_code == 1, result.output
    assert result.output.startswith("Error: dataset.label: label column 'y': every sampled row "
                                    "is negative (300 rows of the training split); positive: "
                                    "['yes'] matched none; values seen in train.csv: 'N' ("), \
        result.output  # fmt: skip
    assert "'Y' (" in result.output and "job.yaml:5" in result.output
    assert "shards:" not in result.output and "NN workers" not in result.output


def test_the_label_check_names_each_rule_and_accepts_a_rare_positive(tmp_path: Path) -> None:
    def fitted(text: str) -> tuple[JobConfig, Any]:
        (tmp_path / "job.yaml").write_text(text)
        job = JobConfig.from_yaml(tmp_path / "job.yaml")
        return job, job.dataset_spec.fit()

    write_rows(tmp_path / "test.csv", 10)
    write_rows(tmp_path / "train.csv", 300, lambda i: "0")
    job, pipeline = fitted(CSV_JOB.replace("positive: [Y]", "name: y"))
    with pytest.raises(ConfigError, match=r"every sampled row is negative .*1 \(or \+1\) is "
                       r"positive.*values seen in train.csv: '0' \(300\)$"):  # fmt: skip
        check_label_classes(job, pipeline)
    write_rows(tmp_path / "train.csv", 300, lambda i: str(i % 10))
    job, pipeline = fitted(CSV_JOB.replace("positive: [Y]", "threshold: 10"))
    with pytest.raises(ConfigError, match=r"every value is below threshold: 10; values seen"):
        check_label_classes(job, pipeline)
    job, pipeline = fitted(CSV_JOB.replace("positive: [Y]", "positive: ['0', '1', '2', '3', "
                                           "'4', '5', '6', '7', '8', '9']"))  # fmt: skip
    with pytest.raises(ConfigError, match=r"every sampled row is positive .* matched every value"):
        check_label_classes(job, pipeline)
    write_rows(tmp_path / "train.csv", 300, lambda i: "Y" if i == 250 else "N")
    job, pipeline = fitted(CSV_JOB)
    check_label_classes(job, pipeline)  # one positive in the sample is enough


# ------------------------------------------------------------------------ failures
def test_ranks_record_errors_and_crashes_and_the_first_error_is_the_cause(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert not is_transient(ConfigError("dataset", "bad"))
    assert not is_transient(RuntimeError("mat1 and mat2 shapes cannot be multiplied"))
    assert not is_transient(GradientPushFailedError("x", cause="InvalidArgumentError"))
    assert not is_transient(EmbeddingWorkerError("the embedding worker could not start: x"))
    assert is_transient(UnavailableError("shard 0 is down"))
    assert is_transient(GradientPushFailedError("x", cause="UnavailableError"))
    assert is_transient(EmbeddingWorkerError("the embedding worker (pid 7) exited with code -9"))
    assert is_transient(RuntimeError("[gloo/transport/tcp/pair.cc:534] Connection closed by peer"))
    assert is_transient(ConnectionResetError("reset"))

    monkeypatch.setenv("EMBEDDB_TRAIN_ATTEMPT", "1")
    monkeypatch.setenv("RANK", "1")
    # the rank the error tore down may write its record first
    torn = RuntimeError("[gloo/transport/tcp/pair.cc:1] Connection closed by peer")
    write_failure(tmp_path, torn)
    monkeypatch.setenv("RANK", "0")
    write_failure(tmp_path, ConfigError("dataset.test", "the test split holds\nno rows"))
    monkeypatch.setenv("EMBEDDB_TRAIN_ATTEMPT", "0")
    write_failure(tmp_path, UnavailableError("shard 0 is down"))
    attempt = read_failures(tmp_path, 1)
    assert [(f.rank, f.transient) for f in attempt] == [(1, True), (0, False)]
    cause = first_failure(attempt)
    assert str(cause) == "rank 0: ConfigError: dataset.test: the test split holds no rows"
    crash = first_failure(read_failures(tmp_path, 0))
    assert crash is not None and crash.transient
    assert first_failure(read_failures(tmp_path / "nowhere")) is None


def test_torchruns_failure_report_names_the_crashed_rank() -> None:
    import io

    report = (
        "=" * 60 + "\nembeddb.trainer.run FAILED\n" + "-" * 60
        + "\nFailures:\n  <NO_OTHER_FAILURES>\n" + "-" * 60
        + "\nRoot Cause (first observed failure):\n[0]:\n"
        "  time      : 2025-01-01_00:00:00\n  rank      : 1 (local_rank: 1)\n"
        "  exitcode  : -9 (pid: 4242)\n  error_file: <N/A>\n"
        "  traceback : Signal 9 (SIGKILL) received by PID 4242\n" + "=" * 60 + "\n"
    )  # fmt: skip
    sink = io.StringIO()
    killed = StderrFilter(io.BytesIO(("rank line\n" + report).encode()), sink)
    killed.join()
    assert sink.getvalue() == "rank line\n"
    assert str(killed.crash()) == "rank 1 was killed by SIGKILL"
    exited = StderrFilter(io.BytesIO(report.replace("-9 (pid", "1 (pid").encode()), sink)
    exited.join()
    assert str(exited.crash()) == "rank 1 exited with code 1"
    # the rank the signal killed, though the report lists first another it tore down
    two = report.replace("  <NO_OTHER_FAILURES>\n", "[1]:\n  rank      : 0 (local_rank: 0)\n"
                         "  exitcode  : 75 (pid: 4241)\n")  # fmt: skip
    both = StderrFilter(io.BytesIO(two.encode()), sink)
    both.join()
    assert str(both.crash()) == "rank 1 was killed by SIGKILL"
    # torchrun stops the other ranks with SIGTERM: a signal too, but not the root cause
    torn = report.replace("  <NO_OTHER_FAILURES>\n", "[1]:\n  rank      : 0 (local_rank: 0)\n"
                          "  exitcode  : -15 (pid: 4241)\n")  # fmt: skip
    stopped = StderrFilter(io.BytesIO(torn.encode()), sink)
    stopped.join()
    assert str(stopped.crash()) == "rank 1 was killed by SIGKILL"
    assert StderrFilter(io.BytesIO(b"nothing\n"), io.StringIO()).crash() is None


@pytest.mark.slow
def test_a_rank_error_is_not_restarted_and_is_the_one_error_line(tmp_path: Path) -> None:
    """The test split holds one class: rank 0 fails after training, deterministically. The job
    checkpoints (max_restarts 3), yet it runs once and says why."""
    job = csv_job(tmp_path, "checkpoint_dir: ckpt\n", test_label=lambda i: "N")
    result = run_train(job)
    out = result.stdout + result.stderr
    assert result.returncode == 1, out
    errors = [line for line in out.splitlines() if line.startswith("Error: ")]
    assert errors == [
        "Error: the NN workers failed: rank 0: ConfigError: dataset.test: every one of the 100 "
        "rows of the test split is negative: a test AUC needs both classes (check the test "
        "files or the split)"
    ], out
    assert "crashed" not in out and "resumed from checkpoint" not in out
    assert "Traceback" not in out


# ------------------------------------------------------------------------ JSON logs, Ctrl-C
@pytest.mark.slow
def test_a_fatal_error_under_json_logs_is_one_json_record(tmp_path: Path) -> None:
    bad = tmp_path / "job.yaml"
    bad.write_text("model: builtin:dnn\nepochs: 0\n")
    for args in (["train", str(bad)], ["train"], ["train", str(tmp_path / "missing.yaml")]):
        result = subprocess.run(
            [sys.executable, "-m", "embeddb", "--log-format", "json", *args],
            capture_output=True,
            text=True,
            cwd=ROOT,
            timeout=60,
            check=False,
        )
        assert result.returncode in (1, 2), result.stderr
        assert json_records(result.stdout) == []
        (record,) = json_records(result.stderr)
        assert record["level"] == "ERROR" and record["logger"] == "embeddb", record
    assert "epochs" in json_records(
        subprocess.run(
            [sys.executable, "-m", "embeddb", "--log-format", "json", "train", str(bad)],
            capture_output=True, text=True, cwd=ROOT, timeout=60, check=False,
        ).stderr
    )[0]["message"]  # fmt: skip


@pytest.mark.slow
def test_ctrl_c_under_json_logs_stops_everything_quietly_in_json(tmp_path: Path) -> None:
    """Ctrl-C on a terminal: SIGINT to the whole foreground process group, once training runs."""
    job = tmp_path / "job.yaml"
    job.write_text(f"model: {MODEL}:AdultModel\nepochs: 50\nbatch_size: 64\n")
    stderr = tmp_path / "stderr.txt"
    with stderr.open("w") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "embeddb", "--log-format", "json", "train", str(job)],
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            cwd=ROOT,
            start_new_session=True,  # its own process group, as a shell's foreground job
        )
    assert proc.stdout is not None
    lines: list[str] = []
    seen: set[int] = set()
    with proc, proc.stdout:
        try:
            for line in proc.stdout:
                lines.append(line)
                seen |= descendants(proc.pid)
                if json.loads(line)["message"].startswith("train: "):  # progress: training
                    break
            assert proc.poll() is None, "".join(lines) + stderr.read_text()
            seen |= descendants(proc.pid)
            os.killpg(proc.pid, signal.SIGINT)
            lines += proc.stdout.readlines()
            assert proc.wait(timeout=60) == 130
        except BaseException:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            raise
    records = json_records("".join(lines)) + json_records(stderr.read_text())
    messages = [str(r["message"]) for r in records]
    assert [m for m in messages if "interrupted" in m] == [
        "interrupted: stopped every process of the job"
    ], messages
    assert not [m for m in messages if "retry" in m or "Traceback" in m or "failed" in m], messages
    assert len(seen) >= 4, seen  # the cluster and its shard, torchrun, the rank...
    assert_all_gone(seen)
