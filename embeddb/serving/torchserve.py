"""A TorchServe handler for an exported model. Build the archive with
``embeddb torchserve-archive MODEL_DIR --out NAME.mar --shard HOST:PORT ...``
(:mod:`embeddb.cli.torchserve`): it packs the model directory, a generated entry file
(``embeddb_handler.py``: ``handle = EmbeddbHandler().handle``, a function entry point, so
TorchServe neither imports this file by path nor takes ``:EmbeddbHandler`` for a function),
``model-config.yaml`` and ``serving.json``. embeddb must be installed in TorchServe's Python.

The model directory is TorchServe's (``context.system_properties["model_dir"]``): the archive
holds ``model.json``, ``dense.pt`` and ``embedding.yaml``. Where the embeddings come from is
``serving.json`` in that directory, either shards::

    {"addresses": ["10.0.0.5:7000", "10.0.0.6:7000"], "tls_ca": null,
     "token_file": "/etc/embeddb/ro.token"}

or a job checkpoint opened read-only in the worker (no shard servers)::

    {"checkpoint_dir": "/data/job/checkpoints", "checkpoint_id": null}

Without ``serving.json`` the shards come from the environment: ``EMBEDDB_ADDRESSES``
(comma-separated ``host:port`` in shard order) and ``EMBEDDB_TLS_CA`` (a PEM file).
``EMBEDDB_TOKEN`` (or ``token_file``, read when the worker starts) is the shards' bearer token;
the token itself is never in the archive. Relative paths in ``serving.json`` are relative to
the model directory.

Each request's body is JSON (measured before it is parsed, as the model server does: see
:mod:`.body`; ``serving.json`` may set ``max_record_bytes`` and ``max_string_bytes``):
``{"records": [record, ...]}``, a list of records, or one record:
raw records (column values as in the training data, ``{"user": "u17", "price": 12.5}``) when
the model was exported with its feature pipeline, else pre-hashed ones; or
``{"hashed_records": [record, ...]}``, always pre-hashed records (records as in
:mod:`embeddb.serving.infer`). TorchServe's batch of requests is scored in one
:meth:`InferCtx.predict`; each request gets the list of its records' scores. A bad request
(not JSON, an unknown feature, a value of the wrong type) raises :class:`BadRequestError`, an
:class:`InvalidArgumentError` that is also TorchServe's ``PredictionException`` with code 400:
TorchServe answers every request of that batch with 400 and the precise message. Raw records
behave as on the model server: a missing numeric value is the training mean, an unknown key
is refused unless the model was exported with ``lenient_records``, a number that is not finite
or a string that is not Unicode is refused naming the record and the column, and a NaN score
is never answered (:func:`~embeddb.serving.codec.finite_scores`).

TorchServe's ``ts`` package is optional: when it imports, the handler subclasses its
``BaseHandler`` (``EmbeddbHandler()`` then ``initialize(context)`` then
``handle(data, context)``, as TorchServe's class entry points are called); otherwise it is a
plain class with the same interface.
"""

from __future__ import annotations

import json
import logging
import os
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from embeddb.common.secrets import read_token_file
from embeddb.errors import ConfigError, InvalidArgumentError, ResourceExhaustedError
from embeddb.features.batch import Batch
from embeddb.serving.body import BodyLimits, check_json, loads
from embeddb.serving.codec import finite_scores, merge_batches
from embeddb.serving.infer import InferCtx

__all__ = ["SERVING_FILE", "BadRequestError", "EmbeddbHandler", "ServingSettings"]

logger = logging.getLogger(__name__)

SERVING_FILE = "serving.json"
BAD_REQUEST = 400
_KEYS = frozenset(("records", "hashed_records"))

try:  # pragma: no cover - depends on whether TorchServe is installed
    with warnings.catch_warnings():  # ts 0.12's __init__ reads version.txt without closing it
        warnings.simplefilter("ignore", ResourceWarning)
        from ts.torch_handler.base_handler import BaseHandler as _Base
        from ts.utils.util import PredictionException as _Prediction
except ImportError:  # the plain interface

    class _Base:  # type: ignore[no-redef]
        def __init__(self) -> None:
            self.initialized = False
            self.context: Any = None

    class _Prediction(Exception):  # type: ignore[no-redef]
        def __init__(self, message: str, error_code: int = 500) -> None:
            super().__init__(message)
            self.message = message
            self.error_code = error_code


class BadRequestError(InvalidArgumentError, _Prediction):  # type: ignore[misc]
    """A bad request: an :class:`InvalidArgumentError` that is also TorchServe's
    ``PredictionException`` with code 400, also for a body over a limit: TorchServe 0.12's
    frontend answers a handler's 413 as 507, so the message, which names the limit, says it)."""

    def __init__(self, message: str, error_code: int = BAD_REQUEST) -> None:
        InvalidArgumentError.__init__(self, message)
        self.message = message
        self.error_code = error_code

    def __str__(self) -> str:
        return self.message


