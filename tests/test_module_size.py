"""The small-modules rule: no hand-written Python module of the project is over 600 lines.

Generated code (the protobuf and gRPC modules under ``embeddb/v1``) is exempt. A module that
grows past the limit is split by what its parts do (a benchmark's phases, a test file's
subjects), sharing helpers instead of copying them.
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAX_LINES = 600
#: Where the project's hand-written Python lives.
TREES = ("embeddb", "benchmarks", "tests", "examples", "docs", "docker", "proto", ".ci")
GENERATED = ("_pb2.py", "_pb2_grpc.py", "_pb2.pyi")


def hand_written_modules(root: Path) -> list[Path]:
    """Every ``*.py`` under the project's trees of ``root``, generated modules left out."""
    found: list[Path] = []
    for tree in TREES:
        for path in sorted((root / tree).rglob("*.py")):
            if path.name.endswith(GENERATED) or "__pycache__" in path.parts:
                continue
            found.append(path)
    return found


def too_long(paths: list[Path], root: Path = ROOT, limit: int = MAX_LINES) -> dict[str, int]:
    """``{path relative to root: lines}`` of the modules over ``limit`` lines."""
    over: dict[str, int] = {}
    for path in paths:
        lines = len(path.read_text(encoding="utf-8").splitlines())
        if lines > limit:
            over[str(path.relative_to(root))] = lines
    return over


def test_the_rule_sees_the_package_benchmarks_and_tests() -> None:
    found = {str(p.relative_to(ROOT)) for p in hand_written_modules(ROOT)}

    assert "embeddb/engine/shard.py" in found
    assert "benchmarks/train.py" in found
    assert "tests/test_module_size.py" in found
    assert not any(name.endswith("_pb2.py") for name in found)


def test_no_hand_written_module_is_over_600_lines() -> None:
    over = too_long(hand_written_modules(ROOT))

    assert over == {}, f"split these modules (limit {MAX_LINES} lines): {over}"


def test_the_rule_can_fail(tmp_path: Path) -> None:
    long_module = tmp_path / "long.py"
    long_module.write_text("x = 1\n" * (MAX_LINES + 1), encoding="utf-8")
    short_module = tmp_path / "short.py"
    short_module.write_text("x = 1\n" * MAX_LINES, encoding="utf-8")

    assert too_long([long_module, short_module], root=tmp_path) == {"long.py": MAX_LINES + 1}
