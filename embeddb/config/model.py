"""The configuration dataclasses; each validates itself on construction."""

from __future__ import annotations

import enum
import os
import types
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import yaml

from embeddb.config._checks import (
    _MAX_HASH_STACK_SIZE,
    _MAX_PREFIX_BITS,
    _MAX_STRIPES,
    _as_bool,
    _as_float,
    _as_int,
    _as_kind,
    _as_name,
    _describe,
    _did_you_mean,
    _set,
)
from embeddb.errors import ConfigError, TableNotFoundError
from embeddb.routing import as_ids, hash_stack, with_group_prefix

# --------------------------------------------------------------------------------------------
# Public configuration types
# --------------------------------------------------------------------------------------------


class OptimizerKind(str, enum.Enum):
    """Server-side optimizer of a table (YAML ``optimizer.type``)."""

    SGD = "sgd"
    ADAGRAD = "adagrad"
    ADAM = "adam"


class LogRecovery(str, enum.Enum):
    """What opening the update log does with a corrupt tail (YAML ``store.log_recovery``).

    A *torn* tail (a write a crash interrupted, never acknowledged) is always cut; a *corrupt*
    one (complete bytes that fail their checks) may hold acknowledged updates. Named after
    RocksDB's WAL recovery modes.
    """

    AUTO = "auto"  # ABSOLUTE_CONSISTENCY with fsync: always, else POINT_IN_TIME
    ABSOLUTE_CONSISTENCY = "absolute_consistency"  # refuse to start unless told to cut
    POINT_IN_TIME = "point_in_time"  # cut, logged at ERROR, counted and recorded


class InitializerKind(str, enum.Enum):
    """How a table fills the vector of a row on first access (YAML ``initializer.type``)."""

    UNIFORM = "uniform"
    NORMAL = "normal"
    ZEROS = "zeros"


# The parameters each kind takes; YAML keys of other kinds are rejected.
_OPTIMIZER_PARAMS: Mapping[OptimizerKind, tuple[str, ...]] = types.MappingProxyType(
    {
        OptimizerKind.SGD: ("lr", "weight_decay"),
        OptimizerKind.ADAGRAD: (
            "lr",
            "weight_decay",
            "initial_accumulator",
            "eps",
            "vectorwise_shared",
        ),
        OptimizerKind.ADAM: ("lr", "weight_decay", "beta1", "beta2", "eps"),
    }
)
_INITIALIZER_PARAMS: Mapping[InitializerKind, tuple[str, ...]] = types.MappingProxyType(
    {
        InitializerKind.UNIFORM: ("low", "high"),
        InitializerKind.NORMAL: ("mean", "std"),
        InitializerKind.ZEROS: (),
    }
)


@dataclass(frozen=True)
class OptimizerConfig:
    """Server-side optimizer of one table.

    Every field is validated on construction whatever the kind; fields another kind uses keep
    their defaults and are ignored.

    Attributes:
        kind: sgd, adagrad or adam (a plain string such as ``"adam"`` is converted).
        lr: learning rate, > 0.
        weight_decay: L2 coefficient added to the gradient, >= 0.
        initial_accumulator: Adagrad's starting accumulator value, >= 0 (PERSIA's 1e-2).
        eps: added to the denominator, > 0. The YAML parser uses 1e-8 for Adam when not given.
        vectorwise_shared: Adagrad keeps one accumulator per row instead of one per float.
        beta1: Adam's first-moment decay, in [0, 1).
        beta2: Adam's second-moment decay, in [0, 1).
    """

    kind: OptimizerKind = OptimizerKind.ADAGRAD
    lr: float = 0.01
    weight_decay: float = 0.0
    initial_accumulator: float = 0.01
    eps: float = 1e-10
    vectorwise_shared: bool = False
    beta1: float = 0.9
    beta2: float = 0.999

    def __post_init__(self) -> None:
        _set(self, "kind", _as_kind(OptimizerKind, self.kind, "kind", "optimizer type"))
        _set(self, "lr", _as_float(self.lr, "lr", low=0.0, low_open=True))
        _set(self, "weight_decay", _as_float(self.weight_decay, "weight_decay", low=0.0))
        _set(
            self,
            "initial_accumulator",
            _as_float(self.initial_accumulator, "initial_accumulator", low=0.0),
        )
        _set(self, "eps", _as_float(self.eps, "eps", low=0.0, low_open=True))
        _set(self, "vectorwise_shared", _as_bool(self.vectorwise_shared, "vectorwise_shared"))
        for name in ("beta1", "beta2"):
            beta = _as_float(getattr(self, name), name, low=0.0, high=1.0, high_open=True)
            _set(self, name, beta)

    def state_dim(self, dim: int) -> int:
        """Return how many floats of optimizer state a row of ``dim`` floats carries.

        Args:
            dim: the table's vector width.

        Returns:
            0 for SGD; ``dim`` for Adagrad (1 when ``vectorwise_shared``); ``2 * dim + 1`` for
            Adam (first moment, second moment, step count).
        """
        if self.kind is OptimizerKind.SGD:
            return 0
        if self.kind is OptimizerKind.ADAGRAD:
            return 1 if self.vectorwise_shared else dim
        return 2 * dim + 1


