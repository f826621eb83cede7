"""``embeddb cluster``: run N ``embeddb serve`` processes locally, health-checked, supervised."""

from __future__ import annotations

import logging
import signal
from pathlib import Path

import click

from embeddb.cli.common import check_bindable, load_config, reported_errors, setup_logging
from embeddb.cli.envvars import from_environment
from embeddb.cli.logs import json_shard_line
from embeddb.cli.options import (
    DEFAULT_PORT,
    NEW_FILE,
    ListenArgs,
    config_option,
    data_dir_option,
    listen_options,
    log_options,
    metrics_host_option,
    options,
    store_option,
)

__all__ = ["cluster"]

logger = logging.getLogger(__name__)


def _write_stderr(text: str) -> None:
    click.echo(text, err=True, nl=False)


@from_environment("cluster")
@click.command()
@click.option("--num-shards", type=click.IntRange(min=1), required=True)
@config_option(
    "Embedding config YAML for every shard (default: the packaged presets/default.yaml)."
)
@data_dir_option(
    "Root data directory; shard i uses DATA_DIR/shard-i.",
    default=Path("embeddb-data"),
    show_default=True,
)
@click.option("--ephemeral", is_flag=True, help="Shards keep nothing after exit.")
@listen_options(
    host_help=None,
    port=click.option(
        "--base-port",
        "port",
        type=click.IntRange(0, 65535),
        default=DEFAULT_PORT,
        show_default=True,
        help="Shard i binds BASE_PORT + i; 0: each picks a free port.",
    ),
    metrics=options(
        click.option(
            "--metrics-base-port",
            "metrics_port",
            type=click.IntRange(0, 65535),
            default=0,
            show_default=True,
            help="Shard i serves Prometheus metrics at "
            "http://HOST:(METRICS_BASE_PORT + i)/metrics; 0: no metrics.",
        ),
        metrics_host_option(
            "Passed to every shard: the address its metrics endpoint binds (default: --host)."
        ),
    ),
    cert_help="Passed to every shard (which then serves TLS only); the supervisor's health "
    "checks trust this certificate.",
    key_help="Passed to every shard: the PEM private key for --tls-cert.",
    tokens_help="Passed to every shard: require bearer tokens (health checks need none).",
    tokens_env_help="Passed to every shard.",
)
@click.option(
    "--address-file",
    type=NEW_FILE,
    help="Write host:port lines here (default: DATA_DIR/addresses.txt; none if --ephemeral).",
)
@click.option("--grace", type=click.FloatRange(min=0), default=5.0, show_default=True)
@click.option(
    "--start-timeout",
    type=click.FloatRange(min=1),
    default=120.0,
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
@log_options()
@click.option("--workers", type=click.IntRange(min=1), help="Passed to every shard.")
@store_option("threads", help="Passed to every shard (its store.threads).")
@click.option("--max-message-mb", type=click.IntRange(min=1), help="Passed to every shard.")
@click.option("--max-ids-per-request", type=click.IntRange(min=1), help="Passed to every shard.")
@click.option(
    "--tls-server-name",
    help="The name health checks expect in the certificate when it does not name HOST.",
)
@click.pass_context
def cluster(
    ctx: click.Context,
    num_shards: int,
    config_path: Path | None,
    data_dir: Path,
    ephemeral: bool,
    listen: ListenArgs,
    address_file: Path | None,
    grace: float,
    start_timeout: float,
    max_restarts: int,
    restart_window: float,
    fail_fast: bool,
    log_level: str | None,
    log_format: str | None,
    quiet: bool,
    workers: int | None,
    threads: int | None,
    max_message_mb: int | None,
    max_ids_per_request: int | None,
    tls_server_name: str | None,
) -> None:
    """Run NUM_SHARDS ``embeddb serve`` processes; restart any that die; stop all on Ctrl-C.

    With --log-format json the shards log JSON too, and each line they print is relayed as one
    JSON object with its "shard" index.
    """
    from embeddb.server.cluster import Cluster, ClusterConfig

    level = setup_logging(ctx, log_level, log_format, quiet)
    json_logs = (log_format or ctx.find_root().params.get("log_format")) == "json"
    quiet = quiet or bool(ctx.find_root().params.get("quiet"))
    serve_args: list[str] = ["--log-format", "json"] if json_logs else []
    if workers is not None:
        serve_args += ["--workers", str(workers)]
    if threads is not None:
        serve_args += ["--threads", str(threads)]
    if max_message_mb is not None:
        serve_args += ["--max-message-mb", str(max_message_mb)]
    if max_ids_per_request is not None:
        serve_args += ["--max-ids-per-request", str(max_ids_per_request)]
    if listen.tokens_file is not None:
        serve_args += ["--tokens-file", str(listen.tokens_file.resolve())]
    if listen.tokens_from_env:
        serve_args.append("--tokens-from-env")  # the shards inherit the environment
    with reported_errors():
        load_config(config_path)  # fail here, once, rather than in every shard
        base_port = listen.port or 0
        if base_port and base_port + num_shards > 65536:
            raise click.BadParameter(
                f"{base_port} + {num_shards} shards exceeds 65535", param_hint="--base-port"
            )
        if base_port:
            check_bindable(listen.host, *(base_port + i for i in range(num_shards)))
        if listen.metrics_port:
            metrics_ports = (listen.metrics_port + i for i in range(num_shards))
            check_bindable(listen.metrics_host or listen.host, *metrics_ports)
        cfg = ClusterConfig(
            num_shards=num_shards,
            config_path=config_path,
            data_dir=data_dir,
            ephemeral=ephemeral,
            host=listen.host,
            base_port=base_port,
            address_file=address_file
            if address_file is not None or ephemeral
            else data_dir / "addresses.txt",
            grace=grace,
            start_timeout=start_timeout,
            max_restarts=max_restarts,
            restart_window=restart_window,
            fail_fast=fail_fast,
            tls_cert=None if listen.tls_cert is None else listen.tls_cert.resolve(),
            tls_key=None if listen.tls_key is None else listen.tls_key.resolve(),
            tls_server_name=tls_server_name,
            metrics_base_port=listen.metrics_port or 0,
            metrics_host=listen.metrics_host,
            log_level=level,
            serve_args=tuple(serve_args),
        )
        runner = Cluster(
            cfg,
            output=(lambda line: _write_stderr(json_shard_line(line))) if json_logs else None,
        )

    def on_signal(signum: int, frame: object) -> None:
        runner.request_stop()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    code = 1
    try:
        with reported_errors():
            runner.start()
            addresses = runner.wait_healthy()
            if not quiet:
                for index, address in enumerate(addresses):
                    click.echo(f"shard {index}: {address}")
                if cfg.address_file is not None:
                    click.echo(f"addresses written to {cfg.address_file}")
            code = runner.supervise()
    finally:
        logger.info("stopping shards ...")
        runner.stop()
        for sig, old in previous.items():
            signal.signal(sig, old)
    ctx.exit(code)
