"""Design rules of docs/architecture.md §2, checked: imports point inward, grpc/torch stay out.

import-linter (the contracts in pyproject.toml) checks the imports themselves. This file checks
what it cannot: that the contracts hold in the real tree, that they cover every top-level module
(a new module must be placed), that each contract can fail (violations planted in a copy of the
tree), and that imports hidden from its graph (lazy tables, ``importlib``) obey the same rules.
"""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import tomllib

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "embeddb"

#: The top-level modules outside the core (docs/architecture.md §2): transports, the SDKs, the CLI.
NOT_CORE = {"__main__", "cli", "demo", "client", "trainer", "server", "rpc", "wire", "v1"}
#: What the client may import: the stubs, the wire format and the core's leaf modules.
CLIENT_MAY_IMPORT = {
    "client",
    "wire",
    "v1",
    "routing",
    "_routing_kernel",
    "splitmix",
    "errors",
    "arrays",
    "allocator",
}
#: One planted violation per contract id: (module written into the copy, its source).
PLANTED = {
    "client": ("embeddb/client/_planted_client.py", "import embeddb.storage\n"),
    "trainer": ("embeddb/trainer/_planted_trainer.py", "import embeddb.server.app\n"),
    "core": ("embeddb/storage/_planted_core.py", "import embeddb.client\n"),
    "cli": ("embeddb/durability/_planted_cli.py", "import embeddb.cli\n"),
    "torch": ("embeddb/server/_planted_torch.py", "import torch\n"),
    "layers": ("embeddb/optim/_planted_layers.py", "import embeddb.storage\n"),
}


def _contracts() -> dict[str, dict[str, Any]]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    return {c["id"]: c for c in config["contracts"]}


def _top_level_modules() -> set[str]:
    """Every module or package directly under embeddb/ (the root package itself excluded)."""
    names = {p.stem for p in PACKAGE.glob("*.py") if p.name != "__init__.py"}
    names |= {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()}
    return {f"embeddb.{name}" for name in names}


def _lint_imports() -> str:
    exe = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    if exe is None:
        pytest.skip("import-linter (the dev extra) is not installed")
    return exe


