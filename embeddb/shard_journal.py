"""The write side of a shard's update log: journaling mutations, and read-only mode.

Every mutation — gradient push, assign, delete, rows created by a training lookup — is
journaled while its stripe lock is held, as the resulting rows (:mod:`embeddb.storage.changes`):
the tables call :meth:`Journal.append`, which appends them to the update log with the next
``seq``. Before the call returns, :meth:`Journal.acknowledge` waits until they are as durable as
``store.fsync`` promises: with ``fsync: always`` the call also waits for the fsync (group
commit). A log whose append fails (full or unwritable disk) puts the shard in read-only mode:
reads go on, mutations raise :class:`~embeddb.errors.FailedPreconditionError`
(:meth:`Journal.mutating`), nothing stored is touched. The :class:`~embeddb.shard.Shard` facade
calls :meth:`~Journal.mutating` and :meth:`~Journal.acknowledge` around each mutation.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from embeddb.durability import records
from embeddb.durability.log import UpdateLog
from embeddb.errors import FailedPreconditionError, StorageError
from embeddb.storage import TieredTable
from embeddb.storage.changes import Change

__all__ = ["Journal"]

logger = logging.getLogger("embeddb.shard")  # the shard's own logger: one place to tune


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
        self.failed: StorageError | None = None  # the append that made the shard read-only

    def attach(self, tables: Mapping[str, TieredTable]) -> None:
        """Make ``tables`` journal their changes here (when there is an update log)."""
        if self._log is not None:
            for table in tables.values():
                table.journal = self.append

    def append(self, changes: list[Change]) -> None:
        """Append one stripe's changes to the log (called under the stripe's lock)."""
        assert self._log is not None
        try:
            self._log.append(records.encode(changes))
        except StorageError as exc:
            if self.failed is None:
                self.failed = exc
                logger.error("update log append failed; the shard is now read-only: %s", exc)
            raise

    def mutating(self) -> int:
        """Check that a mutation may run; returns the log position before it.

        Raises:
            FailedPreconditionError: a follower, or a read-only shard.
        """
        if self._follower:
            raise FailedPreconditionError(
                "this shard is a read-only follower: send writes to its primary"
            )
        if self.failed is not None:
            raise FailedPreconditionError(
                f"the update log failed ({self.failed}); the shard serves reads only until "
                f"it is restarted with a writable data directory"
            )
        return self._log.last_seq if self._log is not None else 0

    def acknowledge(self, before: int) -> None:
        """Wait until the log records after ``before`` (this call's) are as durable as the
        fsync policy promises."""
        if self._log is not None and self._log.last_seq > before:
            self._log.wait_durable(self._log.last_seq)
