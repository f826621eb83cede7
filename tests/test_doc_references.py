"""Every file the documentation or a code comment names exists in the repository.

What counts as a file reference (narrow on purpose: a check that cries wolf gets ignored):

* in Markdown (``README.md``, ``docs/*.md``, every other ``*.md`` of the repository):

  - the target of a link or an image, ``[text](target)``, unless it is a URL: resolved from the
    page's folder, as GitHub renders it. A ``#fragment`` (on a Markdown target, or alone) must
    be the anchor of one of that page's headings;
  - a path that starts at a top-level entry of the repository (``embeddb/engine/shard.py``,
    ``benchmarks/README.md``, ``.ci/run``, ``examples/adult/``), in prose, code spans and
    fenced blocks alike: resolved from the page's folder, then from the root;
  - a bare Markdown file name (``README.md``): from the page's folder, then from the root;

* in the Python of ``embeddb/``, ``benchmarks/``, ``examples/``, ``tests/`` (and the few modules
  of ``docs/``, ``docker/``, ``proto/``, ``.ci/``): the last two kinds, in comments and in
  docstrings (every string statement), resolved from the module's folder, then from the root.

Not references: placeholders (a path with ``<``, ``{``, ``*``, ``$`` or ``...``, or with a
component in capitals such as ``examples/NAME/train.yaml``), a ``:line`` or ``::test`` suffix
(cut off), and paths the repository ignores (``.gitignore``: outputs such as
``benchmarks/results/``). A path under another tree (``../shared/data``) is out of scope.
"""

from __future__ import annotations

import ast
import io
import re
import subprocess
import tokenize
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: Trees whose Python comments and docstrings are checked.
CODE_TREES = ("embeddb", "benchmarks", "examples", "tests", "docs", "docker", "proto", ".ci")
#: Where else a rooted path may start: the include root of the ``.proto`` files (what
#: ``embeddb proto-path`` prints), from which protoc, buf and the files' imports name them.
EXTRA_ROOTS = ("embeddb/proto",)
#: Never part of the repository, whatever the working copy holds (used without git only).
_NOT_REPOSITORY = {".git", ".venv", "build", "dist", "node_modules", "__pycache__"}
_GENERATED = ("_pb2.py", "_pb2_grpc.py", "_pb2.pyi")
#: File names written in capitals by convention; any other name in capitals is a placeholder.
_CAPITAL_NAMES = {"README", "LICENSE", "NOTICE", "SOURCE", "CHANGELOG", "CONTRIBUTING",
                  "SECURITY", "AUTHORS"}  # fmt: skip


@dataclass(frozen=True)
class Reference:
    """One file named by a page or a module."""

    source: Path  # the file that names it (absolute)
    line: int
    target: str  # the path as written, its suffix cut off ("" for an anchor alone)
    fragment: str | None = None  # a link's #fragment
    link: bool = False  # a Markdown link: resolved from the source's folder only


# ------------------------------------------------------------------------------ the repository


@cache
def repository_files(root: Path) -> frozenset[str]:
    """The repository's files (tracked, or new and not ignored), relative to ``root``."""
    try:
        listed = subprocess.run(
            ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
            cwd=root,
            capture_output=True,
            check=True,
        ).stdout.decode()
        names = [name for name in listed.split("\0") if name]
    except (OSError, subprocess.CalledProcessError):  # not a git checkout (an unpacked sdist)
        names = [
            p.relative_to(root).as_posix()
            for p in root.rglob("*")
            if p.is_file() and not _NOT_REPOSITORY & set(p.relative_to(root).parts)
        ]
    return frozenset(name for name in names if (root / name).exists())  # deleted, not committed


@cache
def _entries(root: Path) -> frozenset[str]:
    """Every file and folder of the repository, links resolved, relative to ``root``."""
    base = root.resolve()
    entries: set[str] = set()
    for name in repository_files(root):
        real = (root / name).resolve()
        if real.is_relative_to(base):
            parts = real.relative_to(base).parts
            entries.update("/".join(parts[:i]) for i in range(1, len(parts) + 1))
    return frozenset(entries)


@cache
def _rooted_pattern(root: Path) -> re.Pattern[str]:
    """Paths that start at a top-level entry of the repository (``embeddb/engine/shard.py``)."""
    tops = {name.split("/")[0] for name in repository_files(root)}
    names = "|".join(sorted(map(re.escape, tops), key=len, reverse=True))
    return re.compile(rf"(?<![\w./~$-])((?:{names})/(?:[\w.@+][\w./@+-]*)?)")


def _ignored(path: str, root: Path) -> bool:
    """Whether git ignores ``path``, as a file or as a folder (``benchmarks/results/``)."""
    try:
        done = subprocess.run(
            ["git", "check-ignore", "--no-index", "--stdin"],
            cwd=root,
            input=f"{path}\n{path}/\n",
            capture_output=True,
            text=True,
        )
    except OSError:
        return False
    return done.returncode == 0


