"""``embeddb proto-path``: where the installed package keeps its ``.proto`` files."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import click

__all__ = ["proto_path", "proto_root"]


def proto_root() -> Path:
    """The directory to give ``protoc -I`` (or a ``buf`` module): it holds
    ``embeddb/v1/embeddb.proto``, ``embeddb/v1/model.proto`` and the routing test vectors."""
    return Path(str(resources.files("embeddb") / "proto"))


@click.command("proto-path")
def proto_path() -> None:
    """Print the directory of embeddb's .proto files (for protoc -I or buf), e.g.

    protoc -I "$(embeddb proto-path)" --go_out=. embeddb/v1/embeddb.proto
    """
    root = proto_root()
    if not (root / "embeddb" / "v1" / "embeddb.proto").is_file():
        raise click.ClickException(f"the .proto files are missing from {root}: reinstall embeddb")
    click.echo(str(root))
