"""A TorchServe handler for an exported model: ``torch-model-archiver --handler
embeddb/trainer/serving/torchserve.py --extra-files MODEL_DIR/...`` (or ``--handler
embeddb.trainer.serving.torchserve:EmbeddbHandler`` with embeddb installed).

The model directory is TorchServe's (``context.system_properties["model_dir"]``): the archive
holds ``model.json``, ``dense.pt`` and ``embedding.yaml``. The shards to read come from
``serving.json`` in that directory::

    {"addresses": ["10.0.0.5:7000", "10.0.0.6:7000"], "tls_ca": null}

or, without it, from the environment: ``EMBEDDB_ADDRESSES`` (comma-separated ``host:port`` in
shard order), and ``EMBEDDB_TLS_CA`` (a PEM file). ``EMBEDDB_TOKEN`` is the shards' bearer
token (never in the archive).

Each request's body is JSON: ``{"records": [record, ...]}``, a list of records, or one record:
raw records (column values as in the training data, ``{"user": "u17", "price": 12.5}``) when
the model was exported with its feature pipeline, else pre-hashed ones; or
``{"hashed_records": [record, ...]}``, always pre-hashed records (records as in
:mod:`embeddb.trainer.serving.infer`). TorchServe's batch of requests is scored in one
:meth:`InferCtx.predict`; each request gets the list of its records' scores.

TorchServe's ``ts`` package is optional: when it imports, the handler subclasses its
``BaseHandler``; otherwise it is a plain class with the same interface.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from embeddb.errors import ConfigError, InvalidArgumentError

from ..batch import Batch
from .codec import merge_batches
from .infer import InferCtx

__all__ = ["SERVING_FILE", "EmbeddbHandler"]

SERVING_FILE = "serving.json"

try:  # pragma: no cover - depends on whether TorchServe is installed
    from ts.torch_handler.base_handler import BaseHandler as _Base
except ImportError:  # the plain interface

    class _Base:  # type: ignore[no-redef]
        def __init__(self) -> None:
            self.initialized = False
            self.context: Any = None


class EmbeddbHandler(_Base):  # type: ignore[misc]
    """TorchServe's handler interface over :class:`InferCtx` (see the module docstring)."""

    def __init__(self) -> None:
        super().__init__()
        self.infer: InferCtx | None = None
        self.initialized = False

    def initialize(self, context: Any) -> None:
        """Load the model directory and connect to the shards.

        Raises:
            ConfigError: no shard addresses (neither ``serving.json`` nor
                ``EMBEDDB_ADDRESSES``), or an unreadable ``serving.json``.
            The errors of :class:`InferCtx`.
        """
        self.context = context
        model_dir = Path(context.system_properties["model_dir"])
        addresses, tls_ca = _shards(model_dir, os.environ)
        self.infer = InferCtx(
            model_dir, addresses, token=os.environ.get("EMBEDDB_TOKEN") or None, tls_ca=tls_ca
        )
        self.initialized = True

    def preprocess(self, data: Sequence[Any]) -> tuple[Batch, list[int]]:
        """TorchServe's request list → one batch of every request's records, and the number
        of records of each request.

        Raises:
            InvalidArgumentError: a body that is not JSON, or bad records.
        """
        infer = self._ctx()
        if isinstance(data, (str, bytes, Mapping)) or not isinstance(data, Sequence):
            raise InvalidArgumentError(f"expected a list of requests, got {type(data).__name__}")
        batches: list[Batch] = []
        counts: list[int] = []
        for i, item in enumerate(data):
            hashed, mine = _records(item, i)
            try:
                batch = (
                    infer.batch_from_hashed_records(mine)
                    if hashed
                    else infer.batch_from_records(mine)
                )
            except InvalidArgumentError as exc:
                raise InvalidArgumentError(f"request {i}: {exc}") from exc
            batches.append(batch)
            counts.append(batch.batch_size)
        if not batches:
            raise InvalidArgumentError("no requests to score")
        return merge_batches(batches), counts

    def inference(self, data: tuple[Batch, list[int]], *args: Any, **kwargs: Any) -> Any:
        """Score the batch: ``(scores, counts)``."""
        batch, counts = data
        return self._ctx().predict(batch), counts

    def postprocess(self, data: Any) -> list[list[float]]:
        """One response per request: the list of its records' scores."""
        scores, counts = data
        bounds = np.cumsum([0, *counts])
        return [[float(s) for s in scores[bounds[k] : bounds[k + 1]]] for k in range(len(counts))]

    def handle(self, data: Any, context: Any) -> list[list[float]]:
        """preprocess → inference → postprocess (initializing first if TorchServe did not)."""
        if not self.initialized:
            self.initialize(context)
        return self.postprocess(self.inference(self.preprocess(data)))

    def close(self) -> None:
        if self.infer is not None:
            self.infer.close()
            self.infer = None
            self.initialized = False

    def _ctx(self) -> InferCtx:
        if self.infer is None:
            raise ConfigError("handler", "not initialized: TorchServe calls initialize() first")
        return self.infer


def _shards(model_dir: Path, environ: Mapping[str, str]) -> tuple[list[str], str | None]:
    path = model_dir / SERVING_FILE
    if path.is_file():
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ConfigError(str(path), f"unreadable: {exc}") from exc
        addresses = doc.get("addresses") if isinstance(doc, dict) else None
        if not (isinstance(addresses, list) and addresses):
            raise ConfigError(f"{path}: addresses", "must be a non-empty list of host:port")
        tls_ca = doc.get("tls_ca") or environ.get("EMBEDDB_TLS_CA") or None
        if tls_ca is not None and not Path(tls_ca).is_absolute():
            tls_ca = str(model_dir / tls_ca)
        return [str(a) for a in addresses], tls_ca
    raw = environ.get("EMBEDDB_ADDRESSES", "")
    addresses = [a.strip() for a in raw.split(",") if a.strip()]
    if not addresses:
        raise ConfigError(
            "EMBEDDB_ADDRESSES",
            f"no shard addresses: put {SERVING_FILE} in the model directory or set "
            "EMBEDDB_ADDRESSES=host:port,host:port",
        )
    return addresses, environ.get("EMBEDDB_TLS_CA") or None


def _records(item: object, index: int) -> tuple[bool, list[Any]]:
    """The records of one TorchServe request item, and whether they are pre-hashed."""
    body: object = item
    if isinstance(item, Mapping):
        body = item.get("body", item.get("data"))
        if body is None:
            raise InvalidArgumentError(f"request {index} has no body")
    if isinstance(body, (bytes, bytearray, str)):
        try:
            body = json.loads(body)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise InvalidArgumentError(f"request {index}: the body is not JSON: {exc}") from exc
    if isinstance(body, Mapping) and ("records" in body or "hashed_records" in body):
        if "records" in body and "hashed_records" in body:
            raise InvalidArgumentError(
                f"request {index}: give 'records' or 'hashed_records', not both"
            )
        key = "records" if "records" in body else "hashed_records"
        records = body[key]
        if isinstance(records, (str, bytes, Mapping)) or not isinstance(records, Sequence):
            raise InvalidArgumentError(f"request {index}: {key!r} must be a list")
        return key == "hashed_records", list(records)
    if isinstance(body, Mapping):
        return False, [body]  # one record
    if isinstance(body, list):
        return False, body
    raise InvalidArgumentError(
        f"request {index}: the body must be {{'records': [...]}} or a record, "
        f"got {type(body).__name__}"
    )