def in_repository(path: Path, root: Path) -> bool:
    """Whether ``path`` (absolute) is a file or folder of the repository at ``root``, or a path
    the repository ignores (an output)."""
    real, base = path.resolve(), root.resolve()
    if not real.is_relative_to(base):
        return False
    rel = real.relative_to(base).as_posix()
    return rel in _entries(root) or _ignored(rel, root)


# ------------------------------------------------------------------------------ extraction

#: ``[text](target)`` and ``![alt](target)``; a target has no spaces (an optional title after).
_LINK = re.compile(r"\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")
#: A bare Markdown name, not part of a longer path (``README.md``).
_BARE_MD = re.compile(r"(?<![\w./-])([\w-]+\.md)(?![\w/])")
_PLACEHOLDER = re.compile(r"[<>{}*$]|\.\.\.|…")


def _clean(raw: str, rooted: bool) -> str | None:
    """``raw`` without its ``:line`` / ``::test`` suffix and trailing punctuation, or None for
    a placeholder."""
    if _PLACEHOLDER.search(raw):
        return None
    path = re.sub(r":\d+(?:[-:]\d+)?$", "", raw.split("::")[0]).rstrip(".,;:)'\"")
    stems = [part.split(".")[0] for part in path.split("/") if part]
    if rooted and any(s.isupper() and len(s) > 1 and s not in _CAPITAL_NAMES for s in stems):
        return None  # NAME, DIR, RUN
    return path or None


def _in_text(source: Path, first_line: int, text: str, root: Path) -> Iterator[Reference]:
    """Rooted paths and bare Markdown names in prose, code or a comment."""
    rooted = _rooted_pattern(root)
    for line, body in enumerate(text.splitlines(), start=first_line):
        found = [(m.group(1), True) for m in rooted.finditer(body)]
        found += [(m.group(1), False) for m in _BARE_MD.finditer(body)]
        for raw, is_rooted in found:
            target = _clean(raw, is_rooted)
            if target is not None:
                yield Reference(source, line, target)


def markdown_references(source: Path, text: str, root: Path) -> Iterator[Reference]:
    """The file references of one Markdown page."""
    for line, body in enumerate(text.splitlines(), start=1):
        for match in _LINK.finditer(body):
            if not _SCHEME.match(match.group(1)):
                path, _, fragment = match.group(1).partition("#")
                yield Reference(source, line, path, fragment or None, link=True)
    yield from _in_text(source, 1, _LINK.sub("]()", text), root)


def python_references(source: Path, text: str, root: Path) -> Iterator[Reference]:
    """The file references of one module's comments and docstrings (string statements)."""
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        if token.type == tokenize.COMMENT:
            yield from _in_text(source, token.start[0], token.string, root)
    for node in ast.walk(ast.parse(text)):
        string = node.value if isinstance(node, ast.Expr) else None
        if isinstance(string, ast.Constant) and isinstance(string.value, str):
            yield from _in_text(source, node.lineno, string.value, root)


def references(path: Path, root: Path = ROOT) -> list[Reference]:
    """The file references of a Markdown page or a Python module."""
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".md":
        return list(markdown_references(path, text, root))
    return list(python_references(path, text, root))


# ------------------------------------------------------------------------------ resolution

_HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$")


def heading_anchors(text: str) -> set[str]:
    """The anchors GitHub gives a page's headings (``## 5. Durability`` → ``5-durability``)."""
    anchors: set[str] = set()
    seen: dict[str, int] = {}
    fenced = False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        match = None if fenced else _HEADING.match(line)
        if match is None:
            continue
        title = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", match.group(1))  # a link's text only
        slug = re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        anchors.add(slug if count == 0 else f"{slug}-{count}")
    return anchors


def problem(ref: Reference, root: Path = ROOT) -> str | None:
    """Why ``ref`` does not resolve, or None when it does."""
    found = ref.source  # an anchor alone: this page
    if ref.target:
        bases = [ref.source.parent]
        if not ref.link:
            bases += [root, *(root / extra for extra in EXTRA_ROOTS)]
        match = next((b / ref.target for b in bases if in_repository(b / ref.target, root)), None)
        if match is None:
            return "no such file in the repository"
        found = match
    if ref.fragment is None or found.suffix != ".md" or not found.is_file():
        return None
    if ref.fragment not in heading_anchors(found.read_text(encoding="utf-8")):
        return f"{found.name} has no heading with the anchor #{ref.fragment}"
    return None


def unresolved(paths: Iterable[Path], root: Path = ROOT) -> list[str]:
    """``file:line: target: why`` of every reference in ``paths`` that does not resolve."""
    out = []
    for path in paths:
        for ref in references(path, root):
            why = problem(ref, root)
            if why is not None:
                anchor = f"#{ref.fragment}" if ref.fragment else ""
                where = ref.source.relative_to(root).as_posix()
                out.append(f"{where}:{ref.line}: {ref.target}{anchor}: {why}")
    return out


# ------------------------------------------------------------------------------ the files


