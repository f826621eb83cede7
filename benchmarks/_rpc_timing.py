"""Timing of ``benchmarks/rpc.py``'s throughput operations: warm-up, then alternating rounds
of at least so many seconds and calls each, so that other load on a shared machine skews every
operation alike."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from _rpc_server import BATCH, VECTOR_BYTES

WARMUP_CALLS = 2
ROUNDS, ROUNDS_QUICK = 5, 3
ROUND_SECONDS, ROUND_SECONDS_QUICK = 1.0, 0.4
ROUND_CALLS, ROUND_CALLS_QUICK = 10, 5
MAX_CALLS_PER_ROUND = 2_000  # bounds every timed loop


@dataclass(frozen=True)
class Schedule:
    """How the throughput operations are timed."""

    rounds: int
    round_seconds: float
    round_calls: int

    @classmethod
    def of(cls, quick: bool) -> Schedule:
        if quick:
            return cls(ROUNDS_QUICK, ROUND_SECONDS_QUICK, ROUND_CALLS_QUICK)
        return cls(ROUNDS, ROUND_SECONDS, ROUND_CALLS)


@dataclass(frozen=True)
class Throughput:
    """One throughput measurement: calls of ``BATCH`` ids / 4 MiB of float32 each."""

    calls: int
    seconds: float
    median_call_s: float

    @property
    def calls_per_s(self) -> float:
        return self.calls / self.seconds

    @property
    def ids_per_s(self) -> float:
        return BATCH * self.calls_per_s

    @property
    def bytes_per_s(self) -> float:
        return VECTOR_BYTES * self.calls_per_s

    def as_dict(self) -> dict[str, float | int]:
        return {
            "bytes_per_s": self.bytes_per_s,
            "ids_per_s": self.ids_per_s,
            "calls_per_s": self.calls_per_s,
            "median_call_ms": self.median_call_s * 1e3,
            "calls": self.calls,
            "seconds": self.seconds,
        }


def time_round(work: Callable[[int], object], schedule: Schedule, start: int) -> list[float]:
    """Seconds of each call of one round (>= round_seconds and >= round_calls, bounded)."""
    per_call: list[float] = []
    total = 0.0
    while len(per_call) < MAX_CALLS_PER_ROUND and (
        total < schedule.round_seconds or len(per_call) < schedule.round_calls
    ):
        began = time.perf_counter()
        work(start + len(per_call))
        elapsed = time.perf_counter() - began
        per_call.append(elapsed)
        total += elapsed
    return per_call


def time_interleaved(
    works: Mapping[str, Callable[[int], object]], schedule: Schedule
) -> dict[str, Throughput]:
    """Warm up every operation, then time them in alternating rounds."""
    for work in works.values():
        for i in range(WARMUP_CALLS):
            work(i)
    seconds: dict[str, list[float]] = {name: [] for name in works}
    for _ in range(schedule.rounds):
        for name, work in works.items():
            seconds[name] += time_round(work, schedule, len(seconds[name]))
    return {
        name: Throughput(len(times), sum(times), statistics.median(times))
        for name, times in seconds.items()
    }
