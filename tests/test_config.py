"""Tests of embeddb.config: YAML schema, validation errors, round trips and id encoding."""

from __future__ import annotations

import dataclasses
import pickle
import re
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from embeddb.config import (
    EmbeddingConfig,
    FeatureConfig,
    InitializerConfig,
    InitializerKind,
    OptimizerConfig,
    OptimizerKind,
    StoreConfig,
    TableConfig,
)
from embeddb.errors import ConfigError, InvalidArgumentError, TableNotFoundError

REPO = Path(__file__).resolve().parents[1]
DEFAULT_YAML = REPO / "embeddb" / "presets" / "default.yaml"
PERSIA_YAML = REPO / "examples" / "persia_embedding_config.yaml"

ADULT_TABLES = [
    "demographics",
    "workclass",
    "education",
    "marital_status",
    "occupation",
    "relationship",
    "native_country",
]


SLOTS_AB = "slots_config: {a: {dim: 4}, b: {dim: 4}}\n"


def load(text: str) -> EmbeddingConfig:
    return EmbeddingConfig.from_yaml_text(textwrap.dedent(text))


def top_bits(ids: np.ndarray, bits: int) -> np.ndarray:
    return ids >> np.uint64(64 - bits)


def low_bits(ids: np.ndarray, bits: int) -> np.ndarray:
    return ids & np.uint64((1 << (64 - bits)) - 1)


# --- the shipped files ---------------------------------------------------------------------------


def test_persia_example_loads() -> None:
    config = EmbeddingConfig.from_yaml(PERSIA_YAML)

    assert list(config.tables) == ADULT_TABLES
    assert config.feature_groups == {"demographics": ("age_bucket", "race", "gender")}
    assert config.feature_index_prefix_bit == 8
    for name in ("age_bucket", "race", "gender"):
        feature = config.features[name]
        assert (feature.table, feature.group, feature.group_index) == (
            "demographics",
            "demographics",
            0,
        )
    ungrouped = ADULT_TABLES[1:]
    for index, name in enumerate(ungrouped, start=1):
        feature = config.features[name]
        assert (feature.table, feature.group, feature.group_index) == (name, name, index)
    country = config.features["native_country"]
    assert (country.hash_stack_rounds, country.hash_stack_size) == (2, 64)
    assert all(f.dim == 8 and f.embedding_summation for f in config.features.values())
    assert all(t.dim == 8 and t.row_width == 16 for t in config.tables.values())


def test_persia_example_gets_embeddb_defaults() -> None:
    table = EmbeddingConfig.from_yaml(PERSIA_YAML).table("occupation")

    assert table.optimizer == OptimizerConfig()
    assert table.optimizer.kind is OptimizerKind.ADAGRAD
    assert table.initializer == InitializerConfig()
    assert (table.capacity, table.admit_probability, table.weight_bound) == (1_000_000, 1.0, None)
    assert table.seed == 0


def test_default_config_loads() -> None:
    config = EmbeddingConfig.from_yaml(DEFAULT_YAML)

    assert list(config.tables) == ["user", "item_id"]
    assert config.features["user_city"].table == "user"
    assert config.table("user").capacity == 100_000
    assert config.table("item_id").capacity == 200_000
    assert config.table("item_id").optimizer.eps == 1e-10
    assert config.store == StoreConfig()


# --- defaults and overrides -----------------------------------------------------------------------

OVERRIDES_YAML = """
    seed: 7
    slots_config:
      a: {dim: 4}
      b: {dim: 4, table: shared}
      c: {dim: 4, table: shared}
    defaults:
      optimizer: {type: adam, lr: 0.002, beta1: 0.8}
      initializer: {type: normal, std: 0.05}
      admit_probability: 0.5
      weight_bound: 10
      capacity: 5000
    tables:
      a: {optimizer: {lr: 0.1}, capacity: 10, seed: 3}
      shared: {optimizer: {type: sgd}, initializer: {mean: 1.0}, weight_bound: null}
      extra: {dim: 2, initializer: {type: zeros}}
"""


