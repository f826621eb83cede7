"""The data loader (PERSIA's data-loader role): one process per NN worker that streams that
rank's part of the training data and feeds it batches over a pipe.

``python -m embeddb.trainer.launcher.loader JOB.yaml --run-dir RUN --rank R --world W --epochs E0:E1
--batch-size B [--skip K]`` (numpy only: it never imports torch). For each epoch ``e`` in
``[E0, E1)`` it reads ``DatasetSpec.reader(pipeline, "train", B, train=True, rank=R, world=W,
epoch=e, seed=job.seed)`` (this rank's disjoint byte ranges / files, shuffled in a bounded
buffer, deterministic per (seed, epoch, rank)), drops the first ``K`` batches of epoch ``E0``
(a resumed job) and writes the batches to stdout as frames::

    frame   = kind (1 byte) | payload length (uint64 LE) | payload
    kind B  = a batch:   header length (uint32 LE) | JSON header | arrays, each 8-byte aligned
              header = {"n": 512, "grad": true,
                        "ids": [["user", 512, true], ["tags", 1290, false]],  (name, ids, single)
                        "non_id": [["price", "<f4", [512, 1]]],
                        "labels": [["clicked", "<f4", [512, 1]]]}
              arrays = user.values (uint64), tags.values, tags.offsets (int64, n + 1),
                       price, clicked
    kind E  = end of an epoch (no payload)
    kind D  = done: every epoch sent
    kind X  = an error: "TypeName<TAB>message" (a CorruptDataError names file:line)

The NN worker reads the frames in a background thread into a bounded queue
(:class:`BatchStream`), so parsing in the loader overlaps training in the rank.

Memory, per rank, is bounded by settings, never by the file:

* the loader: one text chunk being parsed (``chunk_bytes``, 1 MiB by default), the shuffle
  buffer (``shuffle: {buffer_rows: N}`` of the dataset, in parsed columns: about
  ``N * (8 * ids + 4 * numeric)`` bytes) and one batch being written;
* the pipe (the kernel's 64 KiB) and the rank's queue: ``depth`` (8) decoded batches.
"""

from __future__ import annotations

import argparse
import json
import queue
import struct
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import numpy as np

from embeddb.errors import (
    ConfigError,
    CorruptDataError,
    EmbeddbError,
    InvalidArgumentError,
    UnavailableError,
)
from embeddb.features.batch import (
    Batch,
    IDTypeFeature,
    IDTypeFeatureWithSingleID,
    Label,
    NonIDTypeFeature,
)
from embeddb.features.pipeline import PIPELINE_FILE, load_pipeline
from embeddb.trainer.launcher.job import JobConfig

__all__ = [
    "QUEUE_DEPTH",
    "BatchStream",
    "decode_batch",
    "encode_batch",
    "loader_command",
    "main",
    "read_frame",
    "write_frame",
]

QUEUE_DEPTH = 8  # decoded batches a rank holds ahead of training
BATCH, END, DONE, ERROR = b"B", b"E", b"D", b"X"
_FRAME = struct.Struct("<cQ")
_HEADER = struct.Struct("<I")
_ALIGN = 8
_ERRORS: dict[str, type[EmbeddbError]] = {
    "CorruptDataError": CorruptDataError,
    "InvalidArgumentError": InvalidArgumentError,
    "UnavailableError": UnavailableError,
}


# ------------------------------------------------------------------------------ serialization
def encode_batch(batch: Batch) -> list[bytes | memoryview]:
    """``batch`` as the parts of a ``B`` frame's payload (see the module docstring): the
    header, then every array's bytes (no copies of the arrays)."""
    arrays: list[np.ndarray[Any, Any]] = []
    ids = []
    for f in batch.id_type_features:
        single = bool(isinstance(f, IDTypeFeatureWithSingleID))
        ids.append([f.name, int(f.values.size), single])
        arrays.append(f.values)
        if not single:
            arrays.append(f.offsets)
    non_id = []
    for i, d in enumerate(batch.non_id_type_features):
        data = np.ascontiguousarray(d.data)
        non_id.append([d.name if d.name is not None else f"non_id_{i}", data.dtype.str, data.shape])
        arrays.append(data)
    labels = []
    for i, lb in enumerate(batch.labels):
        data = np.ascontiguousarray(lb.data)
        labels.append(
            [lb.name if lb.name is not None else f"label_{i}", data.dtype.str, data.shape]
        )
        arrays.append(data)
    doc = {"n": batch.batch_size, "grad": batch.requires_grad, "ids": ids}
    doc |= {"non_id": non_id, "labels": labels}
    header = json.dumps(doc, separators=(",", ":")).encode()
    header += b" " * (-(len(header) + _HEADER.size) % _ALIGN)
    parts: list[bytes | memoryview] = [_HEADER.pack(len(header)), header]
    for arr in arrays:
        arr = np.ascontiguousarray(arr)
        parts.append(arr.data.cast("B"))
        pad = -arr.nbytes % _ALIGN
        if pad:
            parts.append(b"\0" * pad)
    return parts


