"""benchmarks/train.py's table-layout ratios, peers section, start-up and public-shape pieces
(``_train_layouts.py``, ``_train_startup.py``, ``_train_adult_torch.py``, ``_train_public.py``,
``_plain_torch.py``): their arithmetic and files, never the runs themselves."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
import torch

from embeddb.common.evaluation import auc
from embeddb.trainer.launcher.job import JobConfig
from embeddb.trainer.models import build_model

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCHMARKS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def mods() -> Iterator[dict[str, ModuleType]]:
    sys.path.insert(0, str(BENCHMARKS))  # the scripts import their siblings
    try:
        yield {
            n: _load(n)
            for n in ("train", "_train_layouts", "_train_startup", "_train_public", "_plain_torch")
        }
    finally:
        sys.path.remove(str(BENCHMARKS))


def test_one_table_per_feature_is_the_default_layout(mods: dict[str, ModuleType]) -> None:
    args = mods["train"].parse([])
    assert args.layout == "per-feature"
    assert not args.skip_layouts and not args.skip_startup
    assert mods["train"].parse(["--quick"]).layout == "per-feature"


def test_the_layout_ratios_are_per_feature_over_shared(mods: dict[str, ModuleType]) -> None:
    layouts, run = mods["_train_layouts"], mods["train"].Run
    runs = {
        "hybrid": run("hybrid", samples=1000, seconds=1.0),
        "hybrid_shared": run("hybrid_shared", samples=2000, seconds=1.0),
        "hybrid_b128": run("hybrid_b128", samples=500, seconds=1.0),
        "hybrid_shared_b128": run("hybrid_shared_b128", samples=2000, seconds=1.0),
    }
    ratios = layouts.layout_ratios(runs, "per-feature")
    assert ratios == {"table_layout_ratio": 0.5, "table_layout_ratio_b128": 0.25}
    # the main layout shared: the other runs are the per-feature ones, the ratio the same way
    flipped = {
        "hybrid": run("hybrid", samples=2000, seconds=1.0),
        "hybrid_per_feature": run("hybrid_per_feature", samples=1000, seconds=1.0),
    }
    assert layouts.layout_ratios(flipped, "shared") == {
        "table_layout_ratio": 0.5,
        "table_layout_ratio_b128": None,
    }
    assert layouts.layout_name("per-feature", "_b128") == "hybrid_per_feature_b128"


def test_the_peers_section(mods: dict[str, ModuleType]) -> None:
    layouts, run = mods["_train_layouts"], mods["train"].Run
    runs = {
        "hybrid": run("hybrid", samples=1000, seconds=1.0, curve=[(1000, 1.0, 0.70)]),
        "inprocess": run("inprocess", samples=4000, seconds=1.0, curve=[(4000, 1.0, 0.72)]),
    }
    peers = layouts.peers_json(runs, 512, "OSError: Could not load fbgemm_gpu/x.so")
    assert peers["batch"] == 512
    assert peers["pytorch_inprocess"]["hybrid_vs"] == pytest.approx(0.25)
    assert peers["pytorch_inprocess"]["auc_minus_hybrid"] == pytest.approx(0.02)
    assert peers["torchrec"]["skipped"].startswith("OSError: Could not load")
    assert "fbgemm-gpu-cpu" in peers["torchrec"]["skipped"]
    plain = layouts.peers_json(runs, 512, "ModuleNotFoundError: No module named 'torchrec'")
    assert plain["torchrec"] == {"skipped": "ModuleNotFoundError: No module named 'torchrec'"}
    reason = layouts.torchrec_missing()
    assert reason is None or reason.split(":")[0].endswith("Error")


def test_the_adult_job_copy_is_the_example_with_a_metrics_file(
    mods: dict[str, ModuleType], tmp_path: Path
) -> None:
    job_path, metrics = mods["_train_startup"].adult_job(tmp_path)
    job = JobConfig.from_yaml(job_path)
    example = JobConfig.from_yaml(mods["_train_startup"].ADULT_JOB)
    assert job.metrics_file is not None and Path(job.metrics_file) == metrics
    assert (job.epochs, job.batch_size, job.mode) == (example.epochs, example.batch_size, "hybrid")


def test_last_json_takes_the_last_object_line(mods: dict[str, ModuleType]) -> None:
    last_json = mods["_train_startup"].last_json
    assert last_json('noise\n{"a": 1}\n{"b": 2}\nbye\n') == {"b": 2}
    assert last_json("{not json\n[1]\n") == {}


def test_the_plain_pytorch_scripts_auc_agrees_with_embeddbs(
    mods: dict[str, ModuleType],
) -> None:
    script = _load("_train_adult_torch")  # its loop and AUC: _plain_torch.py (mods: on the path)
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 2, 400).astype(np.float64)
    scores = np.round(labels * 0.3 + rng.random(400), 1)  # ties on purpose
    assert script.auc(labels, scores) == pytest.approx(auc(labels=labels, scores=scores))
    assert len(script.CATEGORICAL) == 8 and len(script.NUMERIC) == 6


def test_hybrid_against_inprocess_at_batch_128(mods: dict[str, ModuleType]) -> None:
    layouts, run = mods["_train_layouts"], mods["train"].Run
    runs = {
        "hybrid": run("hybrid", samples=1000, seconds=1.0, curve=[(1000, 1.0, 0.70)]),
        "inprocess": run("inprocess", samples=4000, seconds=1.0, curve=[(4000, 1.0, 0.72)]),
        "hybrid_b128": run("hybrid_b128", samples=600, seconds=2.0),
        "inprocess_b128": run("inprocess_b128", samples=1000, seconds=1.0, curve=[(1, 1.0, 0.7)]),
    }
    assert layouts.hybrid_vs_inprocess_b128(runs) == pytest.approx(0.3)
    small = layouts.peers_json(runs, 512, None)["batch_128"]
    assert small["hybrid_vs"] == pytest.approx(0.3)
    assert small["hybrid_samples_per_s"] == 300.0
    assert small["pytorch_inprocess_samples_per_s"] == 1000.0
    del runs["inprocess_b128"]
    assert layouts.hybrid_vs_inprocess_b128(runs) is None
    assert layouts.peers_json(runs, 512, None)["batch_128"] is None


def test_the_public_shape_data_is_avazu_shaped_and_seeded(
    mods: dict[str, ModuleType], tmp_path: Path
) -> None:
    public = mods["_train_public"]
    train, test = public.write_data(tmp_path / "a", rows=2000)
    header, *rows = train.read_text().splitlines()
    assert header.split(",") == [*public.FIELDS, "click"] and len(public.FIELDS) == 22
    assert len(rows) == 2000 - public.TEST_ROWS
    assert len(test.read_text().splitlines()) == public.TEST_ROWS + 1
    cells = [row.split(",") for row in rows]
    assert all(len(c) == 23 and c[-1] in ("0", "1") for c in cells)
    assert all(len(v) == 8 for c in cells for v in c[:-1])  # 8-hex-digit hashes, as Avazu's
    clicks = np.mean([c[-1] == "1" for c in cells])
    assert 0.05 < clicks < 0.4
    again, _ = public.write_data(tmp_path / "b", rows=2000)
    assert again.read_text() == train.read_text()  # the fixed seed


def test_the_public_shape_job_is_the_plain_scripts_shape(
    mods: dict[str, ModuleType], tmp_path: Path
) -> None:
    public = mods["_train_public"]
    job_path, metrics = public.public_job(tmp_path)
    job = JobConfig.from_yaml(job_path)
    assert job.metrics_file is not None and Path(job.metrics_file) == metrics
    assert (job.batch_size, job.epochs, job.mode, job.builtin_model) == (
        256, public.EPOCHS, "hybrid", "dnn",
    )  # fmt: skip
    assert job.auto_embedding and job.embedding_dim == public.DIM
    # the plain script's network is builtin:dnn's, layer for layer
    plain = _load("_train_public_torch").DNN(22 * public.DIM)
    builtin = build_model("dnn", id_dims=[public.DIM] * 22, non_id_widths=[])
    shapes = [tuple(p.shape) for p in plain.parameters()]
    assert shapes == [tuple(p.shape) for p in builtin.parameters()]
    assert shapes[0] == (256, 22 * public.DIM) and shapes[-1] == (1,)
    assert plain([], [torch.zeros(3, public.DIM)] * 22).shape == (3, 1)
