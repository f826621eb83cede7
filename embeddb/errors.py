"""The embeddb exception tree.

Every error embeddb raises on purpose derives from :class:`EmbeddbError`, so callers can catch
one type. Errors caused by the caller's input also derive from the matching builtin
(``ValueError``, ``LookupError``) so generic code keeps working::

    EmbeddbError
    ├── ConfigError                 (ValueError)   bad configuration; the message names the key
    ├── InvalidArgumentError        (ValueError)   bad request: dtype, shape, dim, counts
    ├── NotFoundError               (LookupError)
    │   └── TableNotFoundError                     unknown table name
    ├── ResourceExhaustedError                     a request above a configured limit
    ├── PermissionDeniedError                      a read-only caller tried to write
    ├── FailedPreconditionError                    a follower (or a failed log) asked to write
    ├── OutOfRangeError                            a seq outside what the shard keeps
    │   └── LogTruncatedError       (StorageError) a follower's records were truncated away
    │                                              (embeddb.engine.durability.log; re-bootstrap)
    ├── UnauthenticatedError                       missing or wrong credentials
    ├── UnavailableError                           the shard is closed or not serving
    ├── DeadlineExceededError       (TimeoutError) a call ran past its deadline
    ├── InternalError                              the other side failed unexpectedly (a bug)
    ├── RemoteError                                a status embeddb does not map (UNKNOWN, ...)
    └── StorageError                (OSError)      the disk tier or data directory failed
        ├── CorruptDataError                       a stored artefact failed its checks
        ├── StorageFullError  (ResourceExhausted)  the data directory is full (ENOSPC)
        └── StorageFaultError (Unavailable)        an I/O error or a read-only filesystem

Foreign exceptions (RocksDB, YAML, OS) are translated at the layer that calls them, to the most
specific type above, with ``raise ... from exc`` so the cause stays visible. Servers map this
tree to gRPC status codes, and clients map the codes back, with the one table of
:mod:`embeddb.transport.status` (which imports grpc; this module does not).
"""

from __future__ import annotations

__all__ = [
    "ConfigError",
    "CorruptDataError",
    "DeadlineExceededError",
    "EmbeddbError",
    "FailedPreconditionError",
    "InternalError",
    "InvalidArgumentError",
    "NotFoundError",
    "OutOfRangeError",
    "PermissionDeniedError",
    "RemoteError",
    "ResourceExhaustedError",
    "StorageError",
    "StorageFaultError",
    "StorageFullError",
    "TableNotFoundError",
    "UnauthenticatedError",
    "UnavailableError",
]


class EmbeddbError(Exception):
    """Root of every error embeddb raises on purpose."""


class ConfigError(EmbeddbError, ValueError):
    """A configuration file or object is invalid. The message names the offending key path."""

    def __init__(self, key: str, message: str) -> None:
        self.key = key
        super().__init__(f"{key}: {message}" if key else message)


class InvalidArgumentError(EmbeddbError, ValueError):
    """A request argument is malformed (wrong dtype, shape, dim or count)."""


class NotFoundError(EmbeddbError, LookupError):
    """A named object does not exist."""


class TableNotFoundError(NotFoundError):
    """The request names a table the shard does not have."""

    def __init__(self, table: str, known: tuple[str, ...] = ()) -> None:
        self.table = table
        hint = f"; known tables: {', '.join(sorted(known))}" if known else ""
        super().__init__(f"unknown table {table!r}{hint}")


class ResourceExhaustedError(EmbeddbError):
    """A request exceeds a configured limit (message size, ids per request)."""


class PermissionDeniedError(EmbeddbError):
    """The caller is authenticated but may not perform this operation."""


class FailedPreconditionError(EmbeddbError):
    """The shard is not in a state that allows the operation (a read-only follower asked to
    write, a shard whose update log failed asked to mutate)."""


class OutOfRangeError(EmbeddbError):
    """A position outside what the shard keeps: update log records already truncated away
    (``embeddb.engine.durability.log.LogTruncatedError`` derives from this), or a seq beyond the
    shard's last. A follower that gets it must bootstrap again from a fresh snapshot."""


class UnauthenticatedError(EmbeddbError):
    """The caller presented no credentials or wrong ones."""


class UnavailableError(EmbeddbError):
    """The shard is closed, shutting down, or otherwise not serving."""


class DeadlineExceededError(EmbeddbError, TimeoutError):
    """A call did not finish within its deadline (status ``DEADLINE_EXCEEDED``): the
    client's ``timeout`` ran out, or a link went silent."""


class InternalError(EmbeddbError):
    """The other side failed unexpectedly (status ``INTERNAL``): a bug in the server, logged
    there with its traceback. Not a :class:`StorageError`: nothing says a disk failed."""


class RemoteError(EmbeddbError):
    """A status embeddb does not map to a class of its own (``UNKNOWN``, ``UNIMPLEMENTED``,
    ``ABORTED``, ``ALREADY_EXISTS``): the other side speaks a protocol this side does not
    know, or something between them (a proxy) answered."""


class StorageError(EmbeddbError, OSError):
    """The disk tier or the data directory failed (I/O error, full disk, wrong layout)."""


class CorruptDataError(StorageError):
    """A stored artefact failed a consistency check; it is never loaded silently."""


class StorageFullError(ResourceExhaustedError, StorageError):
    """A write found the data directory full (ENOSPC, EDQUOT, EFBIG): the call changed
    nothing; writes resume once there is space (``RESOURCE_EXHAUSTED``)."""


class StorageFaultError(UnavailableError, StorageError):
    """A write or fsync failed with an I/O error, or the filesystem is read-only: the shard
    refuses writes until it is restarted (``UNAVAILABLE``)."""
