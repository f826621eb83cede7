"""``embeddb train``: the job file, the launcher end to end (local shards, torchrun, Adult),
clean stops on Ctrl-C/SIGTERM, and the restart of every NN worker after one dies."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from embeddb.errors import ConfigError
from embeddb.trainer.checkpoints.files import latest_checkpoint
from embeddb.trainer.launcher.job import JobConfig
from embeddb.trainer.launcher.launch import torchrun_command
from tests.conftest import SHARED_DATA
from tests.support import eventually

ROOT = Path(__file__).resolve().parents[1]
MODEL = ROOT / "examples" / "adult" / "model.py"


def write_job(tmp_path: Path, **settings: object) -> Path:
    job = {"model": f"{MODEL}:AdultModel", "epochs": 1, "batch_size": 256, **settings}
    path = tmp_path / "job.yaml"
    path.write_text("".join(f"{k}: {v}\n" for k, v in job.items()))
    return path


def test_the_job_file_is_validated_with_clear_errors(tmp_path: Path) -> None:
    job = JobConfig.from_yaml(write_job(tmp_path, checkpoint_dir="ckpt", workers=2))
    assert (
        job.checkpoint_dir == tmp_path / "ckpt" and job.shard_data_dir() == tmp_path / "ckpt/shards"
    )
    assert job.embedding_config_path().name == "adult.yaml"
    command = torchrun_command(tmp_path / "job.yaml", job, tmp_path / "a.txt", predict=5)
    assert command[1:4] == ["-m", "torch.distributed.run", "--standalone"]
    assert "--nproc_per_node=2" in command
    assert "--max-restarts=0" in command  # the launcher restarts after a crash, torchrun never
    assert command[-2:] == ["--predict", "5"]
    for bad, match in [
        ("epochs: 0\n", "epochs"),
        ("mode: fast\n", "mode"),
        ("embedding_stage: fibre\n", "embedding_stage: must be one of process, thread"),
        ("colour: red\n", "colour"),
        ("optimizer: {type: lbfgs}\n", "optimizer"),
        ("embedding_config: nowhere.yaml\n", None),
    ]:
        path = tmp_path / "bad.yaml"
        path.write_text(f"model: m.py:M\n{bad}")
        if match is None:
            with pytest.raises(ConfigError, match="embedding_config"):
                JobConfig.from_yaml(path).embedding_config_path()
        else:
            with pytest.raises(ConfigError, match=match):
                JobConfig.from_yaml(path)
    with pytest.raises(ConfigError, match="no such"):
        JobConfig.from_yaml(tmp_path / "missing.yaml")


# ---------------------------------------------------------------------- tokens
RW_TOKEN = "job-rw-token-0123456789abcdef"


def private_file(path: Path, text: str, mode: int = 0o600) -> Path:
    path.write_text(text)
    path.chmod(mode)
    return path


def test_the_token_file_is_checked_when_the_job_loads(tmp_path: Path) -> None:
    private_file(tmp_path / "rw.token", f"rw {RW_TOKEN}  # the job's token\n")
    job = JobConfig.from_yaml(write_job(tmp_path, token_file="rw.token"))
    assert job.token_file == tmp_path / "rw.token"  # relative to the job file
    assert job.read_token() == RW_TOKEN
    assert RW_TOKEN not in repr(job)
    from embeddb.trainer.config import TrainerConfig
    from embeddb.trainer.embedding.worker import EmbeddingWorkerConfig

    config = TrainerConfig(worker=EmbeddingWorkerConfig(token=job.read_token()))
    assert config.embedding_worker().token == RW_TOKEN
    assert RW_TOKEN not in repr(config) + repr(config.embedding_worker())
    assert JobConfig.from_yaml(write_job(tmp_path)).read_token() is None
    private_file(tmp_path / "shared.token", RW_TOKEN, mode=0o640)
    private_file(tmp_path / "empty.token", "# nothing\n")
    for name, match in [
        ("missing.token", "token_file: .*cannot read"),
        ("shared.token", "token_file: .*chmod 600"),
        ("empty.token", "token_file: .*expected a token"),
    ]:
        with pytest.raises(ConfigError, match=match) as raised:
            JobConfig.from_yaml(write_job(tmp_path, token_file=name))
        assert raised.value.key == "token_file"


@pytest.fixture
def token_shard(tmp_path: Path) -> Iterator[str]:
    """One Adult shard on port 0 that requires bearer tokens (the job's is its rw token)."""
    from embeddb.config import EmbeddingConfig
    from embeddb.engine.shard import Shard
    from embeddb.server import ServerConfig, build_server
    from embeddb.transport.rpc import ListenConfig, Tokens

    config = EmbeddingConfig.from_yaml(
        JobConfig.from_yaml(write_job(tmp_path)).embedding_config_path()
    )
    shard = Shard(config, tmp_path / "shard")
    tokens = Tokens(read_write=frozenset({RW_TOKEN}), read_only=frozenset({"ro-" + RW_TOKEN}))
    server = build_server(shard, ServerConfig(listen=ListenConfig(tokens=tokens)))
    try:
        yield f"127.0.0.1:{server.port}"
    finally:
        server.stop(grace=0)
        shard.close()


@pytest.mark.slow
def test_a_job_without_its_token_file_fails_fast_on_shards_requiring_tokens(
    tmp_path: Path, token_shard: str
) -> None:
    job = write_job(tmp_path, addresses=f"[{token_shard}]")
    proc = start(job)
    out = finish(proc, job)  # fails fast: without retrying until a training-length timeout
    assert proc.returncode != 0, out
    assert "UnauthenticatedError" in out and "set token_file in the job" in out


@pytest.mark.slow
def test_a_job_with_its_token_file_trains_checkpoints_and_predicts_on_shards_requiring_tokens(
    tmp_path: Path, token_shard: str
) -> None:
    private_file(tmp_path / "rw.token", RW_TOKEN + "\n")
    job = write_job(
        tmp_path,
        addresses=f"[{token_shard}]",
        token_file="rw.token",
        checkpoint_dir="ckpt",
        metrics_file="metrics.jsonl",
        epochs=2,  # a checkpoint at the first epoch's end, within the timed training
    )
    proc = start(job, "--predict", "2")
    out = finish(proc, job)
    assert proc.returncode == 0, out
    assert "test AUC" in out and out.count("prediction ") == 2
    assert latest_checkpoint(tmp_path / "ckpt") is not None  # the snapshot call sent it too
    # the samples/s it prints include its checkpoints, and it says so, with their seconds
    metrics = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[-1])
    assert metrics["checkpoint_s"] > 0.0 and metrics["final_checkpoint_s"] > 0.0
    assert f"checkpoints included: {metrics['checkpoint_s']:.1f} s" in out


