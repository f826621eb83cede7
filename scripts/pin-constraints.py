#!/usr/bin/env python3
"""Write constraints/dev.txt: the exact version of every distribution that
``pip install -e ".[dev,trainer]"`` installs, as installed in this Python now.

CI (``.ci/run``) and the README's test command install with ``-c constraints/dev.txt``, so a
fresh machine gets the tools and libraries CI last passed with, not whatever is newest (a new
ruff or mypy release that flags new things, a new pytest plugin). To move to newer versions:

    pip install --upgrade -e ".[dev,trainer]" "torch==2.13.0"   # or: .ci/newest, to try first
    python scripts/pin-constraints.py                          # rewrites constraints/dev.txt
    bash .ci/run                                               # and commit both if green

The set is the closure of pyproject.toml's runtime dependencies and its ``dev`` and ``trainer``
extras over the installed distributions' own requirements (their markers evaluated here), so
nothing unrelated that happens to be installed is pinned. Versions are written without a local
label (``torch==2.13.0``, which a CPU build ``2.13.0+cpu`` satisfies). ``--check`` compares
instead of writing and exits 1 when the file differs.
"""

from __future__ import annotations

import argparse
import importlib.metadata as metadata
import platform
import sys
from pathlib import Path

import tomllib
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "constraints" / "dev.txt"
EXTRAS = ("dev", "trainer")


def top_level() -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    lines = list(project["dependencies"])
    for extra in EXTRAS:
        lines += project["optional-dependencies"][extra]
    return [Requirement(line) for line in lines]


def applies(req: Requirement, extras: set[str]) -> bool:
    if req.marker is None:
        return True
    env = default_environment()
    return any(req.marker.evaluate({**env, "extra": e}) for e in extras or {""})


def closure() -> dict[str, tuple[str, str]]:
    """Canonical name -> (the distribution's own spelling, its public version)."""
    pinned: dict[str, tuple[str, str]] = {}
    seen: set[tuple[str, frozenset[str]]] = set()
    todo = [(req, set[str]()) for req in top_level()]
    while todo:
        req, parent_extras = todo.pop()
        if not applies(req, parent_extras):
            continue
        key = (canonicalize_name(req.name), frozenset(req.extras))
        if key in seen:
            continue
        seen.add(key)
        try:
            dist = metadata.distribution(req.name)
        except metadata.PackageNotFoundError:
            sys.exit(f"pin-constraints: {req.name} is not installed; install .[dev,trainer] first")
        version = Version(dist.version)
        if version not in req.specifier:
            sys.exit(f"pin-constraints: installed {req.name} {version} is outside {req}")
        pinned[key[0]] = (dist.metadata["Name"], version.public)
        todo += [(Requirement(line), set(req.extras)) for line in dist.requires or []]
    return pinned


def render(pinned: dict[str, tuple[str, str]]) -> str:
    head = [
        "# Exact versions for CI and the README's test command (pip install ... -c",
        "# constraints/dev.txt): the closure of pyproject.toml's dependencies and its dev and",
        "# trainer extras, as last tested. Regenerate: scripts/pin-constraints.py (see there);",
        "# .ci/newest tries the newest versions pyproject.toml allows.",
        f"# Written on CPython {platform.python_version()}, {sys.platform} {platform.machine()}.",
    ]
    lines = [f"{name}=={version}" for _, (name, version) in sorted(pinned.items())]
    return "\n".join(head + lines) + "\n"


def main() -> int:  # Python >= 3.11 (tomllib)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="compare, do not write")
    args = parser.parse_args()
    text = render(closure())
    if args.check:
        old = OUT.read_text() if OUT.exists() else ""
        strip = [line for line in old.splitlines() if not line.startswith("#")]
        if strip != [line for line in text.splitlines() if not line.startswith("#")]:
            print(f"{OUT.relative_to(ROOT)} differs from this environment", file=sys.stderr)
            return 1
        return 0
    OUT.parent.mkdir(exist_ok=True)
    OUT.write_text(text)
    print(f"wrote {OUT.relative_to(ROOT)}: {len(text.splitlines()) - 5} pins")
    return 0


if __name__ == "__main__":
    sys.exit(main())
