"""Raw records online, no skew: a model trained on a CSV with string columns through a
FeaturePipeline, exported with it, scores the raw test rows (JSON column values) exactly as
the training-time evaluation scored the CSV reader's batches of the same rows: through
InferCtx, the HTTP and gRPC servers, and ``embeddb serve-model --from-checkpoint``."""

from __future__ import annotations

import csv
import hashlib
import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from embeddb.config import EmbeddingConfig
from embeddb.errors import CorruptDataError, InvalidArgumentError
from embeddb.features import (
    ColumnSpec,
    CsvDialect,
    CsvReader,
    IDColumn,
    LabelColumn,
    NumericColumn,
)
from embeddb.features.batch import Batch
from embeddb.features.pipeline import PIPELINE_FILE, FeaturePipeline, save_pipeline
from embeddb.serving import InferCtx, export_model, load_model_spec
from embeddb.serving.client import ModelClient
from embeddb.serving.server import ModelServerConfig, build_model_server
from embeddb.serving.torchserve import EmbeddbHandler
from embeddb.trainer import EmbeddingWorkerConfig, TrainCtx, TrainerConfig
from tests.support import StartServe, serve_processes
from tests.test_model_server import call_http
from tests.trainer_harness import Shards, serve_shards

# Starts processes or runs for seconds: the full suite's, not the fast tier's.
pytestmark = pytest.mark.slow

FAST = TrainerConfig(
    device="cpu", worker=EmbeddingWorkerConfig(max_staleness=2, retries=1, shard_timeout=5.0)
)
CONFIG = """
slots_config:
  user: {dim: 4}
  city: {dim: 4}
  tags: {dim: 4}
defaults:
  optimizer: {type: adagrad, lr: 0.05, initial_accumulator: 0.01, eps: 1e-10}
  initializer: {type: normal, mean: 0.0, std: 0.05}
  capacity: 10000
store: {stripes: 1}
"""
SPEC = ColumnSpec(
    ids=(IDColumn("user"), IDColumn("city"), IDColumn("tags", separator="|")),
    numeric=(
        NumericColumn(("price",), name="price", log1p=True),
        NumericColumn(("age", "hours"), name="dense", standardize=((40.0, 12.0), (35.0, 9.0))),
    ),
    labels=(LabelColumn("clicked"),),
)
NA = ("NA",)
CITIES = ["Zurich", "Geneva", "Basel", "Bern", ""]
TAGS = ["a", "b", "c", "sale", "new"]


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(3 + 3 * 4, 16), nn.ReLU(), nn.Linear(16, 1))

    def forward(self, non_id: list[torch.Tensor], embeddings: list[torch.Tensor]) -> torch.Tensor:
        return self.mlp(torch.cat(non_id + embeddings, dim=1))  # type: ignore[no-any-return]


