"""``embeddb train``'s steady-state rate: samples/s after the warm-up steps, reported apart from
the start-up time (embeddb.trainer.launcher.rank)."""

from __future__ import annotations

import pytest

from embeddb.trainer.launcher.rank import _WARMUP_STEPS, _steady


def test_the_steady_rate_leaves_the_warm_up_steps_out() -> None:
    # started at t=10; the warm-up steps ended at t=13 with 1,280 samples; 11,280 by t=18
    rate, warm_up = _steady(11_280, (1_280, 13.0), 18.0, 10.0)
    assert rate == pytest.approx(10_000 / 5.0)
    assert warm_up == pytest.approx(3.0)


def test_before_the_warm_up_ends_it_is_the_rate_so_far() -> None:
    rate, warm_up = _steady(640, None, 12.0, 10.0)
    assert rate == pytest.approx(320.0)
    assert warm_up == pytest.approx(2.0)
    assert _steady(1_280, (1_280, 13.0), 13.0, 10.0)[0] == pytest.approx(1_280 / 3.0)
    assert _WARMUP_STEPS >= 1