@dataclass(frozen=True)
class ServingSettings:
    """Where a served model reads its embeddings (``serving.json``, see the module docstring).

    Attributes:
        addresses: the shards' ``host:port`` in shard order (empty with ``checkpoint_dir``).
        tls_ca: PEM file of the shards' CA; ``None``: plaintext.
        token_file: file holding the shards' bearer token; ``None``: ``EMBEDDB_TOKEN``.
        checkpoint_dir: a job's ``checkpoint_dir`` opened read-only instead of shards.
        checkpoint_id: the checkpoint of ``checkpoint_dir``; ``None``: the latest.
        limits: the bounds of a request body (``max_record_bytes``, ``max_string_bytes``;
            TorchServe's own ``max_request_size`` bounds the whole body).
    """

    addresses: tuple[str, ...] = ()
    tls_ca: str | None = None
    token_file: str | None = None
    checkpoint_dir: str | None = None
    checkpoint_id: str | None = None
    limits: BodyLimits = field(default_factory=BodyLimits)

    def to_json(self) -> str:
        """The ``serving.json`` text (``None`` and empty fields, default limits left out)."""
        doc: dict[str, Any] = {"addresses": list(self.addresses)} if self.addresses else {}
        for key in ("tls_ca", "token_file", "checkpoint_dir", "checkpoint_id"):
            value = getattr(self, key)
            if value is not None:
                doc[key] = value
        for key in _LIMITS:
            value = getattr(self.limits, key)
            if value != getattr(BodyLimits(), key):
                doc[key] = value
        return json.dumps(doc, indent=2) + "\n"

    @classmethod
    def read(cls, model_dir: Path, environ: Mapping[str, str]) -> ServingSettings:
        """The settings of ``model_dir/serving.json``, else of the environment.

        Raises:
            ConfigError: an unreadable or malformed ``serving.json``; neither shards nor a
                checkpoint.
        """
        path = model_dir / SERVING_FILE
        if not path.is_file():
            raw = environ.get("EMBEDDB_ADDRESSES", "")
            addresses = tuple(a.strip() for a in raw.split(",") if a.strip())
            if not addresses:
                raise ConfigError(
                    "EMBEDDB_ADDRESSES",
                    f"no shard addresses: put {SERVING_FILE} in the model directory or set "
                    "EMBEDDB_ADDRESSES=host:port,host:port",
                )
            return cls(addresses, tls_ca=environ.get("EMBEDDB_TLS_CA") or None)
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ConfigError(str(path), f"unreadable: {exc}") from exc
        if not isinstance(doc, dict):
            raise ConfigError(str(path), "must be a JSON object")
        limits = _limits(doc, path)
        strings = {}
        for key in ("tls_ca", "token_file", "checkpoint_dir", "checkpoint_id"):
            value = doc.get(key)
            if value is not None and not isinstance(value, str):
                raise ConfigError(f"{path}: {key}", f"must be a string, got {value!r}")
            strings[key] = value or None
        checkpoint_dir = strings["checkpoint_dir"]
        listed = doc.get("addresses")
        if checkpoint_dir is not None:
            if listed:
                raise ConfigError(
                    f"{path}: addresses", "give addresses or checkpoint_dir, not both"
                )
            return cls(
                checkpoint_dir=_under(model_dir, checkpoint_dir),
                checkpoint_id=strings["checkpoint_id"],
                limits=limits,
            )
        if not (isinstance(listed, list) and listed):
            raise ConfigError(f"{path}: addresses", "must be a non-empty list of host:port")
        tls_ca = strings["tls_ca"] or environ.get("EMBEDDB_TLS_CA") or None
        token_file = strings["token_file"]
        return cls(
            tuple(str(a) for a in listed),
            tls_ca=None if tls_ca is None else _under(model_dir, tls_ca),
            token_file=None if token_file is None else _under(model_dir, token_file),
            limits=limits,
        )

    def open(self, model_dir: Path, environ: Mapping[str, str]) -> InferCtx:
        """The :class:`InferCtx` of ``model_dir`` over these settings.

        Raises:
            ConfigError: an unreadable token file. The errors of :class:`InferCtx`.
        """
        if self.checkpoint_dir is not None:
            return InferCtx.from_checkpoint(
                model_dir, self.checkpoint_dir, checkpoint_id=self.checkpoint_id
            )
        token = environ.get("EMBEDDB_TOKEN") or None
        if self.token_file is not None:
            token = read_token_file(Path(self.token_file))
        return InferCtx(model_dir, list(self.addresses), token=token, tls_ca=self.tls_ca)