@dataclass(frozen=True)
class InitializerConfig:
    """How a table initialises the vector of a row it has never seen.

    Attributes:
        kind: uniform, normal or zeros (a plain string is converted).
        low: uniform lower bound; must be < ``high``.
        high: uniform upper bound.
        mean: normal mean.
        std: normal standard deviation, > 0.
    """

    kind: InitializerKind = InitializerKind.UNIFORM
    low: float = -0.01
    high: float = 0.01
    mean: float = 0.0
    std: float = 0.01

    def __post_init__(self) -> None:
        _set(self, "kind", _as_kind(InitializerKind, self.kind, "kind", "initializer type"))
        for name in ("low", "high", "mean"):
            _set(self, name, _as_float(getattr(self, name), name))
        _set(self, "std", _as_float(self.std, "std", low=0.0, low_open=True))
        if self.low >= self.high:
            raise ConfigError("low", f"must be less than high ({self.high!r}), got {self.low!r}")


@dataclass(frozen=True)
class TableConfig:
    """One embedding table: its width, optimizer, initializer and RAM-tier budget.

    A row of the table stores ``row_width`` float32 values, the vector first::

        dim=4, adagrad (state_dim 4):  [ v0 v1 v2 v3 | a0 a1 a2 a3 ]   row_width 8
        dim=4, adam    (state_dim 9):  [ v0 v1 v2 v3 | m0..m3 | s0..s3 | step ]   row_width 13

    Attributes:
        name: table name, a non-empty string of ``[A-Za-z0-9_.-]``.
        dim: vector width, > 0.
        optimizer: the table's server-side optimizer.
        initializer: how new rows are initialised.
        admit_probability: probability that an unseen id gets a row on its first update, in
            (0, 1]; 1 admits every id.
        weight_bound: when set (> 0), every vector element is clamped to
            ``[-weight_bound, weight_bound]`` after each update.
        capacity: RAM-tier rows per shard for this table, > 0.
        seed: initializer seed, >= 0.
    """

    name: str
    dim: int
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    initializer: InitializerConfig = field(default_factory=InitializerConfig)
    admit_probability: float = 1.0
    weight_bound: float | None = None
    capacity: int = 1_000_000
    seed: int = 0

    def __post_init__(self) -> None:
        _as_name(self.name, "name", "table name")
        _set(self, "dim", _as_int(self.dim, "dim", minimum=1))
        if not isinstance(self.optimizer, OptimizerConfig):
            raise ConfigError(
                "optimizer", f"must be an OptimizerConfig, got {_describe(self.optimizer)}"
            )
        if not isinstance(self.initializer, InitializerConfig):
            raise ConfigError(
                "initializer", f"must be an InitializerConfig, got {_describe(self.initializer)}"
            )
        _set(
            self,
            "admit_probability",
            _as_float(
                self.admit_probability, "admit_probability", low=0.0, high=1.0, low_open=True
            ),
        )
        if self.weight_bound is not None:
            bound = _as_float(self.weight_bound, "weight_bound", low=0.0, low_open=True)
            _set(self, "weight_bound", bound)
        _set(self, "capacity", _as_int(self.capacity, "capacity", minimum=1))
        _set(self, "seed", _as_int(self.seed, "seed", minimum=0))

    @property
    def state_dim(self) -> int:
        """Floats of optimizer state per row."""
        return self.optimizer.state_dim(self.dim)

    @property
    def row_width(self) -> int:
        """Floats per row: ``dim`` vector floats followed by ``state_dim`` state floats."""
        return self.dim + self.state_dim


