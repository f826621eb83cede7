"""The model server's HTTP/JSON frontend: uvicorn (HTTP/1.1 on httptools, keep-alive) serving
the ASGI application of ``http_app.py``, on an asyncio event loop in a thread of its own.

Every answer is JSON, error pages of the HTTP parser included; ``HEAD`` gets the headers of
the answer ``GET`` would get and no body::

    POST /v1/predict {"records": [...]}   200 {"scores": [...]}, or an error of the request
      or {"hashed_records": [...]}        (HTTP_STATUS: 400, 401, 413, 503, ...)
    GET|HEAD /healthz                     200 {"status": "SERVING"} / 503 {"status": "NOT_SERVING"}
    another method on those paths         405, with ``Allow``
    any method on another path            404
    the HTTP parser's refusals            400 a request line it cannot parse, or one without
                                          an HTTP version (HTTP/0.9 is not served)
                                          414 a request line over 64 KiB
                                          431 a header line over 64 KiB, or over 100 headers
                                          505 HTTP/2 or later on this HTTP/1.1 port
                                          (``http_protocol.py``: uvicorn's protocol with
                                          these refusals in JSON and these bounds)

An error body is ``{"error": message, "status": gRPC status name}``: the status of the embeddb
error for those of the request (:data:`HTTP_STATUS` maps it to the HTTP code), else the one
of :data:`GRPC_STATUS` (404 NOT_FOUND, 405 UNIMPLEMENTED, 500 INTERNAL, ...).

``POST /v1/predict`` checks, in order: the bearer token (401) → the framing: one
``Content-Length`` (400 if missing, not a number or with ``Transfer-Encoding``; 413 above
``max_body_bytes``) → the body, before it is parsed (:mod:`.body`): arrays and objects nested
at most :data:`MAX_JSON_DEPTH` deep (400), no string over ``max_string_bytes`` and no record
over ``max_record_bytes`` (413, naming the limit and the record) → the JSON (400): strict
UTF-8 (a leading BOM is skipped), no ``NaN``/``Infinity`` literals → the records (400, 413
above ``max_records``; a number that is not finite, ``1e999``, is a 400 naming the record and
the field) → scoring. A score is never NaN in a body: the model returning one for a record is a
400 naming the record (``codec.finite_scores``).

Connections are persistent (HTTP/1.1 keep-alive), also after a 4xx, on sockets with
``TCP_NODELAY`` (asyncio's default): an answer's head and body go out at once, never waiting
for the peer's delayed ACK (Nagle's algorithm would hold the body ~40 ms). One event loop
serves every connection; it only reads requests and writes answers: a ``POST /v1/predict``
body is parsed, scored and its answer serialized on one of ``workers`` threads (the
micro-batcher merges what they submit). An idle connection, or a request stalled in its head
or body, is closed after ``http_idle_seconds``.

The body holds exactly one of two keys: ``"records"``, raw records (column values as in the
training data, ``{"user": "u17", "price": 12.5}``) when the model was exported with its
feature pipeline, else pre-hashed ones (``InferCtx.batch_from_records``); ``"hashed_records"``,
always pre-hashed records (``{"ids": {...}, "non_id": {...}}``, ids as integers or decimal
strings: ``InferCtx.batch_from_hashed_records``). A bad record is a 400 naming the record's
index and the column (or field).

Refusals (4xx) are the caller's doing: logged at DEBUG only and counted in
``embeddb_model_bad_requests_total{method,reason}`` (``ModelMetrics.observe_bad_request``;
method the HTTP method, OTHER for one this server does not know, NONE for a request line not
parsed) with these reasons::

    bad_request_line  400 from the parser     unknown_path      404
    uri_too_long      414                     bad_method        405
    headers_too_large 431                     unauthenticated   401
    bad_version       505                     bad_length        400: Content-Length
    bad_header        400: a header line      too_large         413: body or records
                      the parser refuses      invalid_argument  400: the records
    malformed         400: the body is not JSON this server reads

An unexpected exception is answered 500 ``INTERNAL`` and logged with its traceback by a
:class:`~embeddb.transport.rpc.interceptors.RateLimitedLog`: at most one traceback per interval, so
a
flood of requests that trip a bug cannot flood the log. A refused request whose body was
not read has it read and dropped when small (the connection stays open), else the connection
is closed after the answer.

Stopping (:meth:`HttpFrontend.stop`): the port stops accepting, idle connections close, the
requests in flight get ``grace`` seconds to be answered (with ``Connection: close``), then
the loop ends.

Why uvicorn: a maintained, widely deployed HTTP/1.1 server (event loop, keep-alive and its
timeout, flow control, graceful shutdown) on llhttp, a strict incremental parser; the routes
are two, so the ASGI application is ours (no framework). ``http.server``, which this replaced,
ran one thread per connection and is documented as not meant for production.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import uvicorn

from embeddb.serving.batcher import MicroBatcher
from embeddb.serving.body import MAX_JSON_DEPTH, json_depth, parse_json
from embeddb.serving.http_app import GRPC_STATUS, HTTP_STATUS, HttpSettings, PredictApp
from embeddb.serving.http_protocol import protocol_class
from embeddb.serving.metrics import ModelMetrics
from embeddb.serving.predictor import Predictor

__all__ = [
    "GRPC_STATUS",
    "HTTP_STATUS",
    "MAX_JSON_DEPTH",
    "HttpFrontend",
    "HttpSettings",
    "json_depth",
    "parse_json",
]

logger = logging.getLogger(__name__)

_STOP_POLL = 0.01  # seconds between two looks at the requests in flight, while stopping


class _Server(uvicorn.Server):
    """uvicorn's server, telling when its port accepts, stopping within ``grace`` seconds."""

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self.ready = threading.Event()
        self.loop: asyncio.AbstractEventLoop | None = None
        self.grace = 0.0

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        self.loop = asyncio.get_running_loop()
        await super().startup(sockets)
        self.ready.set()

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        """Stop accepting; close idle connections (the others close after their answer);
        give the requests in flight ``grace`` seconds, then cancel them and close every
        connection (uvicorn's own shutdown logs an ERROR when the grace runs out)."""
        for server in self.servers:
            server.close()
        state = self.server_state
        for connection in list(state.connections):
            connection.shutdown()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.grace
        while (state.connections or state.tasks) and loop.time() < deadline:
            await asyncio.sleep(_STOP_POLL)
        for connection in list(state.connections):  # first: their requests see a disconnect
            connection.transport.close()
        for task in list(state.tasks):
            task.cancel()
        if state.tasks:
            await asyncio.wait(list(state.tasks), timeout=_STOP_POLL * 10)
        for server in self.servers:
            await server.wait_closed()


