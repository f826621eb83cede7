"""The model server's record path (issue 22), the same on HTTP, gRPC (ModelService) and the
TorchServe handler: missing numeric values are the training mean and unknown keys refused
unless the model was exported lenient (both counted in the server's metrics); non-finite
numbers and lone surrogates are 400 / INVALID_ARGUMENT naming the record and the field; a NaN
score is never answered; strings and records over their limits are refused before the body is
parsed; and every HTTP answer is one write on a TCP_NODELAY socket (keep-alive without the
delayed-ACK stall)."""

from __future__ import annotations

import http.client
import json
import re
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from embeddb.config import EmbeddingConfig
from embeddb.errors import InvalidArgumentError, ResourceExhaustedError
from embeddb.features import ColumnSpec, IDColumn, NumericColumn
from embeddb.features.pipeline import FeaturePipeline
from embeddb.serving import InferCtx, export_model, torchserve
from embeddb.serving import body as body_module
from embeddb.serving.client import ModelClient
from embeddb.serving.server import ModelServer, ModelServerConfig, build_model_server
from embeddb.serving.torchserve import BadRequestError, EmbeddbHandler
from embeddb.v1 import model_pb2 as mpb
from tests.trainer_harness import Shards, serve_shards

CONFIG = """
slots_config:
  user: {dim: 4}
  tags: {dim: 4}
defaults:
  optimizer: {type: adagrad, lr: 0.05}
  initializer: {type: normal, mean: 0.0, std: 0.5}
  capacity: 1000
"""
SPEC = ColumnSpec(
    ids=(IDColumn("user"), IDColumn("tags", separator="|")),
    numeric=(
        NumericColumn(("price",), name="price", standardize=((100.0, 10.0),)),
        NumericColumn(("age",), name="age", log1p=True),
    ),
)
PIPELINE = FeaturePipeline(SPEC, na_values=("NA",), means={"price": (100.0,), "age": (30.0,)})
FULL = {"user": "u1", "tags": "a|b", "price": 120.0, "age": 30}


class Model(nn.Module):
    """Linear, plus a term that is NaN when a standardized price overflows float32 inside
    the model (``x * 1e30 - x * 1e30`` for ``x`` near 1e10): finite inputs, a NaN score."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(2 + 8, 1)

    def forward(self, non_id: list[torch.Tensor], embeddings: list[torch.Tensor]) -> torch.Tensor:
        x = non_id[0]
        return self.lin(torch.cat(non_id + embeddings, dim=1)) + (x * 1e30 - x * 1e30)


@dataclass
class Models:
    shards: Shards
    strict: InferCtx
    lenient: InferCtx
    strict_dir: Path
    lenient_dir: Path


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Models]:
    root = tmp_path_factory.mktemp("limits")
    config = EmbeddingConfig.from_yaml_text(CONFIG)
    torch.manual_seed(0)
    model = Model()
    example = PIPELINE.batch_from_records([FULL] * 4)
    with serve_shards(config, None, 1) as shards:
        for name, lenient in (("strict", False), ("lenient", True)):
            export_model(
                model,
                root / name,
                embedding_config=config,
                example=example,
                pipeline=PIPELINE,
                lenient_records=lenient,
            )
        with (
            InferCtx(root / "strict", shards.addresses) as strict,
            InferCtx(root / "lenient", shards.addresses) as lenient,
        ):
            yield Models(shards, strict, lenient, root / "strict", root / "lenient")


@pytest.fixture
def start(models: Models) -> Iterator[Any]:
    servers: list[ModelServer] = []

    def build(infer: InferCtx | None = None, **config: Any) -> ModelServer:
        server = build_model_server(
            infer or models.strict, ModelServerConfig(http_port=0, max_delay=0.0, **config)
        )
        servers.append(server)
        return server

    yield build
    for server in servers:
        server.stop(grace=0)


class Context:
    """Shaped like TorchServe's ``ts.context.Context`` (what the handler reads)."""

    def __init__(self, model_dir: Path) -> None:
        self.system_properties = {"model_dir": str(model_dir), "gpu_id": None, "batch_size": 4}


