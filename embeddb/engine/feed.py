"""Feeding followers and the export: a shard's update log read out, a follower's applied.

The follower process is ``embeddb.server.follower``. :meth:`Shard.open_snapshot
<embeddb.engine.shard.Shard.open_snapshot>` opens a snapshot's files for sending (the bootstrap),
:meth:`Shard.tail_log <embeddb.engine.shard.Shard.tail_log>` yields every log record after a seq and
then each new one as soon as it is appended (:meth:`Shard.wait_for_seq
<embeddb.engine.shard.Shard.wait_for_seq>`), pinning the reader's position so that snapshots never
truncate records a live reader still needs. A follower shard (``follower=True``) applies them
with :meth:`Shard.apply_record <embeddb.engine.shard.Shard.apply_record>`.

The incremental export (``store.export_dir``, :mod:`embeddb.engine.durability.export`) is another
reader of the update log: :func:`start_export` and :func:`stop_export` run it.

The :class:`~embeddb.engine.shard.Shard` facade validates and delegates: :class:`LogReaders` is the
primary's side (the readers and their pins), :class:`RecordApplier` the follower's.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Generator, Iterator, Mapping
from pathlib import Path

from embeddb.common.routing import Topology
from embeddb.config import EmbeddingConfig, FsyncPolicy
from embeddb.engine.durability.export import Exporter
from embeddb.engine.durability.log import LogRecord, UpdateLog
from embeddb.engine.recovery import replay
from embeddb.engine.storage import TieredTable
from embeddb.errors import (
    ConfigError,
    CorruptDataError,
    FailedPreconditionError,
    OutOfRangeError,
    StorageError,
    StorageFaultError,
    UnavailableError,
)

__all__ = ["LogReaders", "RecordApplier", "start_export", "stop_export"]

logger = logging.getLogger("embeddb.engine.shard")  # the shard's own logger: one place to tune


class LogReaders:
    """The readers of a shard's update log, each pinned at the oldest seq it still needs.

    Args:
        update_log: the shard's update log; None (an ephemeral shard, a follower): every read
            raises :class:`FailedPreconditionError`.
        check_open: raises :class:`~embeddb.errors.UnavailableError` once the shard is closed;
            a waiting reader calls it before and after each wait.
    """

    def __init__(self, update_log: UpdateLog | None, check_open: Callable[[], None]) -> None:
        self._log = update_log
        self._check_open = check_open
        self._pins: dict[int, int] = {}  # reader token -> oldest seq it still needs
        self._pins_lock = threading.Lock()

    @property
    def logged(self) -> bool:
        """Whether the shard keeps an update log."""
        return self._log is not None

    def read(self, after_seq: int) -> Iterator[LogRecord]:
        """:meth:`embeddb.engine.shard.Shard.read_log`."""
        update_log = self._required()
        records = self._pinned_records(update_log, after_seq, None)
        return (r for r in records if r is not None)

    def tail(self, after_seq: int, idle_s: float) -> Generator[LogRecord | None, None, None]:
        """:meth:`embeddb.engine.shard.Shard.tail_log`."""
        update_log = self._required()
        if after_seq > update_log.last_seq:
            raise OutOfRangeError(
                f"seq {after_seq} is beyond this shard's last seq {update_log.last_seq}: the "
                f"reader followed another history (a restore?); bootstrap again from a snapshot"
            )
        return self._pinned_records(update_log, after_seq, idle_s)

    def wait_for_seq(self, after_seq: int, timeout: float | None) -> bool:
        """:meth:`embeddb.engine.shard.Shard.wait_for_seq`."""
        return self._required().wait_appended(after_seq, timeout)

    def append_time(self, seq: int) -> float | None:
        """:meth:`embeddb.engine.shard.Shard.append_time`."""
        return self._log.append_time(seq) if self._log is not None else None

    def truncate(self, kept: list[int], exporter: Exporter | None) -> None:
        """Delete the log segments that no retained snapshot or base (their seqs: ``kept``),
        live reader or ``exporter`` needs. Without a snapshot or a base (``kept`` empty),
        recovery replays the whole log: nothing is deleted."""
        if self._log is None or not kept:
            return
        with self._pins_lock:
            needed = kept + list(self._pins.values())
        if exporter is not None:
            needed.append(exporter.exported_seq)  # a restarted export resumes there
        self._log.truncate_before(min(needed) + 1)

    def _required(self) -> UpdateLog:
        if self._log is None:
            raise FailedPreconditionError("this shard keeps no update log")
        return self._log

    def _pinned_records(
        self, update_log: UpdateLog, after_seq: int, idle_s: float | None
    ) -> Generator[LogRecord | None, None, None]:
        """Records after ``after_seq`` with the reader's position pinned against truncation;
        with ``idle_s``, waits for new ones (yielding None when idle) instead of ending."""
        marker = object()  # alive as long as this generator: its id is a unique pin token
        token = id(marker)
        # Under fsync: always a call is committed only once its record is fsynced: a record is
        # fed only then, so a follower never applies a call whose fsync failed (this raises).
        durable_only = update_log.config.fsync is FsyncPolicy.ALWAYS
        with self._pins_lock:
            self._pins[token] = after_seq
        try:
            last = after_seq
            while True:
                for record in update_log.read(last):
                    if durable_only and record.seq > update_log.durable_seq:
                        _wait_durable(update_log, record.seq)
                    last = record.seq
                    with self._pins_lock:
                        self._pins[token] = last
                    yield record
                if idle_s is None:
                    return
                self._check_open()
                if not update_log.wait_appended(last, idle_s):
                    self._check_open()
                    yield None
        finally:
            with self._pins_lock:
                self._pins.pop(token, None)


def _wait_durable(update_log: UpdateLog, seq: int) -> None:
    try:
        update_log.wait_durable(seq)
    except StorageError as exc:
        logger.error("update log feed stopped before seq %d: %s", seq, exc)
        raise StorageFaultError(
            f"the primary's update log failed before seq {seq} was fsynced: records after seq "
            f"{seq - 1} are not fed until the primary is restarted (see its server log)"
        ) from exc


class RecordApplier:
    """A follower's side of the feed: applies its primary's log records in seq order.

    Args:
        tables: the follower's tables.
        applied_seq: the seq its state corresponds to when it opens (a restored snapshot's).
    """

    def __init__(self, tables: Mapping[str, TieredTable], applied_seq: int) -> None:
        self._tables = tables
        self.applied_seq = applied_seq  # the last primary seq applied

    def apply(self, seq: int, payload: bytes) -> bool:
        """:meth:`embeddb.engine.shard.Shard.apply_record`, once the shard is known to be a
        follower."""
        if seq <= self.applied_seq:
            return False
        if seq != self.applied_seq + 1:
            raise CorruptDataError(
                f"record seq {seq} does not follow the last applied seq {self.applied_seq}"
            )
        replay(self._tables, payload, f"record {seq}")
        self.applied_seq = seq
        return True


def start_export(
    config: EmbeddingConfig,
    data_dir: Path,
    readers: LogReaders,
    topology: Topology,
    tables: Mapping[str, TieredTable],
    seq: int,
) -> Exporter | None:
    """Start the incremental export (``store.export_dir``, ``{index}`` replaced by the shard
    index; relative: under ``data_dir``) of a primary's ``tables``, which tails the update log
    through ``readers`` after ``seq``. None without ``store.export_dir``.

    Raises:
        ConfigError: ``store.export_dir`` on a shard that keeps no update log.
    """
    export = config.store.export
    if export.directory is None:
        return None
    if not readers.logged:
        raise ConfigError(
            "store.export_dir", "the export reads the update log: it needs a data directory "
            "and update_log: true"
        )  # fmt: skip
    directory = Path(export.directory.replace("{index}", str(topology.shard_index)))
    dims = {n: (t.dim, tables[n].width) for n, t in config.tables.items()}
    return Exporter(
        directory if directory.is_absolute() else data_dir / directory,
        readers.read,
        dims,
        seq,
        export.interval_s,
        empty=not any(t.stats().rows for t in tables.values()),
    )


def stop_export(exporter: Exporter | None) -> None:
    """Export the tail (every record logged so far) and stop; a failure is logged, not
    raised: the export resumes from its last finished file at the next start."""
    if exporter is None:
        return
    try:
        exporter.close()
    except (StorageError, UnavailableError) as exc:
        logger.error(
            "the export's last write failed (%s); it resumes after seq %d at the next start",
            exc, exporter.exported_seq,
        )  # fmt: skip
