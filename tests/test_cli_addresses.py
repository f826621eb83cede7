"""One spelling of the shards' addresses in every command: ``--addresses A,B`` (repeatable) or
``--addresses @FILE``, parsed by one shared option; the spellings of earlier releases still
work, each with one deprecation line on stderr (not a Python warning: the tests turn warnings
into errors)."""

from __future__ import annotations

from pathlib import Path

import click
import pytest
from click.testing import CliRunner, Result

from embeddb.cli.app import COMMANDS, main
from embeddb.cli.target import LEGACY_ADDRESS_OPTIONS, addresses_option


@click.command()
@addresses_option("The shards.", legacy=tuple(LEGACY_ADDRESS_OPTIONS))
def echo(addresses: tuple[str, ...]) -> None:
    """Print the addresses the option gathered, one per line."""
    click.echo("\n".join(addresses))


def run(*args: str) -> Result:
    return CliRunner().invoke(echo, list(args))


@pytest.fixture
def address_file(tmp_path: Path) -> Path:
    path = tmp_path / "addresses.txt"
    path.write_text("# shard 0\n10.0.0.1:7070\n\n10.0.0.2:7070  # shard 1\n")
    return path


def test_a_comma_list_repeated_and_an_address_file(address_file: Path) -> None:
    result = run("--addresses", "a:1,b:2", "--addresses", " c:3 ")
    assert result.exit_code == 0, result.output
    assert result.stdout.split() == ["a:1", "b:2", "c:3"] and result.stderr == ""
    result = run("--addresses", f"@{address_file}")
    assert result.exit_code == 0, result.output
    assert result.stdout.split() == ["10.0.0.1:7070", "10.0.0.2:7070"] and result.stderr == ""
    assert run().stdout.strip() == ""  # none given: the command decides


@pytest.mark.parametrize(
    ("args", "old", "new"),
    [
        (["--address", "10.0.0.1:7070", "--address", "10.0.0.2:7070"], "--address", "A,B"),
        (["--address-file", "{file}"], "--address-file", "@FILE"),
        (["--shard", "10.0.0.1:7070", "--shard", "10.0.0.2:7070"], "--shard", "A,B"),
        (["--addresses", "{file}"], "--addresses FILE", "--addresses @FILE"),
    ],
)
def test_the_old_spellings_work_with_one_deprecation_line(
    address_file: Path, args: list[str], old: str, new: str
) -> None:
    result = run(*(a.format(file=address_file) for a in args))
    assert result.exit_code == 0, result.output
    assert result.stdout.split() == ["10.0.0.1:7070", "10.0.0.2:7070"]
    [line] = result.stderr.splitlines()
    assert line.startswith(f"Warning: {old} is deprecated") and "use --addresses" in line
    assert new.replace("A,B", "HOST:PORT,...").replace("--addresses ", "") in line


def test_bad_addresses_are_usage_errors_and_a_missing_file_one_error_line(tmp_path: Path) -> None:
    result = run("--addresses", "10.0.0.1:7070,nohost")
    assert result.exit_code == 2 and "'nohost' is not HOST:PORT" in result.stderr
    result = run("--addresses", ",")
    assert result.exit_code == 2 and "names no address" in result.stderr
    result = run("--addresses", "a:1", "--shard", "b:2")
    assert result.exit_code == 2 and "give the shards' addresses once" in result.stderr
    missing = tmp_path / "missing.txt"
    result = run("--addresses", f"@{missing}")
    assert result.exit_code == 1
    [line] = result.stderr.splitlines()
    assert line.startswith("Error: ") and str(missing) in line and "cannot read" in line


def _options(name: str) -> list[click.Option]:
    command = main.get_command(click.Context(main), name)
    assert command is not None
    return [p for p in command.params if isinstance(p, click.Option)]


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_command_spells_the_shards_addresses_one_way(name: str) -> None:
    """No command shows an old spelling in --help (``embeddb cluster --address-file`` is the
    file it writes, not addresses to read); those that keep one hide it and show --addresses
    with the shared metavar."""
    options = _options(name)
    visible = {opt for o in options if not o.hidden for opt in o.opts}
    if name == "cluster":
        visible.discard("--address-file")
    assert not visible & set(LEGACY_ADDRESS_OPTIONS), name
    hidden = {opt for o in options if o.hidden for opt in o.opts}
    if hidden & set(LEGACY_ADDRESS_OPTIONS):
        [shared] = [o for o in options if "--addresses" in o.opts]
        assert shared.metavar == "HOST:PORT,...|@FILE" and shared.multiple


def test_the_commands_that_reach_shards_all_take_addresses() -> None:
    takes = {name for name in COMMANDS if any("--addresses" in o.opts for o in _options(name))}
    assert {"tables", "stats", "peek", "scan", "populate", "snapshot", "serve-model"} <= takes
    assert "torchserve-archive" in takes


def test_the_trainer_entry_point_takes_the_same_spelling(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``python -m embeddb.trainer.launcher.run`` (what torchrun starts; Kubernetes manifests call
    it)
    parses ``--addresses`` with the client's parser, the one behind the CLI's option."""
    from embeddb.errors import ConfigError
    from embeddb.trainer.launcher.run import _shards

    address_file = tmp_path / "shards.txt"
    address_file.write_text("a:1\n# comment\nb:2\n")
    assert _shards(["a:1,b:2", "c:3"]) == ("a:1", "b:2", "c:3")
    assert _shards([f"@{address_file}"]) == ("a:1", "b:2")
    assert capsys.readouterr().err == ""
    assert _shards([str(address_file)]) == ("a:1", "b:2")  # earlier releases' spelling
    assert capsys.readouterr().err.startswith("Warning: --addresses FILE is deprecated")
    with pytest.raises(ConfigError, match="'nohost' is not HOST:PORT"):
        _shards(["a:1,nohost"])
    with pytest.raises(ConfigError, match="cannot read the shard address file"):
        _shards([f"@{tmp_path / 'missing.txt'}"])
