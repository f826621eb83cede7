"""The generated stubs are what proto/generate.py makes from the committed .proto files."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

# Starts processes or runs for seconds: the full suite's, not the fast tier's.
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]


def test_generated_stubs_are_not_stale(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "proto" / "generate.py"), "--check", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (tmp_path / "embeddb" / "v1" / "embeddb_pb2.py").exists()
    assert (tmp_path / "embeddb" / "v1" / "model_pb2_grpc.py").exists()
