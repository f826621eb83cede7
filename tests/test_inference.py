"""Online inference: export (script and trace), InferCtx against real shards (equal to EvalCtx,
no rows inserted, unknown ids, bad records, broken model directories, threads), the TorchServe
handler with a TorchServe-shaped context, and the job's export_dir."""

from __future__ import annotations

import importlib.util
import json
import logging
import shutil
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from embeddb.config import EmbeddingConfig
from embeddb.errors import ConfigError, CorruptDataError, InvalidArgumentError, NotFoundError
from embeddb.serving import InferCtx, export_model, load_model_spec
from embeddb.serving.infer import load_dense
from embeddb.serving.torchserve import EmbeddbHandler
from embeddb.trainer import (
    Batch,
    EmbeddingWorkerConfig,
    IDTypeFeature,
    NonIDTypeFeature,
    TrainCtx,
    TrainerConfig,
)
from embeddb.trainer.launcher.job import JobConfig
from tests.trainer_harness import Shards, adult, adult_config, adult_model, serve_shards

ROOT = Path(__file__).resolve().parents[1]
FAST = TrainerConfig(
    device="cpu", worker=EmbeddingWorkerConfig(max_staleness=2, retries=1, shard_timeout=5.0)
)
ROWS = 64


def example_model(name: str, cls: str, **kwargs: Any) -> nn.Module:
    path = ROOT / "examples" / name / "model.py"
    spec = importlib.util.spec_from_file_location(f"example_{name}_model", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    torch.manual_seed(0)
    model: nn.Module = getattr(module, cls)(**kwargs)
    return model


def records_of(batch: Batch) -> list[dict[str, Any]]:
    dense = batch.non_id_type_features[0].data
    return [
        {
            "ids": {f.name: int(f.values[i]) for f in batch.id_type_features},
            "non_id": {"numeric": dense[i].tolist()},
        }
        for i in range(batch.batch_size)
    ]


@dataclass
class Trained:
    shards: Shards
    model: nn.Module
    model_dir: Path
    test: Batch  # ROWS test rows
    eval_scores: np.ndarray  # EvalCtx's sigmoid on ``test``


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Trained]:
    """Two shards, the harness model trained 20 steps on Adult, exported, scored by EvalCtx."""
    model_dir = tmp_path_factory.mktemp("model") / "adult"
    with serve_shards(adult_config(), None, 2) as shards:
        torch.manual_seed(0)
        model = adult_model()
        optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
        loss_fn = nn.BCEWithLogitsLoss()
        test = next(adult("test").batches(ROWS, requires_grad=False))
        with TrainCtx(model, optimizer, adult_config(), shards.addresses, FAST) as ctx:
            batches = adult("train").batches(256)
            for _, prepared in zip(range(20), ctx.prepare(batches), strict=False):
                output, labels = ctx.forward(prepared)
                ctx.backward(loss_fn(output, labels[0]))
            ctx.export_model(model_dir, positive="income >50K")
            with ctx.eval_ctx() as ev:
                (prepared,) = list(ev.prepare([test]))
                output, _ = ev.forward(prepared)
        yield Trained(shards, model, model_dir, test, torch.sigmoid(output).numpy().ravel())


@pytest.fixture
def infer(trained: Trained) -> Iterator[InferCtx]:
    with InferCtx(trained.model_dir, trained.shards.addresses) as ctx:
        yield ctx


def total_rows(shards: Shards) -> int:
    return sum(int(s.stats().totals()["rows"]) for s in shards.shards)