def test_defaults_apply_to_every_table() -> None:
    extra = load(OVERRIDES_YAML).table("extra")

    assert extra.dim == 2
    assert extra.optimizer == OptimizerConfig(
        kind=OptimizerKind.ADAM, lr=0.002, beta1=0.8, eps=1e-8
    )
    assert extra.initializer.kind is InitializerKind.ZEROS
    assert (extra.admit_probability, extra.weight_bound, extra.capacity) == (0.5, 10.0, 5000)
    assert extra.seed == 7


def test_table_section_merges_over_defaults_of_same_type() -> None:
    table = load(OVERRIDES_YAML).table("a")

    assert table.optimizer == OptimizerConfig(kind=OptimizerKind.ADAM, lr=0.1, beta1=0.8, eps=1e-8)
    assert table.initializer == InitializerConfig(kind=InitializerKind.NORMAL, std=0.05)
    assert (table.capacity, table.seed, table.weight_bound) == (10, 3, 10.0)


def test_table_section_of_another_type_replaces_defaults() -> None:
    config = load(OVERRIDES_YAML)
    shared = config.table("shared")

    assert shared.optimizer == OptimizerConfig(kind=OptimizerKind.SGD)
    assert shared.state_dim == 0
    assert shared.initializer == InitializerConfig(kind=InitializerKind.NORMAL, mean=1.0, std=0.05)
    assert shared.weight_bound is None
    assert list(config.tables) == ["a", "shared", "extra"]


def test_explicit_table_key_shares_a_table_across_groups() -> None:
    config = load(OVERRIDES_YAML)
    b, c = config.features["b"], config.features["c"]

    assert b.table == c.table == "shared"
    assert (b.group, b.group_index, c.group, c.group_index) == ("b", 1, "c", 2)
    assert not np.array_equal(b.encode([5]), c.encode([5]))


@pytest.mark.parametrize(
    ("section", "expected_eps"),
    [
        ("{type: adam}", 1e-8),
        ("{type: adam, eps: 1e-6}", 1e-6),
        ("{type: adagrad}", 1e-10),
        ("{eps: 1e-7}", 1e-7),
        ("{eps: 1.5E-7}", 1.5e-7),
    ],
)
def test_optimizer_eps_defaults_and_exponent_floats(section: str, expected_eps: float) -> None:
    config = load(f"tables: {{t: {{dim: 2, optimizer: {section}}}}}")

    assert config.table("t").optimizer.eps == expected_eps


def test_persia_slot_configs_spelling_is_accepted() -> None:
    config = load("slot_configs: {a: {dim: 3}}")

    assert config.table("a").dim == 3


def test_hash_stack_with_zero_rounds_is_disabled() -> None:
    feature = load(
        "slots_config: {a: {dim: 3, hash_stack_config: {hash_stack_rounds: 0, embedding_size: 9}}}"
    ).features["a"]

    assert (feature.hash_stack_rounds, feature.hash_stack_size) == (0, 0)
    assert feature.encode([1, 2]).shape == (2,)


# --- optimizer state and row layout ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("optimizer", "state_dim"),
    [
        (OptimizerConfig(kind=OptimizerKind.SGD), 0),
        (OptimizerConfig(kind=OptimizerKind.ADAGRAD), 8),
        (OptimizerConfig(kind=OptimizerKind.ADAGRAD, vectorwise_shared=True), 1),
        (OptimizerConfig(kind=OptimizerKind.ADAM), 17),
    ],
)
def test_state_dim_and_row_width(optimizer: OptimizerConfig, state_dim: int) -> None:
    table = TableConfig(name="t", dim=8, optimizer=optimizer)

    assert optimizer.state_dim(8) == table.state_dim == state_dim
    assert table.row_width == 8 + state_dim


# --- construction in code -----------------------------------------------------------------------


