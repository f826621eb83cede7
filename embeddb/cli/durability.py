"""Job checkpoints: ``embeddb snapshot`` (of a running cluster), ``embeddb restore`` (of a
stopped shard, offline) and ``embeddb reshard`` (a checkpoint of N shards rewritten for M)."""

from __future__ import annotations

from pathlib import Path

import click

from embeddb.cli.common import load_config, printable
from embeddb.cli.options import DIRECTORY, config_option, data_dir_option
from embeddb.cli.target import Target, connect, target_options
from embeddb.common.progress import Progress
from embeddb.errors import EmbeddbError

__all__ = ["reshard", "restore", "snapshot_command"]


# ------------------------------------------------------------------------------------ snapshot
@click.command("snapshot")
@target_options(
    token_help="File holding a read-write bearer token (alone on its first line, or 'rw TOKEN')."
)
@click.option("--id", "snapshot_id", help="The snapshot id (default: job-<UTC time>).")
@click.option(
    "--timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=600.0,
    show_default=True,
    help="Seconds each shard may take.",
)
def snapshot_command(target: Target, snapshot_id: str | None, timeout: float) -> None:
    """Take a job checkpoint: every shard of a running cluster snapshots under one id.

    Prints one line per shard. If a shard fails, the command exits 1 naming it; the snapshots
    the other shards took remain. Restore a checkpoint with `embeddb serve --restore ID` on
    every shard. For a checkpoint consistent across shards, pause training meanwhile.
    """
    # one RPC to every shard at once: the count moves when all have answered
    with (
        connect(target) as client,
        Progress("snapshot", total=client.num_shards, unit="shards") as progress,
    ):
        results = client.snapshot(snapshot_id, timeout=timeout)
        progress.update(len(results), bytes=sum(r.bytes for r in results))
    line = "{:<7}{:<24}{:>12}{:>14}{:>11}{:>10}"
    click.echo(line.format("shard", "address", "seq", "bytes", "pause ms", "seconds"))
    for r in results:
        click.echo(
            line.format(
                r.shard, r.address, r.seq, f"{r.bytes:,}", f"{r.pause_ms:.1f}", f"{r.seconds:.2f}"
            )
        )
    # the snapshot id is the server's string: escaped like every server string the CLI prints
    click.echo(f"checkpoint {printable(results[0].snapshot_id)} taken on {len(results)} shards")


# ------------------------------------------------------------------------------------- reshard
@click.command()
@click.option(
    "--from",
    "source",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    required=True,
    help="Data root of the N source shards (shard-0 .. shard-(N-1)).",
)
@click.option(
    "--to",
    "target",
    type=DIRECTORY,
    required=True,
    help="New data root for the M shards; must not exist, be empty, or hold the output of an "
    "interrupted reshard (replaced).",
)
@click.option("--num-shards", type=click.IntRange(min=1), required=True, help="M.")
@click.option(
    "--snapshot",
    "snapshot_id",
    required=True,
    help="The snapshot id every source shard holds (a coordinated snapshot).",
)
@click.option(
    "--chunk-rows",
    type=click.IntRange(min=1),
    default=65536,
    show_default=True,
    help="Rows read, routed and written at a time (memory per chunk: rows x width x 4 bytes).",
)
def reshard(source: Path, target: Path, num_shards: int, snapshot_id: str, chunk_rows: int) -> None:
    """Rewrite snapshot SNAPSHOT of the N shards under FROM into NUM_SHARDS shards under TO.

    Every source snapshot is verified first. Each row (vector and optimizer state) moves to
    the shard that owns it among NUM_SHARDS; serve TO/shard-j with --shard-index j
    --num-shards NUM_SHARDS to recover from the new snapshots. The source shards must be
    stopped: a directory a running process holds is refused, naming its pid.
    """
    from embeddb.engine.durability.reshard import ReshardProgress
    from embeddb.engine.durability.reshard import reshard as run_reshard

    click.echo(f"resharding snapshot {snapshot_id!r} of {source} into {num_shards} shards ...")
    with Progress("reshard", unit="rows") as progress:

        def report(p: ReshardProgress) -> None:
            progress.report(p.rows, p.total)

        try:
            result = run_reshard(
                source, target, num_shards, snapshot_id, chunk_rows=chunk_rows, progress=report
            )
        except (EmbeddbError, OSError) as exc:
            raise click.ClickException(str(exc)) from exc
    click.echo(
        f"{result.total_rows:,} rows from {result.source_shards} shards to "
        f"{result.target_shards} in {result.seconds:.1f} s ({result.rows_per_s:,.0f} rows/s); "
        f"{result.stale:,} stale disk copies skipped"
    )
    for name, per_shard in result.rows.items():
        click.echo(
            f"  table {name}: " + ", ".join(f"shard-{j} {n:,}" for j, n in enumerate(per_shard))
        )
    click.echo(f"written to {target}/shard-<j>/snapshots/{snapshot_id}")


# ------------------------------------------------------------------------------------- restore
@click.command()
@config_option(
    "Embedding config YAML the shard serves (default: the packaged presets/default.yaml)."
)
@data_dir_option("The shard's data directory (it holds snapshots/<SNAPSHOT>).", required=True)
@click.option("--snapshot", "snapshot_id", default=None, help="Snapshot id (default: list them).")
@click.option("--shard-index", type=click.IntRange(min=0), default=0, show_default=True)
@click.option("--num-shards", type=click.IntRange(min=1), default=1, show_default=True)
def restore(
    config_path: Path | None,
    data_dir: Path,
    snapshot_id: str | None,
    shard_index: int,
    num_shards: int,
) -> None:
    """Roll a stopped shard's directory back to snapshot SNAPSHOT, offline.

    A directory a running process holds (embeddb serve) is refused, naming its pid. The
    snapshot is verified file by file, becomes the shard's state (RAM tier and disk tier),
    and the shard is closed cleanly, so the next `embeddb serve` starts from it. The update log
    after the snapshot is kept aside in log.before-restore-<time>, not deleted. Without
    --snapshot, lists the directory's snapshots.
    """
    from embeddb.engine.durability import snapshot as snapshots
    from embeddb.engine.durability.dirlock import DirectoryLock
    from embeddb.engine.recovery import Restore
    from embeddb.engine.shard import Shard

    if snapshot_id is None:
        listed = snapshots.list_snapshots(data_dir / "snapshots")
        if not listed:
            raise click.ClickException(f"no snapshots in {data_dir / 'snapshots'}")
        for s in listed:
            state = "unreadable manifest" if s.seq < 0 else f"seq {s.seq}, {s.bytes:,} bytes"
            click.echo(f"{s.snapshot_id}\t{state}")
        return
    try:
        if data_dir.is_dir():  # a running shard's directory: its one Error line, nothing before
            DirectoryLock.acquire(data_dir).release()  # (the shard takes the lock to restore)
        with Progress("restore: verifying", unit="bytes") as progress:
            shard = Shard(
                load_config(config_path),
                data_dir,
                shard_index=shard_index,
                num_shards=num_shards,
                restore=Restore(snapshot_id, progress.report),
            )
        seq = shard.seq
        shard.close()
    except (EmbeddbError, OSError) as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(f"{data_dir} restored to snapshot {snapshot_id!r} (seq {seq}); closed cleanly")
