"""The one retry policy: how many attempts, which failures, and the one backoff computation.

Used by both clients (per call to one shard, idempotent calls only) and by the embedding worker
(around a whole training lookup or gradient push, which the client never retries itself). The
retry before attempt ``n + 1`` waits::

    full = min(max_backoff, initial_backoff * multiplier ** (n - 1))      (the schedule)
    wait = full * (1 - jitter * u),  u uniform in [0, 1)                  (jittered)

so with the client's defaults (``initial_backoff=0.05``, ``multiplier=2``, ``jitter=0.5``) the
retries wait 25-50 ms, 50-100 ms and 100-200 ms.

Retried: the status codes in :attr:`RetryPolicy.retryable`, by default ``UNAVAILABLE`` and
``CANCELLED`` (both an :class:`~embeddb.errors.UnavailableError`: the shard is, for now, gone).
``RESOURCE_EXHAUSTED`` is not: every embeddb server sends it for a request above a configured
limit or a full disk, which the same request meets again. ``DEADLINE_EXCEEDED`` is retryable only
where each attempt has a deadline of its own (the embedding worker's operations): a client call's
deadline covers all of its attempts, so once it is exceeded no time is left to retry.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

import grpc

from embeddb.errors import ConfigError
from embeddb.transport.status import code_of

__all__ = ["DEFAULT_RETRYABLE", "RetryPolicy"]

#: What :class:`RetryPolicy` retries unless told otherwise.
DEFAULT_RETRYABLE = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED})


@dataclass(frozen=True)
class RetryPolicy:
    """When to try a failed call again, and how long to wait first.

    Attributes:
        attempts: tries in all (1: never retried).
        initial_backoff: seconds before the first retry (before jitter).
        max_backoff: cap of one wait, in seconds (``math.inf``: none).
        multiplier: each further retry waits this many times longer (>= 1).
        jitter: the fraction of each wait drawn at random (0: exact; 0.5: between half and
            all of it), so that callers who failed together do not retry together.
        retryable: the status codes worth another attempt.
    """

    attempts: int = 4
    initial_backoff: float = 0.05
    max_backoff: float = 2.0
    multiplier: float = 2.0
    jitter: float = 0.5
    retryable: frozenset[grpc.StatusCode] = field(default=DEFAULT_RETRYABLE)

    def __post_init__(self) -> None:
        if isinstance(self.attempts, bool) or not isinstance(self.attempts, int):
            raise ConfigError("attempts", f"must be an integer >= 1, got {self.attempts!r}")
        if self.attempts < 1:
            raise ConfigError("attempts", f"must be >= 1, got {self.attempts}")
        if not (0 <= self.initial_backoff <= self.max_backoff):
            raise ConfigError(
                "initial_backoff",
                "need 0 <= initial_backoff <= max_backoff, got "
                f"{self.initial_backoff} and {self.max_backoff}",
            )
        if not (math.isfinite(self.multiplier) and self.multiplier >= 1):
            raise ConfigError("multiplier", f"must be a number >= 1, got {self.multiplier}")
        if not 0 <= self.jitter <= 1:
            raise ConfigError("jitter", f"must be within [0, 1], got {self.jitter}")
        codes = frozenset(self.retryable)
        if not all(isinstance(c, grpc.StatusCode) for c in codes):
            raise ConfigError("retryable", f"must be grpc.StatusCode values, got {codes}")
        object.__setattr__(self, "retryable", codes)

    @classmethod
    def from_retries(
        cls,
        retries: int,
        backoff: float,
        max_backoff: float = math.inf,
        *,
        jitter: float = 0.5,
        timeouts: bool = False,
    ) -> RetryPolicy:
        """The policy of the older settings: ``retries`` extra attempts, the first after about
        ``backoff`` seconds, each further one twice as long up to ``max_backoff``; ``timeouts``:
        retry ``DEADLINE_EXCEEDED`` too (where each attempt has a deadline of its own)."""
        extra = frozenset({grpc.StatusCode.DEADLINE_EXCEEDED}) if timeouts else frozenset()
        return cls(
            attempts=retries + 1,
            initial_backoff=backoff,
            max_backoff=max_backoff,
            jitter=jitter,
            retryable=DEFAULT_RETRYABLE | extra,
        )

    @property
    def retries(self) -> int:
        """Extra attempts after the first."""
        return self.attempts - 1

    def backoff(self, retry: int) -> float:
        """Seconds before retry number ``retry`` (1: the first), before jitter."""
        if retry < 1:
            raise ValueError(f"retries count from 1, got {retry}")
        if self.initial_backoff == 0:
            return 0.0
        try:
            full = self.initial_backoff * self.multiplier ** (retry - 1)
        except OverflowError:  # however many retries: the cap
            return self.max_backoff
        return min(self.max_backoff, full)

    def schedule(self) -> tuple[float, ...]:
        """The waits before each retry, before jitter."""
        return tuple(self.backoff(n) for n in range(1, self.attempts))

    def channel_options(self) -> list[tuple[str, int]]:
        """The gRPC channel arguments that keep the channel's own reconnect backoff within this
        policy's. A channel that failed to connect fails every call at once until its next
        connection attempt, 1 s later by default and up to 2 minutes: without these a shard
        restarted between two retries would still fail every retry, however many."""
        options = [("grpc.initial_reconnect_backoff_ms", max(1, round(self.initial_backoff * 1e3)))]
        if math.isfinite(self.max_backoff):
            options.append(("grpc.max_reconnect_backoff_ms", max(1, round(self.max_backoff * 1e3))))
        return options

    def should_retry(self, code: grpc.StatusCode | None, attempt: int) -> bool:
        """Whether a call that failed with ``code`` at attempt ``attempt`` (1: the first) may
        be tried again."""
        return code in self.retryable and attempt < self.attempts

    def delay(
        self,
        code: grpc.StatusCode | None,
        attempt: int,
        rng: random.Random | None = None,
        remaining: float = math.inf,
    ) -> float | None:
        """Seconds to wait before retrying a call that failed with ``code`` at attempt
        ``attempt``, or ``None`` to give up: not retryable, no attempts left, or the wait
        would not end within the ``remaining`` seconds of the call's deadline. ``rng``: the
        jitter source (``None``: the :mod:`random` module's)."""
        if not self.should_retry(code, attempt):
            return None
        wait = self.jittered(self.backoff(attempt), rng)
        return wait if wait < remaining else None

    def jittered(self, seconds: float, rng: random.Random | None = None) -> float:
        """``seconds`` less the random fraction ``jitter`` of it (``rng``: the jitter source;
        ``None``: the :mod:`random` module's)."""
        if not self.jitter:
            return seconds
        return seconds * (1.0 - self.jitter * (rng or random).random())

    def delay_after(
        self,
        error: BaseException,
        attempt: int,
        rng: random.Random | None = None,
        remaining: float = math.inf,
    ) -> float | None:
        """:meth:`delay` for a failure already translated into an embeddb exception (its status
        is that of :func:`embeddb.transport.status.code_of`)."""
        return self.delay(code_of(error), attempt, rng, remaining)
