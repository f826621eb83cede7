"""The ``embeddb`` click group, ``main``. Each command's module is imported when the command
runs (``embeddb train`` never imports the shard engine, numba or gRPC server code), so a
command's process holds only what it uses: the training launcher and the local cluster's
supervisor stay small (``benchmarks/data.py`` sums every process of a job)."""

from __future__ import annotations

import importlib
import logging

import click

from embeddb import __version__
from embeddb.cli.options import LOG_LEVELS

__all__ = ["COMMANDS", "main"]

# command name -> "module:attribute" of its click command
COMMANDS = {
    "cluster": "embeddb.cli.cluster:cluster",
    "demo": "embeddb.cli.train:demo",
    "reshard": "embeddb.cli.durability:reshard",
    "restore": "embeddb.cli.durability:restore",
    "serve": "embeddb.cli.serve:serve",
    "serve-model": "embeddb.cli.serve:serve_model",
    "snapshot": "embeddb.cli.durability:snapshot_command",
    "train": "embeddb.cli.train:train",
}


class _LazyGroup(click.Group):
    """A group whose commands are imported on first use (``COMMANDS``)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = COMMANDS.get(cmd_name)
        if target is None:
            return None
        module, attribute = target.split(":")
        command = getattr(importlib.import_module(module), attribute)
        assert isinstance(command, click.Command), target
        return command


@click.group(cls=_LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="embeddb")
@click.option(
    "--log-level",
    type=LOG_LEVELS,
    default="warning",
    show_default=True,
)
def main(log_level: str) -> None:
    """embeddb: an embedding database and hybrid training system for recommender models."""
    logging.basicConfig(
        level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
