"""Online inference on an exported model: records → batch → lookups → pooled → dense → scores.

Per :meth:`InferCtx.predict` call::

    batch                 ID features (CSR, see embeddb.features.batch) + non-ID features
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

Records (JSON-shaped, :meth:`InferCtx.batch_from_records`). A model exported with its feature
pipeline (``features.json``) reads **raw records**, column values as in the training data,
turned into a batch by the code that built the training batches (no training/serving skew)::

    {"user": "u17", "city": "Zurich", "tags": "a|b", "price": 12.5}

A missing numeric value is the training mean of its column (0 after ``standardize``), a key
that no column reads is refused unless the model was exported with ``lenient_records``.

A model without one reads **pre-hashed records** (:meth:`InferCtx.batch_from_hashed_records`,
always available; ids may be decimal strings, JSON-safe 64-bit ids)::

    {"ids": {"user_id": 42, "genres": [3, 7]},     # a missing ID feature: an empty sample
     "non_id": {"dense": [0.1, 0.2, 0.3, 0.4]}}     # every non-ID input of model.json required

Where the embeddings come from (the *lookup backend*): the shards over gRPC (``addresses``:
read-only followers in production), or any object with the client's evaluation-lookup
interface (``backend=``, :class:`LookupBackend`), such as the shards of a job checkpoint
opened in-process (:meth:`InferCtx.from_checkpoint`,
:class:`~embeddb.serving.local_shards.LocalShards`).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Protocol

import numpy as np
import torch

from embeddb.client import Client, ClientOptions
from embeddb.client.options import check_addresses, read_address_file, tls_credentials
from embeddb.common.arrays import F32
from embeddb.config import EmbeddingConfig
from embeddb.errors import (
    ConfigError,
    CorruptDataError,
    InvalidArgumentError,
    NotFoundError,
)
from embeddb.features.batch import Batch, IDTypeFeature, NonIDTypeFeature
from embeddb.serving.records import check_records, hashed_batch
from embeddb.trainer.embedding.plan import IdFeature, plan_lookup, pool_lookup, pooling_specs
from embeddb.trainer.export import quiet_jit
from embeddb.trainer.model_spec import (
    DENSE_FILE,
    EMBEDDING_FILE,
    ModelSpec,
    check_pipeline,
    load_model_spec,
)

if TYPE_CHECKING:
    from embeddb.features.pipeline import FeaturePipeline
    from embeddb.features.records import RecordStats

__all__ = [
    "InferCtx",
    "LookupBackend",
    "load_dense",
    "load_embedding_config",
    "load_pipeline_of",
]

logger = logging.getLogger(__name__)


class _Table(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def dim(self) -> int: ...


class LookupBackend(Protocol):
    """Where :class:`InferCtx` reads embeddings: what it uses of
    :class:`~embeddb.client.Client` (evaluation lookups never insert nor refresh rows; an
    unknown id reads as zeros)."""

    @property
    def addresses(self) -> tuple[str, ...]: ...
    def check_topology(self) -> None: ...
    def list_tables(self) -> Sequence[_Table]: ...
    def lookup_many(
        self, requests: Mapping[str, object], train: bool = ...
    ) -> Mapping[str, F32]: ...
    def close(self) -> None: ...


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


def load_pipeline_of(model_dir: str | os.PathLike[str], spec: ModelSpec) -> FeaturePipeline | None:
    """The feature pipeline of a model directory (``None`` when model.json names none),
    checked against the model's inputs.

    Raises:
        NotFoundError: model.json names a pipeline file that is missing.
        CorruptDataError: the file is malformed, or its features are not the model's.
    """
    if spec.pipeline is None:
        return None
    from embeddb.features.pipeline import load_pipeline

    pipeline = load_pipeline(Path(model_dir) / spec.pipeline)
    try:
        check_pipeline(pipeline, spec, str(Path(model_dir) / spec.pipeline))
    except InvalidArgumentError as exc:
        raise CorruptDataError(str(exc)) from exc
    return pipeline


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
        model_dir: a directory written by :func:`~embeddb.serving.export_model`.
        addresses: the shards' ``host:port`` in shard order (read-only followers in
            production), or the path of an address file; ``None`` with ``backend``.
        token: bearer token for the shards (a read-only one is enough).
        tls_ca: PEM file of the CA that signed the shards' certificates; ``None``: plaintext.
        device: where the dense part runs (``"cpu"``, ``"cuda:0"``).
        threads: torch intra-op threads (``torch.set_num_threads``, which is process-wide);
            ``None`` leaves torch's setting.
        backend: read embeddings from this instead of shards at ``addresses``
            (:class:`LookupBackend`); the context closes it.

    Attributes:
        spec: the parsed ``model.json``.
        embedding_config: the parsed ``embedding.yaml``.
        pipeline: the model's feature pipeline (raw records), or ``None`` (pre-hashed
            records only).
        predictions: samples scored so far.

    Raises:
        NotFoundError: the directory, ``model.json``, ``dense.pt``, ``embedding.yaml`` or the
            pipeline model.json names is missing. CorruptDataError: one of them is malformed.
        ConfigError: bad addresses (or both or neither of ``addresses`` and ``backend``), or
            the shards do not serve a table of the model (or with another ``dim``), or list
            in another order. embeddb errors of the client: the shards cannot be reached.
    """

    def __init__(
        self,
        model_dir: str | os.PathLike[str],
        addresses: Sequence[str] | str | os.PathLike[str] | None = None,
        *,
        token: str | None = None,
        tls_ca: str | os.PathLike[str] | None = None,
        device: str = "cpu",
        threads: int | None = None,
        backend: LookupBackend | None = None,
    ) -> None:
        self.model_dir = Path(model_dir)
        self.on_lookup: Callable[[float], None] | None = None  # seconds of each batch's lookups
        # what each batch of raw records found (missing values filled, unknown keys)
        self.on_records: Callable[[RecordStats], None] | None = None
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
        self.pipeline = load_pipeline_of(self.model_dir, self.spec)
        self._id_index = {name: i for i, name in enumerate(self.spec.id_features)}
        self._lock = threading.Lock()
        self.predictions = 0
        self._closed = False
        if (addresses is None) == (backend is None):
            raise ConfigError("addresses", "give the shards' addresses or a backend (one of them)")
        if backend is not None:
            self._client: LookupBackend = backend
        else:
            assert addresses is not None
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

    @classmethod
    def from_checkpoint(
        cls,
        model_dir: str | os.PathLike[str],
        checkpoint_dir: str | os.PathLike[str],
        *,
        checkpoint_id: str | None = None,
        device: str = "cpu",
        threads: int | None = None,
    ) -> InferCtx:
        """Score with the shards of a job checkpoint opened in this process, read-only
        (:class:`~embeddb.serving.local_shards.LocalShards`): no shard servers.

        Args:
            model_dir: the exported model directory.
            checkpoint_dir: the job's ``checkpoint_dir`` (its shards' data under ``shards/``).
            checkpoint_id: the checkpoint; ``None``: the latest. A checkpoint other than the
                model's ``snapshot_id`` is served with a warning (the dense part was exported
                with other embeddings).
            device: see :class:`InferCtx`. threads: see :class:`InferCtx`.

        Raises:
            The errors of :meth:`LocalShards.open
            <embeddb.serving.local_shards.LocalShards.open>` and of
            :class:`InferCtx`.
        """
        from embeddb.serving.local_shards import LocalShards

        spec = load_model_spec(model_dir)
        shards = LocalShards.open(
            checkpoint_dir, load_embedding_config(model_dir), checkpoint_id=checkpoint_id
        )
        served = shards.checkpoint.snapshot_id
        if spec.snapshot_id is not None and spec.snapshot_id != served:
            logger.warning(
                "the model %s was exported with snapshot %s, the checkpoint served is %s: the "
                "embeddings are not the ones its dense part was trained with",
                model_dir,
                spec.snapshot_id,
                served,
            )
        try:
            return cls(model_dir, device=device, threads=threads, backend=shards)
        except BaseException:
            shards.close()
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
        out = self._score(batch, self.on_lookup)
        with self._lock:
            self.predictions += batch.batch_size
        return out

    def warm_up(self) -> float:
        """Make the first real call as fast as the next ones, before a server accepts calls:
        compile (or load from numba's cache) the client's and the core's numba kernels
        (:func:`~embeddb.serving.warmup.warm_up_kernels`), then score one dummy
        record (id 0 of every ID feature, zeros for every non-ID input), untimed and
        uncounted: the lookup path (the shards' channels connected), pooling, and the
        TorchScript module's first runs (its profiling executor optimises the graph on its
        second call), under :func:`torch.inference_mode`. Evaluation lookups insert nothing.

        Returns:
            Seconds spent.

        Raises:
            embeddb errors of the client: the shards cannot be reached.
        """
        from embeddb.serving.warmup import warm_up_kernels

        started = time.perf_counter()
        warm_up_kernels()
        ids = [
            IDTypeFeature.from_csr(name, np.zeros(1, np.uint64), np.array([0, 1], np.int64))
            for name in self.spec.id_features
        ]
        dense = [
            NonIDTypeFeature(np.zeros((1, *spec.shape), np.float32), name=spec.name)
            for spec in self.spec.non_id
        ]
        dummy = Batch(ids, dense, requires_grad=False)
        for _ in range(3):  # TorchScript specialises the graph over its first calls
            self._score(dummy, None)
        return time.perf_counter() - started

    def _score(self, batch: Batch, on_lookup: Callable[[float], None] | None) -> F32:
        n = batch.batch_size
        features = self._id_features(batch, n)
        non_id = self._non_id_tensors(batch, n)
        plan = plan_lookup(self.embedding_config, self._specs, features)
        requests = {table: ids.unique for table, ids in plan.tables.items()}
        started = time.perf_counter()
        vectors = self._client.lookup_many(requests, train=False) if requests else {}
        if on_lookup is not None:
            on_lookup(time.perf_counter() - started)
        pooled = pool_lookup(plan, dict(vectors))
        embeddings = [torch.from_numpy(np.asarray(p)).to(self.device) for p in pooled]
        with torch.inference_mode():
            logits = self._dense(non_id, embeddings)
            scores = torch.sigmoid(logits.float()).reshape(-1)
        out: F32 = scores.cpu().numpy().astype(np.float32, copy=False)
        if out.shape != (n,):
            raise InvalidArgumentError(
                f"the model returned {tuple(logits.shape)} for {n} samples; expected ({n}, 1)"
            )
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
        """A batch from JSON-shaped records: raw records when the model has a feature
        pipeline (:attr:`pipeline`), pre-hashed records otherwise.

        A raw record holds column values as in the training data (``{"user": "u17",
        "tags": "a|b", "price": 12.5}``); it becomes a batch through the pipeline's
        :meth:`~embeddb.features.pipeline.FeaturePipeline.batch_from_records`, the code
        that built the training batches (the same hashing and transforms). A missing numeric
        value (a missing key, ``null`` or a missing-value marker) is the training mean of its
        column (0 after ``standardize``). A key no column reads is refused, unless the model
        was exported with ``lenient_records`` (then ignored); both are counted
        (:attr:`on_records`). A pre-hashed record is :meth:`batch_from_hashed_records`'s.

        Raises:
            InvalidArgumentError: not a non-empty list of records, or a bad record (an unknown
                key, a value that does not parse, a number that is not finite, a string that
                is not Unicode); the message names the record's index and the column (or
                field).
        """
        if self.pipeline is None:
            return self.batch_from_hashed_records(records)
        from embeddb.features.records import RecordStats

        rows = check_records(records)
        stats = RecordStats()
        try:
            return self.pipeline.batch_from_records(
                rows,  # type: ignore[arg-type]
                lenient=self.spec.lenient_records,
                stats=stats,
            )
        finally:
            if self.on_records is not None:
                self.on_records(stats)

    def batch_from_hashed_records(self, records: object) -> Batch:
        """A batch from pre-hashed records (see :mod:`embeddb.serving.records`).

        Each record is ``{"ids": {feature: id | [id, ...]}, "non_id": {name: number | nested
        list}}``: ids are integers in ``[0, 2**64)`` or the same as decimal strings (JSON-safe
        64-bit ids: ``"12345678901234567890"``); a missing ID feature is an empty sample;
        every non-ID input of ``spec.non_id`` is required, with its per-sample shape (a single
        number for a one-element shape), after the model's transforms.

        Raises:
            InvalidArgumentError: not a non-empty list of records, or a record with an unknown
                key, an unknown ID feature or non-ID input, an id that is not an integer (or a
                decimal string) in range, a missing non-ID input, or one of the wrong shape or
                type; the message names the record's index and the field.
        """
        return hashed_batch(records, self.spec)

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
