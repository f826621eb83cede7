"""The command line: the demo end to end, and clean errors."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from embeddb import __version__
from embeddb.cli import main
from embeddb.demo import auc


@pytest.mark.slow
def test_demo_trains_adult_to_a_useful_auc_and_spills(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        main, ["demo", "--epochs", "2", "--ram-rows", "8", "--data-dir", str(tmp_path / "d")]
    )
    assert result.exit_code == 0, result.output
    test_auc = float(re.search(r"test AUC (\d\.\d+);", result.output).group(1))
    assert test_auc > 0.88  # logistic regression on Adult reaches about 0.90
    disk_rows = [int(line.split()[2]) for line in result.output.splitlines()
                 if line.startswith(("education ", "native_country "))]  # fmt: skip
    assert disk_rows and all(n > 0 for n in disk_rows)  # tiny RAM tier: rows live on disk
    assert (tmp_path / "d" / "clean-shutdown.json").exists()


def test_demo_reports_bad_config_with_the_key(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("slots_config:\n  a: {dims: 4}\n")
    result = CliRunner().invoke(main, ["demo", "--config", str(bad)])
    assert result.exit_code == 1
    assert "slots_config.a" in result.output and "dims" in result.output
    assert "Traceback" not in result.output


def test_version() -> None:
    result = CliRunner().invoke(main, ["--version"])
    assert result.exit_code == 0 and __version__ in result.output


def test_auc_matches_pairwise_definition() -> None:
    rng = np.random.default_rng(0)
    scores = rng.integers(0, 6, size=200).astype(np.float64)  # many ties
    labels = (rng.random(200) < 0.4).astype(np.float32)
    pos, neg = scores[labels == 1], scores[labels == 0]
    pairs = (pos[:, None] > neg[None, :]).sum() + 0.5 * (pos[:, None] == neg[None, :]).sum()
    assert abs(auc(labels=labels, scores=scores) - pairs / (pos.size * neg.size)) < 1e-12


def test_serve_threads_overrides_only_the_store_threads() -> None:
    from embeddb.cli.common import packaged_config, with_threads

    config = packaged_config("default.yaml")
    changed = with_threads(config, 3)

    assert changed.store.parallel.threads == 3
    assert changed.store.parallel.min_ids == config.store.parallel.min_ids
    assert changed.tables == config.tables and changed.store.ram == config.store.ram


def test_serve_and_cluster_refuse_a_threads_option_out_of_range() -> None:
    # One validator: the flag is checked by store.threads' own rule, 0 (every CPU) to 256.
    for command in (["serve", "--ephemeral"], ["cluster", "--ephemeral"]):
        result = CliRunner().invoke(main, [*command, "--threads", "257"])
        assert result.exit_code == 2
        assert "--threads" in result.output and "Traceback" not in result.output
        assert "threads: must be an integer in [0, 256], got 257" in result.output
