"""The ``embeddb`` command line. The only module that reads argv, environment or config files.

Commands:
    embeddb demo      train a factorization machine on UCI Adult with its embeddings in a shard
    embeddb train     run a training job (YAML): local shards, NN workers under torchrun
    embeddb serve     serve one shard over gRPC until SIGTERM/SIGINT (then shut down cleanly)
    embeddb serve-model  serve an exported model (gRPC + HTTP/JSON, micro-batched) until SIGTERM
    embeddb cluster   run N ``serve`` processes locally, health-checked and supervised
    embeddb snapshot  take a job checkpoint: every shard of a running cluster snapshots under one id
    embeddb reshard   rewrite a job checkpoint (one snapshot id on N shards) into M shards
    embeddb --version

``python -m embeddb.cli`` works too (the cluster starts its shards that way).
"""

from __future__ import annotations

import logging
import signal
import tempfile
from importlib import resources
from pathlib import Path
from typing import Any

import click

from embeddb import __version__
from embeddb.config import EmbeddingConfig, StoreConfig
from embeddb.errors import EmbeddbError
from embeddb.secrets import read_token_file
from embeddb.server.app import ServerConfig
from embeddb.server.auth import Tokens

__all__ = ["main"]

_LOG_LEVELS = click.Choice(["debug", "info", "warning", "error"])
_DEFAULT_PORT = 7070


def _packaged_config(name: str) -> EmbeddingConfig:
    text = resources.files("embeddb.presets").joinpath(name).read_text()
    return EmbeddingConfig.from_yaml_text(text, source=f"embeddb/presets/{name}")


def _load_config(path: Path | None) -> EmbeddingConfig:
    return EmbeddingConfig.from_yaml(path) if path else _packaged_config("default.yaml")


def _read_bytes(path: Path | None) -> bytes | None:
    if path is None:
        return None
    try:
        return path.read_bytes()
    except OSError as exc:
        raise click.ClickException(f"cannot read {path}: {exc}") from exc


def _read_token(path: Path | None) -> str | None:
    """The bearer token of a client token file (``embeddb.secrets.read_token_file``)."""
    if path is None:
        return None
    try:
        return read_token_file(path)
    except EmbeddbError as exc:
        raise click.ClickException(str(exc)) from exc


def _channel_credentials(ca: Path | None) -> Any:
    """TLS channel credentials trusting the PEM certificate(s) in ``ca``; None for plaintext."""
    if ca is None:
        return None
    import grpc

    return grpc.ssl_channel_credentials(root_certificates=_read_bytes(ca))


def _set_log_level(ctx: click.Context, level: str | None) -> None:
    """The command's ``--log-level``, else the group's if given explicitly, else ``info``."""
    if level is None:
        parent = ctx.parent
        explicit = parent is not None and (
            parent.get_parameter_source("log_level") is click.core.ParameterSource.COMMANDLINE
        )
        level = parent.params["log_level"] if parent is not None and explicit else "info"
    logging.getLogger().setLevel(level.upper())


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="embeddb")
@click.option(
    "--log-level",
    type=_LOG_LEVELS,
    default="warning",
    show_default=True,
)
def main(log_level: str) -> None:
    """embeddb: an embedding database and hybrid training system for recommender models."""
    logging.basicConfig(
        level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )


