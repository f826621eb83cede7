"""The built-in models (``model: builtin:NAME``): shapes, gradients to every embedding,
TorchScript export, learning a separable problem on the CPU, and their config errors."""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from embeddb.config import EmbeddingConfig
from embeddb.errors import ConfigError
from embeddb.serving import export_model
from embeddb.trainer import BUILTIN_MODELS, auc, build_model
from embeddb.trainer.export import quiet_jit

IDS = ("user", "item", "city")
DIM = 8
WIDTHS = (1, 2)  # non-ID features: price (n, 1), position (n, 2)


def inputs(
    n: int, widths: Sequence[int] = WIDTHS, dims: Sequence[int] = (DIM,) * len(IDS)
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    generator = torch.Generator().manual_seed(n)
    non_id = [torch.randn(n, w, generator=generator) for w in widths]
    embeddings = [torch.randn(n, d, generator=generator, requires_grad=True) for d in dims]
    return non_id, embeddings


@pytest.mark.parametrize("name", BUILTIN_MODELS)
@pytest.mark.parametrize("widths", [WIDTHS, ()], ids=["numeric", "ids-only"])
def test_each_model_returns_one_logit_per_row_and_trains_every_embedding(
    name: str, widths: tuple[int, ...]
) -> None:
    torch.manual_seed(0)
    model = build_model(name, id_dims=[DIM] * len(IDS), non_id_widths=widths)
    non_id, embeddings = inputs(16, widths)
    output = model(non_id, embeddings)
    assert output.shape == (16, 1) and output.dtype == torch.float32
    output.square().sum().backward()
    for feature, e in zip(IDS, embeddings, strict=True):
        assert e.grad is not None and bool(e.grad.abs().sum() > 0), feature
    one_row = model([x[:1] for x in non_id], [e[:1].detach() for e in embeddings])
    assert one_row.shape == (1, 1)  # a last batch of one row trains too (BatchNorm)


@pytest.mark.parametrize("name", BUILTIN_MODELS)
def test_each_model_is_scripted_by_the_exporter(
    name: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    torch.manual_seed(0)
    model = build_model(name, id_dims=[DIM] * len(IDS), non_id_widths=WIDTHS, **_small(name))
    model(*inputs(32))  # a training step's forward moves the BatchNorm statistics
    config = EmbeddingConfig.from_yaml_text(
        "slots_config:\n" + "".join(f"  {f}: {{dim: {DIM}}}\n" for f in IDS)
    )
    caplog.set_level(logging.INFO, logger="embeddb.trainer.export")
    directory = export_model(
        model,
        tmp_path / name,
        embedding_config=config,
        example=None,
        non_id_shapes={"price": (1,), "position": (2,)},
    )
    assert any("exported the model (script)" in r.getMessage() for r in caplog.records)
    with quiet_jit():
        loaded = torch.jit.load(str(directory / "dense.pt"))  # type: ignore[no-untyped-call]
    non_id, embeddings = inputs(8)
    embeddings = [e.detach() for e in embeddings]
    model.eval()
    with torch.no_grad():
        torch.testing.assert_close(loaded(non_id, embeddings), model(non_id, embeddings))


def _small(name: str) -> dict[str, list[int]]:
    return {"dlrm": {"top": [32, 16]}, "fm": {}}.get(name, {"hidden": [32, 16]})


class Separable:
    """Labels from a hidden linear score: one weight per id of each feature, plus numerics."""

    def __init__(self, vocabulary: int = 40, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        self.vocabulary = vocabulary
        self.weights = rng.normal(size=(len(IDS), vocabulary))
        self.rng = rng

    def sample(self, n: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        ids = self.rng.integers(0, self.vocabulary, size=(n, len(IDS)))
        numeric = self.rng.normal(size=(n, sum(WIDTHS)))
        score = self.weights[np.arange(len(IDS)), ids].sum(axis=1) + numeric[:, 0]
        labels = (score > 0).astype(np.float32).reshape(-1, 1)
        return (
            torch.from_numpy(ids),
            torch.from_numpy(numeric.astype(np.float32)),
            torch.from_numpy(labels),
        )


@pytest.mark.slow
@pytest.mark.parametrize("name", BUILTIN_MODELS)
def test_each_model_learns_a_separable_problem(name: str) -> None:
    torch.manual_seed(0)
    data = Separable()
    tables = [nn.Embedding(data.vocabulary, DIM) for _ in IDS]  # the "shards"
    for table in tables:
        nn.init.normal_(table.weight, std=0.05)
    model = build_model(name, id_dims=[DIM] * len(IDS), non_id_widths=WIDTHS, **_small(name))
    parameters = [*model.parameters(), *(t.weight for t in tables)]
    optimizer = torch.optim.Adam(parameters, lr=0.01)

    def forward(ids: torch.Tensor, numeric: torch.Tensor) -> torch.Tensor:
        non_id = [numeric[:, :1], numeric[:, 1:]]
        return model(non_id, [t(ids[:, k]) for k, t in enumerate(tables)])  # type: ignore[no-any-return]

    for _ in range(300):
        ids, numeric, labels = data.sample(256)
        loss = nn.functional.binary_cross_entropy_with_logits(forward(ids, numeric), labels)
        optimizer.zero_grad()
        loss.backward()  # type: ignore[no-untyped-call]
        optimizer.step()
    ids, numeric, labels = data.sample(4096)
    model.eval()
    with torch.no_grad():
        scores = forward(ids, numeric).numpy()
    assert auc(labels=labels.numpy(), scores=scores) > 0.9


def test_dnn_takes_different_embedding_dims_and_numerics_only() -> None:
    model = build_model("dnn", id_dims=[4, 16], non_id_widths=[3], hidden=[8], dropout=0.1)
    non_id, embeddings = inputs(5, (3,), (4, 16))
    assert model(non_id, embeddings).shape == (5, 1)
    numerics_only = build_model("builtin:dnn", id_dims=[], non_id_widths=[3])
    assert numerics_only(non_id, []).shape == (5, 1)


@pytest.mark.parametrize(
    ("name", "args", "key", "message"),
    [
        ("xgboost", {}, "model", "unknown builtin model 'xgboost' (dnn, fm, deepfm, dlrm)"),
        ("dnn", {"layers": [8]}, "model_args.layers", "accepts hidden, dropout"),
        ("dnn", {"hidden": [8, 0]}, "model_args.hidden", "list of positive integers"),
        ("dnn", {"hidden": "256"}, "model_args.hidden", "list of positive integers"),
        ("deepfm", {"dropout": 1.5}, "model_args.dropout", "a number in [0, 1)"),
        ("dlrm", {"top": [True]}, "model_args.top", "accepts bottom, top"),
        ("fm", {"hidden": [8]}, "model_args.hidden", "accepts no model_args"),
    ],
)
def test_bad_names_and_model_args_are_config_errors(
    name: str, args: dict[str, object], key: str, message: str
) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)) as info:
        build_model(name, id_dims=[DIM, DIM], non_id_widths=[1], **args)
    assert info.value.key == key


@pytest.mark.parametrize("name", ["fm", "deepfm", "dlrm"])
def test_models_with_interactions_need_one_embedding_dim(name: str) -> None:
    with pytest.raises(
        ConfigError, match=r"one embedding dim for every ID feature.*\[8, 4\]"
    ) as info:
        build_model(name, id_dims=[8, 4], non_id_widths=[1])
    assert info.value.key == "embedding_dim"


def test_a_model_needs_a_feature() -> None:
    with pytest.raises(ConfigError, match="at least one") as info:
        build_model("dnn", id_dims=[], non_id_widths=[])
    assert info.value.key == "model"
