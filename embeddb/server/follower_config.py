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
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from embeddb.client.plans import TableDescription
from embeddb.config import EmbeddingConfig, OptimizerConfig, OptimizerKind, StoreConfig, TableConfig
from embeddb.errors import ConfigError

__all__ = ["PrimaryLayout", "adopted_config", "disagreement", "topology_disagreement"]


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
