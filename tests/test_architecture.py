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

#: What the client may import of embeddb (besides itself): the vocabulary and the wire side.
CLIENT_MAY_IMPORT = {"common", "errors", "transport", "v1"}
#: The packages that may import torch.
TORCH_USERS = {"trainer", "serving"}
#: One planted violation per contract id: (module written into the copy, its source).
PLANTED = {
    "layers": ("embeddb/common/_planted_layers.py", "import embeddb.config\n"),
    "engine": ("embeddb/engine/storage/_planted_engine.py", "import embeddb.transport.wire\n"),
    "transport": ("embeddb/transport/_planted_transport.py", "import embeddb.engine.storage\n"),
    "client": ("embeddb/client/_planted_client.py", "import embeddb.transport.rpc.auth\n"),
    "features": ("embeddb/features/_planted_features.py", "import embeddb.client\n"),
    "trainer": ("embeddb/trainer/_planted_trainer.py", "import embeddb.engine.shard\n"),
    "torch": ("embeddb/server/_planted_torch.py", "import torch\n"),
    "cli": ("embeddb/engine/durability/_planted_cli.py", "import embeddb.cli\n"),
    "engine-layers": (
        "embeddb/engine/optim/_planted_engine_layers.py",
        "import embeddb.engine.storage\n",
    ),
    "trainer-layers": (
        "embeddb/trainer/embedding/_planted_trainer_layers.py",
        "import embeddb.trainer.ctx\n",
    ),
}


def _contracts() -> dict[str, dict[str, Any]]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    return {c["id"]: c for c in config["contracts"]}


def _children(package: Path) -> set[str]:
    """Every module or package directly under ``package`` (its own __init__ excluded)."""
    names = {p.stem for p in package.glob("*.py") if p.name != "__init__.py"}
    return names | {p.name for p in package.iterdir() if (p / "__init__.py").is_file()}


def _top_level_modules() -> set[str]:
    """Every module or package directly under embeddb/ (the root package itself excluded)."""
    return {f"embeddb.{name}" for name in _children(PACKAGE)}


def _layer_names(contract: dict[str, Any]) -> set[str]:
    return {m.strip() for layer in contract["layers"] for m in layer.replace(":", "|").split("|")}


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
    assert _layer_names(contracts["layers"]) == everything
    client = contracts["client"]
    assert client["source_modules"] == ["embeddb.client"]
    may = {f"embeddb.{m}" for m in CLIENT_MAY_IMPORT | {"client", "__main__"}}
    assert set(client["forbidden_modules"]) == everything - may | {"embeddb.transport.rpc", "torch"}
    assert {"grpc", "embeddb.transport", "embeddb.v1", "embeddb.client"} <= set(
        contracts["engine"]["forbidden_modules"]
    )
    assert {"embeddb.engine", "embeddb.config"} <= set(contracts["transport"]["forbidden_modules"])
    assert "embeddb.engine" in contracts["trainer"]["forbidden_modules"]
    assert set(contracts["cli"]["source_modules"]) == everything - {
        "embeddb.cli",
        "embeddb.__main__",  # `python -m embeddb`: the CLI's entry point
    }
    assert set(contracts["torch"]["source_modules"]) == everything - {
        f"embeddb.{m}" for m in TORCH_USERS
    }


@pytest.mark.parametrize("container", ["engine", "trainer"])
def test_inner_layers_cover_their_package(container: str) -> None:
    """A new module of the engine or of training must be placed in its package's layers."""
    contract = _contracts()[f"{container}-layers"]
    assert contract["containers"] == [f"embeddb.{container}"]
    assert _layer_names(contract) == _children(PACKAGE / container)


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
