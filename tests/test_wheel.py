"""What ships, used as a user gets it: the sdist built from this checkout's files, the wheel
built from that sdist, installed with the trainer extra into a fresh virtualenv outside the
checkout, and every check run by that virtualenv's Python and ``embeddb`` from a directory
outside the checkout with ``PYTHONPATH`` unset (the editable install of the test run never
sees these). The CI test run otherwise only imports the checkout, which hides a module or a
data file the wheel leaves out.

The virtualenv takes the versions of ``constraints/dev.txt`` (torch 2.13.0 among them). torch
comes first, from pip's configured find-links when they hold that version (the CPU wheel in
``/opt/wheels`` here), otherwise from PyTorch's CPU index, never PyPI's multi-GB CUDA build;
the other packages come from pip's configured indexes, through pip's cache.
"""

from __future__ import annotations

import contextlib
import importlib.metadata as metadata
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import urllib.request
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import yaml

from tests.support import eventually, free_port

# Building and installing take a minute or two of the first test's time on a busy machine.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[1]
CONSTRAINTS = ROOT / "constraints" / "dev.txt"
DIST = "embeddb-recsys"
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"
START_TIMEOUT_S = 180.0  # a fresh install compiles its numba kernels on the first start
RECORD = {  # one raw Adult row (the README's example)
    "age": 39,
    "workclass": "Private",
    "fnlwgt": 77516,
    "education": "Bachelors",
    "education_num": 13,
    "marital_status": "Never-married",
    "occupation": "Adm-clerical",
    "relationship": "Not-in-family",
    "race": "White",
    "gender": "Male",
    "capital_gain": 2174,
    "capital_loss": 0,
    "hours_per_week": 40,
    "native_country": "United-States",
}

# Run by the virtualenv's Python: import every module of the *installed* package (its files,
# not the checkout's); ``__main__`` modules run the CLI when imported and are run with -m.
IMPORT_ALL = """
import importlib, importlib.util, json, pathlib, sys, sysconfig
(root,) = importlib.util.find_spec("embeddb").submodule_search_locations
root = pathlib.Path(root)
names = []
for path in sorted(root.rglob("*.py")):
    parts = path.relative_to(root.parent).with_suffix("").parts
    if parts[-1] == "__main__":
        continue
    names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
failed = {}
for name in names:
    try:
        importlib.import_module(name)
    except Exception as exc:
        failed[name] = f"{type(exc).__name__}: {exc}"
print(json.dumps({
    "root": str(root),
    "purelib": sysconfig.get_paths()["purelib"],
    "modules": names,
    "failed": failed,
    "files": {n: sys.modules[n].__file__ for n in names if n in sys.modules},
    "sys_path": sys.path,
}))
"""


