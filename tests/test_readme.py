"""The README's promises: its Python example runs, its quickstart matches .ci/run."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def test_readme_python_example_runs(capsys) -> None:
    blocks = re.findall(r"```python\n(.*?)```", README, flags=re.S)
    assert blocks, "README has no python example"
    for block in blocks:
        exec(compile(block, "README.md", "exec"), {})
    assert "TableStats" in capsys.readouterr().out


def test_quickstart_has_two_commands_and_ci_runs_the_test_one() -> None:
    quickstart = README.split("## Quickstart", 1)[1]
    block = re.search(r"```bash\n(.*?)```", quickstart, flags=re.S).group(1)
    commands = [line.split("#")[0].strip() for line in block.splitlines() if line.strip()]
    assert len(commands) == 2
    assert commands[0].startswith('pip install -e ".[trainer]" && embeddb train ')
    job = commands[0].split("embeddb train ", 1)[1].split()[0]
    assert (ROOT / job).is_file(), f"the quickstart's job file {job} is missing"
    assert commands[1] == 'pip install -e ".[dev,trainer]" && python -m pytest'
    assert commands[1] in (ROOT / ".ci" / "run").read_text()