# ---------------------------------------------------------------------- export
def random_inputs(dims: list[int], non_id: list[tuple[int, ...]], n: int = 7) -> tuple[Any, Any]:
    gen = torch.Generator().manual_seed(1)
    return (
        [torch.randn(n, *s, generator=gen) for s in non_id],
        [torch.randn(n, d, generator=gen) for d in dims],
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "make", "how"),
    [
        ("harness", lambda: adult_model(), "trace"),  # [*a, *b] and list[Any]: not scriptable
        (
            "adult",
            lambda: example_model("adult", "AdultModel", num_features=11, numeric=5),
            "script",
        ),
    ],
)
def test_export_round_trip_equals_the_eager_model(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, name: str, make: Any, how: str
) -> None:
    model = make().eval()
    example = next(adult("train").batches(32))
    with caplog.at_level(logging.INFO, logger="embeddb.trainer.export"):
        out = export_model(
            model,
            tmp_path / name,
            embedding_config=adult_config(),
            example=example,
            snapshot_id="s1",
        )
    assert f"exported the model ({how})" in caplog.text
    assert sorted(p.name for p in out.iterdir()) == ["dense.pt", "embedding.yaml", "model.json"]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no staging left
    spec = load_model_spec(out)
    assert spec.id_features == tuple(adult_config().features)
    assert [(s.name, s.shape) for s in spec.non_id] == [("numeric", (5,))]
    assert spec.snapshot_id == "s1" and spec.output == "logit" and spec.torch == torch.__version__
    doc = json.loads((out / "model.json").read_text())
    assert doc["format"] == "embeddb-model/1"
    assert EmbeddingConfig.from_yaml(out / "embedding.yaml") == adult_config()
    dense = load_dense(out, torch.device("cpu"))
    non_id, embeddings = random_inputs([8] * 11, [(5,)])
    with torch.no_grad():
        np.testing.assert_allclose(
            dense(non_id, embeddings).numpy(),
            model(non_id, embeddings).numpy(),
            rtol=1e-5,
            atol=1e-6,
        )


@pytest.mark.slow
@pytest.mark.parametrize(
    ("example", "cls", "kwargs", "numeric"),
    [
        ("criteo", "CriteoModel", {}, 13),
        ("movielens", "MovieLensModel", {}, 4),
    ],
)
def test_the_examples_models_export(
    tmp_path: Path, example: str, cls: str, kwargs: dict[str, Any], numeric: int
) -> None:
    config = EmbeddingConfig.from_yaml(ROOT / "examples" / example / "embedding.yaml")
    model = example_model(example, cls, **kwargs).eval()
    out = export_model(
        model,
        tmp_path / example,
        embedding_config=config,
        example=None,
        non_id_shapes={"dense": [numeric]},
    )
    dense = load_dense(out, torch.device("cpu"))
    dims = [f.dim for f in config.features.values()]
    non_id, embeddings = random_inputs(dims, [(numeric,)])
    with torch.no_grad():
        np.testing.assert_allclose(
            dense(non_id, embeddings).numpy(),
            model(non_id, embeddings).numpy(),
            rtol=1e-4,
            atol=1e-5,
        )


@pytest.mark.slow
def test_export_refuses_to_overwrite_a_model_unless_asked(tmp_path: Path) -> None:
    model, example = adult_model(), next(adult("train").batches(8))
    target = tmp_path / "m"
    export_model(model, target, embedding_config=adult_config(), example=example, snapshot_id="a")
    with pytest.raises(InvalidArgumentError, match="already holds an exported model"):
        export_model(model, target, embedding_config=adult_config(), example=example)
    assert load_model_spec(target).snapshot_id == "a"
    export_model(
        model,
        target,
        embedding_config=adult_config(),
        example=example,
        snapshot_id="b",
        overwrite=True,
    )
    assert load_model_spec(target).snapshot_id == "b"
    assert [p.name for p in tmp_path.iterdir()] == ["m"]
    with pytest.raises(InvalidArgumentError, match="example batch or non_id_shapes"):
        export_model(model, tmp_path / "n", embedding_config=adult_config(), example=None)


def test_export_refuses_a_model_with_the_wrong_output(tmp_path: Path) -> None:
    class TwoOutputs(nn.Module):
        def forward(
            self, non_id: list[torch.Tensor], embeddings: list[torch.Tensor]
        ) -> torch.Tensor:
            return non_id[0][:, :2]

    with pytest.raises(InvalidArgumentError, match=r"\(n, 1\) logits"):
        export_model(
            TwoOutputs(),
            tmp_path / "m",
            embedding_config=adult_config(),
            example=next(adult("train").batches(8)),
        )
    assert not (tmp_path / "m").exists()


