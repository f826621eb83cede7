"""Slots for the long-lived streams (``Subscribe``, ``FetchSnapshot``), and dropping callers
who stop reading.

Each stream holds a server thread for as long as it runs, so their number is bounded **per
role**: a leaked token of one role cannot take the slots of another (followers hold
``replica`` tokens; without tokens every caller counts under ``any``). A stream beyond its
role's ``max_streams`` gets RESOURCE_EXHAUSTED.

gRPC sends a streamed message and only then asks the stream for the next one; a caller that
stops reading fills the HTTP/2 flow-control window and the send blocks, holding the thread
forever. A watchdog thread notes when each stream started its pending send; one pending for
longer than ``idle_timeout`` seconds is cancelled (the caller sees CANCELLED), its slot freed,
and the drop counted and logged::

    stream    yield message ─ pending since t ─ send done ─ pending None ─ yield ...
    watchdog  every min(0.5, idle_timeout / 4) s: pending for > idle_timeout? cancel the call
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from embeddb.errors import ConfigError, ResourceExhaustedError
from embeddb.transport.rpc.auth import CALLER_ROLE

__all__ = ["StreamSlots", "StreamTicket"]

logger = logging.getLogger(__name__)


@dataclass(eq=False)
class StreamTicket:
    """One running stream: its call and since when its current send has been pending."""

    role: str
    context: Any
    pending_since: float | None = None
    dropped: bool = False

    @contextmanager
    def sending(self) -> Iterator[None]:
        """Mark the send of one message (wrap the ``yield``)."""
        self.pending_since = time.monotonic()
        try:
            yield
        finally:
            self.pending_since = None


class StreamSlots:
    """The stream slots of one server (see the module docstring).

    Args:
        max_streams: streams running at once, per role.
        idle_timeout: seconds a send may stay pending before its stream is dropped.

    Raises:
        ConfigError: a limit below 1 or a non-positive timeout.
    """

    def __init__(self, max_streams: int, idle_timeout: float) -> None:
        if max_streams < 1:
            raise ConfigError("max_streams", f"must be >= 1, got {max_streams}")
        if not idle_timeout > 0:
            raise ConfigError("stream_idle_timeout", f"must be > 0, got {idle_timeout}")
        self.max_streams = max_streams
        self.idle_timeout = idle_timeout
        self._lock = threading.Lock()
        self._tickets: set[StreamTicket] = set()
        self._dropped: dict[str, int] = {}
        self._stop = threading.Event()
        self._watchdog: threading.Thread | None = None

    def running(self) -> dict[str, int]:
        """Streams running now, by role."""
        out: dict[str, int] = {}
        with self._lock:
            for ticket in self._tickets:
                out[ticket.role] = out.get(ticket.role, 0) + 1
        return out

    def dropped(self) -> dict[str, int]:
        """Streams dropped so far for not reading, by role."""
        with self._lock:
            return dict(self._dropped)

    @contextmanager
    def hold(self, context: Any) -> Iterator[StreamTicket]:
        """A slot of the caller's role for the duration of the block.

        Raises:
            ResourceExhaustedError: the role's streams are all taken.
        """
        role = CALLER_ROLE.get()
        name = role.value if role is not None else "any"
        with self._lock:
            taken = sum(1 for t in self._tickets if t.role == name)
            if taken >= self.max_streams:
                raise ResourceExhaustedError(
                    f"{taken} streams (Subscribe, FetchSnapshot) of role {name} are running, the "
                    f"server's max_streams per role; retry later"
                )
            ticket = StreamTicket(name, context)
            self._tickets.add(ticket)
            if self._watchdog is None:
                self._watchdog = threading.Thread(
                    target=self._watch, name="embeddb-stream-watchdog", daemon=True
                )
                self._watchdog.start()
        try:
            yield ticket
        finally:
            with self._lock:
                self._tickets.discard(ticket)

    def close(self) -> None:
        """Stop the watchdog (the server is stopping). Idempotent."""
        self._stop.set()
        thread = self._watchdog
        if thread is not None:
            thread.join()

    def _watch(self) -> None:
        period = min(0.5, self.idle_timeout / 4)
        while not self._stop.wait(period):
            now = time.monotonic()
            with self._lock:
                stuck = [
                    t
                    for t in self._tickets
                    if not t.dropped
                    and t.pending_since is not None
                    and now - t.pending_since > self.idle_timeout
                ]
                for ticket in stuck:
                    ticket.dropped = True
                    self._dropped[ticket.role] = self._dropped.get(ticket.role, 0) + 1
            for ticket in stuck:
                logger.warning(
                    "dropping a %s stream of %s: it has not read for %.0fs (stream idle timeout)",
                    ticket.role,
                    _peer(ticket.context),
                    self.idle_timeout,
                )
                ticket.context.cancel()


def _peer(context: Any) -> str:
    try:
        return str(context.peer())
    except Exception:  # the call may be gone already
        return "a caller"
