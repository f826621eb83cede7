"""Incremental export: the rows a shard changed, written every ``interval_s`` as numpy files
for consumers that want PERSIA-style incremental updates (an inference fleet, an offline
indexer) without speaking gRPC.

Design
------
The :class:`Exporter` **tails the update log** (:meth:`embeddb.engine.shard.Shard.read_log`) from a
background thread rather than hooking the write path: a mutation costs exactly what it costs
without an export, the exporter sees precisely the acknowledged mutations in ``seq`` order, and
its position is a seq. That position makes the export resumable: the shard keeps the log
records after the last exported seq (:attr:`Exporter.exported_seq`; log truncation respects it)
and a restarted exporter — after a clean shutdown or a crash — continues from the last file it
finished, so no acknowledged mutation is ever skipped. The price is reading the log back
(usually from the page cache) and decoding it, off the write path.

Changes are folded into the latest row per ``(table, id)`` in memory; every ``interval_s`` (and
whenever ``max_pending_rows`` are pending) each table with changes gets one file, and one line
is appended to the index. :meth:`Exporter.close` (called by ``Shard.close``) reads the log to
its end and writes the tail before it returns.

Files
-----
::

    <export_dir>/
      index.jsonl                                  one line per export, appended (and fsynced)
                                                   once all of its files are in place
      <table>/inc-<n>-<first_seq>-<last_seq>.npz   n: the export's number (8 digits, so file
                                                   names sort in export order)
      <table>/.tmp-*                               being written; never read, removed at start

Each ``.npz`` (``numpy.load``, no pickle) holds the state, as of ``last_seq``, of every id of
one table changed by the log records ``first_seq .. last_seq``::

    ids        uint64  (n,)           changed ids that exist at last_seq, ascending
    rows       float32 (n, width)     their rows [vector | state]; rows[:, :dim] are vectors
    deleted    uint64  (k,)           ids deleted by last_seq (and not re-created), ascending
    dim        int64   ()             vector length
    table      str     ()             the table's name
    first_seq, last_seq  int64 ()     the log records folded into this file

For example (table ``user``, ``dim = 2``, Adagrad so ``width = 4``): records 101..250 assigned
id 7 twice, trained id 9 and deleted id 4 give ``inc-00000003-101-250.npz`` with
``ids = [7, 9]``, ``rows = [[a0, a1, s0, s1], [b0, b1, t0, t1]]`` (id 7's last value) and
``deleted = [4]``.

An index line (JSON)::

    {"n": 3, "first_seq": 101, "last_seq": 250, "time": 1700000000.0, "gap_before": false,
     "files": {"user": {"path": "user/inc-00000003-101-250.npz", "rows": 2, "deleted": 1}}}

A consumer applies the lines in order — for each file, delete ``deleted`` and upsert ``ids``
with ``rows``; a later file wins — and remembers the last ``n`` it applied. A line with no
files only advances the seq. Files are written to a temporary name, fsynced and renamed, and
the index line is appended after them, so every file a line names is complete. A last line
without its newline (a crash while appending) is not yet written: consumers ignore it and the
exporter cuts it when it starts.

A **position line** (``last_seq = first_seq - 1``, no files) records where the export starts or
starts again, as soon as it does, so that a crash before the first file loses nothing: the
first line of a fresh export directory holds the shard's seq at that moment (rows changed
before it are a snapshot's business), with ``gap_before: true`` unless the shard was empty
(a shard restored from ``embeddb reshard`` output holds rows at seq 0).
``gap_before: true`` means the state before this line cannot be derived from the lines before
it: the export starts at a non-empty shard, the log records were already truncated away when
the exporter started (it was off for longer than the snapshots keep the log), or the shard went
back to an older state (a restore, or a power loss under a lax fsync policy took records the
export had already shipped). A consumer that sees it reloads a full snapshot.

The exporter never deletes files; consumers (or an operator) remove the files they have
applied.

Memory: the latest row of each id changed since the last export, compacted as changes arrive
(about twice ``(rows changed per interval) x width x 4`` bytes), and capped by
``max_pending_rows``, beyond which an export is written early.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from embeddb.common.arrays import F32, U64
from embeddb.engine.durability import records
from embeddb.engine.durability.log import LogRecord, LogTruncatedError
from embeddb.engine.storage.changes import Change, Op
from embeddb.errors import CorruptDataError, InvalidArgumentError, StorageError

__all__ = ["INDEX", "ExportFile", "Exporter", "load_file", "read_index"]

logger = logging.getLogger(__name__)

INDEX = "index.jsonl"
_TMP_PREFIX = ".tmp-"
_POLL_S = 0.05
_MAX_PENDING_ROWS = 1 << 20
_MIN_COMPACT = 4096

ReadLog = Callable[[int], Iterator[LogRecord]]


@dataclass(frozen=True)
class ExportFile:
    """One export file as :func:`load_file` reads it (see the module docstring)."""

    table: str
    dim: int
    first_seq: int
    last_seq: int
    ids: U64
    rows: F32
    deleted: U64

    @property
    def vectors(self) -> F32:
        """``rows[:, :dim]``: the vectors without optimizer state."""
        return self.rows[:, : self.dim]


def read_index(directory: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The complete lines of an export directory's index, in order (empty if none yet).

    Raises:
        CorruptDataError: a complete line is not valid JSON.
    """
    path = Path(directory) / INDEX
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise StorageError(f"cannot read {path}: {exc}") from exc
    lines = data.split(b"\n")[:-1]  # the part after the last newline is not written yet
    out = []
    for k, line in enumerate(lines):
        try:
            entry = json.loads(line)
        except ValueError as exc:
            raise CorruptDataError(f"{path} line {k + 1} is not valid JSON: {exc}") from exc
        out.append(entry)
    return out