@dataclass(frozen=True)
class FeatureConfig:
    """One input feature (a PERSIA slot): which table it reads and how its ids are encoded.

    Attributes:
        name: feature name, a non-empty string of ``[A-Za-z0-9_.-]``.
        table: the table the feature reads.
        dim: vector width; equals the table's ``dim``.
        group: the feature group; an ungrouped feature's group is named after the feature.
        group_index: index of the group, stored in the top ``prefix_bits`` bits of its ids.
        embedding_summation: the trainer sums the vectors of one sample (PERSIA's default).
        sqrt_scaling: the trainer scales the sum by ``1 / sqrt(count)``.
        sample_fixed_size: ids per sample kept when not summing, > 0.
        hash_stack_rounds: hash-stack rounds, >= 0; 0 disables the hash stack.
        hash_stack_size: buckets per round (PERSIA's ``embedding_size``); > 0 exactly when
            ``hash_stack_rounds > 0``.
        prefix_bits: the config's ``feature_index_prefix_bit``, in [0, 32].
    """

    name: str
    table: str
    dim: int
    group: str
    group_index: int
    embedding_summation: bool = True
    sqrt_scaling: bool = False
    sample_fixed_size: int = 10
    hash_stack_rounds: int = 0
    hash_stack_size: int = 0
    prefix_bits: int = 8

    def __post_init__(self) -> None:
        _as_name(self.name, "name", "feature name")
        _as_name(self.table, "table", "table name")
        _as_name(self.group, "group", "feature group name")
        _set(self, "dim", _as_int(self.dim, "dim", minimum=1))
        bits = _as_int(self.prefix_bits, "prefix_bits", minimum=0, maximum=_MAX_PREFIX_BITS)
        _set(self, "prefix_bits", bits)
        max_index = (1 << bits) - 1 if bits else None
        _set(
            self,
            "group_index",
            _as_int(self.group_index, "group_index", minimum=0, maximum=max_index),
        )
        for name in ("embedding_summation", "sqrt_scaling"):
            _set(self, name, _as_bool(getattr(self, name), name))
        _set(
            self,
            "sample_fixed_size",
            _as_int(self.sample_fixed_size, "sample_fixed_size", minimum=1),
        )
        self._check_hash_stack()

    def _check_hash_stack(self) -> None:
        rounds = _as_int(self.hash_stack_rounds, "hash_stack_rounds", minimum=0)
        size = _as_int(
            self.hash_stack_size, "hash_stack_size", minimum=0, maximum=_MAX_HASH_STACK_SIZE
        )
        _set(self, "hash_stack_rounds", rounds)
        _set(self, "hash_stack_size", size)
        if rounds > 0 and size == 0:
            raise ConfigError("hash_stack_size", "must be > 0 when hash_stack_rounds > 0")
        if rounds == 0 and size != 0:
            raise ConfigError(
                "hash_stack_size", f"must be 0 when hash_stack_rounds is 0, got {size}"
            )
        if rounds * size > 1 << (64 - self.prefix_bits):
            raise ConfigError(
                "hash_stack_size",
                f"{rounds} rounds x {size} buckets do not fit in the {64 - self.prefix_bits} id "
                "bits left by the group prefix",
            )

    def encode(self, ids: npt.ArrayLike) -> npt.NDArray[np.uint64]:
        """Turn raw ids of this feature into ids of rows of its table.

        Without a hash stack each id keeps its low ``64 - prefix_bits`` bits and gets the group
        index in its top ``prefix_bits`` bits, so features of one group share an id space and
        different groups never collide. With a hash stack each id becomes ``hash_stack_rounds``
        bucket ids (see :func:`embeddb.routing.hash_stack`), each prefixed the same way.

        Args:
            ids: 1-D array of non-negative integer feature ids.

        Returns:
            ``uint64`` table ids of shape ``(n,)``, or ``(n, hash_stack_rounds)`` with a hash
            stack.

        Raises:
            InvalidArgumentError: ``ids`` is not a 1-D array of non-negative integers.
        """
        raw = as_ids(ids, name=f"ids of feature {self.name!r}")
        if self.hash_stack_rounds == 0:
            return with_group_prefix(raw, self.group_index, self.prefix_bits)
        # routing.hash_stack multiplies uint64 salts outside np.errstate; wrap-around is intended.
        with np.errstate(over="ignore"):
            buckets = hash_stack(raw, self.hash_stack_rounds, self.hash_stack_size)
        prefixed = with_group_prefix(buckets.ravel(), self.group_index, self.prefix_bits)
        return prefixed.reshape(buckets.shape)


