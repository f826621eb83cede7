"""Online inference on an exported model: records → batch → lookups → pooled → dense → scores.

Per :meth:`InferCtx.predict` call::

    batch                 ID features (CSR, see embeddb.trainer.batch) + non-ID features
      plan                each feature's ids encoded and deduplicated once per table, exactly as
                          the embedding worker does in training (embedding_worker.plan_lookup)
      look up             every table's unique ids in one Client.lookup_many(train=False): one
                          RPC per shard per batch, shards in parallel; evaluation lookups never
                          insert rows nor refresh recency, and the client retries them
      pool                per feature, as in training (embedding_worker.pool_lookup)
      dense               the TorchScript module under torch.inference_mode(): (n, 1) logits
      scores              sigmoid → (n,) float32 probabilities

Unknown ids (never trained, evicted to nothing, deleted) get what the shard returns for an
evaluation lookup of an id it does not store: **a zero vector** (the table's default; no row is
created). The shards' lookup answer does not say which ids were unknown (``LookupResponse`` holds
vectors only), so ``InferCtx`` cannot count them without a second RPC per shard; it exposes no
unknown-id counter.

A record (JSON-shaped, :meth:`InferCtx.batch_from_records`)::

    {"ids": {"user_id": 42, "genres": [3, 7]},     # a missing ID feature: an empty sample
     "non_id": {"dense": [0.1, 0.2, 0.3, 0.4]}}     # every non-ID input of model.json required
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from types import TracebackType

import numpy as np
import torch

from embeddb.arrays import F32
from embeddb.client import Client, ClientOptions
from embeddb.client.options import check_addresses, read_address_file, tls_credentials
from embeddb.config import EmbeddingConfig
from embeddb.errors import (
    ConfigError,
    CorruptDataError,
    InvalidArgumentError,
    NotFoundError,
)

from ..batch import Batch, IDTypeFeature, IDTypeFeatureWithSingleID, NonIDTypeFeature
from ..embedding_worker import IdFeature, plan_lookup, pool_lookup, pooling_specs
from .spec import DENSE_FILE, EMBEDDING_FILE, ModelSpec, NonIdSpec, load_model_spec

__all__ = ["InferCtx", "load_dense", "load_embedding_config", "quiet_jit"]

_MAX_ID = (1 << 64) - 1
_RECORD_KEYS = frozenset(("ids", "non_id"))


@contextlib.contextmanager
def quiet_jit() -> Iterator[None]:
    """Silence TorchScript's deprecation warnings (torch >= 2.10 warns on script, trace, save
    and load; TorchScript stays the format TorchServe and C++ runtimes load)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r".*torch\.jit", category=DeprecationWarning)
        yield


def load_embedding_config(model_dir: str | os.PathLike[str]) -> EmbeddingConfig:
    """The ``embedding.yaml`` of a model directory.

    Raises:
        NotFoundError: no ``embedding.yaml``. CorruptDataError: it is not a valid config.
    """
    path = Path(model_dir) / EMBEDDING_FILE
    if not path.is_file():
        raise NotFoundError(f"{path} does not exist: {model_dir} is not a complete model")
    try:
        return EmbeddingConfig.from_yaml(path)
    except ConfigError as exc:
        raise CorruptDataError(f"{path} is not a valid embedding config: {exc}") from exc


def load_dense(model_dir: str | os.PathLike[str], device: torch.device) -> torch.jit.ScriptModule:
    """The TorchScript dense part of a model directory, in eval mode on ``device``.

    Raises:
        NotFoundError: no ``dense.pt``. CorruptDataError: it is not a TorchScript archive.
    """
    path = Path(model_dir) / DENSE_FILE
    if not path.is_file():
        raise NotFoundError(f"{path} does not exist: {model_dir} is not a complete model")
    try:
        with quiet_jit():
            module: torch.jit.ScriptModule = torch.jit.load(  # type: ignore[no-untyped-call]
                str(path), map_location=device
            )
    except (RuntimeError, ValueError, OSError) as exc:
        raise CorruptDataError(f"{path} is not a TorchScript archive: {exc}") from exc
    module.eval()
    return module