@dataclass
class Installed:
    """The built artifacts and the virtualenv they are installed in."""

    source: Path  # the copy of the checkout's files the sdist was built from
    sdist: Path
    wheel: Path
    venv: Path
    work: Path  # the working directory of every command: outside the checkout
    env: dict[str, str]

    def bin(self, name: str) -> str:
        return str(self.venv / "bin" / name)

    def run(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        """Run a command of the virtualenv (``embeddb ...``, ``python ...``); must succeed."""
        proc = subprocess.run(
            [self.bin(args[0]), *args[1:]],
            cwd=self.work,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        assert proc.returncode == 0, f"{args}: {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
        return proc

    def python(self, code: str, *args: str, timeout: float = 300) -> str:
        return self.run("python", "-c", code, *args, timeout=timeout).stdout

    def start(self, name: str, *args: str) -> subprocess.Popen[bytes]:
        """Start a long-running ``embeddb`` command; output to ``work/NAME.log``."""
        with (self.work / f"{name}.log").open("wb") as log:
            return subprocess.Popen(
                [self.bin("embeddb"), *args],
                cwd=self.work,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    def log(self, name: str) -> str:
        return (self.work / f"{name}.log").read_text(errors="replace")


def checked(cmd: list[str], cwd: Path, env: dict[str, str] | None = None) -> str:
    """Run ``cmd``, which must succeed; its stdout."""
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, f"{cmd}: {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr}"
    return proc.stdout


def copy_source_tree(into: Path) -> None:
    """The checkout's files as git lists them (tracked and untracked, not ignored): what a
    clone plus the work in progress holds, without build output, caches or data."""
    listed = checked(["git", "ls-files", "-z", "-c", "-o", "--exclude-standard"], ROOT)
    for name in sorted(set(listed.split("\0")) - {""}):
        source = ROOT / name
        if not source.is_symlink() and not source.is_file():
            continue  # deleted in the work tree, or a directory (a submodule)
        target = into / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_symlink():
            target.symlink_to(os.readlink(source))
        else:
            shutil.copy2(source, target)


def pinned(name: str) -> str:
    """``NAME==VERSION`` from constraints/dev.txt."""
    for line in CONSTRAINTS.read_text().splitlines():
        if line.lower().startswith(f"{name}=="):
            return line.strip()
    raise AssertionError(f"{name} is not pinned in {CONSTRAINTS}")


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    root = tmp_path_factory.mktemp("wheel")
    source, dist, venv, work = (root / name for name in ("source", "dist", "venv", "work"))
    work.mkdir()
    copy_source_tree(source)
    # The sdist, then the wheel built from the unpacked sdist (build's default order): the
    # wheel installs only if the sdist holds what it needs.
    checked([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(dist), "."], source)
    (sdist,) = dist.glob("*.tar.gz")
    (wheel,) = dist.glob("*.whl")

    checked([sys.executable, "-m", "venv", str(venv)], root)
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in {"PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "NUMBA_CACHE_DIR"}
        and not k.startswith("EMBEDDB_")
    }
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env["VIRTUAL_ENV"] = str(venv)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet"]
    torch = pinned("torch")
    local = subprocess.run(
        [*pip, "--no-deps", "--no-index", torch], cwd=work, env=env, capture_output=True,
        text=True, timeout=600,
    )  # fmt: skip
    if local.returncode != 0:  # no local wheel: the CPU build, not PyPI's CUDA one
        checked([*pip, "--no-deps", "--index-url", TORCH_CPU_INDEX, torch], work, env=env)
    checked([*pip, f"{wheel}[trainer]", "-c", str(CONSTRAINTS)], work, env=env)
    return Installed(source, sdist, wheel, venv, work, env)


# ---------------------------------------------------------------------- the files
def test_the_sdist_holds_what_the_wheel_is_built_from(installed: Installed) -> None:
    with tarfile.open(installed.sdist) as sdist:
        top = f"{installed.sdist.name.removesuffix('.tar.gz')}/"
        names = {m.name.removeprefix(top) for m in sdist.getmembers() if m.isfile()}
    with zipfile.ZipFile(installed.wheel) as wheel:
        shipped = {n for n in wheel.namelist() if n.startswith("embeddb/")}
    assert {"pyproject.toml", "README.md", "LICENSE", "NOTICE", "PKG-INFO"} <= names
    assert shipped <= names, sorted(shipped - names)
    assert not any(n.startswith(("tests/", "client/", "trainer/")) for n in names), names


def test_the_wheel_ships_every_file_of_the_package_and_nothing_else(
    installed: Installed,
) -> None:
    package = installed.source / "embeddb"
    want = {
        str(p.relative_to(installed.source)) for p in package.rglob("*") if p.is_file()
    }  # every module and data file under embeddb/ in the checkout
    with zipfile.ZipFile(installed.wheel) as wheel:
        names = set(wheel.namelist())
        info = f"{installed.wheel.name.split('-')[0]}-{installed.wheel.name.split('-')[1]}"
        meta = wheel.read(f"{info}.dist-info/METADATA").decode()
        licence = wheel.read(f"{info}.dist-info/licenses/LICENSE").decode()
    assert {n for n in names if not n.startswith(f"{info}.dist-info/")} == want
    assert "embeddb/transport/rpc/__init__.py" in want and "embeddb/proto/buf.yaml" in want
    assert f"Name: {DIST}\n" in meta
    assert "License-Expression: Apache-2.0 AND CC-BY-4.0\n" in meta
    assert "Apache License" in licence and "Version 2.0, January 2004" in licence
    assert f"{info}.dist-info/licenses/NOTICE" in names


# ---------------------------------------------------------------------- the installed package
def test_every_installed_module_imports_from_the_virtualenv(installed: Installed) -> None:
    report = json.loads(installed.python(IMPORT_ALL))
    root = Path(report["root"])
    assert root == Path(report["purelib"]) / "embeddb"
    # ('' on the path is the command's working directory, outside the checkout)
    path = [(installed.work / p).resolve() for p in report["sys_path"]]
    assert not any(p.is_relative_to(ROOT) for p in path), path
    assert report["failed"] == {}
    assert all(Path(f).is_relative_to(root) for f in report["files"].values()), report["files"]
    checkout = {
        ".".join(p.relative_to(installed.source).with_suffix("").parts).removesuffix(".__init__")
        for p in (installed.source / "embeddb").rglob("*.py")
        if p.stem != "__main__"
    }
    assert set(report["modules"]) == checkout


def test_the_version_and_the_distribution_name(installed: Installed) -> None:
    import tomllib

    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert installed.run("embeddb", "--version").stdout == f"embeddb, version {version}\n"
    assert installed.run("python", "-m", "embeddb", "--version").stdout.endswith(f" {version}\n")
    assert installed.run("python", "-m", "embeddb.cli", "--version").stdout.endswith(
        f" {version}\n"
    )
    out = installed.python(
        "import importlib.metadata as m, embeddb\n"
        f"print(m.version({DIST!r}), embeddb.__version__,"
        " m.packages_distributions()['embeddb'])"
    )
    assert out.split() == [version, version, f"['{DIST}']"]


def adult_preset(installed: Installed) -> str:
    """The path of the Adult embedding config the installed package ships."""
    return installed.python(
        "import pathlib, embeddb.presets as p\n"
        "print(pathlib.Path(p.__file__).parent / 'adult.yaml')"
    ).strip()


@dataclass
class Shard:
    process: subprocess.Popen[bytes]
    address: str


@pytest.fixture(scope="module")
def shard(installed: Installed) -> Iterator[Shard]:
    """``embeddb serve`` of the virtualenv on port 0 with the packaged Adult preset."""
    preset = adult_preset(installed)
    port_file = installed.work / "serve.port"
    process = installed.start(
        "serve", "serve", "--config", preset, "--data-dir", str(installed.work / "shard"),
        "--port", "0", "--port-file", str(port_file),
    )  # fmt: skip
    try:

        def bound() -> str:
            if process.poll() is not None:
                pytest.fail(f"serve exited with {process.returncode}:\n{installed.log('serve')}")
            return port_file.read_text().strip() if port_file.exists() else ""

        port = int(eventually(bound, START_TIMEOUT_S, "embeddb serve to write its port file"))
        yield Shard(process, f"127.0.0.1:{port}")
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 0, installed.log("serve")
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=10)


def test_the_client_assigns_and_looks_up_on_a_served_shard(
    installed: Installed, shard: Shard
) -> None:
    out = installed.python(
        "import sys, numpy as np\n"
        "from embeddb.client import Client\n"
        "ids = np.array([2**40 + 1, 2**40 + 2], dtype=np.uint64)\n"
        "vectors = np.arange(16, dtype=np.float32).reshape(2, 8)\n"
        "with Client([sys.argv[1]]) as client:\n"
        "    assert client.assign('workclass', ids, vectors) == 2\n"
        "    got = client.lookup('workclass', ids, train=False)\n"
        "print(got.tolist())",
        shard.address,
    )
    np.testing.assert_array_equal(json.loads(out), np.arange(16).reshape(2, 8))


def test_a_follower_without_a_config_and_a_cluster_run_from_the_virtualenv(
    installed: Installed, shard: Shard
) -> None:
    """``embeddb serve --follow`` adopts the primary's tables (no ``--config``) and serves what
    the primary acknowledged; ``embeddb cluster`` starts shards whose address file the
    inspection commands read with ``--addresses @FILE``."""
    ids = [str(2**41 + 7), str(2**41 + 8)]
    installed.python(
        "import sys, numpy as np\n"
        "from embeddb.client import Client\n"
        "with Client([sys.argv[1]]) as client:\n"
        "    client.assign('occupation', np.array([2**41 + 7, 2**41 + 8], dtype=np.uint64),\n"
        "                  np.full((2, 8), 0.5, dtype=np.float32))\n",
        shard.address,
    )
    preset = adult_preset(installed)
    port_file = installed.work / "follower.port"
    follower = installed.start(
        "follower", "serve", "--follow", shard.address, "--data-dir",
        str(installed.work / "follower"), "--port", "0", "--port-file", str(port_file),
    )  # fmt: skip
    cluster = installed.start(
        "cluster", "cluster", "--num-shards", "2", "--data-dir", str(installed.work / "cluster"),
        "--base-port", "0", "--config", preset,
    )  # fmt: skip
    try:

        def follower_rows() -> str:
            if follower.poll() is not None:
                pytest.fail(f"the follower exited:\n{installed.log('follower')}")
            if not port_file.exists():
                return ""
            address = f"127.0.0.1:{port_file.read_text().strip()}"
            proc = subprocess.run(
                [installed.bin("embeddb"), "peek", "--addresses", address, "--table", "occupation",
                 *ids],
                cwd=installed.work, env=installed.env, capture_output=True, text=True, timeout=60,
            )  # fmt: skip
            return proc.stdout if proc.returncode == 0 and "0.5" in proc.stdout else ""

        out = eventually(follower_rows, START_TIMEOUT_S, "the follower to serve the rows")
        assert out.count("0.5") == 16, out

        addresses = installed.work / "cluster" / "addresses.txt"

        def cluster_up() -> str:
            if cluster.poll() is not None:
                pytest.fail(f"the cluster exited:\n{installed.log('cluster')}")
            if not addresses.exists():
                return ""
            proc = subprocess.run(
                [installed.bin("embeddb"), "tables", "--addresses", f"@{addresses}"],
                cwd=installed.work, env=installed.env, capture_output=True, text=True, timeout=60,
            )  # fmt: skip
            return proc.stdout if proc.returncode == 0 else ""

        tables = eventually(cluster_up, START_TIMEOUT_S, "embeddb cluster to answer")
        assert "occupation" in tables, tables
    finally:
        for process in (follower, cluster):
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for name, process in (("follower", follower), ("cluster", cluster)):
            try:
                assert process.wait(timeout=60) == 0, installed.log(name)
            finally:
                if process.poll() is None:
                    process.kill()
                    process.wait(timeout=10)


@pytest.fixture(scope="module")
def model_dir(installed: Installed, shard: Shard) -> Path:
    """``embeddb train`` of the Adult example (one epoch, large batches) on the shard, its
    model exported to ``work/job/model``."""
    job_dir = installed.work / "job"
    job_dir.mkdir()
    shutil.copy(ROOT / "examples" / "adult" / "model.py", job_dir)
    job = yaml.safe_load((ROOT / "examples" / "adult" / "train.yaml").read_text())
    job.pop("shards")
    job.update(addresses=[shard.address], epochs=1, batch_size=2048, threads=1, export_dir="model")
    (job_dir / "train.yaml").write_text(yaml.safe_dump(job))
    out = installed.run("embeddb", "train", str(job_dir / "train.yaml"), timeout=600)
    assert "test AUC" in out.stdout + out.stderr, out.stdout + out.stderr
    assert (job_dir / "model" / "model.json").is_file()
    return job_dir / "model"


def predict_http(port: int, records: list[dict[str, object]]) -> list[float]:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/predict",
        data=json.dumps({"records": records}).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=60) as reply:
        scores: list[float] = json.loads(reply.read())["scores"]
    return scores


@pytest.fixture(scope="module")
def served_scores(installed: Installed, shard: Shard, model_dir: Path) -> list[float]:
    """``embeddb serve-model`` of the virtualenv (gRPC and HTTP on port 0) answering one
    prediction of the trained model over HTTP."""
    port_file = installed.work / "serve-model.port"
    process = installed.start(
        "serve-model", "serve-model", "--model", str(model_dir), "--addresses", shard.address,
        "--port", "0", "--http-port", "0", "--port-file", str(port_file),
    )  # fmt: skip
    try:

        def ports() -> dict[str, int]:
            if process.poll() is not None:
                pytest.fail(f"serve-model exited:\n{installed.log('serve-model')}")
            return json.loads(port_file.read_text()) if port_file.exists() else {}

        found = eventually(ports, START_TIMEOUT_S, "serve-model to write its port file")
        scores = predict_http(int(found["http"]), [RECORD, {**RECORD, "age": 60}])
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 0, installed.log("serve-model")
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=10)
    return scores


