"""What every command does with the values of its options: read the files they name (embedding
config, PEM, token files), build credentials, set the log level. Errors become
``click.ClickException`` here, the boundary where a user's input is checked."""

from __future__ import annotations

import dataclasses
import logging
from importlib import resources
from pathlib import Path
from typing import Any

import click

from embeddb.config import EmbeddingConfig
from embeddb.errors import EmbeddbError
from embeddb.rpc.auth import Tokens
from embeddb.secrets import read_token_file

__all__ = [
    "channel_credentials",
    "load_config",
    "packaged_config",
    "read_bytes",
    "read_token",
    "server_tokens",
    "set_log_level",
]


def packaged_config(name: str) -> EmbeddingConfig:
    """The embedding config ``embeddb/presets/NAME`` shipped with the package."""
    text = resources.files("embeddb.presets").joinpath(name).read_text()
    return EmbeddingConfig.from_yaml_text(text, source=f"embeddb/presets/{name}")


def load_config(path: Path | None) -> EmbeddingConfig:
    """The config at ``path`` (``--config``), else the packaged ``default.yaml``."""
    return EmbeddingConfig.from_yaml(path) if path else packaged_config("default.yaml")


def with_threads(config: EmbeddingConfig, threads: int) -> EmbeddingConfig:
    """``config`` with its store's ``threads`` (``--threads``) replaced."""
    store = config.store
    parallel = dataclasses.replace(store.parallel, threads=threads)
    return dataclasses.replace(config, store=dataclasses.replace(store, parallel=parallel))


def read_bytes(path: Path | None) -> bytes | None:
    """The contents of ``path`` (a PEM file); None for None."""
    if path is None:
        return None
    try:
        return path.read_bytes()
    except OSError as exc:
        raise click.ClickException(f"cannot read {path}: {exc}") from exc


def read_token(path: Path | None) -> str | None:
    """The bearer token of a client token file (``embeddb.secrets.read_token_file``)."""
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
    if tokens_file is not None:
        return Tokens.from_file(tokens_file)
    return Tokens.from_env() if tokens_from_env else None


def set_log_level(ctx: click.Context, level: str | None) -> None:
    """The command's ``--log-level``, else the group's if given explicitly, else ``info``."""
    if level is None:
        parent = ctx.parent
        explicit = parent is not None and (
            parent.get_parameter_source("log_level") is click.core.ParameterSource.COMMANDLINE
        )
        level = parent.params["log_level"] if parent is not None and explicit else "info"
    logging.getLogger().setLevel(level.upper())
