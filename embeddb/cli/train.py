"""``embeddb demo`` (a factorization machine on UCI Adult, embeddings in one local shard) and
``embeddb train`` (a training job from YAML: local shards, NN workers under torchrun)."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import click

from embeddb import __version__
from embeddb.cli.common import packaged_config
from embeddb.cli.logs import json_line, json_record
from embeddb.cli.options import EXISTING_FILE, config_option, data_dir_option
from embeddb.config import EmbeddingConfig, StoreConfig
from embeddb.errors import EmbeddbError

__all__ = ["demo", "train"]


# ---------------------------------------------------------------------------------------- demo
@click.command()
@config_option("Embedding config YAML (default: the packaged presets/adult.yaml).")
@data_dir_option("Shard data directory (default: a temporary directory, removed afterwards).")
@click.option("--epochs", type=click.IntRange(min=1), default=3, show_default=True)
@click.option("--batch-size", type=click.IntRange(min=1), default=256, show_default=True)
@click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True)
@click.option(
    "--ram-rows",
    type=click.IntRange(min=1),
    help="Override every table's RAM-tier capacity (small values show the disk tier at work).",
)
def demo(
    config_path: Path | None,
    data_dir: Path | None,
    epochs: int,
    batch_size: int,
    seed: int,
    ram_rows: int | None,
) -> None:
    """Train a factorization machine on UCI Adult with its embeddings stored in a shard."""
    from dataclasses import replace

    from embeddb.demo import run_demo
    from embeddb.engine.shard import Shard

    try:
        config = (
            EmbeddingConfig.from_yaml(config_path) if config_path else packaged_config("adult.yaml")
        )
        if ram_rows is not None:
            tables = {n: replace(t, capacity=ram_rows) for n, t in config.tables.items()}
            ram = config.store.ram
            store = StoreConfig(
                ram=replace(ram, min_stripe_rows=min(ram.min_stripe_rows, ram_rows))
            )
            config = replace(config, tables=tables, store=store)
        with tempfile.TemporaryDirectory(prefix="embeddb-demo-") as tmp:
            directory = data_dir if data_dir is not None else Path(tmp) / "shard"
            click.echo(
                f"embeddb {__version__} demo: UCI Adult, {len(config.tables)} tables in {directory}"
            )
            with Shard(config, directory) as shard:
                result = run_demo(
                    config, shard, epochs=epochs, batch_size=batch_size, seed=seed, log=click.echo
                )
                stats = shard.stats()
            click.echo(f"\ntest AUC {result.test_auc:.4f}; ", nl=False)
            click.echo(f"{result.train_samples_per_s:,.0f} training samples/s")
            click.echo("\npredictions for the first test rows (P[income > 50K], truth):")
            for who, p, label in result.predictions:
                click.echo(f"  {p:5.3f}  {'>50K ' if label else '<=50K'}  {who}")
            line = "{:<16}{:>9}{:>10}{:>10}{:>10}{:>9}"
            click.echo(
                "\n"
                + line.format("table", "RAM rows", "disk rows", "RAM hits", "disk hits", "evicted")
            )
            for name, t in stats.tables.items():
                click.echo(
                    line.format(name, t.ram_rows, t.disk_rows, t.ram_hits, t.disk_hits, t.evicted)
                )
    except EmbeddbError as exc:
        raise click.ClickException(str(exc)) from exc


# --------------------------------------------------------------------------------------- train
@click.command()
@click.argument("job", type=EXISTING_FILE)
@click.option(
    "--predict",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="After training, answer this many online predictions (the first test rows).",
)
@click.pass_context
def train(ctx: click.Context, job: Path, predict: int) -> None:
    """Train the job in JOB (YAML; schema in embeddb/trainer/launcher/job.py): start local shards
    (unless the job lists addresses), the NN workers (under torchrun for two or more), show
    progress, evaluate.
    A job whose checkpoint_dir holds its last epoch says so and trains nothing (it still
    exports and predicts). Ctrl-C stops every process it started (exit code 130). Needs the
    trainer extra (torch).

    With --log-format json every line on stdout and stderr is one JSON object: the
    launcher's lines, the ranks' and the shards' (relayed), the fatal error."""
    try:
        from embeddb.trainer.launcher.launch import launch
    except ImportError as exc:  # pragma: no cover - the launcher itself needs no torch
        raise click.ClickException(f"embeddb train needs the trainer extra: {exc}") from exc
    json_logs = ctx.find_root().params.get("log_format") == "json"

    def echo(line: str) -> None:
        if json_logs:
            line = json_record(line, logger="embeddb.trainer.launcher.launch")
        elif line.startswith("interrupted") and _on_terminal():
            line = "\n" + line  # after the progress bar's line
        click.echo(line)

    try:
        code = launch(job, predict=predict, echo=echo, relay=json_line if json_logs else None)
    except EmbeddbError as exc:
        raise click.ClickException(str(exc)) from exc
    if code:
        raise SystemExit(code)


def _on_terminal() -> bool:
    try:
        return sys.stdout.isatty()
    except (AttributeError, ValueError):
        return False
