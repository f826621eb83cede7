"""The requests of ``benchmarks/serve.py`` (rows of a batch; JSON bodies for ``--http``) and
the HTTP load-generator stub of ``--http``.

The phases of serve.py drive a gRPC stub (``stub.Predict.future(request, timeout)``, whose
future has ``add_done_callback`` and ``exception``); :class:`HttpStub` offers the same call
over HTTP/1.1: ``POST /v1/predict`` with a JSON body of pre-hashed records (the same rows as
the gRPC requests), each on a persistent connection of the calling thread's own (a pool of
``threads``; a connection the server closed is reopened once). A status other than 200 is
the future's exception.
"""

from __future__ import annotations

import http.client
import json
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, NamedTuple

__all__ = ["HttpRequest", "HttpStub", "json_body", "slice_batch"]


class HttpRequest(NamedTuple):
    body: bytes
    num_records: int


def json_body(batch: Any) -> bytes:
    """``{"hashed_records": [...]}`` of an evaluation ``Batch``: ids as integer lists."""
    out = []
    for i in range(batch.batch_size):
        ids = {f.name: [int(x) for x in f.sample(i)] for f in batch.id_type_features}
        non_id = {d.name: d.data[i].tolist() for d in batch.non_id_type_features}
        out.append({"ids": ids, "non_id": non_id})
    return json.dumps({"hashed_records": out}).encode()


def slice_batch(batch: Any, start: int, n: int) -> Any:
    """Rows ``start .. start + n - 1`` of an evaluation ``batch``."""
    from embeddb.trainer import Batch, IDTypeFeature, NonIDTypeFeature

    ids = []
    for f in batch.id_type_features:
        lo, hi = int(f.offsets[start]), int(f.offsets[start + n])
        offsets = f.offsets[start : start + n + 1] - lo
        ids.append(IDTypeFeature.from_csr(f.name, f.values[lo:hi], offsets))
    dense = [
        NonIDTypeFeature(d.data[start : start + n], name=d.name) for d in batch.non_id_type_features
    ]
    return Batch(ids, dense, requires_grad=False)


class _Method:
    def __init__(self, stub: HttpStub) -> None:
        self._stub = stub

    def future(self, request: HttpRequest, timeout: float = 30.0) -> Future[bytes]:
        return self._stub.pool.submit(self._stub.call, request, timeout)


class HttpStub:
    """``Predict.future(HttpRequest)`` against ``http://host:port`` (see the module)."""

    def __init__(self, address: str, threads: int) -> None:
        host, _, port = address.removeprefix("http://").rpartition(":")
        self._host, self._port = host, int(port)
        self._local = threading.local()
        self.pool = ThreadPoolExecutor(threads, thread_name_prefix="http-load")
        self.Predict = _Method(self)

    def call(self, request: HttpRequest, timeout: float) -> bytes:
        for attempt in range(2):
            conn: http.client.HTTPConnection | None = getattr(self._local, "conn", None)
            if conn is None:
                conn = http.client.HTTPConnection(self._host, self._port, timeout=timeout)
                self._local.conn = conn
            try:
                conn.request(
                    "POST",
                    "/v1/predict",
                    request.body,
                    {"Content-Type": "application/json"},
                )
                response = conn.getresponse()
                data = response.read()
            except (ConnectionError, http.client.HTTPException):
                conn.close()
                self._local.conn = None
                if attempt:
                    raise
                continue
            if response.will_close:
                conn.close()
                self._local.conn = None
            if response.status != 200:
                raise RuntimeError(f"HTTP {response.status}: {data[:200]!r}")
            return data
        raise AssertionError("unreachable")

    def close(self) -> None:
        self.pool.shutdown(wait=True)
