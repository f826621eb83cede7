"""The HTTP/1.1 connection of the model server: uvicorn's httptools protocol (llhttp, the
parser of Node.js) with this server's refusals in JSON and its bounds on a request's head.

uvicorn answers what its parser refuses with a plain-text 400; this subclass answers every
refusal like the rest of the API (``{"error": ..., "status": ...}``, counted in
``embeddb_model_bad_requests_total``) and adds what uvicorn does not bound::

    a request line over 64 KiB                          414 uri_too_long
    a header line over 64 KiB, or over 100 headers      431 headers_too_large
    a request line the parser refuses                   400 bad_request_line
    no HTTP version (HTTP/0.9: "GET /path")             400 bad_request_line
    HTTP/2 or later, or a version it does not know      505 bad_version
    a bad Content-Length, or one with Transfer-Encoding 400 bad_length
    a header the parser refuses                         400 bad_header
    a method llhttp does not know (FOO)                 404 or 405, like a known one

and a request whose head or body stalls for ``idle_seconds`` is closed (uvicorn times out
idle keep-alive connections only). After any of these the connection closes: the parser has
lost the framing. The class is made per frontend by :func:`protocol_class`.
"""

from __future__ import annotations

import socket
from typing import Any

import httptools
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from embeddb.serving.http_app import Answer, PredictApp, preview

__all__ = ["MAX_HEADERS", "MAX_LINE_BYTES", "protocol_class"]

MAX_LINE_BYTES = 64 << 10  # the longest request line, and header line
MAX_HEADERS = 100


class _Refused(Exception):
    def __init__(self, code: int, reason: str, message: str, method: str | None) -> None:
        super().__init__(message)
        self.code, self.reason, self.message, self.method = code, reason, message, method


def protocol_class(app: PredictApp) -> type[HttpToolsProtocol]:
    """The connection protocol of a frontend serving ``app``."""

    class Protocol(_Protocol):
        _app = app

    return Protocol


