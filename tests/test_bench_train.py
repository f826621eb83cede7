"""benchmarks/train.py: a smoke test of its pieces (the in-process baseline on a few tiny
batches, the embedding configs of both layouts, the curve files), never the whole benchmark."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch

from embeddb.config import EmbeddingConfig
from embeddb.features import SyntheticCriteo, SyntheticCriteoConfig

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    sys.path.insert(0, str(BENCHMARKS))  # the script imports its sibling ``_report``
    try:
        spec = importlib.util.spec_from_file_location("bench_train", BENCHMARKS / "train.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # its dataclasses look their module up there
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(BENCHMARKS))


@pytest.mark.slow
def test_the_inprocess_baseline_trains_and_scores(bench: ModuleType, tmp_path: Path) -> None:
    data = SyntheticCriteo(SyntheticCriteoConfig(cardinality=500, chunk_size=1024))
    train = list(data.batches(1024, 128, "train"))
    test = list(data.batches(512, 256, "test", requires_grad=False))
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        run = bench.run_inprocess("inprocess", train, test, 2, 256, torch.device("cpu"))
    finally:
        torch.set_num_threads(threads)
    assert run.samples == 1024
    assert [point[0] for point in run.curve] == [512, 1024]
    assert run.samples_per_s > 0
    assert 0.0 <= run.auc <= 1.0 and not math.isnan(run.auc)

    csv_path, png_path, note = bench.write_curves([run], tmp_path)
    assert csv_path.read_text().splitlines()[0] == "run,samples,train_seconds,auc"
    assert (png_path is not None and png_path.is_file()) or note is not None


@pytest.mark.parametrize(("layout", "tables"), [("shared", 1), ("per-feature", 26)])
def test_the_embedding_layouts(bench: ModuleType, layout: str, tables: int) -> None:
    config = EmbeddingConfig.from_yaml_text(bench.embedding_yaml(layout, 1000))
    assert len(config.features) == 26
    assert len(config.tables) == tables
    assert sum(t.capacity for t in config.tables.values()) == 26 * 1000
    assert {f.dim for f in config.features.values()} == {16}


@pytest.mark.slow
def test_the_small_model_trains_in_process(bench: ModuleType) -> None:
    small = bench.SMALL
    data = SyntheticCriteo(
        SyntheticCriteoConfig(
            num_id_features=small.num_id, num_dense=small.num_dense, cardinality=500
        )
    )
    train = list(data.batches(1024, small.batch, "train"))
    test = list(data.batches(512, 256, "test", requires_grad=False))
    run = bench.run_inprocess("small", train, test, 1, 64, torch.device("cpu"), small, 2)
    assert run.samples == 1024 and run.warm is not None and run.warm[0] == 2 * small.batch
    assert run.steady_samples_per_s > 0 and 0.0 <= run.auc <= 1.0
    config = EmbeddingConfig.from_yaml_text(bench.embedding_yaml("shared", 100, small))
    assert len(config.features) == 10 and {f.dim for f in config.features.values()} == {16}


def test_the_steady_rate_leaves_the_warm_up_out(bench: ModuleType) -> None:
    run = bench.Run("r", samples=1000, seconds=3.0, warm=(200, 2.0))
    assert run.samples_per_s == pytest.approx(1000 / 3.0)
    assert run.steady_samples_per_s == pytest.approx(800 / 1.0)
    assert bench.Run("r", samples=10, seconds=2.0).steady_samples_per_s == 5.0


def test_hybrids_window_covers_the_network_round_trips(bench: ModuleType) -> None:
    window_for = bench.window_for
    assert window_for(0.0, 0.015, 4) == 4
    assert window_for(20.0, 0.015, 4) == 4 + 3  # 40 ms of round trips = 2.7 steps of 15 ms
    assert window_for(5.0, 0.010, 4) == 4 + 1
    assert window_for(20.0, 0.0, 4) == 4  # no step time measured: the staleness as it is


@pytest.mark.slow
def test_the_sweeps_files_and_json(bench: ModuleType, tmp_path: Path) -> None:
    point = bench.SweepPoint
    points = [
        point("hybrid", 0.0, 4, 30_000.0, 25_000.0, 4.0, 0.6),
        point("sync", 0.0, 1, 20_000.0, 18_000.0, 1.0, 0.6),
        point("hybrid", 20.0, 7, 28_000.0, 24_000.0, 7.0, 0.6),
        point("sync", 20.0, 1, 7_000.0, 6_500.0, 1.0, 0.6),
    ]
    assert bench.rate_at(points, "hybrid", 20.0) / bench.rate_at(points, "hybrid", 0.0) == 28 / 30
    assert math.isnan(bench.rate_at(points, "sync", 5.0))
    settings = bench.SweepSettings((0.0, 20.0), 4, 0, 10, 1, torch.device("cpu"))
    summary = bench.sweep_json(points, settings)
    assert summary["samples_per_s"]["sync"] == {"0": 20_000.0, "20": 7_000.0}
    assert summary["staleness_peak"]["hybrid"] == {"0": 4.0, "20": 7.0}
    csv_path, png_path, note = bench.write_sweep(points, tmp_path)
    lines = csv_path.read_text().splitlines()
    assert lines[0].startswith("mode,rtt_ms,max_staleness,samples_per_s")
    assert lines[3].startswith("hybrid,20,7,28000,")
    assert (png_path is not None and png_path.is_file()) or note is not None
