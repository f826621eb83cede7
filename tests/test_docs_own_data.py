"""docs/own-data.md, run as written: its commands in order, in an empty directory.

The page's blocks are the test's input: the first ``bash`` block (make the data), the first
``yaml`` block (``job.yaml``), the last ``bash`` block (train; serve-model in the background;
curl). Only what a test must change is changed: the example script's path becomes absolute,
the server's ports are the ones it binds (port 0 with a port file) instead of 8080, and curl
waits for the server to be up.

Section 4's examples (other file layouts) are run too: each file shown there (a ``text`` block
after a line "`path`:") is written, and each ``yaml`` block's ``dataset:`` is fitted and read.
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
import yaml

from embeddb.features import DatasetSpec
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

    job = _blocks("yaml")[0]
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


def _layout_examples() -> list[tuple[dict[str, str], str]]:
    """``(files so far, yaml)`` of each example of section 4, in page order."""
    page = PAGE.read_text(encoding="utf-8")
    section = page[page.index("## 4. ") :]
    section = section[: section.index("\n## ")]
    files: dict[str, str] = {}
    examples = []
    for match in re.finditer(r"(?:`([^`\n]+)`:\n\n)?```(text|yaml)\n(.*?)```", section, re.S):
        name, kind, body = match.groups()
        if kind == "text" and name:
            files[name] = body
        elif kind == "yaml":
            examples.append((dict(files), body))
    return examples


EXAMPLES = _layout_examples()


def test_section_4_has_an_example_of_each_layout() -> None:
    jobs = "".join(job for _, job in EXAMPLES)
    assert len(EXAMPLES) == 5
    for key in ("header: {train: true, test: false}", "derived:", "slots:", "indexes:"):
        assert key in jobs


@pytest.mark.parametrize("index", range(len(EXAMPLES)))
def test_the_layout_examples_read_their_files(tmp_path: Path, index: int) -> None:
    files, job = EXAMPLES[index]
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text, encoding="utf-8")
    spec = DatasetSpec.from_yaml_node(yaml.safe_load(job)["dataset"], base_dir=tmp_path)
    pipeline = spec.fit()
    batches = [b for s in ("train", "test") for b in spec.reader(pipeline, s, 64, train=True)]
    rows = 0
    for split, paths in (("train", spec.train_files()), ("test", spec.test_files())):
        skip = spec.format != "libsvm" and spec.dialect(split).header  # the header line
        rows += sum(len(p.read_text(encoding="utf-8").splitlines()) - skip for p in paths)
    assert sum(b.batch_size for b in batches) == rows
    for name in pipeline.id_features:  # every feature of the page's job gets ids
        assert sum(b.feature(name).values.size for b in batches) > 0, name
