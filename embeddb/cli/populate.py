"""``embeddb populate``: load rows into a table of a running shard or cluster, the inverse of
``embeddb scan`` (``embeddb scan ... | embeddb populate ... -`` copies a table).

Two passes, so a bad file writes nothing: pass 1 parses and validates every row
(:mod:`embeddb.cli.rowfiles`: the table's dim, finite values, ids in ``[0, 2^64)``, no id twice)
and counts them; pass 2 parses again and writes with :meth:`Client.assign
<embeddb.client.Client.assign>`, ``--batch-rows`` rows per call (the client splits each call
into requests within every shard's limits). Standard input is spooled to a temporary file for
the two passes. Writing needs the ``rw`` role.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

import click
import numpy as np

from embeddb.cli.common import reported_errors
from embeddb.cli.options import ExistingPath
from embeddb.cli.rowfiles import FORMATS, first_duplicate, read_blocks
from embeddb.cli.target import Target, connect, target_options
from embeddb.errors import InvalidArgumentError

__all__ = ["DEFAULT_BATCH_ROWS", "populate"]

DEFAULT_BATCH_ROWS = 65_536
_SUFFIXES = {".csv": "csv", ".jsonl": "jsonl", ".ndjson": "jsonl", ".npz": "npz"}


def _format_of(file: Path, fmt: str | None) -> str:
    """``--format``, else the one FILE's suffix names (csv for standard input)."""
    if fmt is not None:
        return fmt
    if str(file) == "-":
        return "csv"
    found = _SUFFIXES.get(file.suffix.lower())
    if found is None:
        raise click.UsageError(f"cannot tell the format of {file} from its suffix: give --format")
    return found


@contextmanager
def _opened(file: Path) -> Iterator[IO[bytes]]:
    """FILE opened for reading in binary, or standard input spooled to a temporary file (both
    passes read it)."""
    if str(file) != "-":
        with reported_errors(), file.open("rb") as f:
            yield f
        return
    with tempfile.TemporaryFile() as spool:
        # sys.stdin.buffer, not click.get_binary_stream: click 8.5 deprecates that with a
        # DeprecationWarning (an error under the tests' filterwarnings) and mistypes it
        shutil.copyfileobj(sys.stdin.buffer, spool)
        spool.seek(0)
        yield spool


@click.command("populate")
@target_options(token_help="File holding a bearer token (an rw token: populate writes).")
@click.option("--table", required=True, help="The table to write into.")
@click.option(
    "--format",
    "fmt",
    type=click.Choice(FORMATS),
    help="The file's format; default: from FILE's suffix (.csv, .jsonl, .npz), csv for -.",
)
@click.option(
    "--batch-rows",
    type=click.IntRange(min=1),
    default=DEFAULT_BATCH_ROWS,
    show_default=True,
    help="Rows per assign call (the client splits it into requests within the shards' limits).",
)
@click.argument(
    "file", type=ExistingPath(exists=True, dir_okay=False, allow_dash=True, path_type=Path)
)
def populate(target: Target, table: str, fmt: str | None, batch_rows: int, file: Path) -> None:
    """Load the rows of FILE into TABLE (existing ids are overwritten): what embeddb scan
    prints (csv id,v0,v1,... or jsonl {"id": 7, "vector": [...]}) or an .npz of ids (uint64
    [n]) and vectors (float32 [n, dim]).

    Every row is checked first (dim, finite values, ids in [0, 2^64), no id twice): a bad
    row is one error naming its line, and nothing is written. FILE - reads standard input,
    which is buffered in a temporary file for the two passes.
    """
    from embeddb.common.progress import Progress

    fmt = _format_of(file, fmt)
    name = "<stdin>" if str(file) == "-" else file.name
    with _opened(file) as stream, connect(target) as client, reported_errors():
        dim = client.describe_table(table).dim
        ids, lines = [], []
        # closed only on success: a failure's one Error line is not followed by a final count
        checking = Progress(f"check {name}", unit="rows")
        for block in read_blocks(stream, fmt, dim, batch_rows, name):
            ids.append(block.ids)
            lines.append(block.lines)
            checking.update(block.ids.size)
        total = sum(a.size for a in ids)
        where = "row" if fmt == "npz" else "line"
        repeated = first_duplicate(
            np.concatenate([np.zeros(0, np.uint64), *ids]),
            np.concatenate([np.zeros(0, np.int64), *lines]),
        )
        if repeated is not None:
            id_, first, second = repeated
            raise InvalidArgumentError(
                f"{name} {where} {second}: id {id_} is also on {where} {first}"
            )
        checking.close()
        del ids, lines
        stream.seek(0)
        started = time.monotonic()
        written = 0
        writing = Progress(f"populate {table}", total=total, unit="rows")
        for block in read_blocks(stream, fmt, dim, batch_rows, name):
            client.assign(table, block.ids, block.vectors)
            written += block.ids.size
            writing.update(block.ids.size)
        writing.close()
        seconds = time.monotonic() - started
    rate = written / seconds if seconds > 0 else 0.0
    click.echo(
        f"populate: wrote {written:,} rows into {table} in {seconds:.2f} s ({rate:,.0f} rows/s)"
    )
