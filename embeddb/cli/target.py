"""The cluster a client command talks to: ``--address`` (repeated, in shard order) or
``--address-file``, plus ``--token-file`` / ``--tls-ca`` / ``--tls-server-name``
(:func:`target_options`), and the :class:`~embeddb.client.Client` they describe
(:func:`connect`). Shared by ``embeddb tables``/``stats``/``peek``/``scan`` and
``embeddb populate``."""

from __future__ import annotations

import functools
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from embeddb.cli.common import channel_credentials, read_token, reported_errors
from embeddb.cli.options import EXISTING_FILE, Command, Decorator, client_auth_options, options

if TYPE_CHECKING:
    from embeddb.client import Client

__all__ = ["Target", "connect", "target_options"]


@dataclass(frozen=True)
class Target:
    """Where and how to reach the cluster (the options of :func:`target_options`)."""

    addresses: tuple[str, ...]
    address_file: Path | None
    token_file: Path | None
    tls_ca: Path | None
    tls_server_name: str | None


def target_options(
    token_help: str = "File holding a bearer token (an ro token suffices).",
) -> Decorator:
    """A decorator adding ``--address`` (repeated), ``--address-file`` and the client auth
    options, gathered into one ``target`` argument (a :class:`Target`).

    Args:
        token_help: the help of ``--token-file`` (which role the command needs).
    """

    def decorate(command: Command) -> Command:
        @functools.wraps(command)  # keeps the options declared below this decorator
        def gather(**kwargs: Any) -> Any:
            kwargs["target"] = Target(
                tuple(kwargs.pop("address")),
                kwargs.pop("address_file"),
                kwargs.pop("token_file"),
                kwargs.pop("tls_ca"),
                kwargs.pop("tls_server_name"),
            )
            return command(**kwargs)

        return options(
            click.option(
                "--address",
                multiple=True,
                metavar="HOST:PORT",
                help="A shard's address; repeat for every shard, in shard order.",
            ),
            click.option(
                "--address-file",
                type=EXISTING_FILE,
                help="File of HOST:PORT lines in shard order (embeddb cluster writes "
                "DATA_DIR/addresses.txt).",
            ),
            client_auth_options(
                "",
                token_help=token_help,
                ca_help="PEM certificate(s) to trust; the shards are reached over TLS.",
                server_name_help="The name in the shards' certificate, if HOST differs.",
            ),
        )(gather)

    return decorate


@contextmanager
def connect(target: Target) -> Iterator[Client]:
    """A client of ``target``; errors of the environment become one ``Error:`` line.

    Raises:
        click.UsageError: neither or both of ``--address`` and ``--address-file``, or
            ``--tls-server-name`` without ``--tls-ca``.
        click.ClickException: an unreadable address, token or certificate file, or an
            :class:`~embeddb.errors.EmbeddbError` raised inside the block.
    """
    from embeddb.client import Client, ClientOptions, read_address_file

    if bool(target.addresses) == (target.address_file is not None):
        raise click.UsageError("give --address (repeated) or --address-file (one of them)")
    if target.tls_server_name is not None and target.tls_ca is None:
        raise click.UsageError("--tls-server-name needs --tls-ca")
    with reported_errors():
        shards = (
            read_address_file(target.address_file)
            if target.address_file is not None
            else target.addresses
        )
        credentials = channel_credentials(target.tls_ca)
        factory = None
        if credentials is not None and target.tls_server_name is not None:
            import grpc

            name = [("grpc.ssl_target_name_override", target.tls_server_name)]

            def factory(address: str) -> Any:
                return grpc.secure_channel(address, credentials, options=name)

        token = read_token(target.token_file)
        client_options = ClientOptions(token=token, credentials=credentials, tune_allocator=False)
        with Client(shards, client_options, channel_factory=factory) as client:
            yield client
