"""Generate the bearer tokens of a deployment (run it once, before the first start).

    python docker/make_secrets.py                                    # Compose
    python docker/make_secrets.py --out deploy/k8s/secrets/tokens.env  # Kubernetes

Writes one env file, private to its owner (mode 0600, in a 0700 directory), holding a fresh
random token (``secrets.token_urlsafe(32)``) per role::

    EMBEDDB_RW_TOKEN=...        rw: the training job (training lookups, pushes, snapshots)
    EMBEDDB_RO_TOKEN=...        ro: the model server's reads of the followers, and its callers
    EMBEDDB_REPLICA_TOKEN=...   replica: the followers' Subscribe / FetchSnapshot on their primary

Compose reads it with ``--env-file docker/secrets/tokens.env`` (the default output here);
kustomize turns ``deploy/k8s/secrets/tokens.env`` into the Secret ``embeddb-tokens``
(``secretGenerator`` in ``deploy/k8s/kustomization.yaml``). Both folders are git-ignored: the
tokens are never committed. Give each deployment its own file. An existing file is kept unless
``--force`` is given, which rotates every token: restart every service afterwards.

The tokens are never printed. Standard library only.
"""

from __future__ import annotations

import argparse
import os
import secrets
import sys
from pathlib import Path

__all__ = ["ROLES", "main", "make_tokens", "write_private"]

DEFAULT_OUT = Path(__file__).resolve().parent / "secrets" / "tokens.env"
ROLES = ("rw", "ro", "replica")
"""The roles of ``embeddb.transport.rpc.auth.Role``, in the order written."""


def variable(role: str) -> str:
    """The environment variable of ``role``'s token (what ``--tokens-from-env`` reads)."""
    return f"EMBEDDB_{role.upper()}_TOKEN"


def make_tokens() -> dict[str, str]:
    """A fresh, distinct random token per role, keyed by its environment variable."""
    tokens: dict[str, str] = {}
    while len(set(tokens.values())) < len(ROLES):  # a token may have one role only
        tokens = {variable(role): secrets.token_urlsafe(32) for role in ROLES}
    return tokens


def write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` with mode 0600 (its directory made 0700 if created), through
    a temporary file renamed into place, so no reader ever sees a partial or public file."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    """Write the tokens file; returns the exit status (1: it exists and ``--force`` is absent)."""
    parser = argparse.ArgumentParser(
        prog="python docker/make_secrets.py", description=(__doc__ or "").split("\n\n")[0]
    )
    parser.add_argument(
        "--out", type=Path, default=DEFAULT_OUT, help=f"the env file (default {DEFAULT_OUT})"
    )
    parser.add_argument(
        "--force", action="store_true", help="replace an existing file (rotates every token)"
    )
    args = parser.parse_args(argv)
    out: Path = args.out
    if out.exists() and not args.force:
        print(f"{out} exists; keeping it (--force rotates every token)", file=sys.stderr)
        return 1
    lines = [
        "# Bearer tokens of an embeddb deployment, written by docker/make_secrets.py.",
        "# Secret: never commit this file, never make it readable by group or others.",
        *(f"{name}={token}" for name, token in make_tokens().items()),
    ]
    write_private(out, "\n".join(lines) + "\n")
    print(f"wrote {out} (mode 0600): {', '.join(variable(role) for role in ROLES)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
