"""What every command does with the values of its options: read the files they name (embedding
config, PEM, token files), build credentials, set up logging. Errors become
``click.ClickException`` here, the boundary where a user's input is checked
(:func:`reported_errors`: one ``Error:`` line on stderr, exit code 1, no traceback).

Strings a server supplies (table names, counter names, error details) are printed through
:func:`printable`: a control character (a terminal escape sequence, a newline, a bell, a
bidirectional override) is shown escaped, ``\\x1b`` or ``\\u202e``, never sent to the terminal
as is."""

from __future__ import annotations

import dataclasses
import errno
import logging
import re
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from embeddb.cli.logs import configure_logging
from embeddb.common.secrets import read_token_file
from embeddb.config import EmbeddingConfig, StoreConfig, schema
from embeddb.errors import EmbeddbError

if TYPE_CHECKING:
    from embeddb.transport.rpc.auth import Tokens

__all__ = [
    "channel_credentials",
    "check_bindable",
    "load_config",
    "packaged_config",
    "printable",
    "read_bytes",
    "read_token",
    "reported_errors",
    "server_tokens",
    "set_log_level",
    "setup_logging",
]

_EXPLICIT = (click.core.ParameterSource.COMMANDLINE, click.core.ParameterSource.ENVIRONMENT)
# grpc raises RuntimeError (not OSError) when a server port cannot be bound
_GRPC_BIND_FAILED = re.compile(r"Failed to bind to address (\S+?);")
# C0 and C1 controls, DEL, and the invisible characters that reorder or hide text
_UNPRINTABLE = re.compile(r"[\x00-\x1f\x7f-\x9f\u200b-\u200f\u2028-\u202e\u2066-\u2069\ufeff]")


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(text: object) -> str:
    """``str(text)`` with every control or invisible formatting character escaped
    (``\\x1b``, ``\\u202e``): safe to print to a terminal, and always one line."""
    return _UNPRINTABLE.sub(_escape, str(text))


def packaged_config(name: str) -> EmbeddingConfig:
    """The embedding config ``embeddb/presets/NAME`` shipped with the package."""
    text = resources.files("embeddb.presets").joinpath(name).read_text()
    return EmbeddingConfig.from_yaml_text(text, source=f"embeddb/presets/{name}")


def load_config(path: Path | None, ram_budget: int | None = None) -> EmbeddingConfig:
    """The config at ``path`` (``--config``), else the packaged ``default.yaml``; with
    ``ram_budget`` (``--ram-budget``, bytes) its ``store.ram_budget`` replaced before the
    tables are sized (the tables without a ``capacity`` share it)."""
    if ram_budget is None:
        return EmbeddingConfig.from_yaml(path) if path else packaged_config("default.yaml")
    if path is None:
        text = resources.files("embeddb.presets").joinpath("default.yaml").read_text()
        source = "embeddb/presets/default.yaml"
    else:
        text, source = schema.read_yaml_file(path)
    data = schema.load_yaml(text, source)
    if isinstance(data, dict):
        store = data.get("store")
        data["store"] = {**(store if isinstance(store, dict) else {}), "ram_budget": ram_budget}
    with schema.naming_source(source, text):
        return EmbeddingConfig.from_dict(data)


def with_threads(config: EmbeddingConfig, threads: int) -> EmbeddingConfig:
    """``config`` with its store's ``threads`` (``--threads``) replaced."""
    return dataclasses.replace(config, store=store_with_threads(config.store, threads))


def store_with_threads(store: StoreConfig, threads: int) -> StoreConfig:
    """``store`` with its ``threads`` (``--threads``) replaced."""
    return dataclasses.replace(store, parallel=dataclasses.replace(store.parallel, threads=threads))


def read_bytes(path: Path | None) -> bytes | None:
    """The contents of ``path`` (a PEM file); None for None."""
    if path is None:
        return None
    try:
        return path.read_bytes()
    except OSError as exc:
        raise click.ClickException(f"cannot read {path}: {exc}") from exc


def read_token(path: Path | None) -> str | None:
    """The bearer token of a client token file (``embeddb.common.secrets.read_token_file``)."""
    if path is None:
        return None
    try:
        return read_token_file(path)
    except EmbeddbError as exc:
        raise click.ClickException(str(exc)) from exc