def _run_lint_imports(cwd: Path) -> subprocess.CompletedProcess[str]:
    """``lint-imports`` on the tree at ``cwd`` (its pyproject.toml, its embeddb package)."""
    env = {**os.environ, "PYTHONPATH": str(cwd), "COLUMNS": "200", "NO_COLOR": "1"}
    return subprocess.run(
        [_lint_imports(), "--no-cache", "--no-logo"],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.slow
def test_import_linter_contracts_hold() -> None:
    proc = _run_lint_imports(ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"{len(_contracts())} kept, 0 broken" in proc.stdout


def test_contracts_cover_every_top_level_module() -> None:
    everything = _top_level_modules()
    contracts = _contracts()
    assert set(contracts) == set(PLANTED)
    client = contracts["client"]
    assert client["source_modules"] == ["embeddb.client"]
    assert set(client["forbidden_modules"]) == everything - {
        f"embeddb.{m}" for m in CLIENT_MAY_IMPORT
    }
    assert contracts["trainer"]["source_modules"] == ["embeddb.trainer"]
    assert "embeddb.server" in contracts["trainer"]["forbidden_modules"]
    core = everything - {f"embeddb.{m}" for m in NOT_CORE}
    assert set(contracts["core"]["source_modules"]) == core
    assert {"embeddb.client", "embeddb.trainer", "grpc"} <= set(
        contracts["core"]["forbidden_modules"]
    )
    assert set(contracts["cli"]["source_modules"]) == everything - {
        "embeddb.cli",
        "embeddb.__main__",  # `python -m embeddb`: the CLI's entry point
    }
    assert set(contracts["torch"]["source_modules"]) == everything - {"embeddb.trainer"}
    layers = {
        m.strip()
        for layer in contracts["layers"]["layers"]
        for m in layer.replace(":", "|").split("|")
    }
    assert layers == everything


def test_contract_sources_are_in_the_graph() -> None:
    """Every module a contract governs exists in import-linter's graph, and the SDKs are full."""
    grimp = pytest.importorskip("grimp")
    graph = grimp.build_graph("embeddb", include_external_packages=True)
    modules = set(graph.modules)
    for contract in _contracts().values():
        for source in contract.get("source_modules", []):
            assert source in modules, f"{contract['name']}: {source} is not in the graph"
    assert len(graph.find_descendants("embeddb.client")) >= 10
    assert len(graph.find_descendants("embeddb.trainer")) >= 30
    assert "torch" in modules and "grpc" in modules


@pytest.mark.slow
def test_every_contract_fails_on_a_planted_violation(tmp_path: Path) -> None:
    _lint_imports()
    copy = tmp_path / "tree"
    shutil.copytree(PACKAGE, copy / "embeddb", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", copy / "pyproject.toml")
    for path, source in PLANTED.values():
        (copy / path).write_text(source)
    proc = _run_lint_imports(copy)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    contracts = _contracts()
    assert f"{len(contracts)} broken" in out, out
    report = out[out.index("Broken contracts") :]
    headers = {
        cid: report.find(f"{c['name']}\n{'-' * len(c['name'])}") for cid, c in contracts.items()
    }
    starts = sorted(headers.values())
    for cid, (path, _) in PLANTED.items():
        start = headers[cid]
        assert start >= 0, f"contract {cid!r} is not reported broken:\n{out}"
        end = next((s for s in starts if s > start), len(report))
        planted = path.removesuffix(".py").replace("/", ".")
        assert planted in report[start:end], f"contract {cid!r} missed {planted}:\n{out}"


# ---------------------------------------------------------------- imports import-linter cannot see
def _python_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*.py") if "v1" not in p.relative_to(PACKAGE).parts)


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _resolve(module: str, level: int, package: str) -> str:
    if not level:
        return module
    base = package.split(".")
    base = base[: len(base) - level + 1]
    return ".".join([*base, module] if module else base)


def _is_type_checking(node: ast.If) -> bool:
    return isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"


@pytest.mark.parametrize("path", _python_files(PACKAGE), ids=lambda p: str(p.relative_to(ROOT)))
def test_lazy_and_dynamic_imports_are_visible_or_allowed(path: Path) -> None:
    """A ``_LAZY`` table (names loaded through ``importlib``) is mirrored by ``TYPE_CHECKING``
    imports, so the graph sees it; literal ``importlib.import_module`` targets never name torch
    outside the trainer."""
    tree = ast.parse(path.read_text(), filename=str(path))
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    seen: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.If) and _is_type_checking(node):
            seen |= {
                _resolve(imp.module or "", imp.level, package)
                for imp in ast.walk(node)
                if isinstance(imp, ast.ImportFrom)
            }
    for node in tree.body:
        if (
            isinstance(node, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == "_LAZY" for t in node.targets)
            and isinstance(node.value, ast.Dict)
        ):
            lazy = {
                _resolve(v.value.lstrip("."), len(v.value) - len(v.value.lstrip(".")), package)
                for v in node.value.values
                if isinstance(v, ast.Constant) and isinstance(v.value, str)
            }
            assert lazy <= seen, f"{path}: lazy targets {lazy - seen} lack a TYPE_CHECKING import"
    if name.startswith("embeddb.trainer"):
        return
    for call in ast.walk(tree):
        if (
            isinstance(call, ast.Call)
            and isinstance(call.func, ast.Attribute | ast.Name)
            and getattr(call.func, "attr", getattr(call.func, "id", ""))
            in {"import_module", "__import__"}
            and call.args
            and isinstance(call.args[0], ast.Constant)
        ):
            assert str(call.args[0].value).split(".")[0] != "torch", f"{path} loads torch"
