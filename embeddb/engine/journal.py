"""The write side of a shard's update log: the commit point of every mutation, and write refusal.

**The update log is the commit point.** Every mutating call — gradient push (one table or
many), assign, delete, the rows a training lookup admits — is prepared by the tables without
being published, handed here as **one** list of changes (:meth:`Journal.append`, with the
locks of every stripe it touches held: :mod:`embeddb.engine.storage.writes`), appended to the update
log as **one** record, and only then published to the tiers. With ``fsync: always`` the append
also waits for the fsync (group commit: calls on other stripes share it) before anything is
published. So if the append or that fsync fails, no row of the call is visible — on this shard,
after a restart (recovery replays whole records), or on a follower (which applies whole
records) — and the caller gets the error. :meth:`Journal.acknowledge` then waits until the
call is as durable as ``store.fsync`` promises (a no-op under ``always``, already done).

Storage faults are states of the shard (docs/durability.md, "Storage faults"):

* **full** (``ENOSPC``, ``EDQUOT``, ``EFBIG``): the call fails with
  :class:`~embeddb.errors.StorageFullError` (``RESOURCE_EXHAUSTED``); the shard reports
  :attr:`Journal.read_only` until an append succeeds again: the next mutation retries it, so
  writes resume by themselves once there is space.
* **faulty** (``EIO`` on a write or an fsync, ``EROFS``, a record logged but not published):
  :class:`~embeddb.errors.StorageFaultError` (``UNAVAILABLE``); fail-stop: after a failed
  fsync the page cache is not trusted again, every later mutation is refused until a restart,
  which recovers from the log.

Error messages sent to callers name no server path; the full error, path included, goes to the
server log. Reads go on in both states.
"""

from __future__ import annotations

import errno
import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import TypeVar

import numpy as np
import numpy.typing as npt

from embeddb.config import FsyncPolicy
from embeddb.engine.durability import records
from embeddb.engine.durability.log import UpdateLog
from embeddb.engine.storage import TieredTable, UpdateResult
from embeddb.engine.storage.changes import Change
from embeddb.engine.storage.many import StripeSet
from embeddb.engine.storage.writes import Prepared, commit_ordered
from embeddb.errors import (
    FailedPreconditionError,
    StorageError,
    StorageFaultError,
    StorageFullError,
)

__all__ = ["Journal"]

logger = logging.getLogger("embeddb.engine.shard")  # the shard's own logger: one place to tune

T = TypeVar("T")

_FULL = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})