def markdown_pages(root: Path = ROOT) -> list[Path]:
    return sorted(root / name for name in repository_files(root) if name.endswith(".md"))


def code_modules(root: Path = ROOT) -> list[Path]:
    return sorted(
        root / name
        for name in repository_files(root)
        if name.endswith(".py") and name.split("/")[0] in CODE_TREES
        if not name.endswith(_GENERATED)
    )


# ------------------------------------------------------------------------------ tests


@pytest.mark.slow
def test_the_pages_and_modules_are_found() -> None:
    pages = {p.relative_to(ROOT).as_posix() for p in markdown_pages()}
    assert {"README.md", "docs/architecture.md", "benchmarks/README.md"} <= pages
    modules = {p.relative_to(ROOT).as_posix() for p in code_modules()}
    assert {"embeddb/engine/shard.py", "benchmarks/train.py", "tests/support.py"} <= modules
    assert "examples/clicks/make_data.py" in modules
    assert not any(m.endswith(_GENERATED) for m in modules)


@pytest.mark.slow
def test_every_file_the_docs_name_exists() -> None:
    missing = unresolved(markdown_pages())
    assert not missing, "the docs name files that do not exist:\n" + "\n".join(missing)


@pytest.mark.slow
def test_every_file_the_code_comments_name_exists() -> None:
    missing = unresolved(code_modules())
    assert not missing, "comments and docstrings name files that do not exist:\n" + "\n".join(
        missing
    )


# ------------------------------------------------------------------------------ the check itself


def _repository(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "repo"
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text, encoding="utf-8")
    subprocess.run(["git", "init", "-q", str(root)], check=False, capture_output=True)
    return root


PLANTED_PAGE = """# Guide

## Set up

Read [the reference](reference.md), [its options](reference.md#options) and
[this section](#set-up); `pkg/mod.py` and `pkg/mod.py:3` exist, as do `README.md` and
[the package](../pkg/). Not references: https://example.com/pkg/x.md, `DATA_DIR/log.json`,
`pkg/NAME.yaml`, `pkg/{index}/`, `pkg/*.py`, `pkg/out/run.csv` (ignored), a pkg/-relative path.

Planted: [gone](gone.md), [a bad anchor](reference.md#no-such-heading), [here](#nowhere),
`pkg/missing.py`, see ARCHITECTURE.md.

```bash
python pkg/mod.py --out pkg/absent.txt
```
"""
PLANTED_MODULE = '''"""A module citing STYLE.md §5 and README.md (which exists)."""

# see docs/guide.md and docs/gone.md
x = "pkg/not_a_comment.py"  # a string that is not a docstring is not checked
'''


@pytest.mark.slow
def test_planted_bad_references_are_caught_and_good_ones_pass(tmp_path: Path) -> None:
    root = _repository(
        tmp_path,
        {
            "README.md": "# Repo\n",
            ".gitignore": "pkg/out/\n",
            "docs/guide.md": PLANTED_PAGE,
            "docs/reference.md": "# Reference\n\n## Options\n",
            "pkg/mod.py": PLANTED_MODULE,
        },
    )
    page = unresolved([root / "docs" / "guide.md"], root)
    assert sorted(page) == sorted(
        [
            "docs/guide.md:10: gone.md: no such file in the repository",
            "docs/guide.md:10: reference.md#no-such-heading: reference.md has no heading "
            "with the anchor #no-such-heading",
            "docs/guide.md:10: #nowhere: guide.md has no heading with the anchor #nowhere",
            "docs/guide.md:11: pkg/missing.py: no such file in the repository",
            "docs/guide.md:11: ARCHITECTURE.md: no such file in the repository",
            "docs/guide.md:14: pkg/absent.txt: no such file in the repository",
        ]
    ), page
    module = unresolved([root / "pkg" / "mod.py"], root)
    assert sorted(module) == [
        "pkg/mod.py:1: STYLE.md: no such file in the repository",
        "pkg/mod.py:3: docs/gone.md: no such file in the repository",
    ], module


@pytest.mark.slow
def test_the_real_check_would_catch_a_planted_citation() -> None:
    """The repository's own files, with one bad citation added to a real module's docstring."""
    source = ROOT / "embeddb" / "engine" / "shard.py"
    planted = '"""See docs/no-such-page.md §5."""\n' + source.read_text(encoding="utf-8")
    found = [ref.target for ref in python_references(source, planted, ROOT)]
    assert "docs/no-such-page.md" in found
    bad = [r for r in python_references(source, planted, ROOT) if problem(r) is not None]
    assert [r.target for r in bad if r.line == 1] == ["docs/no-such-page.md"]


def test_heading_anchors_follow_github() -> None:
    text = "# A `code` Title\n## 5. Durability\n## Who may call what\n## Who may call what\n"
    text += "```\n# not a heading\n```\n"
    assert heading_anchors(text) == {
        "a-code-title",
        "5-durability",
        "who-may-call-what",
        "who-may-call-what-1",
    }
