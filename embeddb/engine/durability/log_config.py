"""The settings of one update log (:class:`LogConfig`): its fsync policy, segment size,
compression and what opening does with a corrupt tail.

Fsync policies and their loss windows
-------------------------------------
:meth:`~embeddb.engine.durability.log.UpdateLog.append` returns only after ``write(2)`` has, so a
crash of the **process** (``kill -9``, an exception) loses nothing appended under any policy:
the kernel still holds it. The policies differ on **power loss or a kernel crash**:

- ``always``: ``wait_durable`` returns once an fsync covering the record has completed. Group
  commit: one fsync covers every record appended before it started, and concurrent waiters
  share it. Loses nothing acknowledged; costs an fsync (~0.1–10 ms by device) per group of
  concurrent requests.
- ``interval`` (the default, every 5 ms): ``wait_durable`` returns at once; a background thread
  fsyncs every ``fsync_interval_ms``. Loses at most the acknowledged updates of the last
  ``fsync_interval_ms`` plus the duration of one fsync.
- ``never``: fsync is left to the kernel's writeback (typically up to 30 s of updates lost).

The default is ``interval`` because ``always`` puts an fsync in the path of every acknowledged
request group — its cost is measured by the durability benchmark — while training tolerates a
few milliseconds of lost gradient updates after a power cut (a snapshot plus the log loses
nothing else). How the policies are carried out is :mod:`.log_sync`'s.

Torn tail or corruption
-----------------------
Opening a directory validates every record of every segment (:mod:`.log_scan`, which draws the
rules). Only the end of the **last** segment may hold bytes that are not an intact record. A
**torn tail** (a write a crash interrupted) was never acknowledged: it is cut with a warning
under every mode, and appends continue with the next seq. A **corrupt tail** may hold
acknowledged updates: ``LogConfig.recovery`` decides, after RocksDB's WAL recovery modes —
``absolute_consistency`` (the default under ``always``) refuses to open with
:class:`~embeddb.errors.CorruptDataError`, ``point_in_time`` (the default under ``interval`` and
``never``) cuts it — and ``LogConfig.cut_corrupt_tail`` cuts it under either. Every cut is
recorded before the file is truncated (``UpdateLog.cuts``, ``log-cuts.jsonl``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from embeddb.config import FsyncPolicy, LogRecovery, UpdateLogConfig
from embeddb.config.store import (
    check_fsync,
    check_fsync_interval_ms,
    check_log_lz4_min_bytes,
    check_log_recovery,
    check_log_segment_bytes,
)

__all__ = ["LogConfig"]


@dataclass(frozen=True)
class LogConfig:
    """Settings of one update log.

    Attributes:
        fsync: the fsync policy; a string (``"always"``) is converted.
        fsync_interval_ms: how often the ``interval`` policy's background thread fsyncs.
        segment_bytes: a segment is sealed before a record would take it past this size (a
            record larger than this gets a segment of its own).
        lz4_min_bytes: payloads of at least this many bytes are stored LZ4-compressed when that
            shrinks them; 0 turns compression off.
        recovery: what opening does with a corrupt tail (see the module docstring); ``auto``
            is ``absolute_consistency`` under ``always``, else ``point_in_time``. A string is
            converted.
        cut_corrupt_tail: cut a corrupt tail of the last segment whatever ``recovery`` says:
            the operator accepts losing its records (the cut is recorded).
        cuts_dir: where cuts are recorded (``log-cuts.jsonl``, ``log-cuts/``); None: the
            log's directory.

    Raises:
        ConfigError: a value is out of range.
    """

    fsync: FsyncPolicy = FsyncPolicy.INTERVAL
    fsync_interval_ms: float = 5.0
    segment_bytes: int = 64 << 20
    lz4_min_bytes: int = 4096
    recovery: LogRecovery = LogRecovery.AUTO
    cut_corrupt_tail: bool = False
    cuts_dir: Path | None = None

    def __post_init__(self) -> None:
        # the store: section's validators, so a value is checked once, under its YAML name
        object.__setattr__(self, "fsync", check_fsync(self.fsync))
        object.__setattr__(
            self, "fsync_interval_ms", check_fsync_interval_ms(self.fsync_interval_ms)
        )
        object.__setattr__(self, "segment_bytes", check_log_segment_bytes(self.segment_bytes))
        object.__setattr__(self, "lz4_min_bytes", check_log_lz4_min_bytes(self.lz4_min_bytes))
        object.__setattr__(self, "recovery", check_log_recovery(self.recovery))

    @classmethod
    def of(
        cls, settings: UpdateLogConfig, *, cut_corrupt_tail: bool = False,
        cuts_dir: Path | None = None,
    ) -> LogConfig:  # fmt: skip
        """The log settings of a shard's ``store:`` section (``log_segment_mb`` in bytes)."""
        return cls(
            fsync=settings.fsync,
            fsync_interval_ms=settings.fsync_interval_ms,
            segment_bytes=settings.segment_mb << 20,
            lz4_min_bytes=settings.lz4_min_bytes,
            recovery=settings.recovery,
            cut_corrupt_tail=cut_corrupt_tail,
            cuts_dir=cuts_dir,
        )

    @property
    def tail_recovery(self) -> LogRecovery:
        """``recovery`` in force: ``auto`` resolved by the fsync policy."""
        if self.recovery is not LogRecovery.AUTO:
            return self.recovery
        if self.fsync is FsyncPolicy.ALWAYS:
            return LogRecovery.ABSOLUTE_CONSISTENCY
        return LogRecovery.POINT_IN_TIME
