"""Option declarations that several commands share, and the checks of how they combine.

Each function returns one decorator adding its options in the order listed, so a command's
``--help`` shows them where the command puts the decorator. What differs between commands
(mostly help texts) is an argument; names, types and defaults are fixed here, once.

Groups (the parameter names the command function receives):
    config_option        --config (config_path)
    data_dir_option      --data-dir (data_dir)
    host_option          --host (host)
    log_level_option     --log-level (log_level): the command's own, over the group's
    log_options          --log-level, --log-format, --quiet (log_level, log_format, quiet):
                         how a long-running command logs (``common.setup_logging``)
    metrics_options      --metrics-port, --metrics-host (metrics_port, metrics_host)
    server_tls_options   --tls-cert, --tls-key: the certificate a server presents
    tokens_options       --tokens-file, --tokens-from-env: the bearer tokens a server accepts
    listen_options       --host, a port, the metrics options, the TLS options and the tokens
                         options of a server, gathered into one :class:`ListenArgs` (listen)
                         whose ``config()`` is the server's ``embeddb.transport.rpc.ListenConfig``
    client_auth_options  --[PREFIX]token-file, --[PREFIX]tls-ca, --[PREFIX]tls-server-name:
                         how a command or a server reaches other shards
    store_option         --KEY for the ``store:`` key KEY (KEY): one name per setting (the flag
                         is the key with dashes, its variable follows from the flag), one
                         validator (the setting's dataclass, as for the YAML file)
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from embeddb.cli.common import read_bytes, server_tokens
from embeddb.cli.logs import LOG_FORMATS
from embeddb.config.schema import STORE_KEYS, load_yaml, store_from_keys
from embeddb.errors import ConfigError

__all__ = [
    "DEFAULT_PORT",
    "DIRECTORY",
    "EXISTING_DIR",
    "EXISTING_FILE",
    "LOG_FORMAT_CHOICE",
    "LOG_LEVELS",
    "NEW_FILE",
    "ExistingPath",
    "ListenArgs",
    "StoreSetting",
    "check_metrics_options",
    "check_tokens_options",
    "client_auth_options",
    "config_option",
    "data_dir_option",
    "host_option",
    "listen_options",
    "log_level_option",
    "log_options",
    "metrics_host_option",
    "metrics_options",
    "options",
    "server_tls_options",
    "store_flag",
    "store_option",
    "tokens_options",
]

Command = Callable[..., Any]  # a command function, before `click.command` makes it a Command
Decorator = Callable[[Command], Command]


class ExistingPath(click.Path):
    """A ``click.Path`` that must exist: a missing or unreadable path is an error of the
    environment, not of the command line: one ``Error:`` line and exit code 1 (a usage
    error prints the usage and exits 2)."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        """The path, checked as ``click.Path`` does.

        Raises:
            click.ClickException: the path is missing, unreadable or of the wrong kind.
        """
        try:
            return super().convert(value, param, ctx)
        except click.BadParameter as exc:
            hint = exc.param_hint or (param.get_error_hint(ctx) if param and ctx else None)
            where = f" for {hint}" if hint else ""
            raise click.ClickException(f"Invalid value{where}: {exc.message}") from exc


if TYPE_CHECKING:
    from embeddb.transport.rpc.listen import ListenConfig

    _ParamType = click.ParamType[Any]
else:  # click < 8.2: ParamType is not generic at run time
    _ParamType = click.ParamType


class StoreSetting(_ParamType):
    """The value of one ``store:`` setting given on the command line (or in its variable).

    The text is read as the YAML scalar it would be in the config file (``4``, ``always``,
    ``null``) and checked by the setting's dataclass, the one validator of the setting: a bad
    value is refused with the message the YAML file gets (``threads: must be an integer in
    [0, 256], got 300``). The converted value is the dataclass's normalised one.
    """

    def __init__(self, key: str) -> None:
        if key not in STORE_KEYS:
            raise LookupError(f"{key!r} is not a store: key ({', '.join(STORE_KEYS)})")
        self.key = key
        self.name = key

    def get_metavar(self, param: click.Parameter, ctx: click.Context) -> str:
        """``KEY`` upper case (``--fsync-interval-ms FSYNC_INTERVAL_MS``)."""
        return self.key.upper()

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        """The setting's normalised value.

        Raises:
            click.BadParameter: the dataclass refuses the value (its message, naming the key).
        """
        try:
            parsed = load_yaml(value, store_flag(self.key)) if isinstance(value, str) else value
            store = store_from_keys({self.key: parsed})
        except ConfigError as exc:
            self.fail(str(exc), param, ctx)
        group, name = STORE_KEYS[self.key]
        return getattr(getattr(store, group), name)


def store_flag(key: str) -> str:
    """The command-line flag of the ``store:`` key ``key``: ``--`` + the key, dashes for
    underscores (``fsync_interval_ms`` -> ``--fsync-interval-ms``)."""
    return "--" + key.replace("_", "-")


LOG_LEVELS = click.Choice(["debug", "info", "warning", "error"])
LOG_FORMAT_CHOICE = click.Choice(list(LOG_FORMATS))
DEFAULT_PORT = 7070  # shard i of `embeddb serve` / `embeddb cluster` binds DEFAULT_PORT + i
EXISTING_FILE = ExistingPath(exists=True, dir_okay=False, path_type=Path)
EXISTING_DIR = ExistingPath(exists=True, file_okay=False, path_type=Path)
NEW_FILE = click.Path(dir_okay=False, path_type=Path)
DIRECTORY = click.Path(file_okay=False, path_type=Path)

_TOKENS_FROM_ENV_HELP = (
    "Require bearer tokens from EMBEDDB_RW_TOKEN / EMBEDDB_RO_TOKEN / EMBEDDB_REPLICA_TOKEN."
)


def options(*decorators: Decorator) -> Decorator:
    """One decorator that applies ``decorators`` as if they were stacked in this order."""

    def apply(f: Command) -> Command:
        for decorator in reversed(decorators):
            f = decorator(f)
        return f

    return apply


def config_option(help: str) -> Decorator:
    """``--config PATH``: an embedding config YAML (read with ``common.load_config``)."""
    return click.option("--config", "config_path", type=EXISTING_FILE, help=help)


def store_option(key: str, help: str) -> Decorator:
    """``--KEY`` (:func:`store_flag`) overriding the ``store:`` setting ``key`` of the config;
    the command receives it as the parameter ``key`` (None when not given), checked by the
    setting's dataclass (:class:`StoreSetting`). :func:`~embeddb.cli.envvars.from_environment`
    derives its variable from the flag (``EMBEDDB_SERVE_THREADS``)."""
    return click.option(store_flag(key), key, type=StoreSetting(key), help=help)


def data_dir_option(
    help: str, *, type: click.ParamType[Any] = DIRECTORY, **attrs: Any
) -> Decorator:
    """``--data-dir``: a shard's (or a cluster's) data directory; ``attrs`` as for click."""
    return click.option("--data-dir", type=type, help=help, **attrs)


def host_option(help: str | None = "Address to bind.") -> Decorator:
    """``--host``: the address a server binds."""
    return click.option("--host", default="127.0.0.1", show_default=True, help=help)


def log_level_option() -> Decorator:
    """A command's ``--log-level``; ``common.set_log_level`` applies it."""
    return click.option("--log-level", type=LOG_LEVELS, help="Log level (default: info).")


