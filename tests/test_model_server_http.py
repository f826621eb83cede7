"""The model server's HTTP boundary (``embeddb/serving/http.py``), over real sockets to real
servers (the exported Adult model of ``test_model_server``): malformed bodies and deep JSON are
400 JSON; wrong methods 405 with ``Allow``; unknown paths 404; HEAD; the HTTP parser's own
refusals in JSON; bad requests counted and logged at DEBUG only; unexpected errors 500 with
a rate-limited traceback; the same against an ``embeddb serve-model`` process."""

from __future__ import annotations

import http.client
import json
import logging
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from embeddb.serving.http import MAX_JSON_DEPTH, json_depth
from embeddb.serving.server import ModelServerConfig, build_model_server
from embeddb.trainer import Batch
from embeddb.transport.rpc.interceptors import RateLimitedLog
from tests import test_model_server
from tests.support import ServeProcess, serve_processes
from tests.test_model_server import Served, call_http, records, rows, sample

# Starts processes or runs for seconds: the full suite's, not the fast tier's.
pytestmark = pytest.mark.slow

served = test_model_server.served  # the fixtures: one shard, one exported model served
start = test_model_server.start

HTTP_LOGGER = "embeddb.serving.http"
DEEP = 100_000


def exchange(
    port: int, method: str, path: str, body: bytes | None = None, token: str | None = None
) -> tuple[int, http.client.HTTPMessage, bytes]:
    """One request on a fresh connection: status, headers, body."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        headers = {} if token is None else {"Authorization": f"Bearer {token}"}
        conn.request(method, path, body=body, headers=headers)
        response = conn.getresponse()
        return response.status, response.headers, response.read()
    finally:
        conn.close()


def raw_exchange(port: int, data: bytes) -> tuple[int, http.client.HTTPMessage, bytes]:
    """``data`` as sent (any bytes, no client-side checks); the answer parsed as HTTP/1.x (a
    status line is required: an HTML page without one fails here)."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(data)
        response = http.client.HTTPResponse(sock, method="GET")
        response.begin()
        return response.status, response.headers, response.read()


def error_doc(headers: http.client.HTTPMessage, body: bytes) -> dict[str, Any]:
    """The JSON error body of an answer (asserting it is one)."""
    assert headers["Content-Type"] == "application/json", (headers, body[:200])
    doc: dict[str, Any] = json.loads(body)
    assert set(doc) == {"error", "status"}, doc
    return doc


def bad(server: Any, method: str, reason: str) -> float:
    return sample(server, "embeddb_model_bad_requests_total", method=method, reason=reason)


def good_body(start_row: int = 0, n: int = 2) -> bytes:
    return json.dumps({"records": records(rows(start_row, n))}).encode()


def nested(depth: int, inner: str = "1") -> str:
    return "[" * depth + inner + "]" * depth


def numeric_body(value: str) -> bytes:
    """A body of one record whose non-ID input ``numeric`` is the JSON text ``value``."""
    return ('{"records": [{"ids": {}, "non_id": {"numeric": ' + value + "}}]}").encode()


def records_body(value: str) -> bytes:
    """A body whose ``records`` is the JSON text ``value``."""
    return ('{"records": ' + value + "}").encode()


# ---------------------------------------------------------------------------- bodies
def test_deeply_nested_json_is_400_json_and_the_server_keeps_scoring(
    served: Served, start: Any
) -> None:
    server = start()
    port = server.http_port
    too_deep = [
        nested(DEEP, "").encode(),
        records_body(nested(DEEP, "")),
        numeric_body(nested(900)),  # json.loads parses this one: the schema checks would recurse
        numeric_body(nested(MAX_JSON_DEPTH - 3)),  # one level past the limit
    ]
    for body in too_deep:
        code, doc = call_http(port, "/v1/predict", raw=body)
        assert code == 400 and doc["status"] == "INVALID_ARGUMENT", (code, doc)
        assert f"more than {MAX_JSON_DEPTH}" in doc["error"]
    # at the limit the body parses and the records are judged (the shape is wrong)
    code, doc = call_http(port, "/v1/predict", raw=numeric_body(nested(MAX_JSON_DEPTH - 4)))
    assert code == 400 and "non_id.numeric" in doc["error"] and "deep" not in doc["error"]
    # brackets inside strings (escaped quotes and backslashes included) are no nesting
    key = '\\\\\\"' + "[" * 100 + '\\"{{{'
    body = records_body('[{"ids": {"' + key + '": 1}, "non_id": {"numeric": [1, 2, 3, 4, 5]}}]')
    code, doc = call_http(port, "/v1/predict", raw=body)
    assert code == 400 and "no such ID feature" in doc["error"]
    batch = rows(40, 3)
    code, doc = call_http(port, "/v1/predict", {"records": records(batch)})
    assert code == 200
    np.testing.assert_allclose(
        np.float32(doc["scores"]), served.infer.predict(batch), rtol=1e-6, atol=1e-7
    )
    assert bad(server, "POST", "malformed") == len(too_deep)
    assert bad(server, "POST", "invalid_argument") == 2