def decode_batch(payload: bytearray) -> Batch:
    """The batch of a ``B`` frame's payload (its arrays are views of ``payload``).

    Raises:
        CorruptDataError: a payload that does not parse.
    """
    try:
        (size,) = _HEADER.unpack_from(payload, 0)
        doc = json.loads(bytes(payload[_HEADER.size : _HEADER.size + size]))
        at = _HEADER.size + size
        n = int(doc["n"])

        def take(dtype: np.dtype[Any], count: int) -> np.ndarray[Any, Any]:
            nonlocal at
            arr = np.frombuffer(payload, dtype=dtype, count=count, offset=at)
            at += arr.nbytes + (-arr.nbytes % _ALIGN)
            return arr

        ids: list[IDTypeFeature] = []
        for name, count, single in doc["ids"]:
            values = take(np.dtype(np.uint64), count)
            if single:
                ids.append(IDTypeFeatureWithSingleID(name, values))
            else:
                ids.append(IDTypeFeature.from_csr(name, values, take(np.dtype(np.int64), n + 1)))
        non_id = [
            NonIDTypeFeature(take(np.dtype(dt), int(np.prod(shape))).reshape(shape), name=name)
            for name, dt, shape in doc["non_id"]
        ]
        labels = [
            Label(take(np.dtype(dt), int(np.prod(shape))).reshape(shape), name=name)
            for name, dt, shape in doc["labels"]
        ]
        return Batch(ids, non_id, labels, requires_grad=bool(doc["grad"]))
    except (KeyError, TypeError, ValueError, struct.error) as exc:
        raise CorruptDataError(f"a data loader frame does not parse: {exc}") from exc


def write_frame(out: IO[bytes], kind: bytes, parts: list[bytes | memoryview] | None = None) -> None:
    """Write one frame of ``kind`` whose payload is the concatenation of ``parts``."""
    parts = parts or []
    out.write(_FRAME.pack(kind, sum(len(p) for p in parts)))
    for part in parts:
        out.write(part)


def read_frame(source: IO[bytes]) -> tuple[bytes, bytearray] | None:
    """The next frame ``(kind, payload)``; None at the end of the stream.

    Raises:
        CorruptDataError: a stream cut mid-frame.
    """
    head = _read_exactly(source, _FRAME.size, allow_eof=True)
    if head is None:
        return None
    kind, size = _FRAME.unpack(head)
    payload = _read_exactly(source, size, allow_eof=False)
    assert payload is not None
    return kind, payload


def _read_exactly(source: IO[bytes], size: int, *, allow_eof: bool) -> bytearray | None:
    buffer = bytearray(size)
    view = memoryview(buffer)
    got = 0
    while got < size:
        n = source.readinto(view[got:])  # type: ignore[attr-defined]
        if not n:
            if got == 0 and allow_eof:
                return None
            raise CorruptDataError(f"the data loader's stream ended mid-frame ({got}/{size} bytes)")
        got += n
    return buffer


# ------------------------------------------------------------------------------ the loader
def run_loader(
    job: JobConfig,
    run_dir: Path,
    out: IO[bytes],
    *,
    rank: int,
    world: int,
    epochs: tuple[int, int],
    batch_size: int,
    skip: int = 0,
) -> None:
    """Write this rank's batches of epochs ``[epochs[0], epochs[1])`` to ``out`` as frames,
    dropping the first ``skip`` batches of the first epoch (see the module docstring)."""
    pipeline = load_pipeline(run_dir / PIPELINE_FILE)
    for epoch in range(*epochs):
        reader = job.dataset_spec.reader(
            pipeline,
            "train",
            batch_size,
            train=True,
            rank=rank,
            world=world,
            epoch=epoch,
            seed=job.seed,
        )
        for i, batch in enumerate(reader):
            if epoch == epochs[0] and i < skip:
                continue
            write_frame(out, BATCH, encode_batch(batch))
        write_frame(out, END)
    write_frame(out, DONE)
    out.flush()


