"""The one retry policy (:class:`embeddb.client.RetryPolicy`): its backoff schedule, what it
retries, the older settings mapped onto it, and both layers that use it (the clients, per call
to one shard, and the embedding worker, per operation) against real servers on 127.0.0.1 that
are stopped and restarted. Nothing here waits on the wall clock: a retry is observed through
the policy itself (each consultation recorded), and a server restarts from within one.

Before: the client (``ClientOptions.retry_delay``) and the embedding worker (its own loop of
``retry_backoff * 2**n``) computed two backoffs, the worker's client got the worker's
``retries`` but not its backoff, and a shard restarted between two of the client's retries still
failed every later retry (the channel waited 1 s, its own backoff, before reconnecting)."""

from __future__ import annotations

import asyncio
import logging
import math
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest

from embeddb.client import AsyncClient, Client, ClientOptions, RetryPolicy
from embeddb.client.retry import DEFAULT_RETRYABLE
from embeddb.errors import (
    ConfigError,
    DeadlineExceededError,
    InternalError,
    ResourceExhaustedError,
    UnavailableError,
)
from embeddb.server import ServerConfig, build_server
from embeddb.trainer.embedding.worker import EmbeddingWorker, EmbeddingWorkerConfig
from embeddb.trainer.errors import LookupFailedError
from embeddb.transport.rpc.listen import ListenConfig

Code = grpc.StatusCode


class Fixed(random.Random):
    """A jitter source that always draws ``value``."""

    def __init__(self, value: float) -> None:
        super().__init__(0)
        self.value = value

    def random(self) -> float:
        return self.value


# ------------------------------------------------------------------------- the policy alone
def test_the_schedule_doubles_up_to_the_cap() -> None:
    policy = RetryPolicy(attempts=6, initial_backoff=0.125, max_backoff=1.0, jitter=0)
    assert policy.schedule() == (0.125, 0.25, 0.5, 1.0, 1.0)
    assert RetryPolicy(attempts=4, initial_backoff=0.5, multiplier=3, max_backoff=9).schedule() == (
        0.5,
        1.5,
        4.5,
    )
    assert RetryPolicy(attempts=1).schedule() == ()
    assert RetryPolicy(max_backoff=math.inf).backoff(5000) == math.inf  # no overflow error
    assert RetryPolicy(max_backoff=2.0).backoff(5000) == 2.0
    assert RetryPolicy(initial_backoff=0.0).backoff(5000) == 0.0


def test_jitter_draws_between_the_fraction_and_all_of_the_wait() -> None:
    policy = RetryPolicy(attempts=3, initial_backoff=0.5, jitter=0.5)
    assert policy.delay(Code.UNAVAILABLE, 1, Fixed(0.0)) == 0.5
    assert policy.delay(Code.UNAVAILABLE, 2, Fixed(0.5)) == 0.75  # 1.0 * (1 - 0.5 * 0.5)
    assert policy.delay(Code.UNAVAILABLE, 2, Fixed(1.0)) == 0.5


@pytest.mark.parametrize("code", list(Code), ids=lambda c: c.name)
def test_only_unavailable_and_cancelled_are_retried_by_default(code: grpc.StatusCode) -> None:
    policy = RetryPolicy(jitter=0)
    expected = 0.05 if code in (Code.UNAVAILABLE, Code.CANCELLED) else None
    assert policy.delay(code, 1) == expected
    assert frozenset({Code.UNAVAILABLE, Code.CANCELLED}) == DEFAULT_RETRYABLE
    assert Code.RESOURCE_EXHAUSTED not in policy.retryable  # a limit the retry meets again


def test_attempts_and_the_deadline_end_the_retries() -> None:
    policy = RetryPolicy(attempts=3, initial_backoff=0.25, jitter=0)
    assert [policy.delay(Code.UNAVAILABLE, n) for n in (1, 2, 3)] == [0.25, 0.5, None]
    assert policy.delay(Code.UNAVAILABLE, 1, remaining=0.25) is None  # would outlast the call
    assert policy.delay(Code.UNAVAILABLE, 1, remaining=0.26) == 0.25


