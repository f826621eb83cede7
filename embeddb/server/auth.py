"""Bearer-token authentication and read-only authorisation, as a gRPC server interceptor.

A caller sends ``authorization: Bearer <token>`` metadata (what
``grpc.access_token_call_credentials`` sends). Each token has one of two roles:

======================  ==================================================================
role                    may call
======================  ==================================================================
``Role.READ_WRITE``     everything
``Role.READ_ONLY``      ``Lookup`` with ``train=false``, ``LookupMany`` whose every part has
                        ``train=false``, ``ListTables``, ``DescribeTable``, ``Stats``,
                        ``ListSnapshots``, ``Subscribe``, ``FetchSnapshot`` with
                        ``take_new=false``
======================  ==================================================================

A training lookup is a write: it creates admitted rows, promotes disk rows and refreshes
recency, so a read-only caller gets ``PERMISSION_DENIED`` for it. So is ``Snapshot``, and
``FetchSnapshot`` with ``take_new``: a new snapshot costs a pause of the mutations and can prune
older snapshots (retention). A read-only token is enough for a follower: it reads the update
log (which shows no more than evaluation lookups could) and the newest snapshot; a primary
without any snapshot takes its first one for it (that prunes nothing). A missing, malformed or
unknown token gets ``UNAUTHENTICATED``. Services named in ``open_services`` (health checking
and reflection, so orchestrators can probe) need no token. Denied calls never reach the
servicer.

Tokens are secrets: they are compared with :func:`hmac.compare_digest` over their SHA-256
digests, and never appear in logs, error details or ``repr``.

Token file format (``Tokens.from_file``), one token per line::

    # comments and blank lines are ignored
    rw 3q2+7w...   read-write token
    ro Zm9v...     read-only token
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import logging
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from embeddb.errors import (
    ConfigError,
    EmbeddbError,
    PermissionDeniedError,
    UnauthenticatedError,
)
from embeddb.server.interceptors import abort_with, rewrap
from embeddb.v1 import embeddb_pb2 as pb

__all__ = ["MIN_TOKEN_CHARS", "AuthInterceptor", "Role", "Tokens", "authenticate"]

log = logging.getLogger(__name__)

MIN_TOKEN_CHARS = 16
_HINT = "generate one with: python -c 'import secrets; print(secrets.token_urlsafe(32))'"

_STORE = pb.DESCRIPTOR.services_by_name["EmbeddingStore"].full_name
_LOOKUP = f"/{_STORE}/Lookup"
_LOOKUP_MANY = f"/{_STORE}/LookupMany"
_FETCH_SNAPSHOT = f"/{_STORE}/FetchSnapshot"
_READ_ONLY_METHODS = frozenset(
    f"/{_STORE}/{name}"
    for name in (
        "Lookup",
        "LookupMany",
        "ListTables",
        "DescribeTable",
        "Stats",
        "ListSnapshots",
        "Subscribe",
        "FetchSnapshot",
    )
)


class Role(enum.Enum):
    """What a token allows."""

    READ_WRITE = "rw"
    READ_ONLY = "ro"


def _check_token(token: object, where: str) -> None:
    """Raise ConfigError if ``token`` cannot be a bearer token; never echo the token."""
    if not isinstance(token, str):
        raise ConfigError(where, f"a token must be a str, not {type(token).__name__}")
    if len(token) < MIN_TOKEN_CHARS:
        raise ConfigError(
            where, f"token is {len(token)} characters, fewer than {MIN_TOKEN_CHARS}; {_HINT}"
        )
    if not all("!" <= ch <= "~" for ch in token):
        raise ConfigError(
            where, "a token may hold only printable ASCII without spaces (it travels as metadata)"
        )


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8", "surrogateescape")).digest()


@dataclass(frozen=True, repr=False)
class Tokens:
    """The accepted bearer tokens.

    Args:
        read_write: tokens allowed every call.
        read_only: tokens allowed reads only (see the module docstring).

    Raises:
        ConfigError: a token is too short or not printable ASCII, a token has both roles, or
            there is no token at all (that would lock every caller out).
    """

    read_write: frozenset[str]
    read_only: frozenset[str]
    _digests: tuple[tuple[bytes, Role], ...] = field(init=False, compare=False, default=())

    def __post_init__(self) -> None:
        for name in ("read_write", "read_only"):
            value = getattr(self, name)
            if isinstance(value, str) or not isinstance(value, Iterable):
                raise ConfigError(name, "must be a set of token strings")
            object.__setattr__(self, name, frozenset(value))
            for token in getattr(self, name):
                _check_token(token, name)
        if self.read_write & self.read_only:
            raise ConfigError("tokens", "a token is listed as both read-write and read-only")
        if not self.read_write and not self.read_only:
            raise ConfigError("tokens", "no tokens given; every call would be refused")
        digests = tuple((_digest(t), Role.READ_WRITE) for t in sorted(self.read_write)) + tuple(
            (_digest(t), Role.READ_ONLY) for t in sorted(self.read_only)
        )
        object.__setattr__(self, "_digests", digests)

    def __repr__(self) -> str:
        return f"Tokens(read_write=<{len(self.read_write)}>, read_only=<{len(self.read_only)}>)"

    def role_of(self, token: str) -> Role | None:
        """The role of ``token``, or None when it is not accepted.

        Every stored digest is compared (in constant time each), whether or not one matched.
        """
        presented = _digest(token)
        found: Role | None = None
        for digest, role in self._digests:
            if hmac.compare_digest(presented, digest):
                found = role
        return found

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> Tokens:
        """Read a token file: lines ``rw TOKEN`` or ``ro TOKEN``; ``#`` starts a comment.

        Raises:
            ConfigError: the file cannot be read, or a line is malformed (the message names
                the line number, never the line's content), or see :class:`Tokens`.
        """
        p = Path(path)
        try:
            text = p.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(str(p), f"cannot read the token file: {exc}") from exc
        read_write: set[str] = set()
        read_only: set[str] = set()
        for number, line in enumerate(text.splitlines(), start=1):
            where = f"{p}:{number}"
            fields = line.split("#", 1)[0].split()
            if not fields:
                continue
            if len(fields) != 2 or fields[0] not in ("rw", "ro"):
                raise ConfigError(
                    where,
                    "expected 'rw TOKEN' or 'ro TOKEN' (the line is not shown: it may hold a "
                    "token)",
                )
            _check_token(fields[1], where)
            (read_write if fields[0] == "rw" else read_only).add(fields[1])
        if not read_write and not read_only:
            raise ConfigError(str(p), "the token file holds no tokens")
        return cls(frozenset(read_write), frozenset(read_only))

    @classmethod
    def from_env(cls, prefix: str = "EMBEDDB", environ: Mapping[str, str] | None = None) -> Tokens:
        """Read ``{prefix}_RW_TOKEN`` and ``{prefix}_RO_TOKEN``.

        Each variable holds one token, or several separated by commas or whitespace (to rotate
        tokens without downtime). Call it at the composition root only.

        Args:
            prefix: variable name prefix.
            environ: the environment to read; ``os.environ`` when None.

        Raises:
            ConfigError: neither variable is set, or a token is invalid (the message names
                the variable, never the token).
        """
        env = os.environ if environ is None else environ
        found: dict[Role, frozenset[str]] = {}
        for role in Role:
            name = f"{prefix}_{role.value.upper()}_TOKEN"
            raw = env.get(name)
            tokens = frozenset(raw.replace(",", " ").split()) if raw else frozenset()
            for token in tokens:
                _check_token(token, name)
            found[role] = tokens
        if not found[Role.READ_WRITE] and not found[Role.READ_ONLY]:
            raise ConfigError(
                f"{prefix}_RW_TOKEN", f"neither {prefix}_RW_TOKEN nor {prefix}_RO_TOKEN is set"
            )
        return cls(found[Role.READ_WRITE], found[Role.READ_ONLY])


def _bearer(metadata: Iterable[tuple[str, str | bytes]] | None) -> str:
    """The token of the one ``authorization: Bearer`` entry; UnauthenticatedError otherwise."""
    values = [v for k, v in metadata or () if k.lower() == "authorization"]
    if not values:
        raise UnauthenticatedError(
            "missing credentials: send metadata 'authorization: Bearer <token>'"
        )
    if len(values) > 1:
        raise UnauthenticatedError("more than one authorization metadata entry")
    value = values[0]
    if isinstance(value, bytes):
        value = value.decode("ascii", "replace")
    scheme, _, token = value.strip().partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise UnauthenticatedError("authorization metadata must be 'Bearer <token>'")
    return token.strip()


def authenticate(tokens: Tokens, metadata: Iterable[tuple[str, str | bytes]] | None) -> Role:
    """The role of the one ``authorization: Bearer <token>`` entry of ``metadata`` (gRPC
    metadata, or HTTP headers as ``(name, value)`` pairs).

    Raises:
        UnauthenticatedError: no such entry, several, a malformed one, or an unknown token.
    """
    role = tokens.role_of(_bearer(metadata))
    if role is None:
        raise UnauthenticatedError("invalid bearer token")
    return role


Check = Callable[[Any], None]


class AuthInterceptor(grpc.ServerInterceptor):  # type: ignore[misc]
    """Refuses calls without an accepted token, and writes by read-only tokens.

    Args:
        tokens: the accepted tokens.
        open_services: full service names callable without a token (health, reflection).
        read_only_methods: full method names (``/package.Service/Method``) a read-only token
            may call; ``None``: the ``EmbeddingStore`` reads of the module docstring. (The
            model server passes its ``Predict``.)
    """

    def __init__(
        self,
        tokens: Tokens,
        open_services: Iterable[str] = (),
        read_only_methods: Iterable[str] | None = None,
    ) -> None:
        self._tokens = tokens
        self._open = frozenset(open_services)
        self._read_only = (
            _READ_ONLY_METHODS if read_only_methods is None else frozenset(read_only_methods)
        )

    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], grpc.RpcMethodHandler | None],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler | None:
        handler = continuation(handler_call_details)
        method: str = handler_call_details.method
        if handler is None or method.split("/")[1] in self._open:
            return handler
        try:
            role = authenticate(self._tokens, handler_call_details.invocation_metadata)
            if role is Role.READ_ONLY and method not in self._read_only:
                raise PermissionDeniedError(
                    f"a read-only token may not call {method.rsplit('/', 1)[-1]}"
                )
        except EmbeddbError as exc:
            log.info("refused %s: %s", method, exc)
            return _refusing(handler, exc)
        if role is Role.READ_ONLY and method == _LOOKUP:
            return _checked(handler, _refuse_training_lookup, method)
        if role is Role.READ_ONLY and method == _LOOKUP_MANY:
            return _checked(handler, _refuse_training_lookups, method)
        if role is Role.READ_ONLY and method == _FETCH_SNAPSHOT:
            return _checked(handler, _refuse_new_snapshot, method)
        return handler


def _refuse_training_lookup(request: Any) -> None:
    if request.train:
        raise PermissionDeniedError(
            "a read-only token may not run a training lookup (train=true creates rows and "
            "refreshes recency); send train=false or use a read-write token"
        )


def _refuse_training_lookups(request: Any) -> None:
    for part in request.lookups:
        _refuse_training_lookup(part)


def _refuse_new_snapshot(request: Any) -> None:
    if request.take_new:
        raise PermissionDeniedError(
            "a read-only token may not take a snapshot (FetchSnapshot take_new=true); fetch the "
            "newest one or use a read-write token"
        )


def _refusing(handler: grpc.RpcMethodHandler, error: EmbeddbError) -> grpc.RpcMethodHandler:
    """A handler of the same shape as ``handler`` that aborts every call with ``error``."""

    def refuse(request: Any, context: grpc.ServicerContext) -> Any:
        abort_with(context, error)

    return rewrap(handler, refuse)


def _checked(handler: grpc.RpcMethodHandler, check: Check, method: str) -> grpc.RpcMethodHandler:
    """``handler`` (unary request) with ``check(request)`` run first; its error aborts the call."""
    inner = handler.unary_unary or handler.unary_stream

    def guarded(request: Any, context: grpc.ServicerContext) -> Any:
        try:
            check(request)
        except EmbeddbError as exc:
            log.info("refused %s: %s", method, exc)
            abort_with(context, exc)
        return inner(request, context)

    return rewrap(handler, guarded)
