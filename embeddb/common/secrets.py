"""Secrets on disk: token files, which only their owner may read.

A bearer token in a file that group or others can read is a leaked token: every reader of a
token file (the servers' ``--tokens-file``, the clients' ``--token-file``,
``--primary-token-file``, a training job's ``token_file``) checks its mode first and refuses
one with any permission bit for group or others, naming ``chmod 600``. The check looks at the
file the path names after following links. A Kubernetes secret volume is not enough on its own
in a pod with ``fsGroup`` (kubelet makes its files group-readable whatever ``defaultMode``
says): ``deploy/k8s`` copies each token into an in-memory volume with ``install -m 0400``. It
is a POSIX check; elsewhere it passes.

A leaf module (errors only), so that the server, the client tools and the trainer can share it.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from embeddb.errors import ConfigError

__all__ = ["check_private_file", "read_token_file"]


def check_private_file(path: Path, what: str) -> None:
    """Refuse a secret file that group or others may access (POSIX permissions only).

    Raises:
        ConfigError: the file's mode grants any permission to group or others; the message
            names the mode and ``chmod 600``.
    """
    if os.name != "posix":
        return
    try:
        mode = os.stat(path).st_mode
    except OSError as exc:
        raise ConfigError(str(path), f"cannot read the {what}: {exc}") from exc
    if mode & 0o077:
        raise ConfigError(
            str(path),
            f"the {what} is accessible by group or others (mode {stat.S_IMODE(mode):04o}); "
            f"it holds secrets: run chmod 600 {path}",
        )


def read_token_file(path: Path) -> str:
    """The bearer token in a caller's token file: the first line holding a token alone, or
    ``ROLE TOKEN`` (so a server's token file works too); ``#`` starts a comment. The file must
    be private (:func:`check_private_file`).

    Raises:
        ConfigError: the file is unreadable, not private, or its first line holds no token
            (the message never shows the line: it may hold a token).
    """
    check_private_file(path, "token file")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(str(path), f"cannot read the token file: {exc}") from exc
    for line in text.splitlines():
        fields = line.split("#", 1)[0].split()
        if len(fields) == 1:
            return fields[0]
        if len(fields) == 2 and fields[0] in ("rw", "ro", "replica"):
            return fields[1]
        if fields:
            break
    raise ConfigError(
        str(path),
        "expected a token alone on its first line, or 'rw TOKEN' / 'ro TOKEN' / "
        "'replica TOKEN' (the line is not shown: it may hold a token)",
    )
