"""The warm-ups compile every kernel signature real traffic uses, and a filled cache is reused.

Each check runs in a fresh process (``tests/warmup_traffic.py``), so nothing this process
compiled earlier can hide a signature the warm-up misses. The kernels are found by scanning every
embeddb module outside the trainer for numba dispatchers: a new kernel is covered without
editing this file. The Docker images compile the kernels at build time: checked statically here
(Docker cannot run on this machine), and the cache reuse they rely on is checked for real.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _traffic(mode: str, tmp_path: Path, **env: str) -> dict[str, Any]:
    """Run ``tests/warmup_traffic.py`` after the ``mode`` warm-up; its JSON report."""
    proc = subprocess.run(
        [sys.executable, "-m", "tests.warmup_traffic", mode, str(tmp_path)],
        cwd=ROOT,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr
    report: dict[str, Any] = json.loads(proc.stdout.splitlines()[-1])
    return report


def _is_client(kernel: str) -> bool:
    return kernel.startswith("embeddb.client.")


@pytest.mark.slow
def test_after_warm_up_core_shard_traffic_compiles_nothing(tmp_path: Path) -> None:
    report = _traffic("core", tmp_path)
    missed = {k: v for k, v in report["added"].items() if not _is_client(k)}
    assert not missed, f"signatures warm_up_core() does not compile: {missed}"
    # the same traffic does reach kernels: the client's, which this warm-up leaves alone
    assert any(_is_client(k) for k in report["added"])
    # read-only ids (decoded from a request) are a signature of their own
    assert any(
        "'C', True" in s for s in report["warm"]["embeddb.engine.storage.hash_index.partition"]
    )


@pytest.mark.slow
def test_after_warm_up_client_client_traffic_compiles_nothing(tmp_path: Path) -> None:
    report = _traffic("client", tmp_path)
    missed = {k: v for k, v in report["added"].items() if _is_client(k)}
    assert not missed, f"signatures warm_up_client() does not compile: {missed}"
    # without the core warm-up the traffic compiles core kernels, read-only ids included
    core = {k: v for k, v in report["added"].items() if not _is_client(k)}
    assert "embeddb.engine.optim.kernels.apply_rows" in core
    assert any("'C', True" in s for s in core["embeddb.engine.storage.hash_index.partition"])


@pytest.mark.slow
def test_a_cache_filled_by_one_process_serves_every_kernel_of_the_next(tmp_path: Path) -> None:
    """What the Docker images do: compile at build time into NUMBA_CACHE_DIR, load at run."""
    cache = tmp_path / "numba-cache"
    script = (
        "import json\n"
        "from embeddb.engine.warmup import warm_up_core\n"
        "from embeddb.client import warm_up_client\n"
        "from tests.warmup_traffic import dispatchers\n"
        "warm_up_core(); warm_up_client()\n"
        "stats = {k: (sum(d.stats.cache_hits.values()), sum(d.stats.cache_misses.values()))\n"
        "         for k, d in dispatchers().items()}\n"
        "print(json.dumps(stats))\n"
    )
    env = {**os.environ, "NUMBA_CACHE_DIR": str(cache)}
    runs = []
    for _ in range(2):
        proc = subprocess.run(
            [sys.executable, "-c", script],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert proc.returncode == 0, proc.stderr
        runs.append(json.loads(proc.stdout.splitlines()[-1]))
    build, start = runs
    compiled = {k for k, (_, misses) in build.items() if misses}
    assert "embeddb.engine.storage.hash_index.lookup_gather" in compiled  # the empty cache compiled
    assert {k for k, (_, misses) in start.items() if misses} == set()
    loaded = {k for k, (hits, _) in start.items() if hits}
    assert {"embeddb.engine.optim.kernels.apply_rows", "embeddb.client._kernels.dedup"} <= loaded


@pytest.mark.parametrize("dockerfile", ["Dockerfile", "Dockerfile.trainer"])
def test_images_ship_the_kernels_compiled_at_build_time(dockerfile: str) -> None:
    """The image's stage installs the wheel, then compiles every kernel (embeddb.engine.warmup) of
    the
    installed package into NUMBA_CACHE_DIR and gives that directory to the image's user (numba
    ignores a cache directory it cannot write to, and compiles again in every process)."""
    _, wheel, image = re.split(r"^FROM .*$", (ROOT / "docker" / dockerfile).read_text(), flags=re.M)
    assert "NUMBA_CACHE_DIR" not in wheel  # the wheel stage only builds
    cache = re.findall(r"NUMBA_CACHE_DIR=(\S+)", image)
    assert len(cache) == 1, cache
    install = image.index("/wheels/embeddb_recsys-")
    warm = re.search(r"^RUN python -c \"(.*?)\"( \\\n.*)?$", image, re.M | re.S)
    assert warm and warm.start() > install and warm.start() > image.index("NUMBA_CACHE_DIR")
    code = warm.group(1).replace("\\\n", "\n")
    assert "warm_up_core()" in code and "warm_up_client()" in code
    compile(code, "warm-up", "exec")
    user = re.findall(r"^USER (\S+)$", image, re.M)[-1]
    assert image.index(f"chown -R {user} {cache[0]}") > warm.start()