def test_train_exports_a_model_that_serve_model_scores(served_scores: list[float]) -> None:
    assert len(served_scores) == 2 and all(0.0 < s < 1.0 for s in served_scores)
    assert served_scores[0] != served_scores[1]


# Run by the virtualenv's Python in the unpacked archive: TorchServe's loader imports the entry
# file as a top-level module, calls handle(None, context) once, then handle(requests, context).
TORCHSERVE_CALLS = """
import json, sys
sys.path.insert(0, sys.argv[1])
import embeddb_handler
class Context:
    system_properties = {"model_dir": sys.argv[1], "gpu_id": None, "batch_size": 4}
assert embeddb_handler.handle(None, Context()) is None
out = embeddb_handler.handle([{"body": sys.argv[2].encode()}], None)
handler = sys.modules["embeddb.serving.torchserve"].__file__
print(json.dumps({"scores": out[0], "handler": handler}))
"""


def test_the_torchserve_handler_scores_like_serve_model(
    installed: Installed, shard: Shard, model_dir: Path, served_scores: list[float]
) -> None:
    mar = installed.work / "adult.mar"
    installed.run("embeddb", "torchserve-archive", str(model_dir), "--out", str(mar),
                  "--addresses", shard.address)  # fmt: skip
    unpacked = installed.work / "mar"
    with zipfile.ZipFile(mar) as archive:
        archive.extractall(unpacked)
    body = json.dumps({"records": [RECORD, {**RECORD, "age": 60}]})
    out = json.loads(installed.python(TORCHSERVE_CALLS, str(unpacked), body))
    assert Path(out["handler"]).is_relative_to(installed.venv)
    np.testing.assert_allclose(out["scores"], served_scores, rtol=1e-5, atol=1e-6)