class Journal:
    """Journals a shard's mutations into its update log.

    Args:
        update_log: the shard's update log; None (an ephemeral shard, a follower,
            ``update_log: false``): nothing is journaled and nothing waited for.
        follower: the shard is a read-only follower: :meth:`mutating` refuses every mutation.
    """

    def __init__(self, update_log: UpdateLog | None, follower: bool) -> None:
        self._log = update_log
        self._follower = follower
        self._always = update_log is not None and update_log.config.fsync is FsyncPolicy.ALWAYS
        self.full: StorageFullError | None = None  # the last append found the disk full
        self.failed: StorageFaultError | None = None  # fail-stop: writes refused until restart

    @property
    def read_only(self) -> bool:
        """Whether mutations are refused (fail-stop) or failing (a full disk)."""
        return self.failed is not None or self.full is not None

    def attach(self, tables: Mapping[str, TieredTable]) -> None:
        """Make ``tables`` journal their calls here (when there is an update log)."""
        # calls spanning tables lock them in this order (a snapshot's too: no deadlock)
        self._rank = {name: k for k, name in enumerate(tables)}
        self.stripes = StripeSet(tables)  # the same order
        if self._log is not None:
            for table in tables.values():
                table.journal = self.append
                table.on_failure = self.unpublished

    def commit(
        self, calls: Sequence[tuple[TieredTable, list[threading.Lock], Callable[[], Prepared[T]]]]
    ) -> list[T]:
        """A call spanning tables — ``(table, its stripe locks, its preparation)`` each — logged
        as one record before any of it is published (:func:`~embeddb.engine.storage.writes.commit`).
        Returns the tables' results in order."""
        ranked = [(self._rank[t.name], locks, prepare) for t, locks, prepare in calls]
        if self._log is None:
            return commit_ordered(ranked, None)
        return commit_ordered(ranked, self.append, self.unpublished)

    def update_many(
        self, items: Sequence[tuple[TieredTable, npt.NDArray[np.uint64], npt.NDArray[np.float32]]]
    ) -> list[UpdateResult]:
        """A gradient push spanning tables — ``(table, ids, grads)`` each — prepared in one pass
        (:mod:`~embeddb.engine.storage.many`) and logged as one record before any of it is
        published. Returns the tables' results in order."""
        if self._log is None:
            return self.stripes.update(items, None)
        return self.stripes.update(items, self.append, self.unpublished)

    def append(self, changes: list[Change]) -> None:
        """Append one call's changes to the log as one record (called with the stripe locks
        of the call held, before any change is published); under ``fsync: always`` also wait
        for its fsync.

        Raises:
            StorageFullError: the disk is full; the call is not logged.
            StorageFaultError: an I/O error; the call is not logged, or (a failed fsync) is
                not known to be, and the shard now refuses writes until a restart.
        """
        assert self._log is not None
        try:
            seq = self._log.append(records.encode(changes))
            if self._always:
                self._log.wait_durable(seq)
        except StorageError as exc:
            raise self._fault(exc) from exc
        if self.full is not None:
            logger.warning("the update log accepts appends again: writes resumed")
            self.full = None

    def unpublished(self, exc: BaseException) -> None:
        """A logged call could not be published (the disk tier failed): this shard is behind
        its log, so it stops taking writes; a restart replays the log."""
        if self.failed is None:
            logger.error(
                "a logged mutation could not be applied to the tables (%s); the shard refuses "
                "writes until it is restarted, which recovers it from the update log",
                exc,
            )
            self.failed = StorageFaultError(
                "the shard could not apply a logged write to its storage; it refuses writes "
                "until it is restarted (see the server log)"
            )

    def _fault(self, exc: StorageError) -> StorageError:
        """The error to answer a failed append with (no path in it); records the state."""
        code = getattr(exc, "errno", None)
        if code in _FULL and (self._log is None or not self._log.failed):
            logger.error("update log append failed, the disk is full; writes fail until "
                         "there is space again: %s", exc)  # fmt: skip
            self.full = StorageFullError(
                f"the shard's data directory is full ({errno.errorcode.get(code or 0, code)}): "
                f"the write was not applied; writes resume once space is freed"
            )
            return self.full
        if self.failed is None:
            logger.error("update log failed; the shard refuses writes until it is restarted: "
                         "%s", exc)  # fmt: skip
            name = errno.errorcode.get(code, "an I/O error") if code else "an I/O error"
            self.failed = StorageFaultError(
                f"the shard's update log failed ({name}): the write was not applied; the shard "
                f"refuses writes until it is restarted (see the server log)"
            )
        return self.failed

    def mutating(self) -> int:
        """Check that a mutation may run; returns the log position before it.

        Raises:
            FailedPreconditionError: a follower.
            StorageFaultError: the shard refuses writes until a restart (fail-stop).
        """
        if self._follower:
            raise FailedPreconditionError(
                "this shard is a read-only follower: send writes to its primary"
            )
        if self.failed is not None:
            raise self.failed
        return self._log.last_seq if self._log is not None else 0

    def acknowledge(self, before: int) -> None:
        """Wait until the log records after ``before`` (this call's) are as durable as the
        fsync policy promises."""
        if self._log is not None and self._log.last_seq > before:
            try:
                self._log.wait_durable(self._log.last_seq)
            except StorageError as exc:
                raise self._fault(exc) from exc
