"""One name and one validator per ``store:`` setting.

Each setting is named by its ``store:`` key everywhere: the YAML file, a command-line flag
(``--`` + the key with dashes), the flag's variable (``EMBEDDB_<COMMAND>_<KEY>``) and every
error message, including the one a dataclass built in code raises. Its only validator is its
dataclass's: the YAML file, ``store_from_keys``, the dataclass's own keyword and the
command line all reach it and print the same message.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import click
import pytest
import yaml
from click.testing import CliRunner

from embeddb.cli import main
from embeddb.cli.envvars import from_environment
from embeddb.cli.options import StoreSetting, store_flag, store_option
from embeddb.config import EmbeddingConfig, StoreConfig
from embeddb.config.schema import STORE_KEYS, store_from_keys
from embeddb.errors import ConfigError

# A bad value of every store: key, as YAML text, and the message its dataclass gives it.
BAD_VALUES: dict[str, tuple[str, str]] = {
    "stripes": ("3", "must be a power of two, got 3"),
    "eviction_chunk": ("0.75", "must be a finite number in (0, 0.5], got 0.75"),
    "min_stripe_rows": ("0", "must be an integer >= 1, got 0"),
    "ram_budget": ("4 GiBs", "must be a byte count: an integer or a number with a unit"),
    "disk_cache_mb": ("0", "must be an integer >= 1, got 0"),
    "threads": ("257", "must be an integer in [0, 256], got 257"),
    "parallel_min_ids": ("0", "must be an integer >= 1, got 0"),
    "update_log": ("maybe", "must be true or false, got 'maybe'"),
    "fsync": ("alway", "unknown fsync policy 'alway' (did you mean 'always'?)"),
    "fsync_interval_ms": ("0", "must be a finite number in (0, 60000], got 0.0"),
    "log_segment_mb": ("0", "must be an integer >= 1, got 0"),
    "log_lz4_min_bytes": ("-1", "must be an integer >= 0, got -1"),
    "log_recovery": ("point_in_tme", "unknown log recovery mode 'point_in_tme'"),
    "snapshot_retention": ("0", "must be an integer >= 1, got 0"),
    "export_dir": ("5", "must be a directory path or null, got int 5"),
    "export_interval_s": ("0", "must be a finite number in (0, 86400], got 0.0"),
}
# The commands that take store: settings as flags.
COMMANDS = ("serve", "cluster")


def test_every_store_key_has_a_bad_value_here() -> None:
    assert sorted(BAD_VALUES) == sorted(STORE_KEYS)


def _message(exc: ConfigError) -> str:
    return str(exc).removeprefix(f"{exc.key}: ")


@pytest.mark.parametrize("key", sorted(STORE_KEYS))
def test_yaml_code_and_keys_reach_one_validator(key: str, tmp_path: Path) -> None:
    text, expected = BAD_VALUES[key]
    value = yaml.safe_load(text)
    path = tmp_path / "bad.yaml"
    path.write_text(f"slots_config: {{a: {{dim: 4}}}}\nstore:\n  {key}: {text}\n")
    with pytest.raises(ConfigError) as from_file:
        EmbeddingConfig.from_yaml(path)
    group, name = STORE_KEYS[key]
    group_type = type(getattr(StoreConfig(), group))
    with pytest.raises(ConfigError) as from_code:
        group_type(**{name: value})  # the dataclass's own keyword
    with pytest.raises(ConfigError) as from_keys:
        store_from_keys({key: value})
    assert from_file.value.key == f"store.{key}"
    message = _message(from_code.value)
    assert str(from_file.value) == f"store.{key}: {message} (in {path}:3)"  # file:line
    assert from_code.value.key == from_keys.value.key == key  # the YAML key, not the field
    assert str(from_code.value) == str(from_keys.value)
    assert expected in str(from_code.value)


def _toy() -> click.Command:
    def body(**settings: Any) -> None:
        click.echo(repr({k: v for k, v in sorted(settings.items()) if v is not None}))

    command: Any = body
    for key in STORE_KEYS:
        command = store_option(key, help=key)(command)
    return from_environment("toy")(click.command("toy")(command))


@pytest.mark.parametrize("key", sorted(STORE_KEYS))
def test_a_flag_and_its_variable_reach_the_same_validator(key: str) -> None:
    text, _ = BAD_VALUES[key]
    value = yaml.safe_load(text)
    with pytest.raises(ConfigError) as from_keys:
        store_from_keys({key: value})
    flag = store_flag(key)
    variable = "EMBEDDB_TOY_" + key.upper()
    assert flag == "--" + key.replace("_", "-")
    by_flag = CliRunner().invoke(_toy(), [flag, text])
    by_variable = CliRunner().invoke(_toy(), [], env={variable: text})
    for result in (by_flag, by_variable):
        assert result.exit_code == 2, result.output
        assert f"Invalid value for '{flag}'" in result.output
        assert str(from_keys.value) in result.output  # "KEY: the dataclass's message"
        assert "Traceback" not in result.output


def test_a_flag_gives_the_value_the_dataclass_normalised() -> None:
    result = CliRunner().invoke(
        _toy(), ["--fsync", "always", "--threads", "0", "--fsync-interval-ms", "2"]
    )
    assert result.exit_code == 0, result.output
    assert result.output.strip() == (
        "{'fsync': <FsyncPolicy.ALWAYS: 'always'>, 'fsync_interval_ms': 2.0, 'threads': 0}"
    )


def test_a_setting_option_names_a_store_key() -> None:
    with pytest.raises(LookupError, match="'log_segment' is not a store: key"):
        StoreSetting("log_segment")


def _command(name: str) -> click.Command:
    found = main.get_command(click.Context(main), name)
    assert found is not None, name
    return found


def _options(command: str) -> list[click.Option]:
    return [p for p in _command(command).params if isinstance(p, click.Option)]


@pytest.mark.parametrize("command", COMMANDS)
def test_command_flags_of_store_keys_use_the_dataclass_validator(command: str) -> None:
    flags = {store_flag(key): key for key in STORE_KEYS}
    settings = [o for o in _options(command) if set(o.opts) & set(flags)]
    assert settings, f"embeddb {command} takes no store: setting (renamed?)"
    for option in settings:
        (flag,) = option.opts
        key = flags[flag]
        assert isinstance(option.type, StoreSetting) and option.type.key == key, flag
        assert option.name == key
        variable = f"EMBEDDB_{command}_{key}".upper()
        variables = [option.envvar] if isinstance(option.envvar, str) else option.envvar
        assert variables is not None and variable in variables


@pytest.mark.parametrize("command", COMMANDS)
def test_threads_flag_takes_what_the_yaml_key_takes(command: str) -> None:
    (option,) = [o for o in _options(command) if "--threads" in o.opts]
    ctx = click.Context(_command(command))
    for value in (0, 1, 256):  # 0: every CPU, as `store: {threads: 0}`
        assert option.type.convert(str(value), option, ctx) == value
        assert store_from_keys({"threads": value}).parallel.threads == value
    with pytest.raises(click.BadParameter, match=r"threads: must be an integer in \[0, 256\]"):
        option.type.convert("257", option, ctx)


def test_store_keys_name_every_field_once() -> None:
    fields = [
        (group.name, f.name)
        for group in dataclasses.fields(StoreConfig)
        for f in dataclasses.fields(getattr(StoreConfig(), group.name))
    ]
    assert sorted(STORE_KEYS.values()) == sorted(fields)
    assert len(set(STORE_KEYS.values())) == len(STORE_KEYS)