def test_bodies_that_are_not_utf8_json_are_400_and_counted(start: Any) -> None:
    server = start()
    port = server.http_port

    def numeric(first: str) -> bytes:
        return numeric_body(f"[{first}, 0, 0, 0, 0]")

    malformed = {
        "not UTF-8": [
            b'{"records": "\xff"}',
            b'{"records": ["\xed\xa0\x80"]}',  # a UTF-8-encoded surrogate
            good_body().decode().encode("utf-16"),
        ],
        "not valid JSON": [
            numeric("NaN"),
            numeric("Infinity"),
            numeric("-Infinity"),
            numeric("1" * 5000),  # more digits than int() converts
            b'{"records": [',
        ],
    }
    for message, bodies in malformed.items():
        for body in bodies:
            code, headers, answer = exchange(port, "POST", "/v1/predict", body)
            doc = error_doc(headers, answer)
            assert code == 400 and doc["status"] == "INVALID_ARGUMENT", (body[:60], doc)
            assert message in doc["error"], (body[:60], doc)
    assert "NaN" in call_http(port, "/v1/predict", raw=numeric("NaN"))[1]["error"]
    # a UTF-8 byte order mark is skipped
    code, doc = call_http(port, "/v1/predict", raw=b"\xef\xbb\xbf" + good_body())
    assert code == 200 and len(doc["scores"]) == 2
    assert bad(server, "POST", "malformed") == 9
    for length in ("12abc", "-1", "1_0"):
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        conn.putrequest("POST", "/v1/predict")
        conn.putheader("Content-Length", length)
        conn.endheaders()
        response = conn.getresponse()
        doc = error_doc(response.headers, response.read())
        conn.close()
        assert response.status == 400 and "Content-Length" in doc["error"], doc
    assert bad(server, "POST", "bad_length") == 3


# ---------------------------------------------------------------------------- methods, paths
def test_a_wrong_method_on_a_known_path_is_405_json_with_allow(start: Any) -> None:
    server = start()
    port = server.http_port
    for method in ("GET", "PUT", "DELETE", "PATCH", "OPTIONS", "FOO"):
        body = good_body() if method in ("PUT", "PATCH") else None
        code, headers, answer = exchange(port, method, "/v1/predict", body)
        doc = error_doc(headers, answer)
        assert code == 405 and headers["Allow"] == "POST", (method, code)
        assert doc["status"] == "UNIMPLEMENTED" and "not allowed" in doc["error"]
    for method in ("POST", "PUT", "DELETE"):
        code, headers, answer = exchange(port, method, "/healthz", b"{}")
        assert code == 405 and headers["Allow"] == "GET, HEAD"
        assert error_doc(headers, answer)["status"] == "UNIMPLEMENTED"
    code, headers, answer = exchange(port, "HEAD", "/v1/predict")
    assert code == 405 and headers["Allow"] == "POST" and answer == b""
    assert int(headers["Content-Length"]) > 0  # what a GET would have got
    assert bad(server, "GET", "bad_method") == 1
    assert bad(server, "OTHER", "bad_method") == 1  # FOO
    assert bad(server, "HEAD", "bad_method") == 1
    # a refused request's small body is read and dropped: the connection serves on
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("PUT", "/v1/predict", body=good_body())
    response = conn.getresponse()
    assert response.status == 405 and not response.will_close
    response.read()
    sock = conn.sock
    conn.request("POST", "/v1/predict", body=good_body())
    response = conn.getresponse()
    assert response.status == 200 and len(json.loads(response.read())["scores"]) == 2
    assert conn.sock is sock
    conn.close()


