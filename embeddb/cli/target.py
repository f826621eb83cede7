"""The shards a command talks to, named one way by every command (:func:`addresses_option`),
plus ``--token-file`` / ``--tls-ca`` / ``--tls-server-name`` (:func:`target_options`), and the
:class:`~embeddb.client.Client` they describe (:func:`connect`). Shared by ``embeddb
tables``/``stats``/``peek``/``scan``, ``embeddb populate`` and ``embeddb snapshot``; ``embeddb
serve-model`` and ``embeddb torchserve-archive`` take the same ``--addresses``.

The one spelling, in shard order::

    --addresses 10.0.0.1:7070,10.0.0.2:7070        a comma-separated list
    --addresses 10.0.0.1:7070 --addresses 10.0.0.2:7070   repeated: the lists are joined
    --addresses @data/addresses.txt                a cluster address file (HOST:PORT lines,
                                                   # comments; embeddb cluster writes one)

The spellings of earlier releases still work for one release, each with a deprecation line on
stderr: ``--address HOST:PORT`` (repeated), ``--address-file FILE``, ``--shard HOST:PORT``
(repeated) and ``--addresses FILE`` (a file without the ``@``).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from embeddb.cli.common import channel_credentials, read_token, reported_errors
from embeddb.cli.options import Command, Decorator, client_auth_options, options

if TYPE_CHECKING:
    from embeddb.client import Client

__all__ = [
    "ADDRESSES_METAVAR",
    "LEGACY_ADDRESS_OPTIONS",
    "ShardPlace",
    "Target",
    "addresses_option",
    "connect",
    "parse_addresses",
    "shard_place",
    "target_options",
]

ADDRESSES_METAVAR = "HOST:PORT,...|@FILE"
# the deprecated spellings: option -> (parameter name, what replaces it)
LEGACY_ADDRESS_OPTIONS = {
    "--address": ("legacy_address", "--addresses HOST:PORT,..."),
    "--address-file": ("legacy_address_file", "--addresses @FILE"),
    "--shard": ("legacy_shard", "--addresses HOST:PORT,..."),
}


def deprecated(old: str, new: str) -> None:
    """One line on stderr: ``old`` still works, for this release, and ``new`` replaces it (not a
    Python ``DeprecationWarning``: the message is for the person typing the command)."""
    click.echo(
        f"Warning: {old} is deprecated and will be removed in the next release; use {new}",
        err=True,
    )


def _read_file(path: Path) -> tuple[str, ...]:
    """The addresses of a cluster address file (``embeddb.client.read_address_file``).

    Raises:
        click.ClickException: the file is missing, unreadable, empty or has a bad line.
    """
    from embeddb.client.options import read_address_file
    from embeddb.errors import EmbeddbError

    try:
        return read_address_file(path)
    except EmbeddbError as exc:
        raise click.ClickException(str(exc)) from exc


def _is_address(text: str) -> bool:
    host, sep, port = text.rpartition(":")
    return bool(sep and host and port.isdigit() and 0 < int(port) < 65536)


def parse_addresses(values: Sequence[str], option: str = "--addresses") -> tuple[str, ...]:
    """The shard addresses ``values`` of ``--addresses`` name, in order: each value is a
    comma-separated ``HOST:PORT`` list or ``@FILE`` (``embeddb.client.options.parse_addresses``);
    a lone value without ``@`` that is no address but an existing file is read as a file too
    (deprecated).

    Raises:
        click.BadParameter: a value names no address, or an item is not ``HOST:PORT``.
        click.ClickException: an address file is missing, unreadable or malformed.
    """
    from embeddb.client.options import parse_addresses as parse
    from embeddb.errors import ConfigError

    found: list[str] = []
    for value in values:
        items = [item.strip() for item in value.split(",") if item.strip()]
        if len(items) == 1 and not _is_address(items[0]) and Path(items[0]).is_file():
            deprecated(f"{option} FILE", f"{option} @FILE")
            found += _read_file(Path(items[0]))
        elif value.startswith("@"):
            found += _read_file(Path(value[1:]))
        else:
            try:
                found += parse([value], option)
            except ConfigError as exc:
                reason = str(exc).removeprefix(f"{option}: ")
                raise click.BadParameter(reason, param_hint=option) from None
    return tuple(found)


def addresses_option(help: str, *, legacy: Sequence[str] = ()) -> Decorator:
    """``--addresses`` (see the module docstring), and the deprecated spellings named in
    ``legacy`` (keys of :data:`LEGACY_ADDRESS_OPTIONS`, hidden from ``--help``), gathered into
    one ``addresses`` argument: a tuple of ``HOST:PORT`` in shard order, empty when none was
    given (the command decides whether that is an error).

    Raises (when the command runs):
        click.UsageError: both ``--addresses`` and a deprecated spelling, or two of those.
    """
    declared = [
        click.option(
            "--addresses",
            "addresses",
            multiple=True,
            metavar=ADDRESSES_METAVAR,
            help=help,
        )
    ]
    for name in legacy:
        param, _ = LEGACY_ADDRESS_OPTIONS[name]
        declared.append(click.option(name, param, multiple=name != "--address-file", hidden=True))

    def decorate(command: Command) -> Command:
        @functools.wraps(command)  # keeps the options declared below this decorator
        def gather(*args: Any, **kwargs: Any) -> Any:
            given: dict[str, tuple[str, ...]] = {}
            new = kwargs.pop("addresses")
            if new:
                given["--addresses"] = parse_addresses(new)
            for name in legacy:
                param, replacement = LEGACY_ADDRESS_OPTIONS[name]
                value = kwargs.pop(param)
                if not value:
                    continue
                deprecated(name, replacement)
                if name == "--address-file":
                    given[name] = _read_file(Path(value))
                else:
                    given[name] = parse_addresses(value, name)
            if len(given) > 1:
                raise click.UsageError(
                    f"give the shards' addresses once, with --addresses (got {', '.join(given)})"
                )
            kwargs["addresses"] = next(iter(given.values()), ())
            return command(*args, **kwargs)

        return options(*declared)(gather)

    return decorate


@dataclass(frozen=True)
class Target:
    """Where and how to reach the cluster (the options of :func:`target_options`)."""

    addresses: tuple[str, ...]
    token_file: Path | None
    tls_ca: Path | None
    tls_server_name: str | None
    one_shard: bool = False  # one address may be any one shard of a cluster (see connect)


def target_options(
    token_help: str = "File holding a bearer token (an ro token suffices).",
    *,
    one_shard: bool = False,
) -> Decorator:
    """A decorator adding ``--addresses`` (with the deprecated ``--address`` and
    ``--address-file``) and the client auth options, gathered into one ``target`` argument (a
    :class:`Target`).

    Args:
        token_help: the help of ``--token-file`` (which role the command needs).
        one_shard: a single address may be one shard of a larger cluster (:func:`connect`);
            otherwise the addresses must be every shard of one cluster.
    """
    whole = "every shard, in shard order" if not one_shard else "in shard order"
    alone = " One address of a larger cluster: that shard alone." if one_shard else ""

    def decorate(command: Command) -> Command:
        @functools.wraps(command)  # keeps the options declared below this decorator
        def gather(**kwargs: Any) -> Any:
            kwargs["target"] = Target(
                kwargs.pop("addresses"),
                kwargs.pop("token_file"),
                kwargs.pop("tls_ca"),
                kwargs.pop("tls_server_name"),
                one_shard,
            )
            return command(**kwargs)

        return options(
            addresses_option(
                f"The shards, {whole}: HOST:PORT,HOST:PORT (repeatable) or @FILE, a cluster "
                f"address file (embeddb cluster writes DATA_DIR/addresses.txt).{alone}",
                legacy=("--address", "--address-file"),
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

    Before its first call the client checks that the addresses are every shard of one
    cluster, in shard order. With ``target.one_shard`` (commands that only read), a single
    address may be any one shard of a cluster: the client then talks to that shard alone (see
    :func:`shard_place`).

    Raises:
        click.UsageError: no address, or ``--tls-server-name`` without ``--tls-ca``.
        click.ClickException: an unreadable token or certificate file, or an
            :class:`~embeddb.errors.EmbeddbError` raised inside the block.
    """
    from embeddb.client import Client, ClientOptions

    if not target.addresses:
        raise click.UsageError(
            f"give the shards' addresses: --addresses {ADDRESSES_METAVAR}, in shard order"
        )
    if target.tls_server_name is not None and target.tls_ca is None:
        raise click.UsageError("--tls-server-name needs --tls-ca")
    with reported_errors():
        credentials = channel_credentials(target.tls_ca)
        factory = None
        if credentials is not None and target.tls_server_name is not None:
            import grpc

            name = [("grpc.ssl_target_name_override", target.tls_server_name)]

            def factory(address: str) -> Any:
                return grpc.secure_channel(address, credentials, options=name)

        client_options = ClientOptions(
            token=read_token(target.token_file),
            credentials=credentials,
            tune_allocator=False,
            verify_topology=not (target.one_shard and len(target.addresses) == 1),
        )
        with Client(target.addresses, client_options, channel_factory=factory) as client:
            yield client


@dataclass(frozen=True)
class ShardPlace:
    """The one shard a single-address client reaches, in a cluster of several."""

    address: str
    shard_index: int
    num_shards: int

    def note(self) -> str:
        """The line the inspection commands print on stderr before that shard's part."""
        return (
            f"{self.address} is shard {self.shard_index} of {self.num_shards}: showing that "
            f"shard's part only (give every shard's address for the whole cluster)"
        )


def shard_place(client: Client) -> ShardPlace | None:
    """Which shard of how many a client of one address reaches (its ``Stats`` answer); None
    when the client lists several addresses or the shard is its cluster's only one.

    Raises:
        EmbeddbError: the shard cannot be reached.
    """
    if client.num_shards != 1:
        return None
    answer = client.stats()[0]
    if answer["num_shards"] <= 1:
        return None
    return ShardPlace(answer["address"], answer["shard_index"], answer["num_shards"])
