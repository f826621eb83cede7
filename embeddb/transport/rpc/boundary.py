"""The server's trust boundary: one gRPC interceptor that runs before any request is parsed.

For a call of a guarded service (every service but the open ones: health and reflection), in
this order, before the servicer sees anything::

    1 authenticate   the bearer token in the call's metadata → a role    UNAUTHENTICATED
                     (done when the call's handler is looked up: not a byte of the request has
                     been parsed yet, so an anonymous caller's garbage is never deserialized)
    2 authorize      may this role call this method at all?             PERMISSION_DENIED
    3 decode         the request bytes → the message                    INVALID_ARGUMENT
                     ("malformed LookupRequest: ...")
    4 enum values    every enum field holds a value its enum defines    INVALID_ARGUMENT
                     (proto3 parses any number; the message names the field path)
    5 authorize      request-dependent rules (a read-only caller's      PERMISSION_DENIED
                     training lookup)
    6 the servicer   with the caller's role in :data:`CALLER_ROLE`

A call refused at step 1 or 2 is refused before gRPC reads its request: the boundary answers
it through a handler that takes its request as a stream and never reads it, so an anonymous
caller's upload is never received (gRPC Python otherwise receives a unary request whole,
up to the server's receive limit, before any handler runs). Every method kind is guarded the
same way — unary-unary, unary-stream, stream-unary, stream-stream — and a method of a guarded
service is closed unless the policy names it for the caller's role.

Admitted calls of guarded services are charged to the server's memory budget
(:class:`~embeddb.transport.rpc.budget.MemoryBudget`) after step 5 and before the servicer runs:
their
request's size and their expected answer's (``cost``), times the copies each makes. A call
that does not fit within ``budget_wait_s`` is RESOURCE_EXHAUSTED before it allocates its
answer; the charge is given back when gRPC has ended the call (its answer sent).
Every request's size is told to ``note_bytes`` (the malloc trimmer), refused ones included,
so the memory of a burst of refused large requests is given back too.

Open services (health, reflection) skip 1, 2 and 5 but their requests are decoded here too
(3, 4; each message of reflection's request stream as it is read), so an anonymous caller's
garbage to a health check or to reflection is INVALID_ARGUMENT as well. gRPC itself would answer
undecodable bytes with INTERNAL and log a traceback per request: here every refusal is counted
(``on_refused``, the ``embeddb_requests_total`` and ``embeddb_bad_requests_total`` metrics) and
logged by a :class:`RateLimitedLog`: the first one of a kind at once, then at most one summary
line per interval — a flood of bad requests cannot flood the log.

The boundary also places calls on thread pools (gRPC's ``experimental_thread_pool`` handler
attribute): methods named in ``dedicated_pools`` (the health check) run on their own executor,
so data calls and streams can never starve them, and the server-streaming methods of guarded
services (``Subscribe``, ``FetchSnapshot``) on ``stream_pool``, so long-lived streams cannot
take the threads of data calls.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent import futures
from dataclasses import dataclass
from typing import Any, NoReturn

import grpc
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message

from embeddb.errors import EmbeddbError, InvalidArgumentError, ResourceExhaustedError
from embeddb.transport.rpc.auth import CALLER_ROLE, AccessPolicy, Role, Tokens, authenticate
from embeddb.transport.rpc.budget import MemoryBudget
from embeddb.transport.rpc.interceptors import RateLimitedLog
from embeddb.transport.status import code_of

__all__ = [
    "ANSWER_COPIES",
    "REQUEST_COPIES",
    "Boundary",
    "Cost",
    "RefusalObserver",
    "RefusedCall",
    "enum_problem",
]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class RefusedCall:
    """A call refused at the boundary, as told to the ``on_refused`` observer.

    Attributes:
        service: the full service name (``embeddb.v1.EmbeddingStoreService``).
        method: the short method name.
        status: the gRPC status name it was answered with.
        seconds: time spent on it.
        request_bytes: the size of its request as received (0 when refused before reading it).
        reason: for a refusal caused by the request's content (``malformed``, ``bad_enum``),
            the bad-request reason; None for authentication and authorisation refusals.
    """

    service: str
    method: str
    status: str
    seconds: float
    request_bytes: int
    reason: str | None


RefusalObserver = Callable[[RefusedCall], None]

Cost = Callable[[str, Any], int]
"""``cost(method, request)``: the bytes of the answer the call will build (0 when small),
computed from the decoded request before any work."""

REQUEST_COPIES = 2
"""Copies of a request a call holds: gRPC's bytes and the decoded message (and its arrays)."""
ANSWER_COPIES = 3
"""Copies of an answer a call holds: the one gathered, the encoded one, and the one gRPC
sends (measured: about 2.8 x the answer per 64 MiB lookup in flight)."""