def test_head_healthz_answers_the_headers_of_get_without_a_body(start: Any) -> None:
    server = start()
    conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=30)
    conn.request("HEAD", "/healthz")
    response = conn.getresponse()
    assert response.status == 200 and response.read() == b""
    assert response.headers["Content-Type"] == "application/json"
    assert int(response.headers["Content-Length"]) == len(json.dumps({"status": "SERVING"}))
    server.set_serving(False)
    conn.request("HEAD", "/healthz")
    response = conn.getresponse()
    assert response.status == 503 and response.read() == b""
    conn.request("GET", "/healthz")  # same connection: nothing stray was sent after a HEAD
    response = conn.getresponse()
    assert response.status == 503 and json.loads(response.read()) == {"status": "NOT_SERVING"}
    conn.close()


def test_an_unknown_path_is_404_json_for_every_method(start: Any) -> None:
    server = start()
    port = server.http_port
    for path in ("/nothing", "/v1/predict/more", "/healthz/", "*"):
        for method in ("GET", "POST", "PUT", "DELETE", "FOO"):
            code, headers, answer = exchange(port, method, path, b"{}")
            doc = error_doc(headers, answer)
            assert code == 404 and doc["status"] == "NOT_FOUND", (method, path, code)
        code, headers, answer = exchange(port, "HEAD", path)
        assert code == 404 and answer == b""
    assert bad(server, "PUT", "unknown_path") == 4
    assert bad(server, "OTHER", "unknown_path") == 4
    assert bad(server, "HEAD", "unknown_path") == 4


def test_the_http_parsers_refusals_are_json_with_a_status_line(start: Any) -> None:
    """Each request is sent whole and read whole by the server before it answers (no unread
    bytes: closing on them would reset the connection)."""
    server = start()
    port = server.http_port
    cases = [
        (b"GARBAGE\r\n", 400),
        (b"GET /healthz HTTP/1.1 more\r\n", 400),
        (b"GET /healthz NOT-HTTP\r\n", 400),
        (b"\x00\xff\xfe /nothing HTTP/1.1\r\n\r\n", 404),  # an odd method, an unknown path
        (b"GET /healthz\r\n\r\n", 400),  # HTTP/0.9: no version, no status line in answers
        (b"GET /healthz HTTP/2.0\r\n", 505),
        (b"GET /" + b"a" * (65537 - 5), 414),  # a request line over 64 KiB
        (b"GET /healthz HTTP/1.1\r\nX: " + b"a" * (65537 - 3), 431),  # a header line too
        (b"GET /healthz HTTP/1.1\r\n" + b"".join(b"H%d: v\r\n" % i for i in range(101)), 431),
    ]
    for data, want in cases:
        code, headers, body = raw_exchange(port, data)
        doc = error_doc(headers, body)
        assert code == want, (data[:40], code, doc)
        assert want == 404 or headers["Connection"] == "close"  # the parser's: framing lost
        status = {400: "INVALID_ARGUMENT", 404: "NOT_FOUND"}.get(want)
        assert doc["status"] == (
            status or ("UNIMPLEMENTED" if want == 505 else "RESOURCE_EXHAUSTED")
        )
    assert bad(server, "NONE", "bad_request_line") == 3
    assert bad(server, "GET", "bad_request_line") == 1
    assert bad(server, "OTHER", "unknown_path") == 1
    assert bad(server, "NONE", "bad_version") == 1
    assert bad(server, "NONE", "uri_too_long") == 1
    assert bad(server, "GET", "headers_too_large") == 2
    assert call_http(port, "/healthz") == (200, {"status": "SERVING"})


# ---------------------------------------------------------------------------- logs
def test_refusals_are_logged_at_debug_only(start: Any, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="embeddb.serving")
    server = start(max_records=1)
    port = server.http_port
    assert call_http(port, "/v1/predict", raw=nested(DEEP, "").encode())[0] == 400
    assert call_http(port, "/v1/predict", raw=b"\xff")[0] == 400
    assert call_http(port, "/v1/predict", raw=good_body(0, 2))[0] == 413
    assert exchange(port, "DELETE", "/v1/predict")[0] == 405
    assert exchange(port, "GET", "/nothing")[0] == 404
    assert raw_exchange(port, b"GARBAGE\r\n")[0] == 400
    ours = [r for r in caplog.records if r.name.startswith("embeddb.serving")]
    assert [r for r in ours if r.levelno >= logging.INFO] == []
    assert {"400", "404", "405", "413"} <= {str(a) for r in ours for a in r.args or ()}
    assert not [r for r in caplog.records if r.exc_info]


