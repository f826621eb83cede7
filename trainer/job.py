"""The training job's YAML file (``embeddb train CONFIG``): what to train, where, and how.

Schema (every key optional except ``model``; relative paths are relative to the YAML file)::

    dataset: adult                 # adult: UCI Adult (the packaged copy unless data_dir is set)
    data_dir: null                 # a directory holding adult.data / adult.test (gzip or plain)
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
    workers: 1                     # NN worker processes on this machine (--nproc_per_node)
    max_restarts: 3                # restarts of all NN workers after one dies (torchrun's)
    checkpoint_dir: null           # checkpoints here (and the local shards' data in /shards)
    checkpoint_every: 0            # steps between checkpoints; 0: at the end of every epoch
    metrics_file: null             # a JSON line of the final metrics is appended here

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

__all__ = ["DATASETS", "JobConfig"]

DATASETS = ("adult",)
_OPTIMIZERS = ("adam", "adagrad", "sgd")
_MODES = ("hybrid", "sync", "async")


@dataclass(frozen=True)
class JobConfig:
    """A training job (see the module docstring for each key). Paths are absolute."""

    model: str
    dataset: str = "adult"
    data_dir: Path | None = None
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
    workers: int = 1
    max_restarts: int = 3
    checkpoint_dir: Path | None = None
    checkpoint_every: int = 0
    metrics_file: Path | None = None
    base_dir: Path = Path(".")

    def __post_init__(self) -> None:
        if self.dataset not in DATASETS:
            raise ConfigError("dataset", f"must be one of {', '.join(DATASETS)}: {self.dataset!r}")
        if self.mode not in _MODES:
            raise ConfigError("mode", f"must be one of {', '.join(_MODES)}, got {self.mode!r}")
        if not isinstance(self.model, str) or ":" not in self.model:
            raise ConfigError("model", f"must be FILE.py:NAME or module:NAME, got {self.model!r}")
        for name in ("max_staleness", "epochs", "batch_size", "eval_batch_size", "threads"):
            _positive(name, getattr(self, name))
        for name in ("shards", "workers", "max_restarts"):
            _positive(name, getattr(self, name), minimum=0 if name == "max_restarts" else 1)
        _positive("checkpoint_every", self.checkpoint_every, minimum=0)
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
        for key in ("data_dir", "checkpoint_dir", "metrics_file"):
            if values.get(key) is not None:
                values[key] = (base / str(values[key])).resolve()
        if values.get("addresses") is not None:
            if not isinstance(values["addresses"], list):
                raise ConfigError("addresses", "must be a list of host:port")
            values["addresses"] = tuple(values["addresses"])
        return cls(**values, base_dir=base)

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
