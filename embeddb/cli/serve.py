"""``embeddb serve`` (one shard, or a read-only follower of one) and ``embeddb serve-model``
(an exported model over gRPC and HTTP/JSON). Both run until SIGTERM or SIGINT."""

from __future__ import annotations

from pathlib import Path

import click

from embeddb.cli.common import (
    channel_credentials,
    check_bindable,
    load_config,
    read_token,
    reported_errors,
    setup_logging,
    store_with_threads,
    with_threads,
)
from embeddb.cli.envvars import from_environment
from embeddb.cli.options import (
    DEFAULT_PORT,
    EXISTING_DIR,
    NEW_FILE,
    ListenArgs,
    client_auth_options,
    config_option,
    data_dir_option,
    listen_options,
    log_options,
    store_option,
)
from embeddb.cli.target import ADDRESSES_METAVAR, addresses_option
from embeddb.config import StoreConfig
from embeddb.server.app import ServerConfig

__all__ = ["serve", "serve_model"]


# --------------------------------------------------------------------------------------- serve
@from_environment("serve")
@click.command()
@config_option(
    "Embedding config YAML (default: the packaged presets/default.yaml; with --follow, the "
    "primary's tables, and a config given must agree with them)."
)
@data_dir_option(
    "Shard data directory; {index} is replaced by the shard index.",
    type=click.STRING,
    default="embeddb-data/shard-{index}",
    show_default=True,
)
@click.option(
    "--ephemeral",
    is_flag=True,
    help="Keep rows in a temporary directory removed at exit (nothing persists).",
)
@click.option(
    "--shard-index",
    type=click.IntRange(min=0),
    envvar="EMBEDDB_SHARD_INDEX",
    show_envvar=True,
    help="This shard's index (default: 0; with --follow, the primary's, which a value given "
    "must equal); the option wins over the variables (a Kubernetes StatefulSet sets "
    "EMBEDDB_SHARD_INDEX from the pod ordinal).",
)
@click.option(
    "--num-shards",
    type=click.IntRange(min=1),
    help="Shards in the cluster (default: 1; with --follow, the primary's cluster's).",
)
@listen_options(
    port=click.option(
        "--port",
        type=click.IntRange(0, 65535),
        help=f"Port to bind (default: {DEFAULT_PORT} + shard index; 0: any free port).",
    ),
    cert_help="PEM certificate chain; with --tls-key the port serves TLS only.",
    tokens_help="Require bearer tokens: lines 'rw TOKEN', 'ro TOKEN' or 'replica TOKEN' "
    "(followers); the file must be private (chmod 600).",
)
@click.option(
    "--port-file",
    type=NEW_FILE,
    help="Write the bound port here once serving (removed at shutdown).",
)
@log_options()
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
    "--max-ids-per-request",
    type=click.IntRange(min=1),
    default=ServerConfig().max_ids_per_request,
    show_default=True,
    help="Ids one request may carry (all parts of a *Many request together); more is "
    "RESOURCE_EXHAUSTED. Clients learn it from DescribeShard.",
)
@click.option(
    "--max-inflight-mb",
    type=click.IntRange(min=1),
    default=ServerConfig().max_inflight_bytes >> 20,
    show_default=True,
    help="Memory budget of the requests and answers of all calls in flight, in MiB; a call "
    "that finds no room within 60 s (or its deadline) is RESOURCE_EXHAUSTED before it "
    "builds its answer.",
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
@store_option(
    "threads",
    help="Threads that may serve the stripes of one large call, 0 to 256 (overrides the "
    "config's store.threads; default: the config's; 0 = every CPU). `embeddb train` sets it "
    "from the job's core budget.",
)
@store_option(
    "ram_budget",
    help="Bytes the RAM tiers of all tables may take (4GiB, 512MiB or an integer; overrides "
    "the config's store.ram_budget): tables without a capacity share what the others leave.",
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
@client_auth_options(
    "primary-",
    token_help="With --follow: file holding the bearer token for the primary: a replica token "
    "(private file, chmod 600).",
    ca_help="With --follow: PEM certificate(s) to trust; the primary is reached over TLS.",
    server_name_help="With --follow: the name in the primary's certificate, if HOST does not "
    "match it.",
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
    shard_index: int | None,
    num_shards: int | None,
    listen: ListenArgs,
    port_file: Path | None,
    log_level: str | None,
    log_format: str | None,
    quiet: bool,
    max_message_mb: int,
    max_response_mb: int,
    max_ids_per_request: int,
    max_inflight_mb: int,
    max_streams: int,
    stream_idle_timeout: float,
    max_idle: float,
    workers: int,
    threads: int | None,
    ram_budget: int | None,
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
    from embeddb.client import ClientOptions
    from embeddb.server.daemon import DaemonOptions, run_daemon
    from embeddb.server.follower import FollowerOptions

    setup_logging(ctx, log_level, log_format, quiet)
    if follow is None:  # a follower learns the place it is not given from its primary
        shard_index, num_shards = shard_index or 0, num_shards or 1
    if shard_index is not None and num_shards is not None and shard_index >= num_shards:
        raise click.BadParameter(
            f"must be less than --num-shards ({num_shards}), got {shard_index}",
            param_hint="--shard-index",
        )
    listen.check()
    if follow is not None and (restore is not None or fallback_snapshot):
        raise click.UsageError(
            "--follow excludes --restore and --fallback-snapshot: a follower bootstraps from "
            "its primary's snapshot"
        )
    if follow is None and (primary_token_file or primary_tls_ca or primary_tls_server_name):
        raise click.UsageError("the --primary-* options need --follow")
    if ephemeral and restore is not None:
        raise click.UsageError("--restore needs a data directory, not --ephemeral")
    if follow is not None and ctx.get_parameter_source("data_dir") not in (
        click.core.ParameterSource.COMMANDLINE,
        click.core.ParameterSource.ENVIRONMENT,
    ):
        data_dir = "embeddb-data/follower-{index}"
    index = shard_index or 0  # the default port and data directory
    port = DEFAULT_PORT + index if listen.port is None else listen.port
    check_bindable(listen.host, port)
    check_bindable(listen.metrics_host or listen.host, listen.metrics_port)
    with reported_errors():
        # a follower without --config serves its primary's tables (embeddb.server.follower)
        if follow is not None and config_path is None and ram_budget is not None:
            raise click.UsageError("--ram-budget of a follower needs its --config")
        config = (
            None
            if follow is not None and config_path is None
            else load_config(config_path, ram_budget)
        )
        if threads is not None and config is not None:
            config = with_threads(config, threads)
        server_config = ServerConfig(
            listen=listen.config(DEFAULT_PORT + index if listen.port is None else None),
            shard_index=shard_index,
            num_shards=num_shards,
            max_message_bytes=max_message_mb << 20,
            max_response_bytes=max_response_mb << 20,
            max_ids_per_request=max_ids_per_request,
            max_inflight_bytes=max_inflight_mb << 20,
            max_streams=max_streams,
            stream_idle_timeout=stream_idle_timeout,
            max_idle_s=max_idle,
            workers=workers,
        )
        following = (
            None
            if follow is None
            else FollowerOptions(
                primary=follow,
                client=ClientOptions(
                    token=read_token(primary_token_file),
                    credentials=channel_credentials(primary_tls_ca),
                ),
                server_name=primary_tls_server_name,
                store=None if threads is None else store_with_threads(StoreConfig(), threads),
            )
        )
        options = DaemonOptions(
            data_dir=None if ephemeral else Path(data_dir.replace("{index}", str(index))),
            grace=grace,
            port_file=port_file,
            parent_pid=parent_pid,
            restore=restore,
            fallback=fallback_snapshot,
            cut_corrupt_log_tail=cut_corrupt_log_tail,
            follow=following,
        )
        code = run_daemon(config, server_config, options)
    ctx.exit(code)


# --------------------------------------------------------------------------------- serve-model
@from_environment("serve-model")
@click.command("serve-model")
@click.option(
    "--model",
    "model_dir",
    required=True,
    type=EXISTING_DIR,
    help="The exported model directory (model.json, dense.pt, embedding.yaml).",
)
@addresses_option(
    "The shards to read, in shard order (followers in production): HOST:PORT,HOST:PORT "
    "(repeatable) or @FILE, a cluster address file.",
    legacy=("--shard",),
)
@click.option(
    "--from-checkpoint",
    "checkpoint_dir",
    type=EXISTING_DIR,
    help="A job's checkpoint_dir: serve with the shards of its latest checkpoint opened in "
    "this process, read-only (no shard servers; a local demo). Instead of --addresses.",
)
@listen_options(
    port=click.option(
        "--port", type=click.IntRange(0, 65535), default=7080, show_default=True, help="gRPC port."
    ),
    cert_help="PEM certificate chain; with --tls-key the gRPC port serves TLS only.",
    tokens_help="Require bearer tokens of callers: lines 'rw TOKEN', 'ro TOKEN' or "
    "'replica TOKEN' (any may predict); the file must be private (chmod 600).",
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
    "--port-file",
    type=NEW_FILE,
    help='Write {"grpc": port, "http": port, "metrics": port} here once serving (removed at '
    "shutdown).",
)
@client_auth_options(
    "shard-",
    token_help="File holding the bearer token for the shards (read-only is enough).",
    ca_help="PEM certificate(s) to trust; the shards are reached over TLS.",
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
    "--threads",
    type=click.IntRange(min=1, max=256),
    default=1,
    show_default=True,
    help="torch intra-op threads of the model (1 keeps a lone request's latency low when "
    "several requests run at once).",
)
@click.option(
    "--workers",
    type=click.IntRange(min=1),
    default=8,
    show_default=True,
    help="gRPC threads (also the most gRPC requests one micro-batch merges); as many HTTP "
    "threads parse and score request bodies.",
)
@click.option(
    "--max-body-bytes",
    type=click.IntRange(min=1),
    default=64 << 20,
    show_default=True,
    help="Largest HTTP request body (more: 413).",
)
@click.option(
    "--max-record-bytes",
    type=click.IntRange(min=1),
    default=1 << 20,
    show_default=True,
    help="Largest record of a JSON body (HTTP, gRPC records_json), measured before parsing "
    "(more: 413 / RESOURCE_EXHAUSTED).",
)
@click.option(
    "--max-string-bytes",
    type=click.IntRange(min=1),
    default=64 << 10,
    show_default=True,
    help="Longest string (an id, a value, a key) of a JSON body, measured before parsing "
    "(more: 413 / RESOURCE_EXHAUSTED).",
)
@log_options()
@click.pass_context
def serve_model(
    ctx: click.Context,
    model_dir: Path,
    addresses: tuple[str, ...],
    checkpoint_dir: Path | None,
    listen: ListenArgs,
    http_port: int,
    no_http: bool,
    port_file: Path | None,
    shard_token_file: Path | None,
    shard_tls_ca: Path | None,
    max_batch: int,
    max_delay_ms: float,
    workers: int,
    max_body_bytes: int,
    max_record_bytes: int,
    max_string_bytes: int,
    threads: int,
    log_level: str | None,
    log_format: str | None,
    quiet: bool,
) -> None:
    """Serve an exported model over gRPC and HTTP/JSON until SIGTERM or SIGINT.

    Embeddings are read from the shards (read-only followers in production) with evaluation
    lookups, or with --from-checkpoint from a job checkpoint's shards opened in this process;
    concurrent requests are scored together in micro-batches. A model exported with its
    feature pipeline scores raw records ({"records": [{"user": "u17", "price": 12.5}]}).
    Shutdown: health NOT_SERVING, stop accepting calls, let in-flight ones finish, exit 0.
    Needs the trainer extra (torch).
    """
    setup_logging(ctx, log_level, log_format, quiet)
    if bool(addresses) == (checkpoint_dir is not None):
        raise click.UsageError(
            f"give --addresses {ADDRESSES_METAVAR} or --from-checkpoint DIR (one of them)"
        )
    if checkpoint_dir is not None and (shard_token_file or shard_tls_ca):
        raise click.UsageError("--shard-token-file and --shard-tls-ca need shards to reach")
    listen.check()
    try:
        from embeddb.serving.daemon import ModelDaemonOptions, run_model_server
        from embeddb.serving.server import ModelServerConfig
    except ImportError as exc:
        raise click.ClickException(f"embeddb serve-model needs the trainer extra: {exc}") from exc
    check_bindable(listen.host, listen.port)
    if not no_http:
        check_bindable(listen.host, http_port)
    check_bindable(listen.metrics_host or listen.host, listen.metrics_port)
    with reported_errors():
        config = ModelServerConfig(
            listen=listen.config(),
            http_port=None if no_http else http_port,
            max_batch=max_batch,
            max_delay=max_delay_ms / 1e3,
            workers=workers,
            max_body_bytes=max_body_bytes,
            max_record_bytes=max_record_bytes,
            max_string_bytes=max_string_bytes,
        )
        options = ModelDaemonOptions(
            model_dir=model_dir,
            shards=None if checkpoint_dir is not None else list(addresses),
            checkpoint_dir=checkpoint_dir,
            shard_token=read_token(shard_token_file),
            shard_tls_ca=shard_tls_ca,
            port_file=port_file,
            threads=threads,
        )
        code = run_model_server(config, options)
    ctx.exit(code)
