"""Tests of embeddb.config's errors: every invalid key, value and file is named precisely."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest
import yaml

from embeddb.config import (
    EmbeddingConfig,
)
from embeddb.errors import ConfigError

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
        ConfigError, match=r"^slots_config\.age\.dim: .*\(in .*bad\.yaml:1\)$"
    ) as info:
        EmbeddingConfig.from_yaml(str(path))
    assert info.value.key == "slots_config.age.dim"


@pytest.mark.parametrize(
    ("text", "key", "line"),
    [
        ("slots_config:\n  a: {dim: 4}\nstore:\n  threads: 2\n  fsync: alway\n", "store.fsync", 5),
        (
            "slots_config:\n  a: {dim: 4}\ntables:\n  a:\n    optimizer:\n      type: sgd\n"
            "      lr: -1\n",
            "tables.a.optimizer.lr",
            7,
        ),
        # a missing key is reported at the entry that lacks it
        (
            "seed: 1\nslots_config:\n  a: {dim: 4}\n  b: {sqrt_scaling: true}\n",
            "slots_config.b.dim",
            4,
        ),
        # a table name with a dot is one component of the path
        ("slots_config:\n  a: {dim: 4}\ntables:\n  x.y:\n    dim: 0\n", "tables.x.y.dim", 5),
    ],
)
def test_file_errors_name_the_line_of_the_key(
    tmp_path: Path, text: str, key: str, line: int
) -> None:
    path = tmp_path / "conf.yaml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        EmbeddingConfig.from_yaml(path)
    assert info.value.key == key
    assert str(info.value).endswith(f" (in {path}:{line})")


def test_an_error_of_the_whole_file_names_the_file_only(tmp_path: Path) -> None:
    path = tmp_path / "conf.yaml"
    path.write_text("seed: 1\n", encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        EmbeddingConfig.from_yaml(path)
    assert info.value.key == "tables"  # no tables: no line to point at
    assert str(info.value).endswith(f" (in {path})")
