"""``embeddb serve-model``: a model exported from a briefly trained Adult model, served over gRPC
and HTTP against a real shard; scores equal ``InferCtx.predict``; micro-batching merges
concurrent requests; auth, bad input and health; the CLI process and its SIGTERM shutdown."""

from __future__ import annotations

import http.client
import itertools
import json
import logging
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import torch
from click.testing import CliRunner
from grpc_health.v1 import health_pb2, health_pb2_grpc
from torch import nn

from embeddb.cli import main
from embeddb.errors import InvalidArgumentError, ResourceExhaustedError, UnauthenticatedError
from embeddb.serving import InferCtx
from embeddb.serving.client import ModelClient
from embeddb.serving.codec import encode_request, merge_batches, split_scores
from embeddb.serving.server import ModelServer, ModelServerConfig, build_model_server
from embeddb.trainer import (
    Batch,
    EmbeddingWorkerConfig,
    IDTypeFeature,
    NonIDTypeFeature,
    TrainCtx,
    TrainerConfig,
)
from embeddb.transport.rpc import ListenConfig, Tokens
from embeddb.v1 import model_pb2 as mpb
from tests.support import StartServe, eventually, serve_processes
from tests.trainer_harness import Shards, adult, adult_config, adult_model, serve_shards

RW = "rw-token-0123456789abcdef"
RO = "ro-token-0123456789abcdef"
TOKENS = Tokens(read_write=frozenset({RW}), read_only=frozenset({RO}))


@dataclass
class Served:
    shards: Shards
    model_dir: Path
    infer: InferCtx


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """One shard (port 0), an Adult model trained for 30 batches, exported and loaded."""
    torch.set_num_threads(1)
    torch.manual_seed(0)
    directory = tmp_path_factory.mktemp("model") / "adult"
    with serve_shards(adult_config(), None, 1) as shards:
        model = adult_model()
        optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
        config = TrainerConfig(
            mode="hybrid", device="cpu", worker=EmbeddingWorkerConfig(max_staleness=4)
        )
        with TrainCtx(model, optimizer, adult_config(), shards.addresses, config) as ctx:
            batches = adult("train").batches(512, shuffle_seed=0)
            for prepared in itertools.islice(ctx.prepare(batches), 30):
                output, labels = ctx.forward(prepared)
                ctx.backward(nn.BCEWithLogitsLoss()(output, labels[0]))
            ctx.flush()
            ctx.export_model(directory)
        with InferCtx(directory, shards.addresses) as infer:
            yield Served(shards, directory, infer)


def rows(start: int, n: int) -> Batch:
    """Test rows ``start .. start + n - 1`` as an evaluation batch."""
    data = adult("test")
    sl = slice(start, start + n)
    return Batch(
        [IDTypeFeature.from_csr(k, v[sl], np.arange(n + 1)) for k, v in data.ids.items()],
        [NonIDTypeFeature(data.dense[sl], name="numeric")],
        requires_grad=False,
    )


def ragged(batch: Batch) -> Batch:
    """``batch`` with record 0's ``occupation`` empty and record 1's ``workclass`` doubled."""
    features = []
    for f in batch.id_type_features:
        samples = [list(f.sample(i)) for i in range(batch.batch_size)]
        if f.name == "occupation":
            samples[0] = []
        if f.name == "workclass":
            samples[1] = samples[1] * 2 + [12345]
        features.append(IDTypeFeature(f.name, samples))
    return Batch(features, batch.non_id_type_features, requires_grad=False)


def records(batch: Batch) -> list[dict[str, Any]]:
    """The JSON records of ``batch`` (ids as lists, possibly empty)."""
    out = []
    for i in range(batch.batch_size):
        ids = {f.name: [int(x) for x in f.sample(i)] for f in batch.id_type_features}
        non_id = {d.name: d.data[i].tolist() for d in batch.non_id_type_features}
        out.append({"ids": ids, "non_id": non_id})
    return out


def call_http(
    port: int, path: str, body: object = None, token: str | None = None, raw: bytes | None = None
) -> tuple[int, dict[str, Any]]:
    data = raw if raw is not None else None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data)
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, json.loads(exc.read())


def sample(server: ModelServer, name: str, **labels: str) -> float:
    return server.registry.get_sample_value(name, labels or None) or 0.0