_FSYNC_POLICIES = ("always", "interval", "never")


@dataclass(frozen=True)
class StoreConfig:
    """Settings of every table's store on a shard.

    Attributes:
        stripes: lock stripes per table, a power of two in [1, 64].
        eviction_chunk: least fraction of a table's capacity evicted per eviction, in (0, 0.5].
        min_stripe_rows: a table gets fewer stripes rather than stripes smaller than this (a
            small table is not worth striping, and a tiny stripe fills up on a few unlucky ids).
        disk_cache_mb: RocksDB block cache of the shard's disk tier, in MiB (shared by tables).
        threads: threads that may serve the stripes of one large lookup or gradient push at
            once, the calling one included; 0 (default) means the CPUs this process may use,
            1 keeps every call on its calling thread.
        parallel_min_ids: calls with fewer ids than this stay on their calling thread.
        update_log: log every acknowledged mutation (needed for crash recovery, snapshots'
            point-in-time restore and followers); ``False`` only for throwaway shards.
        fsync: when the update log is fsynced: ``always`` (before each acknowledgement, group
            commit), ``interval`` (default: every ``fsync_interval_ms``; a power loss can lose
            the acknowledged updates of that window, a process crash loses none) or ``never``
            (left to the OS).
        fsync_interval_ms: the ``interval`` policy's period.
        log_segment_mb: size at which an update log segment is sealed and a new one begun.
        log_lz4_min_bytes: log records at least this large are LZ4-compressed when that shrinks
            them (0: never).
        log_recovery: what opening the update log does when its last segment ends in a
            corrupt record (complete on disk, failing its checksum; a torn write is always cut):
            ``absolute_consistency`` refuses to start (``embeddb serve --cut-corrupt-log-tail``
            cuts it), ``point_in_time`` cuts it, logged at ERROR, counted and recorded in
            ``log-cuts.jsonl``; ``auto`` (default) is the first with ``fsync: always`` and the
            second otherwise.
        snapshot_retention: complete snapshots kept per shard; older ones (and the log segments
            only they needed) are deleted when a new snapshot lands.
        export_dir: write the rows the shard changes, every ``export_interval_s``, as numpy
            files into this directory (``embeddb.durability.export``); ``None`` (default): no
            export. ``{index}`` is replaced by the shard index; a relative path is taken
            inside the shard's data directory (so each shard of a cluster gets its own). Needs
            the update log; followers do not export.
        export_interval_s: seconds between two exports (the tail is always written when the
            shard closes).
    """

    stripes: int = 4
    eviction_chunk: float = 1 / 64
    min_stripe_rows: int = 1024
    disk_cache_mb: int = 256
    threads: int = 0
    parallel_min_ids: int = 16384
    update_log: bool = True
    fsync: str = "interval"
    fsync_interval_ms: float = 5.0
    log_segment_mb: int = 64
    log_lz4_min_bytes: int = 4096
    log_recovery: LogRecovery = LogRecovery.AUTO
    snapshot_retention: int = 3
    export_dir: str | None = None
    export_interval_s: float = 10.0

    def __post_init__(self) -> None:
        stripes = _as_int(self.stripes, "stripes", minimum=1, maximum=_MAX_STRIPES)
        if stripes & (stripes - 1):
            raise ConfigError("stripes", f"must be a power of two, got {stripes}")
        _set(self, "stripes", stripes)
        chunk = _as_float(self.eviction_chunk, "eviction_chunk", low=0.0, high=0.5, low_open=True)
        _set(self, "eviction_chunk", chunk)
        _set(self, "min_stripe_rows", _as_int(self.min_stripe_rows, "min_stripe_rows", minimum=1))
        _set(self, "disk_cache_mb", _as_int(self.disk_cache_mb, "disk_cache_mb", minimum=1))
        _set(self, "threads", _as_int(self.threads, "threads", minimum=0, maximum=256))
        _set(
            self,
            "parallel_min_ids",
            _as_int(self.parallel_min_ids, "parallel_min_ids", minimum=1),
        )
        if not isinstance(self.update_log, bool):
            raise ConfigError("update_log", f"must be true or false, got {self.update_log!r}")
        if self.fsync not in _FSYNC_POLICIES:
            raise ConfigError(
                "fsync", f"must be one of {', '.join(_FSYNC_POLICIES)}, got {self.fsync!r}"
            )
        interval = _as_float(self.fsync_interval_ms, "fsync_interval_ms", low=0.0, high=60_000.0,
                             low_open=True)  # fmt: skip
        _set(self, "fsync_interval_ms", interval)
        _set(self, "log_segment_mb", _as_int(self.log_segment_mb, "log_segment_mb", minimum=1))
        _set(
            self,
            "log_lz4_min_bytes",
            _as_int(self.log_lz4_min_bytes, "log_lz4_min_bytes", minimum=0),
        )
        recovery = _as_kind(LogRecovery, self.log_recovery, "log_recovery", "log recovery mode")
        _set(self, "log_recovery", recovery)
        _set(
            self,
            "snapshot_retention",
            _as_int(self.snapshot_retention, "snapshot_retention", minimum=1),
        )
        if isinstance(self.export_dir, os.PathLike):
            _set(self, "export_dir", os.fspath(self.export_dir))
        if self.export_dir is not None and (
            not isinstance(self.export_dir, str) or not self.export_dir.strip()
        ):
            raise ConfigError(
                "export_dir", f"must be a directory path or null, got {_describe(self.export_dir)}"
            )
        _set(
            self,
            "export_interval_s",
            _as_float(self.export_interval_s, "export_interval_s", low=0.0, high=86_400.0,
                      low_open=True),
        )  # fmt: skip


