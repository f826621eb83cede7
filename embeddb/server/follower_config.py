"""What a follower serves, learned from its primary before each bootstrap: the primary's place
in its cluster (``DescribeShard``) and its tables (``ListTables``), as a :class:`PrimaryLayout`.

A follower started without ``--config`` serves exactly the primary's tables
(:func:`adopted_config`: name, dim, optimizer and RAM-tier capacity of each; the store settings
are the defaults). A follower holds rows, it never updates them, so the optimizer's
hyperparameters and the initializer do not matter: only the row layout ``[vector | state]``,
which the optimizer kind and the state width fix. A ``--config`` given anyway must agree with
the primary on every table's name, dim and row layout (:func:`disagreement`; the capacity may
differ: the follower's own RAM budget), and a ``--shard-index`` / ``--num-shards`` given must
name the primary's place (:func:`topology_disagreement`).

What a follower accepts from its primary is bounded (:class:`SnapshotLimits`): a snapshot of
more files, a larger file or more bytes in all than the limits allow is refused while it
arrives (:class:`CorruptDataError`, the partial copy removed), so a broken or hostile primary
cannot fill the follower's disk. The total defaults to the free space of the follower's data
directory (less a reserve), measured when each bootstrap starts.
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from embeddb.client.plans import TableDescription
from embeddb.config import EmbeddingConfig, OptimizerConfig, OptimizerKind, StoreConfig, TableConfig
from embeddb.errors import ConfigError, CorruptDataError

__all__ = [
    "PrimaryLayout",
    "ReceiveBudget",
    "SnapshotLimits",
    "adopted_config",
    "disagreement",
    "topology_disagreement",
]

_GIB = 1 << 30


@dataclass(frozen=True)
class SnapshotLimits:
    """Bounds on one snapshot a follower receives from its primary.

    Attributes:
        max_files: files in the snapshot (its RocksDB checkpoint's SST files, three per table
            for the RAM tier, the manifest).
        max_file_bytes: bytes of one file (the largest is usually a table's RAM rows).
        max_total_bytes: bytes of the whole snapshot; None: the free space of the follower's
            data directory when the bootstrap starts, less ``reserve_bytes``.
        reserve_bytes: space left free when ``max_total_bytes`` is None.

    Raises:
        ConfigError: a limit below 1 (the key names it).
    """

    max_files: int = 100_000
    max_file_bytes: int = 1024 * _GIB
    max_total_bytes: int | None = None
    reserve_bytes: int = _GIB

    def __post_init__(self) -> None:
        for key in ("max_files", "max_file_bytes", "max_total_bytes"):
            value = getattr(self, key)
            if value is not None and value < 1:
                raise ConfigError(key, f"must be at least 1, got {value}")
        if self.reserve_bytes < 0:
            raise ConfigError("reserve_bytes", f"must be at least 0, got {self.reserve_bytes}")

    def budget(self, data_dir: Path) -> ReceiveBudget:
        """A fresh budget for one snapshot received into ``data_dir``."""
        total = self.max_total_bytes
        if total is None:
            try:
                free = shutil.disk_usage(data_dir).free
            except OSError:
                free = self.max_file_bytes
            total = max(1, free - self.reserve_bytes)
        return ReceiveBudget(self, total)


class ReceiveBudget:
    """Counts one snapshot's files and bytes as its chunks arrive (see :class:`SnapshotLimits`).

    Args:
        limits: the bounds.
        total_bytes: the bound on the snapshot's bytes.
    """

    def __init__(self, limits: SnapshotLimits, total_bytes: int) -> None:
        self.limits = limits
        self.total_bytes = total_bytes
        self.bytes = 0
        self._sizes: dict[str, int] = {}

    def take(self, path: str, offset: int, size: int) -> None:
        """Account for ``size`` bytes of ``path`` at ``offset`` before they are written.

        Raises:
            CorruptDataError: a bound would be exceeded (the message names it).
        """
        limits = self.limits
        if path not in self._sizes and len(self._sizes) >= limits.max_files:
            raise CorruptDataError(
                f"the primary's snapshot has more than {limits.max_files} files (max_files)"
            )
        end = max(self._sizes.get(path, 0), offset + size)
        if end > limits.max_file_bytes:
            raise CorruptDataError(
                f"the primary's snapshot file {path!r} exceeds {limits.max_file_bytes} bytes "
                f"(max_file_bytes)"
            )
        if self.bytes + size > self.total_bytes:
            raise CorruptDataError(
                f"the primary's snapshot exceeds {self.total_bytes} bytes (max_total_bytes, "
                f"by default the free space of the follower's data directory)"
            )
        self._sizes[path] = end
        self.bytes += size


@dataclass(frozen=True)
class PrimaryLayout:
    """The primary's answers: its place (``shard_index`` of ``num_shards``) and tables."""

    address: str
    shard_index: int
    num_shards: int
    tables: tuple[TableDescription, ...]


def _table(described: TableDescription, address: str) -> TableConfig:
    """The table a follower opens for one the primary describes.

    Raises:
        ConfigError: an optimizer this embeddb does not know, or a state width it does not
            produce (the primary is another version).
    """
    try:
        kind = OptimizerKind(described.optimizer)
    except ValueError:
        raise ConfigError(
            f"tables.{described.name}.optimizer",
            f"primary {address} uses optimizer {described.optimizer!r}, which this embeddb does "
            f"not know (give the follower the primary's version)",
        ) from None
    shared = kind is OptimizerKind.ADAGRAD and described.state_dim == 1 < described.dim
    table = TableConfig(
        name=described.name,
        dim=described.dim,
        optimizer=OptimizerConfig(kind=kind, vectorwise_shared=shared),
        capacity=max(described.capacity, 1),
    )
    if table.state_dim != described.state_dim:
        raise ConfigError(
            f"tables.{described.name}.optimizer",
            f"primary {address} keeps {described.state_dim} state floats per row of table "
            f"{described.name!r} ({kind.value}, dim {described.dim}); this embeddb keeps "
            f"{table.state_dim}",
        )
    return table


def adopted_config(layout: PrimaryLayout, store: StoreConfig | None = None) -> EmbeddingConfig:
    """The embedding config of a follower serving ``layout``'s tables (``store``: the default
    store settings when None).

    Raises:
        ConfigError: the primary serves no table, or one this embeddb cannot lay out.
    """
    if not layout.tables:
        raise ConfigError("tables", f"primary {layout.address} serves no table")
    tables = {t.name: _table(t, layout.address) for t in layout.tables}
    return EmbeddingConfig(tables=tables, store=store or StoreConfig())


def _names(names: Sequence[str]) -> str:
    return ", ".join(repr(n) for n in sorted(names))


def disagreement(config: EmbeddingConfig, layout: PrimaryLayout) -> str | None:
    """How the follower's ``--config`` disagrees with the primary's tables, or None when it
    agrees (same names; each with the same dim, optimizer and state width)."""
    primary = {t.name: t for t in layout.tables}
    where = f"the follower's --config disagrees with its primary {layout.address}"
    missing = [n for n in primary if n not in config.tables]
    if missing:
        return f"{where}: it lacks table(s) {_names(missing)}, which the primary serves"
    extra = [n for n in config.tables if n not in primary]
    if extra:
        return f"{where}: it defines table(s) {_names(extra)}, which the primary does not serve"
    for name, described in primary.items():
        mine = config.tables[name]
        if mine.dim != described.dim:
            return (
                f"{where}: table {name!r} has dim {described.dim} on the primary, {mine.dim} in "
                f"--config"
            )
        if (mine.optimizer.kind.value, mine.state_dim) != (
            described.optimizer,
            described.state_dim,
        ):
            return (
                f"{where}: table {name!r} uses {described.optimizer} with {described.state_dim} "
                f"state floats per row on the primary, {mine.optimizer.kind.value} with "
                f"{mine.state_dim} in --config"
            )
    return None


def topology_disagreement(
    layout: PrimaryLayout, shard_index: int | None, num_shards: int | None
) -> str | None:
    """How a ``--shard-index`` / ``--num-shards`` given to the follower disagrees with the
    primary's place, or None (each one not given is the primary's)."""
    index = layout.shard_index if shard_index is None else shard_index
    count = layout.num_shards if num_shards is None else num_shards
    if (index, count) == (layout.shard_index, layout.num_shards):
        return None
    return (
        f"primary {layout.address} serves shard {layout.shard_index} of {layout.num_shards}; "
        f"this follower was started as shard {index} of {count}"
    )
