"""Durability of one shard (docs/architecture.md §5): the update log
(:mod:`embeddb.engine.durability.log`) of every acknowledged mutation, in seq order, which
restore replays after a snapshot and followers read while it grows.

Modules: :mod:`~embeddb.engine.durability.log` (the update log: appending, rolling and
deleting segments; its settings and fsync policies in
:mod:`~embeddb.engine.durability.log_config`, opening a directory in
:mod:`~embeddb.engine.durability.log_open`, group commit, the interval thread and a failed
fsync in :mod:`~embeddb.engine.durability.log_sync`, the cut after one in
:mod:`~embeddb.engine.durability.log_fence`, its bytes on disk in
:mod:`~embeddb.engine.durability.log_format`, the scan that validates it in
:mod:`~embeddb.engine.durability.log_scan` and its reads in
:mod:`~embeddb.engine.durability.log_read`),
:mod:`~embeddb.engine.durability.records` (what a log record holds),
:mod:`~embeddb.engine.durability.snapshot` (self-checking snapshots, and writing one; the
``snapshots/`` directory and a new snapshot's private files in
:mod:`~embeddb.engine.durability.snapshot_dirs`, sending and receiving one in
:mod:`~embeddb.engine.durability.snapshot_transfer`),
:mod:`~embeddb.engine.durability.manifest` (a snapshot's manifest, its checks, and where the
files it lists are), :mod:`~embeddb.engine.durability.reshard` (a checkpoint of N shards
rewritten into M, into the root :mod:`~embeddb.engine.durability.reshard_target` checks),
:mod:`~embeddb.engine.durability.export` (changed rows exported as numpy files),
:mod:`~embeddb.engine.durability.dirlock` (one process at a time in a data directory) and
:mod:`~embeddb.engine.durability.unfinished` (markers of an interrupted restore or reshard).

This package is core: it never imports grpc or torch.
"""

from __future__ import annotations

from embeddb.engine.durability.log import LogRecord, LogTruncatedError, UpdateLog
from embeddb.engine.durability.log_config import LogConfig

__all__ = ["LogConfig", "LogRecord", "LogTruncatedError", "UpdateLog"]
