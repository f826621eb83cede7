"""The model server's HTTP routes as an ASGI application (served by uvicorn: ``http.py``).

Every answer is JSON (:class:`Answer`); what each route answers, the refusals and their
``embeddb_model_bad_requests_total`` reasons are listed in ``http.py``'s docstring. The
event loop never scores nor parses: a ``POST /v1/predict`` body is read on the loop, then
checked, parsed, scored and its answer serialized in a worker thread (:meth:`PredictApp.score`,
on the frontend's executor), so a large body or a slow model never holds other connections.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from concurrent.futures import Executor
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any

from embeddb.errors import EmbeddbError, InvalidArgumentError, ResourceExhaustedError
from embeddb.serving.batcher import MicroBatcher
from embeddb.serving.body import BodyLimits, parse_json
from embeddb.serving.codec import finite_scores
from embeddb.serving.metrics import ModelMetrics
from embeddb.serving.predictor import Predictor
from embeddb.transport.rpc.auth import Tokens, authenticate
from embeddb.transport.rpc.interceptors import RateLimitedLog
from embeddb.transport.status import HTTP_STATUS, code_of

__all__ = [
    "DRAIN_BYTES",
    "GRPC_STATUS",
    "HTTP_STATUS",
    "METHODS",
    "Answer",
    "HttpSettings",
    "PredictApp",
    "method_label",
    "preview",
]

logger = logging.getLogger(__name__)

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]

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

METHODS = frozenset(
    {"GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "CONNECT", "TRACE"}
)
DRAIN_BYTES = 64 << 10  # a refused request's unread body up to this size is dropped, not closed on
SERVER = "embeddb-model"

_ROUTES: dict[str, tuple[str, ...]] = {"/v1/predict": ("POST",), "/healthz": ("GET", "HEAD")}
_BODY_KEYS = ("records", "hashed_records")
_RECORD_LEVEL = 3  # records open at depth 3 in {"records": [{...}, ...]}
# the bad-request reason of a 4xx embeddb error of POST /v1/predict (else the status name in
# lower case), but INVALID_ARGUMENT's, which depends on the step that raised it
_REASON_OF_STATUS = {"UNAUTHENTICATED": "unauthenticated", "RESOURCE_EXHAUSTED": "too_large"}


def preview(value: object, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def method_label(method: str | None) -> str:
    """The ``method`` label of a bad request: the method, OTHER for one this server does not
    know, NONE for a request line that was not parsed."""
    return "NONE" if not method else method if method in METHODS else "OTHER"


@dataclass(frozen=True)
class HttpSettings:
    """What the HTTP frontend serves with (taken from the model server's config).

    Attributes:
        host: the address to bind.
        port: the port (0 picks a free one).
        tokens: the bearer tokens (None: no authentication).
        limits: the bounds of a request body.
        max_records: the most records of one request.
        idle_seconds: an idle keep-alive connection (or a request stalled in its head or
            body) is closed after this long.
        workers: threads that parse and score bodies (requests beyond wait for one).
    """

    host: str = "127.0.0.1"
    port: int = 0
    tokens: Tokens | None = None
    limits: BodyLimits = field(default_factory=BodyLimits)
    max_records: int = 65536
    idle_seconds: float = 30.0
    workers: int = 8


@dataclass(frozen=True)
class Answer:
    """One JSON answer: status, body (serialized), extra headers, whether the connection
    closes after it."""

    code: int
    body: bytes
    headers: tuple[tuple[str, str], ...] = ()
    close: bool = False

    @classmethod
    def of(
        cls,
        code: int,
        doc: dict[str, Any],
        headers: Iterable[tuple[str, str]] = (),
        close: bool = False,
    ) -> Answer:
        extra = tuple(headers) + ((("WWW-Authenticate", "Bearer"),) if code == 401 else ())
        return cls(code, json.dumps(doc, allow_nan=False).encode(), extra, close)

    def header_lines(self) -> list[tuple[bytes, bytes]]:
        lines = [
            (b"server", SERVER.encode()),
            (b"content-type", b"application/json"),
            (b"content-length", str(len(self.body)).encode()),
        ]
        lines += [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in self.headers]
        if self.close:
            lines.append((b"connection", b"close"))
        return lines

    def raw(self, default_headers: Iterable[tuple[bytes, bytes]], head_only: bool) -> bytes:
        """The whole answer as bytes (status line, headers, body unless ``head_only``)."""
        lines = [f"HTTP/1.1 {self.code} {HTTPStatus(self.code).phrase}".encode()]
        lines += [name + b": " + value for name, value in (*default_headers, *self.header_lines())]
        head = b"\r\n".join(lines) + b"\r\n\r\n"
        return head if head_only else head + self.body


class PredictApp:
    """``POST /v1/predict`` and ``GET|HEAD /healthz`` (an ASGI 3 application).

    Attributes:
        serving: what ``/healthz`` answers (SERVING or NOT_SERVING).
        errors: where unexpected errors are logged, at most one traceback per interval.
    """

    def __init__(
        self,
        predictor: Predictor,
        batcher: MicroBatcher,
        metrics: ModelMetrics,
        settings: HttpSettings,
        executor: Executor,
    ) -> None:
        self.predictor = predictor
        self.batcher = batcher
        self.metrics = metrics
        self.settings = settings
        self.executor = executor
        self.serving = True
        self.errors = RateLimitedLog(logger)

    # ------------------------------------------------------------------ refusals
    def refusal(
        self,
        code: int,
        reason: str | None,
        message: str,
        *,
        method: str | None,
        client: str = "-",
        status: str | None = None,
        allow: Iterable[str] = (),
        close: bool = False,
    ) -> Answer:
        """An error answer; a bad request (``reason``) is counted and logged at DEBUG."""
        status = status or GRPC_STATUS.get(code, "UNKNOWN")
        if reason is not None:
            self.metrics.observe_bad_request(method_label(method), reason)
        logger.debug("http %s: %d %s: %s", client, code, reason or status, message)
        allowed = tuple(allow)
        headers = [("Allow", ", ".join(allowed))] if allowed else []
        return Answer.of(code, {"error": message, "status": status}, headers, close)

    def route_refusal(self, method: str, target: str, client: str, close: bool) -> Answer | None:
        """The 404 or 405 of a request for ``target`` (None: the route serves it)."""
        path = target.split("?", 1)[0]
        allowed = _ROUTES.get(path)
        if allowed is None:
            message = f"no such path {preview(target)}"
            return self.refusal(
                404, "unknown_path", message, method=method, client=client, close=close
            )
        if method not in allowed:
            message = (
                f"method {preview(method)} is not allowed on {path} (allowed: {', '.join(allowed)})"
            )
            return self.refusal(
                405, "bad_method", message, method=method, client=client, allow=allowed, close=close
            )
        return None

    # ------------------------------------------------------------------ ASGI
    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":  # lifespan is off and websockets are not served
            return
        method: str = scope["method"]
        target = scope["raw_path"].decode("latin-1")
        if scope["query_string"]:
            target += "?" + scope["query_string"].decode("latin-1")
        headers = _Headers(scope["headers"])
        client = "{}:{}".format(*scope["client"]) if scope.get("client") else "-"
        try:
            answer = await self._answer(method, target, headers, client, receive)
        except (ConnectionError, asyncio.CancelledError):
            return  # the client went away (or the server stopped): nothing to answer
        except Exception:
            self.errors.log(
                logging.ERROR, "http", f"unexpected error in HTTP {method} {target}", exc_info=True
            )
            answer = Answer.of(
                500,
                {"error": "internal error; see the server log", "status": "INTERNAL"},
                close=True,
            )
        await send(
            {"type": "http.response.start", "status": answer.code, "headers": answer.header_lines()}
        )
        await send({"type": "http.response.body", "body": answer.body})

    async def _answer(
        self, method: str, target: str, headers: _Headers, client: str, receive: Receive
    ) -> Answer:
        # a body this answer leaves unread: dropped by the server when small, else closed on
        unread = headers.has_body() and (headers.chunked() or headers.length() > DRAIN_BYTES)
        refused = self.route_refusal(method, target, client, unread)
        if refused is not None:
            return refused
        if target.split("?", 1)[0] == "/healthz":
            serving = self.serving
            doc = {"status": "SERVING" if serving else "NOT_SERVING"}
            return Answer.of(200 if serving else 503, doc, close=unread)
        return await self._predict(method, headers, client, receive)

    async def _predict(
        self, method: str, headers: _Headers, client: str, receive: Receive
    ) -> Answer:
        started = time.perf_counter()
        status = "OK"
        try:
            if self.settings.tokens is not None:  # any role may predict
                authenticate(self.settings.tokens, headers.pairs())
            if headers.chunked():
                raise _Framing(
                    "Transfer-Encoding is not accepted: send the body with a Content-Length"
                )
            if not headers.has_length():
                raise _Framing("a Content-Length header is required")
            self.settings.limits.check_body_size(headers.length())
            body = await _read_body(receive)
            loop = asyncio.get_running_loop()
            status, answer = await loop.run_in_executor(self.executor, self.score, body, client)
            return answer
        except EmbeddbError as exc:
            status = code_of(exc).name
            unread = headers.chunked() or headers.length() > DRAIN_BYTES
            return self._refuse_error(exc, "bad_length", method, client, close=unread)
        except (ConnectionError, asyncio.CancelledError):
            status = "CANCELLED"
            raise
        except Exception:
            status = "INTERNAL"
            raise
        finally:
            self.metrics.observe("http_predict", status, time.perf_counter() - started)

    # ------------------------------------------------------------------ a worker thread
    def score(self, body: bytes, client: str = "-") -> tuple[str, Answer]:
        """Check, parse and score one body (in a worker thread): ``(status name, answer)``."""
        step = "malformed"  # the reason of an INVALID_ARGUMENT, by step
        try:
            doc = parse_json(body, self.settings.limits, _RECORD_LEVEL)
            step = "invalid_argument"
            return "OK", Answer.of(200, {"scores": self.predict(doc)})
        except EmbeddbError as exc:
            return code_of(exc).name, self._refuse_error(exc, step, "POST", client)

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
        max_records = self.settings.max_records
        if isinstance(records, list) and len(records) > max_records:
            raise ResourceExhaustedError(
                f"{len(records)} records in one request, more than this server accepts "
                f"({max_records}); split the request"
            )
        batch = (
            self.predictor.batch_from_records(records)
            if key == "records"
            else self.predictor.batch_from_hashed_records(records)
        )
        scores: list[float] = finite_scores(self.batcher.submit(batch).result()).tolist()
        return scores

    def _refuse_error(
        self, exc: EmbeddbError, invalid: str, method: str, client: str, close: bool = False
    ) -> Answer:
        """The answer of an embeddb error (``invalid``: the reason of an INVALID_ARGUMENT)."""
        status = code_of(exc).name
        code = HTTP_STATUS.get(status, 500)
        reason = (
            None
            if code >= 500
            else invalid
            if status == "INVALID_ARGUMENT"
            else _REASON_OF_STATUS.get(status, status.lower())
        )
        close = close or isinstance(exc, _Framing)
        return self.refusal(
            code, reason, str(exc), method=method, client=client, status=status, close=close
        )


class _Framing(InvalidArgumentError):
    """A body this server does not read (chunked, or no length): the connection closes."""


class _Headers:
    """A request's headers (ASGI: lower-case byte names)."""

    def __init__(self, raw: Iterable[tuple[bytes, bytes]]) -> None:
        self.raw = list(raw)

    def pairs(self) -> list[tuple[str, str]]:
        return [(k.decode("latin-1"), v.decode("latin-1")) for k, v in self.raw]

    def chunked(self) -> bool:
        return any(k == b"transfer-encoding" for k, _ in self.raw)

    def has_length(self) -> bool:
        return any(k == b"content-length" for k, _ in self.raw)

    def length(self) -> int:
        """The Content-Length (checked by the parser: digits, never two different ones)."""
        for k, v in self.raw:
            if k == b"content-length":
                return int(v)
        return 0

    def has_body(self) -> bool:
        return self.chunked() or self.length() > 0


async def _read_body(receive: Receive) -> bytes:
    """The request body (the parser frames it by its Content-Length)."""
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ConnectionError("the client went away before the body was read")
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks)