def write_csv(path: Path, rows: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    lines = ["user,city,tags,price,age,hours,clicked"]
    for i in range(rows):
        user = f"u{int(rng.integers(0, 40))}"
        city = CITIES[int(rng.integers(0, len(CITIES)))]
        tags = "|".join(rng.choice(TAGS, size=int(rng.integers(0, 3)), replace=False))
        price = "NA" if i % 7 == 3 else f"{rng.uniform(0, 200):.2f}"  # the file's NA marker
        age = "" if i % 11 == 5 else str(int(rng.integers(18, 80)))
        hours = f"{rng.uniform(10, 60):.1f}"
        clicked = int(city == "Zurich" or "sale" in tags)
        lines.append(f"{user},{city},{tags},{price},{age},{hours},{clicked}")
    path.write_text("\n".join(lines) + "\n")


def raw_records(path: Path) -> list[dict[str, Any]]:
    """The rows of ``path`` as a JSON client sends them: numbers as numbers, missing values as
    null, an absent key or the pipeline's marker ("NA"), tags as text or a list, no label."""
    out: list[dict[str, Any]] = []
    with open(path, newline="") as fh:
        for i, row in enumerate(csv.DictReader(fh)):
            record: dict[str, Any] = {"user": row["user"], "city": row["city"] or None}
            record["tags"] = row["tags"] if i % 2 else [t for t in row["tags"].split("|") if t]
            missing = "NA" if i % 2 else None
            record["price"] = missing if row["price"] == "NA" else float(row["price"])
            if row["age"]:
                record["age"] = int(row["age"])  # a missing key is a missing value
            record["hours"] = float(row["hours"])
            out.append(record)
    return out


def hashed_records(batch: Batch) -> list[dict[str, Any]]:
    """The pre-hashed records of ``batch``, ids as decimal strings."""
    return [
        {
            "ids": {f.name: [str(int(x)) for x in f.sample(i)] for f in batch.id_type_features},
            "non_id": {d.name: d.data[i].tolist() for d in batch.non_id_type_features},
        }
        for i in range(batch.batch_size)
    ]


def tree_digest(root: Path) -> dict[str, str]:
    """Every file of the checkpoints and the shards' snapshots (the live shards of this module
    keep writing their own disk tier and log beside them) with its mode and content hash."""
    files = [*root.glob("ckpt-*/*"), *root.glob("shards/*/snapshots/**/*")]
    digest = {
        str(p.relative_to(root)): f"{p.stat().st_mode:o} "
        + hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(files)
        if p.is_file()
    }
    assert len(digest) > 10
    return digest


@dataclass
class Trained:
    shards: Shards
    model_dir: Path
    checkpoint_dir: Path
    test_csv: Path
    records: list[dict[str, Any]]
    test: list[Batch]  # the CSV reader's test batches
    eval_scores: np.ndarray  # EvalCtx's sigmoid on ``test``
    # EvalCtx's sigmoid on the test CSV with every missing "age" written as its training mean
    # (the pipeline's standardize mean, 40): what serving makes of the raw records, whose
    # missing age is filled with that mean (a missing "price", log1p with no recorded mean,
    # keeps training's fill, 0)
    served_scores: np.ndarray


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Trained]:
    """Two shards keeping their data under the job's checkpoint dir; 3 epochs on the train
    CSV; a checkpoint; the test CSV evaluated by EvalCtx; the model exported with the
    pipeline."""
    root = tmp_path_factory.mktemp("raw")
    train_csv, test_csv = root / "train.csv", root / "test.csv"
    write_csv(train_csv, 600, seed=1)
    write_csv(test_csv, 70, seed=2)
    config = EmbeddingConfig.from_yaml_text(CONFIG)
    pipeline = FeaturePipeline(SPEC, na_values=NA, positive="clicked")
    dialect = CsvDialect(na_values=NA)
    checkpoint_dir = root / "checkpoints"
    with serve_shards(config, checkpoint_dir / "shards", 2) as shards:
        torch.manual_seed(0)
        model = Model()
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
        loss_fn = nn.BCEWithLogitsLoss()
        with TrainCtx(model, optimizer, config, shards.addresses, FAST) as ctx:
            for _ in range(3):
                reader = CsvReader(train_csv, SPEC, 64, dialect)
                for prepared in ctx.prepare(reader):
                    output, labels = ctx.forward(prepared)
                    ctx.backward(loss_fn(output, labels[0]))
            ctx.save_checkpoint(checkpoint_dir)
            test = list(CsvReader(test_csv, SPEC, 32, dialect, requires_grad=False))
            lines = test_csv.read_text().splitlines()
            filled_csv = root / "test-filled.csv"
            filled_csv.write_text(
                "\n".join([lines[0], *(_fill_age(line) for line in lines[1:])]) + "\n"
            )
            filled = list(CsvReader(filled_csv, SPEC, 32, dialect, requires_grad=False))
            scores, served = [], []
            with ctx.eval_ctx() as ev:
                for batches, out in ((test, scores), (filled, served)):
                    for prepared in ev.prepare(batches):
                        output, _ = ev.forward(prepared)
                        out.append(torch.sigmoid(output).numpy().ravel())
            model_dir = ctx.export_model(root / "model", pipeline=pipeline)
        yield Trained(
            shards,
            model_dir,
            checkpoint_dir,
            test_csv,
            raw_records(test_csv),
            test,
            np.concatenate(scores),
            np.concatenate(served),
        )


def _fill_age(line: str) -> str:
    """A test CSV line with an empty age (column 4) written as the training mean, 40."""
    fields = line.split(",")
    fields[4] = fields[4] or "40"
    return ",".join(fields)


@pytest.fixture
def infer(trained: Trained) -> Iterator[InferCtx]:
    with InferCtx(trained.model_dir, trained.shards.addresses) as ctx:
        yield ctx


