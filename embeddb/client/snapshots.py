"""What a job checkpoint sends (``Snapshot`` on every shard) and how its answers combine, and
the listing of every shard's snapshots. No I/O; see :mod:`.plans` for the data calls."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from embeddb.client.calls import Plan, ShardCall
from embeddb.errors import EmbeddbError
from embeddb.v1 import embeddb_pb2 as pb

__all__ = [
    "CheckpointPart",
    "ListedSnapshot",
    "list_snapshots",
    "new_snapshot_id",
    "snapshot",
    "snapshot_error",
]


@dataclass(frozen=True)
class CheckpointPart:
    """One shard's part of a job checkpoint (:meth:`Client.snapshot`).

    Attributes:
        shard, address: which shard.
        snapshot_id: the id (the same on every shard).
        seq: the shard's seq the snapshot holds exactly.
        bytes: total size of its files.
        pause_ms: how long the shard's mutations paused while it was captured.
        seconds: the whole call on the shard.
    """

    shard: int
    address: str
    snapshot_id: str
    seq: int
    bytes: int
    pause_ms: float
    seconds: float


@dataclass(frozen=True)
class ListedSnapshot:
    """A complete snapshot kept by a shard (:meth:`Client.list_snapshots`); ``created`` is a
    UNIX time."""

    snapshot_id: str
    seq: int
    bytes: int
    created: float


def new_snapshot_id() -> str:
    """A job checkpoint id from the UTC time, e.g. ``job-20260314T092653.120Z``."""
    now = time.time()
    return time.strftime("job-%Y%m%dT%H%M%S", time.gmtime(now)) + f".{int(now % 1 * 1000):03d}Z"


def snapshot(
    snapshot_id: str, addresses: Sequence[str], timeout: float
) -> Plan[list[CheckpointPart]]:
    """Every shard snapshots under ``snapshot_id``; never retried (see :meth:`Client.snapshot`)."""
    calls = [
        ShardCall(
            k,
            "Snapshot",
            pb.SnapshotRequest(snapshot_id=snapshot_id),
            idempotent=False,
            timeout=timeout,
        )
        for k in range(len(addresses))
    ]

    def merge(responses: list[Any]) -> list[CheckpointPart]:
        return [
            CheckpointPart(
                shard=k,
                address=address,
                snapshot_id=r.snapshot_id,
                seq=int(r.seq),
                bytes=int(r.bytes),
                pause_ms=float(r.pause_ms),
                seconds=float(r.seconds),
            )
            for k, (address, r) in enumerate(zip(addresses, responses, strict=True))
        ]

    return Plan(calls, merge)


def snapshot_error(
    snapshot_id: str, addresses: Sequence[str], outcomes: Sequence[object]
) -> EmbeddbError | None:
    """The error to raise for a job checkpoint whose shards answered ``outcomes`` (responses or
    exceptions, in shard order): the first failure's type, naming every failed shard and the
    shards whose snapshots were taken (they remain). None when every shard succeeded."""
    failed = [(k, o) for k, o in enumerate(outcomes) if isinstance(o, BaseException)]
    if not failed:
        return None
    taken = [str(k) for k, o in enumerate(outcomes) if not isinstance(o, BaseException)]
    reasons = "; ".join(str(o) for _, o in failed)
    kept = (
        f"shards {', '.join(taken)} took snapshot {snapshot_id!r} and keep it"
        if taken
        else "no shard took it"
    )
    message = (
        f"checkpoint {snapshot_id!r} failed on shard(s) "
        f"{', '.join(f'{k} ({addresses[k]})' for k, _ in failed)}: {reasons}. {kept}; "
        f"take a new checkpoint under another id"
    )
    first = failed[0][1]
    cls = type(first) if isinstance(first, EmbeddbError) else EmbeddbError
    try:
        return cls(message)
    except TypeError:  # an error class with another constructor
        return EmbeddbError(message)


def list_snapshots(addresses: Sequence[str]) -> Plan[list[list[ListedSnapshot]]]:
    """Every shard's complete snapshots (oldest first), in shard order."""
    calls = [
        ShardCall(k, "ListSnapshots", pb.ListSnapshotsRequest(), idempotent=True)
        for k in range(len(addresses))
    ]

    def merge(responses: list[Any]) -> list[list[ListedSnapshot]]:
        return [
            [
                ListedSnapshot(s.snapshot_id, int(s.seq), int(s.bytes), float(s.created))
                for s in r.snapshots
            ]
            for r in responses
        ]

    return Plan(calls, merge)
