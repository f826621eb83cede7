"""The training job's YAML file (``embeddb train CONFIG``): what to train, where, and how.

Schema (every key optional except ``model``; relative paths are relative to the YAML file)::

    dataset: adult                 # adult | criteo | movielens (see "Datasets" below)
    data_dir: null                 # where the dataset's files are (adult: the packaged copy)
    split: null                    # movielens: u1 .. u5, ua, ub (default u1)
    train_rows: null               # criteo: rows 0 .. train_rows-1 train, the rest test
    skip_missing_data: false       # true: a job whose data is absent prints why and exits 0
    model: model.py:AdultModel     # FILE.py:NAME or package.module:NAME; called with model_args,
    model_args: {}                 #   forward(non_id_tensors, embedding_tensors) -> logits (B, 1)
    embedding_config: preset:adult # preset:NAME (embeddb/presets/NAME.yaml) or a YAML path
    mode: hybrid                   # hybrid | sync | async
    max_staleness: 4
    epochs: 3
    batch_size: 256                # per NN worker
    eval_batch_size: 4096
    optimizer: {type: adam, lr: 0.003}   # the dense optimizer: adam | adagrad | sgd + its kwargs
    seed: 0
    threads: 1                     # torch threads per NN worker
    shards: 1                      # local shard processes started by the launcher ...
    addresses: null                # ... or the shards' host:port list (then none is started)
    token_file: null               # private file with the rw bearer token the job's clients send
    workers: 1                     # NN worker processes on this machine (--nproc_per_node)
    max_restarts: 3                # restarts of all NN workers after one dies (torchrun's)
    checkpoint_dir: null           # checkpoints here (and the local shards' data in /shards)
    checkpoint_every: 0            # steps between checkpoints; 0: at the end of every epoch
    export_dir: null               # after training rank 0 exports the model here (replaced)
    metrics_file: null             # a JSON line of the final metrics is appended here
    metrics_port: null             # embedding worker of local rank r: Prometheus on port+r

Datasets (train / test splits; each file plain or ``.gz``):

* ``adult``: ``adult.data`` / ``adult.test`` in ``data_dir``, default the copy shipped in the
  package (:class:`~embeddb.trainer.data.AdultReader`).
* ``criteo``: the first of ``train.txt``, ``sample.train.txt``, ``sample.train`` in
  ``data_dir`` (Criteo's labelled TSV; :class:`~embeddb.trainer.data.CriteoReader`). The logs
  are in time order, so the first ``train_rows`` rows train and the later ones test.
* ``movielens``: the ``ml-100k`` folder; ratings ``{split}.base`` train and ``{split}.test``
  test (:class:`~embeddb.trainer.data.MovieLensReader`; rating >= 4 is a positive).

Tokens: shards that require bearer tokens (``embeddb serve --tokens-file``) need
``token_file``, a file private to its owner (``chmod 600``; anything group- or world-readable is
refused) holding a read-write token, alone on its first line or as ``rw TOKEN``. It is checked
when the job is loaded, and every client of the job sends it: the embedding workers' lookups
and gradient pushes, the checkpoints' snapshot calls and the ``--predict`` lookups. Local shards
(no ``addresses``) then require that token too.

Criteo and MovieLens may not be redistributed, so no copy ships with embeddb: their examples
read ``../shared/data`` of a development checkout, and set ``skip_missing_data`` so that a
machine without it says so and skips rather than fails.

Validated once, here (:meth:`JobConfig.from_yaml`), with :class:`~embeddb.errors.ConfigError`
naming the key. numpy and PyYAML only: the launcher imports it without torch.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from embeddb.errors import ConfigError
from embeddb.secrets import read_token_file

from .data import AdultReader, CriteoReader, MovieLensReader, Reader, RowRange

__all__ = ["DATASETS", "JobConfig"]

DATASETS = ("adult", "criteo", "movielens")
_CRITEO_FILES = ("train.txt", "sample.train.txt", "sample.train")
_MOVIELENS_SPLITS = ("u1", "u2", "u3", "u4", "u5", "ua", "ub")
_MOVIELENS_TABLES = ("u.user", "u.item", "u.genre")
_OPTIMIZERS = ("adam", "adagrad", "sgd")
_MODES = ("hybrid", "sync", "async")


@dataclass(frozen=True)
class JobConfig:
    """A training job (see the module docstring for each key). Paths are absolute."""

    model: str
    dataset: str = "adult"
    data_dir: Path | None = None
    split: str | None = None
    train_rows: int | None = None
    skip_missing_data: bool = False
    model_args: dict[str, Any] = field(default_factory=dict)
    embedding_config: str = "preset:adult"
    mode: str = "hybrid"
    max_staleness: int = 4
    epochs: int = 3
    batch_size: int = 256
    eval_batch_size: int = 4096
    optimizer: dict[str, Any] = field(default_factory=lambda: {"type": "adam", "lr": 0.003})
    seed: int = 0
    threads: int = 1
    shards: int = 1
    addresses: tuple[str, ...] | None = None
    token_file: Path | None = None
    workers: int = 1
    max_restarts: int = 3
    checkpoint_dir: Path | None = None
    checkpoint_every: int = 0
    export_dir: Path | None = None
    metrics_file: Path | None = None
    metrics_port: int | None = None
    base_dir: Path = Path(".")

    def __post_init__(self) -> None:
        if self.dataset not in DATASETS:
            raise ConfigError("dataset", f"must be one of {', '.join(DATASETS)}: {self.dataset!r}")
        self._check_dataset()
        if self.mode not in _MODES:
            raise ConfigError("mode", f"must be one of {', '.join(_MODES)}, got {self.mode!r}")
        if not isinstance(self.model, str) or ":" not in self.model:
            raise ConfigError("model", f"must be FILE.py:NAME or module:NAME, got {self.model!r}")
        for name in ("max_staleness", "epochs", "batch_size", "eval_batch_size", "threads"):
            _positive(name, getattr(self, name))
        for name in ("shards", "workers", "max_restarts"):
            _positive(name, getattr(self, name), minimum=0 if name == "max_restarts" else 1)
        _positive("checkpoint_every", self.checkpoint_every, minimum=0)
        if self.metrics_port is not None:
            _positive("metrics_port", self.metrics_port)
            if self.metrics_port + self.workers > 65536:
                raise ConfigError(
                    "metrics_port", f"{self.metrics_port} + {self.workers} workers exceeds 65535"
                )
        if not isinstance(self.optimizer, dict) or self.optimizer.get("type") not in _OPTIMIZERS:
            raise ConfigError(
                "optimizer", f"needs a type in {', '.join(_OPTIMIZERS)}, got {self.optimizer!r}"
            )
        if not isinstance(self.model_args, dict):
            raise ConfigError("model_args", f"must be a mapping, got {self.model_args!r}")
        if self.addresses is not None and (
            not self.addresses or not all(isinstance(a, str) for a in self.addresses)
        ):
            raise ConfigError("addresses", f"must be a list of host:port, got {self.addresses!r}")
        if self.token_file is not None:
            self.read_token()  # unreadable, not private or holding no token: refused now

    @classmethod
    def from_yaml(cls, path: str | os.PathLike[str]) -> JobConfig:
        """Read and validate a job file.

        Raises:
            ConfigError: a missing or unreadable file, an unknown key, a bad value.
        """
        source = Path(path).resolve()
        if not source.is_file():
            raise ConfigError(str(path), "no such training job file")
        try:
            raw = yaml.safe_load(source.read_text()) or {}
        except yaml.YAMLError as exc:
            raise ConfigError(str(path), f"is not valid YAML: {exc}") from exc
        if not isinstance(raw, dict):
            raise ConfigError(str(path), "must be a mapping of settings")
        known = {f.name for f in fields(cls)} - {"base_dir"}
        unknown = sorted(set(raw) - known)
        if unknown:
            raise ConfigError(
                unknown[0], f"is not a training job setting ({', '.join(sorted(known))})"
            )
        if "model" not in raw:
            raise ConfigError("model", "is required (FILE.py:NAME or module:NAME)")
        base = source.parent
        values = dict(raw)
        for key in ("data_dir", "checkpoint_dir", "export_dir", "metrics_file", "token_file"):
            if values.get(key) is not None:
                values[key] = (base / str(values[key])).resolve()
        if values.get("addresses") is not None:
            if not isinstance(values["addresses"], list):
                raise ConfigError("addresses", "must be a list of host:port")
            values["addresses"] = tuple(values["addresses"])
        return cls(**values, base_dir=base)

    def read_token(self) -> str | None:
        """The bearer token in ``token_file`` (read now, never kept in the job), or ``None``
        without one. Read by the composition roots (the launcher, each NN worker's entry point).

        Raises:
            ConfigError: naming ``token_file``: the file is missing or unreadable, group or
                others may access it, or its first line holds no token (never shown).
        """
        if self.token_file is None:
            return None
        try:
            return read_token_file(Path(self.token_file))
        except ConfigError as exc:
            raise ConfigError("token_file", str(exc)) from exc

    def _check_dataset(self) -> None:
        if self.dataset in ("criteo", "movielens") and self.data_dir is None:
            raise ConfigError(
                "data_dir", f"is required for {self.dataset} (no copy ships with embeddb)"
            )
        if self.dataset == "movielens":
            if self.split is not None and self.split not in _MOVIELENS_SPLITS:
                raise ConfigError(
                    "split", f"must be one of {', '.join(_MOVIELENS_SPLITS)}, got {self.split!r}"
                )
        elif self.split is not None:
            raise ConfigError("split", f"applies to movielens only, not {self.dataset}")
        if self.dataset == "criteo":
            if self.train_rows is None:
                raise ConfigError("train_rows", "is required for criteo (the rest is the test)")
            _positive("train_rows", self.train_rows)
        elif self.train_rows is not None:
            raise ConfigError("train_rows", f"applies to criteo only, not {self.dataset}")
        if not isinstance(self.skip_missing_data, bool):
            raise ConfigError(
                "skip_missing_data", f"must be true or false, got {self.skip_missing_data!r}"
            )

    def data_files(self) -> list[Path]:
        """The files the job reads (each may also be the ``.gz`` of the name given)."""
        if self.dataset == "adult":
            return [] if self.data_dir is None else [self.data_dir / "adult.data"]
        assert self.data_dir is not None
        if self.dataset == "criteo":
            return [self._criteo_file()]
        split = self.split or "u1"
        names = (f"{split}.base", f"{split}.test", *_MOVIELENS_TABLES)
        return [self.data_dir / name for name in names]

    def missing_data(self) -> str | None:
        """Why the job's data cannot be read (a missing directory or file), else ``None``."""
        if self.data_dir is not None and not self.data_dir.is_dir():
            return f"{self.dataset} data directory {self.data_dir} does not exist"
        for path in self.data_files():
            if not path.is_file() and not path.with_name(path.name + ".gz").is_file():
                return f"{path} (or {path.name}.gz) does not exist"
        return None

    def _criteo_file(self) -> Path:
        assert self.data_dir is not None
        for name in _CRITEO_FILES:
            path = self.data_dir / name
            if path.is_file() or path.with_name(name + ".gz").is_file():
                return path
        return self.data_dir / _CRITEO_FILES[0]

    def reader(self, split: str, batch_size: int, *, train: bool) -> Reader:
        """A reader of the ``"train"`` or ``"test"`` split in batches of ``batch_size``
        (``train``: training batches, which need labels)."""
        if self.dataset == "adult":
            return AdultReader(batch_size, split, self.data_dir, requires_grad=train)
        assert self.data_dir is not None
        if self.dataset == "criteo":
            path = self._criteo_file()
            path = path if path.is_file() else path.with_name(path.name + ".gz")
            rows = CriteoReader(path, batch_size, requires_grad=train)
            assert self.train_rows is not None
            if split == "train":
                return RowRange(rows, 0, self.train_rows)
            return RowRange(rows, self.train_rows)
        name = f"{self.split or 'u1'}.{'base' if split == 'train' else 'test'}"
        return MovieLensReader(self.data_dir, batch_size, name, requires_grad=train)

    def embedding_config_path(self) -> Path:
        """The embedding config's YAML file (a packaged preset or a path).

        Raises:
            ConfigError: no such preset or file.
        """
        if self.embedding_config.startswith("preset:"):
            name = self.embedding_config.split(":", 1)[1]
            path = Path(str(resources.files("embeddb.presets").joinpath(f"{name}.yaml")))
        else:
            path = (self.base_dir / self.embedding_config).resolve()
        if not path.is_file():
            raise ConfigError("embedding_config", f"no such preset or file: {path}")
        return path

    def shard_data_dir(self) -> Path | None:
        """Where local shards keep their rows: under the checkpoint directory (snapshots need
        one), else nowhere (ephemeral shards)."""
        return None if self.checkpoint_dir is None else self.checkpoint_dir / "shards"


def _positive(name: str, value: object, minimum: int = 1) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ConfigError(name, f"must be an integer >= {minimum}, got {value!r}")
