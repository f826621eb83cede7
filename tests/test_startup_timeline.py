"""``embeddb train``'s start-up timeline (embeddb.trainer.launcher.startup): marks handed from
the launcher to the ranks, phases and ``startup_s``."""

from __future__ import annotations

import json
import os
import time

import pytest

from embeddb.trainer.launcher.startup import (
    MARKS_ENV,
    marks_from,
    phases,
    process_started,
    startup_s,
)


def test_the_launchers_marks_reach_a_rank_through_its_environment() -> None:
    marks = {"command": 100.0, "validated": 102.5, "torchrun": 104.0}
    assert marks_from({MARKS_ENV: json.dumps(marks)}) == marks
    assert marks_from({}) == {}
    assert marks_from({MARKS_ENV: "{not json"}) == {}
    assert marks_from({MARKS_ENV: "[1, 2]"}) == {}
    assert marks_from({MARKS_ENV: '{"a": 1, "b": "x"}'}) == {"a": 1.0}


def test_phases_are_the_seconds_between_marks_in_time_order() -> None:
    marks = {"first_step": 110.0, "command": 100.0, "shards_up": 104.0, "validated": 103.0}
    out = phases(marks)
    assert list(out) == ["command", "validated", "shards_up", "first_step"]
    assert out == {"command": 0.0, "validated": 3.0, "shards_up": 1.0, "first_step": 6.0}
    assert startup_s(marks) == pytest.approx(10.0) == pytest.approx(sum(out.values()))
    assert startup_s({"command": 1.0}) is None  # no step trained


def test_this_process_started_before_now() -> None:
    started = process_started()
    now = time.time()
    assert started <= now
    if os.path.exists("/proc/self/stat"):  # the kernel's record, not "now"
        assert started < now - 0.01
