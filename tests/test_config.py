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


# --- errors ---------------------------------------------------------------------------------------

SLOTS_AB = "slots_config: {a: {dim: 4}, b: {dim: 4}}\n"
SLOT_A = "slots_config: {a: {dim: 4}}\n"


def each_value(
    key: str, yaml: str, fragment: str, *values: object
) -> list[tuple[str, str, str, str]]:
    """One error case per bad value of ``key``: ``yaml % value``, id ``key=value``."""
    return [(f"{key}={value}", yaml % (value,), key, fragment) for value in values]


ERROR_CASES: list[tuple[str, str, str, str]] = [
    # (id, yaml, key path, message fragment)
    ("top-unknown", "slotsconfig: {a: {dim: 4}}", "slotsconfig", "did you mean 'slots_config'"),
    (
        "slot-unknown",
        "slots_config: {a: {dim: 4, dimm: 3}}",
        "slots_config.a.dimm",
        "did you mean 'dim'",
    ),
    (
        "hash-stack-unknown",
        "slots_config: {a: {dim: 4, hash_stack_config: {hash_stack_round: 2, embedding_size: 9}}}",
        "slots_config.a.hash_stack_config.hash_stack_round",
        "did you mean 'hash_stack_rounds'",
    ),
    (
        "defaults-unknown",
        SLOT_A + "defaults: {capacityy: 3}",
        "defaults.capacityy",
        "did you mean 'capacity'",
    ),
    (
        "optimizer-unknown",
        SLOT_A + "defaults: {optimizer: {type: adam, beta_1: 0.9}}",
        "defaults.optimizer.beta_1",
        "did you mean 'beta1'",
    ),
    (
        "initializer-unknown",
        SLOT_A + "defaults: {initializer: {type: normal, stdev: 0.1}}",
        "defaults.initializer.stdev",
        "did you mean 'std'",
    ),
    (
        "table-unknown",
        "tables: {t: {dim: 4, capacty: 5}}",
        "tables.t.capacty",
        "did you mean 'capacity'",
    ),
    ("store-unknown", SLOT_A + "store: {stripe: 4}", "store.stripe", "did you mean 'stripes'"),
    ("dim-missing", "slots_config: {a: {sqrt_scaling: true}}", "slots_config.a.dim", "required"),
    ("dim-null-slot", "slots_config: {a: }", "slots_config.a.dim", "required"),
    ("dim-zero", "slots_config: {a: {dim: 0}}", "slots_config.a.dim", "integer >= 1"),
    ("dim-negative", "slots_config: {a: {dim: -3}}", "slots_config.a.dim", "integer >= 1"),
    (
        "dim-bool",
        "slots_config: {a: {dim: true}}",
        "slots_config.a.dim",
        "must be an integer, got bool",
    ),
    ("dim-float", "slots_config: {a: {dim: 8.0}}", "slots_config.a.dim", "must be an integer"),
    ("dim-string", "slots_config: {a: {dim: '8'}}", "slots_config.a.dim", "must be an integer"),
    ("table-dim-zero", "tables: {t: {dim: 0}}", "tables.t.dim", "integer >= 1"),
    (
        "feature-named-like-group",
        SLOTS_AB + "feature_groups: {a: [b]}",
        "feature_groups.a",
        "both a feature group and a feature",
    ),
    (
        "feature-in-two-groups",
        SLOTS_AB + "feature_groups: {g1: [a], g2: [a, b]}",
        "feature_groups.g2",
        "'a' is already in group 'g1'",
    ),
    (
        "feature-twice-in-group",
        SLOTS_AB + "feature_groups: {g: [a, a]}",
        "feature_groups.g",
        "already in group 'g'",
    ),
    (
        "group-unknown-feature",
        SLOTS_AB + "feature_groups: {g: [a, c]}",
        "feature_groups.g",
        "unknown feature 'c'",
    ),
    ("group-empty", SLOTS_AB + "feature_groups: {g: []}", "feature_groups.g", "empty group"),
    ("group-not-list", SLOTS_AB + "feature_groups: {g: a}", "feature_groups.g", "must be a list"),
    (
        "too-many-groups",
        "feature_index_prefix_bit: 1\nslots_config: {a: {dim: 4}, b: {dim: 4}, c: {dim: 4}}",
        "feature_index_prefix_bit",
        "3 feature groups",
    ),
    *each_value(
        "feature_index_prefix_bit", SLOT_A + "feature_index_prefix_bit: %s", "[0, 32]", 33, -1
    ),
    ("capacity-zero", SLOT_A + "defaults: {capacity: 0}", "defaults.capacity", "integer >= 1"),
    ("capacity-table", SLOT_A + "tables: {a: {capacity: -5}}", "tables.a.capacity", "integer >= 1"),
    (
        "admit-zero",
        SLOT_A + "defaults: {admit_probability: 0}",
        "defaults.admit_probability",
        "(0, 1]",
    ),
    (
        "admit-above-one",
        SLOT_A + "tables: {a: {admit_probability: 1.5}}",
        "tables.a.admit_probability",
        "(0, 1]",
    ),
    ("weight-bound-zero", SLOT_A + "defaults: {weight_bound: 0}", "defaults.weight_bound", "> 0"),
    (
        "weight-bound-negative",
        SLOT_A + "tables: {a: {weight_bound: -1}}",
        "tables.a.weight_bound",
        "> 0",
    ),
    (
        "optimizer-type-unknown",
        "tables: {t: {dim: 4, optimizer: {type: adamw}}}",
        "tables.t.optimizer.type",
        "unknown optimizer type 'adamw' (did you mean 'adam'?)",
    ),
    (
        "initializer-type-unknown",
        "tables: {t: {dim: 4, initializer: {type: gaussian}}}",
        "tables.t.initializer.type",
        "unknown initializer type 'gaussian'",
    ),
    ("lr-zero", SLOT_A + "defaults: {optimizer: {lr: 0}}", "defaults.optimizer.lr", "> 0"),
    (
        "lr-negative",
        "tables: {t: {dim: 4, optimizer: {type: sgd, lr: -0.1}}}",
        "tables.t.optimizer.lr",
        "> 0",
    ),
    (
        "uniform-low-not-below-high",
        SLOT_A + "defaults: {initializer: {type: uniform, low: 0.1, high: 0.1}}",
        "defaults.initializer.low",
        "less than high",
    ),
    (
        "normal-std-zero",
        SLOT_A + "defaults: {initializer: {type: normal, std: 0}}",
        "defaults.initializer.std",
        "> 0",
    ),
    (
        "beta1-one",
        SLOT_A + "defaults: {optimizer: {type: adam, beta1: 1.0}}",
        "defaults.optimizer.beta1",
        "[0, 1)",
    ),
    (
        "beta2-negative",
        SLOT_A + "defaults: {optimizer: {type: adam, beta2: -0.1}}",
        "defaults.optimizer.beta2",
        "[0, 1)",
    ),
    ("eps-zero", SLOT_A + "defaults: {optimizer: {eps: 0}}", "defaults.optimizer.eps", "> 0"),
    (
        "eps-adam-negative",
        SLOT_A + "defaults: {optimizer: {type: adam, eps: -1e-8}}",
        "defaults.optimizer.eps",
        "> 0",
    ),
    (
        "optimizer-key-of-other-type",
        SLOT_A + "defaults: {optimizer: {type: sgd, eps: 1e-8}}",
        "defaults.optimizer.eps",
        "does not apply to optimizer type 'sgd'",
    ),
    (
        "zeros-initializer-takes-nothing",
        SLOT_A + "defaults: {initializer: {type: zeros, low: -1}}",
        "defaults.initializer.low",
        "takes no parameters",
    ),
    # store: the YAML is flat, StoreConfig grouped; errors name the YAML key
    *each_value("store.stripes", SLOT_A + "store: {stripes: %s}", "power of two", 3),
    *each_value("store.stripes", SLOT_A + "store: {stripes: %s}", "[1, 64]", 0, 128),
    *each_value(
        "store.eviction_chunk", SLOT_A + "store: {eviction_chunk: %s}", "(0, 0.5]", 0, 0.75
    ),
    *each_value("store.disk_cache_mb", SLOT_A + "store: {disk_cache_mb: %s}", ">= 1", 0),
    *each_value("store.parallel_min_ids", SLOT_A + "store: {parallel_min_ids: %s}", ">= 1", 0),
    *each_value(
        "store.update_log", SLOT_A + "store: {update_log: %s}", "true or false", "yes please"
    ),
    *each_value(
        "store.fsync", SLOT_A + "store: {fsync: %s}", "expected one of: always", "sometimes"
    ),
    *each_value("store.log_segment_mb", SLOT_A + "store: {log_segment_mb: %s}", ">= 1", 0),
    *each_value("store.snapshot_retention", SLOT_A + "store: {snapshot_retention: %s}", ">= 1", 0),
    *each_value("store.export_dir", SLOT_A + "store: {export_dir: %s}", "directory path", "' '"),
    (
        "feature-name-space",
        "slots_config: {'a b': {dim: 4}}",
        "slots_config",
        "feature name must be",
    ),
    ("feature-name-empty", "slots_config: {'': {dim: 4}}", "slots_config", "feature name must be"),
    ("feature-name-int", "slots_config: {3: {dim: 4}}", "slots_config", "feature name must be"),
    (
        "group-name-slash",
        SLOTS_AB + "feature_groups: {g/1: [a]}",
        "feature_groups",
        "group name must be",
    ),
    ("table-name-space", "tables: {'x y': {dim: 4}}", "tables", "table name must be"),
    ("table-name-dots", "tables: {'..': {dim: 4}}", "tables", "table name must be"),
    (
        "explicit-table-name",
        "slots_config: {a: {dim: 4, table: 'x y'}}",
        "slots_config.a.table",
        "table name must be",
    ),
    (
        "group-dim-mismatch",
        "slots_config: {a: {dim: 4}, b: {dim: 8}}\nfeature_groups: {g: [a, b]}",
        "slots_config.b.dim",
        "both read table 'g'",
    ),
    (
        "explicit-table-dim-mismatch",
        "slots_config: {a: {dim: 4}, b: {dim: 8, table: a}}",
        "slots_config.b.dim",
        "both read table 'a'",
    ),
    (
        "tables-dim-mismatch",
        SLOT_A + "tables: {a: {dim: 8}}",
        "tables.a.dim",
        "differs from dim 4 of feature 'a'",
    ),
    ("standalone-table-no-dim", SLOT_A + "tables: {t: {capacity: 3}}", "tables.t.dim", "required"),
    ("standalone-table-null", SLOT_A + "tables: {t: }", "tables.t.dim", "required"),
    (
        "hash-stack-share-mismatch",
        "slots_config:\n"
        "  a: {dim: 4, hash_stack_config: {hash_stack_rounds: 2, embedding_size: 10}}\n"
        "  b: {dim: 4, hash_stack_config: {hash_stack_rounds: 2, embedding_size: 20}}\n"
        "feature_groups: {g: [a, b]}",
        "slots_config.b.hash_stack_config",
        "both read table 'g'",
    ),
    (
        "hash-stack-vs-plain",
        "slots_config:\n"
        "  a: {dim: 4, hash_stack_config: {hash_stack_rounds: 2, embedding_size: 10}}\n"
        "  b: {dim: 4, table: a}",
        "slots_config.b.hash_stack_config",
        "both read table 'a'",
    ),
    (
        "hash-stack-no-size",
        "slots_config: {a: {dim: 4, hash_stack_config: {hash_stack_rounds: 2}}}",
        "slots_config.a.hash_stack_config.embedding_size",
        "must be > 0",
    ),
    (
        "hash-stack-negative-rounds",
        "slots_config: {a: {dim: 4,"
        " hash_stack_config: {hash_stack_rounds: -1, embedding_size: 9}}}",
        "slots_config.a.hash_stack_config.hash_stack_rounds",
        "integer >= 0",
    ),
    (
        "hash-stack-size-too-big",
        "slots_config: {a: {dim: 4,"
        " hash_stack_config: {hash_stack_rounds: 1, embedding_size: 8589934592}}}",
        "slots_config.a.hash_stack_config.embedding_size",
        "[0, 4294967296]",
    ),
    (
        "sample-fixed-size-zero",
        "slots_config: {a: {dim: 4, sample_fixed_size: 0}}",
        "slots_config.a.sample_fixed_size",
        ">= 1",
    ),
    (
        "summation-not-bool",
        "slots_config: {a: {dim: 4, embedding_summation: 1}}",
        "slots_config.a.embedding_summation",
        "true or false",
    ),
    ("slots-not-mapping", "slots_config: [a, b]", "slots_config", "must be a mapping"),
    ("defaults-not-mapping", SLOT_A + "defaults: 3", "defaults", "must be a mapping"),
    (
        "two-slot-sections",
        "slots_config: {a: {dim: 4}}\nslot_configs: {b: {dim: 4}}",
        "slot_configs",
        "duplicates 'slots_config'",
    ),
    ("no-tables", "seed: 1", "tables", "no tables"),
    ("seed-negative", SLOT_A + "seed: -1", "seed", "integer >= 0"),
    ("table-seed-negative", SLOT_A + "tables: {a: {seed: -1}}", "tables.a.seed", "integer >= 0"),
    ("lr-nan", SLOT_A + "defaults: {optimizer: {lr: .nan}}", "defaults.optimizer.lr", "finite"),
]