# ---------------------------------------------------------------------- InferCtx
@pytest.mark.slow
def test_infer_equals_eval_ctx_on_the_same_batch(trained: Trained, infer: InferCtx) -> None:
    scores = infer.predict(trained.test)
    assert scores.dtype == np.float32 and scores.shape == (ROWS,)
    np.testing.assert_allclose(scores, trained.eval_scores, rtol=1e-5, atol=1e-6)
    assert 0.0 < scores.min() < scores.max() < 1.0  # a trained model, not a constant
    from_records = infer.predict(infer.batch_from_records(records_of(trained.test)))
    np.testing.assert_allclose(from_records, scores, rtol=1e-6, atol=1e-7)
    assert infer.spec.positive == "income >50K"
    assert infer.predictions == 2 * ROWS


@pytest.mark.slow
def test_predictions_insert_no_rows_and_unknown_ids_read_as_zeros(
    trained: Trained, infer: InferCtx
) -> None:
    before = total_rows(trained.shards)
    assert before > 0
    rng = np.random.default_rng(5)
    features = infer.embedding_config.features
    # hash-stacked features map any id into a small space of trained rows: not unknown
    plain = [n for n in infer.spec.id_features if features[n].hash_stack_rounds <= 1]
    assert len(plain) == 10
    unknown = [
        {
            "ids": {name: int(rng.integers(1 << 40, 1 << 50)) for name in plain},
            "non_id": {"numeric": [0.3, 0.5, 0.1, 0.0, 0.4]},
        }
        for _ in range(3)
    ]
    got = infer.predict(infer.batch_from_records(unknown))
    assert total_rows(trained.shards) == before  # evaluation lookups create nothing
    no_ids = [{"non_id": r["non_id"]} for r in unknown]  # every ID feature empty
    np.testing.assert_allclose(infer.predict(infer.batch_from_records(no_ids)), got, rtol=1e-6)
    non_id = [torch.tensor([[0.3, 0.5, 0.1, 0.0, 0.4]] * 3)]
    zeros = [torch.zeros(3, 8) for _ in infer.spec.id_features]
    with torch.no_grad():
        expected = torch.sigmoid(trained.model(non_id, zeros)).numpy().ravel()
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
    assert total_rows(trained.shards) == before


@pytest.mark.slow
def test_ragged_and_missing_id_features(infer: InferCtx, trained: Trained) -> None:
    rec = records_of(trained.test)[:2]
    rec[0]["ids"]["workclass"] = [rec[0]["ids"]["workclass"], rec[1]["ids"]["workclass"]]
    del rec[1]["ids"]["education"]
    batch = infer.batch_from_records(rec)
    workclass = batch.feature("workclass")
    assert workclass.offsets.tolist() == [0, 2, 3] and not workclass.single_id
    assert batch.feature("education").offsets.tolist() == [0, 1, 1]
    assert np.isfinite(infer.predict(batch)).all()


GOOD = {"ids": {"workclass": 1}, "non_id": {"numeric": [0.1, 0.2, 0.3, 0.4, 0.5]}}


