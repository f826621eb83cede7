"""Request metrics of any gRPC service: :class:`MetricsInterceptor` times every unary call and
hands it, with its status, to the service's own recorder (the shard's ``ShardMetrics``, the
model server's ``ModelMetrics``); :data:`LATENCY_BUCKETS` are the histogram buckets of both.

The ``/metrics`` HTTP endpoint is :mod:`embeddb.transport.rpc.metrics_http`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

import grpc

from embeddb.transport.rpc.interceptors import rewrap

__all__ = ["LATENCY_BUCKETS", "MetricsInterceptor", "Observe"]

# Lookups of a few ids take well under a millisecond; big batches that touch disk take longer.
LATENCY_BUCKETS = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)

Observe = Callable[[str, str, float, Any, Any], None]
"""``observe(method, status, seconds, request, response)``: one finished call (``method`` the
short name, ``status`` the gRPC status name, ``response`` None unless it returned one)."""


def _status_name(context: grpc.ServicerContext, finished: bool) -> str:
    code = context.code()
    if code is None:
        return "OK" if finished else "UNKNOWN"
    return str(getattr(code, "name", code))


class MetricsInterceptor(grpc.ServerInterceptor):  # type: ignore[misc]
    """Tells ``observe`` of every finished unary call of the services named in ``services``.

    Place it after the boundary, so that it sees the calls that reached the servicer (the
    boundary counts the ones it refuses), and before the error interceptor, so that failed
    calls are counted with their status.
    """

    def __init__(self, services: Iterable[str], observe: Observe) -> None:
        self._observe = observe
        self._services = frozenset(services)

    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], grpc.RpcMethodHandler | None],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler | None:
        handler = continuation(handler_call_details)
        service, _, method = handler_call_details.method.lstrip("/").partition("/")
        if handler is None or handler.unary_unary is None or service not in self._services:
            return handler
        inner = handler.unary_unary
        observe = self._observe

        def observed(request: Any, context: grpc.ServicerContext) -> Any:
            start = time.perf_counter()
            response = None
            finished = False
            try:
                response = inner(request, context)
                finished = True
                return response
            finally:
                status = _status_name(context, finished)
                observe(method, status, time.perf_counter() - start, request, response)

        return rewrap(handler, observed)
