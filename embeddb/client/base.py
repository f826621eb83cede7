"""What :class:`~embeddb.client.Client` and :class:`~embeddb.client.AsyncClient` share: the
checked address list, the options, and the state both keep between calls (the jitter source,
cached table dims, the shards' request budgets). They differ only in how they wait."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Sequence

import grpc

import embeddb.common.allocator as allocator
from embeddb.client.batching import Budget
from embeddb.client.calls import ShardCall
from embeddb.client.errors import translate_rpc_error
from embeddb.client.options import ClientOptions, check_addresses

__all__ = ["ClientBase"]


class ClientBase:
    """The state common to both clients.

    Args:
        addresses: ``host:port`` of each shard, in shard order.
        options: how to talk to the shards; ``None``: the defaults of :class:`ClientOptions`.

    Raises:
        ConfigError: an invalid address.
    """

    def __init__(self, addresses: Sequence[str], options: ClientOptions | None) -> None:
        self.addresses = check_addresses(addresses)
        self.options = options if options is not None else ClientOptions()
        if self.options.tune_allocator:
            allocator.tune_allocator()
        self._rng = random.Random()
        self._rng_lock = threading.Lock()  # the sync client's calls draw from threads
        self._dims: dict[str, int] = {}
        self._closed = False
        self._budgets: tuple[Budget, ...] | None = None  # per shard, once described

    @property
    def num_shards(self) -> int:
        return len(self.addresses)

    def _retry_delay(
        self, call: ShardCall, exc: grpc.RpcError, attempt: int, deadline: float
    ) -> float:
        """Seconds to wait before attempt ``attempt + 1`` of ``call`` after ``exc``.

        Raises:
            EmbeddbError: the translated ``exc`` (naming the shard) when ``call`` is not retried
                again: not idempotent, or the options' :class:`~embeddb.client.RetryPolicy`
                gives up.
        """
        delay = None
        if call.idempotent:
            with self._rng_lock:
                delay = self.options.retry_policy.delay(
                    exc.code(), attempt, self._rng, deadline - time.monotonic()
                )
        if delay is None:
            address = self.addresses[call.shard]
            raise translate_rpc_error(exc, call.shard, address, call.method, attempt) from exc
        return delay

    def __repr__(self) -> str:
        return f"{type(self).__name__}({list(self.addresses)!r})"
