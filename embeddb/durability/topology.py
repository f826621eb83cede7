"""A data directory's record of which shard it holds: ``DATA_DIR/topology.json``.

A shard's rows are the ids :func:`embeddb.routing.shard_of` gives its index among its cluster's
shard count; served under another index or count, the directory would answer for ids it does
not hold and accept rows that belong elsewhere. So the first start of a shard on a directory
records its place, and every later start must agree::

    {"format_version": 1, "shard_index": 0, "num_shards": 4, "routing": "splitmix64-lemire-v1"}

A directory from before this record existed (or one ``embeddb reshard`` wrote, holding only
snapshots) takes its topology from its newest readable snapshot manifest; one with no snapshot
either adopts the topology it is started with. The file is written atomically and is private
to the server's user (0600), like everything else in the directory.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from embeddb.durability import snapshot
from embeddb.errors import ConfigError, CorruptDataError
from embeddb.routing import ROUTING_ALGORITHM, Topology

__all__ = ["TOPOLOGY_FILE", "check_directory", "read_topology", "write_topology"]

TOPOLOGY_FILE = "topology.json"
_FORMAT_VERSION = 1


def read_topology(data_dir: Path) -> Topology | None:
    """The topology ``data_dir`` records, or None when it records none.

    Raises:
        CorruptDataError: the file is unreadable, malformed, or names another routing.
    """
    path = data_dir / TOPOLOGY_FILE
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise CorruptDataError(f"{path} is unreadable: {exc}") from exc
    try:
        doc = json.loads(text)
        if not isinstance(doc, dict) or doc.get("format_version") != _FORMAT_VERSION:
            raise ValueError("not a topology record of format_version 1")
        index, count = doc.get("shard_index"), doc.get("num_shards")
        if not (type(index) is int and type(count) is int):
            raise ValueError("shard_index and num_shards must be integers")
        topology = Topology(index, count)
    except ValueError as exc:  # InvalidArgumentError is a ValueError too
        raise CorruptDataError(f"{path} is unreadable: {exc}") from exc
    if doc.get("routing") != ROUTING_ALGORITHM:
        raise CorruptDataError(
            f"{path} records routing {doc.get('routing')!r}; this embeddb routes ids with "
            f"{ROUTING_ALGORITHM!r} (move the rows with embeddb reshard)"
        )
    return topology


def write_topology(data_dir: Path, topology: Topology) -> None:
    """Record ``topology`` in ``data_dir`` (atomically: a temporary file renamed, mode 0600)."""
    doc = {
        "format_version": _FORMAT_VERSION,
        "shard_index": topology.shard_index,
        "num_shards": topology.num_shards,
        "routing": ROUTING_ALGORITHM,
    }
    fd, tmp = tempfile.mkstemp(dir=data_dir, prefix=f".{TOPOLOGY_FILE}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:  # mkstemp creates the file 0600
            f.write(json.dumps(doc, indent=1) + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, data_dir / TOPOLOGY_FILE)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _from_snapshots(data_dir: Path) -> tuple[Topology, str] | None:
    """The topology of the newest snapshot whose manifest is readable, and its id."""
    for info in reversed(snapshot.list_snapshots(data_dir / "snapshots")):
        if info.seq < 0:
            continue
        try:
            manifest = snapshot.read_manifest(info.path)
            return (
                Topology(int(manifest.get("shard_index", 0)), int(manifest.get("num_shards", 1))),
                info.snapshot_id,
            )
        except (CorruptDataError, TypeError, ValueError):
            continue
    return None


def check_directory(data_dir: Path, wanted: Topology) -> None:
    """Check that ``data_dir`` holds shard ``wanted``; record it when the directory has no
    record yet (see the module docstring).

    Raises:
        ConfigError: the directory holds another shard or another shard count (the message
            names the flags to start it with, or ``embeddb reshard``).
        CorruptDataError: the record is unreadable.
    """
    recorded = read_topology(data_dir)
    has_record = recorded is not None
    source = TOPOLOGY_FILE
    if recorded is None:
        found = _from_snapshots(data_dir)
        if found is not None:
            recorded, snapshot_id = found
            source = f"its snapshot {snapshot_id}"
    if recorded is not None and recorded != wanted:
        key = "num_shards" if recorded.num_shards != wanted.num_shards else "shard_index"
        raise ConfigError(
            key,
            f"{data_dir} holds {recorded} ({source}), but this start asks for {wanted}: start it "
            f"with --shard-index {recorded.shard_index} --num-shards {recorded.num_shards}, or "
            f"move its rows to {wanted.num_shards} shards with embeddb reshard",
        )
    if not has_record:
        write_topology(data_dir, wanted)