def log_options() -> Decorator:
    """``--log-level``, ``--log-format`` and ``--quiet`` of a long-running command; each, when
    not given, falls back to the ``embeddb`` group's (``common.setup_logging`` applies them)."""
    return options(
        log_level_option(),
        click.option(
            "--log-format",
            type=LOG_FORMAT_CHOICE,
            help="text, or json: one JSON object per line (time, level, logger, message, "
            "exception) (default: text).",
        ),
        click.option(
            "--quiet", "-q", is_flag=True, help="Log only warnings and errors (over --log-level)."
        ),
    )


def metrics_host_option(help: str) -> Decorator:
    """``--metrics-host ADDRESS``: the address a Prometheus endpoint binds."""
    return click.option("--metrics-host", metavar="ADDRESS", help=help)


def metrics_options() -> Decorator:
    """``--metrics-port`` and ``--metrics-host`` of a server's Prometheus endpoint."""
    return options(
        click.option(
            "--metrics-port",
            type=click.IntRange(0, 65535),
            help="Serve Prometheus metrics at http://HOST:PORT/metrics (0: any free port).",
        ),
        metrics_host_option(
            "Address the metrics endpoint binds (default: --host); it has no TLS or tokens."
        ),
    )


def server_tls_options(
    cert_help: str, key_help: str = "PEM private key for --tls-cert."
) -> Decorator:
    """``--tls-cert`` and ``--tls-key``: the PEM files a TLS server presents."""
    return options(
        click.option("--tls-cert", type=EXISTING_FILE, help=cert_help),
        click.option("--tls-key", type=EXISTING_FILE, help=key_help),
    )


def tokens_options(file_help: str, env_help: str = _TOKENS_FROM_ENV_HELP) -> Decorator:
    """``--tokens-file`` and ``--tokens-from-env``: the bearer tokens a server accepts
    (``common.server_tokens`` reads them; ``check_tokens_options`` excludes giving both)."""
    return options(
        click.option("--tokens-file", type=EXISTING_FILE, help=file_help),
        click.option("--tokens-from-env", is_flag=True, help=env_help),
    )