class _Protocol(HttpToolsProtocol):
    """One connection (see the module docstring)."""

    _app: PredictApp

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._in_head = False  # in a request line or headers
        self._head_lines = 0  # lines of the head so far (the request line included)
        self._line_bytes = 0  # bytes of the head's last, unfinished line
        self._headers = 0
        self._rescue: bytearray | None = None  # a request line llhttp refused by its method

    # ---------------------------------------------------------------- bytes in
    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)
        # an answer's head and body are two writes: the body must not wait for the peer's
        # delayed ACK (asyncio sets TCP_NODELAY only on sockets whose proto is IPPROTO_TCP;
        # socket.create_server's have proto 0)
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        # a connection that never sends a request is closed like an idle keep-alive one
        self.timeout_keep_alive_task = self.loop.call_later(
            self._app.settings.idle_seconds, self.timeout_keep_alive_handler
        )

    def data_received(self, data: bytes) -> None:
        self._unset_keepalive_if_required()
        if self._rescue is not None:
            self._rescue_request_line(data)
            return
        # the head of a request starts with this chunk, or goes on in it: its lines are
        # counted (a chunk that also ends the previous request is not: pipelining only)
        own_head = self._in_head or not self._receiving_body()
        try:
            self.parser.feed_data(data)
            if self._in_head and own_head:
                self._check_head(data)
        except _Refused as refused:
            self._refuse(refused)
        except httptools.HttpParserInvalidMethodError:
            if own_head:  # a method llhttp does not know: read the request line ourselves
                self._rescue = bytearray()
                self._rescue_request_line(data)
            else:
                self._refuse(_Refused(400, "bad_request_line", "bad request line", None))
        except httptools.HttpParserUpgrade:
            pass  # no protocol switch is served: the request was answered as a plain one
        except httptools.HttpParserError as exc:
            self._refuse(self._classify(exc))
        else:
            if self._in_head or self._receiving_body():
                # a request stalled in its head or body is closed after idle_seconds
                # without bytes (uvicorn arms its timer between requests only)
                self.timeout_keep_alive_task = self.loop.call_later(
                    self._app.settings.idle_seconds, self.timeout_keep_alive_handler
                )

    def _receiving_body(self) -> bool:
        return self.cycle is not None and self.cycle.more_body

    def _check_head(self, data: bytes) -> None:
        """Bound the head still being received (``data`` is its latest part)."""
        newlines = data.count(b"\n")
        self._head_lines += newlines
        if newlines:
            self._line_bytes = len(data) - data.rfind(b"\n") - 1
        else:
            self._line_bytes += len(data)
        if self._line_bytes > MAX_LINE_BYTES:
            if self._head_lines == 0:
                raise _Refused(414, "uri_too_long", "the request line is over 64 KiB", None)
            raise _Refused(431, "headers_too_large", "a header line is over 64 KiB", self._method())
        if self._head_lines - 1 > MAX_HEADERS:
            raise _Refused(
                431, "headers_too_large", f"more than {MAX_HEADERS} headers", self._method()
            )
        if self._head_lines and self.parser.get_http_version() not in ("0.0", "0.9", "1.0", "1.1"):
            self._refuse_version()

    # ---------------------------------------------------------------- parser callbacks
    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_head = True
        self._head_lines = self._line_bytes = self._headers = 0

    def on_url(self, url: bytes) -> None:
        super().on_url(url)
        if len(self.url) > MAX_LINE_BYTES:
            raise _Refused(414, "uri_too_long", "the request line is over 64 KiB", None)

    def on_header(self, name: bytes, value: bytes) -> None:
        super().on_header(name, value)
        self._headers += 1
        if len(name) + len(value) + 2 > MAX_LINE_BYTES:
            raise _Refused(431, "headers_too_large", "a header line is over 64 KiB", self._method())
        if self._headers > MAX_HEADERS:
            raise _Refused(
                431, "headers_too_large", f"more than {MAX_HEADERS} headers", self._method()
            )

    def on_headers_complete(self) -> None:
        version = self.parser.get_http_version()
        if version == "0.9":  # a two-word request line: 'GET /path'
            message = "the request line has no HTTP version (HTTP/0.9)"
            raise _Refused(400, "bad_request_line", message, self._method())
        if version not in ("1.0", "1.1"):
            self._refuse_version()
        self._in_head = False
        super().on_headers_complete()

    # ---------------------------------------------------------------- refusals
    def _method(self) -> str | None:
        try:
            return str(self.parser.get_method().decode("latin-1"))
        except httptools.HttpParserError:
            return None

    def _refuse_version(self) -> None:
        version = self.parser.get_http_version()
        message = f"HTTP/{version} is not served on this HTTP/1.1 port"
        raise _Refused(505, "bad_version", message, None)

    def _classify(self, exc: httptools.HttpParserError) -> _Refused:
        cause = exc.__cause__ or exc.__context__
        if isinstance(cause, _Refused):  # raised in a callback, wrapped by the parser
            return cause
        text = str(exc)
        if text == "Invalid HTTP version":
            return _Refused(505, "bad_version", f"bad HTTP version: {text}", None)
        if "Content-Length" in text or "Transfer-Encoding" in text:
            return _Refused(400, "bad_length", f"bad Content-Length: {text}", self._method())
        if self._head_lines and "header" in text.lower():
            return _Refused(400, "bad_header", f"bad header: {text}", self._method())
        return _Refused(400, "bad_request_line", f"bad request line: {text}", None)

    def _refuse(self, refused: _Refused) -> None:
        answer = self._app.refusal(
            refused.code,
            refused.reason,
            refused.message,
            method=refused.method,
            client=self._client_name(),
            close=True,
        )
        self._write_and_close(answer, head_only=refused.method == "HEAD")

    def _rescue_request_line(self, data: bytes) -> None:
        """Answer a request whose method llhttp refused as the routes would (404, or 405:
        no route serves an unknown method), once its request line is in; then close."""
        assert self._rescue is not None
        self._rescue += data
        end = self._rescue.find(b"\n")
        if end < 0:
            if len(self._rescue) > MAX_LINE_BYTES:
                self._refuse(_Refused(414, "uri_too_long", "the request line is over 64 KiB", None))
            return
        words = bytes(self._rescue[:end]).split()
        if len(words) != 3 or not words[2].startswith(b"HTTP/1."):
            line = preview(bytes(self._rescue[:end]).rstrip(b"\r"))
            self._refuse(_Refused(400, "bad_request_line", f"bad request line {line}", None))
            return
        method, target = words[0].decode("latin-1"), words[1].decode("latin-1")
        answer = self._app.route_refusal(method, target, self._client_name(), close=True)
        assert answer is not None  # no route serves a method llhttp does not know
        self._write_and_close(answer, head_only=False)

    def _write_and_close(self, answer: Answer, head_only: bool) -> None:
        if self.transport.is_closing():
            return
        self.transport.write(answer.raw(self.server_state.default_headers, head_only))
        self.transport.close()

    def _client_name(self) -> str:
        return f"{self.client[0]}:{self.client[1]}" if self.client else "-"
