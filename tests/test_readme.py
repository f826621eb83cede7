"""The README's promises, checked: its quickstart (two commands, the second one CI's), its
Python example, every ``embeddb`` command it shows, the name it installs, the torch it pins,
the pages it links and the figures it quotes. (Every file it names is checked by
tests/test_doc_references.py.)"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import tomllib
from packaging.requirements import Requirement
from packaging.version import Version

from tests.test_docs import (  # noqa: F401
    _commands,
    _words,
    check_parses,
    paths_need_not_exist,
)

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
#: A README a stranger reads in five minutes; internals belong in docs/.
MAX_LINES = 200


def _quickstart() -> list[str]:
    """The quickstart's command lines, comments cut."""
    section = README.split("## Quickstart", 1)[1]
    block = re.search(r"```bash\n(.*?)```", section, flags=re.S)
    assert block is not None, "the Quickstart has no bash block"
    return [line.split(" #")[0].strip() for line in block.group(1).splitlines() if line.strip()]


def _steps(command: str) -> list[list[str]]:
    return [shlex.split(step) for step in command.split("&&")]


def test_readme_is_short() -> None:
    lines = len(README.splitlines())
    assert lines <= MAX_LINES, f"README.md has {lines} lines; move details to docs/"


def test_readme_python_example_runs(capsys: pytest.CaptureFixture[str]) -> None:
    blocks = re.findall(r"```python\n(.*?)```", README, flags=re.S)
    assert blocks, "README has no python example"
    for block in blocks:
        namespace: dict[str, object] = {}
        exec(compile(block, "README.md", "exec"), namespace)
    printed = capsys.readouterr().out
    assert printed.count("[") >= 4, printed  # the (3, 8) evaluation lookup it prints
    assert namespace["vectors"].shape == (3, 8)  # type: ignore[attr-defined]


def test_quickstart_has_two_commands_and_ci_runs_the_test_one() -> None:
    commands = _quickstart()
    assert len(commands) == 2, commands
    torch, install, train = _steps(commands[0])
    assert torch[:3] == ["pip", "install", next(w for w in torch if w.startswith("torch=="))]
    assert "--index-url" in torch and torch[torch.index("--index-url") + 1].endswith("/whl/cpu")
    assert install == ["pip", "install", ".[trainer]"]
    assert train[:2] == ["embeddb", "train"]
    job = train[2]
    assert (ROOT / job).is_file(), f"the quickstart's job file {job} is missing"
    assert commands[1] == (
        'pip install -e ".[dev,trainer]" -c constraints/dev.txt && python -m pytest'
    )
    assert commands[1] in (ROOT / ".ci" / "run").read_text(encoding="utf-8")


def test_quickstart_extras_and_constraints_exist() -> None:
    extras = set(PROJECT["optional-dependencies"])
    for command in _quickstart():
        for words in _steps(command):
            for before, word in zip(["", *words], words, strict=False):
                match = re.fullmatch(r"\.\[([a-z,]+)\]", word)
                if match:
                    assert set(match.group(1).split(",")) <= extras, word
                if before == "-c":
                    assert (ROOT / word).is_file(), f"{word} is missing"


def test_quickstart_torch_is_inside_the_trainer_range() -> None:
    pinned = re.search(r"torch==([0-9][^\s]*)", _quickstart()[0])
    assert pinned is not None
    version = Version(pinned.group(1))
    (torch,) = [
        Requirement(r) for r in PROJECT["optional-dependencies"]["trainer"] if r.startswith("torch")
    ]
    assert torch.name == "torch"
    assert version in torch.specifier, f"torch {version} is outside the trainer extra {torch}"
    constraints = (ROOT / "constraints" / "dev.txt").read_text(encoding="utf-8")
    ci = re.search(r"^torch==(\S+)", constraints, flags=re.M)
    assert ci is not None and Version(ci.group(1)) == version, "CI tests another torch"


def _installs(text: str) -> list[str]:
    """What each ``pip install`` of ``text`` names besides options and their values."""
    names = []
    for line in re.findall(r"pip install ([^`\n&|;#]+)", text):
        words = shlex.split(line)
        skip = False
        for word in words:
            if skip:
                skip = False
            elif word in {"-c", "--index-url", "-r", "--constraint"}:
                skip = True
            elif not word.startswith("-"):
                names.append(word)
    return names


def test_readme_installs_only_this_project() -> None:
    """No ``pip install embeddb`` (someone else's project): a path of this checkout, torch,
    or the distribution name of pyproject.toml."""
    name = PROJECT["name"]
    stated = re.search(r"distribution is `([^`]+)`", README)
    assert stated is not None and stated.group(1) == name, "the README names another distribution"
    for target in _installs(README):
        if target.startswith(".") or target.startswith("torch"):
            continue
        assert Requirement(target).name == name, f"the README installs {target!r}"


def test_the_install_check_reads_pip_lines() -> None:
    text = 'x `pip install torch==2 --index-url U && pip install ".[a]"` and pip install embeddb'
    assert _installs(text) == ["torch==2", ".[a]", "embeddb"]


def test_readme_claims_of_the_package() -> None:
    assert "Python ≥ 3.10" in README and PROJECT["requires-python"] == ">=3.10"
    licence = PROJECT["license"]
    assert "Apache-2.0" in README and str(licence).startswith("Apache-2.0")


@pytest.mark.parametrize(("line", "complete"), _commands(README))
@pytest.mark.usefixtures("paths_need_not_exist")
def test_every_command_in_the_readme_parses(line: str, complete: bool) -> None:
    check_parses("README.md", line, complete)


def test_readme_shows_the_user_paths_commands() -> None:
    shown = {_words(line)[1] for line, complete in _commands(README) if complete}
    assert {"train", "serve", "cluster", "serve-model"} <= shown


def _links(page: Path) -> set[Path]:
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text(encoding="utf-8"))
    return {(page.parent / t).resolve() for t in targets if not re.match(r"^[a-z]+:", t)}


def test_every_docs_page_is_reachable_from_the_readme() -> None:
    seen: set[Path] = set()
    todo = [ROOT / "README.md"]
    while todo:
        page = todo.pop()
        for target in _links(page) - seen:
            seen.add(target)
            if target.suffix == ".md" and target.is_file():
                todo.append(target)
    orphans = sorted(p.name for p in (ROOT / "docs").glob("*.md") if p.resolve() not in seen)
    assert not orphans, f"docs pages no link leads to from README.md: {orphans}"


def test_readme_figures_are_detailed_in_the_performance_page() -> None:
    """Every throughput figure the README quotes (``31.3k``) is on docs/performance.md, where
    its method and reproduction are."""
    performance = (ROOT / "docs" / "performance.md").read_text(encoding="utf-8")
    figures = set(re.findall(r"\b\d+(?:\.\d+)?k\b", README))
    assert {"31.3k", "20.8k", "77.9k"} <= figures
    missing = sorted(f for f in figures if f not in performance)
    assert not missing, f"README figures not on docs/performance.md: {missing}"
