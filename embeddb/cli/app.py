"""The ``embeddb`` click group, ``main``, with every command added to it."""

from __future__ import annotations

import logging

import click

from embeddb import __version__
from embeddb.cli.cluster import cluster
from embeddb.cli.durability import reshard, restore, snapshot_command
from embeddb.cli.options import LOG_LEVELS
from embeddb.cli.serve import serve, serve_model
from embeddb.cli.train import demo, train

__all__ = ["main"]


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
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


for _command in (demo, train, serve, serve_model, snapshot_command, cluster, reshard, restore):
    main.add_command(_command)
