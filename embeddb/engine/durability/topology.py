"""A data directory's record of which shard it holds: ``DATA_DIR/topology.json``.

A shard's rows are the ids :func:`embeddb.common.routing.shard_of` gives its index among its
cluster's
shard count; served under another index or count, the directory would answer for ids it does
not hold and accept rows that belong elsewhere. So the first start of a shard on a directory
records its place, and every later start must agree::

    {"format_version": 1, "shard_index": 0, "num_shards": 4, "routing": "splitmix64-lemire-v1"}

The same record is kept twice: ``topology.json`` and ``shard-identity.json`` (identical
content), so that deleting one file cannot make the directory start as another shard. A
directory without ``topology.json`` takes its place from ``shard-identity.json``, else from its
newest readable snapshot manifest (a directory from before these records existed, or one
``embeddb reshard`` wrote, holding only snapshots). A directory whose place none of these
establishes adopts the place it is started with only while it holds no data (no disk tier
files, no update log segment, no clean-shutdown record); otherwise the start is refused with
a :class:`~embeddb.errors.ConfigError` telling how to restore the record. Both files are
written atomically and are private to the server's user (0600), like everything else in the
directory.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from embeddb.common.routing import ROUTING_ALGORITHM, Topology
from embeddb.engine.durability import snapshot, snapshot_dirs
from embeddb.errors import ConfigError, CorruptDataError

__all__ = ["IDENTITY_FILE", "TOPOLOGY_FILE", "check_directory", "read_topology", "write_topology"]

TOPOLOGY_FILE = "topology.json"
IDENTITY_FILE = "shard-identity.json"  # the second copy of the record
_DATA_MARKERS = ("clean-shutdown.json",)  # files that mean the directory holds rows
_FORMAT_VERSION = 1


def read_topology(data_dir: Path, name: str = TOPOLOGY_FILE) -> Topology | None:
    """The topology ``data_dir`` records in its file ``name`` (``topology.json`` or
    ``shard-identity.json``), or None when that file does not exist.

    Raises:
        CorruptDataError: the file is unreadable, malformed, or names another routing.
    """
    path = data_dir / name
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


def write_topology(data_dir: Path, topology: Topology, name: str = TOPOLOGY_FILE) -> None:
    """Record ``topology`` in ``data_dir``'s file ``name`` (atomically: a temporary file
    renamed, mode 0600)."""
    doc = {
        "format_version": _FORMAT_VERSION,
        "shard_index": topology.shard_index,
        "num_shards": topology.num_shards,
        "routing": ROUTING_ALGORITHM,
    }
    fd, tmp = tempfile.mkstemp(dir=data_dir, prefix=f".{name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:  # mkstemp creates the file 0600
            f.write(json.dumps(doc, indent=1) + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, data_dir / name)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _from_snapshots(data_dir: Path) -> tuple[Topology, str] | None:
    """The topology of the newest snapshot whose manifest is readable, and its id."""
    for info in reversed(snapshot_dirs.list_snapshots(data_dir / "snapshots")):
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


def _holds_data(data_dir: Path) -> bool:
    """Whether ``data_dir`` holds rows: disk tier files, an update log segment or a
    clean-shutdown record."""
    disk, log = data_dir / "disk", data_dir / "log"
    return (
        (disk.is_dir() and any(disk.iterdir()))
        or (log.is_dir() and any(log.glob("*.log")))
        or any((data_dir / name).exists() for name in _DATA_MARKERS)
    )


def check_directory(data_dir: Path, wanted: Topology) -> None:
    """Check that ``data_dir`` holds shard ``wanted``; record it in whichever of its two
    record files is missing (see the module docstring).

    Raises:
        ConfigError: the directory holds another shard or another shard count (the message
            names the flags to start it with, or ``embeddb reshard``), or it holds data but
            no record or snapshot says which shard (key ``shard_index``).
        CorruptDataError: a record is unreadable, or the two records disagree.
    """
    recorded = read_topology(data_dir)
    identity = read_topology(data_dir, IDENTITY_FILE)
    if recorded is not None and identity is not None and recorded != identity:
        raise CorruptDataError(
            f"{data_dir / TOPOLOGY_FILE} records {recorded} but {data_dir / IDENTITY_FILE} "
            f"records {identity}; remove the wrong one"
        )
    has_record = recorded is not None
    source = TOPOLOGY_FILE
    if recorded is None and identity is not None:
        recorded, source = identity, IDENTITY_FILE
    if recorded is None:
        found = _from_snapshots(data_dir)
        if found is not None:
            recorded, snapshot_id = found
            source = f"its snapshot {snapshot_id}"
    if recorded is None and _holds_data(data_dir):
        raise ConfigError(
            "shard_index",
            f"{data_dir} holds data but neither {TOPOLOGY_FILE} nor {IDENTITY_FILE} nor a "
            f"snapshot records which shard it is, so it cannot be started as {wanted} safely: "
            f"restore {TOPOLOGY_FILE} from a backup, or write it with the shard's place "
            f'({{"format_version": {_FORMAT_VERSION}, "shard_index": N, "num_shards": M, '
            f'"routing": "{ROUTING_ALGORITHM}"}})',
        )
    if recorded is not None and recorded != wanted:
        key = "num_shards" if recorded.num_shards != wanted.num_shards else "shard_index"
        raise ConfigError(
            key,
            f"{data_dir} holds {recorded} ({source}), but this start asks for {wanted}: start it "
            f"with --shard-index {recorded.shard_index} --num-shards {recorded.num_shards}, or "
            f"move its rows to {wanted.num_shards} shards with embeddb reshard",
        )
    if identity is None:
        write_topology(data_dir, wanted, IDENTITY_FILE)
    if not has_record:
        write_topology(data_dir, wanted)
