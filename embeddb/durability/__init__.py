"""Durability of one shard (ARCHITECTURE.md §5): the update log (:mod:`embeddb.durability.log`)
of every acknowledged mutation, in seq order, which restore replays after a snapshot and
followers read while it grows.

This package is core: it never imports grpc or torch.
"""

from __future__ import annotations

from embeddb.durability.log import FsyncPolicy, LogConfig, LogRecord, LogTruncatedError, UpdateLog

__all__ = ["FsyncPolicy", "LogConfig", "LogRecord", "LogTruncatedError", "UpdateLog"]