# ---------------------------------------------------------------------------- enum validation
_ENUMS: dict[str, bool] = {}


def _has_enums(descriptor: Descriptor) -> bool:
    """Whether messages of ``descriptor`` can hold an enum field, directly or nested."""
    known = _ENUMS.get(descriptor.full_name)
    if known is None:
        _ENUMS[descriptor.full_name] = False  # recursion guard for self-referencing messages
        known = any(
            f.type == FieldDescriptor.TYPE_ENUM
            or (f.type == FieldDescriptor.TYPE_MESSAGE and _has_enums(f.message_type))
            for f in descriptor.fields
        )
        _ENUMS[descriptor.full_name] = known
    return known


def enum_problem(message: Message, prefix: str = "") -> str | None:
    """The first enum field of ``message`` (nested ones included) holding a number its enum
    does not define, described as ``"path.to.field: value is not a Type"``; None if none."""
    if not _has_enums(message.DESCRIPTOR):
        return None
    for field, value in message.ListFields():
        repeated = field.is_repeated
        if field.type == FieldDescriptor.TYPE_ENUM:
            for k, number in enumerate(value if repeated else [value]):
                if field.enum_type.values_by_number.get(number) is None:
                    at = f"{prefix}{field.name}" + (f"[{k}]" if repeated else "")
                    names = ", ".join(f"{v.name} = {v.number}" for v in field.enum_type.values)
                    return f"{at}: {number} is not a {field.enum_type.name} ({names})"
        elif field.type == FieldDescriptor.TYPE_MESSAGE and _has_enums(field.message_type):
            if field.message_type.GetOptions().map_entry:
                continue  # no map of ours holds enum values
            items = value if repeated else [value]
            for k, item in enumerate(items):
                at = f"{prefix}{field.name}" + (f"[{k}]" if repeated else "")
                problem = enum_problem(item, at + ".")
                if problem is not None:
                    return problem
    return None


# ------------------------------------------------------------------------------- the boundary
class _Refusal(Exception):
    """A call refused at the boundary: its error and the bad-request reason, if any."""

    def __init__(self, error: EmbeddbError, reason: str | None = None) -> None:
        super().__init__(str(error))
        self.error = error
        self.reason = reason


