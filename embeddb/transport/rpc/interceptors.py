"""Cross-cutting server concerns as gRPC interceptors (docs/style.md §12), and a rate-limited log
for what callers can trigger at will."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, NoReturn

import grpc

from embeddb.errors import EmbeddbError
from embeddb.transport.status import code_of

__all__ = ["ErrorInterceptor", "RateLimitedLog", "abort_with", "rewrap"]

logger = logging.getLogger(__name__)


class RateLimitedLog:
    """Logs the first event of each kind at once, then at most one line per ``interval``
    seconds, counting the events it did not log.

    Args:
        logger: where to log.
        interval: seconds between two lines of one kind.
        clock: the time source (monotonic seconds).
    """

    def __init__(
        self,
        logger: logging.Logger,
        interval: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._logger = logger
        self._interval = interval
        self._clock = clock
        self._lock = threading.Lock()
        self._state: dict[str, tuple[float, int]] = {}  # kind -> (last logged at, suppressed)

    def log(self, level: int, kind: str, message: str, *, exc_info: bool = False) -> bool:
        """Log ``message`` unless a line of ``kind`` was logged within the interval. Returns
        whether it was logged (with the count of those suppressed since the last line)."""
        now = self._clock()
        with self._lock:
            last, suppressed = self._state.get(kind, (-float("inf"), 0))
            if now - last < self._interval:
                self._state[kind] = (last, suppressed + 1)
                return False
            self._state[kind] = (now, 0)
        more = f" ({suppressed} more like it suppressed)" if suppressed else ""
        self._logger.log(level, "%s%s", message, more, exc_info=exc_info)
        return True


def abort_with(context: grpc.ServicerContext, error: EmbeddbError) -> NoReturn:
    """End the call with the status of ``error`` (the table of :mod:`embeddb.transport.status`)."""
    context.abort(code_of(error), str(error))
    raise AssertionError("unreachable: ServicerContext.abort raises")  # pragma: no cover


class ErrorInterceptor(grpc.ServerInterceptor):  # type: ignore[misc]
    """Turns embeddb exceptions into gRPC statuses (the table of :mod:`embeddb.transport.status`).

    Unary calls and server-streaming calls (raised before or between the streamed messages).
    An unexpected exception (outside the embeddb tree) is answered with ``INTERNAL`` (its code in
    the table; a client raises ``InternalError``) and logged with its traceback, at
    most once per ``log_interval`` seconds per method (a caller who found such a request cannot
    flood the log); the server keeps serving either way. Non-blocking handlers (the health
    service's ``Watch``, which answers through a callback and holds no thread) pass untouched.
    """

    def __init__(self, log_interval: float = 10.0) -> None:
        self._log = RateLimitedLog(logger, log_interval)

    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], grpc.RpcMethodHandler | None],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler | None:
        handler = continuation(handler_call_details)
        if handler is None:
            return handler
        method = handler_call_details.method
        unexpected = self._unexpected
        if getattr(handler.unary_stream, "experimental_non_blocking", False):
            return handler
        if handler.unary_stream is not None:
            streaming = handler.unary_stream

            def guarded_stream(request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
                try:
                    yield from streaming(request, context)
                except EmbeddbError as exc:
                    abort_with(context, exc)
                except Exception as exc:
                    unexpected(method, context, exc)

            return rewrap(handler, guarded_stream)
        if handler.unary_unary is None:
            return handler
        inner = handler.unary_unary

        def guarded(request: Any, context: grpc.ServicerContext) -> Any:
            try:
                return inner(request, context)
            except EmbeddbError as exc:
                abort_with(context, exc)
            except Exception as exc:
                unexpected(method, context, exc)

        return rewrap(handler, guarded)

    def _unexpected(self, method: str, context: grpc.ServicerContext, error: Exception) -> NoReturn:
        """Log the exception being handled (rate-limited) and answer with its code (INTERNAL)."""
        self._log.log(logging.ERROR, method, f"unexpected error in {method}", exc_info=True)
        context.abort(code_of(error), f"internal error in {method}; see server log")
        raise AssertionError("unreachable: ServicerContext.abort raises")  # pragma: no cover


def rewrap(handler: grpc.RpcMethodHandler, behaviour: Any) -> grpc.RpcMethodHandler:
    """A handler of the same kind and (de)serializers as ``handler`` running ``behaviour``."""
    kinds = {
        (False, False): grpc.unary_unary_rpc_method_handler,
        (False, True): grpc.unary_stream_rpc_method_handler,
        (True, False): grpc.stream_unary_rpc_method_handler,
        (True, True): grpc.stream_stream_rpc_method_handler,
    }
    make = kinds[(bool(handler.request_streaming), bool(handler.response_streaming))]
    return make(
        behaviour,
        request_deserializer=handler.request_deserializer,
        response_serializer=handler.response_serializer,
    )
