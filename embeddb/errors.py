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
    ├── UnauthenticatedError                       missing or wrong credentials
    ├── UnavailableError                           the shard is closed or not serving
    └── StorageError                (OSError)      the disk tier or data directory failed
        └── CorruptDataError                       a stored artefact failed its checks

Foreign exceptions (RocksDB, YAML, OS) are translated at the layer that calls them, to the most
specific type above, with ``raise ... from exc`` so the cause stays visible. The server maps this
tree to gRPC status codes in one table and the client maps them back.
"""

from __future__ import annotations

__all__ = [
    "ConfigError",
    "CorruptDataError",
    "EmbeddbError",
    "InvalidArgumentError",
    "NotFoundError",
    "PermissionDeniedError",
    "ResourceExhaustedError",
    "StorageError",
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


class UnauthenticatedError(EmbeddbError):
    """The caller presented no credentials or wrong ones."""


class UnavailableError(EmbeddbError):
    """The shard is closed, shutting down, or otherwise not serving."""


class StorageError(EmbeddbError, OSError):
    """The disk tier or the data directory failed (I/O error, full disk, wrong layout)."""


class CorruptDataError(StorageError):
    """A stored artefact failed a consistency check; it is never loaded silently."""