@pytest.fixture
def start(served: Served) -> Iterator[Any]:
    """Build model servers on port 0 around the module's InferCtx; stopped at teardown."""
    servers: list[ModelServer] = []

    def build(tokens: Tokens | None = None, **config: Any) -> ModelServer:
        listen = ListenConfig(tokens=tokens)
        server = build_model_server(served.infer, ModelServerConfig(listen, **config))
        servers.append(server)
        return server

    yield build
    for server in servers:
        server.stop(grace=1)


# ---------------------------------------------------------------------------- codec
@pytest.mark.slow
def test_merge_then_split_is_the_batch_scored_at_once() -> None:
    a, b = ragged(rows(0, 3)), rows(10, 2)
    merged = merge_batches([a, b])
    assert merged.batch_size == 5
    for f in merged.id_type_features:
        got = [list(f.sample(i)) for i in range(5)]
        want = [list(a.feature(f.name).sample(i)) for i in range(3)]
        want += [list(b.feature(f.name).sample(i)) for i in range(2)]
        assert got == want
    np.testing.assert_array_equal(
        merged.non_id_type_features[0].data, adult("test").dense[[0, 1, 2, 10, 11]]
    )
    parts = split_scores(np.arange(5, dtype=np.float32), [3, 2])
    assert [p.tolist() for p in parts] == [[0, 1, 2], [3, 4]]


# ---------------------------------------------------------------------------- scores
@pytest.mark.slow
def test_grpc_and_http_answer_the_scores_of_infer_predict(served: Served, start: Any) -> None:
    server = start(max_delay=0.0)
    batch = ragged(rows(0, 16))
    want = served.infer.predict(batch)
    assert want.shape == (16,) and np.all((want > 0) & (want < 1))
    with ModelClient(f"127.0.0.1:{server.port}") as client:
        np.testing.assert_allclose(client.predict(batch), want, rtol=1e-6, atol=1e-7)
        one = client.predict(rows(5, 1))
        np.testing.assert_allclose(one, served.infer.predict(rows(5, 1)), rtol=1e-6, atol=1e-7)
    code, doc = call_http(server.http_port, "/v1/predict", {"records": records(batch)})
    assert code == 200
    np.testing.assert_allclose(np.float32(doc["scores"]), want, rtol=1e-6, atol=1e-7)
    # the record with the empty sample and the one with extra ids score differently from the
    # plain rows, so the ragged layout really reached the model
    plain = served.infer.predict(rows(0, 16))
    assert plain[0] != want[0] and plain[1] != want[1]
    np.testing.assert_allclose(plain[2:], want[2:], rtol=1e-6, atol=1e-7)
    assert sample(server, "embeddb_model_predictions_total") == 16 + 1 + 16
    assert sample(server, "embeddb_model_requests_total", method="Predict", status="OK") == 2
    assert sample(server, "embeddb_model_requests_total", method="http_predict", status="OK") == 1
    # every predict of the shared InferCtx times its lookups: the server's batches + this test's
    batches = sample(server, "embeddb_model_batch_seconds_count")
    assert batches >= 2 and sample(server, "embeddb_model_lookup_seconds_count") >= batches + 1
    assert sample(server, "embeddb_model_lookup_seconds_sum") > 0


@pytest.mark.slow
def test_a_missing_id_feature_is_an_empty_sample(served: Served, start: Any) -> None:
    server = start()
    batch = rows(20, 4)
    request = encode_request(batch)
    kept = [f for f in request.id_features if f.name != "education"]
    del request.id_features[:]
    request.id_features.extend(kept)
    empty = Batch(
        [
            IDTypeFeature(f.name, [[]] * 4) if f.name == "education" else f
            for f in batch.id_type_features
        ],
        batch.non_id_type_features,
        requires_grad=False,
    )
    with ModelClient(f"127.0.0.1:{server.port}") as client:
        got = client.predict_request(request)
    np.testing.assert_allclose(got, served.infer.predict(empty), rtol=1e-6, atol=1e-7)