def test_single_table() -> None:
    config = EmbeddingConfig.single_table(
        "emb", 8, capacity=10, optimizer=OptimizerConfig(kind="sgd")
    )

    assert list(config.tables) == ["emb"]
    assert config.table("emb").capacity == 10
    assert config.table("emb").optimizer.kind is OptimizerKind.SGD
    assert dict(config.features) == {} and dict(config.feature_groups) == {}


def test_unknown_table_raises_table_not_found() -> None:
    config = EmbeddingConfig.single_table("emb", 8)
    with pytest.raises(TableNotFoundError, match=r"'nope'.*known tables: emb"):
        config.table("nope")


@pytest.mark.parametrize(
    ("kwargs", "key"),
    [
        ({"dim": 0}, "dim"),
        ({"dim": True}, "dim"),
        ({"dim": 4, "capacity": 0}, "capacity"),
        ({"dim": 4, "admit_probability": 0.0}, "admit_probability"),
        ({"dim": 4, "weight_bound": -1.0}, "weight_bound"),
        ({"dim": 4, "seed": -1}, "seed"),
        ({"dim": 4, "optimizer": {"type": "sgd"}}, "optimizer"),
    ],
)
def test_table_config_validates_itself(kwargs: dict[str, Any], key: str) -> None:
    with pytest.raises(ConfigError, match=rf"^{key}: ") as info:
        TableConfig(name="t", **kwargs)
    assert info.value.key == key


def test_dataclasses_normalise_numbers_and_kinds() -> None:
    table = TableConfig(
        name="t", dim=np.int64(4), admit_probability=1, weight_bound=np.float32(2.0)
    )
    optimizer = OptimizerConfig(kind="adam", lr=1)

    assert type(table.dim) is int and type(table.admit_probability) is float
    assert type(table.weight_bound) is float
    assert optimizer.kind is OptimizerKind.ADAM and type(optimizer.lr) is float
    with pytest.raises(ConfigError, match=r"^kind: unknown optimizer type 'adamw'"):
        OptimizerConfig(kind="adamw")


def test_configs_are_immutable() -> None:
    config = load(SLOTS_AB + "feature_groups: {g: [a, b]}")

    with pytest.raises(dataclasses.FrozenInstanceError):
        config.seed = 3  # type: ignore[misc]
    with pytest.raises(TypeError):
        config.tables["x"] = TableConfig(name="x", dim=1)  # type: ignore[index]
    with pytest.raises(TypeError):
        config.feature_groups["h"] = ("a",)  # type: ignore[index]


def _feature(name: str, table: str, group_index: int, **kwargs: Any) -> FeatureConfig:
    return FeatureConfig(
        name=name, table=table, dim=4, group=name, group_index=group_index, **kwargs
    )


@pytest.mark.parametrize(
    ("feature", "key"),
    [
        (_feature("f", "missing", 0), "features.f.table"),
        (_feature("f", "t", 1), "features.f.group_index"),
        (_feature("f", "t", 0, prefix_bits=4), "features.f.prefix_bits"),
        (dataclasses.replace(_feature("f", "t", 0), dim=5), "features.f.dim"),
    ],
)
def test_embedding_config_checks_consistency(feature: FeatureConfig, key: str) -> None:
    with pytest.raises(ConfigError, match=rf"^{re.escape(key)}: ") as info:
        EmbeddingConfig(tables={"t": TableConfig(name="t", dim=4)}, features={"f": feature})
    assert info.value.key == key


def test_embedding_config_checks_mapping_keys() -> None:
    with pytest.raises(ConfigError, match=r"^tables\.u: must be a TableConfig named 'u'"):
        EmbeddingConfig(tables={"u": TableConfig(name="t", dim=4)})


def test_pickle_and_hash() -> None:
    config = EmbeddingConfig.from_yaml(PERSIA_YAML)
    clone = pickle.loads(pickle.dumps(config))

    assert clone == config
    assert hash(clone) == hash(config)
    assert dataclasses.replace(config, seed=5).seed == 5


