"""``embeddb torchserve-archive``: the archive's contents, the handler as TorchServe's loader
calls it, and real TorchServe (Java + ``torchserve``; ``scripts/install-torchserve.sh``)
loading the archive, scoring like :class:`InferCtx` and answering bad records with 400."""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import urllib.error
import urllib.request
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from torch import nn

from embeddb.cli.app import main
from embeddb.cli.torchserve import ENTRY_FILE, MODEL_CONFIG_FILE
from embeddb.client import Client
from embeddb.errors import ConfigError
from embeddb.features.batch import Batch
from embeddb.serving import InferCtx
from embeddb.serving.torchserve import (
    SERVING_FILE,
    BadRequestError,
    EmbeddbHandler,
    ServingSettings,
)
from embeddb.trainer import EmbeddingWorkerConfig, TrainCtx, TrainerConfig
from embeddb.trainer.checkpoints.files import write_checkpoint
from tests.support import eventually, free_port
from tests.trainer_harness import Shards, adult_config, adult_model, random_adult_batches
from tests.trainer_harness import serve_shards as harness_shards

ROOT = Path(__file__).resolve().parents[1]
FAST = TrainerConfig(
    device="cpu", worker=EmbeddingWorkerConfig(max_staleness=2, retries=1, shard_timeout=5.0)
)
CHECKPOINT = "ckpt-000000001"
TORCHSERVE_START_S = 180.0  # the JVM and a worker importing torch on a busy 2-core machine


def records_of(batch: Batch) -> list[dict[str, Any]]:
    dense = batch.non_id_type_features[0].data
    return [
        {
            "ids": {f.name: int(f.values[i]) for f in batch.id_type_features},
            "non_id": {"non_id_0": dense[i].tolist()},
        }
        for i in range(batch.batch_size)
    ]


@dataclass
class Exported:
    shards: Shards
    model_dir: Path
    checkpoint_dir: Path  # a job checkpoint of the shards after training (CHECKPOINT)
    records: list[dict[str, Any]]
    scores: np.ndarray  # InferCtx's on ``records``


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Exported]:
    """Two shards, the harness model trained 5 steps on random Adult-shaped batches, exported,
    and InferCtx's scores of 8 records."""
    root = tmp_path_factory.mktemp("model")
    model_dir, checkpoint_dir = root / "adult", root / "ckpt"
    with harness_shards(adult_config(), checkpoint_dir / "shards", 2) as shards:
        torch.manual_seed(0)
        model = adult_model()
        optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
        loss_fn = nn.BCEWithLogitsLoss()
        with TrainCtx(model, optimizer, adult_config(), shards.addresses, FAST) as ctx:
            for prepared in ctx.prepare(random_adult_batches(5, 64, seed=1)):
                output, labels = ctx.forward(prepared)
                ctx.backward(loss_fn(output, labels[0]))
            ctx.export_model(model_dir, example=next(random_adult_batches(1, 4, seed=2)))
        records = records_of(next(random_adult_batches(1, 8, seed=3)))
        with InferCtx(model_dir, shards.addresses) as infer:
            scores = infer.predict_records(records)
        with Client(shards.addresses) as client:
            client.snapshot(CHECKPOINT)
        write_checkpoint(checkpoint_dir, CHECKPOINT, {}, step=5, samples=320, num_shards=2)
        yield Exported(shards, model_dir, checkpoint_dir, records, scores)


def archive(model_dir: Path, out: Path, *args: str) -> Path:
    result = CliRunner().invoke(
        main, ["torchserve-archive", str(model_dir), "--out", str(out), *args]
    )
    assert result.exit_code == 0, result.output
    return out


def unpack(mar: Path, into: Path) -> Path:
    with zipfile.ZipFile(mar) as z:
        z.extractall(into)
    return into


# ---------------------------------------------------------------------- the archive
@pytest.mark.slow
def test_the_archive_holds_the_model_an_entry_point_and_its_config(
    exported: Exported, tmp_path: Path
) -> None:
    mar = archive(
        exported.model_dir,
        tmp_path / "adult.mar",
        "--addresses=" + ",".join(exported.shards.addresses),
        "--shard-token-file",
        str(tmp_path / "ro.token"),
        "--batch-size",
        "4",
    )
    with zipfile.ZipFile(mar) as z:
        names = set(z.namelist())
        manifest = json.loads(z.read("MAR-INF/MANIFEST.json"))
        serving = json.loads(z.read("serving.json"))
        entry = z.read(ENTRY_FILE).decode()
    assert {"model.json", "dense.pt", "embedding.yaml", ENTRY_FILE, MODEL_CONFIG_FILE} <= names
    assert manifest["runtime"] == "python"
    assert manifest["model"]["modelName"] == "adult"
    assert manifest["model"]["handler"] == ENTRY_FILE
    assert manifest["model"]["configFile"] == MODEL_CONFIG_FILE
    assert serving == {
        "addresses": exported.shards.addresses,
        "token_file": str((tmp_path / "ro.token").resolve()),
    }
    assert "from embeddb.serving.torchserve import EmbeddbHandler" in entry
    assert "from ." not in entry  # no relative import: TorchServe loads it as a top-level module
    props = (tmp_path / "adult.config.properties").read_text()
    assert f"model_store={tmp_path.resolve()}" in props
    assert "load_models=adult=adult.mar" in props
    assert "disable_token_authorization" not in props  # TorchServe's default stays on
    result = CliRunner().invoke(
        main, ["torchserve-archive", str(exported.model_dir), "--out", str(mar)]
    )
    assert result.exit_code == 1 and "pass --overwrite" in result.output


