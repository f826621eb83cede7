"""The training job's YAML file (``embeddb train CONFIG``): what to train, where, and how.

Schema (every key optional except ``model``; relative paths are relative to the YAML file)::

    dataset:                       # a generic dataset (the keys: embeddb.features.dataset) ...
      format: csv                  #   csv | tsv | parquet | libsvm
      train: data/train*.csv       #   a path or glob, plain or .gz
      test: data/test.csv          #   or split: {fraction: 0.2} | {order_by: COLUMN, fraction: 0.2}
      label: {column: clicked}
      ids: [user, item, {column: tags, separator: "|"}]
      numeric: [{column: price, transform: log1p}, age]
                                   # ... or a preset: adult | criteo | movielens (below)
    data_dir: null                 # preset given by name: where the dataset's files are
    split: null                    # movielens: u1 .. u5, ua, ub (default u1)
    train_rows: null               # criteo: rows 0 .. train_rows-1 train, the rest test
    skip_missing_data: false       # true: a job whose data is absent prints why and exits 0
    model: builtin:deepfm          # builtin:dnn | fm | deepfm | dlrm, FILE.py:NAME or
    model_args: {}                 #   package.module:NAME; called with model_args,
                                   #   forward(non_id_tensors, embedding_tensors) -> logits (B, 1)
    embedding_config: auto         # auto: one table per ID feature (dim embedding_dim);
                                   #   preset:NAME (embeddb/presets/NAME.yaml) or a YAML path
                                   #   (default: preset:adult for dataset adult, else auto)
    embedding_dim: 16              # the auto tables' dim
    ram_budget: 1GiB               # auto: RAM bytes per shard, its tables sized from the data
    in_memory: false               # true: each rank reads its part into memory first (baseline)
    mode: hybrid                   # hybrid | sync | async
    max_staleness: 4
    embedding_stage: process       # process | thread: the embedding stage in its own process or
                                   #   in a thread of the NN worker (no pickling; docs/training.md)
    epochs: 3
    batch_size: 256                # per NN worker
    eval_batch_size: 4096
    optimizer: {type: adam, lr: 0.003}   # the dense optimizer: adam | adagrad | sgd + its kwargs
    seed: 0                        # also the shuffle seed (with the epoch and rank)
    threads: null                  # torch threads per NN worker; null: the machine's core budget
    shards: 1                      # local shard processes started by the launcher ...
    addresses: null                # ... or the shards' host:port list (then none is started)
    token_file: null               # private file with the rw bearer token the job's clients send
    workers: 1                     # NN worker processes on this machine (--nproc_per_node)
    max_restarts: 3                # restarts of every NN worker after a crash (not an error)
    checkpoint_dir: null           # checkpoints here (and the local shards' data in /shards)
    checkpoint_every: 0            # steps between checkpoints; 0: at the end of every epoch
    export_dir: null               # after training rank 0 exports the model here (replaced)
    lenient_records: false         # the exported model ignores unknown keys of raw records
    metrics_file: null             # a JSON line of the final metrics is appended here
    metrics_port: null             # embedding worker of local rank r: Prometheus on port+r
    simulated_network: null        # {rtt_ms: 20, bandwidth_gbit: 10}: shard calls wait rtt+bytes/bw

Errors name the key and its line in the job file (``epochs: must be an integer >= 1, got 0
(job.yaml:7)``; :mod:`embeddb.trainer.launcher.job_yaml`).

Preset datasets (``dataset: NAME``, or ``dataset: {preset: NAME, data_dir: ...}``; presets of
:class:`~embeddb.features.dataset.DatasetSpec`, like generic ones; files plain or ``.gz``):

* ``adult``: ``adult.data`` / ``adult.test`` in ``data_dir``, default the copy shipped in the
  package (:class:`~embeddb.features.AdultReader`).
* ``criteo``: the first of ``train.txt``, ``sample.train.txt``, ``sample.train`` in
  ``data_dir`` (Criteo's labelled TSV; :class:`~embeddb.features.CriteoReader`). The logs
  are in time order, so the first ``train_rows`` rows train and the later ones test.
* ``movielens``: the ``ml-100k`` folder; ratings ``{split}.base`` train and ``{split}.test``
  test (:class:`~embeddb.features.MovieLensReader`; rating >= 4 is a positive).

Tokens: shards that require bearer tokens (``embeddb serve --tokens-file``) need
``token_file``, a file private to its owner (``chmod 600``; anything group- or world-readable is
refused) holding a read-write token, alone on its first line or as ``rw TOKEN``. It is checked
when the job is loaded, and every client of the job sends it: the embedding workers' lookups
and gradient pushes, the checkpoints' snapshot calls and the ``--predict`` lookups. Local shards
(no ``addresses``) then require that token too.

Simulated network (``simulated_network``, off by default): the embedding workers' clients delay
every call to one shard by ``rtt_ms`` plus its request and response bytes over
``bandwidth_gbit`` (default 10), as :class:`embeddb.client.SimulatedNetwork` describes: a way
to see what a slower network between the NN side and the shards costs, on one machine.

Criteo and MovieLens may not be redistributed, so no copy ships with embeddb: their examples
read ``../shared/data`` of a development checkout, and set ``skip_missing_data`` so that a
machine without it says so and skips rather than fails.

Validated once, here (:meth:`JobConfig.from_yaml`), with :class:`~embeddb.errors.ConfigError`
naming the key. numpy and PyYAML only: the launcher imports it without torch.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from embeddb.common.secrets import read_token_file
from embeddb.errors import ConfigError
from embeddb.features.dataset import DatasetSpec
from embeddb.trainer.launcher.job_yaml import Where, load_with_lines, with_line

if TYPE_CHECKING:
    from embeddb.client.options import SimulatedNetwork

__all__ = [
    "AUTO",
    "BUILTIN_PREFIX",
    "CONFIG_ERROR",
    "DATASETS",
    "EMBEDDING_FILE",
    "EXIT_CONFIG_ERROR",
    "JobConfig",
]

DATASETS = ("adult", "criteo", "movielens")
AUTO = "auto"
BUILTIN_PREFIX = "builtin:"
EMBEDDING_FILE = "embedding.yaml"  # the auto embedding config, in the run directory
# The validation step (embeddb.trainer.launcher.validate, torch) tells the launcher (no torch) of a
# bad
# job with this exit code and one stderr line starting with CONFIG_ERROR.
CONFIG_ERROR = "embeddb: CONFIG ERROR: "
EXIT_CONFIG_ERROR = 2
_PRESET_KEYS = ("data_dir", "split", "train_rows")
_CRITEO_FILES = ("train.txt", "sample.train.txt", "sample.train")
_MOVIELENS_SPLITS = ("u1", "u2", "u3", "u4", "u5", "ua", "ub")
_MOVIELENS_TABLES = ("u.user", "u.item", "u.genre")
_OPTIMIZERS = ("adam", "adagrad", "sgd")
_MODES = ("hybrid", "sync", "async")


def _no_line(key_path: str) -> str:
    return ""


@dataclass(frozen=True)
class JobConfig:
    """A training job (see the module docstring for each key). Paths are absolute.

    ``dataset_spec`` is the :class:`DatasetSpec` built from ``dataset`` (and, for a preset
    given by name, ``data_dir``/``split``/``train_rows``); ``where`` maps a key path to its
    place in the job file (``"job.yaml:14"``) for error messages.
    """

    model: str
    dataset: str | dict[str, Any] = "adult"
    data_dir: Path | None = None
    split: str | None = None
    train_rows: int | None = None
    skip_missing_data: bool = False
    model_args: dict[str, Any] = field(default_factory=dict)
    embedding_config: str | None = None
    embedding_dim: int = 16
    ram_budget: int | str | None = None
    in_memory: bool = False
    mode: str = "hybrid"
    max_staleness: int = 4
    embedding_stage: str = "process"
    epochs: int = 3
    batch_size: int = 256
    eval_batch_size: int = 4096
    optimizer: dict[str, Any] = field(default_factory=lambda: {"type": "adam", "lr": 0.003})
    seed: int = 0
    threads: int | None = None
    shards: int = 1
    addresses: tuple[str, ...] | None = None
    token_file: Path | None = None
    workers: int = 1
    max_restarts: int = 3
    checkpoint_dir: Path | None = None
    checkpoint_every: int = 0
    export_dir: Path | None = None
    lenient_records: bool = False
    metrics_file: Path | None = None
    metrics_port: int | None = None
    simulated_network: dict[str, Any] | None = None
    base_dir: Path = Path(".")
    where: Callable[[str], str] = field(default=_no_line, repr=False, compare=False)
    dataset_spec: DatasetSpec = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self._check_dataset()
        if self.embedding_config is None:
            default = "preset:adult" if self.dataset == "adult" else AUTO
            object.__setattr__(self, "embedding_config", default)
        if not isinstance(self.embedding_config, str) or not self.embedding_config:
            raise ConfigError(
                "embedding_config",
                f"must be auto, preset:NAME or a path: {self.embedding_config!r}",
            )
        _positive("embedding_dim", self.embedding_dim)
        self._check_ram_budget()
        for flag in ("in_memory", "lenient_records"):
            if not isinstance(getattr(self, flag), bool):
                raise ConfigError(flag, f"must be true or false, got {getattr(self, flag)!r}")
        if self.mode not in _MODES:
            raise ConfigError("mode", f"must be one of {', '.join(_MODES)}, got {self.mode!r}")
        self._check_model()
        from embeddb.trainer.config import EMBEDDING_STAGES  # not at import: the CLI's start

        if self.embedding_stage not in EMBEDDING_STAGES:
            raise ConfigError(
                "embedding_stage",
                f"must be one of {', '.join(EMBEDDING_STAGES)}, got {self.embedding_stage!r}",
            )
        for name in ("max_staleness", "epochs", "batch_size", "eval_batch_size"):
            _positive(name, getattr(self, name))
        if self.threads is not None:
            _positive("threads", self.threads)
        for name in ("shards", "workers", "max_restarts"):
            _positive(name, getattr(self, name), minimum=0 if name == "max_restarts" else 1)
        _positive("checkpoint_every", self.checkpoint_every, minimum=0)
        _positive("seed", self.seed, minimum=0)
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
        if self.addresses is not None and (
            not self.addresses or not all(isinstance(a, str) for a in self.addresses)
        ):
            raise ConfigError("addresses", f"must be a list of host:port, got {self.addresses!r}")
        if self.token_file is not None:
            self.read_token()  # unreadable, not private or holding no token: refused now
        self.network()  # a bad simulated_network is refused now
        object.__setattr__(self, "dataset_spec", self._build_dataset_spec())

    @classmethod
    def from_yaml(cls, path: str | os.PathLike[str]) -> JobConfig:
        """Read and validate a job file (every key; the data and the model are checked by the
        validation step, :mod:`embeddb.trainer.launcher.validate`).

        Raises:
            ConfigError: a missing or unreadable file, an unknown key, a bad value; the
                message names the key and its line (``(job.yaml:14)``).
        """
        source = Path(path).resolve()
        if not source.is_file():
            raise ConfigError(str(path), "no such training job file")
        relative = os.path.relpath(source)
        shown = relative if not relative.startswith("..") else str(source)
        raw, where = load_with_lines(source, shown)
        raw = {} if raw is None else raw
        if not isinstance(raw, dict):
            raise ConfigError(shown, "must be a mapping of settings")
        try:
            return cls._from_mapping(raw, source.parent, where)
        except ConfigError as exc:
            raise with_line(exc, where) from exc.__cause__

    @classmethod
    def _from_mapping(cls, raw: dict[str, Any], base: Path, where: Where) -> JobConfig:
        known = {f.name for f in fields(cls) if f.init} - {"base_dir", "where"}
        unknown = sorted(set(raw) - known, key=str)
        if unknown:
            raise ConfigError(
                str(unknown[0]), f"is not a training job setting ({', '.join(sorted(known))})"
            )
        if "model" not in raw:
            raise ConfigError("model", "is required (builtin:NAME, FILE.py:NAME or module:NAME)")
        values = dict(raw)
        for key in ("data_dir", "checkpoint_dir", "export_dir", "metrics_file", "token_file"):
            if values.get(key) is not None:
                values[key] = (base / str(values[key])).resolve()
        if values.get("addresses") is not None:
            if not isinstance(values["addresses"], list):
                raise ConfigError("addresses", "must be a list of host:port")
            values["addresses"] = tuple(values["addresses"])
        if values.get("model_args") is None:
            values["model_args"] = {}
        return cls(**values, base_dir=base, where=where)

    @property
    def preset(self) -> str | None:
        """The preset's name (``dataset: criteo`` or ``{preset: criteo, ...}``), else None."""
        if isinstance(self.dataset, str):
            return self.dataset
        name = self.dataset.get("preset")
        return name if isinstance(name, str) else None

    @property
    def dataset_name(self) -> str:
        """The preset's name, or ``"custom"`` (metrics, messages)."""
        return self.preset or "custom"

    @property
    def builtin_model(self) -> str | None:
        """``NAME`` of ``model: builtin:NAME``, else None."""
        if self.model.startswith(BUILTIN_PREFIX):
            return self.model[len(BUILTIN_PREFIX) :]
        return None

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

    def network(self) -> SimulatedNetwork | None:
        """The embedding workers' simulated network (``simulated_network``), or ``None``.

        Raises:
            ConfigError: naming ``simulated_network.rtt_ms`` (or the bad key): not a mapping,
                an unknown or missing key, a negative RTT or a non-positive bandwidth.
        """
        if self.simulated_network is None:
            return None
        # Imported here: the client (grpc) is loaded only by jobs that simulate a network.
        from embeddb.client.options import SimulatedNetwork

        return SimulatedNetwork.from_mapping(self.simulated_network, "simulated_network")

    def _check_model(self) -> None:
        if not isinstance(self.model, str) or ":" not in self.model:
            raise ConfigError(
                "model", f"must be builtin:NAME, FILE.py:NAME or module:NAME, got {self.model!r}"
            )
        if not isinstance(self.model_args, dict):
            raise ConfigError("model_args", f"must be a mapping, got {self.model_args!r}")
        builtin = self.builtin_model
        if builtin is not None:
            from embeddb.trainer.config import BUILTIN_MODELS  # not at import: the CLI's start

            if builtin not in BUILTIN_MODELS:
                names = ", ".join(BUILTIN_PREFIX + n for n in BUILTIN_MODELS)
                raise ConfigError("model", f"no built-in model {builtin!r} (one of {names})")
            return
        target, name = self.model.rsplit(":", 1)
        if not target or not name.isidentifier():
            raise ConfigError(
                "model", f"must be builtin:NAME, FILE.py:NAME or module:NAME, got {self.model!r}"
            )

    def _check_dataset(self) -> None:
        if not isinstance(self.skip_missing_data, bool):
            raise ConfigError(
                "skip_missing_data", f"must be true or false, got {self.skip_missing_data!r}"
            )
        if isinstance(self.dataset, dict):
            for key in _PRESET_KEYS:
                if getattr(self, key) is not None:
                    raise ConfigError(
                        key,
                        "belongs inside dataset: when dataset is a mapping (a preset given "
                        "by name takes it at the top level)",
                    )
            return
        if self.dataset not in DATASETS:
            raise ConfigError(
                "dataset",
                f"must be a mapping (format:, train:, label:, ids: ...) or a preset "
                f"({', '.join(DATASETS)}), got {self.dataset!r}",
            )
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

    def _build_dataset_spec(self) -> DatasetSpec:
        if isinstance(self.dataset, str):  # a preset by name: the top-level keys are its own
            return DatasetSpec.from_legacy(
                self.dataset,
                self.data_dir,
                self.split,
                self.train_rows,
                base_dir=self.base_dir,
                where=self.where,
            )
        return DatasetSpec.from_yaml_node(self.dataset, base_dir=self.base_dir, where=self.where)

    def data_files(self) -> list[Path]:
        """The files a preset given by name reads (each may also be the ``.gz`` of the name
        given); ``[]`` for other datasets (the validation step checks theirs)."""
        if not isinstance(self.dataset, str) or self.data_dir is None:
            return []
        if self.dataset == "adult":
            return [self.data_dir / "adult.data"]
        if self.dataset == "criteo":
            return [self._criteo_file()]
        split = self.split or "u1"
        names = (f"{split}.base", f"{split}.test", *_MOVIELENS_TABLES)
        return [self.data_dir / name for name in names]

    def missing_data(self) -> str | None:
        """Why a preset's data cannot be read (a missing directory or file), else ``None``."""
        if self.data_dir is not None and not self.data_dir.is_dir():
            return f"{self.dataset_name} data directory {self.data_dir} does not exist"
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

    def _check_ram_budget(self) -> None:
        if self.ram_budget is None:
            return
        if self.embedding_config != AUTO:
            raise ConfigError(
                "ram_budget",
                "sizes the embedding_config: auto tables; set store.ram_budget in the "
                f"embedding config {self.embedding_config!r} instead",
            )
        from embeddb.config.store import check_ram_budget

        object.__setattr__(self, "ram_budget", check_ram_budget(self.ram_budget))

    @property
    def shard_count(self) -> int:
        """The shards the job's tables are split over (``addresses`` or ``shards``)."""
        return len(self.addresses) if self.addresses is not None else self.shards

    @property
    def auto_embedding(self) -> bool:
        """Whether the embedding config is generated (``embedding_config: auto``)."""
        return self.embedding_config == AUTO

    def embedding_config_path(self, run_dir: Path | None = None) -> Path:
        """The embedding config's YAML file: a packaged preset, a path, or with ``auto``
        ``RUN_DIR/embedding.yaml`` (written by the launcher or the validation step).

        Raises:
            ConfigError: no such preset or file; ``auto`` without a run directory.
        """
        config = str(self.embedding_config)
        if config == AUTO:
            if run_dir is None:
                raise ConfigError(
                    "embedding_config", "auto is written by the validation step (no run dir)"
                )
            return run_dir / EMBEDDING_FILE
        if config.startswith("preset:"):
            name = config.split(":", 1)[1]
            path = Path(str(resources.files("embeddb.presets").joinpath(f"{name}.yaml")))
        else:
            path = (self.base_dir / config).resolve()
        if not path.is_file():
            at = self.where("embedding_config")
            raise ConfigError(
                "embedding_config", f"no such preset or file: {path}" + (f" ({at})" if at else "")
            )
        return path

    def shard_data_dir(self) -> Path | None:
        """Where local shards keep their rows: under the checkpoint directory (snapshots need
        one), else nowhere (ephemeral shards)."""
        return None if self.checkpoint_dir is None else self.checkpoint_dir / "shards"


def _positive(name: str, value: object, minimum: int = 1) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ConfigError(name, f"must be an integer >= {minimum}, got {value!r}")