class Boundary(grpc.ServerInterceptor):  # type: ignore[misc]
    """The interceptor of the module docstring; place it first (outermost).

    Args:
        policy: what each role may call (see :class:`~embeddb.transport.rpc.auth.AccessPolicy`).
        tokens: the accepted bearer tokens; None serves every caller with full rights (no
            role: :data:`CALLER_ROLE` holds None).
        open_services: full service names callable without a token (health, reflection).
        on_refused: told of every call refused here (counting; the servicer's own errors are
            the metrics interceptor's).
        dedicated_pools: full method names (``/pkg.Service/Method``) → the executor their
            calls run on instead of the server's.
        stream_pool: the executor of guarded server-streaming methods.
        log_interval: seconds between two log lines about refused calls of one kind.
        budget: the memory budget of admitted calls of guarded services; None: unbounded.
        cost: the expected answer bytes of a call (see :data:`Cost`); None: 0.
        budget_wait_s: seconds a call waits for room in the budget (at most its deadline).
        note_bytes: told the size of every request (the malloc trimmer's ``note``).
    """

    def __init__(
        self,
        policy: AccessPolicy,
        tokens: Tokens | None = None,
        open_services: Iterable[str] = (),
        on_refused: RefusalObserver | None = None,
        dedicated_pools: Mapping[str, futures.ThreadPoolExecutor] | None = None,
        stream_pool: futures.ThreadPoolExecutor | None = None,
        log_interval: float = 10.0,
        budget: MemoryBudget | None = None,
        cost: Cost | None = None,
        budget_wait_s: float = 60.0,
        note_bytes: Callable[[int], None] | None = None,
    ) -> None:
        self.policy = policy
        self.budget = budget
        self.cost = cost
        self.budget_wait_s = budget_wait_s
        self.note_bytes = note_bytes
        self._tokens = tokens
        self._open = frozenset(open_services)
        self._on_refused = on_refused
        self._pools = dict(dedicated_pools or {})
        self._stream_pool = stream_pool
        self._log = RateLimitedLog(logger, log_interval)

    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], grpc.RpcMethodHandler | None],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler | None:
        handler = continuation(handler_call_details)
        if handler is None:
            return handler  # unknown (gRPC answers UNIMPLEMENTED)
        full: str = handler_call_details.method
        service, _, method = full.lstrip("/").partition("/")
        guarded = service not in self._open
        role: Role | None = None
        refusal: _Refusal | None = None
        if guarded and self._tokens is not None:
            try:
                role = authenticate(self._tokens, handler_call_details.invocation_metadata)
                self.policy.authorize(role, method)
            except EmbeddbError as exc:
                refusal = _Refusal(exc)
        call = _Call(self, service, method, guarded, role, refusal, handler.request_deserializer)
        pool = self._pools.get(full)
        if handler.response_streaming and not handler.request_streaming:
            pool = self._pools.get(full, self._stream_pool if guarded else None)
        if refusal is not None:  # refused without reading a byte of the request
            make: Any = (
                grpc.stream_stream_rpc_method_handler
                if handler.response_streaming
                else grpc.stream_unary_rpc_method_handler
            )
            wrapped: Any = call.unread(bool(handler.response_streaming))
        elif handler.request_streaming and handler.response_streaming:
            make = grpc.stream_stream_rpc_method_handler
            wrapped = call.request_stream(handler.stream_stream)
        elif handler.request_streaming:
            make = grpc.stream_unary_rpc_method_handler
            wrapped = call.request_stream(handler.stream_unary, streaming=False)
        elif handler.response_streaming:
            make = grpc.unary_stream_rpc_method_handler
            wrapped = call.streaming(handler.unary_stream)
        else:
            make = grpc.unary_unary_rpc_method_handler
            wrapped = call.unary(handler.unary_unary)
        if pool is not None:
            wrapped.experimental_thread_pool = pool
        return make(
            wrapped, request_deserializer=None, response_serializer=handler.response_serializer
        )

    def refused(
        self, service: str, method: str, refusal: _Refusal, seconds: float, size: int
    ) -> None:
        """Count and (rate-limited) log one refused call."""
        status = code_of(refusal.error).name
        if self._on_refused is not None:
            self._on_refused(RefusedCall(service, method, status, seconds, size, refusal.reason))
        level = logging.WARNING if refusal.reason is not None else logging.INFO
        kind = f"{method}:{refusal.reason or status}"
        self._log.log(level, kind, f"refused {service}/{method}: {status}: {refusal.error}")