@pytest.mark.slow
def test_the_command_refuses_shards_with_a_checkpoint_and_non_model_dirs(
    exported: Exported, tmp_path: Path
) -> None:
    both = CliRunner().invoke(
        main,
        [
            "torchserve-archive",
            str(exported.model_dir),
            "--out",
            str(tmp_path / "a.mar"),
            "--addresses",
            "127.0.0.1:1",
            "--from-checkpoint",
            str(tmp_path),
        ],
    )
    assert both.exit_code == 2 and "not both" in both.output
    empty = tmp_path / "empty"
    empty.mkdir()
    none = CliRunner().invoke(
        main, ["torchserve-archive", str(empty), "--out", str(tmp_path / "b.mar")]
    )
    assert none.exit_code == 1 and "model.json" in none.output
    assert not (tmp_path / "a.mar").exists() and not (tmp_path / "b.mar").exists()


def test_serving_settings_round_trip_and_resolve_relative_paths(tmp_path: Path) -> None:
    shards = ServingSettings(("127.0.0.1:7000",), tls_ca="shards-ca.pem", token_file="ro.token")
    (tmp_path / SERVING_FILE).write_text(shards.to_json())
    assert ServingSettings.read(tmp_path, {}) == ServingSettings(
        ("127.0.0.1:7000",),
        tls_ca=str(tmp_path / "shards-ca.pem"),
        token_file=str(tmp_path / "ro.token"),
    )
    checkpoint = ServingSettings(checkpoint_dir="/data/ckpt", checkpoint_id="c7")
    (tmp_path / SERVING_FILE).write_text(checkpoint.to_json())
    assert ServingSettings.read(tmp_path, {"EMBEDDB_ADDRESSES": "ignored:1"}) == checkpoint
    both = {"addresses": ["127.0.0.1:7000"], "checkpoint_dir": "/data/ckpt"}
    (tmp_path / SERVING_FILE).write_text(json.dumps(both))
    with pytest.raises(ConfigError, match="not both"):
        ServingSettings.read(tmp_path, {})
    (tmp_path / SERVING_FILE).unlink()
    assert ServingSettings.read(tmp_path, {"EMBEDDB_ADDRESSES": "a:1, b:2"}).addresses == (
        "a:1",
        "b:2",
    )


class Context:
    """Shaped like TorchServe's ``ts.context.Context`` (the attributes a handler reads)."""

    def __init__(self, model_dir: Path) -> None:
        self.system_properties = {"model_dir": str(model_dir), "gpu_id": None, "batch_size": 4}


