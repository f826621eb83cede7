"""The Prometheus HTTP endpoint of a server: ``GET /metrics`` and nothing else.

:func:`serve_metrics` runs a small WSGI app on a threaded ``wsgiref`` server that logs no
requests. The app hands the exact path ``/metrics`` to
:func:`prometheus_client.make_wsgi_app` (text or OpenMetrics format and gzip as the scraper
asks; a query string such as ``?name[]=embeddb_rows`` filters the families) and answers every
other path ``404`` with a short plain-text body, where the bare ``prometheus_client`` app would
serve the metrics at any path. The path is compared exactly, ``..`` never resolved:
``/metrics/`` and ``/metrics/../x`` are other paths.

The endpoint is plain HTTP without authentication: bind it to loopback or a private network
(``ListenConfig.metrics_host``, ``embeddb serve --metrics-host``).

Every registry the project exports (shard and follower, model server, embedding worker) also
holds the standard process and Python collectors, added by :func:`add_runtime_collectors`:
``process_*`` (resident memory, CPU seconds, open fds, start time; Linux only),
``python_info`` and ``python_gc_*``, the series that dashboards and alert rules written for any
Python service expect.
"""

from __future__ import annotations

import contextlib
import socket
import socketserver
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from socketserver import ThreadingMixIn
from typing import TYPE_CHECKING, Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

from prometheus_client import (
    CollectorRegistry,
    GCCollector,
    PlatformCollector,
    ProcessCollector,
    make_wsgi_app,
)
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from _typeshed.wsgi import StartResponse, WSGIApplication, WSGIEnvironment

__all__ = [
    "METRICS_PATH",
    "MetricsEndpoint",
    "RuntimeCollector",
    "add_runtime_collectors",
    "metrics_app",
    "serve_metrics",
]

METRICS_PATH = "/metrics"
_NOT_FOUND = b"404 not found: this endpoint serves /metrics only\n"


class RuntimeCollector(Collector):
    """The standard process (``process_*``), platform (``python_info``) and garbage collector
    (``python_gc_*``) collectors as one, which describes its series so that a registry refuses
    it twice (the standard ones describe nothing, so a registry would take them twice)."""

    def __init__(self) -> None:
        self._parts = CollectorRegistry()
        ProcessCollector(registry=self._parts)
        PlatformCollector(registry=self._parts)
        GCCollector(registry=self._parts)

    def describe(self) -> list[Metric]:
        return list(self._parts.collect())

    def collect(self) -> Iterator[Metric]:
        yield from self._parts.collect()


def add_runtime_collectors(registry: CollectorRegistry) -> None:
    """Register a :class:`RuntimeCollector` in ``registry`` unless it holds one already (a
    registry shared by two metric sets)."""
    with contextlib.suppress(ValueError):  # "Duplicated timeseries": already there
        registry.register(RuntimeCollector())


def metrics_app(registry: CollectorRegistry) -> WSGIApplication:
    """A WSGI app serving ``registry`` at ``/metrics`` and ``404`` everywhere else."""
    inner = make_wsgi_app(registry)

    def app(environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        if environ.get("PATH_INFO") == METRICS_PATH:
            body: Iterable[bytes] = inner(environ, start_response)
            return body
        start_response(
            "404 Not Found",
            [
                ("Content-Type", "text/plain; charset=utf-8"),
                ("Content-Length", str(len(_NOT_FOUND))),
            ],
        )
        return [_NOT_FOUND]

    return app


class _QuietHandler(WSGIRequestHandler):
    """No access log: scrapes every few seconds would flood the server's stderr."""

    def log_message(self, format: str, *args: Any) -> None:
        return


class _Server(ThreadingMixIn, WSGIServer):
    """A thread per request; the threads never hold up the process's exit."""

    daemon_threads = True

    def __init__(self, address: tuple[str, int], family: socket.AddressFamily) -> None:
        self.address_family = family  # read by TCPServer.__init__ when it makes the socket
        super().__init__(address, _QuietHandler)

    def server_bind(self) -> None:
        # HTTPServer.server_bind resolves the host's FQDN (a reverse DNS lookup that can stall
        # for seconds without DNS) only to fill SERVER_NAME, which the app never reads.
        socketserver.TCPServer.server_bind(self)
        host, port = self.server_address[:2]
        self.server_name = str(host)
        self.server_port = int(port)
        self.setup_environ()


@dataclass
class MetricsEndpoint:
    """A running HTTP server exposing one registry at ``/metrics``."""

    server: WSGIServer
    thread: threading.Thread
    port: int

    def stop(self) -> None:
        """Stop serving and close the socket."""
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()


def serve_metrics(
    registry: CollectorRegistry, host: str = "127.0.0.1", port: int = 0
) -> MetricsEndpoint:
    """Expose ``registry`` over HTTP at ``http://host:port/metrics`` (port 0 picks a free one).

    Args:
        registry: the metrics to serve.
        host: the address to bind, IPv4 or IPv6 (or a name resolving to one).
        port: the TCP port.

    Raises:
        OSError: the address cannot be resolved or bound.
    """
    family, _, _, _, sockaddr = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    server = _Server((str(sockaddr[0]), port), family)
    server.set_app(metrics_app(registry))
    thread = threading.Thread(target=server.serve_forever, name="embeddb-metrics", daemon=True)
    thread.start()
    return MetricsEndpoint(server=server, thread=thread, port=int(server.server_port))
