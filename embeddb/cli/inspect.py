"""Look inside a running shard or cluster: ``embeddb tables``, ``embeddb stats``,
``embeddb peek`` and ``embeddb scan``. All four only read (an ``ro`` token suffices): ``peek`` is
an evaluation lookup (nothing is inserted or refreshed), ``scan`` pages through the ``Scan`` RPC.

Each takes the cluster's addresses like ``embeddb snapshot`` (``--address`` repeated, in shard
order, or ``--address-file``) and ``--token-file`` / ``--tls-ca`` / ``--tls-server-name``.
Rows print as CSV (``id,v0,v1,...``; float32 values with 9 significant digits, which read back
exactly) or JSON lines (``{"id": 7, "vector": [...]}``).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
import numpy as np

from embeddb.arrays import F32, U64
from embeddb.cli.common import channel_credentials, read_token, reported_errors
from embeddb.cli.options import EXISTING_FILE, client_auth_options, options

if TYPE_CHECKING:
    from embeddb.client import Client

__all__ = ["peek", "scan", "stats", "tables"]

_STATS_COLUMNS = ("rows", "ram_rows", "ram_capacity", "disk_rows", "lookup_ids", "data_loss")
_ROW_FORMATS = click.Choice(["csv", "jsonl"])


@dataclass(frozen=True)
class _Target:
    """Where and how to reach the cluster (the options of :func:`_target_options`)."""

    addresses: tuple[str, ...]
    address_file: Path | None
    token_file: Path | None
    tls_ca: Path | None
    tls_server_name: str | None


def _target_options(command: Any) -> Any:
    """``--address`` (repeated), ``--address-file`` and the client auth options, gathered into
    one ``target`` argument."""

    @functools.wraps(command)  # keeps the options declared below this decorator
    def gather(**kwargs: Any) -> Any:
        kwargs["target"] = _Target(
            tuple(kwargs.pop("address")),
            kwargs.pop("address_file"),
            kwargs.pop("token_file"),
            kwargs.pop("tls_ca"),
            kwargs.pop("tls_server_name"),
        )
        return command(**kwargs)

    return options(
        click.option(
            "--address",
            multiple=True,
            metavar="HOST:PORT",
            help="A shard's address; repeat for every shard, in shard order.",
        ),
        click.option(
            "--address-file",
            type=EXISTING_FILE,
            help="File of HOST:PORT lines in shard order (embeddb cluster writes "
            "DATA_DIR/addresses.txt).",
        ),
        client_auth_options(
            "",
            token_help="File holding a bearer token (an ro token suffices).",
            ca_help="PEM certificate(s) to trust; the shards are reached over TLS.",
            server_name_help="The name in the shards' certificate, if HOST differs.",
        ),
    )(gather)


@contextmanager
def _client(target: _Target) -> Iterator[Client]:
    """A client of the target; errors of the environment become one ``Error:`` line."""
    from embeddb.client import Client, ClientOptions, read_address_file

    if bool(target.addresses) == (target.address_file is not None):
        raise click.UsageError("give --address (repeated) or --address-file (one of them)")
    if target.tls_server_name is not None and target.tls_ca is None:
        raise click.UsageError("--tls-server-name needs --tls-ca")
    with reported_errors():
        shards = (
            read_address_file(target.address_file)
            if target.address_file is not None
            else target.addresses
        )
        credentials = channel_credentials(target.tls_ca)
        factory = None
        if credentials is not None and target.tls_server_name is not None:
            import grpc

            name = [("grpc.ssl_target_name_override", target.tls_server_name)]

            def factory(address: str) -> Any:
                return grpc.secure_channel(address, credentials, options=name)

        token = read_token(target.token_file)
        options = ClientOptions(token=token, credentials=credentials, tune_allocator=False)
        with Client(shards, options, channel_factory=factory) as client:
            yield client


def _echo_table(header: tuple[str, ...], rows: list[tuple[Any, ...]]) -> None:
    """Columns left-aligned, each as wide as its widest cell."""
    cells = [tuple(str(c) for c in header), *(tuple(str(c) for c in r) for r in rows)]
    widths = [max(len(r[k]) for r in cells) for k in range(len(header))]
    for r in cells:
        click.echo("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())


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
@_target_options
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table")
def tables(target: _Target, fmt: str) -> None:
    """List the tables: name, dim, optimizer, capacity and rows (over every shard)."""
    with _client(target) as client:
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
@_target_options
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["table", "json"]),
    default="table",
    help="json: every counter of every table of every shard.",
)
def stats(target: _Target, fmt: str) -> None:
    """Print every shard's per-table sizes and counters."""
    with _client(target) as client:
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
@_target_options
@click.option("--table", required=True, help="The table.")
@click.option("--format", "fmt", type=_ROW_FORMATS, default="csv", show_default=True)
@click.argument("ids", nargs=-1, required=True, type=click.IntRange(0, (1 << 64) - 1))
def peek(target: _Target, table: str, fmt: str, ids: tuple[int, ...]) -> None:
    """Print the vectors of IDS (an evaluation lookup: nothing is inserted or refreshed; ids
    stored nowhere read as zeros)."""
    id_arr = np.array(ids, dtype=np.uint64)
    with _client(target) as client, reported_errors():
        vectors = client.lookup(table, id_arr, train=False)
    _echo_rows(id_arr, vectors, fmt)


@click.command("scan")
@_target_options
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
def scan(target: _Target, table: str, limit: int | None, fmt: str, page_rows: int) -> None:
    """Print a table's rows: shard 0's in ascending id order, then shard 1's, and so on
    (read-only; rows written meanwhile may or may not appear)."""
    left = limit
    with _client(target) as client, reported_errors():
        pages = client.scan(table, min(page_rows, left) if left is not None else page_rows)
        for ids, vectors in pages:
            if left is not None:
                ids, vectors = ids[:left], vectors[:left]
                left -= ids.size
            _echo_rows(ids, vectors, fmt)
            if left == 0:
                break
