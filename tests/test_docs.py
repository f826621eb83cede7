"""The documentation in docs/ against the code: generated reference, commands, examples, metrics,
install ranges. (Every file the docs name is checked by tests/test_doc_references.py.)"""

from __future__ import annotations

import functools
import importlib.util
import re
import shlex
from pathlib import Path
from types import ModuleType

import click
import pytest
import tomllib
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from prometheus_client import CollectorRegistry

from embeddb.cli import main as cli_main
from embeddb.config import OptimizerConfig, OptimizerKind, schema
from embeddb.config.reference import attribute_docs, render_reference

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
PAGES = sorted(DOCS.glob("*.md"))
#: Pages whose ```python blocks are complete programs, run by a test.
RUNNABLE_PAGES = ("database.md", "api.md")


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("docs_generate", DOCS / "generate.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_docs_exist() -> None:
    names = {p.name for p in PAGES}
    assert {"operations.md", "configuration.md", "persia-migration.md", "own-data.md"} <= names
    assert {"architecture.md", "style.md", "install.md", "training.md", "database.md"} <= names
    assert {"api.md", "durability.md", "serving.md", "performance.md", "development.md"} <= names


def test_the_configuration_reference_is_fresh() -> None:
    expected = _generator().render()
    current = (DOCS / "configuration.md").read_text(encoding="utf-8")
    assert current == expected, (
        "docs/configuration.md is stale: regenerate it with `python docs/generate.py`"
    )


def test_the_reference_covers_every_store_key_and_optimizer_parameter() -> None:
    text = render_reference()
    for name in schema.STORE_KEYS:
        assert f"| `{name}` |" in text
    for name in ("lr", "initial_accumulator", "vectorwise_shared", "beta1", "beta2", "eps"):
        assert f"| `{name}` |" in text
    assert "`adam` 2 x dim + 1" in text  # the state layout, derived from OptimizerConfig
    assert OptimizerConfig(kind=OptimizerKind.ADAM).state_dim(16) == 33


def test_attribute_docs_parses_google_style_sections() -> None:
    class Example:
        """Summary.

        Attributes:
            alpha: first line
                continued here.
            beta (int): second.

        Raises:
            ValueError: not an attribute.
        """

    assert attribute_docs(Example) == {"alpha": "first line continued here.", "beta": "second."}


def test_a_stale_reference_is_detected(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    generator = _generator()
    stale = tmp_path / "configuration.md"
    stale.write_text(generator.render().replace("lock stripes", "lock strips"), encoding="utf-8")
    monkeypatch.setattr(generator, "OUTPUT", stale)
    assert generator.main(["--check"]) == 1
    assert generator.main([]) == 0
    assert generator.main(["--check"]) == 0


# ------------------------------------------------------------------------------ commands


def _code_blocks(text: str) -> list[str]:
    """Bodies of fenced shell blocks (```bash, ```sh, ```console or bare ```)."""
    blocks: list[str] = []
    body: list[str] | None = None
    shell = False
    for line in text.splitlines():
        if line.startswith("```"):
            if body is None:
                body, shell = [], line[3:].strip() in {"", "bash", "sh", "console"}
            else:
                if shell:
                    blocks.append("\n".join(body))
                body = None
        elif body is not None:
            body.append(line)
    return blocks


def _commands(text: str) -> list[tuple[str, bool]]:
    """Every ``embeddb ...`` command, with whether it is complete: the commands of shell blocks
    (also after ``&&``, ``;`` or a pipe) are; inline code spans may name a command without its
    required options."""
    lines: list[tuple[str, bool]] = []
    for block in _code_blocks(text):
        for raw in block.replace("\\\n", " ").splitlines():
            for part in re.split(r"&&|\|\||;|(?<!\|)\|(?!\|)", raw):  # each command of a line
                line = part.strip().removeprefix("$ ")
                if line.startswith("embeddb "):
                    lines.append((line, True))
    without_blocks = re.sub(r"```.*?```", "", text, flags=re.DOTALL)
    lines += [(m, False) for m in re.findall(r"`(embeddb [^`]+)`", without_blocks)]
    return lines


def _words(line: str) -> list[str]:
    words = shlex.split(line, comments=True)
    for i, word in enumerate(words):  # a pipeline or a second command ends this one
        if word in {"|", "&&", "||", ";", ">", "&"}:
            return words[:i]
    return words


def _parse(words: list[str]) -> None:
    """Parse ``embeddb ARGS`` as the CLI would, without running the command."""
    args = words[1:]
    with cli_main.make_context("embeddb", list(args), resilient_parsing=False) as ctx:
        protected = getattr(ctx, "_protected_args", None)  # click >= 8.2 deprecates the property
        rest = [*(ctx.protected_args if protected is None else protected), *ctx.args]
        if not rest:
            return
        name, command, sub_args = cli_main.resolve_command(ctx, rest)
        assert command is not None and name is not None
        if "--help" in sub_args or "-h" in sub_args:
            return
        command.make_context(name, list(sub_args), parent=ctx)


@pytest.fixture
def paths_need_not_exist(monkeypatch: pytest.MonkeyPatch) -> None:
    """Docs name files of the reader's deployment; check syntax and types, not existence."""
    convert = click.Path.convert

    def lenient(self: click.Path, value: object, param: object, ctx: object) -> object:
        exists, self.exists = self.exists, False
        try:
            return convert(self, value, param, ctx)  # type: ignore[arg-type]
        finally:
            self.exists = exists

    monkeypatch.setattr(click.Path, "convert", lenient)


def _all_commands() -> list[tuple[str, str, bool]]:
    return [
        (page.name, line, complete)
        for page in PAGES
        for line, complete in _commands(page.read_text())
    ]


def test_the_docs_show_commands() -> None:
    pages = {page for page, _, complete in _all_commands() if complete}
    assert {"operations.md", "persia-migration.md"} <= pages


@pytest.mark.parametrize(("page", "line", "complete"), _all_commands())
@pytest.mark.usefixtures("paths_need_not_exist")
def test_every_command_in_the_docs_parses(page: str, line: str, complete: bool) -> None:
    check_parses(page, line, complete)


def check_parses(page: str, line: str, complete: bool) -> None:
    """Fail unless the ``embeddb`` command ``line`` of ``page`` parses (a command shown in
    part, ``complete`` False, may leave required options out)."""
    try:
        _parse(_words(line))
    except click.exceptions.Exit:
        pass
    except click.MissingParameter:
        if complete:
            raise
    except click.ClickException as exc:
        pytest.fail(f"{page}: `{line}` does not parse: {exc.format_message()}")


def test_the_command_check_catches_a_bad_option() -> None:
    with pytest.raises(click.ClickException):
        _parse(_words("embeddb serve --no-such-option 1"))
    with pytest.raises(click.ClickException):
        _parse(_words("embeddb reshard --from a --to b --snapshot s --num-shards zero"))


# ------------------------------------------------------------------------------ examples


def python_blocks(text: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


@pytest.mark.slow
@pytest.mark.parametrize("name", RUNNABLE_PAGES)
def test_the_python_examples_run(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    blocks = python_blocks((DOCS / name).read_text(encoding="utf-8"))
    assert blocks, f"{name} has no python example"
    for block in blocks:
        exec(compile(block, name, "exec"), {})  # each block asserts what it shows
    assert capsys.readouterr().err == ""


# ------------------------------------------------------------------------------ install ranges


def _range_cell(cell: str) -> SpecifierSet:
    """``≥ 1.85.1, < 2`` (the install page's spelling) as a specifier set."""
    spec = cell.replace("≥", ">=").replace("≤", "<=").replace(" ", "")
    spec = re.sub(r"(^|,)=(?!=)", r"\1==", spec)
    return SpecifierSet(spec)


def install_table(text: str) -> dict[str, SpecifierSet]:
    """``{distribution: range}`` from the rows of the install page's dependency table."""
    table: dict[str, SpecifierSet] = {}
    section = text.split("## Dependency ranges", 1)[1].split("\n## ", 1)[0]
    for row in re.findall(r"^\|(.+)\|$", section, flags=re.M):
        cells = [c.strip() for c in row.split("|")]
        names = re.findall(r"`([A-Za-z0-9_.-]+)`(?! extra)", cells[0])
        if names and cells[1] not in {"range", "---"}:
            table.update((name, _range_cell(cells[1])) for name in names)
    return table


def pyproject_ranges() -> dict[str, SpecifierSet]:
    """The runtime dependencies and the trainer extra of pyproject.toml."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    requirements = [*project["dependencies"], *project["optional-dependencies"]["trainer"]]
    return {(r := Requirement(text)).name: r.specifier for text in requirements}


def test_the_install_page_lists_the_ranges_of_pyproject() -> None:
    listed = install_table((DOCS / "install.md").read_text(encoding="utf-8"))
    assert listed == pyproject_ranges(), (
        "docs/install.md's dependency table differs from pyproject.toml"
    )


def test_the_range_check_reads_the_table() -> None:
    page = "## Dependency ranges\n\n| dependency | range | notes |\n|---|---|---|\n"
    page += "| `a`, `b` | ≥ 1.2, < 2 | x |\n| `torch` (`trainer` extra) | = 2.13.0 | |\n"
    assert install_table(page) == {
        "a": SpecifierSet(">=1.2,<2"),
        "b": SpecifierSet(">=1.2,<2"),
        "torch": SpecifierSet("==2.13.0"),
    }
    assert install_table(page.replace("< 2", "< 3"))["a"] != SpecifierSet(">=1.2,<2")


# ------------------------------------------------------------------------------ metrics


class _FakeFollower:
    applied_records = reconnects = bootstraps = 0
    applied_seq = primary_seq = 0
    bootstrapped = False

    def lag_seconds(self) -> float:
        return 0.0


class _Predictor:
    """Enough of an ``InferCtx`` to build a model server that is never asked to predict."""

    spec = None

    def predict(self, batch: object) -> object:
        raise AssertionError("not called")


def _names(registry: CollectorRegistry) -> set[str]:
    """The metric names a scrape of ``registry`` shows (``_total`` and histogram suffixes
    included, for labelled metrics with no sample yet too)."""
    names: set[str] = set()
    for family in registry.collect():
        names.add(family.name)
        names.update(sample.name for sample in family.samples)
        if family.type == "counter":
            names.add(f"{family.name}_total")
        if family.type == "histogram":
            names.update(f"{family.name}_{s}" for s in ("bucket", "count", "sum"))
    return names


@functools.cache
def _exported_metric_names() -> frozenset[str]:
    """Every metric name the shard server, a follower, an embedding worker and the model
    server export, read from real registries built as the servers build them."""
    from embeddb import EmbeddingConfig, Shard
    from embeddb.server.metrics import (
        DurabilityCollector,
        FollowerCollector,
        LogCutsCollector,
        ShardMetrics,
        ShardStatsCollector,
    )
    from embeddb.server.streams import StreamSlots
    from embeddb.serving.server import ModelServerConfig, build_model_server
    from embeddb.trainer.embedding.metrics import WorkerMetrics

    shard_registry, follower_registry, model_registry = (
        CollectorRegistry(),
        CollectorRegistry(),
        CollectorRegistry(),
    )
    ShardMetrics(shard_registry).watch_streams(StreamSlots(1, 1.0))
    follower_registry.register(FollowerCollector(_FakeFollower()))
    config = ModelServerConfig(http_port=None, workers=1, metrics_registry=model_registry)
    build_model_server(_Predictor(), config).stop(grace=0)  # type: ignore[arg-type]
    registries = [shard_registry, follower_registry, model_registry, WorkerMetrics(4).registry]
    with Shard(EmbeddingConfig.single_table("t", 4, capacity=64)) as shard:
        shard_registry.register(ShardStatsCollector(shard))
        shard_registry.register(LogCutsCollector(shard))
        shard_registry.register(DurabilityCollector(shard))
        return frozenset().union(*map(_names, registries))


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_metric_in_the_docs_exists(page: Path) -> None:
    exported = _exported_metric_names()
    cited = set(re.findall(r"`(embeddb_[a-z0-9_]+)", page.read_text()))
    missing = sorted(cited - exported)
    assert not missing, f"{page.name} cites metrics no code exports: {missing}"


def test_the_metric_check_knows_the_exported_names() -> None:
    exported = _exported_metric_names()
    assert {"embeddb_rows", "embeddb_evicted_total", "embeddb_request_seconds_bucket"} <= exported
    assert {"embeddb_follower_lag_seq", "embeddb_trainer_staleness"} <= exported
    assert {"embeddb_model_predictions_total", "embeddb_model_batch_samples_count"} <= exported
    assert "embeddb_no_such_metric" not in exported