class InferCtx:
    """Score records with an exported model against the shards (see the module docstring).

    Args:
        model_dir: a directory written by :func:`~embeddb.trainer.serving.export_model`.
        addresses: the shards' ``host:port`` in shard order (read-only followers in
            production), or the path of an address file.
        token: bearer token for the shards (a read-only one is enough).
        tls_ca: PEM file of the CA that signed the shards' certificates; ``None``: plaintext.
        device: where the dense part runs (``"cpu"``, ``"cuda:0"``).
        threads: torch intra-op threads (``torch.set_num_threads``, which is process-wide);
            ``None`` leaves torch's setting.

    Attributes:
        spec: the parsed ``model.json``.
        embedding_config: the parsed ``embedding.yaml``.
        predictions: samples scored so far.

    Raises:
        NotFoundError: the directory, ``model.json``, ``dense.pt`` or ``embedding.yaml`` is
            missing. CorruptDataError: one of them is malformed. ConfigError: bad addresses, or
            the shards do not serve a table of the model (or with another ``dim``), or list
            in another order. embeddb errors of the client: the shards cannot be reached.
    """

    def __init__(
        self,
        model_dir: str | os.PathLike[str],
        addresses: Sequence[str] | str | os.PathLike[str],
        *,
        token: str | None = None,
        tls_ca: str | os.PathLike[str] | None = None,
        device: str = "cpu",
        threads: int | None = None,
    ) -> None:
        self.model_dir = Path(model_dir)
        self.on_lookup: Callable[[float], None] | None = None  # seconds of each batch's lookups
        self.spec: ModelSpec = load_model_spec(self.model_dir)
        self.embedding_config = load_embedding_config(self.model_dir)
        unknown = [n for n in self.spec.id_features if n not in self.embedding_config.features]
        if unknown:
            raise CorruptDataError(
                f"{self.model_dir}: model.json names ID features {unknown} that "
                f"{EMBEDDING_FILE} lacks"
            )
        if threads is not None:
            if not isinstance(threads, int) or threads < 1:
                raise ConfigError("threads", f"must be an integer >= 1, got {threads!r}")
            torch.set_num_threads(threads)
        self.device = torch.device(device)
        self._dense = load_dense(self.model_dir, self.device)
        self._specs = pooling_specs(self.embedding_config, self.spec.pooling)
        for name in self.spec.id_features:
            if self._specs[name].sequence:
                raise CorruptDataError(
                    f"{self.model_dir}: feature {name!r} is a sequence feature "
                    "(embedding_summation: false); exported models support pooled features only"
                )
        self._non_id = {s.name: s for s in self.spec.non_id}
        self._id_index = {name: i for i, name in enumerate(self.spec.id_features)}
        self._lock = threading.Lock()
        self.predictions = 0
        self._closed = False
        shard_list = (
            read_address_file(addresses)
            if isinstance(addresses, (str, os.PathLike))
            else check_addresses(list(addresses))
        )
        options = ClientOptions(token=token, credentials=tls_credentials(tls_ca))
        self._client = Client(shard_list, options)
        try:
            self._check_shards()
        except BaseException:
            self._client.close()
            raise

    @property
    def addresses(self) -> tuple[str, ...]:
        return tuple(self._client.addresses)

    def _check_shards(self) -> None:
        self._client.check_topology()
        served = {t.name: t.dim for t in self._client.list_tables()}
        for name in self.spec.id_features:
            feature = self.embedding_config.features[name]
            dim = served.get(feature.table)
            if dim is None:
                raise ConfigError(
                    f"tables.{feature.table}",
                    f"the shards serve no table {feature.table!r} ({sorted(served)})",
                )
            if dim != feature.dim:
                raise ConfigError(
                    f"tables.{feature.table}.dim",
                    f"the shards' table has dim {dim}, the model's config says {feature.dim}",
                )

    # ------------------------------------------------------------------ scoring
    def predict(self, batch: Batch) -> F32:
        """Score ``batch``: ``(n,)`` float32 probabilities (the sigmoid of the model's logits).

        Safe to call from several threads at once (the client and the TorchScript module are
        shared; nothing else is).

        Args:
            batch: ID features named in ``spec.id_features`` (any order; a missing one is an
                empty sample for every row), and the non-ID features of ``spec.non_id`` in
                order, each ``(n, *shape)``; labels are ignored.

        Raises:
            InvalidArgumentError: an ID feature the model does not read, a missing non-ID
                feature or one of the wrong shape.
            embeddb errors of the client (UnavailableError, DeadlineExceededError, ...).
        """
        if self._closed:
            raise InvalidArgumentError("the inference context is closed")
        n = batch.batch_size
        features = self._id_features(batch, n)
        non_id = self._non_id_tensors(batch, n)
        plan = plan_lookup(self.embedding_config, self._specs, features)
        requests = {table: ids.unique for table, ids in plan.tables.items()}
        started = time.perf_counter()
        vectors = self._client.lookup_many(requests, train=False) if requests else {}
        if self.on_lookup is not None:
            self.on_lookup(time.perf_counter() - started)
        pooled = pool_lookup(plan, vectors)
        embeddings = [torch.from_numpy(np.asarray(p)).to(self.device) for p in pooled]
        with torch.inference_mode():
            logits = self._dense(non_id, embeddings)
            scores = torch.sigmoid(logits.float()).reshape(-1)
        out: F32 = scores.cpu().numpy().astype(np.float32, copy=False)
        if out.shape != (n,):
            raise InvalidArgumentError(
                f"the model returned {tuple(logits.shape)} for {n} samples; expected ({n}, 1)"
            )
        with self._lock:
            self.predictions += n
        return out

    def predict_records(self, records: object) -> F32:
        """:meth:`predict` of :meth:`batch_from_records`."""
        return self.predict(self.batch_from_records(records))

    def _id_features(self, batch: Batch, n: int) -> list[IdFeature]:
        given: dict[str, IDTypeFeature] = {}
        for f in batch.id_type_features:
            if f.name not in self._id_index:
                raise InvalidArgumentError(
                    f"the model reads no ID feature {f.name!r} "
                    f"(it reads {', '.join(self.spec.id_features)})"
                )
            given[f.name] = f
        empty = np.zeros(n + 1, dtype=np.int64)
        out: list[IdFeature] = []
        for name in self.spec.id_features:
            feature = given.get(name)
            if feature is None:
                out.append((name, np.zeros(0, np.uint64), empty))
            else:
                offsets = None if feature.single_id else feature.offsets
                out.append((name, feature.values, offsets))
        return out

    def _non_id_tensors(self, batch: Batch, n: int) -> list[torch.Tensor]:
        got = batch.non_id_type_features
        if len(got) != len(self.spec.non_id):
            names = [s.name for s in self.spec.non_id]
            raise InvalidArgumentError(
                f"the model reads {len(names)} non-ID features {names}, the batch has {len(got)}"
            )
        out: list[torch.Tensor] = []
        for spec, f in zip(self.spec.non_id, got, strict=True):
            if f.data.shape != (n, *spec.shape):
                raise InvalidArgumentError(
                    f"non-ID feature {spec.name!r} must have shape {(n, *spec.shape)}, "
                    f"got {f.data.shape}"
                )
            if not (np.issubdtype(f.data.dtype, np.number) or f.data.dtype == np.bool_):
                raise InvalidArgumentError(
                    f"non-ID feature {spec.name!r} must be numeric, got dtype {f.data.dtype}"
                )
            array = np.ascontiguousarray(f.data, dtype=np.float32)
            if not array.flags.writeable:  # e.g. a view of a request's bytes: torch warns
                array = array.copy()
            out.append(torch.from_numpy(array).to(self.device))
        return out

    # ------------------------------------------------------------------ records
    def batch_from_records(self, records: object) -> Batch:
        """A batch from JSON-shaped records (see the module docstring).

        Each record is ``{"ids": {feature: id | [id, ...]}, "non_id": {name: number | nested
        list}}``: ids are integers in ``[0, 2**64)``; a missing ID feature is an empty sample;
        every non-ID input of ``spec.non_id`` is required, with its per-sample shape (a single
        number for a one-element shape).

        Raises:
            InvalidArgumentError: not a non-empty list of records, or a record with an unknown
                key, an unknown ID feature or non-ID input, an id that is not an integer in
                range, a missing non-ID input, or one of the wrong shape or type; the message
                names the record's index and the field.
        """
        if isinstance(records, (str, bytes, Mapping)) or not isinstance(records, Sequence):
            raise InvalidArgumentError(
                f"records must be a list of records, got {type(records).__name__}"
            )
        n = len(records)
        if n == 0:
            raise InvalidArgumentError("records is empty: nothing to score")
        names = self.spec.id_features
        counts = np.zeros((len(names), n), dtype=np.int64)
        flat: list[list[int]] = [[] for _ in names]  # every id of a feature, in record order
        non_id_values: dict[str, list[object]] = {s.name: [] for s in self.spec.non_id}
        for i, record in enumerate(records):
            if not isinstance(record, Mapping):
                raise InvalidArgumentError(
                    f"record {i} must be an object, got {type(record).__name__}"
                )
            extra = record.keys() - _RECORD_KEYS
            if extra:
                raise InvalidArgumentError(
                    f"record {i} has unknown keys {sorted(map(str, extra))} "
                    "(a record has 'ids' and 'non_id')"
                )
            ids = record.get("ids", {})
            if not isinstance(ids, Mapping):
                raise InvalidArgumentError(
                    f"record {i}: 'ids' must be an object of feature -> ids, "
                    f"got {type(ids).__name__}"
                )
            for name, value in ids.items():
                k = self._id_index.get(name)
                if k is None:
                    raise InvalidArgumentError(
                        f"record {i}: ids.{name}: the model reads no such ID feature "
                        f"({', '.join(names)})"
                    )
                if type(value) is int and 0 <= value <= _MAX_ID:  # the common case, no numpy
                    flat[k].append(value)
                    counts[k, i] = 1
                else:
                    many = _ids_of(value, i, name)
                    flat[k].extend(many)
                    counts[k, i] = len(many)
            values = record.get("non_id", {})
            if not isinstance(values, Mapping):
                raise InvalidArgumentError(
                    f"record {i}: 'non_id' must be an object of name -> values, "
                    f"got {type(values).__name__}"
                )
            for name in values.keys() - non_id_values.keys():
                raise InvalidArgumentError(
                    f"record {i}: non_id.{name}: the model reads no such non-ID input "
                    f"({', '.join(non_id_values) or 'none'})"
                )
            for name, column in non_id_values.items():
                if name not in values:
                    raise InvalidArgumentError(f"record {i}: non_id.{name} is missing")
                column.append(values[name])
        id_features: list[IDTypeFeature] = []
        for k, name in enumerate(names):
            row = counts[k]
            values_k = np.array(flat[k], dtype=np.uint64)
            if values_k.size == n and bool(np.all(row == 1)):
                id_features.append(IDTypeFeatureWithSingleID(name, values_k))
            else:
                offsets = np.zeros(n + 1, dtype=np.int64)
                np.cumsum(row, out=offsets[1:])
                id_features.append(IDTypeFeature.from_csr(name, values_k, offsets))
        non_id = [
            NonIDTypeFeature(_non_id_column(spec, non_id_values[spec.name]), name=spec.name)
            for spec in self.spec.non_id
        ]
        return Batch(id_features, non_id, requires_grad=False)

    # ------------------------------------------------------------------ lifecycle
    def close(self) -> None:
        """Close the shards' client. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._client.close()

    def __enter__(self) -> InferCtx:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"InferCtx({str(self.model_dir)!r}, {list(self.addresses)!r})"


# ---------------------------------------------------------------------- helpers
def _ids_of(value: object, index: int, name: str) -> list[int]:
    """One record's ids of one feature, checked (a number or a list of numbers)."""
    if isinstance(value, int) and not isinstance(value, bool):
        raise InvalidArgumentError(
            f"record {index}: ids.{name}: {value} is not an id (integers in [0, 2**64))"
        )
    if isinstance(value, (list, tuple)):
        if not value:
            return []
        try:
            array = np.asarray(value)
        except (ValueError, OverflowError):
            array = np.asarray([0.5])  # ragged or out of range: reported below
        if array.ndim == 1 and (
            array.dtype.kind == "u" or (array.dtype.kind == "i" and int(array.min()) >= 0)
        ):
            return list(value)
        raise InvalidArgumentError(
            f"record {index}: ids.{name}: must be a flat list of integers in [0, 2**64), "
            f"got {_preview(value)}"
        )
    raise InvalidArgumentError(
        f"record {index}: ids.{name}: must be an integer id or a list of them, "
        f"got {type(value).__name__}"
    )


