"""Where the update log's cost per ``apply_gradients`` goes (``durability.py --breakdown``).

One shard without a log runs the benchmark's batches while its table's journal hook is swapped
for stages of the real log path, each adding one step to the one before, in alternating rounds:

=================  ==========================================================================
``off``            no journal: the baseline of ``update_ratio_*``
``gather``         the table gathers the updated rows and ids (the records' content) and builds
                   the changes, under the stripe lock; nothing is written
``encode_crc32``   + :func:`records.encode` and zlib CRC-32 of every byte (format version 1)
``encode_crc32c``  + :func:`records.encode` and framing with CRC-32C (format version 2), instead
``write``          + ``writev`` of header and payload buffers into a file: page cache, no fsync
``log_<policy>``   the real :class:`UpdateLog` through the shard's :class:`Journal`: its lock,
                   segment rolls, and the policy's fsyncs (``interval``: a background thread)
=================  ==========================================================================

Each stage's figures are the medians over its rounds of the wall ms per call and of the
process's CPU ms per call (every thread: the stripe pool, the ``interval`` fsync thread; the
kernel's own writeback threads are not counted); the differences between a stage and the one
it adds to (:data:`BASE`) attribute the cost. CPU time is the steadier figure on a shared
machine: wall time also counts waiting for a core.
"""

from __future__ import annotations

import os
import shutil
import statistics
import time
import zlib
from collections.abc import Callable
from pathlib import Path

from embeddb.common.arrays import F32, U64
from embeddb.config import FsyncPolicy
from embeddb.engine.durability import records
from embeddb.engine.durability.log import LogConfig, UpdateLog
from embeddb.engine.durability.log_format import RECORD_HEADER, frame, record_header, write_all
from embeddb.engine.journal import Journal
from embeddb.engine.shard import Shard
from embeddb.engine.storage.changes import Change

STAGES = ("off", "gather", "encode_crc32", "encode_crc32c", "write", "log_never", "log_interval")
BASE = {  # the stage each one adds to
    "gather": "off",
    "encode_crc32": "gather",
    "encode_crc32c": "gather",
    "write": "encode_crc32c",
    "log_never": "write",
    "log_interval": "log_never",
}
Hook = Callable[[list[Change]], object] | None


def measure(
    shard: Shard,
    table_name: str,
    batches: list[U64],
    grads: F32,
    root: Path,
    rounds: int = 3,
    calls: int = 16,
) -> dict[str, dict[str, float]]:
    """Median wall and CPU ms per ``apply_gradients`` call of each stage (see the module
    docstring) on ``shard``, which must have no update log; its rows change as training would.

    Returns:
        ``{stage: {"wall_ms": ..., "cpu_ms": ...}}`` in :data:`STAGES` order.
    """
    table = shard._tables[table_name]  # the journal hook, as Shard.__init__ attaches it
    root.mkdir(parents=True, exist_ok=True)
    sink = os.open(root / "sink.bin", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    logs: dict[str, tuple[UpdateLog, Journal]] = {}
    for policy in ("never", "interval"):
        log = UpdateLog(root / policy, LogConfig(fsync=FsyncPolicy(policy)))
        logs[f"log_{policy}"] = (log, Journal(log, follower=False))

    def crc32(changes: list[Change]) -> None:
        crc = 0
        for part in records.encode(changes):
            crc = zlib.crc32(part, crc)

    def crc32c(changes: list[Change]) -> None:
        frame(records.encode(changes), 4096)

    def write(changes: list[Change]) -> None:
        rec = frame(records.encode(changes), 4096)
        write_all(sink, [record_header(rec, 1), *rec.parts], RECORD_HEADER.size + rec.stored)

    hooks: dict[str, Hook] = {
        "off": None,
        "gather": lambda changes: None,
        "encode_crc32": crc32,
        "encode_crc32c": crc32c,
        "write": write,
        **{name: journal.append for name, (_, journal) in logs.items()},
    }
    walls: dict[str, list[float]] = {name: [] for name in STAGES}
    cpus: dict[str, list[float]] = {name: [] for name in STAGES}
    k = 0
    try:
        for _ in range(rounds):
            for name in STAGES:
                journal = logs[name][1] if name in logs else None
                table.journal = hooks[name]
                began, cpu = time.perf_counter(), time.process_time()
                for _ in range(calls):
                    before = journal.mutating() if journal is not None else 0
                    shard.apply_gradients(table_name, batches[k % len(batches)], grads)
                    if journal is not None:
                        journal.acknowledge(before)
                    k += 1
                walls[name].append((time.perf_counter() - began) / calls * 1e3)
                cpus[name].append((time.process_time() - cpu) / calls * 1e3)
            os.ftruncate(sink, 0)
    finally:
        table.journal = None
        os.close(sink)
        for log, _ in logs.values():
            log.close()
        shutil.rmtree(root, ignore_errors=True)
    return {
        name: {"wall_ms": statistics.median(walls[name]), "cpu_ms": statistics.median(cpus[name])}
        for name in STAGES
    }
