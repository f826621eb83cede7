"""benchmarks/_storage_common.py: the ideal disk share that the storage benchmark's tiering
figures are compared with (the Zipf mass outside the hottest ``ram_rows`` ids)."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture(scope="module")
def common() -> Iterator[ModuleType]:
    sys.path.insert(0, str(BENCHMARKS))  # the module imports its sibling ``_report``
    try:
        yield importlib.import_module("_storage_common")
    finally:
        sys.path.remove(str(BENCHMARKS))


@pytest.mark.parametrize(("n", "ram"), [(3_000_000, 200_000), (1_500_000, 1_200_000)])
def test_the_ideal_share_matches_the_exact_zipf_sum(common: ModuleType, n: int, ram: int) -> None:
    weights = np.power(np.arange(1, n + 1, dtype=np.float64), -common.ZIPF_S)
    exact = 1.0 - weights[:ram].sum() / weights.sum()
    assert common.ideal_disk_share(n, ram) == pytest.approx(exact, rel=1e-9)


def test_the_ideal_share_is_zero_when_every_id_fits_and_grows_with_the_table(
    common: ModuleType,
) -> None:
    assert common.ideal_disk_share(1_000_000, 1_000_000) == 0.0
    shares = [common.ideal_disk_share(n, 1_000_000) for n in (10**7, 10**8, 10**9)]
    assert 0.0 < shares[0] < shares[1] < shares[2] < 1.0
