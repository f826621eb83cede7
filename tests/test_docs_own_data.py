"""docs/own-data.md, run as written: its commands in order, in an empty directory.

The page's blocks are the test's input: the first ``bash`` block (make the data), the ``yaml``
block (``job.yaml``), the last ``bash`` block (train; serve-model in the background; curl).
Only what a test must change is changed: the example script's path becomes absolute, the
server's ports are the ones it binds (port 0 with a port file) instead of 8080, and curl waits
for the server to be up.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import StartServe, serve_processes

pytest.importorskip("torch", reason="the walkthrough trains a model (the trainer extra)")

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "own-data.md"


def _blocks(kind: str) -> list[str]:
    return re.findall(rf"```{kind}\n(.*?)```", PAGE.read_text(encoding="utf-8"), flags=re.S)


def _lines(block: str) -> list[str]:
    return [line.split("  #")[0].strip() for line in block.splitlines() if line.strip()]


@pytest.fixture
def start(tmp_path: Path) -> Iterator[StartServe]:
    (tmp_path / "servers").mkdir()
    yield from serve_processes(tmp_path / "servers")


@pytest.mark.slow
def test_the_own_data_walkthrough_runs(tmp_path: Path, start: StartServe) -> None:
    make, *_ = _lines(_blocks("bash")[0])
    assert make.startswith("python examples/clicks/make_data.py")
    argv = shlex.split(make)
    argv[0], argv[1] = sys.executable, str(ROOT / argv[1])
    subprocess.run(argv, cwd=tmp_path, check=True, capture_output=True)
    assert (tmp_path / "data" / "train.csv").is_file()
    with (tmp_path / "data" / "train.csv").open() as fh:
        header = fh.readline()
    assert header.strip() in _blocks("text")[0], "the page shows the file's real header"

    (job,) = _blocks("yaml")
    (tmp_path / "job.yaml").write_text(job, encoding="utf-8")
    train, serve, curl = _lines(_blocks("bash")[-1])

    assert train == "embeddb train job.yaml"
    done = subprocess.run(
        [sys.executable, "-m", "embeddb.cli", *shlex.split(train)[1:]],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    test_auc = float(done.stdout.split("test AUC ")[1].split()[0])
    assert test_auc > 0.65, done.stdout[-2000:]
    assert (tmp_path / "model" / "features.json").is_file()

    assert serve.startswith("embeddb serve-model ") and serve.endswith(" &")
    args = shlex.split(serve[: -len(" &")])[2:]
    args[args.index("--http-port") + 1] = "0"
    args = [str(tmp_path / a) if a in ("model", "ckpt") else a for a in args]
    server = start(*args, command="serve-model")
    http_port = server.ports["http"]

    assert curl.startswith("curl ")
    if shutil.which("curl") is None:
        pytest.skip("curl is not installed: the page's last command cannot run")
    argv = [a.replace("localhost:8080", f"127.0.0.1:{http_port}") for a in shlex.split(curl)]
    answer = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=True)
    scores = json.loads(answer.stdout)["scores"]
    assert len(scores) == 1 and 0.0 < scores[0] < 1.0