@pytest.mark.slow
def test_local_shards_of_a_job_with_a_token_file_require_its_token(tmp_path: Path) -> None:
    from embeddb.client import Client, ClientOptions
    from embeddb.errors import UnauthenticatedError
    from embeddb.trainer.launcher.launch import _shards

    private_file(tmp_path / "rw.token", RW_TOKEN)
    job = JobConfig.from_yaml(write_job(tmp_path, token_file="rw.token"))
    run_dir = tmp_path / "run"
    run_dir.mkdir(mode=0o700)
    with _shards(job, run_dir / "shards.txt", echo=lambda line: None):
        addresses = (run_dir / "shards.txt").read_text().split()
        assert (run_dir / "tokens.txt").stat().st_mode & 0o777 == 0o600
        with Client(addresses, ClientOptions(token=RW_TOKEN)) as client:
            assert client.list_tables()
        with Client(addresses) as client, pytest.raises(UnauthenticatedError):
            client.list_tables()


# ---------------------------------------------------------------------- processes
def _children() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        tree.setdefault(ppid, []).append(int(entry))
    return tree


def descendants(pid: int) -> set[int]:
    tree, found, todo = _children(), set(), [pid]
    while todo:
        for child in tree.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def rank_pid(launcher: int, local_rank: int) -> int | None:
    for pid in descendants(launcher):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if (
            b"embeddb.trainer.launcher.run" in cmdline
            and f"LOCAL_RANK={local_rank}".encode() in environ
        ):
            return pid
    return None