@pytest.mark.slow
@pytest.mark.parametrize(
    ("records", "message"),
    [
        ("abc", "records must be a list of records, got str"),
        ([], "records is empty"),
        ([GOOD, 3], "record 1 must be an object, got int"),
        ([{**GOOD, "label": 1}], r"record 0 has unknown keys \['label'\]"),
        ([{**GOOD, "ids": [1]}], "record 0: 'ids' must be an object"),
        ([{**GOOD, "ids": {"nope": 1}}], "record 0: ids.nope: the model reads no such ID feature"),
        ([GOOD, {**GOOD, "ids": {"workclass": -1}}], r"record 1: ids.workclass: -1 is not an id"),
        ([{**GOOD, "ids": {"workclass": 1 << 64}}], "record 0: ids.workclass: .* is not an id"),
        ([{**GOOD, "ids": {"workclass": 1.5}}], "record 0: ids.workclass: must be an id or a"),
        ([{**GOOD, "ids": {"workclass": True}}], "record 0: ids.workclass: must be an id or a"),
        ([{**GOOD, "ids": {"workclass": "x7"}}], "record 0: ids.workclass: 'x7' is not an id"),
        ([{**GOOD, "ids": {"workclass": str(1 << 64)}}], "record 0: ids.workclass: .* not an id"),
        ([{**GOOD, "ids": {"workclass": [True, 1]}}], "record 0: ids.workclass: must be a flat"),
        ([{**GOOD, "ids": {"workclass": ["1", "-2"]}}], "record 0: ids.workclass: must be a flat"),
        (
            [{**GOOD, "ids": {"workclass": [1, "x"]}}],
            "record 0: ids.workclass: must be a flat list",
        ),
        ([{**GOOD, "ids": {"workclass": [1, -2]}}], "record 0: ids.workclass: must be a flat list"),
        ([{**GOOD, "ids": {"workclass": [[1]]}}], "record 0: ids.workclass: must be a flat list"),
        ([GOOD, {"ids": {}}], "record 1: non_id.numeric is missing"),
        (
            [{**GOOD, "non_id": {"numeric": [1] * 5, "x": 1}}],
            "record 0: non_id.x: the model reads no",
        ),
        (
            [GOOD, GOOD, {**GOOD, "non_id": {"numeric": [1, 2]}}],
            r"record 2: non_id.numeric: must have shape \[5\], got \[2\]",
        ),
        (
            [GOOD, {**GOOD, "non_id": {"numeric": [1, 2, "a", 4, 5]}}],
            "record 1: non_id.numeric: must be numbers",
        ),
        (
            [{**GOOD, "non_id": {"numeric": 3.0}}],
            r"record 0: non_id.numeric: must have shape \[5\], got \[\]",
        ),
        (
            [{**GOOD, "non_id": {"numeric": [1, 2, float("nan"), 4, 5]}}],
            "record 0: non_id.numeric: must be finite",
        ),
        ([{**GOOD, "non_id": "x"}], "record 0: 'non_id' must be an object"),
    ],
)
def test_bad_records_raise_precise_errors(infer: InferCtx, records: Any, message: str) -> None:
    with pytest.raises(InvalidArgumentError, match=message):
        infer.batch_from_records(records)


@pytest.mark.slow
def test_predict_checks_the_batch_against_the_model(infer: InferCtx, trained: Trained) -> None:
    ids = list(trained.test.id_type_features)
    with pytest.raises(InvalidArgumentError, match="the model reads no ID feature 'other'"):
        infer.predict(Batch([IDTypeFeature("other", [[1]] * ROWS)], requires_grad=False))
    with pytest.raises(InvalidArgumentError, match=r"must have shape \(64, 5\), got \(64, 4\)"):
        infer.predict(
            Batch(ids, [NonIDTypeFeature(np.zeros((ROWS, 4), np.float32))], requires_grad=False)
        )
    with pytest.raises(InvalidArgumentError, match="1 non-ID features"):
        infer.predict(Batch(ids, requires_grad=False))


def copy_model(trained: Trained, tmp_path: Path) -> Path:
    out = tmp_path / "copy"
    shutil.copytree(trained.model_dir, out)
    return out


@pytest.mark.slow
@pytest.mark.parametrize(
    ("damage", "error", "message"),
    [
        (lambda d: (d / "model.json").unlink(), NotFoundError, "model.json does not exist"),
        (lambda d: (d / "model.json").write_text("{"), CorruptDataError, "not valid JSON"),
        (
            lambda d: (d / "model.json").write_text('{"format": "other/9"}'),
            CorruptDataError,
            "format must be 'embeddb-model/1'",
        ),
        (
            lambda d: (d / "model.json").write_text(
                json.dumps({**json.loads((d / "model.json").read_text()), "id_features": "x"})
            ),
            CorruptDataError,
            "id_features must be a list",
        ),
        (lambda d: (d / "dense.pt").unlink(), NotFoundError, "dense.pt does not exist"),
        (
            lambda d: (d / "dense.pt").write_bytes(b"not a zip"),
            CorruptDataError,
            "not a TorchScript",
        ),
        (lambda d: (d / "embedding.yaml").unlink(), NotFoundError, "embedding.yaml does not exist"),
        (lambda d: shutil.rmtree(d), NotFoundError, "does not exist"),
    ],
)
def test_broken_model_directories_raise_clear_errors(
    trained: Trained, tmp_path: Path, damage: Any, error: type, message: str
) -> None:
    model_dir = copy_model(trained, tmp_path)
    damage(model_dir)
    with pytest.raises(error, match=message):
        InferCtx(model_dir, trained.shards.addresses)