class _Call:
    """The checks of one call (one per call: the handler lookup creates it)."""

    def __init__(
        self,
        boundary: Boundary,
        service: str,
        method: str,
        guarded: bool,
        role: Role | None,
        refusal: _Refusal | None,
        decode: Callable[[bytes], Any] | None,
    ) -> None:
        self.boundary = boundary
        self.service = service
        self.method = method
        self.guarded = guarded
        self.role = role
        self.refusal = refusal
        self.decode = decode

    def admit(self, raw: Any) -> Any:
        """Steps 3-5 of the module docstring; the decoded request or :class:`_Refusal`."""
        if self.refusal is not None:
            raise self.refusal
        request = raw
        if self.decode is not None:
            try:
                request = self.decode(raw)
            except Exception as exc:  # google.protobuf.message.DecodeError and friends
                kind = getattr(getattr(self.decode, "__self__", None), "__name__", None)
                kind = kind or f"{self.method} request"
                raise _Refusal(
                    InvalidArgumentError(f"malformed {kind}: the bytes do not parse ({exc})"),
                    "malformed",
                ) from None
        if isinstance(request, Message):
            problem = enum_problem(request)
            if problem is not None:
                raise _Refusal(InvalidArgumentError(problem), "bad_enum")
        if self.guarded and self.role is not None:
            try:
                self.boundary.policy.check_request(self.role, self.method, request)
            except EmbeddbError as exc:
                raise _Refusal(exc) from None
        return request

    def charge(self, raw: Any, request: Any, context: Any) -> None:
        """Charge an admitted call of a guarded service to the memory budget, given back when
        gRPC ends the call; :class:`_Refusal` (RESOURCE_EXHAUSTED) when it does not fit."""
        budget = self.boundary.budget
        if budget is None or not self.guarded:
            return
        cost = self.boundary.cost
        answer = cost(self.method, request) if cost is not None else 0
        need = REQUEST_COPIES * _size(raw) + ANSWER_COPIES * max(answer, 0)
        wait = self.boundary.budget_wait_s
        remaining = context.time_remaining()
        if remaining is not None:
            wait = min(wait, max(remaining, 0.0))
        charge = budget.acquire(need, wait)
        if not charge:
            raise _Refusal(
                ResourceExhaustedError(
                    f"this call needs about {need >> 20} MiB and this server's memory budget "
                    f"for calls in flight ({budget.limit >> 20} MiB) is in use; retry later "
                    "or split the request"
                )
            )
        if not context.add_callback(lambda: budget.release(charge)):
            budget.release(charge)  # the call has already ended

    def note(self, raw: Any) -> None:
        note = self.boundary.note_bytes
        if note is not None:
            note(_size(raw))

    def refuse(self, refusal: _Refusal, raw: Any, started: float, context: Any) -> NoReturn:
        self.boundary.refused(
            self.service, self.method, refusal, time.perf_counter() - started, _size(raw)
        )
        error = refusal.error
        context.abort(code_of(error), str(error))
        raise AssertionError("unreachable: ServicerContext.abort raises")  # pragma: no cover

    def unary(self, behaviour: Callable[..., Any]) -> Callable[..., Any]:
        non_blocking = getattr(behaviour, "experimental_non_blocking", False)

        def guarded(raw: Any, context: Any, *callback: Any) -> Any:
            started = time.perf_counter()
            self.note(raw)
            try:
                request = self.admit(raw)
                self.charge(raw, request, context)
            except _Refusal as refusal:
                self.refuse(refusal, raw, started, context)
            token = CALLER_ROLE.set(self.role)
            try:
                return behaviour(request, context, *callback)
            finally:
                CALLER_ROLE.reset(token)

        if non_blocking:
            guarded.experimental_non_blocking = True  # type: ignore[attr-defined]
        return guarded

    def streaming(self, behaviour: Callable[..., Any]) -> Callable[..., Any]:
        non_blocking = getattr(behaviour, "experimental_non_blocking", False)
        if non_blocking:  # health Watch: answers through the callback, holds no thread
            return self.unary(behaviour)

        def guarded(raw: Any, context: Any) -> Iterator[Any]:
            started = time.perf_counter()
            self.note(raw)
            try:
                request = self.admit(raw)
                self.charge(raw, request, context)
            except _Refusal as refusal:
                self.refuse(refusal, raw, started, context)
            CALLER_ROLE.set(self.role)  # this generator runs in the call's own context
            yield from behaviour(request, context)

        return guarded

    def request_stream(
        self, behaviour: Callable[..., Any], streaming: bool = True
    ) -> Callable[..., Any]:
        """A handler of a request stream (answering a stream, or one message when not
        ``streaming``): each message goes through :meth:`admit` as the servicer reads it; a
        bad one ends the call."""

        def decoded(raw_requests: Iterator[Any]) -> Iterator[Any]:
            for raw in raw_requests:
                self.note(raw)
                yield self.admit(raw)

        def stream(raw_requests: Iterator[Any], context: Any) -> Iterator[Any]:
            started = time.perf_counter()
            CALLER_ROLE.set(self.role)
            try:
                yield from behaviour(decoded(raw_requests), context)
            except _Refusal as refusal:
                self.refuse(refusal, b"", started, context)

        def single(raw_requests: Iterator[Any], context: Any) -> Any:
            started = time.perf_counter()
            token = CALLER_ROLE.set(self.role)
            try:
                return behaviour(decoded(raw_requests), context)
            except _Refusal as refusal:
                self.refuse(refusal, b"", started, context)
            finally:
                CALLER_ROLE.reset(token)

        return stream if streaming else single

    def unread(self, streaming: bool) -> Callable[..., Any]:
        """A handler of a call refused before its request is read: it takes the request as a
        stream it never reads, so gRPC never receives more of it than its flow-control
        window, and answers the refusal at once."""
        refusal = self.refusal
        assert refusal is not None

        def single(raw_requests: Iterator[Any], context: Any) -> Any:
            self.refuse(refusal, b"", time.perf_counter(), context)

        def stream(raw_requests: Iterator[Any], context: Any) -> Iterator[Any]:
            self.refuse(refusal, b"", time.perf_counter(), context)
            yield  # pragma: no cover - refuse raises

        return stream if streaming else single


def _size(raw: Any) -> int:
    return len(raw) if isinstance(raw, (bytes, bytearray, memoryview)) else 0