def start(job: Path, *args: str, group: bool = False) -> subprocess.Popen[str]:
    """``embeddb train JOB``, its output in ``JOB.out`` (a pipe nobody reads would fill);
    ``group``: in a process group of its own, as a shell's foreground job."""
    with open(job.with_suffix(".out"), "w") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "embeddb.cli", "train", str(job), *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=ROOT,
            start_new_session=group,
        )


def finish(proc: subprocess.Popen[str], job: Path) -> str:
    proc.wait(timeout=60)
    return job.with_suffix(".out").read_text()


def watch(
    proc: subprocess.Popen[str],
    seen: set[int],
    what: str,
    timeout: float,
    until: Callable[[], object] = lambda: False,
) -> None:
    """Record ``proc``'s descendants (sampled: no event reports them) until ``until()`` holds
    or ``proc`` exits."""

    def done() -> bool:
        seen.update(descendants(proc.pid))
        return proc.poll() is not None or bool(until())

    eventually(done, timeout, what)


def assert_all_gone(pids: set[int]) -> None:
    eventually(lambda: not [p for p in pids if alive(p)], 30, f"processes {sorted(pids)} to end")


@pytest.mark.slow
def test_a_job_trains_adult_predicts_and_leaves_no_process(tmp_path: Path) -> None:
    job = write_job(tmp_path, workers=2, metrics_file="metrics.jsonl")
    proc = start(job, "--predict", "3")
    seen: set[int] = set()
    watch(proc, seen, "the job to end", 300)
    out = finish(proc, job)
    assert proc.returncode == 0, out
    assert "torchrun --standalone --nproc_per_node=2" in out
    assert "samples/s" in out and "AUC" in out
    assert "\r" not in out  # progress to a file: plain lines, not a terminal's bar
    assert out.count("prediction ") == 3
    auc = float(out.split("test AUC ")[1].split()[0])
    assert auc > 0.85
    metrics = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[-1])
    assert metrics["test_auc"] == pytest.approx(auc, abs=1e-4)
    assert metrics["checkpoint_s"] == 0.0 and "checkpoints included" not in out
    # start-up: from the launcher's own start to the first step, through every process
    phases = metrics["startup_phases_s"]
    order = list(phases)
    assert order[0] == "command" and order[-1] == "first_step"
    for mark in ("validated", "shards_up", "torchrun", "rank_imports", "embedding_worker"):
        assert phases[mark] >= 0.0, mark
    assert metrics["startup_s"] == pytest.approx(sum(phases.values()))
    assert "(command start to the first step)" in out
    assert len(seen) >= 4  # shard, torchrun, 2 ranks (and their embedding workers)
    assert_all_gone(seen)


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_ctrl_c_or_sigterm_stops_every_process(tmp_path: Path, signum: int) -> None:
    """Ctrl-C: SIGINT to the terminal's whole foreground process group; SIGTERM: to the
    launcher alone. Either way one line, no retry warning or traceback, nothing left."""
    job = write_job(tmp_path, epochs=50, batch_size=64)
    proc = start(job, group=True)
    seen: set[int] = set()
    out = job.with_suffix(".out")
    watch(proc, seen, "training progress", 180, lambda: "samples/s" in out.read_text())
    assert rank_pid(proc.pid, 0) is not None, out.read_text()
    seen |= descendants(proc.pid)
    if signum == signal.SIGINT:
        os.killpg(proc.pid, signum)
    else:
        proc.send_signal(signum)
    text = finish(proc, job)
    assert proc.returncode == 130, text
    assert [line for line in text.splitlines() if "interrupted" in line] == [
        "interrupted: stopped every process of the job"
    ], text
    assert "retry" not in text and "Traceback" not in text and "Error" not in text, text
    assert_all_gone(seen)


