"""embeddb.common.progress: a tqdm bar on a terminal, periodic plain lines (never ``\\r``)
elsewhere,
off under ``--quiet``; and the plain lines of ``embeddb reshard`` / ``restore`` in a pipe."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from embeddb.cli.common import load_config
from embeddb.common.progress import QUIET_ENV, Progress, export_quiet, progress_enabled
from embeddb.engine.durability import snapshot
from embeddb.engine.shard import Shard

ROOT = Path(__file__).resolve().parents[1]
SNAP = "ckpt-1"


class FakeTTY(io.StringIO):
    """A terminal, as far as ``isatty`` tells."""

    def isatty(self) -> bool:
        return True


class Clock:
    """A time source the test moves by hand."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


# ------------------------------------------------------------------------------ the class
def test_not_a_tty_writes_plain_lines_with_count_total_rate_and_fields() -> None:
    out, clock = io.StringIO(), Clock()
    p = Progress("reshard", total=524_288, stream=out, enabled=True, interval_s=0, clock=clock)
    clock.now += 2.0
    p.update(131_072, loss=0.41)
    assert out.getvalue() == "reshard: 131,072/524,288 rows (25%), 65,536 rows/s, loss=0.41\n"
    assert "\r" not in out.getvalue()


def test_plain_lines_come_once_per_interval_and_once_at_close() -> None:
    out, clock = io.StringIO(), Clock()
    p = Progress("train", unit="steps", stream=out, enabled=True, interval_s=10, clock=clock)
    for _ in range(5):
        clock.now += 1.0
        p.update(1, AUC="0.7700")
    assert out.getvalue() == ""  # 5 s: under the interval
    clock.now += 6.0
    p.update(2, AUC="0.7800")
    assert out.getvalue().splitlines() == ["train: 7 steps, 1 steps/s, AUC=0.7800"]
    clock.now += 3.0
    p.update(3)
    p.close()
    p.close()  # idempotent: no second final line
    lines = out.getvalue().splitlines()
    assert lines[1:] == ["train: 10 steps, 1 steps/s, AUC=0.7800"]
    assert "\r" not in out.getvalue()
    p.update(5)  # after close: ignored
    assert out.getvalue().splitlines() == lines and p.count == 10


def test_close_does_not_repeat_the_last_line_unchanged() -> None:
    out = io.StringIO()
    with Progress("restore", total=4, unit="bytes", stream=out, enabled=True, interval_s=0) as p:
        p.update(4)
    assert len(out.getvalue().splitlines()) == 1 and "4/4 bytes (100%)" in out.getvalue()


def test_fields_replace_earlier_values_and_keep_the_others() -> None:
    out = io.StringIO()
    p = Progress("train", stream=out, enabled=True, interval_s=0, clock=lambda: 0.0)
    p.update(1, epoch="1/2", loss=0.5, step=1_000)
    p.update(1, loss=0.25)
    assert out.getvalue().splitlines()[-1] == "train: 2 rows, epoch=1/2, loss=0.25, step=1,000"


def test_set_total_adds_the_share() -> None:
    out = io.StringIO()
    p = Progress("reshard", stream=out, enabled=True, interval_s=0, clock=lambda: 0.0)
    p.update(5)
    p.set_total(20)
    p.update(5)
    assert out.getvalue().splitlines() == ["reshard: 5 rows", "reshard: 10/20 rows (50%)"]


def test_a_tty_gets_a_tqdm_bar() -> None:
    out = FakeTTY()
    with Progress("reshard", total=100, stream=out, enabled=True) as p:
        p.update(40, loss=0.5)
        p.update(60)
    text = out.getvalue()
    assert "\r" in text and "reshard" in text and "100/100" in text, text
    assert "loss=0.5" in text
    assert "reshard: 100/100 rows (100%)" not in text  # no plain line on a terminal


def test_disabled_writes_nothing_but_counts() -> None:
    out, tty = io.StringIO(), FakeTTY()
    for stream in (out, tty):
        with Progress("x", total=3, stream=stream, enabled=False, interval_s=0) as p:
            p.update(3)
        assert p.count == 3
    assert out.getvalue() == "" and tty.getvalue() == ""


def test_quiet_disables_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(QUIET_ENV, raising=False)
    assert progress_enabled()
    restore = export_quiet(True)
    try:
        assert os.environ[QUIET_ENV] == "1" and not progress_enabled()
        out = io.StringIO()
        with Progress("x", stream=out, interval_s=0) as p:
            p.update(1)
        assert out.getvalue() == ""
    finally:
        restore()
    assert QUIET_ENV not in os.environ and progress_enabled()
    assert not progress_enabled({QUIET_ENV: "true"}) and progress_enabled({QUIET_ENV: "0"})


def test_a_broken_stream_turns_progress_off() -> None:
    out = io.StringIO()
    p = Progress("x", stream=out, enabled=True, interval_s=0)
    out.close()
    p.update(1)  # no ValueError from the closed stream
    p.close()
    assert p.count == 1


# ------------------------------------------------------------------------------ the commands
@pytest.fixture(scope="module")
def shard_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One shard of the packaged config with rows and snapshot ``ckpt-1``; closed."""
    root = tmp_path_factory.mktemp("progress")
    ids = np.arange(1, 2001, dtype=np.uint64)
    with Shard(load_config(None), root / "shard-0") as shard:
        shard.lookup("item_id", ids)
        shard.snapshot(SNAP)
    return root


def _embeddb(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if k != QUIET_ENV}
    return subprocess.run(
        [sys.executable, "-m", "embeddb.cli", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
        env={**environ, **(env or {})},
    )


@pytest.mark.slow
def test_reshard_in_a_pipe_writes_plain_progress_lines(shard_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    args = ["--from", str(shard_dir), "--to", str(out), "--num-shards", "2", "--snapshot", SNAP]
    result = _embeddb("reshard", *args, "--chunk-rows", "500")
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("reshard: ")]
    assert lines and lines[-1].startswith("reshard: 2,000/2,000 rows (100%)"), result.stderr
    assert "\r" not in result.stderr + result.stdout
    assert "2,000 rows from 1 shards to 2" in result.stdout
    snapshot.verify(out / "shard-1" / "snapshots" / SNAP)


@pytest.mark.slow
def test_restore_in_a_pipe_reports_bytes_verified_and_quiet_silences_it(
    shard_dir: Path, tmp_path: Path
) -> None:
    import shutil

    data = tmp_path / "shard"
    shutil.copytree(shard_dir / "shard-0", data)
    files = snapshot.read_manifest(data / "snapshots" / SNAP)["files"]
    total = sum(f["size"] for f in files.values())
    result = _embeddb("restore", "--data-dir", str(data), "--snapshot", SNAP)
    assert result.returncode == 0, result.stderr
    assert "\r" not in result.stderr + result.stdout
    lines = [line for line in result.stderr.splitlines() if line.startswith("restore: ")]
    assert len(lines) == 1 and lines[0].startswith("restore: verifying: "), result.stderr
    assert f"{total:,}/{total:,} bytes (100%)" in lines[0], lines
    assert f"restored to snapshot {SNAP!r}" in result.stdout
    for quiet in (["--quiet"], []):
        env = {} if quiet else {QUIET_ENV: "1"}
        result = _embeddb(*quiet, "restore", "--data-dir", str(data), "--snapshot", SNAP, env=env)
        assert result.returncode == 0, result.stderr
        assert "restore: " not in result.stderr and "restored to snapshot" in result.stdout
