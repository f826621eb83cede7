"""The installed package: import names, lazy root, shipped data."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest


def _run(code: str, cwd: Path) -> str:
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def test_client_and_trainer_install_under_embeddb_not_as_bare_names(tmp_path: Path) -> None:
    # Run from an unrelated directory. An editable install puts the checkout on sys.path, where
    # the top-level client/ and trainer/ links would make a second copy of each package: they
    # refuse to be imported under a bare name.
    out = _run(
        "import embeddb.client, embeddb.trainer\n"
        "for bare in ('client', 'trainer'):\n"
        "    try:\n"
        "        __import__(bare)\n"
        "    except ImportError as e:\n"
        "        print(e)\n"
        "    else:\n"
        "        print('imported', bare)\n",
        tmp_path,
    )
    lines = out.splitlines()
    assert all(not line.startswith("imported") for line in lines), out
    for line in lines:
        assert line.startswith(("import embeddb.client", "import embeddb.trainer", "No module")), (
            out
        )


def test_a_downstream_type_checker_sees_the_client_and_the_trainer(tmp_path: Path) -> None:
    # What a user's mypy reports after `pip install -e .`: the installed package's real types,
    # so a wrong keyword is an error, not Any.
    mypy = shutil.which("mypy", path=str(Path(sys.executable).parent))
    if mypy is None:
        pytest.skip("mypy (the dev extra) is not installed")
    (tmp_path / "use.py").write_text(
        "from embeddb.client import Client\n"
        "from embeddb.trainer import TrainCtx\n"
        "Client(['127.0.0.1:1'], no_such_kwarg=1)\n"
        "TrainCtx(no_such_option=1)\n"
    )
    proc = subprocess.run(
        [mypy, "--no-incremental", "--python-executable", sys.executable, "use.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    out = proc.stdout
    assert 'use.py:3: error: Unexpected keyword argument "no_such_kwarg" for "Client"' in out
    assert 'use.py:4: error: Unexpected keyword argument "no_such_option" for "TrainCtx"' in out
    assert "import-not-found" not in out


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
