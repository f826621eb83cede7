"""The model server's HTTP connections (``embeddb/serving/http.py``): persistent HTTP/1.1
connections that survive refusals, many clients served at once, stalled and idle connections
closed, a stop that answers what is in flight; real servers on 127.0.0.1 port 0."""

from __future__ import annotations

import http.client
import json
import socket
import threading
from typing import Any

import numpy as np
import pytest

from tests import test_model_server
from tests.test_model_server import Served, records, rows, sample

pytestmark = pytest.mark.slow  # the model server's shards run in a child process

served = test_model_server.served  # the fixtures: one shard, one exported model served
start = test_model_server.start


def predict_body(start_row: int, n: int) -> bytes:
    return json.dumps({"hashed_records": records(rows(start_row, n))}).encode()


def answer(conn: http.client.HTTPConnection) -> tuple[int, http.client.HTTPResponse, Any]:
    response = conn.getresponse()
    data = response.read()
    return response.status, response, json.loads(data) if data else None


def test_one_connection_serves_every_request_also_after_refusals(
    served: Served, start: Any
) -> None:
    server = start(max_records=4, tokens=None)
    conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=30)
    try:
        conn.request("POST", "/v1/predict", predict_body(0, 2))
        code, response, doc = answer(conn)
        assert code == 200 and not response.will_close
        sock = conn.sock
        assert sock is not None
        requests = [
            ("POST", "/v1/predict", b'{"records": [', 400),  # not JSON
            ("POST", "/v1/predict", b'{"records": [{"ids": {}}]}', 400),  # a bad record
            ("POST", "/v1/predict", predict_body(0, 5), 413),  # over max_records
            ("GET", "/nowhere", None, 404),
            ("PUT", "/v1/predict", predict_body(0, 1), 405),  # a body the server drops
            ("DELETE", "/healthz", b"x" * 1000, 405),
            ("HEAD", "/v1/predict", None, 405),
            ("GET", "/healthz", None, 200),
            ("HEAD", "/healthz", None, 200),
            ("POST", "/v1/predict", predict_body(10, 3), 200),
        ]
        for method, path, body, want in requests:
            conn.request(method, path, body)
            code, response, doc = answer(conn)
            assert code == want, (method, path, code, doc)
            assert not response.will_close and response.getheader("Connection") is None
            assert conn.sock is sock, (method, path)  # the same socket: nothing reconnected
        np.testing.assert_allclose(
            np.float32(doc["scores"]), served.infer.predict(rows(10, 3)), rtol=1e-6, atol=1e-7
        )
        (server_side,) = server.http.connections()  # type: ignore[union-attr]
        assert server_side.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
    finally:
        conn.close()


def test_fifty_concurrent_connections_are_each_served(served: Served, start: Any) -> None:
    server = start(max_delay=0.002)
    clients = 50
    conns = [
        http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=60)
        for _ in range(clients)
    ]
    barrier = threading.Barrier(clients)
    results: dict[int, tuple[int, Any]] = {}
    errors: list[BaseException] = []

    def client(i: int) -> None:
        try:
            barrier.wait(timeout=60)  # every client connects and sends at once
            conns[i].connect()
            for k in range(2):  # twice: the connection persists
                conns[i].request("POST", "/v1/predict", predict_body(i + k, 1))
                code, _, doc = answer(conns[i])
                results[2 * i + k] = (code, doc)
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    try:
        assert not errors, errors[:3]
        assert len(server.http.connections()) == clients  # type: ignore[union-attr]
        expected = served.infer.predict(rows(0, clients + 1))
        for i in range(clients):
            for k in range(2):
                code, doc = results[2 * i + k]
                assert code == 200, doc
                np.testing.assert_allclose(doc["scores"], [expected[i + k]], rtol=1e-5, atol=1e-6)
        ok = {"method": "http_predict", "status": "OK"}
        assert sample(server, "embeddb_model_requests_total", **ok) == 2 * clients
    finally:
        for conn in conns:
            conn.close()


def test_stalled_and_silent_connections_are_closed_after_the_idle_time(start: Any) -> None:
    server = start(http_idle_seconds=0.3)
    stalls = [
        b"",  # connects, sends nothing
        b"POST /v1/predict HTTP/1.1\r\nContent-Le",  # a head that stops
        b"POST /v1/predict HTTP/1.1\r\nContent-Length: 100\r\n\r\n{",  # a body that stops
    ]
    for data in stalls:
        with socket.create_connection(("127.0.0.1", server.http_port), timeout=30) as sock:
            sock.sendall(data)
            assert sock.recv(1024) == b""  # closed by the server, no answer (30 s: fails)
    # an idle keep-alive connection too, after its answer
    with socket.create_connection(("127.0.0.1", server.http_port), timeout=30) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        response = http.client.HTTPResponse(sock)
        response.begin()
        assert response.status == 200 and json.loads(response.read()) == {"status": "SERVING"}
        assert sock.recv(1024) == b""


def test_stop_answers_the_request_in_flight_and_closes_idle_connections(
    served: Served, start: Any
) -> None:
    server = start()
    idle = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=30)
    idle.request("GET", "/healthz")
    assert answer(idle)[0] == 200
    scoring = threading.Event()
    release = threading.Event()
    predict = served.infer.predict

    class Slow:
        spec = served.infer.spec

        def batch_from_hashed_records(self, records: object) -> Any:
            scoring.set()
            assert release.wait(30)
            return served.infer.batch_from_hashed_records(records)

    server.http.app.predictor = Slow()  # type: ignore[union-attr,assignment]
    busy = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=30)
    busy.request("POST", "/v1/predict", predict_body(0, 2))
    assert scoring.wait(30)
    stopper = threading.Thread(target=server.stop, kwargs={"grace": 30})
    stopper.start()
    # the idle connection is closed by the stop, before the request in flight ends
    assert idle.sock is not None
    assert idle.sock.recv(1024) == b""
    release.set()
    code, response, doc = answer(busy)
    stopper.join(30)
    assert not stopper.is_alive()
    assert code == 200 and response.will_close  # answered, then the connection closes
    np.testing.assert_allclose(np.float32(doc["scores"]), predict(rows(0, 2)), rtol=1e-6, atol=1e-7)
    idle.close()
    busy.close()