def test_an_error_is_retried_by_its_status() -> None:
    policy = RetryPolicy(jitter=0)
    assert policy.delay_after(UnavailableError("down"), 1) == 0.05
    assert policy.delay_after(ResourceExhaustedError("too big"), 1) is None
    assert policy.delay_after(InternalError("bug"), 1) is None
    assert policy.delay_after(DeadlineExceededError("slow"), 1) is None
    timeouts = RetryPolicy.from_retries(3, 0.05, jitter=0, timeouts=True)
    assert timeouts.delay_after(DeadlineExceededError("slow"), 1) == 0.05


@pytest.mark.parametrize(
    ("kwargs", "key"),
    [
        ({"attempts": 0}, "attempts"),
        ({"attempts": 1.5}, "attempts"),
        ({"initial_backoff": -1.0}, "initial_backoff"),
        ({"initial_backoff": 3.0, "max_backoff": 2.0}, "initial_backoff"),
        ({"multiplier": 0.5}, "multiplier"),
        ({"jitter": 1.5}, "jitter"),
        ({"retryable": frozenset({"UNAVAILABLE"})}, "retryable"),
    ],
)
def test_a_bad_policy_names_its_key(kwargs: dict[str, Any], key: str) -> None:
    with pytest.raises(ConfigError, match=rf"^{key}: "):
        RetryPolicy(**kwargs)


def test_the_older_settings_map_onto_the_policy() -> None:
    """``ClientOptions(retries, backoff, max_backoff)`` and ``EmbeddingWorkerConfig(retries,
    retry_backoff)`` keep working: each is one policy."""
    assert ClientOptions(retries=2, backoff=0.25, max_backoff=1.0).retry_policy == RetryPolicy(
        attempts=3, initial_backoff=0.25, max_backoff=1.0, multiplier=2.0, jitter=0.5
    )
    assert ClientOptions().retry_policy == RetryPolicy()
    own = RetryPolicy(attempts=7)
    assert ClientOptions(retry=own).retry_policy is own
    with pytest.raises(ConfigError, match=r"^retry: "):
        ClientOptions(retry=3)  # type: ignore[arg-type]
    worker = EmbeddingWorkerConfig(retries=3, retry_backoff=0.2)
    policy = worker.retry_policy
    assert policy.schedule() == (0.2, 0.4, 0.8)  # as docs/operations.md says
    assert policy.jitter == 0 and policy.max_backoff == math.inf
    assert policy.retryable == {Code.UNAVAILABLE, Code.CANCELLED, Code.DEADLINE_EXCEEDED}
    assert worker.retry_policy is policy  # one object for the worker and its client


def test_the_channel_reconnects_on_the_policys_schedule() -> None:
    options = dict(ClientOptions(backoff=0.05, max_backoff=2.0).channel_options)
    assert options["grpc.initial_reconnect_backoff_ms"] == 50
    assert options["grpc.max_reconnect_backoff_ms"] == 2000
    uncapped = dict(RetryPolicy(initial_backoff=0, max_backoff=math.inf).channel_options())
    assert uncapped == {"grpc.initial_reconnect_backoff_ms": 1}


# ------------------------------------------------------------ real servers, stopped, restarted
@dataclass(frozen=True)
class Recording(RetryPolicy):
    """A policy that records each consultation ``(code, attempt, delay)`` and may act on it."""

    seen: list[tuple[grpc.StatusCode | None, int, float | None]] = field(
        default_factory=list, compare=False
    )
    on_retry: Callable[[int], None] | None = field(default=None, compare=False)

    def delay(
        self,
        code: grpc.StatusCode | None,
        attempt: int,
        rng: random.Random | None = None,
        remaining: float = math.inf,
    ) -> float | None:
        wait = super().delay(code, attempt, rng, remaining)
        self.seen.append((code, attempt, wait))
        if self.on_retry is not None and wait is not None:
            self.on_retry(attempt)
        return wait