def client_auth_options(
    prefix: str, *, token_help: str, ca_help: str, server_name_help: str | None = None
) -> Decorator:
    """How to reach other shards: ``--{prefix}token-file`` (``common.read_token``),
    ``--{prefix}tls-ca`` (``common.channel_credentials``) and, given its help,
    ``--{prefix}tls-server-name``. ``prefix`` is ``""`` or ends with ``-``."""
    declared = [
        click.option(f"--{prefix}token-file", type=EXISTING_FILE, help=token_help),
        click.option(f"--{prefix}tls-ca", type=EXISTING_FILE, help=ca_help),
    ]
    if server_name_help is not None:
        declared.append(click.option(f"--{prefix}tls-server-name", help=server_name_help))
    return options(*declared)


def check_tokens_options(tokens_file: Path | None, tokens_from_env: bool) -> None:
    """Raises:
    click.UsageError: both ``--tokens-file`` and ``--tokens-from-env`` were given."""
    if tokens_file is not None and tokens_from_env:
        raise click.UsageError("use --tokens-file or --tokens-from-env, not both")


def check_metrics_options(metrics_port: int | None, metrics_host: str | None) -> None:
    """Raises:
    click.UsageError: ``--metrics-host`` was given without ``--metrics-port``."""
    if metrics_host is not None and metrics_port is None:
        raise click.UsageError("--metrics-host needs --metrics-port")


@dataclass(frozen=True)
class ListenArgs:
    """The values of a server's :func:`listen_options`, before any file they name is read."""

    host: str
    port: int | None
    metrics_port: int | None
    metrics_host: str | None
    tls_cert: Path | None
    tls_key: Path | None
    tokens_file: Path | None
    tokens_from_env: bool

    def check(self) -> None:
        """Raises:
        click.UsageError: both token sources, or ``--metrics-host`` without a metrics port."""
        check_tokens_options(self.tokens_file, self.tokens_from_env)
        check_metrics_options(self.metrics_port, self.metrics_host)

    def config(self, port: int | None = None) -> ListenConfig:
        """The listen config: the PEM files and tokens read; ``port`` (when given) instead of
        the option's value.

        Raises:
            click.ClickException: a PEM file cannot be read.
            ConfigError: the tokens are unreadable, malformed or empty, or see
                :class:`~embeddb.transport.rpc.listen.ListenConfig`.
        """
        from embeddb.transport.rpc.listen import ListenConfig  # grpc: when a server starts

        return ListenConfig(
            host=self.host,
            port=(self.port or 0) if port is None else port,
            tls_cert=read_bytes(self.tls_cert),
            tls_key=read_bytes(self.tls_key),
            tokens=server_tokens(self.tokens_file, self.tokens_from_env),
            metrics_port=self.metrics_port,
            metrics_host=self.metrics_host,
        )


def listen_options(
    *,
    port: Decorator,
    cert_help: str,
    tokens_help: str,
    key_help: str = "PEM private key for --tls-cert.",
    tokens_env_help: str = _TOKENS_FROM_ENV_HELP,
    host_help: str | None = "Address to bind.",
    metrics: Decorator | None = None,
) -> Decorator:
    """Where and how a server listens: ``--host``, ``port`` (an option whose parameter is
    named ``port``), ``metrics`` (:func:`metrics_options` by default; parameters
    ``metrics_port`` and ``metrics_host``), :func:`server_tls_options` and
    :func:`tokens_options`. The command function receives them as one ``listen``
    (:class:`ListenArgs`)."""

    def apply(f: Command) -> Command:
        @functools.wraps(f)
        def command(
            *args: Any,
            host: str,
            port: int | None,
            metrics_port: int | None,
            metrics_host: str | None,
            tls_cert: Path | None,
            tls_key: Path | None,
            tokens_file: Path | None,
            tokens_from_env: bool,
            **kwargs: Any,
        ) -> Any:
            listen = ListenArgs(
                host=host,
                port=port,
                metrics_port=metrics_port,
                metrics_host=metrics_host,
                tls_cert=tls_cert,
                tls_key=tls_key,
                tokens_file=tokens_file,
                tokens_from_env=tokens_from_env,
            )
            return f(*args, listen=listen, **kwargs)

        return options(
            host_option(host_help),
            port,
            metrics if metrics is not None else metrics_options(),
            server_tls_options(cert_help, key_help),
            tokens_options(tokens_help, tokens_env_help),
        )(command)

    return apply