def test_the_model_directory_holds_the_pipeline(trained: Trained) -> None:
    spec = load_model_spec(trained.model_dir)
    assert spec.pipeline == PIPELINE_FILE and (trained.model_dir / PIPELINE_FILE).is_file()
    assert spec.positive == "clicked" and spec.snapshot_id is not None
    assert spec.id_features == ("user", "city", "tags")
    doc = json.loads((trained.model_dir / "model.json").read_text())
    assert doc["format"] == "embeddb-model/1" and doc["pipeline"] == PIPELINE_FILE


def test_infer_ctx_scores_raw_records_as_evaluation_did(trained: Trained, infer: InferCtx) -> None:
    assert len(trained.records) == trained.eval_scores.size == 70
    assert float(np.std(trained.eval_scores)) > 0.05  # the model learned something
    assert infer.pipeline is not None
    got = infer.predict_records(trained.records)
    np.testing.assert_allclose(got, trained.served_scores, rtol=0, atol=1e-6)
    # only the records without an age score differently from the file's rows (whose empty
    # age training filled with 0, i.e. (0 - 40) / 12 after standardize)
    no_age = np.array(["age" not in r for r in trained.records])
    assert 0 < no_age.sum() < 70
    differs = np.abs(trained.served_scores - trained.eval_scores) > 1e-6
    assert differs.tolist() == no_age.tolist()
    # the pre-hashed form of the reader's batches (ids as strings) scores the same
    first = trained.test[0]
    hashed = infer.predict(infer.batch_from_hashed_records(hashed_records(first)))
    np.testing.assert_allclose(hashed, trained.eval_scores[:32], rtol=0, atol=1e-6)


def test_http_and_grpc_score_raw_records_as_evaluation_did(
    trained: Trained, infer: InferCtx
) -> None:
    server = build_model_server(infer, ModelServerConfig(http_port=0, max_delay=0.0))
    try:
        port = server.http_port
        assert port is not None
        code, doc = call_http(port, "/v1/predict", {"records": trained.records})
        assert code == 200, doc
        np.testing.assert_allclose(doc["scores"], trained.served_scores, rtol=0, atol=1e-6)
        body = {"hashed_records": hashed_records(trained.test[1])}
        code, doc = call_http(port, "/v1/predict", body)
        assert code == 200, doc
        np.testing.assert_allclose(doc["scores"], trained.eval_scores[32:64], rtol=0, atol=1e-6)
        with ModelClient(f"127.0.0.1:{server.port}") as client:
            got = client.predict_records(trained.records)
            np.testing.assert_allclose(got, trained.served_scores, rtol=0, atol=1e-6)
            bad = [trained.records[0], {**trained.records[1], "hours": "many"}]
            with pytest.raises(InvalidArgumentError, match="record 1") as caught:
                client.predict_records(bad)
            assert "hours" in str(caught.value)
        for column, value in (("price", "cheap"), ("tags", {"a": 1}), ("hours", [1.0, 2.0])):
            bad = [trained.records[0], trained.records[1], {**trained.records[2], column: value}]
            code, doc = call_http(port, "/v1/predict", {"records": bad})
            assert code == 400 and doc["status"] == "INVALID_ARGUMENT", doc
            assert "record 2" in doc["error"] and column in doc["error"], doc
        code, doc = call_http(port, "/v1/predict", {"records": ["user"]})
        assert code == 400 and "record 0" in doc["error"]
        code, doc = call_http(port, "/v1/predict", {"records": trained.records[:3]})
        assert code == 200 and len(doc["scores"]) == 3  # still serving
    finally:
        server.stop(grace=0)


