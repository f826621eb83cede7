"""benchmarks/train.py's table-layout ratios, peers section and start-up pieces
(``_train_layouts.py``, ``_train_startup.py``, ``_train_adult_torch.py``): their arithmetic and
files, never the runs themselves."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

from embeddb.common.evaluation import auc
from embeddb.trainer.launcher.job import JobConfig

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
        yield {n: _load(n) for n in ("train", "_train_layouts", "_train_startup")}
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


def test_the_plain_pytorch_scripts_auc_agrees_with_embeddbs() -> None:
    script = _load("_train_adult_torch")
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 2, 400).astype(np.float64)
    scores = np.round(labels * 0.3 + rng.random(400), 1)  # ties on purpose
    assert script.auc(labels, scores) == pytest.approx(auc(labels=labels, scores=scores))
    assert len(script.CATEGORICAL) == 8 and len(script.NUMERIC) == 6