class EmbeddbHandler(_Base):  # type: ignore[misc]
    """TorchServe's handler interface over :class:`InferCtx` (see the module docstring)."""

    def __init__(self) -> None:
        super().__init__()
        self.infer: InferCtx | None = None
        self.limits = BodyLimits()
        self.initialized = False

    def initialize(self, context: Any) -> None:
        """Load the model directory and connect to the shards (or open the checkpoint).

        Raises:
            ConfigError: no shard addresses (neither ``serving.json`` nor
                ``EMBEDDB_ADDRESSES``), or an unreadable ``serving.json`` or token file.
            The errors of :class:`InferCtx`.
        """
        self.context = context
        model_dir = Path(context.system_properties["model_dir"])
        settings = ServingSettings.read(model_dir, os.environ)
        self.limits = settings.limits
        self.infer = settings.open(model_dir, os.environ)
        self.initialized = True
        logger.info("embeddb model %s ready: %r", model_dir, self.infer)

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
            hashed, mine = _records(item, i, self.limits)
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
        out: list[list[float]] = []
        for k in range(len(counts)):
            try:
                mine = finite_scores(scores[bounds[k] : bounds[k + 1]])
            except InvalidArgumentError as exc:
                raise InvalidArgumentError(f"request {k}: {exc}") from exc
            out.append([float(s) for s in mine])
        return out

    def handle(self, data: Any, context: Any) -> list[list[float]] | None:
        """preprocess → inference → postprocess (initializing first if TorchServe did not).

        ``data=None`` only initializes: TorchServe calls a function entry point (the archive's
        ``handle = EmbeddbHandler().handle``) that way once when the worker starts.

        Raises:
            BadRequestError: a bad request (an :class:`InvalidArgumentError` and TorchServe's
                ``PredictionException`` with code 400, over a limit too).
        """
        if not self.initialized:
            self.initialize(context)
        if data is None:
            return None
        try:
            return self.postprocess(self.inference(self.preprocess(data)))
        except (InvalidArgumentError, ResourceExhaustedError) as exc:
            raise BadRequestError(str(exc)) from exc

    def close(self) -> None:
        """Close the shards' client (or the checkpoint)."""
        if self.infer is not None:
            self.infer.close()
            self.infer = None
            self.initialized = False

    def _ctx(self) -> InferCtx:
        if self.infer is None:
            raise ConfigError("handler", "not initialized: TorchServe calls initialize() first")
        return self.infer


def _under(model_dir: Path, path: str) -> str:
    """``path``, relative ones taken relative to the model directory."""
    return path if Path(path).is_absolute() else str(model_dir / path)


def _limits(doc: Mapping[str, Any], path: Path) -> BodyLimits:
    """The body limits ``serving.json`` sets (the defaults for those it leaves out)."""
    given = {key: doc[key] for key in _LIMITS if key in doc}
    try:
        return BodyLimits(**given)
    except ConfigError as exc:
        raise ConfigError(str(path), str(exc)) from None


_LIMITS = ("max_record_bytes", "max_string_bytes")


def _measured(raw: bytes, index: int, limits: BodyLimits, parsed: object = None) -> object:
    """The document of ``raw``, checked against ``limits`` before it is parsed (``parsed``:
    the document TorchServe already parsed from it, returned as it is)."""
    # records open at depth 2 in [{...}], 3 in {"records": [{...}]}; a body that is one
    # record ({"user": ...}: no container at depth 3) is one record's size, checked below
    level = 2 if raw.lstrip(b" \t\r\n\xef\xbb\xbf")[:1] == b"[" else 3
    try:
        scan = check_json(raw, limits, level)
        body = loads(raw) if parsed is None else parsed
        if scan is not None and isinstance(body, Mapping) and not _KEYS & body.keys():
            scan.check_records(limits, 1)
    except InvalidArgumentError as exc:
        raise InvalidArgumentError(f"request {index}: {exc}") from exc
    except ResourceExhaustedError as exc:
        raise ResourceExhaustedError(f"request {index}: {exc}") from exc
    return body


def _records(item: object, index: int, limits: BodyLimits) -> tuple[bool, list[Any]]:
    """The records of one TorchServe request item, and whether they are pre-hashed (a body
    still in bytes is measured against ``limits`` before it is parsed)."""
    body: object = item
    if isinstance(item, Mapping):
        body = item.get("body", item.get("data"))
        if body is None:
            raise InvalidArgumentError(f"request {index} has no body")
    if isinstance(body, (bytes, bytearray, str)):
        raw = body.encode("utf-8", "surrogatepass") if isinstance(body, str) else bytes(body)
        body = _measured(raw, index, limits)
    elif isinstance(body, (Mapping, list)):
        # TorchServe parses an application/json body itself (its max_request_size bounded
        # the body): the same limits apply to the same document, written out again
        text = json.dumps(body, ensure_ascii=False).encode("utf-8", "surrogatepass")
        _measured(text, index, limits, body)
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