class HttpFrontend:
    """``POST /v1/predict`` and ``GET|HEAD /healthz`` on ``settings.host:settings.port``,
    started (the port bound and accepting) when the constructor returns.

    Args:
        predictor: what scores (an ``InferCtx``).
        batcher: the micro-batcher requests are submitted to.
        metrics: the model server's metrics.
        settings: address, tokens, limits, idle timeout, worker threads.

    Raises:
        OSError: the port cannot be bound.
    """

    def __init__(
        self,
        predictor: Predictor,
        batcher: MicroBatcher,
        metrics: ModelMetrics,
        settings: HttpSettings,
    ) -> None:
        self._executor = ThreadPoolExecutor(
            settings.workers, thread_name_prefix="embeddb-model-http"
        )
        self.app = PredictApp(predictor, batcher, metrics, settings, self._executor)
        sock = socket.create_server((settings.host, settings.port))
        self.port = int(sock.getsockname()[1])
        config = uvicorn.Config(
            self.app,
            http=protocol_class(self.app),
            loop="asyncio",
            interface="asgi3",
            lifespan="off",
            ws="none",
            access_log=False,
            log_config=None,
            log_level=logging.WARNING,  # uvicorn's start and stop lines are not ours to log
            server_header=False,  # the answers name this server
            proxy_headers=False,
            timeout_keep_alive=settings.idle_seconds,  # type: ignore[arg-type]
        )
        self._server = _Server(config)
        self._sock = sock
        self._thread = threading.Thread(
            target=self._server.run,
            kwargs={"sockets": [sock]},
            name="embeddb-model-http",
            daemon=True,
        )
        self._thread.start()
        while not self._server.ready.wait(0.05):
            if not self._thread.is_alive():
                sock.close()
                self._executor.shutdown(wait=False)
                raise OSError(f"the HTTP server on port {self.port} did not start")

    @property
    def serving(self) -> bool:
        """What ``GET /healthz`` answers: SERVING (True) or NOT_SERVING."""
        return self.app.serving

    @serving.setter
    def serving(self, value: bool) -> None:
        self.app.serving = value

    @property
    def errors(self) -> Any:
        """Where unexpected errors are logged (a ``RateLimitedLog``)."""
        return self.app.errors

    @errors.setter
    def errors(self, value: Any) -> None:
        self.app.errors = value

    def connections(self) -> list[Any]:
        """The sockets of the client connections open now."""
        loop = self._server.loop
        if loop is None or not self._thread.is_alive():
            return []

        async def sockets() -> list[Any]:
            return [
                c.transport.get_extra_info("socket") for c in self._server.server_state.connections
            ]

        return asyncio.run_coroutine_threadsafe(sockets(), loop).result(10)

    def stop(self, grace: float) -> None:
        """Stop accepting; close idle connections; answer the requests in flight within
        ``grace`` s (then cancel them); close the port. Idempotent."""
        self.app.serving = False
        self._server.grace = grace
        self._server.should_exit = True
        self._thread.join()
        self._executor.shutdown(wait=False, cancel_futures=True)
        self._sock.close()