def load_file(path: str | os.PathLike[str]) -> ExportFile:
    """Read one export file.

    Raises:
        CorruptDataError: the file is not a complete export file.
    """
    try:
        with np.load(path, allow_pickle=False) as z:
            return ExportFile(
                table=str(z["table"]),
                dim=int(z["dim"]),
                first_seq=int(z["first_seq"]),
                last_seq=int(z["last_seq"]),
                ids=z["ids"].astype(np.uint64, copy=False),
                rows=z["rows"].astype(np.float32, copy=False),
                deleted=z["deleted"].astype(np.uint64, copy=False),
            )
    except (OSError, ValueError, KeyError) as exc:
        raise CorruptDataError(f"export file {path} is unreadable: {exc}") from exc


class _Pending:
    """The changes of one table since the last export, folded to the latest per id."""

    def __init__(self, width: int) -> None:
        self.width = width
        self._ids: list[U64] = []
        self._rows: list[F32] = []
        self._puts: list[npt.NDArray[np.bool_]] = []
        self.count = 0  # entries held (ids may repeat until the next compaction)
        self._compact_at = _MIN_COMPACT

    def add(self, change: Change) -> None:
        n = change.ids.size
        if n == 0:
            return
        self._ids.append(change.ids)
        if change.op is Op.PUT and change.rows is not None:
            self._rows.append(change.rows)
            self._puts.append(np.ones(n, dtype=bool))
        else:
            self._rows.append(np.zeros((n, self.width), dtype=np.float32))
            self._puts.append(np.zeros(n, dtype=bool))
        self.count += n
        if self.count >= self._compact_at:
            self._compact()
            self._compact_at = max(_MIN_COMPACT, 2 * self.count)

    def _compact(self) -> tuple[U64, F32, npt.NDArray[np.bool_]]:
        """Keep the last entry of each id (sorted by id); returns ``(ids, rows, is_put)``."""
        if not self._ids:
            return (
                np.empty(0, np.uint64),
                np.empty((0, self.width), np.float32),
                np.empty(0, bool),
            )
        ids = np.concatenate(self._ids)
        rows = np.concatenate(self._rows)
        puts = np.concatenate(self._puts)
        # The last occurrence of each id: the first in the reversed arrays.
        uniq, first_in_reversed = np.unique(ids[::-1], return_index=True)
        last = ids.size - 1 - first_in_reversed
        ids, rows, puts = uniq, rows[last], puts[last]
        self._ids, self._rows, self._puts = [ids], [rows], [puts]
        self.count = ids.size
        return ids, rows, puts

    def result(self) -> tuple[U64, F32, U64]:
        """``(ids, rows, deleted)`` as they would be exported now (nothing is reset)."""
        ids, rows, puts = self._compact()
        return ids[puts], np.ascontiguousarray(rows[puts]), ids[~puts]

    def clear(self) -> None:
        self._ids, self._rows, self._puts = [], [], []
        self.count = 0
        self._compact_at = _MIN_COMPACT