# --- encode ---------------------------------------------------------------------------------------

IDS = np.array([0, 1, 42, (1 << 63) + 7, (1 << 64) - 1], dtype=np.uint64)


def test_encode_prefixes_group_index() -> None:
    config = EmbeddingConfig.from_yaml(PERSIA_YAML)
    race, gender, education = (config.features[n] for n in ("race", "gender", "education"))

    encoded = race.encode(IDS)
    assert encoded.shape == IDS.shape and encoded.dtype == np.uint64
    assert np.array_equal(gender.encode(IDS), encoded)  # one group: one id space
    assert np.all(top_bits(encoded, 8) == 0)
    assert np.array_equal(low_bits(encoded, 8), low_bits(IDS, 8))
    other = education.encode(IDS)
    assert np.all(top_bits(other, 8) == 2)
    assert not np.any(np.isin(other, encoded))  # two groups never share a row


def test_encode_hash_stack_shape_and_prefix() -> None:
    country = EmbeddingConfig.from_yaml(PERSIA_YAML).features["native_country"]

    encoded = country.encode(IDS)
    assert encoded.shape == (IDS.size, 2) and encoded.dtype == np.uint64
    assert np.all(top_bits(encoded, 8) == 6)
    buckets = low_bits(encoded, 8)
    assert np.all(buckets[:, 0] < 64)
    assert np.all((buckets[:, 1] >= 64) & (buckets[:, 1] < 128))
    assert np.array_equal(country.encode(list(IDS[:2])), encoded[:2])


def test_encode_without_prefix_keeps_ids() -> None:
    feature = load(
        "feature_index_prefix_bit: 0\nslots_config: {a: {dim: 2}, b: {dim: 2}}"
    ).features["b"]

    assert feature.group_index == 1
    assert np.array_equal(feature.encode(IDS), IDS)


def test_encode_rejects_bad_ids() -> None:
    feature = EmbeddingConfig.from_yaml(PERSIA_YAML).features["race"]
    with pytest.raises(InvalidArgumentError):
        feature.encode(np.array([-1, 2]))
    with pytest.raises(InvalidArgumentError):
        feature.encode(np.zeros((2, 2), dtype=np.uint64))


# --- round trip over generated configs -----------------------------------------------------------

SLOT_NAMES = st.from_regex(r"[a-z][a-z0-9]{0,5}", fullmatch=True)
DIMS = st.integers(min_value=1, max_value=64)
HASH_STACKS = st.none() | st.fixed_dictionaries(
    {"hash_stack_rounds": st.integers(1, 3), "embedding_size": st.integers(1, 1000)}
)
FLOAT_KW: dict[str, Any] = {"allow_nan": False, "allow_infinity": False}

OPTIMIZER_PARAMS = {
    "sgd": {"lr": st.floats(1e-6, 1.0), "weight_decay": st.floats(0.0, 0.1)},
    "adagrad": {
        "lr": st.floats(1e-6, 1.0),
        "initial_accumulator": st.floats(0.0, 1.0),
        "eps": st.floats(1e-12, 1e-3),
        "vectorwise_shared": st.booleans(),
    },
    "adam": {
        "lr": st.floats(1e-6, 1.0),
        "beta1": st.floats(0.0, 0.999),
        "beta2": st.floats(0.0, 0.9999),
        "eps": st.floats(1e-12, 1e-3),
    },
}
INITIALIZER_PARAMS = {
    "uniform": {"low": st.floats(-1.0, 0.0), "high": st.floats(0.001, 1.0)},
    "normal": {"mean": st.floats(-1.0, 1.0), "std": st.floats(1e-4, 1.0)},
    "zeros": {},
}


@st.composite
def kinded_sections(draw: st.DrawFn, params: dict[str, dict[str, Any]]) -> dict[str, Any]:
    kind = draw(st.sampled_from(sorted(params)))
    return {"type": kind, **draw(st.fixed_dictionaries({}, optional=params[kind]))}


