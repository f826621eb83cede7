"""The ``embeddb`` click group, ``main``. Each command's module is imported when the command
runs (``embeddb train`` never imports the shard engine, numba or gRPC server code), so a
command's process holds only what it uses: the training launcher and the local cluster's
supervisor stay small (``benchmarks/data.py`` sums every process of a job)."""

from __future__ import annotations

import importlib
import sys
from typing import Any

import click

from embeddb import __version__
from embeddb.cli.envvars import from_environment
from embeddb.cli.logs import configure_logging, json_record
from embeddb.cli.options import LOG_FORMAT_CHOICE, LOG_LEVELS
from embeddb.common.progress import export_quiet

__all__ = ["COMMANDS", "main"]

# command name -> "module:attribute" of its click command
COMMANDS = {
    "cluster": "embeddb.cli.cluster:cluster",
    "demo": "embeddb.cli.train:demo",
    "peek": "embeddb.cli.inspect:peek",
    "populate": "embeddb.cli.populate:populate",
    "proto-path": "embeddb.cli.proto:proto_path",
    "reshard": "embeddb.cli.durability:reshard",
    "restore": "embeddb.cli.durability:restore",
    "scan": "embeddb.cli.inspect:scan",
    "serve": "embeddb.cli.serve:serve",
    "serve-model": "embeddb.cli.serve:serve_model",
    "snapshot": "embeddb.cli.durability:snapshot_command",
    "stats": "embeddb.cli.inspect:stats",
    "tables": "embeddb.cli.inspect:tables",
    "torchserve-archive": "embeddb.cli.torchserve:torchserve_archive",
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

    def invoke(self, ctx: click.Context) -> Any:
        """Run the command; under ``--log-format json`` its fatal error (a usage error of the
        command included) is one JSON record on stderr instead of the ``Error:`` line."""
        try:
            return super().invoke(ctx)
        except click.ClickException as exc:
            if ctx.params.get("log_format") != "json":
                raise
            message = exc.format_message()
            if isinstance(exc, click.UsageError) and exc.ctx is not None:
                message = f"{message} (usage: {exc.ctx.get_usage().strip()})"
            click.echo(json_record(message, level="ERROR"), file=sys.stderr)
            raise click.exceptions.Exit(exc.exit_code) from None


@from_environment("")
@click.group(cls=_LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="embeddb")
@click.option(
    "--log-level",
    type=LOG_LEVELS,
    default="warning",
    show_default=True,
)
@click.option(
    "--log-format",
    type=LOG_FORMAT_CHOICE,
    default="text",
    show_default=True,
    help="json: one JSON object per line (time, level, logger, message, exception).",
)
@click.option(
    "--quiet", "-q", is_flag=True, help="Log only warnings and errors; no progress bars or lines."
)
@click.pass_context
def main(ctx: click.Context, log_level: str, log_format: str, quiet: bool) -> None:
    """embeddb: an embedding database and hybrid training system for recommender models.

    The options of serve, serve-model and cluster can also be set by environment variables
    named EMBEDDB_<COMMAND>_<OPTION> (EMBEDDB_SERVE_PORT, EMBEDDB_SERVE_MODEL_HTTP_PORT); the
    options above drop the command (EMBEDDB_LOG_FORMAT). The command line wins.

    Long commands (train, reshard, snapshot, restore, populate) show a progress bar on a
    terminal and a plain line every 10 seconds otherwise; --quiet turns them off.
    """
    configure_logging("warning" if quiet and log_level != "error" else log_level, log_format)
    ctx.call_on_close(export_quiet(quiet))  # progress off here and in the processes it starts