@pytest.mark.parametrize(
    ("text", "key", "fragment"),
    [case[1:] for case in ERROR_CASES],
    ids=[case[0] for case in ERROR_CASES],
)
def test_invalid_config_names_the_key(text: str, key: str, fragment: str) -> None:
    pattern = rf"^{re.escape(key)}: .*{re.escape(fragment)}"
    with pytest.raises(ConfigError, match=pattern) as info:
        EmbeddingConfig.from_yaml_text(text)
    assert info.value.key == key


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("- a\n- b\n", "top level must be a mapping"),
        ("42\n", "top level must be a mapping"),
        ("", "config is empty"),
        ("# only a comment\n", "config is empty"),
    ],
)
def test_top_level_must_be_a_mapping(text: str, fragment: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(fragment)):
        EmbeddingConfig.from_yaml_text(text)


def test_yaml_syntax_error_is_wrapped() -> None:
    with pytest.raises(ConfigError, match=r"^conf\.yaml: invalid YAML") as info:
        EmbeddingConfig.from_yaml_text("slots_config: {a: [", source="conf.yaml")
    assert isinstance(info.value.__cause__, yaml.YAMLError)


def test_duplicate_yaml_key_is_an_error() -> None:
    with pytest.raises(ConfigError, match="found duplicate key 'a'"):
        load(
            """
            slots_config:
              a: {dim: 4}
              a: {dim: 8}
            """
        )