def test_infer_ctx_from_checkpoint_reads_the_snapshot_read_only(
    trained: Trained, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    before = tree_digest(trained.checkpoint_dir)
    with InferCtx.from_checkpoint(trained.model_dir, trained.checkpoint_dir) as ctx:
        got = ctx.predict_records(trained.records)
        assert len(ctx.addresses) == 2
    np.testing.assert_allclose(got, trained.served_scores, rtol=0, atol=1e-6)
    assert tree_digest(trained.checkpoint_dir) == before  # nothing written, moved or removed
    # a model exported with another snapshot is served with a warning
    other = tmp_path / "other"
    other.mkdir()
    for p in trained.model_dir.iterdir():
        other.joinpath(p.name).write_bytes(p.read_bytes())
    doc = json.loads((other / "model.json").read_text())
    doc["snapshot_id"] = "ckpt-999"
    (other / "model.json").write_text(json.dumps(doc))
    with caplog.at_level(logging.WARNING, logger="embeddb.serving.infer"):
        InferCtx.from_checkpoint(other, trained.checkpoint_dir).close()
    assert "exported with snapshot ckpt-999" in caplog.text


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[StartServe]:
    yield from serve_processes(tmp_path)


def test_serve_model_from_checkpoint_scores_raw_records(
    trained: Trained, serve: StartServe
) -> None:
    before = tree_digest(trained.checkpoint_dir)
    model = serve(
        "--model",
        str(trained.model_dir),
        "--from-checkpoint",
        str(trained.checkpoint_dir),
        "--http-port",
        "0",
        command="serve-model",
    )
    port = model.ports["http"]
    assert isinstance(port, int)
    code, doc = call_http(port, "/v1/predict", {"records": trained.records})
    assert code == 200, doc
    np.testing.assert_allclose(doc["scores"], trained.served_scores, rtol=0, atol=1e-6)
    bad = [trained.records[0], {**trained.records[1], "price": "cheap"}]
    code, doc = call_http(port, "/v1/predict", {"records": bad})
    assert code == 400 and "record 1" in doc["error"] and "price" in doc["error"]
    model.stop()
    assert "raw records" in model.stderr()
    assert tree_digest(trained.checkpoint_dir) == before


class Context:
    """Shaped like TorchServe's ``ts.context.Context`` (the attributes a handler reads)."""

    def __init__(self, model_dir: Path) -> None:
        self.system_properties = {"model_dir": str(model_dir), "gpu_id": None, "batch_size": 4}


def test_the_torchserve_handler_reads_raw_records_by_default(
    trained: Trained, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model_dir = tmp_path / "archive"
    model_dir.mkdir()
    for p in trained.model_dir.iterdir():
        model_dir.joinpath(p.name).write_bytes(p.read_bytes())
    (model_dir / "serving.json").write_text(json.dumps({"addresses": trained.shards.addresses}))
    monkeypatch.delenv("EMBEDDB_ADDRESSES", raising=False)
    handler = EmbeddbHandler()
    handler.initialize(Context(model_dir))
    try:
        raw = trained.records
        requests = [
            {"body": json.dumps({"records": raw[:3]}).encode()},
            {"data": raw[3]},  # one raw record, already parsed
            {"body": {"hashed_records": hashed_records(trained.test[0])[4:6]}},
        ]
        out = handler.handle(requests, Context(model_dir))
        assert [len(r) for r in out] == [3, 1, 2]
        np.testing.assert_allclose(np.concatenate(out), trained.eval_scores[:6], atol=1e-6)
        bad = {"body": {"records": [raw[0], {**raw[1], "price": "cheap"}]}}
        with pytest.raises(InvalidArgumentError, match="request 1: record 1") as caught:
            handler.handle([requests[0], bad], Context(model_dir))
        assert "price" in str(caught.value)
    finally:
        handler.close()


def test_export_refuses_a_pipeline_that_is_not_the_models(trained: Trained, tmp_path: Path) -> None:
    config = EmbeddingConfig.from_yaml_text(CONFIG)
    example = trained.test[0]
    other = FeaturePipeline(
        ColumnSpec(ids=(IDColumn("city"), IDColumn("user"), IDColumn("tags")), numeric=SPEC.numeric)
    )
    with pytest.raises(InvalidArgumentError, match="ID features"):
        export_model(
            Model(), tmp_path / "m", embedding_config=config, example=example, pipeline=other
        )
    narrow = FeaturePipeline(ColumnSpec(ids=SPEC.ids, numeric=SPEC.numeric[:1]))
    with pytest.raises(InvalidArgumentError, match="non-ID features"):
        export_model(
            Model(), tmp_path / "m", embedding_config=config, example=example, pipeline=narrow
        )
    assert not (tmp_path / "m").exists()
    # a model directory whose pipeline disagrees with model.json is refused on load
    broken = tmp_path / "broken"
    broken.mkdir()
    for p in trained.model_dir.iterdir():
        broken.joinpath(p.name).write_bytes(p.read_bytes())
    save_pipeline(narrow, broken / PIPELINE_FILE)
    with pytest.raises(CorruptDataError, match="non-ID features"):
        InferCtx(broken, trained.shards.addresses)
