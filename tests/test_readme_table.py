"""README.md's comparison block is what benchmarks/readme_table.py renders from the recorded
run (benchmarks/recorded/train-quick.json): editing one without the other fails here."""

from __future__ import annotations

import copy
import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
RECORDED = ROOT / "benchmarks" / "recorded" / "train-quick.json"


@pytest.fixture(scope="module")
def gen() -> ModuleType:
    path = ROOT / "benchmarks" / "readme_table.py"
    spec = importlib.util.spec_from_file_location("bench_readme_table", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def recorded() -> dict[str, Any]:
    result: dict[str, Any] = json.loads(RECORDED.read_text(encoding="utf-8").splitlines()[-1])
    return result


def test_the_readme_block_is_the_generated_one(gen: ModuleType, recorded: dict[str, Any]) -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert gen.block_of(readme) == gen.render(recorded), (
        "README.md's comparison block differs from benchmarks/recorded/train-quick.json: "
        "run python benchmarks/readme_table.py --write (or record a new run)"
    )


def test_the_recorded_run_has_every_target_key(recorded: dict[str, Any]) -> None:
    assert recorded["bench"] == "train" and recorded["quick"] is True
    for key in (
        "table_layout_ratio",
        "table_layout_ratio_b128",
        "hybrid_vs_inprocess",
        "hybrid_vs_inprocess_b128",
        "small_hybrid_vs_inprocess",
        "public_shape_vs_torch",
        "startup_s",
        "adult_wall_vs_torch",
    ):
        assert isinstance(recorded[key], float), key
        assert (
            key in recorded["targets"]
            or f"{key}_at_most" in recorded["targets"]
            or key in ("startup_s",)
        ), key
    assert set(recorded["peers"]) >= {"batch", "hybrid", "pytorch_inprocess", "torchrec"}
    assert recorded["settings"]["load_average"], "the run's load average is part of its figures"


def test_the_block_follows_the_json(gen: ModuleType, recorded: dict[str, Any]) -> None:
    before = gen.render(recorded)
    changed = copy.deepcopy(recorded)
    changed["peers"]["hybrid"]["samples_per_s"] = 12_345.0
    changed["peers"]["pytorch_inprocess"]["hybrid_vs"] = 0.123
    after = gen.render(changed)
    assert after != before
    assert "**12.3k**" in after and "0.12\u00d7 /" in after
    changed["reference"]["side_by_side"]["persia"]["512"] = 10_000
    assert "| PERSIA | 12.2k | 10.0k | 26.4k |" in gen.render(changed)


def test_the_block_says_how_it_was_measured(gen: ModuleType, recorded: dict[str, Any]) -> None:
    block = gen.render(recorded)
    assert "python benchmarks/train.py --quick" in block
    assert f"{recorded['settings']['cpus']}-core" in block and "load average" in block
    assert "warm" in block and "batch 128" in block and "without a GPU" in block
    threads = recorded["settings"]["threads"]
    assert "1-minute load average" in block
    assert f"{threads} torch thread{'s' if threads > 1 else ''}" in block
    assert "TorchRec (CPU) | not run" in block  # skipped here: the reason, not a figure


def test_the_rate_format(gen: ModuleType) -> None:
    assert [gen.rate(v) for v in (9_849.0, 56_200, 111_000, 105_800, None)] == [
        "9.8k",
        "56.2k",
        "111k",
        "105.8k",
        "\u2013",
    ]


def test_write_and_check(gen: ModuleType, tmp_path: Path) -> None:
    readme = tmp_path / "README.md"
    readme.write_text((ROOT / "README.md").read_text(encoding="utf-8"), encoding="utf-8")
    assert gen.main(["--check", "--readme", str(readme)]) == 0
    text = readme.read_text(encoding="utf-8")
    edited = text.replace("| embeddb, `hybrid` mode, 1 local shard | **", "| embeddb | **", 1)
    assert edited != text
    readme.write_text(edited, encoding="utf-8")
    assert gen.main(["--check", "--readme", str(readme)]) == 1
    assert gen.main(["--write", "--readme", str(readme)]) == 0
    assert readme.read_text(encoding="utf-8") == text
    with pytest.raises(ValueError, match="markers"):
        gen.block_of("# no block here\n")