@dataclass
class Restartable:
    """One shard served on 127.0.0.1: stopped, and started again on the same port."""

    shard: Any
    server: Any = None
    port: int = 0

    def start(self) -> None:
        self.server = build_server(
            self.shard, ServerConfig(listen=ListenConfig(port=self.port), shard_index=0)
        )
        self.port = self.server.port

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Restartable]:
    from embeddb.engine.shard import Shard
    from tests.test_client import sgd_tables

    with Shard(sgd_tables(), tmp_path / "s", shard_index=0, num_shards=1) as shard:
        node = Restartable(shard)
        node.start()
        try:
            yield node
        finally:
            node.server.stop(grace=0)


def test_a_stopped_shard_is_tried_as_often_as_the_policy_says(served: Restartable) -> None:
    policy = Recording(attempts=4, initial_backoff=0.001, max_backoff=0.004, jitter=0)
    with Client([served.address], ClientOptions(retry=policy)) as client:
        client.lookup("t", [1], train=False)  # the topology and the table's dim, once
        served.server.stop(grace=0)
        with pytest.raises(UnavailableError, match=r"Lookup failed after 4 attempts: UNAVAILABLE"):
            client.lookup("t", [1, 2], train=False)
        assert policy.seen == [
            (Code.UNAVAILABLE, 1, 0.001),
            (Code.UNAVAILABLE, 2, 0.002),
            (Code.UNAVAILABLE, 3, 0.004),
            (Code.UNAVAILABLE, 4, None),
        ]
        policy.seen.clear()
        with pytest.raises(UnavailableError) as info:  # a write is never retried
            client.apply_gradients("t", [1], np.zeros((1, 4), np.float32))
        assert "attempts" not in str(info.value) and policy.seen == []


def test_a_shard_restarted_between_retries_answers_the_next_one(served: Restartable) -> None:
    """Before: every retry after the restart failed too (the channel's own 1 s backoff)."""
    restarted: list[int] = []

    def restart(attempt: int) -> None:
        if not restarted:
            served.start()
            restarted.append(attempt)

    # All retries end within 0.45 s, before gRPC's own first reconnect (1 s +- 20 %) would.
    policy = Recording(
        attempts=8, initial_backoff=0.01, max_backoff=0.1, jitter=0, on_retry=restart
    )
    with Client([served.address], ClientOptions(retry=policy)) as client:
        client.lookup("t", [1], train=False)  # the topology and the table's dim, once
        served.server.stop(grace=0)
        rows = client.lookup("t", [1, 2], train=False)
    assert rows.shape == (2, 4)
    assert restarted == [1]
    codes = {code for code, _, _ in policy.seen}
    assert codes == {Code.UNAVAILABLE}
    attempts = [attempt for _, attempt, _ in policy.seen]
    assert attempts == list(range(1, len(attempts) + 1)) and len(attempts) < policy.attempts
    assert [wait for _, _, wait in policy.seen] == list(policy.schedule()[: len(attempts)])


def test_the_async_client_retries_with_the_same_policy(served: Restartable) -> None:
    policy = Recording(attempts=3, initial_backoff=0.001, jitter=0)

    async def main() -> None:
        async with AsyncClient([served.address], ClientOptions(retry=policy)) as client:
            await client.lookup("t", [1], train=False)
            served.server.stop(grace=0)
            with pytest.raises(UnavailableError, match="after 3 attempts"):
                await client.lookup("t", [1], train=False)

    asyncio.run(main())
    assert [(c, n) for c, n, _ in policy.seen] == [(Code.UNAVAILABLE, n) for n in (1, 2, 3)]


# ------------------------------------------------------------------------- the embedding worker
def _worker(served: Restartable, config: EmbeddingWorkerConfig) -> EmbeddingWorker:
    from tests.test_embedding_worker import CONFIG

    options = ClientOptions(timeout=config.shard_timeout, retry=config.retry_policy)
    return EmbeddingWorker(AsyncClient([served.address], options), CONFIG, config)