@dataclass(frozen=True)
class EmbeddingConfig:
    """The whole embedding configuration of a job: tables, features and feature groups.

    Build one with :meth:`from_yaml` (the usual way), :meth:`from_dict` or :meth:`single_table`.
    The mappings are read-only views in insertion order: tables in the order features first read
    them, then standalone tables; features in file order.

    Attributes:
        tables: table name -> table.
        features: feature name -> feature.
        feature_groups: group name -> names of its features (ungrouped features are not listed).
        feature_index_prefix_bit: bits of every id that hold the group index, in [0, 32].
        store: settings of every table's store.
        seed: default initializer seed of the tables, >= 0.

    Raises:
        ConfigError: on construction, when the parts are inconsistent: a feature reads an unknown
            table or one of another ``dim``, group membership or group indices disagree with
            ``feature_groups``, or no table is defined.
    """

    tables: Mapping[str, TableConfig]
    features: Mapping[str, FeatureConfig] = field(default_factory=dict)
    feature_groups: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    feature_index_prefix_bit: int = 8
    store: StoreConfig = field(default_factory=StoreConfig)
    seed: int = 0

    def __post_init__(self) -> None:
        bits = _as_int(
            self.feature_index_prefix_bit,
            "feature_index_prefix_bit",
            minimum=0,
            maximum=_MAX_PREFIX_BITS,
        )
        _set(self, "feature_index_prefix_bit", bits)
        _set(self, "seed", _as_int(self.seed, "seed", minimum=0))
        if not isinstance(self.store, StoreConfig):
            raise ConfigError("store", f"must be a StoreConfig, got {_describe(self.store)}")
        _set(self, "tables", _by_name(self.tables, TableConfig, "tables"))
        _set(self, "features", _by_name(self.features, FeatureConfig, "features"))
        if not self.tables:
            raise ConfigError("tables", "no tables: define slots_config or tables")
        if not isinstance(self.feature_groups, Mapping):
            raise ConfigError(
                "feature_groups", f"must be a mapping, got {_describe(self.feature_groups)}"
            )
        group_of = _group_of(self.feature_groups, self.features)
        groups = {group: tuple(members) for group, members in self.feature_groups.items()}
        _set(self, "feature_groups", types.MappingProxyType(groups))
        index_of = _group_indices(groups, group_of, self.features, bits)
        for feature in self.features.values():
            self._check_feature(feature, group_of.get(feature.name, feature.name), index_of)

    def _check_feature(
        self, feature: FeatureConfig, group: str, index_of: Mapping[str, int]
    ) -> None:
        path = f"features.{feature.name}"
        table = self.tables.get(feature.table)
        if table is None:
            raise ConfigError(f"{path}.table", f"unknown table {feature.table!r}")
        if feature.dim != table.dim:
            raise ConfigError(
                f"{path}.dim", f"{feature.dim} differs from dim {table.dim} of table {table.name!r}"
            )
        if feature.group != group:
            raise ConfigError(
                f"{path}.group", f"must be {group!r} (from feature_groups), got {feature.group!r}"
            )
        if feature.group_index != index_of[group]:
            raise ConfigError(
                f"{path}.group_index",
                f"must be {index_of[group]}: groups are numbered in feature_groups order, then "
                f"ungrouped features in features order; got {feature.group_index}",
            )
        if feature.prefix_bits != self.feature_index_prefix_bit:
            raise ConfigError(
                f"{path}.prefix_bits",
                f"must equal feature_index_prefix_bit ({self.feature_index_prefix_bit}), "
                f"got {feature.prefix_bits}",
            )

    def __reduce__(self) -> tuple[Any, ...]:
        # Read-only mapping views do not pickle; rebuild from plain dicts (multiprocessing, copy).
        return (
            type(self),
            (
                dict(self.tables),
                dict(self.features),
                dict(self.feature_groups),
                self.feature_index_prefix_bit,
                self.store,
                self.seed,
            ),
        )

    def __hash__(self) -> int:
        return hash(
            (
                tuple(self.tables.items()),
                tuple(self.features.items()),
                tuple(self.feature_groups.items()),
                self.feature_index_prefix_bit,
                self.store,
                self.seed,
            )
        )

    @classmethod
    def from_yaml(cls, path: str | os.PathLike[str]) -> EmbeddingConfig:
        """Load and validate a YAML config file.

        Args:
            path: the YAML file.

        Raises:
            ConfigError: the file is missing or unreadable, is not valid YAML, or the config is
                invalid (the message names the key path and the file).
        """
        file = Path(path)
        try:
            text = file.read_text(encoding="utf-8")
        except FileNotFoundError as exc:
            raise ConfigError("", f"config file not found: {file}") from exc
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError("", f"cannot read config file {file}: {exc}") from exc
        return cls.from_yaml_text(text, source=str(file))

    @classmethod
    def from_yaml_text(cls, text: str, source: str = "<string>") -> EmbeddingConfig:
        """Parse and validate a YAML config document.

        Besides standard YAML, ``1e-10`` (an exponent without a dot) reads as a float, and a
        mapping with a duplicate key is an error instead of silently keeping the last value.

        Args:
            text: the YAML document.
            source: where the text came from, for error messages.

        Raises:
            ConfigError: invalid YAML or an invalid config.
        """
        from embeddb.config.schema import _detail, _YamlLoader  # the parser imports this module

        try:
            data = yaml.load(text, Loader=_YamlLoader)
        except yaml.YAMLError as exc:
            raise ConfigError("", f"{source}: invalid YAML: {exc}") from exc
        try:
            return cls.from_dict(data)
        except ConfigError as exc:
            if source == "<string>":
                raise
            raise ConfigError(exc.key, f"{_detail(exc)} (in {source})") from exc.__cause__

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> EmbeddingConfig:
        """Build a config from parsed YAML data (the schema in the module docstring).

        Raises:
            ConfigError: the data is not a mapping or the config is invalid.
        """
        if data is None:
            raise ConfigError("", "the config is empty")
        if not isinstance(data, Mapping):
            raise ConfigError(
                "", f"the top level must be a mapping of config keys, got {_describe(data)}"
            )
        from embeddb.config.schema import _parse  # the parser imports this module

        return cls(**_parse(data))

    @classmethod
    def single_table(cls, name: str, dim: int, **table_kwargs: Any) -> EmbeddingConfig:
        """Build a config of one table and no features (for tests and benchmarks).

        Args:
            name: the table name.
            dim: the table's vector width.
            **table_kwargs: further :class:`TableConfig` fields.

        Raises:
            ConfigError: an invalid table setting.
        """
        return cls(tables={name: TableConfig(name=name, dim=dim, **table_kwargs)})

    def table(self, name: str) -> TableConfig:
        """Return the table called ``name``.

        Raises:
            TableNotFoundError: no such table.
        """
        try:
            return self.tables[name]
        except KeyError:
            raise TableNotFoundError(name, tuple(self.tables)) from None

    def to_dict(self) -> dict[str, Any]:
        """Return plain data in the YAML schema; ``from_dict(c.to_dict()) == c``.

        Every table and feature is written out in full (each slot with its explicit ``table``),
        so the result needs no ``defaults`` section and can be dumped with ``yaml.safe_dump``.
        """
        from embeddb.config.schema import _feature_to_dict, _table_to_dict

        return {
            "feature_index_prefix_bit": self.feature_index_prefix_bit,
            "seed": self.seed,
            "slots_config": {name: _feature_to_dict(f) for name, f in self.features.items()},
            "feature_groups": {
                name: list(members) for name, members in self.feature_groups.items()
            },
            "tables": {name: _table_to_dict(t) for name, t in self.tables.items()},
            "store": {f.name: _plain(getattr(self.store, f.name)) for f in fields(self.store)},
        }