@pytest.mark.slow
def test_a_dead_nn_worker_restarts_every_worker_from_the_last_checkpoint(tmp_path: Path) -> None:
    job = write_job(
        tmp_path, workers=2, epochs=2, batch_size=256, checkpoint_dir="ckpt", checkpoint_every=10
    )
    proc = start(job)
    seen: set[int] = set()
    watch(proc, seen, "a checkpoint", 180, lambda: latest_checkpoint(tmp_path / "ckpt"))
    victim = rank_pid(proc.pid, 1)
    assert victim is not None and proc.poll() is None
    os.kill(victim, signal.SIGKILL)
    watch(proc, seen, "the job to end", 300)
    out = finish(proc, job)
    assert proc.returncode == 0, out
    assert "the NN workers crashed (rank 1 was killed by SIGKILL); restarting them from " \
        "checkpoint ckpt-" in out  # fmt: skip
    assert "(restart 1 of 3)" in out and "resumed from checkpoint ckpt-" in out
    assert "test AUC" in out
    last = latest_checkpoint(tmp_path / "ckpt")
    assert last is not None and last.step == 2 * ((32561 + 255) // 256 // 2)
    assert_all_gone(seen)


@pytest.mark.slow
def test_the_quickstart_adult_example_reaches_auc_090(tmp_path: Path) -> None:
    """The README's first command, minus the install."""
    job = ROOT / "examples" / "adult" / "train.yaml"
    result = subprocess.run(
        [sys.executable, "-m", "embeddb.cli", "train", str(job), "--predict", "5"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert float(out.split("test AUC ")[1].split()[0]) >= 0.90
    assert out.count("prediction ") == 5


def test_train_reports_a_bad_job_file_cleanly(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from embeddb.cli import main

    bad = tmp_path / "job.yaml"
    bad.write_text("model: m.py:M\nepochs: -1\n")
    result = CliRunner().invoke(main, ["train", str(bad)])
    assert result.exit_code == 1 and "epochs" in result.output


@pytest.mark.slow
def test_restarted_workers_key_their_process_group_by_attempt() -> None:
    from embeddb.trainer import DistEnv

    env = {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "1"}
    assert DistEnv.from_environ(env).attempt is None  # not under torchrun's agent store
    agent = {**env, "TORCHELASTIC_USE_AGENT_STORE": "True", "TORCHELASTIC_RESTART_COUNT": "2"}
    assert DistEnv.from_environ(agent).attempt == 2


# ------------------------------------------------------------- Criteo and MovieLens examples
EXAMPLES = {
    # example: (its data folder in ../shared/data, lowest acceptable test AUC)
    "criteo": ("criteo", 0.66),
    "movielens": ("movielens-100k", 0.75),
}


def test_jobs_on_criteo_and_movielens_are_validated(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    cases: list[tuple[str, str]] = [
        ("dataset: criteo\ntrain_rows: 10\n", "data_dir.*required"),
        ("dataset: criteo\ndata_dir: data\n", "train_rows.*required"),
        ("dataset: criteo\ndata_dir: data\ntrain_rows: 0\n", "train_rows"),
        ("dataset: movielens\ndata_dir: data\nsplit: u9\n", "split"),
        ("dataset: movielens\ndata_dir: data\ntrain_rows: 5\n", "criteo only"),
        ("dataset: adult\nsplit: u1\n", "movielens only"),
        ("dataset: imagenet\n", "dataset"),
        ("skip_missing_data: maybe\n", "skip_missing_data"),
    ]
    for text, match in cases:
        path = tmp_path / "bad.yaml"
        path.write_text(f"model: m.py:M\n{text}")
        with pytest.raises(ConfigError, match=match):
            JobConfig.from_yaml(path)
    path = tmp_path / "ml.yaml"
    path.write_text("model: m.py:M\ndataset: movielens\ndata_dir: data\nsplit: u3\n")
    job = JobConfig.from_yaml(path)
    assert [p.name for p in job.data_files()][:2] == ["u3.base", "u3.test"]
    assert "u3.base" in (job.missing_data() or "")
    for name in ("u3.base", "u3.test", "u.user", "u.item"):
        (data / name).write_text("")
    (data / "u.genre.gz").write_bytes(b"")  # the gzipped name counts too
    assert job.missing_data() is None


@pytest.mark.parametrize("example", sorted(EXAMPLES))
def test_an_example_without_its_data_skips_or_fails_clearly(tmp_path: Path, example: str) -> None:
    """A checkout without ../shared (a user's fresh clone): the example says why and exits 0;
    the same job without ``skip_missing_data`` fails, naming the missing directory."""
    from click.testing import CliRunner

    from embeddb.cli import main

    job = tmp_path / "a" / "b" / example / "train.yaml"  # its data_dir resolves inside tmp_path
    job.parent.mkdir(parents=True)
    source = ROOT / "examples" / example
    for name in ("train.yaml", "model.py", "embedding.yaml"):
        (job.parent / name).write_text((source / name).read_text())
    result = CliRunner().invoke(main, ["train", str(job)])
    assert result.exit_code == 0, result.output
    assert result.output.startswith(f"skipped {job}") and "does not exist" in result.output
    job.write_text(job.read_text().replace("skip_missing_data: true", "skip_missing_data: false"))
    result = CliRunner().invoke(main, ["train", str(job)])
    assert result.exit_code == 1 and "data_dir" in result.output
    assert str(tmp_path / "shared" / "data") in result.output


@pytest.mark.slow
@pytest.mark.parametrize("example", sorted(EXAMPLES))
def test_the_criteo_and_movielens_examples_train_and_predict(example: str) -> None:
    folder, min_auc = EXAMPLES[example]
    if not (SHARED_DATA / folder).is_dir():
        pytest.skip(f"{SHARED_DATA / folder} is absent (not redistributable; dev checkouts only)")
    job = ROOT / "examples" / example / "train.yaml"
    result = subprocess.run(
        [sys.executable, "-m", "embeddb.cli", "train", str(job), "--predict", "3"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert "skipped" not in out
    assert float(out.split("test AUC ")[1].split()[0]) >= min_auc
    assert float(out.split("|  ")[1].split()[0].replace(",", "")) > 0  # samples/s printed
    assert out.count("prediction ") == 3


# ------------------------------------------------------------- friendly failures
def test_torchruns_noise_is_filtered() -> None:
    import io

    from embeddb.trainer.launcher.launch import StderrFilter

    noise = (
        "W1124 20:00:00.000000 123 torch/distributed/run.py:793] *****\n"
        "rank output line\n"
        "embeddb train: rank 1: CorruptDataError: data.csv:7: bad\n"
        "E1124 20:00:01.000000 123 torch/distributed/elastic/multiprocessing/api.py:1] failed\n"
        "Traceback (most recent call last):\n"
        '  File "x.py", line 1, in <module>\n'
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:\n"
        + "=" * 60
        + "\nembeddb.trainer.run FAILED\n"
        + "-" * 60
        + "\nRoot Cause (first observed failure):\n[0]:\n  rank      : 1\n"
        + "=" * 60
        + "\nafter the report\n"
    )
    sink = io.StringIO()
    StderrFilter(io.BytesIO(noise.encode()), sink).join()
    assert sink.getvalue() == "rank output line\nafter the report\n"


def test_job_errors_name_the_key_and_its_line(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text("model: m.py:M\nepochs: 3\nbatch_size: 0\n")
    with pytest.raises(ConfigError, match=r"batch_size: .*\(.*job\.yaml:3\)") as raised:
        JobConfig.from_yaml(path)
    assert raised.value.key == "batch_size"
    path.write_text("model: builtin:dnnn\n")
    with pytest.raises(ConfigError, match=r"model: .*dnnn.*job\.yaml:1"):
        JobConfig.from_yaml(path)
    path.write_text("model: builtin:fm\nepochs: [1\n")
    with pytest.raises(ConfigError, match=r"job\.yaml:\d+: is not valid YAML"):
        JobConfig.from_yaml(path)
