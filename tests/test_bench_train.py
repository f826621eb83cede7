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
from embeddb.trainer.data import SyntheticCriteo, SyntheticCriteoConfig

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
