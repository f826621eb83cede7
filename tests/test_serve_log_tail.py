"""A real ``embeddb serve`` killed with SIGKILL, then restarted on a log whose last complete
record has one flipped byte: refused under ``fsync: always`` until the operator passes
``--cut-corrupt-log-tail``; cut, logged at ERROR, counted and recorded under ``interval``."""

from __future__ import annotations

import json
import re
import signal
import struct
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from embeddb.client import Client, ClientOptions
from tests.support import ServeProcess, serve_processes

# Starts processes or runs for seconds: the full suite's, not the fast tier's.
pytestmark = pytest.mark.slow

CONFIG = """
slots_config:
  item: {dim: 4}
defaults:
  optimizer: {type: sgd, lr: 0.1}
  capacity: 1024
store: {stripes: 1, min_stripe_rows: 16, fsync: %s}
"""
IDS = np.arange(10, dtype=np.uint64)
RECORD_HEADER = struct.Struct("<IIQIB")  # crc32, stored, seq, length, flags
SEGMENT_HEADER = 24


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Callable[..., ServeProcess]]:
    """``serve(fsync, *args, expect_exit=False)``: ``embeddb serve`` on ``tmp_path/data``."""
    config = tmp_path / "config.yaml"
    starts = serve_processes(tmp_path)
    start = next(starts)

    def run(fsync: str, *args: str, expect_exit: bool = False) -> ServeProcess:
        config.write_text(CONFIG % fsync)
        data = str(tmp_path / "data")
        return start("--config", str(config), "--data-dir", data, *args, expect_exit=expect_exit)

    yield run
    next(starts, None)


def write_then_kill(served: ServeProcess) -> None:
    """Two acknowledged assigns of every id (1.0, then 2.0), then SIGKILL."""
    with Client([served.address], ClientOptions(timeout=10, retries=0)) as client:
        client.assign("item", IDS, np.full((IDS.size, 4), 1.0, np.float32))
        client.assign("item", IDS, np.full((IDS.size, 4), 2.0, np.float32))
    served.process.send_signal(signal.SIGKILL)
    served.process.wait(timeout=30)


def flip_last_record(log_dir: Path) -> tuple[Path, int, int]:
    """Flip a payload byte of the last record of the last segment (walked by its documented
    framing); returns the segment, the record's offset and its seq."""
    segment = sorted(log_dir.glob("*.log"))[-1]
    data = bytearray(segment.read_bytes())
    offset, last = SEGMENT_HEADER, None
    while offset < len(data):
        _, stored, seq, _, _ = RECORD_HEADER.unpack_from(data, offset)
        last = (offset, seq, stored)
        offset += RECORD_HEADER.size + stored
    assert offset == len(data) and last is not None  # complete records only
    at, seq, stored = last
    data[at + RECORD_HEADER.size + stored // 2] ^= 0x5A
    segment.write_bytes(bytes(data))
    return segment, at, seq


def lookup(served: ServeProcess) -> np.ndarray:
    with Client([served.address], ClientOptions(timeout=10, retries=0)) as client:
        return client.lookup("item", IDS, train=False)


def cut_lines(data_dir: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in (data_dir / "log-cuts.jsonl").read_text().splitlines()]


def test_fsync_always_refuses_a_corrupt_tail_until_the_operator_cuts_it(
    serve, tmp_path: Path
) -> None:
    data = tmp_path / "data"
    write_then_kill(serve("always"))
    segment, offset, seq = flip_last_record(data / "log")
    damaged = segment.read_bytes()

    refused = serve("always", expect_exit=True)
    assert refused.process.returncode != 0
    errors = refused.stderr()
    assert segment.name in errors and f"at offset {offset} (seq {seq})" in errors, errors
    assert "--cut-corrupt-log-tail" in errors
    assert segment.read_bytes() == damaged and not (data / "log-cuts.jsonl").exists()

    served = serve("always", "--cut-corrupt-log-tail")
    assert (lookup(served) == 1.0).all()  # the lost record was the assign of 2.0
    served.stop()
    [line] = cut_lines(data)
    assert (line["kind"], line["offset"], line["first_seq_lost"]) == ("corrupt", offset, seq)
    assert line["log_recovery"] == "absolute_consistency" and line["cut_corrupt_log_tail"]
    assert Path(str(line["saved"])).read_bytes() == damaged[offset:]


def test_fsync_interval_cuts_a_corrupt_tail_logs_counts_and_records_it(
    serve, tmp_path: Path
) -> None:
    data = tmp_path / "data"
    write_then_kill(serve("interval"))
    segment, offset, seq = flip_last_record(data / "log")

    served = serve("interval", "--metrics-port", "0")
    assert (lookup(served) == 1.0).all()
    with urllib.request.urlopen(served.metrics_url(), timeout=10) as reply:
        metrics = reply.read().decode()
    served.stop()
    assert 'embeddb_log_tail_cuts_total{kind="corrupt"} 1.0' in metrics
    assert 'embeddb_log_tail_cuts_total{kind="torn"} 0.0' in metrics
    error = re.search(
        r" ERROR embeddb\.engine\.durability\.log: (.*cut a corrupt tail.*)", served.stderr()
    )
    assert error is not None, served.stderr()
    assert segment.name in error[1] and f"at offset {offset}" in error[1]
    [line] = cut_lines(data)
    assert (line["kind"], line["offset"], line["first_seq_lost"]) == ("corrupt", offset, seq)
    assert line["log_recovery"] == "point_in_time" and not line["cut_corrupt_log_tail"]