def channel_credentials(ca: Path | None) -> Any:
    """The client's TLS credentials for ``ca`` (``embeddb.client.options.tls_credentials``);
    None for plaintext. An unreadable file is a usage error."""
    from embeddb.client.options import tls_credentials

    try:
        return tls_credentials(ca)
    except EmbeddbError as exc:
        raise click.ClickException(str(exc)) from exc


def server_tokens(tokens_file: Path | None, tokens_from_env: bool) -> Tokens | None:
    """The tokens a server accepts (``options.tokens_options``); None: no tokens required.

    Raises:
        ConfigError: the file or the variables are unreadable, malformed or empty.
    """
    from embeddb.transport.rpc.auth import Tokens  # grpc: not in every command's start

    if tokens_file is not None:
        return Tokens.from_file(tokens_file)
    return Tokens.from_env() if tokens_from_env else None


def _group_value(ctx: click.Context, name: str, *, explicit_only: bool) -> Any:
    """The ``embeddb`` group's value of option ``name`` (None: no group, or, with
    ``explicit_only``, not given on its command line or in the environment)."""
    parent = ctx.parent
    if parent is None or name not in parent.params:
        return None
    if explicit_only and parent.get_parameter_source(name) not in _EXPLICIT:
        return None
    return parent.params[name]


def set_log_level(ctx: click.Context, level: str | None) -> None:
    """The command's ``--log-level``, else the group's if given explicitly (command line or
    ``EMBEDDB_LOG_LEVEL``), else ``info``."""
    level = level or _group_value(ctx, "log_level", explicit_only=True) or "info"
    logging.getLogger().setLevel(level.upper())


def setup_logging(
    ctx: click.Context, level: str | None, log_format: str | None, quiet: bool
) -> str:
    """Apply a command's ``options.log_options``: each falls back to the group's (the level only
    when the group's was given explicitly), then to ``info`` / ``text``; ``quiet`` (the
    command's or the group's) raises the level to at least ``warning``.

    Returns:
        the level in effect (``embeddb cluster`` passes it to its shards).
    """
    level = level or _group_value(ctx, "log_level", explicit_only=True) or "info"
    if quiet or _group_value(ctx, "quiet", explicit_only=False):
        level = level if level == "error" else "warning"
    log_format = log_format or _group_value(ctx, "log_format", explicit_only=False) or "text"
    configure_logging(level, log_format)
    return level


def check_bindable(host: str, *ports: int | None) -> None:
    """Check, before a server starts, that each of ``ports`` on ``host`` can be bound (None
    and 0 are skipped), so a busy port is one clear line rather than gRPC's or http.server's
    error after the store has been opened. The server's own bind still decides (a race).

    Raises:
        click.ClickException: a port is in use, or ``host`` is not an address of this machine.
    """
    for port in ports:
        if not port:
            continue
        address = f"{host}:{port}"
        try:
            infos = socket.getaddrinfo(host.strip("[]"), port, type=socket.SOCK_STREAM)
        except OSError as exc:
            raise click.ClickException(f"cannot bind {address}: {exc}") from exc
        failures: list[OSError] = []
        for family, kind, proto, _, sockaddr in infos:
            try:
                with socket.socket(family, kind, proto) as probe:
                    # as gRPC binds: a TIME_WAIT left by a closed connection does not block it
                    probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                    probe.bind(sockaddr)
                break
            except OSError as exc:
                failures.append(exc)
        else:
            in_use = any(exc.errno == errno.EADDRINUSE for exc in failures)
            why = "the port is in use" if in_use else str(failures[0])
            raise click.ClickException(f"cannot bind {address}: {why}")


@contextmanager
def reported_errors() -> Iterator[None]:
    """Turns what a running command may meet in its environment (an ``EmbeddbError``, an
    ``OSError``, a port gRPC cannot bind) into a ``click.ClickException``: one line, exit 1.

    Raises:
        click.ClickException: in place of those errors.
    """
    try:
        yield
    except (EmbeddbError, OSError) as exc:  # may carry a server's error details
        raise click.ClickException(printable(str(exc) or type(exc).__name__)) from exc
    except RuntimeError as exc:
        bind = _GRPC_BIND_FAILED.match(str(exc))
        if bind is None:
            raise
        raise click.ClickException(
            f"cannot bind {bind.group(1)}: the port is in use or the address is not this machine's"
        ) from exc