# ---------------------------------------------------------------------------- batching
@pytest.mark.slow
def test_concurrent_requests_are_merged_into_fewer_predict_calls(
    served: Served, start: Any
) -> None:
    n = 12
    server = start(max_delay=0.2, max_batch=256, workers=n)
    want = served.infer.predict(rows(100, n))
    got: dict[int, np.ndarray] = {}
    barrier = threading.Barrier(n)
    with ModelClient(f"127.0.0.1:{server.port}") as client:
        client.predict(rows(0, 1))  # connect first, so the calls below start together
        before_count = sample(server, "embeddb_model_batch_samples_count")
        before_sum = sample(server, "embeddb_model_batch_samples_sum")

        def call(i: int) -> None:
            barrier.wait()
            got[i] = client.predict(rows(100 + i, 1))

        threads = [threading.Thread(target=call, args=(i,)) for i in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
    runs = sample(server, "embeddb_model_batch_samples_count") - before_count
    assert sample(server, "embeddb_model_batch_samples_sum") - before_sum == n
    assert 1 <= runs <= n // 3, f"{n} concurrent requests ran in {runs} predict calls"
    # each request got its own record's score back
    np.testing.assert_allclose([got[i][0] for i in range(n)], want, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_a_request_larger_than_max_batch_runs_alone(served: Served, start: Any) -> None:
    server = start(max_batch=4)
    with ModelClient(f"127.0.0.1:{server.port}") as client:
        scores = client.predict(rows(0, 10))
    assert scores.shape == (10,)
    assert sample(server, "embeddb_model_batch_samples_count") == 1
    assert sample(server, "embeddb_model_batch_samples_sum") == 10
    assert sample(server, "embeddb_model_batch_samples_bucket", le="8.0") == 0


# ---------------------------------------------------------------------------- auth
@pytest.mark.slow
def test_tokens_are_required_and_a_read_only_one_may_predict(start: Any) -> None:
    server = start(tokens=TOKENS)
    batch = rows(0, 2)
    address = f"127.0.0.1:{server.port}"
    with ModelClient(address) as anonymous, pytest.raises(UnauthenticatedError):
        anonymous.predict(batch)
    with ModelClient(address, token="x" * 24) as wrong, pytest.raises(UnauthenticatedError):
        wrong.predict(batch)
    for token in (RO, RW):
        with ModelClient(address, token=token) as client:
            assert client.predict(batch).shape == (2,)
    body = {"records": records(batch)}
    assert call_http(server.http_port, "/v1/predict", body)[0] == 401
    assert call_http(server.http_port, "/v1/predict", body, token="y" * 24)[0] == 401
    code, doc = call_http(server.http_port, "/v1/predict", body, token=RO)
    assert code == 200 and len(doc["scores"]) == 2
    assert call_http(server.http_port, "/healthz")[0] == 200  # probes need no token
    with grpc.insecure_channel(address) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        answer = health.Check(health_pb2.HealthCheckRequest(service=""), timeout=10)
        assert answer.status == health_pb2.HealthCheckResponse.SERVING
    refused = sample(
        server, "embeddb_model_requests_total", method="Predict", status="UNAUTHENTICATED"
    )
    assert refused == 2
    assert (
        sample(
            server, "embeddb_model_requests_total", method="http_predict", status="UNAUTHENTICATED"
        )
        == 2
    )


@pytest.mark.slow
def test_describe_model_tells_a_client_how_to_build_a_request(served: Served, start: Any) -> None:
    """A request built from DescribeModel alone (as a client in another language would) is
    scored, and the limits it reports are the ones enforced."""
    server = start(tokens=TOKENS, max_records=8, max_message_bytes=2 << 20)
    address = f"127.0.0.1:{server.port}"
    with ModelClient(address) as anonymous, pytest.raises(UnauthenticatedError):
        anonymous.describe()
    with ModelClient(address, token=RO) as client:
        described = client.describe()
        assert list(described.id_features) == list(served.infer.spec.id_features)
        shapes = {i.name: tuple(i.shape) for i in described.non_id_inputs}
        assert shapes == {i.name: tuple(i.shape) for i in served.infer.spec.non_id}
        assert (described.limits.max_records, described.limits.max_message_bytes) == (8, 2 << 20)
        assert described.raw_records is (served.infer.pipeline is not None)
        n = int(described.limits.max_records)
        request = mpb.PredictRequest(num_records=n)
        for name in described.id_features:
            ids = np.arange(n, dtype="<u8")
            request.id_features.add(name=name, ids=ids.tobytes())
        for spec in described.non_id_inputs:
            shape = [n, *spec.shape]
            values = np.zeros(shape, "<f4")
            request.non_id_features.add(name=spec.name, values=values.tobytes(), shape=shape)
        scores = client.predict_request(request)
        assert scores.shape == (n,) and np.all((scores > 0) & (scores < 1))
        request.num_records = n + 1  # one over the described limit
        with pytest.raises(ResourceExhaustedError):
            client.predict_request(request)
    assert sample(server, "embeddb_model_requests_total", method="DescribeModel", status="OK") == 1


# ---------------------------------------------------------------------------- bad input
def _request(batch: Batch, **change: Any) -> mpb.PredictRequest:
    request = encode_request(batch)
    for key, value in change.items():
        setattr(request, key, value)
    return request


@pytest.mark.slow
def test_bad_grpc_requests_get_precise_errors_and_the_server_stays_up(start: Any) -> None:
    server = start(max_records=8)
    batch = rows(0, 3)
    with ModelClient(f"127.0.0.1:{server.port}") as client:
        unknown = encode_request(batch)
        unknown.id_features.add(name="colour", ids=np.uint64([1, 2, 3]).tobytes())
        with pytest.raises(InvalidArgumentError, match="unknown id feature 'colour'"):
            client.predict_request(unknown)
        wrong_dims = encode_request(batch)
        wrong_dims.non_id_features[0].shape[:] = [3, 4]
        wrong_dims.non_id_features[0].values = np.zeros((3, 4), np.float32).tobytes()
        with pytest.raises(InvalidArgumentError, match=r"'numeric': shape must be \[3, 5\]"):
            client.predict_request(wrong_dims)
        no_numeric = encode_request(batch)
        del no_numeric.non_id_features[:]
        with pytest.raises(InvalidArgumentError, match=r"missing non-ID feature.*numeric"):
            client.predict_request(no_numeric)
        offsets = encode_request(ragged(batch))
        bad = next(f for f in offsets.id_features if f.name == "workclass")
        bad.offsets = np.uint64([0, 2, 1, 5]).tobytes()
        with pytest.raises(InvalidArgumentError, match="'workclass': offsets must start at 0"):
            client.predict_request(offsets)
        short = encode_request(batch)
        short.id_features[0].ids = short.id_features[0].ids[:-3]
        with pytest.raises(InvalidArgumentError, match="multiple of 8"):
            client.predict_request(short)
        with pytest.raises(InvalidArgumentError, match="num_records must be at least 1"):
            client.predict_request(mpb.PredictRequest())
        nan = encode_request(batch)
        nan.non_id_features[0].values = np.full((3, 5), np.nan, np.float32).tobytes()
        with pytest.raises(InvalidArgumentError, match="NaN or Inf"):
            client.predict_request(nan)
        with pytest.raises(ResourceExhaustedError, match="9 records in one request"):
            client.predict(rows(0, 9))
        assert client.predict(batch).shape == (3,)  # still serving
    assert (
        sample(server, "embeddb_model_requests_total", method="Predict", status="INVALID_ARGUMENT")
        == 7
    )
    assert (
        sample(
            server, "embeddb_model_requests_total", method="Predict", status="RESOURCE_EXHAUSTED"
        )
        == 1
    )


@pytest.mark.slow
def test_garbage_grpc_predict_is_invalid_argument_authenticated_first_and_logged_once(
    start: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """Bytes that are no PredictRequest: UNAUTHENTICATED without a token (never parsed),
    INVALID_ARGUMENT with one; counted, one rate-limited warning, no traceback."""
    server = start(tokens=TOKENS)
    garbage = b"\x0a\xff\xff\xff\xff\x0f garbage \x80"
    with grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        raw = channel.unary_unary("/embeddb.v1.ModelService/Predict")
        with pytest.raises(grpc.RpcError) as info:
            raw(garbage, timeout=10)
        assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
        caplog.set_level(logging.INFO)
        for _ in range(20):
            with pytest.raises(grpc.RpcError) as info:
                raw(garbage, metadata=(("authorization", f"Bearer {RO}"),), timeout=10)
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "malformed PredictRequest" in (info.value.details() or "")
    with ModelClient(f"127.0.0.1:{server.port}", token=RO) as client:
        assert client.predict(rows(0, 2)).shape == (2,)  # still serving
    assert (
        sample(server, "embeddb_model_bad_requests_total", method="Predict", reason="malformed")
        == 20
    )
    status = {"method": "Predict", "status": "INVALID_ARGUMENT"}
    assert sample(server, "embeddb_model_requests_total", **status) == 20
    warnings = [r for r in caplog.records if "malformed PredictRequest" in r.getMessage()]
    assert len(warnings) == 1 and warnings[0].levelno == logging.WARNING
    assert not any(r.exc_info for r in caplog.records)


@pytest.mark.slow
def test_bad_http_requests_get_400_or_413_and_the_server_stays_up(start: Any) -> None:
    server = start(max_records=8, max_body_bytes=1 << 20)
    port = server.http_port
    good = records(rows(0, 2))
    code, doc = call_http(port, "/v1/predict", raw=b'{"records": [')
    assert code == 400 and "not valid JSON" in doc["error"] and doc["status"] == "INVALID_ARGUMENT"
    code, doc = call_http(port, "/v1/predict", {"rows": good})
    assert code == 400 and '"records"' in doc["error"]
    wrong_dims = json.loads(json.dumps(good))
    wrong_dims[1]["non_id"]["numeric"] = [1.0, 2.0]
    code, doc = call_http(port, "/v1/predict", {"records": wrong_dims})
    assert code == 400 and "record 1" in doc["error"] and "numeric" in doc["error"]
    unknown = json.loads(json.dumps(good))
    unknown[0]["ids"]["colour"] = 3
    code, doc = call_http(port, "/v1/predict", {"records": unknown})
    assert code == 400 and "record 0" in doc["error"] and "colour" in doc["error"]
    code, doc = call_http(port, "/v1/predict", {"records": records(rows(0, 9))})
    assert code == 413 and doc["status"] == "RESOURCE_EXHAUSTED"
    # a declared body above max_body_bytes is refused before it is read
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.putrequest("POST", "/v1/predict")
    conn.putheader("Content-Length", str((1 << 20) + 1))
    conn.endheaders()
    response = conn.getresponse()
    assert response.status == 413 and b"more than this server accepts" in response.read()
    conn.close()
    assert call_http(port, "/v1/nothing", {"records": good})[0] == 404
    code, doc = call_http(port, "/v1/predict", {"records": good})
    assert code == 200 and len(doc["scores"]) == 2  # still serving
    assert (
        sample(
            server, "embeddb_model_requests_total", method="http_predict", status="INVALID_ARGUMENT"
        )
        == 4
    )


@pytest.mark.slow
def test_hashed_records_and_string_ids_over_http_and_grpc_json(served: Served, start: Any) -> None:
    """A model without a feature pipeline: "records" and "hashed_records" are both the
    pre-hashed form; ids may be decimal strings (JSON-safe 64-bit ids); gRPC's records_json
    scores the same; exactly one body key."""
    server = start(max_records=8)
    port = server.http_port
    batch = ragged(rows(30, 5))
    want = served.infer.predict(batch)
    hashed = records(batch)
    as_text = json.loads(json.dumps(hashed))
    for record in as_text:
        record["ids"] = {name: [str(x) for x in ids] for name, ids in record["ids"].items()}
    assert served.infer.pipeline is None
    for body in ({"records": hashed}, {"hashed_records": hashed}, {"hashed_records": as_text}):
        code, doc = call_http(port, "/v1/predict", body)
        assert code == 200, doc
        np.testing.assert_allclose(np.float32(doc["scores"]), want, rtol=1e-6, atol=1e-7)
    with ModelClient(f"127.0.0.1:{server.port}") as client:
        np.testing.assert_allclose(client.predict_records(as_text), want, rtol=1e-6, atol=1e-7)
        with pytest.raises(InvalidArgumentError, match=r"record 1: ids\.education"):
            client.predict_records([hashed[0], {"ids": {"education": "x1"}}])
        request = mpb.PredictRequest(num_records=3, records_json=json.dumps(hashed).encode())
        with pytest.raises(InvalidArgumentError, match="num_records is 3"):
            client.predict_request(request)
    code, doc = call_http(port, "/v1/predict", {"records": hashed, "hashed_records": hashed})
    assert code == 400 and "exactly one" in doc["error"]
    too_big = str(1 << 64)
    for bad_id in (too_big, "-1", "1e3", "\uff11\uff12", "", True):
        body = {"hashed_records": [{"ids": {"education": bad_id}, "non_id": hashed[0]["non_id"]}]}
        code, doc = call_http(port, "/v1/predict", body)
        assert code == 400 and "record 0: ids.education" in doc["error"], (bad_id, doc)
    body = {"hashed_records": [{**hashed[0], "ids": {"education": ["7", too_big]}}]}
    code, doc = call_http(port, "/v1/predict", body)
    assert code == 400 and "record 0: ids.education" in doc["error"]


@pytest.mark.slow
def test_health_follows_set_serving(start: Any) -> None:
    server = start()
    assert call_http(server.http_port, "/healthz") == (200, {"status": "SERVING"})
    server.set_serving(False)
    assert call_http(server.http_port, "/healthz") == (503, {"status": "NOT_SERVING"})
    with grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        answer = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service="embeddb.v1.ModelService"), timeout=10
        )
    assert answer.status == health_pb2.HealthCheckResponse.NOT_SERVING


# ---------------------------------------------------------------------------- the CLI
@pytest.fixture
def serve(tmp_path: Path) -> Iterator[StartServe]:
    yield from serve_processes(tmp_path)


@pytest.mark.slow
def test_serve_model_cli_serves_and_exits_0_on_sigterm(served: Served, serve: StartServe) -> None:
    model = serve("--model", str(served.model_dir), "--addresses", served.shards.addresses[0],
                  "--http-port", "0", "--max-delay-ms", "1", command="serve-model",
                  metrics=True)  # fmt: skip
    ports = model.ports
    assert set(ports) == {"grpc", "http", "metrics"}
    batch = rows(30, 5)
    want = served.infer.predict(batch)
    with ModelClient(model.address) as client:
        np.testing.assert_allclose(client.predict(batch), want, rtol=1e-6, atol=1e-7)
    code, doc = call_http(ports["http"], "/v1/predict", {"records": records(batch)})
    assert code == 200
    np.testing.assert_allclose(np.float32(doc["scores"]), want, rtol=1e-6, atol=1e-7)
    url = f"http://127.0.0.1:{ports['metrics']}/metrics"
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    assert "embeddb_model_predictions_total 10.0" in text
    assert "embeddb_model_batch_samples_count 2.0" in text
    model.stop()
    assert model.port_file is not None and not model.port_file.exists()
    assert "stopped cleanly" in model.stderr()


@pytest.mark.slow
def test_serve_model_cli_needs_exactly_one_way_to_name_the_shards(
    served: Served, tmp_path: Path
) -> None:
    runner = CliRunner()
    result = runner.invoke(main, ["serve-model", "--model", str(served.model_dir)])
    assert result.exit_code == 2 and "--addresses HOST:PORT,...|@FILE or" in result.output
    addresses = tmp_path / "shards.txt"
    addresses.write_text(served.shards.addresses[0] + "\n")
    both = ["serve-model", "--model", str(served.model_dir), "--addresses", f"@{addresses}",
            "--shard", served.shards.addresses[0]]  # fmt: skip
    assert runner.invoke(main, both).exit_code == 2
    with_checkpoint = ["serve-model", "--model", str(served.model_dir), "--addresses",
                       served.shards.addresses[0], "--from-checkpoint", str(tmp_path)]  # fmt: skip
    refused = runner.invoke(main, with_checkpoint)
    assert refused.exit_code == 2 and "--from-checkpoint DIR (one of them)" in refused.output
    missing = runner.invoke(
        main, ["serve-model", "--model", str(tmp_path / "none"), "--addresses", "x:1"]
    )
    assert missing.exit_code == 1 and "does not exist" in missing.output  # a missing file: 1


def test_the_batcher_scores_a_lone_request_inline_and_merges_under_load() -> None:
    """An idle batcher scores a request in the caller's thread (no hand-off); requests that
    arrive while a batch is being scored are merged into the next one."""
    from embeddb.serving.batcher import MicroBatcher

    calls: list[tuple[str, int]] = []
    gate = threading.Event()

    def predict(batch: Batch) -> np.ndarray:
        calls.append((threading.current_thread().name, batch.batch_size))
        if len(calls) == 1:
            gate.wait(5)  # hold the first batch while others queue
        return np.arange(batch.batch_size, dtype=np.float32)

    batcher = MicroBatcher(predict, max_batch=64, max_delay=0.05)
    try:
        first: list[np.ndarray] = []
        lone = threading.Thread(
            target=lambda: first.append(batcher.submit(rows(0, 2)).result()), name="caller"
        )
        lone.start()
        eventually(lambda: calls, 30, "the lone request to be scored")
        futures = [batcher.submit(rows(i, 1)) for i in range(5)]  # queue while busy
        gate.set()
        results = [f.result(5) for f in futures]
        lone.join(5)
    finally:
        batcher.close()
    assert calls[0] == ("caller", 2) and first[0].tolist() == [0.0, 1.0]
    assert [name for name, _ in calls[1:]] == ["embeddb-batcher"] * (len(calls) - 1)
    assert sum(n for _, n in calls[1:]) == 5 and len(calls) <= 3  # merged, not 5 calls
    assert [r.size for r in results] == [1] * 5
