"""Cross-cutting server concerns as gRPC interceptors (STYLE.md §12)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any, NoReturn

import grpc

from embeddb.errors import EmbeddbError, status_of

__all__ = ["ErrorInterceptor", "abort_with", "rewrap"]

log = logging.getLogger(__name__)


def abort_with(context: grpc.ServicerContext, error: EmbeddbError) -> NoReturn:
    """End the call with the status of ``error`` (``embeddb.errors.STATUS_BY_ERROR``)."""
    context.abort(getattr(grpc.StatusCode, status_of(error)), str(error))
    raise AssertionError("unreachable: ServicerContext.abort raises")  # pragma: no cover


class ErrorInterceptor(grpc.ServerInterceptor):  # type: ignore[misc]
    """Turns embeddb exceptions into gRPC statuses (``embeddb.errors.STATUS_BY_ERROR``).

    Unary calls and server-streaming calls (raised before or between the streamed messages).
    An unexpected exception is logged with its traceback and answered with ``INTERNAL``; the
    server keeps serving either way.
    """

    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], grpc.RpcMethodHandler | None],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler | None:
        handler = continuation(handler_call_details)
        if handler is None:
            return handler
        method = handler_call_details.method
        if handler.unary_stream is not None:
            streaming = handler.unary_stream

            def guarded_stream(request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
                try:
                    yield from streaming(request, context)
                except EmbeddbError as exc:
                    abort_with(context, exc)
                except Exception:
                    log.exception("unexpected error in %s", method)
                    context.abort(
                        grpc.StatusCode.INTERNAL, f"internal error in {method}; see server log"
                    )

            return rewrap(handler, guarded_stream)
        if handler.unary_unary is None:
            return handler
        inner = handler.unary_unary

        def guarded(request: Any, context: grpc.ServicerContext) -> Any:
            try:
                return inner(request, context)
            except EmbeddbError as exc:
                abort_with(context, exc)
            except Exception:
                log.exception("unexpected error in %s", method)
                context.abort(
                    grpc.StatusCode.INTERNAL, f"internal error in {method}; see server log"
                )

        return rewrap(handler, guarded)


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