def test_an_unexpected_error_is_500_json_and_logged_once_per_interval(
    served: Served, caplog: pytest.LogCaptureFixture
) -> None:
    class BrokenModel:
        """Checks records like the real model, then fails to score them."""

        spec = served.infer.spec

        def batch_from_records(self, records: object) -> Batch:
            return served.infer.batch_from_records(records)

        def predict(self, batch: Batch) -> np.ndarray:
            raise RuntimeError("the dense model broke")

    now = [0.0]
    server = build_model_server(BrokenModel(), ModelServerConfig(max_delay=0.0))
    try:
        assert server.http is not None
        server.http.errors = RateLimitedLog(logging.getLogger(HTTP_LOGGER), 10.0, lambda: now[0])
        caplog.set_level(logging.ERROR)
        for _ in range(3):
            code, headers, body = exchange(server.http_port, "POST", "/v1/predict", good_body())
            assert code == 500 and error_doc(headers, body)["status"] == "INTERNAL"
            assert b"broke" not in body  # the details stay in the log
        logged = [r for r in caplog.records if r.levelno >= logging.ERROR]
        assert len(logged) == 1 and logged[0].exc_info is not None
        assert "the dense model broke" in caplog.text
        now[0] = 10.0
        assert exchange(server.http_port, "POST", "/v1/predict", good_body())[0] == 500
        logged = [r for r in caplog.records if r.levelno >= logging.ERROR]
        assert len(logged) == 2 and "2 more like it suppressed" in logged[1].getMessage()
        assert logged[1].exc_info is not None
        status = {"method": "http_predict", "status": "INTERNAL"}
        assert sample(server, "embeddb_model_requests_total", **status) == 4
        assert call_http(server.http_port, "/healthz") == (200, {"status": "SERVING"})
    finally:
        server.stop(grace=1)


# ---------------------------------------------------------------------------- json_depth
_leaf = st.none() | st.booleans() | st.integers() | st.text(alphabet='[]{}"\\ aé\n', max_size=8)
_json = st.recursive(
    _leaf,
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(st.text(alphabet='[]{}"\\ k', max_size=4), inner, max_size=3)
    ),
    max_leaves=20,
)


def _depth(value: object) -> int:
    if isinstance(value, list):
        return 1 + max(map(_depth, value), default=0)
    if isinstance(value, dict):
        return 1 + max(map(_depth, value.values()), default=0)
    return 0


@given(_json, st.booleans())
def test_json_depth_is_the_nesting_of_arrays_and_objects(value: object, ensure_ascii: bool) -> None:
    text = json.dumps(value, ensure_ascii=ensure_ascii).encode()
    assert json_depth(text) == _depth(value)


# ---------------------------------------------------------------------------- the process
@pytest.fixture
def model_process(served: Served, tmp_path: Path) -> Iterator[ServeProcess]:
    """``embeddb serve-model`` on port 0, once its port file is written; killed at teardown
    if still running."""
    starts = serve_processes(tmp_path)
    start = next(starts)
    yield start("--model", str(served.model_dir), "--addresses", served.shards.addresses[0],
                "--http-port", "0", "--max-delay-ms", "0", command="serve-model")  # fmt: skip
    next(starts, None)


def test_serve_model_answers_bad_http_with_json_and_logs_no_traceback(
    served: Served, model_process: ServeProcess
) -> None:
    port = model_process.ports["http"]
    code, doc = call_http(port, "/v1/predict", raw=nested(DEEP, "").encode())
    assert code == 400 and doc["status"] == "INVALID_ARGUMENT"
    code, doc = call_http(port, "/v1/predict", raw=records_body(nested(DEEP, "")))
    assert code == 400 and doc["status"] == "INVALID_ARGUMENT"
    code, headers, body = exchange(port, "GET", "/v1/predict")
    assert code == 405 and headers["Allow"] == "POST" and error_doc(headers, body)
    for method in ("PUT", "DELETE", "PATCH", "OPTIONS", "FOO"):
        code, headers, body = exchange(port, method, "/v1/predict")
        assert code == 405 and error_doc(headers, body)["status"] == "UNIMPLEMENTED"
    code, headers, body = raw_exchange(port, b"GARBAGE\r\n")
    assert code == 400 and error_doc(headers, body)["status"] == "INVALID_ARGUMENT"
    batch = rows(50, 4)
    code, doc = call_http(port, "/v1/predict", {"records": records(batch)})
    assert code == 200
    np.testing.assert_allclose(
        np.float32(doc["scores"]), served.infer.predict(batch), rtol=1e-6, atol=1e-7
    )
    model_process.stop()
    log = model_process.stderr()
    assert "stopped cleanly" in log
    assert "Traceback" not in log and " ERROR " not in log, log
