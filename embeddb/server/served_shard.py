"""The shard a server serves, replaceable while it serves (a follower's re-bootstrap).

A primary's server serves one :class:`~embeddb.engine.shard.Shard` for its whole life. A follower
replaces its shard when it bootstraps again from a fresh snapshot, while calls keep arriving::

    call:   with served.use() as shard: ...      borrows the current shard for one call
    swap:   old = served.swap(new)               new calls get `new`; returns once no call
            old.close()                          still uses `old`, which the caller closes
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from embeddb.engine.shard import Shard
from embeddb.errors import UnavailableError

__all__ = ["ServedShard"]


class ServedShard:
    """The shard calls are served by; none until a follower has bootstrapped.

    Args:
        shard: the shard to serve; None: calls get ``UnavailableError`` until :meth:`swap`.
        empty_reason: the message of that error.
        follower: whether the shards it will hold are a follower's (reported while empty).
    """

    def __init__(
        self,
        shard: Shard | None = None,
        empty_reason: str = "the shard is not open yet",
        follower: bool = False,
    ) -> None:
        self._shard = shard
        self.follower = follower if shard is None else shard.follower
        self._empty_reason = empty_reason
        self._users: dict[int, int] = {}  # id(shard) -> calls using it
        self._changed = threading.Condition()

    @property
    def current(self) -> Shard | None:
        """The shard new calls get (None while empty); for inspection, not for calls."""
        return self._shard

    @contextmanager
    def use(self) -> Iterator[Shard]:
        """Borrow the current shard for the duration of the block.

        Raises:
            UnavailableError: no shard is served yet.
        """
        with self._changed:
            shard = self._shard
            if shard is None:
                raise UnavailableError(self._empty_reason)
            key = id(shard)
            self._users[key] = self._users.get(key, 0) + 1
        try:
            yield shard
        finally:
            with self._changed:
                left = self._users[key] - 1
                if left:
                    self._users[key] = left
                else:
                    del self._users[key]
                    self._changed.notify_all()

    def swap(self, shard: Shard | None) -> Shard | None:
        """Serve ``shard`` from now on; wait until no call uses the previous one, return it
        (the caller closes it)."""
        with self._changed:
            old, self._shard = self._shard, shard
            if old is not None and old is not shard:
                self._changed.wait_for(lambda: id(old) not in self._users)
        return old
