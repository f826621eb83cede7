"""The installed package: import names, lazy root, shipped data; the distribution's metadata,
package discovery and the constraint files (tests/test_wheel.py builds and installs it)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version


def _run(code: str, cwd: Path) -> str:
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


@pytest.mark.slow
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


@pytest.mark.slow
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


@pytest.mark.slow
def test_importing_errors_and_routing_does_not_load_the_engine(tmp_path: Path) -> None:
    out = _run(
        "import sys, embeddb.errors, embeddb.common.routing;"
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


# ---------------------------------------------------------------------- the distribution
ROOT = Path(__file__).resolve().parents[1]


def _project() -> dict[str, Any]:
    import tomllib

    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def _pins(name: str) -> dict[str, Version]:
    """Canonical name -> version of each ``NAME==VERSION`` line of constraints/NAME.txt."""
    out = {}
    for line in (ROOT / "constraints" / f"{name}.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            requirement = Requirement(line)
            (spec,) = requirement.specifier
            assert spec.operator == "==", line
            out[canonicalize_name(requirement.name)] = Version(spec.version)
    return out


def test_the_distribution_has_its_own_name_and_an_spdx_licence() -> None:
    # `embeddb` on PyPI is an unrelated project; the import name stays `embeddb`.
    project = _project()["project"]
    assert project["name"] == "embeddb-recsys"
    assert project["license"] == "Apache-2.0 AND CC-BY-4.0"  # the code; the Adult data
    assert project["license-files"] == ["LICENSE", "NOTICE"]
    assert not any(c.startswith("License ::") for c in project["classifiers"])
    licence = (ROOT / "LICENSE").read_text()
    assert licence.split()[:5] == ["Apache", "License", "Version", "2.0,", "January"]
    assert "END OF TERMS AND CONDITIONS" in licence
    notice = (ROOT / "NOTICE").read_text()
    assert "CC BY 4.0" in notice and "embeddb/datasets/adult/SOURCE.md" in notice
    requires = _project()["build-system"]["requires"]
    assert requires == ["setuptools>=77"]  # the first to read PEP 639's license fields


def test_every_package_under_embeddb_is_found_and_nothing_else() -> None:
    from setuptools import find_packages

    config = _project()["tool"]["setuptools"]
    assert set(config["packages"]) == {"find"}  # no hand-written list to forget a package in
    find = config["packages"]["find"]
    assert find["namespaces"] is False
    found = set(find_packages(str(ROOT), include=find["include"], exclude=find["exclude"]))
    on_disk = {
        ".".join(p.parent.relative_to(ROOT).parts)
        for p in (ROOT / "embeddb").rglob("__init__.py")
        if "__pycache__" not in p.parts
    }
    assert found == on_disk and "embeddb.transport.rpc" in found
    # the links client/ and trainer/ (they would install second copies under bare names)
    assert not {p for p in found if not p.startswith("embeddb")}


def test_dev_constraints_pin_every_requirement_within_pyprojects_ranges() -> None:
    project = _project()["project"]
    pins = _pins("dev")
    extras = project["optional-dependencies"]
    for line in [*project["dependencies"], *extras["dev"], *extras["trainer"]]:
        requirement = Requirement(line)
        name = canonicalize_name(requirement.name)
        assert name in pins, f"{name} is not pinned in constraints/dev.txt"
        assert requirement.specifier.contains(pins[name], prereleases=True), (line, pins[name])
    # CI keeps the CPU build of torch on this machine's disk; PyPI's later ones are CUDA builds.
    assert pins["torch"] == Version("2.13.0")
    assert "constraints/dev.txt" in (ROOT / ".ci" / "run").read_text()


def test_lowest_constraints_are_the_lower_bound_of_each_runtime_range() -> None:
    project = _project()["project"]
    lowest = _pins("lowest")
    lines = [*project["dependencies"], *project["optional-dependencies"]["trainer"]]
    for line in lines:
        requirement = Requirement(line)
        (bound,) = [s for s in requirement.specifier if s.operator == ">="]
        assert lowest.pop(canonicalize_name(requirement.name)) == Version(bound.version), line
    assert lowest == {}, f"constraints/lowest.txt pins what pyproject does not require: {lowest}"
