"""The model server's HTTP/JSON frontend: a ThreadingHTTPServer (HTTP/1.1, keep-alive).

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

Answers go out in one write each (status line, headers and body joined), on sockets with
``TCP_NODELAY``: a keep-alive connection never waits for the peer's delayed ACK (Nagle's
algorithm would hold a second write until the first is acknowledged: ~40 ms per request).

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
    malformed         400: the body is not    too_large         413: body or records
                      JSON this server reads  invalid_argument  400: the records

An unexpected exception is answered 500 ``INTERNAL`` and logged with its traceback by a
:class:`~embeddb.transport.rpc.interceptors.RateLimitedLog`: at most one traceback per interval, so
a
flood of requests that trip a bug cannot flood the log. A refused request whose body was
not read has it read and dropped when small (the connection stays open), else the connection
is closed after the answer.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import socket
import threading
import time
from collections.abc import Iterable, Sequence
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

from embeddb.errors import EmbeddbError, InvalidArgumentError, ResourceExhaustedError
from embeddb.serving.batcher import MicroBatcher
from embeddb.serving.body import MAX_JSON_DEPTH, json_depth, parse_json
from embeddb.serving.codec import finite_scores
from embeddb.serving.metrics import ModelMetrics
from embeddb.transport.rpc.auth import authenticate
from embeddb.transport.rpc.interceptors import RateLimitedLog
from embeddb.transport.status import code_of

if TYPE_CHECKING:
    from embeddb.serving.server import ModelServerConfig, Predictor

__all__ = [
    "GRPC_STATUS",
    "HTTP_STATUS",
    "MAX_JSON_DEPTH",
    "HttpFrontend",
    "json_depth",
    "parse_json",
]

logger = logging.getLogger(__name__)

# gRPC status name → HTTP status of the JSON API.
HTTP_STATUS: dict[str, int] = {
    "OK": 200,
    "INVALID_ARGUMENT": 400,
    "FAILED_PRECONDITION": 400,
    "OUT_OF_RANGE": 400,
    "UNAUTHENTICATED": 401,
    "PERMISSION_DENIED": 403,
    "NOT_FOUND": 404,
    "RESOURCE_EXHAUSTED": 413,
    "UNAVAILABLE": 503,
    "DEADLINE_EXCEEDED": 504,
}

# HTTP status → the gRPC status name in the body of an answer that no embeddb error caused.
GRPC_STATUS: dict[int, str] = {
    400: "INVALID_ARGUMENT",
    404: "NOT_FOUND",
    405: "UNIMPLEMENTED",
    413: "RESOURCE_EXHAUSTED",
    414: "RESOURCE_EXHAUSTED",
    431: "RESOURCE_EXHAUSTED",
    500: "INTERNAL",
    501: "UNIMPLEMENTED",
    505: "UNIMPLEMENTED",
}

_BODY_KEYS = ("records", "hashed_records")
_RECORD_LEVEL = 3  # records open at depth 3 in {"records": [{...}, ...]}

_ROUTES: dict[str, tuple[str, ...]] = {"/v1/predict": ("POST",), "/healthz": ("GET", "HEAD")}
_METHODS = frozenset(
    {"GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "CONNECT", "TRACE"}
)
# the bad-request reason of each refusal of the stdlib parser (BaseHTTPRequestHandler)
_PARSER_REASON = {
    400: "bad_request_line",
    414: "uri_too_long",
    431: "headers_too_large",
    505: "bad_version",
}
# the bad-request reason of a 4xx embeddb error of POST /v1/predict (else the status name in
# lower case), but INVALID_ARGUMENT's, which depends on the step that raised it
_REASON_OF_STATUS = {"UNAUTHENTICATED": "unauthenticated", "RESOURCE_EXHAUSTED": "too_large"}
_DRAIN_BYTES = 64 << 10  # a refused request's unread body up to this size is read and dropped
_LENGTH = re.compile(r"[0-9]{1,19}")


def _preview(value: object, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


# ------------------------------------------------------------------------------- the log
# --------------------------------------------------------------------------- the frontend
class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(
        self,
        address: tuple[str, int],
        handler: type[BaseHTTPRequestHandler],
        errors: RateLimitedLog,
    ) -> None:
        self.errors = errors
        super().__init__(address, handler)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """An exception that escaped a handler (the socketserver default prints it)."""
        self.errors.log(
            logging.ERROR,
            "http",
            f"unexpected error serving HTTP to {client_address}",
            exc_info=True,
        )


class HttpFrontend:
    """``POST /v1/predict`` and ``GET|HEAD /healthz``, one thread per connection.

    Args:
        predictor: what scores (an ``InferCtx``).
        batcher: the micro-batcher requests are submitted to.
        metrics: the model server's metrics.
        config: the server's config (``listen.host``, ``listen.tokens``, ``http_port``, the
            limits).
    """

    def __init__(
        self,
        predictor: Predictor,
        batcher: MicroBatcher,
        metrics: ModelMetrics,
        config: ModelServerConfig,
    ) -> None:
        self.predictor = predictor
        self.batcher = batcher
        self.metrics = metrics
        self.config = config
        self.serving = True
        self.stopping = False
        self.errors = RateLimitedLog(logger)
        self.limits = config.body_limits()
        self._lock = threading.Condition()
        self._in_flight = 0
        self._connections: set[socket.socket] = set()
        self.httpd = _Server(
            (config.listen.host, config.http_port or 0), _handler(self), self.errors
        )
        self.port = int(self.httpd.server_address[1])
        self._thread = threading.Thread(
            target=self.httpd.serve_forever,
            kwargs={"poll_interval": 0.1},
            name="embeddb-model-http",
            daemon=True,
        )
        self._thread.start()

    # connection and request bookkeeping, for a graceful stop
    def connections(self) -> list[socket.socket]:
        """The client connections open now."""
        with self._lock:
            return list(self._connections)

    def opened(self, conn: socket.socket) -> None:
        with self._lock:
            self._connections.add(conn)

    def closed(self, conn: socket.socket) -> None:
        with self._lock:
            self._connections.discard(conn)

    def begin(self) -> None:
        with self._lock:
            self._in_flight += 1

    def end(self) -> None:
        with self._lock:
            self._in_flight -= 1
            self._lock.notify_all()

    def stop(self, grace: float) -> None:
        """Stop accepting; wait up to ``grace`` s for requests in flight; close every
        connection (idle keep-alive ones included); close the socket."""
        self.stopping = True
        self.serving = False
        self.httpd.shutdown()
        self._thread.join()
        deadline = time.monotonic() + grace
        with self._lock:
            while self._in_flight and self._lock.wait(max(0.0, deadline - time.monotonic())):
                pass
            connections = list(self._connections)
        for conn in connections:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        self.httpd.server_close()

    def authenticate(self, headers: Any) -> None:
        """UnauthenticatedError unless tokens are off or ``Authorization`` holds one (any
        role may predict)."""
        if self.config.listen.tokens is not None:
            authenticate(self.config.listen.tokens, list(headers.items()))

    def predict(self, doc: object) -> list[float]:
        """Validate and score the JSON document of one ``POST /v1/predict`` body."""
        if not isinstance(doc, dict):
            raise InvalidArgumentError(
                'the body must be a JSON object {"records": [record, ...]}, got a JSON '
                f"{type(doc).__name__}"
            )
        given = [key for key in _BODY_KEYS if key in doc]
        if len(given) != 1:
            raise InvalidArgumentError(
                'the body needs exactly one of "records" (raw records) and "hashed_records" '
                f"(pre-hashed records), got {'both' if given else 'neither'}"
            )
        extra = sorted(set(doc) - set(_BODY_KEYS))
        if extra:
            raise InvalidArgumentError(
                f"unknown keys {extra} (the body has 'records' or 'hashed_records')"
            )
        (key,) = given
        records = doc[key]
        if isinstance(records, list) and len(records) > self.config.max_records:
            raise ResourceExhaustedError(
                f"{len(records)} records in one request, more than this server accepts "
                f"({self.config.max_records}); split the request"
            )
        batch = (
            self.predictor.batch_from_records(records)
            if key == "records"
            else self.predictor.batch_from_hashed_records(records)
        )
        scores: list[float] = finite_scores(self.batcher.submit(batch).result()).tolist()
        return scores


def _content_length(values: Sequence[str]) -> int:
    """The body length of the ``Content-Length`` header ``values`` (repeats must agree)."""
    distinct = {v.strip() for v in values}
    if len(distinct) != 1:
        raise InvalidArgumentError(f"conflicting Content-Length headers {sorted(distinct)}")
    (raw,) = distinct
    if _LENGTH.fullmatch(raw) is None:
        raise InvalidArgumentError(f"bad Content-Length {_preview(raw)}")
    return int(raw)


def _handler(front: HttpFrontend) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        """One connection. Every method, known or not, goes to :meth:`_route` (see
        ``__getattr__``); the stdlib parser's refusals come through :meth:`send_error`."""

        protocol_version = "HTTP/1.1"
        server_version = "embeddb-model"
        disable_nagle_algorithm = True  # TCP_NODELAY (StreamRequestHandler.setup)
        timeout = front.config.http_idle_seconds
        # per request (reset in parse_request): an answer was sent; the body was consumed
        _responded = False
        _body_done = False

        def setup(self) -> None:
            super().setup()
            front.opened(self.connection)

        def finish(self) -> None:
            front.closed(self.connection)
            super().finish()

        def handle(self) -> None:
            try:
                super().handle()
            except (ConnectionError, TimeoutError) as exc:  # the peer went away or stalled
                logger.debug("http %s: connection lost: %r", self.address_string(), exc)

        def log_message(self, format: str, *args: Any) -> None:
            logger.debug("http %s: " + format, self.address_string(), *args)

        def __getattr__(self, name: str) -> Any:
            # handle_one_request calls do_<METHOD>, else answers HTML 501: route them all
            if name.startswith("do_"):
                return self._route
            raise AttributeError(name)

        def parse_request(self) -> bool:
            self._responded = self._body_done = False
            if not super().parse_request():
                return False
            if self.request_version == "HTTP/0.9":  # a two-word request line: 'GET /path'
                self.send_error(400, "the request line has no HTTP version (HTTP/0.9)")
                return False
            return True

        def send_error(
            self, code: int, message: str | None = None, explain: str | None = None
        ) -> None:
            """The stdlib parser's refusals, in JSON like every other answer."""
            self.close_connection = True
            self._body_done = True  # the framing is unknown: never read on
            # a request line that failed to parse leaves request_version at HTTP/0.9, whose
            # answers have no status line and no headers: answer as HTTP/1.x
            if self.request_version == "HTTP/0.9":
                self.request_version = "HTTP/1.0"
            self._refuse(code, _PARSER_REASON.get(code), message or HTTPStatus(code).phrase)

        # ------------------------------------------------------------------ routing
        def _route(self) -> None:
            path = self.path.split("?", 1)[0]
            allowed = _ROUTES.get(path)
            try:
                if allowed is None:
                    self._refuse(404, "unknown_path", f"no such path {_preview(self.path)}")
                elif self.command not in allowed:
                    self._refuse(
                        405,
                        "bad_method",
                        f"method {_preview(self.command)} is not allowed on {path} "
                        f"(allowed: {', '.join(allowed)})",
                        allow=allowed,
                    )
                elif path == "/healthz":
                    self._drop_body()
                    serving = front.serving
                    self._send(
                        200 if serving else 503, {"status": "SERVING" if serving else "NOT_SERVING"}
                    )
                else:
                    self._predict()
            except (ConnectionError, TimeoutError):
                raise
            except Exception:
                front.errors.log(
                    logging.ERROR,
                    "http",
                    f"unexpected error in HTTP {self.command} {path}",
                    exc_info=True,
                )
                self.close_connection = True
                if not self._responded:
                    self._send(
                        500, {"error": "internal error; see the server log", "status": "INTERNAL"}
                    )

        def _predict(self) -> None:
            front.begin()
            started = time.perf_counter()
            status = "OK"
            invalid = "bad_length"  # the reason of an INVALID_ARGUMENT, by step
            try:
                front.authenticate(self.headers)
                body = self._body()
                invalid = "malformed"
                doc = parse_json(body, front.limits, _RECORD_LEVEL)
                invalid = "invalid_argument"
                self._send(200, {"scores": front.predict(doc)})
            except EmbeddbError as exc:
                status = code_of(exc).name
                code = HTTP_STATUS.get(status, 500)
                reason = (
                    None
                    if code >= 500
                    else invalid
                    if status == "INVALID_ARGUMENT"
                    else _REASON_OF_STATUS.get(status, status.lower())
                )
                self._refuse(code, reason, str(exc), status=status)
            except (ConnectionError, TimeoutError):
                status = "CANCELLED"
                raise
            except Exception:
                status = "INTERNAL"
                raise
            finally:
                front.metrics.observe("http_predict", status, time.perf_counter() - started)
                front.end()

        # --------------------------------------------------------------- the body
        def _body(self) -> bytes:
            if "Transfer-Encoding" in self.headers:
                self.close_connection = True
                raise InvalidArgumentError(
                    "Transfer-Encoding is not accepted: send the body with a Content-Length"
                )
            values = self.headers.get_all("Content-Length")
            if not values:
                raise InvalidArgumentError("a Content-Length header is required")
            length = _content_length(values)
            front.limits.check_body_size(length)
            self._body_done = True
            body = self.rfile.read(length)
            if len(body) < length:
                self.close_connection = True
                raise InvalidArgumentError(
                    f"the body ended after {len(body)} of its {length} bytes"
                )
            return body

        def _drop_body(self) -> None:
            """Before answering a request whose body was not read: read and drop a small
            one, so the connection can serve the next request; else close it after."""
            if self._body_done:
                return
            self._body_done = True
            if "Transfer-Encoding" in self.headers:
                self.close_connection = True
                return
            values = self.headers.get_all("Content-Length")
            if not values:
                return  # no body
            try:
                length = _content_length(values)
            except InvalidArgumentError:
                length = _DRAIN_BYTES + 1
            if length > _DRAIN_BYTES or len(self.rfile.read(length)) < length:
                self.close_connection = True

        # ---------------------------------------------------------------- answers
        def _refuse(
            self,
            code: int,
            reason: str | None,
            message: str,
            status: str | None = None,
            allow: Iterable[str] = (),
        ) -> None:
            """Answer an error; a bad request (``reason``) is counted and logged at DEBUG."""
            status = status or GRPC_STATUS.get(code, "UNKNOWN")
            if reason is not None:
                command = self.command
                method = command if command in _METHODS else "OTHER" if command else "NONE"
                front.metrics.observe_bad_request(method, reason)
            logger.debug(
                "http %s: %d %s: %s", self.address_string(), code, reason or status, message
            )
            self._drop_body()
            headers = [("Allow", ", ".join(allow))] if allow else []
            self._send(code, {"error": message, "status": status}, headers)

        def _send(
            self, code: int, doc: dict[str, Any], headers: Iterable[tuple[str, str]] = ()
        ) -> None:
            """The answer in one write: status line, headers and body joined (with the
            socket's TCP_NODELAY, no wait for an ACK between two writes)."""
            data = json.dumps(doc, allow_nan=False).encode()
            self._responded = True
            self.log_request(code)
            lines = [
                f"{self.protocol_version} {code} {HTTPStatus(code).phrase}",
                f"Server: {self.version_string()}",
                f"Date: {self.date_time_string()}",
                "Content-Type: application/json",
                f"Content-Length: {len(data)}",
            ]
            lines += [f"{name}: {value}" for name, value in headers]
            if code == 401:
                lines.append("WWW-Authenticate: Bearer")
            if front.stopping:
                self.close_connection = True
            if self.close_connection:
                lines.append("Connection: close")
            head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
            self.wfile.write(head if self.command == "HEAD" else head + data)

    return Handler