def _non_id_column(spec: NonIdSpec, column: list[object]) -> F32:
    """``(n, *spec.shape)`` float32 from one value per record; a precise error otherwise."""
    n = len(column)
    scalar = spec.size == 1
    try:
        array = np.asarray(column, dtype=np.float32)
    except (TypeError, ValueError):
        array = None
    if array is not None:
        if array.shape == (n, *spec.shape):
            pass
        elif scalar and array.shape == (n,):
            array = array.reshape(n, *spec.shape)
        else:
            array = None
    if array is not None and bool(np.isfinite(array).all()):
        return array
    for i, value in enumerate(column):  # the slow path, only to name the bad record
        if isinstance(value, bool) or not _is_numeric(value):
            raise InvalidArgumentError(
                f"record {i}: non_id.{spec.name}: must be numbers, got {_preview(value)}"
            )
        one = np.asarray(value, dtype=np.float64)
        if one.shape != spec.shape and not (scalar and one.size == 1):
            raise InvalidArgumentError(
                f"record {i}: non_id.{spec.name}: must have shape {list(spec.shape)}, got "
                f"{list(one.shape)}"
            )
        if not np.isfinite(one).all():
            raise InvalidArgumentError(f"record {i}: non_id.{spec.name}: must be finite numbers")
    raise InvalidArgumentError(f"non_id.{spec.name}: values of mixed shapes")


def _is_numeric(value: object) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, (int, float)):
        return True
    if isinstance(value, (list, tuple)):
        return all(_is_numeric(v) for v in value)
    return False


def _preview(value: object, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
