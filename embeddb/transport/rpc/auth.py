"""Bearer tokens, roles, and the policy of what each role may call (enforced by
:class:`~embeddb.transport.rpc.boundary.Boundary`); what a role may call of a given service is that
service's :class:`AccessPolicy` (the shard's: ``embeddb.server.policy.STORE_POLICY``).

A caller sends ``authorization: Bearer <token>`` metadata (what
``grpc.access_token_call_credentials`` sends). Each token has one role: ``Role.READ_WRITE``
(rw), ``Role.READ_ONLY`` (ro) or ``Role.REPLICA`` (replica: a follower's). A missing,
malformed or unknown token gets ``UNAUTHENTICATED``; a call its role may not make
``PERMISSION_DENIED``. Services named in a boundary's ``open_services`` (health checking and
reflection, so orchestrators can probe) need no token.

Tokens are secrets: they are compared with :func:`hmac.compare_digest` over their SHA-256
digests, and never appear in logs, error details or ``repr``. A token file must be private to
its owner (no permission bits for group or others): anything else is refused with a message
naming ``chmod 600``.

Token file format (``Tokens.from_file``), one token per line::

    # comments and blank lines are ignored
    rw 3q2+7w...        read-write token
    ro Zm9v...          read-only token
    replica cmVw...     replica token (followers)
"""

from __future__ import annotations

import contextvars
import enum
import hashlib
import hmac
import logging
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from embeddb.common.secrets import check_private_file
from embeddb.errors import ConfigError, PermissionDeniedError, UnauthenticatedError

__all__ = [
    "CALLER_ROLE",
    "MIN_TOKEN_CHARS",
    "AccessPolicy",
    "Role",
    "Tokens",
    "authenticate",
]

logger = logging.getLogger(__name__)

MIN_TOKEN_CHARS = 16
_HINT = "generate one with: python -c 'import secrets; print(secrets.token_urlsafe(32))'"


class Role(enum.Enum):
    """What a token allows (see the module docstring)."""

    READ_WRITE = "rw"
    READ_ONLY = "ro"
    REPLICA = "replica"


CALLER_ROLE: contextvars.ContextVar[Role | None] = contextvars.ContextVar(
    "embeddb_caller_role", default=None
)
"""The role of the caller of the call being served (None when tokens are off); set by the
boundary for the duration of each call (gRPC runs every call in a context of its own)."""


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
        replica: tokens of followers: reads plus the update log and snapshots.

    Raises:
        ConfigError: a token is too short or not printable ASCII, a token has two roles, or
            there is no token at all (that would lock every caller out).
    """

    read_write: frozenset[str]
    read_only: frozenset[str]
    replica: frozenset[str] = frozenset()
    _digests: tuple[tuple[bytes, Role], ...] = field(init=False, compare=False, default=())

    def __post_init__(self) -> None:
        for name in _ROLE_FIELDS.values():
            value = getattr(self, name)
            if isinstance(value, str) or not isinstance(value, Iterable):
                raise ConfigError(name, "must be a set of token strings")
            object.__setattr__(self, name, frozenset(value))
            for token in getattr(self, name):
                _check_token(token, name)
        seen: set[str] = set()
        for name in _ROLE_FIELDS.values():
            if seen & getattr(self, name):
                raise ConfigError("tokens", "a token is listed under two roles")
            seen |= getattr(self, name)
        if not seen:
            raise ConfigError("tokens", "no tokens given; every call would be refused")
        digests = tuple(
            (_digest(t), role)
            for role, name in _ROLE_FIELDS.items()
            for t in sorted(getattr(self, name))
        )
        object.__setattr__(self, "_digests", digests)

    def __repr__(self) -> str:
        return (
            f"Tokens(read_write=<{len(self.read_write)}>, read_only=<{len(self.read_only)}>, "
            f"replica=<{len(self.replica)}>)"
        )

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
        """Read a token file: lines ``rw TOKEN``, ``ro TOKEN`` or ``replica TOKEN``; ``#``
        starts a comment. The file must be private (see :func:`check_private_file`).

        Raises:
            ConfigError: the file cannot be read, group or others may access it, or a line is
                malformed (the message names the line number, never the line's content), or
                see :class:`Tokens`.
        """
        p = Path(path)
        check_private_file(p, "token file")
        try:
            text = p.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(str(p), f"cannot read the token file: {exc}") from exc
        found: dict[Role, set[str]] = {role: set() for role in Role}
        for number, line in enumerate(text.splitlines(), start=1):
            where = f"{p}:{number}"
            fields = line.split("#", 1)[0].split()
            if not fields:
                continue
            if len(fields) != 2 or fields[0] not in _ROLE_NAMES:
                raise ConfigError(
                    where,
                    "expected 'rw TOKEN', 'ro TOKEN' or 'replica TOKEN' (the line is not "
                    "shown: it may hold a token)",
                )
            _check_token(fields[1], where)
            found[_ROLE_NAMES[fields[0]]].add(fields[1])
        if not any(found.values()):
            raise ConfigError(str(p), "the token file holds no tokens")
        return cls(**{_ROLE_FIELDS[role]: frozenset(v) for role, v in found.items()})

    @classmethod
    def from_env(cls, prefix: str = "EMBEDDB", environ: Mapping[str, str] | None = None) -> Tokens:
        """Read ``{prefix}_RW_TOKEN``, ``{prefix}_RO_TOKEN`` and ``{prefix}_REPLICA_TOKEN``.

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
        if not any(found.values()):
            raise ConfigError(
                f"{prefix}_RW_TOKEN",
                f"none of {prefix}_RW_TOKEN, {prefix}_RO_TOKEN, {prefix}_REPLICA_TOKEN is set",
            )
        return cls(**{_ROLE_FIELDS[role]: v for role, v in found.items()})


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


@dataclass(frozen=True)
class AccessPolicy:
    """What each role may call: per role, the methods (short names) it may call (None: every
    method), per ``(role, method)`` a check of the decoded request, and per method the reason
    appended to a refusal (``" (it streams every logged row: ...)"``).

    Raises (from the methods):
        PermissionDeniedError: the role may not make this call.
    """

    allowed: Mapping[Role, frozenset[str] | None]
    checks: Mapping[tuple[Role, str], Check] = field(default_factory=dict)
    why: Mapping[str, str] = field(default_factory=dict)

    def authorize(self, role: Role, method: str) -> None:
        """Whether ``role`` may call ``method`` at all (before the request is decoded)."""
        allowed = self.allowed.get(role, frozenset())
        if allowed is not None and method not in allowed:
            raise PermissionDeniedError(
                f"a {_DESCRIBED[role]} token may not call {method}{self.why.get(method, '')}"
            )

    def check_request(self, role: Role, method: str, request: Any) -> None:
        """The request-dependent rule of ``(role, method)``, if any."""
        check = self.checks.get((role, method))
        if check is not None:
            check(request)


_ROLE_FIELDS = {Role.READ_WRITE: "read_write", Role.READ_ONLY: "read_only", Role.REPLICA: "replica"}
_ROLE_NAMES = {role.value: role for role in Role}
_DESCRIBED = {
    Role.READ_WRITE: "read-write (rw)",
    Role.READ_ONLY: "read-only (ro)",
    Role.REPLICA: "replica",
}
