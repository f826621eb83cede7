"""Look inside a running shard or cluster: ``embeddb tables``, ``embeddb stats``,
``embeddb peek`` and ``embeddb scan``. All four only read (an ``ro`` token suffices, except for
``scan``: it reads every row, which needs a ``replica`` or ``rw`` token): ``peek`` is an
evaluation lookup (nothing is inserted or refreshed), ``scan`` pages through the ``Scan`` RPC.

Each takes the shards' addresses like every command (``--addresses HOST:PORT,...`` in shard
order, or ``--addresses @FILE``) and ``--token-file`` / ``--tls-ca`` / ``--tls-server-name``
(:mod:`embeddb.cli.target`, shared with ``embeddb populate``, which reads these formats back).
Rows print as CSV (``id,v0,v1,...``; float32 values with 9 significant digits, which read back
exactly) or JSON lines (``{"id": 7, "vector": [...]}``). Strings the server supplies (table and
optimizer names, error details) print with control characters escaped
(:func:`~embeddb.cli.common.printable`); JSON output escapes them anyway.

One address of a cluster of several shards inspects that shard alone: a line on stderr says
which shard of how many it is, and the output is that shard's part (its rows and counters;
``peek`` prints the ids it owns and names the others on stderr).
"""

from __future__ import annotations

import json
from typing import Any

import click
import numpy as np

from embeddb.cli.common import printable, reported_errors
from embeddb.cli.target import ShardPlace, Target, connect, shard_place, target_options
from embeddb.common.arrays import F32, U64

__all__ = ["peek", "scan", "stats", "tables"]

_STATS_COLUMNS = (
    "rows",
    "ram_rows",
    "ram_capacity",
    "ram_bytes",
    "disk_rows",
    "lookup_ids",
    "data_loss",
)
_ROW_FORMATS = click.Choice(["csv", "jsonl"])


def _echo_table(header: tuple[str, ...], rows: list[tuple[Any, ...]]) -> None:
    """Columns left-aligned, each as wide as its widest cell; every cell :func:`printable`
    (table names, optimizer names and counters come from the server)."""
    cells = [tuple(header), *(tuple(printable(c) for c in r) for r in rows)]
    widths = [max(len(r[k]) for r in cells) for k in range(len(header))]
    for r in cells:
        click.echo("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())


def _noted(place: ShardPlace | None) -> None:
    """Say on stderr (stdout stays the data) that only one shard's part follows."""
    if place is not None:
        click.echo(place.note(), err=True)


def _echo_rows(ids: U64, vectors: F32, fmt: str) -> None:
    """One line per row, ``fmt`` csv or jsonl."""
    if fmt == "csv":
        values = np.char.mod("%.9g", vectors)
        lines = [f"{i}," + ",".join(v) for i, v in zip(ids.tolist(), values.tolist(), strict=True)]
    else:
        lines = [
            json.dumps({"id": i, "vector": v})
            for i, v in zip(ids.tolist(), vectors.tolist(), strict=True)
        ]
    click.echo("\n".join(lines))


@click.command("tables")
@target_options(one_shard=True)
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table")
def tables(target: Target, fmt: str) -> None:
    """List the tables: name, dim, optimizer, capacity and rows (over every shard given)."""
    with connect(target) as client, reported_errors():
        _noted(shard_place(client))
        described = client.list_tables()
        shard_stats = client.stats()
    rows = {
        t.name: sum(s["tables"].get(t.name, {}).get("rows", 0) for s in shard_stats)
        for t in described
    }
    listed = [
        {"table": t.name, "dim": t.dim, "optimizer": t.optimizer, "capacity": t.capacity}
        | {"rows": rows[t.name]}
        for t in described
    ]
    if fmt == "json":
        click.echo(json.dumps(listed))
        return
    _echo_table(
        ("table", "dim", "optimizer", "capacity", "rows"),
        [tuple(t.values()) for t in listed],
    )


@click.command("stats")
@target_options(one_shard=True)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["table", "json"]),
    default="table",
    help="json: every counter of every table of every shard.",
)
def stats(target: Target, fmt: str) -> None:
    """Print every shard's per-table sizes and counters."""
    with connect(target) as client, reported_errors():
        _noted(shard_place(client))
        shard_stats = client.stats()
    if fmt == "json":
        click.echo(json.dumps(shard_stats))
        return
    _echo_table(
        ("shard", "address", "table", *_STATS_COLUMNS),
        [
            (s["shard_index"], s["address"], name, *(c.get(k, 0) for k in _STATS_COLUMNS))
            for s in shard_stats
            for name, c in sorted(s["tables"].items())
        ],
    )


@click.command("peek")
@target_options(one_shard=True)
@click.option("--table", required=True, help="The table.")
@click.option("--format", "fmt", type=_ROW_FORMATS, default="csv", show_default=True)
@click.argument("ids", nargs=-1, required=True, type=click.IntRange(0, (1 << 64) - 1))
def peek(target: Target, table: str, fmt: str, ids: tuple[int, ...]) -> None:
    """Print the vectors of IDS (an evaluation lookup: nothing is inserted or refreshed; ids
    stored nowhere read as zeros). With one shard of a larger cluster, the ids it owns."""
    from embeddb.common.routing import shard_of

    id_arr = np.array(ids, dtype=np.uint64)
    with connect(target) as client, reported_errors():
        place = shard_place(client)
        _noted(place)
        if place is not None:
            owner = shard_of(id_arr, place.num_shards)
            elsewhere = id_arr[owner != place.shard_index]
            if elsewhere.size:
                listed = ", ".join(str(i) for i in elsewhere[:10].tolist())
                more = f" and {elsewhere.size - 10} more" if elsewhere.size > 10 else ""
                click.echo(f"not on this shard (owned by others): {listed}{more}", err=True)
            id_arr = id_arr[owner == place.shard_index]
            if not id_arr.size:
                return
        vectors = client.lookup(table, id_arr, train=False)
    _echo_rows(id_arr, vectors, fmt)


@click.command("scan")
@target_options(
    one_shard=True,
    token_help="File holding a bearer token: replica or rw (Scan reads every row; ro may not).",
)
@click.option("--table", required=True, help="The table.")
@click.option(
    "--limit",
    type=click.IntRange(min=1),
    help="Stop after this many rows (default: every row).",
)
@click.option("--format", "fmt", type=_ROW_FORMATS, default="csv", show_default=True)
@click.option(
    "--page-rows",
    type=click.IntRange(min=1, max=0xFFFFFFFF),
    default=4096,
    show_default=True,
    help="Rows per Scan call (each shard caps it).",
)
def scan(target: Target, table: str, limit: int | None, fmt: str, page_rows: int) -> None:
    """Print a table's rows: shard 0's in ascending id order, then shard 1's, and so on
    (read-only; rows written meanwhile may or may not appear)."""
    left = limit
    with connect(target) as client, reported_errors():
        _noted(shard_place(client))
        pages = client.scan(table, min(page_rows, left) if left is not None else page_rows)
        for ids, vectors in pages:
            if left is not None:
                ids, vectors = ids[:left], vectors[:left]
                left -= ids.size
            _echo_rows(ids, vectors, fmt)
            if left == 0:
                break
