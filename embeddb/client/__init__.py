"""embeddb client SDK, installed as ``embeddb.client``.

A client knows every shard's address (shard ``i`` is ``addresses[i]``), routes each id with
:func:`embeddb.common.routing.shard_of`, deduplicates every batch once and talks to the shards in
parallel over one gRPC channel each. Before its first call it asks every shard once which shard
of how many it is (``DescribeShard``): a wrong address list raises ``ConfigError`` before
anything is sent, and every request is sized to fit the shards' limits. Errors come back as
:mod:`embeddb.errors` exceptions that name the shard. Usage::

    import numpy as np
    from embeddb.client import Client, ClientOptions

    with Client.from_address_file("shards.txt", ClientOptions(timeout=5.0)) as client:
        ids = np.array([7, 42, 7], dtype=np.uint64)
        vectors = client.lookup("user", ids)               # (3, dim) float32, rows 0 and 2 equal
        grads = np.ones_like(vectors)
        result = client.apply_gradients("user", ids, grads)  # id 7 gets one summed gradient
        print(result.applied, client.stats()[0]["tables"]["user"]["rows"])
        # Several tables in one call per shard (a training batch over many tables):
        both = client.lookup_many({"user": ids, "item": np.array([3], dtype=np.uint64)})

:class:`AsyncClient` offers the same methods as coroutines (``await client.lookup(...)``).
``client.snapshot()`` takes a job checkpoint: one snapshot id on every shard.

Its result types are named apart from the core's (:class:`PushResult`, not the storage's
``UpdateResult``; :class:`TableDescription`, :class:`ShardStatsDict`, :class:`CheckpointPart`,
:class:`ListedSnapshot`), so that code and tests using both never mix them up.

Modules: :mod:`~embeddb.client.sync` and :mod:`~embeddb.client.aio` (the two clients, I/O only;
their shared state in :mod:`~embeddb.client.base`),
:mod:`~embeddb.client.plans` (what each method sends and how answers merge; job checkpoints
in :mod:`~embeddb.client.snapshots`), :mod:`~embeddb.client.topology` (the ``DescribeShard``
check and the request budgets), :mod:`~embeddb.client.batching` (dedup, split, merge; pure
numpy), :mod:`~embeddb.client.calls` (the plan and call types both clients execute),
:mod:`~embeddb.client.options` (settings, address file; the retry policy in
:mod:`~embeddb.client.retry`; the simulated network's
calls in :mod:`~embeddb.client.netsim`),
:mod:`~embeddb.client.errors` (gRPC status → embeddb exception).
"""

from __future__ import annotations

if __name__ != "embeddb.client":  # the top-level folder is a link, not a second package
    raise ImportError(f"import embeddb.client, not {__name__}")

from embeddb.client.aio import AsyncClient
from embeddb.client.errors import DeadlineExceededError, InternalError, RemoteError
from embeddb.client.options import ClientOptions, SimulatedNetwork, read_address_file
from embeddb.client.plans import (
    CheckpointPart,
    ListedSnapshot,
    PushResult,
    ShardStatsDict,
    TableDescription,
)
from embeddb.client.retry import RetryPolicy
from embeddb.client.sync import Client
from embeddb.client.warmup import warm_up_client

__all__ = [
    "AsyncClient",
    "CheckpointPart",
    "Client",
    "ClientOptions",
    "DeadlineExceededError",
    "InternalError",
    "ListedSnapshot",
    "PushResult",
    "RemoteError",
    "RetryPolicy",
    "ShardStatsDict",
    "SimulatedNetwork",
    "TableDescription",
    "read_address_file",
    "warm_up_client",
]