@pytest.fixture
def worker_shard(tmp_path: Path) -> Iterator[Restartable]:
    from embeddb.engine.shard import Shard
    from tests.test_embedding_worker import CONFIG

    with Shard(CONFIG, tmp_path / "w", shard_index=0, num_shards=1) as shard:
        node = Restartable(shard)
        node.start()
        try:
            yield node
        finally:
            node.server.stop(grace=0)


def test_the_worker_retries_a_training_lookup_on_its_schedule(
    worker_shard: Restartable, caplog: pytest.LogCaptureFixture
) -> None:
    from tests.test_embedding_worker import features, wire

    config = EmbeddingWorkerConfig(retries=3, retry_backoff=0.001, shard_timeout=5.0)

    async def main() -> None:
        worker = _worker(worker_shard, config)
        await worker.lookup(0, wire(features()), True)
        worker_shard.server.stop(grace=0)
        with pytest.raises(LookupFailedError) as info:
            await worker.lookup(1, wire(features()), True)
        assert info.value.cause == "UnavailableError"
        stats = worker.stats()
        assert stats['embeddb_trainer_retries_total{operation="lookup"}'] == 3
        await worker.close()

    with caplog.at_level(logging.WARNING, "embeddb.trainer.embedding.worker"):
        asyncio.run(main())
    waits = [r.args[-1] for r in caplog.records if "retry" in r.getMessage()]
    assert waits == [0.001, 0.002, 0.004]  # config.retry_policy.schedule()
    assert [r.args[-3] for r in caplog.records if "retry" in r.getMessage()] == [1, 2, 3]


def test_the_worker_resumes_once_the_shard_is_back(
    worker_shard: Restartable, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.test_embedding_worker import features, like, wire

    # All retries end within 0.31 s, before gRPC's own first reconnect (1 s +- 20 %) would.
    config = EmbeddingWorkerConfig(retries=5, retry_backoff=0.01, shard_timeout=5.0)
    seen: list[tuple[grpc.StatusCode | None, int]] = []
    delay = RetryPolicy.delay

    def recorded(self: RetryPolicy, code: Any, attempt: int, *args: Any) -> float | None:
        seen.append((code, attempt))
        if len(seen) == 1:
            worker_shard.start()  # back before the first retry
        return delay(self, code, attempt, *args)

    async def main() -> None:
        worker = _worker(worker_shard, config)
        pooled = await worker.lookup(0, wire(features()), True)
        worker_shard.server.stop(grace=0)
        monkeypatch.setattr(RetryPolicy, "delay", recorded)
        task = worker.push_gradients(0, like(pooled, 1.0))
        assert task is not None
        await task
        stats = worker.stats()
        assert stats['embeddb_trainer_failures_total{operation="gradient_push"}'] == 0
        assert stats["embeddb_trainer_gradient_pushes_total"] == 1
        await worker.close()

    asyncio.run(main())
    assert seen[0] == (Code.UNAVAILABLE, 1)
    assert [n for _, n in seen] == list(range(1, len(seen) + 1)) and len(seen) <= config.retries


def test_the_follower_reconnects_with_the_same_backoff() -> None:
    """The follower's reconnect loop waits ``backoff(n)`` of two policies (the feed's, and the
    longer one of re-bootstraps that follow each other), no backoff of its own."""
    from embeddb.server.follower import FollowerOptions

    options = FollowerOptions(
        "127.0.0.1:7070", backoff=0.125, max_backoff=0.5, max_bootstrap_backoff=1.0
    )
    feed, boot = options.reconnect_policy, options.bootstrap_policy
    assert [feed.backoff(n) for n in range(1, 6)] == [0.125, 0.25, 0.5, 0.5, 0.5]
    assert [boot.backoff(n) for n in range(1, 6)] == [0.125, 0.25, 0.5, 1.0, 1.0]
    assert feed.jittered(0.5, Fixed(1.0)) == 0.25 and feed.jittered(0.5, Fixed(0.0)) == 0.5