TABLE_SETTINGS = st.fixed_dictionaries(
    {},
    optional={
        "optimizer": kinded_sections(OPTIMIZER_PARAMS),
        "initializer": kinded_sections(INITIALIZER_PARAMS),
        "admit_probability": st.floats(0.0, 1.0, exclude_min=True, **FLOAT_KW),
        "weight_bound": st.none() | st.floats(1e-3, 10.0),
        "capacity": st.integers(1, 10**7),
    },
)


@st.composite
def config_dicts(draw: st.DrawFn) -> dict[str, Any]:
    names = draw(st.lists(SLOT_NAMES, min_size=1, max_size=6, unique=True))
    group_names = [f"grp_{i}" for i in range(draw(st.integers(0, 2)))]
    group_of = {name: draw(st.sampled_from([None, *group_names])) for name in names}
    groups = {g: [n for n in names if group_of[n] == g] for g in group_names}
    groups = {g: members for g, members in groups.items() if members}
    shape = {g: (draw(DIMS), draw(HASH_STACKS)) for g in groups}
    slots: dict[str, Any] = {}
    for name in names:
        group = group_of[name]
        dim, stack = shape[group] if group in shape else (draw(DIMS), draw(HASH_STACKS))
        slot: dict[str, Any] = {"dim": dim}
        if stack is not None:
            slot["hash_stack_config"] = stack
        if draw(st.booleans()):
            slot.update(
                sqrt_scaling=draw(st.booleans()), sample_fixed_size=draw(st.integers(1, 50))
            )
        slots[name] = slot
    data: dict[str, Any] = {"slots_config": slots, "feature_groups": groups}
    data["feature_index_prefix_bit"] = draw(st.sampled_from([0, 4, 8, 32]))
    data["seed"] = draw(st.integers(0, 2**32))
    data["defaults"] = draw(TABLE_SETTINGS)
    table_names = [*groups, *(n for n in names if group_of[n] is None)]
    overridden = draw(st.lists(st.sampled_from(table_names), unique=True))
    data["tables"] = {name: draw(TABLE_SETTINGS) for name in overridden}
    for i in range(draw(st.integers(0, 2))):
        data["tables"][f"extra_{i}"] = {"dim": draw(DIMS), **draw(TABLE_SETTINGS)}
    data["store"] = {"stripes": draw(st.sampled_from([1, 2, 4, 64])), "eviction_chunk": 0.25}
    return data


@pytest.mark.slow
@settings(max_examples=150, deadline=None)
@given(config_dicts())
def test_to_dict_round_trips(data: dict[str, Any]) -> None:
    config = EmbeddingConfig.from_dict(data)
    plain = config.to_dict()

    assert EmbeddingConfig.from_dict(plain) == config
    assert EmbeddingConfig.from_dict(plain).to_dict() == plain
    assert EmbeddingConfig.from_yaml_text(yaml.safe_dump(plain, sort_keys=False)) == config
    assert pickle.loads(pickle.dumps(config)) == config


@pytest.mark.slow
@settings(max_examples=50, deadline=None)
@given(config_dicts())
def test_generated_configs_keep_group_invariants(data: dict[str, Any]) -> None:
    config = EmbeddingConfig.from_dict(data)
    ids = np.arange(5, dtype=np.uint64)

    by_group: dict[str, np.ndarray] = {}
    for feature in config.features.values():
        table = config.table(feature.table)
        assert table.dim == feature.dim
        encoded = feature.encode(ids)
        expected_shape = (5, feature.hash_stack_rounds) if feature.hash_stack_rounds else (5,)
        assert encoded.shape == expected_shape
        if feature.group in by_group:
            assert np.array_equal(by_group[feature.group], encoded)
        by_group[feature.group] = encoded
    if config.feature_index_prefix_bit:
        prefixes = {
            g: int(top_bits(e, config.feature_index_prefix_bit).flat[0])
            for g, e in by_group.items()
        }
        assert len(set(prefixes.values())) == len(prefixes)