@pytest.mark.slow
def test_the_entry_point_loads_as_torchserve_calls_it(
    exported: Exported, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """TorchServe imports the handler file as a top-level module from the unpacked archive,
    calls ``handle(None, context)`` once, then ``handle(requests, context)``."""
    mar = archive(
        exported.model_dir,
        tmp_path / "m.mar",
        "--addresses=" + ",".join(exported.shards.addresses),
    )
    model_dir = unpack(mar, tmp_path / "unpacked")
    monkeypatch.syspath_prepend(str(model_dir))
    monkeypatch.delenv("EMBEDDB_ADDRESSES", raising=False)
    module = importlib.import_module(ENTRY_FILE.removesuffix(".py"))
    handle = module.handle
    try:
        assert handle(None, Context(model_dir)) is None
        out = handle([{"body": json.dumps({"records": exported.records}).encode()}], None)
        np.testing.assert_allclose(out[0], exported.scores, rtol=1e-5, atol=1e-6)
        with pytest.raises(BadRequestError, match="request 0: the body is not valid") as caught:
            handle([{"body": b"{"}], None)
        assert caught.value.error_code == 400
    finally:
        handle.__self__.close()
        sys.modules.pop(ENTRY_FILE.removesuffix(".py"), None)


def test_the_handler_class_is_what_torchserve_instantiates() -> None:
    handler = EmbeddbHandler()  # TorchServe's class entry point: no arguments
    assert not handler.initialized and handler.infer is None


# ---------------------------------------------------------------------- real TorchServe
def java_major() -> int | None:
    java = shutil.which("java")
    if java is None:
        return None
    out = subprocess.run([java, "-version"], capture_output=True, text=True, check=False)
    found = re.search(r'version "(\d+)(?:\.(\d+))?', out.stderr + out.stdout)
    if found is None:
        return None
    major = int(found.group(1))
    return int(found.group(2) or 0) if major == 1 else major


def torchserve_missing() -> str | None:
    """Why real TorchServe cannot run here, or ``None``."""
    major = java_major()
    if major is None:
        return "java is not installed (scripts/install-torchserve.sh)"
    if major < 11:
        return f"TorchServe 0.12 needs Java 11+, found Java {major}"
    if shutil.which("torchserve") is None:
        return "torchserve is not installed (scripts/install-torchserve.sh)"
    # Found, not imported: ts 0.12's __init__ leaves version.txt open, a ResourceWarning that
    # pytest (filterwarnings = error) would pin on whichever test runs next.
    if importlib.util.find_spec("ts") is None:
        return "the ts package (torchserve) is not installed in this Python"
    return None


def http(method: str, url: str, body: bytes | None = None) -> tuple[int, str]:
    request = urllib.request.Request(url, data=body, method=method)
    request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def model_ready(management: str, name: str) -> bool:
    code, text = http("GET", f"{management}/models/{name}")
    if code != 200:
        return False
    workers = json.loads(text)[0].get("workers", [])
    return any(w.get("status") == "READY" for w in workers)


@pytest.mark.slow
@pytest.mark.skipif(torchserve_missing() is not None, reason=str(torchserve_missing()))
@pytest.mark.parametrize("source", ["shards", "checkpoint"])
def test_real_torchserve_loads_the_archive_and_scores_like_infer_ctx(
    exported: Exported, tmp_path: Path, source: str
) -> None:
    store = tmp_path / "store"
    ports = [free_port() for _ in range(3)]
    inference, management, metrics = (f"http://127.0.0.1:{p}" for p in ports)
    archive(
        exported.model_dir,
        store / "adult.mar",
        *(
            ["--addresses=" + ",".join(exported.shards.addresses)]
            if source == "shards"
            else ["--from-checkpoint", str(exported.checkpoint_dir)]
        ),
        "--inference-address",
        inference,
        "--management-address",
        management,
        "--metrics-address",
        metrics,
        "--disable-token-auth",
    )
    env = {
        **os.environ,
        "TMPDIR": str(tmp_path),
        "LOG_LOCATION": str(tmp_path / "logs"),
        "METRICS_LOCATION": str(tmp_path / "logs"),
    }
    env.pop("EMBEDDB_ADDRESSES", None)
    # the worker must import this checkout's embeddb (not whatever the environment installed)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    command = [
        "torchserve",
        "--start",
        "--foreground",
        "--ncs",
        "--model-store",
        str(store),
        "--ts-config",
        str(store / "adult.config.properties"),
    ]
    log = (tmp_path / "torchserve.out").open("wb")
    process = subprocess.Popen(
        command,
        cwd=tmp_path,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        eventually(
            lambda: process.poll() is None and model_ready(management, "adult"),
            timeout=TORCHSERVE_START_S,
            what="TorchServe's adult model READY",
        )
        code, text = http(
            "POST",
            f"{inference}/predictions/adult",
            json.dumps({"records": exported.records}).encode(),
        )
        assert code == 200, text
        np.testing.assert_allclose(json.loads(text), exported.scores, rtol=1e-5, atol=1e-6)
        code, text = http("POST", f"{inference}/predictions/adult", b"{not json")
        assert code == 400 and "the body is not valid JSON" in text, (code, text)
        bad = {**exported.records[0], "ids": {**exported.records[0]["ids"], "nope": 3}}
        code, text = http(
            "POST", f"{inference}/predictions/adult", json.dumps({"records": [bad]}).encode()
        )
        assert code == 400 and "nope" in text, (code, text)
        wrong = {**exported.records[0], "non_id": {"non_id_0": "cheap"}}
        code, text = http(
            "POST", f"{inference}/predictions/adult", json.dumps({"records": [wrong]}).encode()
        )
        assert code == 400 and "non_id_0" in text, (code, text)
        # the model server's record path: a number that is not finite is a 400 naming the
        # record, a string over max_string_bytes a 400 naming the limit (TorchServe's frontend
        # answers a handler's 413 as 507)
        marked = {**exported.records[0], "non_id": {"non_id_0": [12345.5, 0.0, 0.0, 0.0, 0.0]}}
        infinite = json.dumps({"records": [marked]}).replace("12345.5", "1e999")
        code, text = http("POST", f"{inference}/predictions/adult", infinite.encode())
        assert code == 400 and "record 0: non_id.non_id_0" in text, (code, text)
        long_id = {**exported.records[0], "ids": {"workclass": "1" * (65 << 10)}}
        code, text = http(
            "POST", f"{inference}/predictions/adult", json.dumps({"records": [long_id]}).encode()
        )
        assert code == 400 and "max_string_bytes 65536" in text, (code, text)
    except BaseException:
        log.flush()
        sys.stderr.write((tmp_path / "torchserve.out").read_text(errors="replace")[-8000:])
        raise
    finally:
        subprocess.run(
            ["torchserve", "--stop"],
            env=env,
            cwd=tmp_path,
            timeout=60,
            check=False,
            capture_output=True,
        )
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=30)
        log.close()