# --------------------------------------------------------------------------------------------
# Consistency rules shared by EmbeddingConfig and the parser
# --------------------------------------------------------------------------------------------


def _plain(value: object) -> object:
    """``value`` as YAML-safe plain data (an enum as its value)."""
    return value.value if isinstance(value, enum.Enum) else value


def _by_name(items: object, kind: type, key: str) -> Mapping[str, Any]:
    if not isinstance(items, Mapping):
        raise ConfigError(
            key, f"must be a mapping of name -> {kind.__name__}, got {_describe(items)}"
        )
    for name, item in items.items():
        if not isinstance(item, kind) or getattr(item, "name", None) != name:
            raise ConfigError(
                f"{key}.{name}", f"must be a {kind.__name__} named {name!r}, got {item!r}"
            )
    return types.MappingProxyType(dict(items))


def _group_of(feature_groups: Mapping[Any, Any], features: Collection[str]) -> dict[str, str]:
    """Validate ``feature_groups`` against the feature names; return feature -> its group."""
    group_of: dict[str, str] = {}
    for group, members in feature_groups.items():
        _as_name(group, "feature_groups", "feature group name")
        path = f"feature_groups.{group}"
        if group in features:
            raise ConfigError(path, f"{group!r} is both a feature group and a feature; rename one")
        if isinstance(members, (str, bytes)) or not isinstance(members, Sequence):
            raise ConfigError(path, f"must be a list of feature names, got {_describe(members)}")
        if not members:
            raise ConfigError(path, "empty group: list at least one feature")
        for member in members:
            if not isinstance(member, str) or member not in features:
                hint = _did_you_mean(str(member), features)
                raise ConfigError(path, f"unknown feature {member!r}{hint}")
            if member in group_of:
                raise ConfigError(
                    path, f"feature {member!r} is already in group {group_of[member]!r}"
                )
            group_of[member] = group
    return group_of


def _group_indices(
    groups: Collection[str],
    group_of: Mapping[str, str],
    features: Collection[str],
    prefix_bits: int,
) -> dict[str, int]:
    """Number the groups: ``groups`` in order, then the ungrouped features in order."""
    names = [*groups, *(name for name in features if name not in group_of)]
    if prefix_bits and len(names) > 1 << prefix_bits:
        raise ConfigError(
            "feature_index_prefix_bit",
            f"{len(names)} feature groups ({len(groups)} in feature_groups, "
            f"{len(names) - len(groups)} ungrouped features) do not fit in {prefix_bits} prefix "
            f"bits (at most {1 << prefix_bits})",
        )
    return {name: index for index, name in enumerate(names)}