@pytest.mark.slow
def test_shards_without_the_models_tables_are_refused(trained: Trained, tmp_path: Path) -> None:
    with (
        serve_shards(EmbeddingConfig.single_table("other", 8), None) as other,
        pytest.raises(ConfigError, match="the shards serve no table"),
    ):
        InferCtx(trained.model_dir, other.addresses)


@pytest.mark.slow
def test_concurrent_predictions_equal_sequential_ones(trained: Trained, infer: InferCtx) -> None:
    rows = records_of(next(adult("test").batches(256, requires_grad=False)))
    batches = [infer.batch_from_records(rows[i : i + 16]) for i in range(0, 256, 16)]
    sequential = [infer.predict(b) for b in batches]
    with ThreadPoolExecutor(8) as pool:
        for _ in range(3):
            concurrent = list(pool.map(infer.predict, batches))
            for got, want in zip(concurrent, sequential, strict=True):
                np.testing.assert_array_equal(got, want)


# ---------------------------------------------------------------------- TorchServe
class Context:
    """Shaped like TorchServe's ``ts.context.Context`` (the attributes a handler reads)."""

    def __init__(self, model_dir: Path) -> None:
        self.system_properties = {"model_dir": str(model_dir), "gpu_id": None, "batch_size": 4}
        self.manifest = {"model": {"modelName": "adult", "handler": "torchserve.py"}}


@pytest.mark.slow
def test_the_torchserve_handler_scores_each_request(
    trained: Trained, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model_dir = copy_model(trained, tmp_path)
    (model_dir / "serving.json").write_text(json.dumps({"addresses": trained.shards.addresses}))
    monkeypatch.delenv("EMBEDDB_ADDRESSES", raising=False)
    rows = records_of(trained.test)
    handler = EmbeddbHandler()
    handler.initialize(Context(model_dir))
    try:
        requests = [
            {"body": json.dumps({"records": rows[:3]}).encode()},
            {"data": rows[3]},  # one record, already parsed
            {"body": {"records": rows[4:6]}},
        ]
        out = handler.handle(requests, Context(model_dir))
        assert [len(r) for r in out] == [3, 1, 2]
        np.testing.assert_allclose(
            np.concatenate(out), trained.eval_scores[:6], rtol=1e-5, atol=1e-6
        )
        with pytest.raises(InvalidArgumentError, match="request 0: the body is not valid JSON"):
            handler.handle([{"body": b"{"}], Context(model_dir))
    finally:
        handler.close()


@pytest.mark.slow
def test_the_torchserve_handler_reads_addresses_from_the_environment(
    trained: Trained, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model_dir = copy_model(trained, tmp_path)
    handler = EmbeddbHandler()
    monkeypatch.delenv("EMBEDDB_ADDRESSES", raising=False)
    with pytest.raises(ConfigError, match="no shard addresses"):
        handler.initialize(Context(model_dir))
    monkeypatch.setenv("EMBEDDB_ADDRESSES", ",".join(trained.shards.addresses))
    out = handler.handle([{"body": records_of(trained.test)[0]}], Context(model_dir))
    handler.close()
    np.testing.assert_allclose(out, [[trained.eval_scores[0]]], rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------------- the job
@pytest.mark.slow
def test_train_ctx_export_needs_an_example_and_the_job_resolves_export_dir(
    tmp_path: Path,
) -> None:
    with serve_shards(adult_config(), None) as shards:
        model = adult_model()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        with TrainCtx(model, optimizer, adult_config(), shards.addresses, FAST) as ctx:
            with pytest.raises(InvalidArgumentError, match="needs an example batch"):
                ctx.export_model(tmp_path / "m")
            out = ctx.export_model(tmp_path / "m", example=next(adult("train").batches(4)))
            assert load_model_spec(out).snapshot_id is None
    job = tmp_path / "job.yaml"
    job.write_text("model: model.py:M\nexport_dir: out/model\n")
    assert JobConfig.from_yaml(job).export_dir == (tmp_path / "out" / "model").resolve()