class Exporter:
    """Exports a shard's changed rows to ``directory`` (see the module docstring).

    Args:
        directory: the export directory (created if missing).
        read_log: ``read_log(after_seq)`` iterates the log records after ``after_seq`` and ends
            once caught up (:meth:`embeddb.engine.shard.Shard.read_log`).
        tables: ``{table name: (dim, width)}``.
        seq: the shard's current seq: where a fresh export starts, and the bound on where a
            resumed one may continue.
        empty: the shard holds no rows (a fresh export of a non-empty shard starts with a gap).
        interval_s: seconds between exports.
        max_pending_rows: pending rows (over all tables) that trigger an early export.
        poll_s: how often the background thread reads the log.

    Raises:
        StorageError: the directory cannot be created or its index read.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        read_log: ReadLog,
        tables: Mapping[str, tuple[int, int]],
        seq: int,
        interval_s: float = 10.0,
        *,
        empty: bool = False,
        max_pending_rows: int = _MAX_PENDING_ROWS,
        poll_s: float = _POLL_S,
    ) -> None:
        if interval_s <= 0 or poll_s <= 0 or max_pending_rows < 1:
            raise InvalidArgumentError("interval_s, poll_s and max_pending_rows must be positive")
        self.directory = Path(directory)
        self.interval_s = interval_s
        self._read_log = read_log
        self._dims = {name: dim for name, (dim, _) in tables.items()}
        self._pending = {name: _Pending(width) for name, (_, width) in tables.items()}
        self._max_pending = max_pending_rows
        self._poll_s = poll_s
        self._lock = threading.Lock()  # reading the log and writing files
        self._stop = threading.Event()
        self._closed = False
        self.error: Exception | None = None  # the last failure of the background thread
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            for name in tables:
                (self.directory / name).mkdir(exist_ok=True)
                for stale in (self.directory / name).glob(_TMP_PREFIX + "*"):
                    stale.unlink()
            last = self._open_index()
        except OSError as exc:
            raise StorageError(f"cannot use export directory {self.directory}: {exc}") from exc
        self._next_n = 1 if last is None else int(last["n"]) + 1
        self._exported_seq = seq if last is None else int(last["last_seq"])  # in a finished export
        self._read_seq = self._exported_seq  # the last seq folded into _pending
        if last is None:
            self._append_position(seq, gap=not empty)
        elif self._exported_seq > seq:
            logger.warning(
                "export %s has shipped up to seq %d but the shard is at seq %d (restored or "
                "lost records): the export starts again there, marked gap_before",
                self.directory, self._exported_seq, seq,
            )  # fmt: skip
            self._append_position(seq, gap=True)
        self._thread = threading.Thread(target=self._run, name="embeddb-export", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ public
    @property
    def exported_seq(self) -> int:
        """The last seq whose changes are in a finished export (the log must keep the records
        after it)."""
        return self._exported_seq

    def flush(self) -> None:
        """Read the log to its end and write what is pending now.

        Raises:
            StorageError: writing failed (the changes stay pending).
        """
        with self._lock:
            self._drain_and_write(force=True)

    def close(self) -> None:
        """Stop the thread, then export the tail: every record appended before this call.
        Idempotent.

        Raises:
            StorageError: the last export failed; the changes are not lost — the next start
                resumes from :attr:`exported_seq`.
            UnavailableError: the log was closed first.
        """
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        self._thread.join()
        self.flush()

    def abandon(self) -> None:
        """Stop the thread without exporting what is pending, as a crash would; the next start
        resumes after :attr:`exported_seq`. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        self._thread.join()

    # ------------------------------------------------------------------ the thread
    def _run(self) -> None:
        due = time.monotonic() + self.interval_s
        while not self._stop.wait(self._poll_s):
            try:
                with self._lock:
                    if self._stop.is_set():
                        return
                    self._drain_and_write(force=time.monotonic() >= due)
                if time.monotonic() >= due:
                    due = time.monotonic() + self.interval_s
                self.error = None
            except Exception as exc:  # the thread must not die: it retries at the next interval
                if self.error is None or str(exc) != str(self.error):
                    logger.error("export to %s failed (retrying): %r", self.directory, exc)
                self.error = exc
                due = time.monotonic() + self.interval_s  # retry at the next interval
                self._stop.wait(min(self.interval_s, 1.0))

    def _drain_and_write(self, force: bool) -> None:
        """Fold the new log records in (writing early whenever too much is pending); write
        everything pending if ``force``."""
        while self._drain():
            self._write()
        if force:
            self._write()

    def _drain(self) -> bool:
        """Fold log records into the pending rows; True if it stopped because too many rows
        are pending (the caller writes them and calls again)."""
        try:
            for record in self._read_log(self._read_seq):
                where = f"update log record {record.seq}"
                for change in records.decode(record.payload, where):
                    pending = self._pending.get(change.table)
                    if pending is not None:
                        pending.add(change)
                self._read_seq = record.seq
                if sum(p.count for p in self._pending.values()) >= self._max_pending:
                    return True
        except LogTruncatedError as exc:
            logger.error(
                "export %s: the update log after seq %d is gone (it starts at %d); the changes "
                "in between are not exported and the next export is marked gap_before",
                self.directory, self._read_seq, exc.first_seq,
            )  # fmt: skip
            self._write()  # what was read before the gap
            self._append_position(exc.first_seq - 1, gap=True)
            return True
        return False

    def _write(self) -> None:
        """Write the pending changes (records ``exported_seq + 1 .. read_seq``) and their index
        line; on failure nothing is lost (the changes stay pending)."""
        first, last = self._exported_seq + 1, self._read_seq
        if last < first:
            return
        n = self._next_n
        written: list[Path] = []
        files: dict[str, dict[str, Any]] = {}
        try:
            for name, pending in self._pending.items():
                ids, rows, deleted = pending.result()
                if ids.size == 0 and deleted.size == 0:
                    continue
                rel = f"{name}/inc-{n:08d}-{first}-{last}.npz"
                self._write_file(self.directory / rel, name, first, last, ids, rows, deleted)
                written.append(self.directory / rel)
                files[name] = {"path": rel, "rows": int(ids.size), "deleted": int(deleted.size)}
            line = {
                "n": n,
                "first_seq": first,
                "last_seq": last,
                "time": time.time(),
                "gap_before": False,
                "files": files,
            }
            self._append_index(line)
        except OSError as exc:
            for path in written:
                path.unlink(missing_ok=True)
            raise StorageError(f"cannot write export {n} to {self.directory}: {exc}") from exc
        for pending in self._pending.values():
            pending.clear()
        self._exported_seq, self._next_n = last, n + 1

    def _append_position(self, seq: int, gap: bool) -> None:
        """Record (durably) that the export goes on after ``seq`` (see the module docstring)."""
        line = {
            "n": self._next_n,
            "first_seq": seq + 1,
            "last_seq": seq,
            "time": time.time(),
            "gap_before": gap,
            "files": {},
        }
        try:
            self._append_index(line)
        except OSError as exc:
            raise StorageError(f"cannot write the export index in {self.directory}: {exc}") from exc
        self._exported_seq = self._read_seq = seq
        self._next_n += 1

    def _write_file(
        self, path: Path, table: str, first: int, last: int, ids: U64, rows: F32, deleted: U64
    ) -> None:
        tmp = path.with_name(f"{_TMP_PREFIX}{path.name}")
        with open(tmp, "wb") as f:
            np.savez(
                f,
                ids=ids.astype("<u8"),
                rows=rows.astype("<f4"),
                deleted=deleted.astype("<u8"),
                dim=np.int64(self._dims[table]),
                table=np.str_(table),
                first_seq=np.int64(first),
                last_seq=np.int64(last),
            )
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        _fsync_dir(path.parent)

    def _append_index(self, line: dict[str, Any]) -> None:
        """Append one line durably; on failure, cut the file back so that no partial line is
        left for the next append to follow."""
        path = self.directory / INDEX
        with open(path, "ab") as f:
            end = f.tell()
            try:
                f.write(json.dumps(line, sort_keys=True).encode() + b"\n")
                f.flush()
                os.fsync(f.fileno())
            except OSError:
                try:
                    f.truncate(end)
                except OSError:
                    logger.exception("cannot cut the export index %s back after a failure", path)
                raise
        if line["n"] == 1:
            _fsync_dir(self.directory)

    def _open_index(self) -> dict[str, Any] | None:
        """The last complete index line; a torn last line is cut off."""
        path = self.directory / INDEX
        if not path.exists():
            return None
        data = path.read_bytes()
        end = data.rfind(b"\n") + 1
        if end < len(data):
            logger.warning("export index %s: cutting an incomplete last line", path)
            with open(path, "r+b") as f:
                f.truncate(end)
                os.fsync(f.fileno())
        entries = read_index(self.directory)
        return entries[-1] if entries else None


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
