"""Design rules of ARCHITECTURE.md §2, checked: imports point inward, grpc/torch stay out."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CORE = ["embeddb/shard.py", "embeddb/durability", "embeddb/storage", "embeddb/optim",
        "embeddb/config", "embeddb/routing.py", "embeddb/errors.py",
        "embeddb/initializers.py"]  # fmt: skip
CLIENT_MAY_IMPORT = {
    "embeddb.allocator",
    "embeddb.arrays",
    "embeddb.errors",
    "embeddb.routing",
    "embeddb.client",
    "embeddb.wire",
    "embeddb.v1",
}


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def _python_files(*parts: str) -> list[Path]:
    files: list[Path] = []
    for part in parts:
        p = ROOT / part
        files.extend(sorted(p.rglob("*.py")) if p.is_dir() else [p])
    return files


def test_import_linter_contracts_hold() -> None:
    exe = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    if exe is None:
        pytest.skip("import-linter (the dev extra) is not installed")
    proc = subprocess.run([exe], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "broken" in proc.stdout and "0 broken" in proc.stdout


@pytest.mark.parametrize("path", _python_files(*CORE), ids=lambda p: str(p.relative_to(ROOT)))
def test_core_imports_neither_grpc_nor_torch(path: Path) -> None:
    bad = {m for m in _imports(path) if m.split(".")[0] in {"grpc", "torch"}}
    assert not bad, f"{path} imports {bad}"


def test_only_the_trainer_imports_torch() -> None:
    offenders = [
        str(p.relative_to(ROOT))
        for p in _python_files("embeddb")
        if "trainer" not in p.relative_to(ROOT).parts
        and any(m.split(".")[0] == "torch" for m in _imports(p))
    ]
    assert not offenders


def test_client_depends_only_on_stubs_types_errors_routing() -> None:
    for path in _python_files("embeddb/client"):
        for module in _imports(path):
            if module.startswith("embeddb"):
                assert any(module == m or module.startswith(m + ".") for m in CLIENT_MAY_IMPORT), (
                    f"{path} imports {module}"
                )
