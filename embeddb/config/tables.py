"""The building blocks of an embedding configuration: optimizers, initializers, tables, features.

Each dataclass validates itself on construction. :class:`~embeddb.config.model.EmbeddingConfig`
gathers them into a job's configuration, and :mod:`embeddb.config.schema` parses the YAML
schema into them; both import this module, which imports neither (so the dependency runs one
way: ``tables`` <- ``schema`` <- ``model``).
"""

from __future__ import annotations

import enum
import types
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from embeddb.common.routing import as_ids, hash_stack, with_group_prefix
from embeddb.config._checks import (
    MAX_PREFIX_BITS,
    as_bool,
    as_float,
    as_int,
    as_kind,
    as_name,
    describe,
    set_field,
)
from embeddb.errors import ConfigError

__all__ = [
    "INITIALIZER_PARAMS",
    "OPTIMIZER_PARAMS",
    "Eviction",
    "FeatureConfig",
    "InitializerConfig",
    "InitializerKind",
    "OptimizerConfig",
    "OptimizerKind",
    "TableConfig",
]

# routing.hash_stack multiplies 32-bit hashes by the bucket count in uint64 arithmetic.
_MAX_HASH_STACK_SIZE = 1 << 32

# --------------------------------------------------------------------------------------------
# Public configuration types
# --------------------------------------------------------------------------------------------


class OptimizerKind(str, enum.Enum):
    """Server-side optimizer of a table (YAML ``optimizer.type``)."""

    SGD = "sgd"
    ADAGRAD = "adagrad"
    ADAM = "adam"


class InitializerKind(str, enum.Enum):
    """How a table fills the vector of a row on first access (YAML ``initializer.type``)."""

    UNIFORM = "uniform"
    NORMAL = "normal"
    ZEROS = "zeros"


class Eviction(str, enum.Enum):
    """Which rows a full RAM tier keeps (YAML ``eviction``)."""

    TINYLFU = "tinylfu"
    LRU = "lru"


# The parameters each kind takes; YAML keys of other kinds are rejected.
OPTIMIZER_PARAMS: Mapping[OptimizerKind, tuple[str, ...]] = types.MappingProxyType(
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
INITIALIZER_PARAMS: Mapping[InitializerKind, tuple[str, ...]] = types.MappingProxyType(
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
        vectorwise_shared: row-wise Adagrad: one accumulator per row instead of one per float,
            fed the mean of the squared gradient over the row (TorchRec/FBGEMM's
            ``EXACT_ROWWISE_ADAGRAD``; PERSIA's name). A row is ``dim + 1`` floats (68 bytes
            at dim 16, not 128) in RAM, on disk, in log records and snapshots. On in the
            ``embedding_config: auto`` tables.
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
        set_field(self, "kind", as_kind(OptimizerKind, self.kind, "kind", "optimizer type"))
        set_field(self, "lr", as_float(self.lr, "lr", low=0.0, low_open=True))
        set_field(self, "weight_decay", as_float(self.weight_decay, "weight_decay", low=0.0))
        set_field(
            self,
            "initial_accumulator",
            as_float(self.initial_accumulator, "initial_accumulator", low=0.0),
        )
        set_field(self, "eps", as_float(self.eps, "eps", low=0.0, low_open=True))
        set_field(self, "vectorwise_shared", as_bool(self.vectorwise_shared, "vectorwise_shared"))
        for name in ("beta1", "beta2"):
            beta = as_float(getattr(self, name), name, low=0.0, high=1.0, high_open=True)
            set_field(self, name, beta)

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
        set_field(self, "kind", as_kind(InitializerKind, self.kind, "kind", "initializer type"))
        for name in ("low", "high", "mean"):
            set_field(self, name, as_float(getattr(self, name), name))
        set_field(self, "std", as_float(self.std, "std", low=0.0, low_open=True))
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
        capacity: RAM-tier rows per shard for this table, > 0. With ``store.ram_budget``, a
            table whose YAML (``defaults`` or its ``tables`` entry) gives none gets a share of
            the budget instead (docs/database.md, *RAM budget*).
        eviction: which rows a full RAM tier keeps: ``tinylfu`` admits a row (promoted,
            created or assigned) only if it was looked up more often lately than the least
            recently used row it would evict, apart from a window of 1% of the capacity for new
            rows, and serves the others from disk; ``lru`` always evicts the least recently used
            rows. Residency only: values are the same either way. ``admit_probability`` still
            decides whether a new id gets a row at all. tinylfu reads less from disk on skewed
            (Zipf) lookups once warm, but its disk reads are colder (see docs/architecture.md
            §8).
        seed: initializer seed, >= 0.
    """

    name: str
    dim: int
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    initializer: InitializerConfig = field(default_factory=InitializerConfig)
    admit_probability: float = 1.0
    weight_bound: float | None = None
    capacity: int = 1_000_000
    eviction: Eviction = Eviction.LRU
    seed: int = 0

    def __post_init__(self) -> None:
        as_name(self.name, "name", "table name")
        set_field(self, "dim", as_int(self.dim, "dim", minimum=1))
        if not isinstance(self.optimizer, OptimizerConfig):
            raise ConfigError(
                "optimizer", f"must be an OptimizerConfig, got {describe(self.optimizer)}"
            )
        if not isinstance(self.initializer, InitializerConfig):
            raise ConfigError(
                "initializer", f"must be an InitializerConfig, got {describe(self.initializer)}"
            )
        set_field(
            self,
            "admit_probability",
            as_float(self.admit_probability, "admit_probability", low=0.0, high=1.0, low_open=True),
        )
        if self.weight_bound is not None:
            bound = as_float(self.weight_bound, "weight_bound", low=0.0, low_open=True)
            set_field(self, "weight_bound", bound)
        set_field(self, "capacity", as_int(self.capacity, "capacity", minimum=1))
        set_field(self, "eviction", as_kind(Eviction, self.eviction, "eviction", "eviction policy"))
        set_field(self, "seed", as_int(self.seed, "seed", minimum=0))

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
        as_name(self.name, "name", "feature name")
        as_name(self.table, "table", "table name")
        as_name(self.group, "group", "feature group name")
        set_field(self, "dim", as_int(self.dim, "dim", minimum=1))
        bits = as_int(self.prefix_bits, "prefix_bits", minimum=0, maximum=MAX_PREFIX_BITS)
        set_field(self, "prefix_bits", bits)
        max_index = (1 << bits) - 1 if bits else None
        set_field(
            self,
            "group_index",
            as_int(self.group_index, "group_index", minimum=0, maximum=max_index),
        )
        for name in ("embedding_summation", "sqrt_scaling"):
            set_field(self, name, as_bool(getattr(self, name), name))
        set_field(
            self,
            "sample_fixed_size",
            as_int(self.sample_fixed_size, "sample_fixed_size", minimum=1),
        )
        self._check_hash_stack()

    def _check_hash_stack(self) -> None:
        rounds = as_int(self.hash_stack_rounds, "hash_stack_rounds", minimum=0)
        size = as_int(
            self.hash_stack_size, "hash_stack_size", minimum=0, maximum=_MAX_HASH_STACK_SIZE
        )
        set_field(self, "hash_stack_rounds", rounds)
        set_field(self, "hash_stack_size", size)
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
        bucket ids (see :func:`embeddb.common.routing.hash_stack`), each prefixed the same way.

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
