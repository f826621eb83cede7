"""benchmarks/_storage_capacity.py: the capacity series' options, its disk-space and time-budget
skip decisions and the JSON keys computed from a given series (never by running it)."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
GB = 10**9


@pytest.fixture(scope="module")
def modules() -> Iterator[tuple[ModuleType, ModuleType]]:
    sys.path.insert(0, str(BENCHMARKS))  # the modules import their siblings
    try:
        yield importlib.import_module("_storage_capacity"), importlib.import_module("storage")
    finally:
        sys.path.remove(str(BENCHMARKS))


@pytest.fixture()
def capacity(modules: tuple[ModuleType, ModuleType]) -> ModuleType:
    return modules[0]


@pytest.fixture()
def storage(modules: tuple[ModuleType, ModuleType]) -> ModuleType:
    return modules[1]


# ------------------------------------------------------------------------------------ options


@pytest.mark.parametrize(
    ("text", "max_ids", "sizes"),
    [
        ("1e9", 10**9, [10**6, 10**7, 10**8, 10**9]),
        ("1E8", 10**8, [10**6, 10**7, 10**8]),
        ("100000000", 10**8, [10**6, 10**7, 10**8]),
        ("100_000_000", 10**8, [10**6, 10**7, 10**8]),
        ("5e7", 5 * 10**7, [10**6, 10**7]),
        ("1e6", 10**6, [10**6]),
    ],
)
def test_max_ids_takes_integers_and_e_notation(
    storage: ModuleType, text: str, max_ids: int, sizes: list[int]
) -> None:
    args = storage.parse_args(["--max-ids", text])
    assert args.max_ids == max_ids
    assert isinstance(args.max_ids, int)
    assert args.capacity_series == sizes


def test_the_defaults_run_up_to_100m_ids_with_1m_ram_rows(storage: ModuleType) -> None:
    args = storage.parse_args([])
    assert args.capacity_series == [10**6, 10**7, 10**8]
    assert args.capacity_ram_rows == 1_000_000


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--max-ids", "lots"], "not a number: 'lots'"),
        (["--max-ids", "1.5"], "not a whole number of ids: '1.5'"),
        (["--max-ids", "2.5e6x"], "not a number"),
        (["--max-ids", "inf"], "not a whole number of ids"),
        (["--max-ids", "nan"], "not a whole number of ids"),
        (["--max-ids", "1e5"], "must be at least 1,000,000"),
        (["--max-ids=-1e9"], "must be at least 1,000,000"),
        (["--capacity-ram-rows", "500000"], "--capacity-ram-rows must be 1,000,000 to 4,000,000"),
        (["--capacity-ram-rows", "4000001"], "--capacity-ram-rows must be 1,000,000 to 4,000,000"),
        (["--capacity-step-budget-s", "0"], "--capacity-step-budget-s must be > 0"),
    ],
)
def test_bad_capacity_options_are_argparse_errors(
    storage: ModuleType, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    with pytest.raises(SystemExit) as exc:
        storage.parse_args(argv)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_the_ram_rows_accept_the_issues_range(storage: ModuleType) -> None:
    assert storage.parse_args(["--capacity-ram-rows", "4000000"]).capacity_ram_rows == 4_000_000


# ------------------------------------------------------------------------------------ skips


def test_a_size_the_free_disk_cannot_hold_is_skipped_with_its_numbers(
    capacity: ModuleType, tmp_path: Path
) -> None:
    measured = capacity.DiskEstimate(bytes_per_row=79.4, copies=2.0, measured_at=10**8)
    reason = capacity.disk_skip_reason(10**9, measured, 64 * GB, 8 * GB, tmp_path)
    assert reason is not None
    assert "1,000,000,000 ids need ~158.8 GB" in reason
    assert "79.4 B/row (measured at 100,000,000 ids)" in reason
    assert "= 79.4 GB of rows, x 2.00 copies" in reason
    assert f"only 64.0 GB free under {tmp_path} + 8.0 GB the series holds" in reason
    # what the series already holds counts: 100M ids fit 64 GB free
    assert capacity.disk_skip_reason(10**8, measured, 64 * GB, 8 * GB, tmp_path) is None


def test_the_skip_decision_follows_the_free_bytes(capacity: ModuleType, tmp_path: Path) -> None:
    measured = capacity.DiskEstimate(bytes_per_row=80.0, copies=2.0, measured_at=10**7)
    needed = 16 * GB  # 80 B x 100M rows x 2 copies
    reserve = capacity.DISK_RESERVE_BYTES
    assert capacity.disk_skip_reason(10**8, measured, needed + reserve, 0, tmp_path) is None
    assert capacity.disk_skip_reason(10**8, measured, needed + reserve - 1, 0, tmp_path)
    assert capacity.disk_skip_reason(10**8, measured, needed + reserve - GB, GB, tmp_path) is None
    first = capacity.DiskEstimate(capacity.FIRST_BYTES_PER_ROW, capacity.FIRST_COPIES, None)
    reason = capacity.disk_skip_reason(10**6, first, 0, 0, tmp_path)
    assert reason is not None and "estimated before any size was measured" in reason


def test_the_next_sizes_estimate_comes_from_the_last_measured_size(capacity: ModuleType) -> None:
    first = capacity.estimate_after(None)
    assert (first.bytes_per_row, first.copies, first.measured_at) == (
        capacity.FIRST_BYTES_PER_ROW,
        capacity.FIRST_COPIES,
        None,
    )
    point = {"distinct_ids": 10**7, "disk_bytes_per_row_closed": 78.6, "disk_copies": 2.5}
    assert capacity.estimate_after(point) == capacity.DiskEstimate(78.6, 2.5, 10**7)
    assert capacity.estimate_after(point).needed(10**9) == pytest.approx(196.5 * GB)
    no_copies = {**point, "disk_copies": None}  # follower and reshard skipped at that size
    assert capacity.estimate_after(no_copies).copies == capacity.FIRST_COPIES


def test_a_step_projected_beyond_its_budget_is_skipped_and_says_why(capacity: ModuleType) -> None:
    assert capacity.step_skip_reason("reshard", 10**8, 500_000.0, "rows", 600.0) is None
    reason = capacity.step_skip_reason("reshard", 10**8, 100_000.0, "rows", 600.0)
    assert reason == (
        "reshard skipped: 100,000,000 rows at 100K rows/s (the previous size's rate) "
        "project 1000 s > the step budget 600 s"
    )
    assert capacity.step_skip_reason("reshard", 10**8, None, "rows", 600.0) is None


# ------------------------------------------------------------------------------------ keys


def point(n: int, lookup: float, populate: float, ratio: float | None) -> dict[str, Any]:
    return {
        "distinct_ids": n,
        "lookup_ids_per_s": lookup,
        "populate_rows_per_s": populate,
        "disk_share_vs_ideal": ratio,
    }


SERIES = [
    point(10**6, 11.0e6, 1.1e6, None),
    point(10**7, 1.2e6, 0.4e6, 1.45),
    point(10**8, 0.9e6, 0.3e6, 1.05),
]


def test_the_json_keys_of_a_series_whose_1b_size_was_skipped(capacity: ModuleType) -> None:
    skipped = [{"distinct_ids": 10**9, "reason": "1,000,000,000 ids need ~160 GB"}]
    keys = capacity.capacity_keys(SERIES, skipped, 10**9)
    assert keys == {
        "spill_flatness": pytest.approx(0.75),
        "spill_lookup_ids_per_s_100m": 0.9e6,
        "spill_lookup_ids_per_s_1b": None,
        "spill_1b_skipped": "1,000,000,000 ids need ~160 GB",
        "capacity_disk_share_vs_ideal": 1.45,
        "populate_rows_per_s_min": 0.3e6,
    }
    assert capacity.capacity_met(keys) == {
        "spill_flatness": False,
        "spill_lookup_ids_per_s_100m": False,
        "spill_lookup_ids_per_s_1b": None,
        "capacity_disk_share_vs_ideal": False,
        "populate_rows_per_s_min": False,
    }


def test_the_json_keys_when_every_size_ran_and_met(capacity: ModuleType) -> None:
    series = [
        point(10**7, 1.5e6, 1.2e6, 1.02),
        point(10**8, 1.3e6, 1.1e6, 1.08),
        point(10**9, 0.6e6, 1.0e6, 1.09),
    ]
    keys = capacity.capacity_keys(series, [], 10**9)
    assert keys["spill_flatness"] == pytest.approx(1.3 / 1.5)
    assert keys["spill_lookup_ids_per_s_1b"] == 0.6e6
    assert keys["spill_1b_skipped"] is None
    assert keys["capacity_disk_share_vs_ideal"] == 1.08  # 1B is not part of the worst
    assert keys["populate_rows_per_s_min"] == 1.0e6
    assert all(capacity.capacity_met(keys).values())


def test_a_series_capped_below_1b_says_so_and_has_no_flatness_without_100m(
    capacity: ModuleType,
) -> None:
    keys = capacity.capacity_keys(SERIES[:2], [], 10**7)
    assert keys["spill_flatness"] is None
    assert keys["spill_lookup_ids_per_s_100m"] is None
    assert keys["spill_1b_skipped"] == "--max-ids 10,000,000 is below 1,000,000,000 (not run)"
    assert keys["capacity_disk_share_vs_ideal"] == 1.45
    assert keys["populate_rows_per_s_min"] == 0.4e6
    quick = capacity.capacity_keys([], [], 10**8, "not in --quick mode")
    assert quick["spill_1b_skipped"] == "not in --quick mode"
    empty = capacity.capacity_keys([], [], 10**6)
    assert empty["populate_rows_per_s_min"] is None
    assert empty["capacity_disk_share_vs_ideal"] is None


def test_the_summary_prints_each_target_with_its_verdict(capacity: ModuleType) -> None:
    skipped = [{"distinct_ids": 10**9, "reason": "no room"}]
    lines = list(capacity.capacity_summary(capacity.capacity_keys(SERIES, skipped, 10**9)))
    assert lines == [
        "spill_flatness 0.75 (lookup ids/s at 100M / at 10M) [target >= 0.8: NOT met]",
        "spill_lookup_ids_per_s_100m 900K (lookup ids/s at 100M ids) [target >= 1.00M: NOT met]",
        "spill_lookup_ids_per_s_1b n/a (lookup ids/s at 1B ids) [target >= 500K: not measured]"
        ": no room",
        "capacity_disk_share_vs_ideal 1.45 (disk share / ideal, worst of 10M, 100M) "
        "[target <= 1.1: NOT met]",
        "populate_rows_per_s_min 300K (populate rows/s, slowest size) [target >= 1.00M: NOT met]",
    ]