@pytest.fixture
def handler(models: Models, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A TorchServe handler (the plain interface, in this process) per model kind; serving.json
    may set limits."""
    handlers: list[EmbeddbHandler] = []
    monkeypatch.delenv("EMBEDDB_ADDRESSES", raising=False)

    def make(lenient: bool = False, **limits: int) -> EmbeddbHandler:
        source = models.lenient_dir if lenient else models.strict_dir
        target = tmp_path / f"archive-{len(handlers)}"
        target.mkdir()
        for p in source.iterdir():
            target.joinpath(p.name).write_bytes(p.read_bytes())
        settings = {"addresses": models.shards.addresses, **limits}
        (target / "serving.json").write_text(json.dumps(settings))
        made = EmbeddbHandler()
        made.initialize(Context(target))
        handlers.append(made)
        return made

    yield make
    for made in handlers:
        made.close()


def post(port: int, body: bytes) -> tuple[int, dict[str, Any]]:
    """POST /v1/predict; the answer parsed as strict JSON (no NaN or Infinity literal)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        conn.request("POST", "/v1/predict", body, {"Content-Type": "application/json"})
        response = conn.getresponse()
        return response.status, json.loads(response.read(), parse_constant=_no_constant)
    finally:
        conn.close()


def _no_constant(name: str) -> object:
    raise AssertionError(f"the body holds {name}")


def records_body(*records: object) -> bytes:
    return json.dumps({"records": list(records)}).encode()


def grpc_json(server: ModelServer, text: bytes) -> np.ndarray:
    """Predict with ``records_json`` bytes as given (1e999, escapes and all)."""
    n = len(json.loads(text))
    with ModelClient(f"127.0.0.1:{server.port}") as client:
        return client.predict_request(mpb.PredictRequest(num_records=n, records_json=text))


def sample(server: ModelServer, name: str, **labels: str) -> float:
    return server.registry.get_sample_value(name, labels or None) or 0.0


# ------------------------------------------------------------ missing values, unknown keys
@pytest.mark.slow
def test_missing_values_and_unknown_keys_answer_alike_on_every_frontend(
    models: Models, start: Any, handler: Any
) -> None:
    server = start()
    mean = {**FULL, "price": 100.0, "age": 30}
    missing = {"user": "u1", "tags": "a|b", "age": "NA"}  # no price; age a marker
    (want,) = models.strict.predict_records([mean]).tolist()
    zero = models.strict.predict_records([{**FULL, "price": 0.0, "age": 0}])[0]
    assert abs(want - zero) > 1e-3  # filling with 0 (the old behaviour) would show
    code, doc = post(server.http_port, records_body(missing, FULL))
    assert code == 200 and doc["scores"][0] == pytest.approx(want, abs=1e-7), doc
    assert grpc_json(server, json.dumps([missing]).encode()).tolist() == pytest.approx([want])
    ts = handler()
    assert ts.handle([{"body": records_body(missing)}], None)[0] == pytest.approx([want])
    assert sample(server, "embeddb_model_record_missing_filled_total") == 4  # 2 per request

    misspelt = {**FULL, "pirce": 3.0}
    code, doc = post(server.http_port, records_body(FULL, misspelt))
    assert code == 400 and doc["status"] == "INVALID_ARGUMENT"
    assert doc["error"].startswith("record 1: unknown key 'pirce' (did you mean 'price'?)")
    with pytest.raises(InvalidArgumentError, match=r"record 0: unknown key 'pirce'"):
        grpc_json(server, json.dumps([misspelt]).encode())
    with pytest.raises(BadRequestError, match=r"request 0: record 0: unknown key 'pirce'") as bad:
        ts.handle([{"body": records_body(misspelt)}], None)
    assert bad.value.error_code == 400
    assert sample(server, "embeddb_model_record_unknown_keys_total") == 2
    assert (
        sample(server, "embeddb_model_bad_requests_total", method="POST", reason="invalid_argument")
        == 1
    )

    lenient = start(models.lenient)
    (plain,) = models.lenient.predict_records([FULL]).tolist()
    code, doc = post(lenient.http_port, records_body(misspelt))
    assert code == 200 and doc["scores"] == pytest.approx([plain], abs=1e-7)
    assert grpc_json(lenient, json.dumps([misspelt]).encode()).tolist() == pytest.approx([plain])
    assert handler(lenient=True).handle([{"body": records_body(misspelt)}], None)[0] == (
        pytest.approx([plain])
    )
    assert sample(lenient, "embeddb_model_record_unknown_keys_total") == 2


# ----------------------------------------------------- non-finite inputs, surrogates, NaN
@pytest.mark.parametrize(
    ("raw", "match"),
    [
        (b'{"user": "u1", "price": 1e999}', r"record 1: column 'price': inf is not a finite"),
        (b'{"user": "u1", "age": -1e999}', r"record 1: column 'age': -inf is not a finite"),
        (
            b'{"user": "u1", "price": ' + b"9" * 4000 + b"}",
            r"record 1: column 'price': 9{20}\.\.\.\(4000 digits\) is not a finite",
        ),
        (b'{"user": "\\ud800"}', r"record 1: column 'user': the string holds a lone surrogate"),
        (b'{"user": "u", "tags": "a|\\udfff"}', r"record 1: column 'tags': the string holds"),
    ],
)
def test_non_finite_numbers_and_lone_surrogates_are_400_everywhere(
    start: Any, handler: Any, raw: bytes, match: str
) -> None:
    server = start()
    records = b"[" + json.dumps(FULL).encode() + b", " + raw + b"]"
    code, doc = post(server.http_port, b'{"records": ' + records + b"}")
    assert code == 400 and doc["status"] == "INVALID_ARGUMENT", doc
    assert re.search(match, doc["error"]), doc
    with pytest.raises(InvalidArgumentError, match=match):
        grpc_json(server, records)
    with pytest.raises(BadRequestError, match=f"request 0: {match}"):
        handler().handle([{"body": b'{"records": ' + records + b"}"}], None)
    assert sample(server, "embeddb_model_requests_total", method="http_predict", status="OK") == 0
    code, doc = post(server.http_port, records_body(FULL))  # still serving
    assert code == 200 and len(doc["scores"]) == 1


def test_a_nan_score_is_never_answered(start: Any, handler: Any) -> None:
    server = start()
    huge = {**FULL, "price": 1e11}  # finite; the model's x * 1e30 overflows to inf - inf
    code, doc = post(server.http_port, records_body(FULL, huge))
    assert code == 400 and doc["status"] == "INVALID_ARGUMENT", doc
    assert doc["error"].startswith("record 1: the model's score is NaN")
    hashed = {"ids": {"user": 1}, "non_id": {"price": 1e10, "age": 0.0}}
    code, doc = post(server.http_port, json.dumps({"hashed_records": [hashed]}).encode())
    assert code == 400 and doc["error"].startswith("record 0: the model's score is NaN"), doc
    with pytest.raises(InvalidArgumentError, match=r"record 0: the model's score is NaN"):
        grpc_json(server, json.dumps([huge]).encode())
    # pre-hashed inputs out of float32's range are refused before the model runs
    for value in (b"1e999", b"1e300", b"9" * 400):
        raw = b'{"hashed_records": [{"ids": {}, "non_id": {"price": %s, "age": 0}}]}' % value
        code, doc = post(server.http_port, raw)
        assert code == 400 and doc["error"].startswith(
            "record 0: non_id.price: must be finite numbers within float32's range"
        ), doc
    with pytest.raises(BadRequestError, match=r"request 1: record 0: the model's score is NaN"):
        handler().handle([{"body": records_body(FULL)}, {"body": records_body(huge)}], None)


# -------------------------------------------------------------------- limits before parsing
def test_strings_and_records_over_their_limits_are_refused_before_parsing(
    start: Any, handler: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = start(max_string_bytes=64, max_record_bytes=512, max_body_bytes=4096)
    ts = handler(max_string_bytes=64, max_record_bytes=512)
    long_id = {**FULL, "user": "u" * 100}
    big = {**FULL, "tags": ["tag"] * 150}  # short strings, one long record
    assert len(json.dumps(big)) > 512
    code, doc = post(server.http_port, records_body(FULL, long_id))  # parses when small
    assert code == 413 and doc["status"] == "RESOURCE_EXHAUSTED"
    assert doc["error"] == (
        "record 1: 'user': a string of 100 bytes, longer than this server accepts "
        "(max_string_bytes 64)"
    )

    with pytest.raises(BadRequestError, match=r"request 0: record 0 is \d+ bytes") as caught:
        ts.handle([{"body": json.dumps(big).encode()}], None)  # one record: checked once parsed
    assert caught.value.error_code == 400  # TorchServe's frontend answers a 413 as 507

    def never(body: bytes) -> object:
        raise AssertionError("a body over a limit was parsed")

    monkeypatch.setattr(body_module, "loads", never)
    monkeypatch.setattr(torchserve, "loads", never)
    code, doc = post(server.http_port, records_body(FULL, FULL, long_id))
    assert code == 413 and "record 2: 'user': a string of 100 bytes" in doc["error"], doc
    code, doc = post(server.http_port, records_body(FULL, big.copy()))
    assert code == 413 and doc["error"].startswith("record 1 is "), doc
    assert doc["error"].endswith(
        "bytes of JSON, more than this server accepts (max_record_bytes 512)"
    )
    code, doc = post(server.http_port, records_body(*[FULL] * 80))
    assert code == 413 and "(max_body_bytes 4096)" in doc["error"], doc
    assert (
        sample(server, "embeddb_model_bad_requests_total", method="POST", reason="too_large") == 4
    )
    with pytest.raises(ResourceExhaustedError, match=r"record 1: 'user': a string of 100 bytes"):
        grpc_json(server, json.dumps([FULL, long_id]).encode())
    with pytest.raises(ResourceExhaustedError, match=r"record 1 is \d+ bytes of JSON"):
        grpc_json(server, json.dumps([FULL, big]).encode())
    with pytest.raises(
        BadRequestError, match=r"request 0: record 0: 'user': a string of 100"
    ) as caught:
        ts.handle([{"body": records_body(long_id)}], None)
    assert caught.value.error_code == 400  # TorchServe's frontend answers a 413 as 507
    with pytest.raises(BadRequestError, match=r"request 0: record 0: 'user': a string of 100"):
        ts.handle([{"body": json.loads(records_body(long_id))}], None)  # parsed by TorchServe
    with pytest.raises(BadRequestError, match=r"request 0: record 1 is \d+ bytes") as caught:
        ts.handle([{"body": json.dumps([FULL, big]).encode()}], None)
    assert caught.value.error_code == 400  # TorchServe's frontend answers a 413 as 507


def test_a_4_mb_id_is_refused_by_the_default_string_limit(start: Any) -> None:
    server = start()
    code, doc = post(server.http_port, records_body({**FULL, "user": "x" * (4 << 20)}))
    assert code == 413 and "a string of 4194304 bytes" in doc["error"]
    assert "(max_string_bytes 65536)" in doc["error"]


# ------------------------------------------------------------------ keep-alive, TCP_NODELAY
def test_keep_alive_answers_on_one_nodelay_socket(start: Any) -> None:
    server = start()
    conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=30)
    try:
        requests = [
            ("POST", "/v1/predict", records_body(FULL)),
            ("POST", "/v1/predict", records_body({**FULL, "pirce": 1})),  # 400
            ("GET", "/healthz", None),
            ("HEAD", "/healthz", None),
            ("GET", "/nowhere", None),  # 404
        ]
        socks = []
        for method, path, body in requests:
            conn.request(method, path, body)
            response = conn.getresponse()
            data = response.read()
            length = int(response.getheader("Content-Length") or 0)
            assert len(data) == (0 if method == "HEAD" else length)
            assert not response.will_close
            socks.append(conn.sock)
        assert len(set(map(id, socks))) == 1  # one connection served them all
        (connection,) = server.http.connections()  # type: ignore[union-attr]
        assert connection.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
    finally:
        conn.close()


def test_lenient_records_needs_a_pipeline(tmp_path: Path, models: Models) -> None:
    config = EmbeddingConfig.from_yaml_text(CONFIG)
    example = PIPELINE.batch_from_records([FULL] * 4)
    with pytest.raises(InvalidArgumentError, match="lenient_records applies to raw records"):
        export_model(
            Model(), tmp_path / "m", embedding_config=config, example=example, lenient_records=True
        )
    assert not (tmp_path / "m").exists()
    assert models.lenient.spec.lenient_records and not models.strict.spec.lenient_records