def test_yaml_merge_keys_still_work() -> None:
    config = load(
        """
        slots_config:
          a: &base {dim: 4, sqrt_scaling: true}
          b: {<<: *base, dim: 6}
        """
    )
    assert (config.features["b"].dim, config.features["b"].sqrt_scaling) == (6, True)


def test_missing_file_names_the_path(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError, match=re.escape(str(missing))) as info:
        EmbeddingConfig.from_yaml(missing)
    assert isinstance(info.value.__cause__, FileNotFoundError)


def test_directory_is_not_a_config_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read config file"):
        EmbeddingConfig.from_yaml(tmp_path)


def test_file_errors_name_key_and_file(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("slots_config: {age: {dim: 0}}\n", encoding="utf-8")
    with pytest.raises(
        ConfigError, match=r"^slots_config\.age\.dim: .*\(in .*bad\.yaml\)$"
    ) as info:
        EmbeddingConfig.from_yaml(str(path))
    assert info.value.key == "slots_config.age.dim"


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


@settings(max_examples=150, deadline=None)
@given(config_dicts())
def test_to_dict_round_trips(data: dict[str, Any]) -> None:
    config = EmbeddingConfig.from_dict(data)
    plain = config.to_dict()

    assert EmbeddingConfig.from_dict(plain) == config
    assert EmbeddingConfig.from_dict(plain).to_dict() == plain
    assert EmbeddingConfig.from_yaml_text(yaml.safe_dump(plain, sort_keys=False)) == config
    assert pickle.loads(pickle.dumps(config)) == config


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