@main.command()
@click.option(
    "--config",
    "config_path",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Embedding config YAML (default: the packaged presets/adult.yaml).",
)
@click.option(
    "--data-dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Shard data directory (default: a temporary directory, removed afterwards).",
)
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
    from embeddb.shard import Shard

    try:
        config = (
            EmbeddingConfig.from_yaml(config_path)
            if config_path
            else _packaged_config("adult.yaml")
        )
        if ram_rows is not None:
            tables = {n: replace(t, capacity=ram_rows) for n, t in config.tables.items()}
            store = StoreConfig(
                stripes=config.store.stripes,
                eviction_chunk=config.store.eviction_chunk,
                min_stripe_rows=min(config.store.min_stripe_rows, ram_rows),
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
@main.command()
@click.argument("job", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option(
    "--predict",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="After training, answer this many online predictions (the first test rows).",
)
def train(job: Path, predict: int) -> None:
    """Train the job in JOB (YAML; schema in embeddb/trainer/job.py): start local shards
    (unless the job lists addresses), the NN workers under torchrun, show progress, evaluate.
    Needs the trainer extra (torch)."""
    try:
        from embeddb.trainer.launch import launch
    except ImportError as exc:  # pragma: no cover - the launcher itself needs no torch
        raise click.ClickException(f"embeddb train needs the trainer extra: {exc}") from exc
    try:
        code = launch(job, predict=predict, echo=click.echo)
    except EmbeddbError as exc:
        raise click.ClickException(str(exc)) from exc
    if code:
        raise SystemExit(code)


# --------------------------------------------------------------------------------------- serve
@main.command()
@click.option(
    "--config",
    "config_path",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Embedding config YAML (default: the packaged presets/default.yaml).",
)
@click.option(
    "--data-dir",
    default="embeddb-data/shard-{index}",
    show_default=True,
    help="Shard data directory; {index} is replaced by the shard index.",
)
@click.option(
    "--ephemeral",
    is_flag=True,
    help="Keep rows in a temporary directory removed at exit (nothing persists).",
)
@click.option(
    "--shard-index",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    envvar="EMBEDDB_SHARD_INDEX",
    show_envvar=True,
    help="This shard's index; the option wins over the variable (a Kubernetes StatefulSet sets "
    "the variable from the pod ordinal).",
)
@click.option("--num-shards", type=click.IntRange(min=1), default=1, show_default=True)
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind.")
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    help=f"Port to bind (default: {_DEFAULT_PORT} + shard index; 0: any free port).",
)
@click.option(
    "--port-file",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write the bound port here once serving (removed at shutdown).",
)
@click.option(
    "--metrics-port",
    type=click.IntRange(0, 65535),
    help="Serve Prometheus metrics at http://HOST:PORT/metrics (0: any free port).",
)
@click.option(
    "--metrics-host",
    metavar="ADDRESS",
    help="Address the metrics endpoint binds (default: --host); it has no TLS or tokens.",
)
@click.option(
    "--tls-cert",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="PEM certificate chain; with --tls-key the port serves TLS only.",
)
@click.option(
    "--tls-key",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="PEM private key for --tls-cert.",
)
@click.option(
    "--tokens-file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Require bearer tokens: lines 'rw TOKEN', 'ro TOKEN' or 'replica TOKEN' (followers); "
    "the file must be private (chmod 600).",
)
@click.option(
    "--tokens-from-env",
    is_flag=True,
    help="Require bearer tokens from EMBEDDB_RW_TOKEN / EMBEDDB_RO_TOKEN / EMBEDDB_REPLICA_TOKEN.",
)
@click.option("--log-level", type=_LOG_LEVELS, help="Log level (default: info).")
@click.option(
    "--max-message-mb",
    type=click.IntRange(min=1),
    default=ServerConfig().max_message_bytes >> 20,
    show_default=True,
    help="Largest request or response, in MiB.",
)
@click.option(
    "--max-response-mb",
    type=click.IntRange(min=1),
    default=ServerConfig().max_response_bytes >> 20,
    show_default=True,
    help="Largest answer (ids x dim x 4 bytes, computed before any work) and the most an "
    "LZ4-compressed request tensor may decompress to, in MiB; more is RESOURCE_EXHAUSTED.",
)
@click.option(
    "--max-streams",
    type=click.IntRange(min=1),
    default=ServerConfig().max_streams,
    show_default=True,
    help="Subscribe/FetchSnapshot streams served at once, per token role.",
)
@click.option(
    "--stream-idle-timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=ServerConfig().stream_idle_timeout,
    show_default=True,
    help="Seconds a Subscribe/FetchSnapshot caller may leave a message unread before the "
    "stream is dropped.",
)
@click.option(
    "--max-idle",
    type=click.FloatRange(min=0, min_open=True),
    default=ServerConfig().max_idle_s,
    show_default=True,
    help="Seconds a connection without calls stays open (clients reconnect on their next call).",
)
@click.option(
    "--workers", type=click.IntRange(min=1), default=ServerConfig().workers, show_default=True
)
@click.option(
    "--grace",
    type=click.FloatRange(min=0),
    default=5.0,
    show_default=True,
    help="Seconds in-flight calls may finish after SIGTERM/SIGINT.",
)
@click.option(
    "--restore",
    metavar="SNAPSHOT_ID",
    help="Start from this snapshot of the data directory; the state and update log after it "
    "are set aside (the log is kept in log.before-restore-<time>).",
)
@click.option(
    "--fallback-snapshot",
    is_flag=True,
    help="If the newest snapshot fails verification while recovering from a crash, recover "
    "from the next older one instead of refusing to start.",
)
@click.option(
    "--cut-corrupt-log-tail",
    is_flag=True,
    help="Cut a corrupt update log tail (losing its records; saved in DATA_DIR/log-cuts/) "
    "instead of refusing to start.",
)
@click.option(
    "--follow",
    metavar="HOST:PORT",
    help="Serve a read-only follower of the primary shard at HOST:PORT (bootstrapped from its "
    "snapshot, then fed its update log); --data-dir then holds the replica (default "
    "embeddb-data/follower-{index}).",
)
@click.option(
    "--primary-token-file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="With --follow: file holding the bearer token for the primary: a replica token "
    "(private file, chmod 600).",
)
@click.option(
    "--primary-tls-ca",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="With --follow: PEM certificate(s) to trust; the primary is reached over TLS.",
)
@click.option(
    "--primary-tls-server-name",
    help="With --follow: the name in the primary's certificate, if HOST does not match it.",
)
@click.option(
    "--parent-pid",
    type=click.IntRange(min=1),
    hidden=True,  # set by `embeddb cluster`: shut down once this process is no longer the parent
)
@click.pass_context
def serve(
    ctx: click.Context,
    config_path: Path | None,
    data_dir: str,
    ephemeral: bool,
    shard_index: int,
    num_shards: int,
    host: str,
    port: int | None,
    port_file: Path | None,
    metrics_port: int | None,
    metrics_host: str | None,
    tls_cert: Path | None,
    tls_key: Path | None,
    tokens_file: Path | None,
    tokens_from_env: bool,
    log_level: str | None,
    max_message_mb: int,
    max_response_mb: int,
    max_streams: int,
    stream_idle_timeout: float,
    max_idle: float,
    workers: int,
    grace: float,
    restore: str | None,
    fallback_snapshot: bool,
    cut_corrupt_log_tail: bool,
    follow: str | None,
    primary_token_file: Path | None,
    primary_tls_ca: Path | None,
    primary_tls_server_name: str | None,
    parent_pid: int | None,
) -> None:
    """Serve one shard over gRPC until SIGTERM or SIGINT, then shut down cleanly.

    Shutdown: health NOT_SERVING, stop accepting calls, let in-flight ones finish (--grace),
    write rows back and record a clean shutdown, exit 0.

    A directory that was not shut down cleanly is recovered from its newest snapshot and update
    log. With --follow the process serves a read-only replica of another shard instead.
    """
    from embeddb.server.daemon import DaemonOptions, run_daemon
    from embeddb.server.follower import FollowerOptions

    _set_log_level(ctx, log_level)
    if shard_index >= num_shards:
        raise click.BadParameter(
            f"must be less than --num-shards ({num_shards}), got {shard_index}",
            param_hint="--shard-index",
        )
    if tokens_file is not None and tokens_from_env:
        raise click.UsageError("use --tokens-file or --tokens-from-env, not both")
    if follow is not None and (restore is not None or fallback_snapshot):
        raise click.UsageError(
            "--follow excludes --restore and --fallback-snapshot: a follower bootstraps from "
            "its primary's snapshot"
        )
    if follow is None and (primary_token_file or primary_tls_ca or primary_tls_server_name):
        raise click.UsageError("the --primary-* options need --follow")
    if ephemeral and restore is not None:
        raise click.UsageError("--restore needs a data directory, not --ephemeral")
    if metrics_host is not None and metrics_port is None:
        raise click.UsageError("--metrics-host needs --metrics-port")
    if follow is not None and ctx.get_parameter_source("data_dir") is not (
        click.core.ParameterSource.COMMANDLINE
    ):
        data_dir = "embeddb-data/follower-{index}"
    try:
        config = _load_config(config_path)
        tokens = (
            Tokens.from_file(tokens_file)
            if tokens_file is not None
            else Tokens.from_env()
            if tokens_from_env
            else None
        )
        server_config = ServerConfig(
            host=host,
            port=_DEFAULT_PORT + shard_index if port is None else port,
            shard_index=shard_index,
            num_shards=num_shards,
            max_message_bytes=max_message_mb << 20,
            max_response_bytes=max_response_mb << 20,
            max_streams=max_streams,
            stream_idle_timeout=stream_idle_timeout,
            max_idle_s=max_idle,
            workers=workers,
            tls_cert=_read_bytes(tls_cert),
            tls_key=_read_bytes(tls_key),
            tokens=tokens,
            metrics_port=metrics_port,
            metrics_host=metrics_host,
        )
        following = (
            None
            if follow is None
            else FollowerOptions(
                primary=follow,
                token=_read_token(primary_token_file),
                credentials=_channel_credentials(primary_tls_ca),
                server_name=primary_tls_server_name,
            )
        )
        options = DaemonOptions(
            data_dir=None if ephemeral else Path(data_dir.replace("{index}", str(shard_index))),
            grace=grace,
            port_file=port_file,
            parent_pid=parent_pid,
            restore=restore,
            fallback=fallback_snapshot,
            cut_corrupt_log_tail=cut_corrupt_log_tail,
            follow=following,
        )
        code = run_daemon(config, server_config, options)
    except (EmbeddbError, OSError) as exc:
        raise click.ClickException(str(exc)) from exc
    ctx.exit(code)


# --------------------------------------------------------------------------------- serve-model
@main.command("serve-model")
@click.option(
    "--model",
    "model_dir",
    required=True,
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    help="The exported model directory (model.json, dense.pt, embedding.yaml).",
)
@click.option(
    "--addresses",
    "address_file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="File of the shards' HOST:PORT lines in shard order (followers in production).",
)
@click.option(
    "--shard",
    "shards",
    multiple=True,
    metavar="HOST:PORT",
    help="A shard to read, in shard order (repeat for each); instead of --addresses.",
)
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind.")
@click.option(
    "--port", type=click.IntRange(0, 65535), default=7080, show_default=True, help="gRPC port."
)
@click.option(
    "--http-port",
    type=click.IntRange(0, 65535),
    default=8080,
    show_default=True,
    help="HTTP/JSON port (POST /v1/predict, GET /healthz).",
)
@click.option("--no-http", is_flag=True, help="Serve gRPC only.")
@click.option(
    "--metrics-port",
    type=click.IntRange(0, 65535),
    help="Serve Prometheus metrics at http://HOST:PORT/metrics (0: any free port).",
)
@click.option(
    "--metrics-host",
    metavar="ADDRESS",
    help="Address the metrics endpoint binds (default: --host); it has no TLS or tokens.",
)
@click.option(
    "--port-file",
    type=click.Path(dir_okay=False, path_type=Path),
    help='Write {"grpc": port, "http": port, "metrics": port} here once serving (removed at '
    "shutdown).",
)
@click.option(
    "--tokens-file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Require bearer tokens of callers: lines 'rw TOKEN', 'ro TOKEN' or 'replica TOKEN' "
    "(any may predict); the file must be private (chmod 600).",
)
@click.option(
    "--tokens-from-env",
    is_flag=True,
    help="Require bearer tokens from EMBEDDB_RW_TOKEN / EMBEDDB_RO_TOKEN / EMBEDDB_REPLICA_TOKEN.",
)
@click.option(
    "--shard-token-file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="File holding the bearer token for the shards (read-only is enough).",
)
@click.option(
    "--shard-tls-ca",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="PEM certificate(s) to trust; the shards are reached over TLS.",
)
@click.option(
    "--tls-cert",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="PEM certificate chain; with --tls-key the gRPC port serves TLS only.",
)
@click.option(
    "--tls-key",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="PEM private key for --tls-cert.",
)
@click.option(
    "--max-batch",
    type=click.IntRange(min=1),
    default=256,
    show_default=True,
    help="Most samples per micro-batch (one model call); a larger request runs alone.",
)
@click.option(
    "--max-delay-ms",
    type=click.FloatRange(min=0),
    default=2.0,
    show_default=True,
    help="Longest a request waits for others to join its micro-batch.",
)
@click.option(
    "--workers",
    type=click.IntRange(min=1),
    default=8,
    show_default=True,
    help="gRPC threads (also the most gRPC requests one micro-batch merges).",
)
@click.option("--log-level", type=_LOG_LEVELS, help="Log level (default: info).")
@click.pass_context
def serve_model(
    ctx: click.Context,
    model_dir: Path,
    address_file: Path | None,
    shards: tuple[str, ...],
    host: str,
    port: int,
    http_port: int,
    no_http: bool,
    metrics_port: int | None,
    metrics_host: str | None,
    port_file: Path | None,
    tokens_file: Path | None,
    tokens_from_env: bool,
    shard_token_file: Path | None,
    shard_tls_ca: Path | None,
    tls_cert: Path | None,
    tls_key: Path | None,
    max_batch: int,
    max_delay_ms: float,
    workers: int,
    log_level: str | None,
) -> None:
    """Serve an exported model over gRPC and HTTP/JSON until SIGTERM or SIGINT.

    Embeddings are read from the shards (read-only followers in production) with evaluation
    lookups; concurrent requests are scored together in micro-batches. Shutdown: health
    NOT_SERVING, stop accepting calls, let in-flight ones finish, exit 0. Needs the trainer
    extra (torch).
    """
    _set_log_level(ctx, log_level)
    if (address_file is None) == (not shards):
        raise click.UsageError("give --addresses FILE or --shard HOST:PORT (one of them)")
    if tokens_file is not None and tokens_from_env:
        raise click.UsageError("use --tokens-file or --tokens-from-env, not both")
    if metrics_host is not None and metrics_port is None:
        raise click.UsageError("--metrics-host needs --metrics-port")
    try:
        from embeddb.trainer.serving.daemon import ModelDaemonOptions, run_model_server
        from embeddb.trainer.serving.server import ModelServerConfig
    except ImportError as exc:
        raise click.ClickException(f"embeddb serve-model needs the trainer extra: {exc}") from exc
    try:
        tokens = (
            Tokens.from_file(tokens_file)
            if tokens_file is not None
            else Tokens.from_env()
            if tokens_from_env
            else None
        )
        config = ModelServerConfig(
            host=host,
            port=port,
            http_port=None if no_http else http_port,
            metrics_port=metrics_port,
            metrics_host=metrics_host,
            max_batch=max_batch,
            max_delay=max_delay_ms / 1e3,
            workers=workers,
            tokens=tokens,
            tls_cert=_read_bytes(tls_cert),
            tls_key=_read_bytes(tls_key),
        )
        options = ModelDaemonOptions(
            model_dir=model_dir,
            shards=address_file if address_file is not None else list(shards),
            shard_token=_read_token(shard_token_file),
            shard_tls_ca=shard_tls_ca,
            port_file=port_file,
        )
        code = run_model_server(config, options)
    except (EmbeddbError, OSError) as exc:
        raise click.ClickException(str(exc)) from exc
    ctx.exit(code)


# ------------------------------------------------------------------------------------ snapshot
@main.command("snapshot")
@click.option("--addresses", help="Every shard's HOST:PORT, comma-separated, in shard order.")
@click.option(
    "--address-file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="File of HOST:PORT lines in shard order (embeddb cluster writes DATA_DIR/addresses.txt).",
)
@click.option("--id", "snapshot_id", help="The snapshot id (default: job-<UTC time>).")
@click.option(
    "--token-file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="File holding a read-write bearer token (alone on its first line, or 'rw TOKEN').",
)
@click.option(
    "--tls-ca",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="PEM certificate(s) to trust; the shards are reached over TLS.",
)
@click.option("--tls-server-name", help="The name in the shards' certificate, if HOST differs.")
@click.option(
    "--timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=600.0,
    show_default=True,
    help="Seconds each shard may take.",
)
def snapshot_command(
    addresses: str | None,
    address_file: Path | None,
    snapshot_id: str | None,
    token_file: Path | None,
    tls_ca: Path | None,
    tls_server_name: str | None,
    timeout: float,
) -> None:
    """Take a job checkpoint: every shard of a running cluster snapshots under one id.

    Prints one line per shard. If a shard fails, the command exits 1 naming it; the snapshots
    the other shards took remain. Restore a checkpoint with `embeddb serve --restore ID` on
    every shard. For a checkpoint consistent across shards, pause training meanwhile.
    """
    from embeddb.client import Client, read_address_file

    if (addresses is None) == (address_file is None):
        raise click.UsageError("give --addresses or --address-file (one of them)")
    if tls_server_name is not None and tls_ca is None:
        raise click.UsageError("--tls-server-name needs --tls-ca")
    try:
        shards = (
            read_address_file(address_file)
            if address_file is not None
            else tuple(a.strip() for a in (addresses or "").split(",") if a.strip())
        )
        credentials = _channel_credentials(tls_ca)
        factory = None
        if credentials is not None and tls_server_name is not None:
            import grpc

            name = [("grpc.ssl_target_name_override", tls_server_name)]

            def factory(address: str) -> Any:
                return grpc.secure_channel(address, credentials, options=name)

        with Client(
            shards,
            token=_read_token(token_file),
            credentials=credentials,
            channel_factory=factory,
            tune_allocator=False,
        ) as client:
            results = client.snapshot(snapshot_id, timeout=timeout)
    except EmbeddbError as exc:
        raise click.ClickException(str(exc)) from exc
    line = "{:<7}{:<24}{:>12}{:>14}{:>11}{:>10}"
    click.echo(line.format("shard", "address", "seq", "bytes", "pause ms", "seconds"))
    for r in results:
        click.echo(
            line.format(
                r.shard, r.address, r.seq, f"{r.bytes:,}", f"{r.pause_ms:.1f}", f"{r.seconds:.2f}"
            )
        )
    click.echo(f"checkpoint {results[0].snapshot_id} taken on {len(results)} shards")


# ------------------------------------------------------------------------------------- cluster
@main.command()
@click.option("--num-shards", type=click.IntRange(min=1), required=True)
@click.option(
    "--config",
    "config_path",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Embedding config YAML for every shard (default: the packaged presets/default.yaml).",
)
@click.option(
    "--data-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("embeddb-data"),
    show_default=True,
    help="Root data directory; shard i uses DATA_DIR/shard-i.",
)
@click.option("--ephemeral", is_flag=True, help="Shards keep nothing after exit.")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option(
    "--base-port",
    type=click.IntRange(0, 65535),
    default=_DEFAULT_PORT,
    show_default=True,
    help="Shard i binds BASE_PORT + i; 0: each picks a free port.",
)
@click.option(
    "--address-file",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write host:port lines here (default: DATA_DIR/addresses.txt; none if --ephemeral).",
)
@click.option("--grace", type=click.FloatRange(min=0), default=5.0, show_default=True)
@click.option(
    "--start-timeout",
    type=click.FloatRange(min=1),
    default=60.0,
    show_default=True,
    help="Seconds a shard may take to become healthy.",
)
@click.option(
    "--max-restarts",
    type=click.IntRange(min=1),
    default=3,
    show_default=True,
    help="Restarts a shard may need within --restart-window (and consecutive failed restarts "
    "at all) before it is given up.",
)
@click.option(
    "--restart-window",
    type=click.FloatRange(min=0, min_open=True),
    default=60.0,
    show_default=True,
    help="Seconds over which restarts count against --max-restarts (a crash loop is given up).",
)
@click.option("--fail-fast", is_flag=True, help="Stop the cluster when a shard is given up.")
@click.option("--log-level", type=_LOG_LEVELS, help="Log level (default: info).")
@click.option("--workers", type=click.IntRange(min=1), help="Passed to every shard.")
@click.option("--max-message-mb", type=click.IntRange(min=1), help="Passed to every shard.")
@click.option(
    "--tokens-file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Passed to every shard: require bearer tokens (health checks need none).",
)
@click.option("--tokens-from-env", is_flag=True, help="Passed to every shard.")
@click.option(
    "--tls-cert",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Passed to every shard (which then serves TLS only); the supervisor's health checks "
    "trust this certificate.",
)
@click.option(
    "--tls-key",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Passed to every shard: the PEM private key for --tls-cert.",
)
@click.option(
    "--tls-server-name",
    help="The name health checks expect in the certificate when it does not name HOST.",
)
@click.option(
    "--metrics-base-port",
    type=click.IntRange(0, 65535),
    default=0,
    show_default=True,
    help="Shard i serves Prometheus metrics at http://HOST:(METRICS_BASE_PORT + i)/metrics; "
    "0: no metrics.",
)
@click.option(
    "--metrics-host",
    metavar="ADDRESS",
    help="Passed to every shard: the address its metrics endpoint binds (default: --host).",
)
@click.pass_context
def cluster(
    ctx: click.Context,
    num_shards: int,
    config_path: Path | None,
    data_dir: Path,
    ephemeral: bool,
    host: str,
    base_port: int,
    address_file: Path | None,
    grace: float,
    start_timeout: float,
    max_restarts: int,
    restart_window: float,
    fail_fast: bool,
    log_level: str | None,
    workers: int | None,
    max_message_mb: int | None,
    tokens_file: Path | None,
    tokens_from_env: bool,
    tls_cert: Path | None,
    tls_key: Path | None,
    tls_server_name: str | None,
    metrics_base_port: int,
    metrics_host: str | None,
) -> None:
    """Run NUM_SHARDS ``embeddb serve`` processes; restart any that die; stop all on Ctrl-C."""
    from embeddb.server.cluster import Cluster, ClusterConfig

    _set_log_level(ctx, log_level)
    serve_args: list[str] = []
    if workers is not None:
        serve_args += ["--workers", str(workers)]
    if max_message_mb is not None:
        serve_args += ["--max-message-mb", str(max_message_mb)]
    if tokens_file is not None:
        serve_args += ["--tokens-file", str(tokens_file.resolve())]
    if tokens_from_env:
        serve_args.append("--tokens-from-env")  # the shards inherit the environment
    try:
        _load_config(config_path)  # fail here, once, rather than in every shard
        if base_port and base_port + num_shards > 65536:
            raise click.BadParameter(
                f"{base_port} + {num_shards} shards exceeds 65535", param_hint="--base-port"
            )
        cfg = ClusterConfig(
            num_shards=num_shards,
            config_path=config_path,
            data_dir=data_dir,
            ephemeral=ephemeral,
            host=host,
            base_port=base_port,
            address_file=address_file
            if address_file is not None or ephemeral
            else data_dir / "addresses.txt",
            grace=grace,
            start_timeout=start_timeout,
            max_restarts=max_restarts,
            restart_window=restart_window,
            fail_fast=fail_fast,
            tls_cert=None if tls_cert is None else tls_cert.resolve(),
            tls_key=None if tls_key is None else tls_key.resolve(),
            tls_server_name=tls_server_name,
            metrics_base_port=metrics_base_port,
            metrics_host=metrics_host,
            log_level=log_level or logging.getLevelName(logging.getLogger().level).lower(),
            serve_args=tuple(serve_args),
        )
        runner = Cluster(cfg)
    except EmbeddbError as exc:
        raise click.ClickException(str(exc)) from exc

    def on_signal(signum: int, frame: object) -> None:
        runner.request_stop()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    code = 1
    try:
        runner.start()
        addresses = runner.wait_healthy()
        for index, address in enumerate(addresses):
            click.echo(f"shard {index}: {address}")
        if cfg.address_file is not None:
            click.echo(f"addresses written to {cfg.address_file}")
        code = runner.supervise()
    except (EmbeddbError, OSError) as exc:
        raise click.ClickException(str(exc)) from exc
    finally:
        click.echo("stopping shards ...", err=True)
        runner.stop()
        for sig, old in previous.items():
            signal.signal(sig, old)
    ctx.exit(code)


# ------------------------------------------------------------------------------------- reshard
@main.command()
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
    type=click.Path(file_okay=False, path_type=Path),
    required=True,
    help="New data root for the M shards; must not exist or be empty.",
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
    --num-shards NUM_SHARDS to recover from the new snapshots.
    """
    import time

    from embeddb.durability.reshard import ReshardProgress
    from embeddb.durability.reshard import reshard as run_reshard

    last = [0.0]

    def report(p: ReshardProgress) -> None:
        now = time.monotonic()
        if now - last[0] >= 1.0 or p.rows >= p.total:
            last[0] = now
            share = f" ({100 * p.rows / p.total:.0f}%)" if p.total else ""
            rate = p.rows / p.seconds if p.seconds > 0 else 0.0
            click.echo(f"  {p.rows:,} of {p.total:,} rows{share}, {rate:,.0f} rows/s", err=True)

    click.echo(f"resharding snapshot {snapshot_id!r} of {source} into {num_shards} shards ...")
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


@main.command()
@click.option(
    "--config",
    "config_path",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Embedding config YAML the shard serves (default: the packaged presets/default.yaml).",
)
@click.option(
    "--data-dir",
    type=click.Path(file_okay=False, path_type=Path),
    required=True,
    help="The shard's data directory (it holds snapshots/<SNAPSHOT>).",
)
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

    The snapshot is verified file by file, becomes the shard's state (RAM tier and disk tier),
    and the shard is closed cleanly, so the next `embeddb serve` starts from it. The update log
    after the snapshot is kept aside in log.before-restore-<time>, not deleted. Without
    --snapshot, lists the directory's snapshots.
    """
    from embeddb.durability import snapshot as snapshots
    from embeddb.shard import Shard

    if snapshot_id is None:
        listed = snapshots.list_snapshots(data_dir / "snapshots")
        if not listed:
            raise click.ClickException(f"no snapshots in {data_dir / 'snapshots'}")
        for s in listed:
            state = "unreadable manifest" if s.seq < 0 else f"seq {s.seq}, {s.bytes:,} bytes"
            click.echo(f"{s.snapshot_id}\t{state}")
        return
    try:
        shard = Shard(
            _load_config(config_path),
            data_dir,
            shard_index=shard_index,
            num_shards=num_shards,
            restore=snapshot_id,
        )
        seq = shard.seq
        shard.close()
    except (EmbeddbError, OSError) as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(f"{data_dir} restored to snapshot {snapshot_id!r} (seq {seq}); closed cleanly")


if __name__ == "__main__":
    main(prog_name="embeddb")