def test_real_torchserve_serves_the_archive_with_the_installed_package(
    installed: Installed, shard: Shard, model_dir: Path, served_scores: list[float]
) -> None:
    """Where real TorchServe runs (``tests/test_torchserve_real.py``'s conditions: Java 11+,
    ``torchserve`` and its ``ts`` package in the test run's Python;
    ``scripts/install-torchserve.sh``), the same release is installed into the virtualenv and
    serves the archive there: its worker imports the installed handler."""
    from tests.test_torchserve_real import (
        TORCHSERVE_START_S,
        http,
        model_ready,
        torchserve_missing,
    )

    missing = torchserve_missing()
    if missing is not None:
        pytest.skip(f"real TorchServe: {missing}")
    version = metadata.version("torchserve")
    tools = [f"torchserve=={version}", f"torch-model-archiver=={version}"]
    installed.run("python", "-m", "pip", "install", "--quiet", *tools, "-c", str(CONSTRAINTS))
    store = installed.work / "store"
    inference, management, metrics = (f"http://127.0.0.1:{free_port()}" for _ in range(3))
    installed.run("embeddb", "torchserve-archive", str(model_dir), "--out",
                  str(store / "adult.mar"), "--addresses", shard.address, "--inference-address",
                  inference, "--management-address", management, "--metrics-address", metrics,
                  "--disable-token-auth")  # fmt: skip
    logs = installed.work / "torchserve-logs"
    env = {**installed.env, "LOG_LOCATION": str(logs), "METRICS_LOCATION": str(logs)}
    command = [installed.bin("torchserve"), "--start", "--foreground", "--ncs", "--model-store",
               str(store), "--ts-config", str(store / "adult.config.properties")]  # fmt: skip
    with (installed.work / "torchserve.log").open("wb") as log:
        process = subprocess.Popen(
            command, cwd=installed.work, env=env, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    try:
        eventually(
            lambda: process.poll() is None and model_ready(management, "adult"),
            TORCHSERVE_START_S,
            "TorchServe's adult model READY",
        )
        code, text = http(
            "POST",
            f"{inference}/predictions/adult",
            json.dumps({"records": [RECORD, {**RECORD, "age": 60}]}).encode(),
        )
        assert code == 200, text
        np.testing.assert_allclose(json.loads(text), served_scores, rtol=1e-5, atol=1e-6)
        # the worker ran the virtualenv's Python, which has no checkout on its path
        assert str(installed.venv) in installed.log("torchserve") + "".join(
            p.read_text(errors="replace") for p in logs.glob("*.log")
        )
    finally:
        subprocess.run([installed.bin("torchserve"), "--stop"], cwd=installed.work, env=env,
                       timeout=60, check=False, capture_output=True)  # fmt: skip
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=60)
