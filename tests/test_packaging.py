"""The installed package: import names, lazy root, shipped data."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def _run(code: str, cwd: Path) -> str:
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def test_client_and_trainer_install_under_embeddb_not_as_bare_names(tmp_path: Path) -> None:
    # Run from an unrelated directory so the repository checkout is not on sys.path.
    out = _run(
        "import importlib.util, embeddb.client, embeddb.trainer;"
        "print(importlib.util.find_spec('client'), importlib.util.find_spec('trainer'))",
        tmp_path,
    )
    assert out == "None None"


def test_importing_errors_and_routing_does_not_load_the_engine(tmp_path: Path) -> None:
    out = _run(
        "import sys, embeddb.errors, embeddb.routing;"
        "print(sorted(m for m in ('numba', 'rocksdict', 'yaml') if m in sys.modules))",
        tmp_path,
    )
    assert out == "[]"


def test_shipped_adult_data_matches_its_published_checksums() -> None:
    import gzip
    import hashlib

    from embeddb.datasets import ADULT_DIR

    want = {
        "adult.data.gz": "5b00264637dbfec36bdeaab5676b0b309ff9eb788d63554ca0a249491c86603d",
        "adult.test.gz": "a2a9044bc167a35b2361efbabec64e89d69ce82d9790d2980119aac5fd7e9c05",
    }
    for name, digest in want.items():
        with gzip.open(ADULT_DIR / name, "rb") as fh:
            assert hashlib.sha256(fh.read()).hexdigest() == digest
    assert "CC BY 4.0" in (ADULT_DIR / "SOURCE.md").read_text()