def loader_command(
    job_path: Path,
    run_dir: Path,
    *,
    rank: int,
    world: int,
    epochs: tuple[int, int],
    batch_size: int,
    skip: int = 0,
) -> list[str]:
    """The command line of a rank's data loader."""
    return [
        sys.executable,
        "-m",
        "embeddb.trainer.launcher.loader",
        str(job_path),
        f"--run-dir={run_dir}",
        f"--rank={rank}",
        f"--world={world}",
        f"--epochs={epochs[0]}:{epochs[1]}",
        f"--batch-size={batch_size}",
        f"--skip={skip}",
    ]


def main(argv: list[str] | None = None) -> int:
    """Run a loader; errors become an ``X`` frame (and exit code 1)."""
    parser = argparse.ArgumentParser(prog="python -m embeddb.trainer.launcher.loader")
    parser.add_argument("job", type=Path, help="the training job YAML")
    parser.add_argument("--run-dir", type=Path, required=True)
    parser.add_argument("--rank", type=int, default=0)
    parser.add_argument("--world", type=int, default=1)
    parser.add_argument("--epochs", default="0:1", help="first:end (end exclusive)")
    parser.add_argument("--batch-size", type=int, required=True)
    parser.add_argument("--skip", type=int, default=0, help="batches of the first epoch to drop")
    args = parser.parse_args(argv)
    out = sys.stdout.buffer
    try:
        first, end = (int(x) for x in args.epochs.split(":"))
        job = JobConfig.from_yaml(args.job)
        run_loader(
            job,
            args.run_dir,
            out,
            rank=args.rank,
            world=args.world,
            epochs=(first, end),
            batch_size=args.batch_size,
            skip=args.skip,
        )
    except BrokenPipeError:  # the rank stopped reading (it stopped, or the epoch ended early)
        return 0
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # reported to the rank, which raises it
        message = f"{type(exc).__name__}\t{' '.join(str(exc).split())}".encode()
        try:
            write_frame(out, ERROR, [message])
            out.flush()
        except BrokenPipeError:
            pass
        return 1
    return 0


# ------------------------------------------------------------------------------ the rank side
class BatchStream:
    """A rank's end of its data loader: the loader process, and a thread reading its frames
    into a bounded queue (``depth`` batches) so parsing overlaps training.

    Usage::

        with BatchStream(loader_command(...)) as stream:
            for epoch in range(first, end):
                for batch in stream.epoch():     # this rank's batches of the epoch
                    ...

    Raises (from :meth:`epoch`):
        CorruptDataError: the loader met bad data (the message names file:line).
        UnavailableError: the loader died (its stderr is the rank's).
    """

    def __init__(self, command: list[str], depth: int = QUEUE_DEPTH) -> None:
        self._process = subprocess.Popen(command, stdout=subprocess.PIPE, bufsize=1 << 20)
        self._queue: queue.Queue[tuple[bytes, object]] = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._read, name="batch-stream", daemon=True)
        self._thread.start()

    def _put(self, item: tuple[bytes, object]) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _read(self) -> None:
        source = self._process.stdout
        assert source is not None
        try:
            while not self._stop.is_set():
                frame = read_frame(source)
                if frame is None:
                    code = self._process.wait()
                    self._put((ERROR, f"UnavailableError\tthe data loader exited with code {code}"))
                    return
                kind, payload = frame
                item: object = decode_batch(payload) if kind == BATCH else payload
                if not self._put((kind, item)) or kind in (DONE, ERROR):
                    return
        except Exception as exc:
            self._put((ERROR, f"{type(exc).__name__}\t{exc}"))

    def epoch(self) -> Iterator[Batch]:
        """The batches of the next epoch, until its end frame."""
        while True:
            kind, item = self._queue.get()
            if kind == BATCH:
                assert isinstance(item, Batch)
                yield item
            elif kind == END:
                return
            elif kind == DONE:
                raise UnavailableError("the data loader has no more epochs")
            else:
                text = item.decode() if isinstance(item, bytearray | bytes) else str(item)
                name, _, message = text.partition("\t")
                if name == "ConfigError":
                    raise ConfigError("", message)
                if name in _ERRORS:
                    raise _ERRORS[name](message)
                raise UnavailableError(f"the data loader failed: {name}: {message}")

    def close(self) -> None:
        """Stop the loader and the reading thread."""
        self._stop.set()
        if self._process.poll() is None:
            self._process.terminate()
        if self._process.stdout is not None:
            self._process.stdout.close()
        self._process.wait()
        self._thread.join(timeout=5)

    def __enter__(self) -> BatchStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


if __name__ == "__main__":
    sys.exit(main())
