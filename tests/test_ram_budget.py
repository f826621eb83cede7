"""A shard's RAM budget in bytes (embeddb.config.ram_budget, store.ram_budget, the job's
ram_budget): the byte cost of a table's RAM tier is exactly its arrays' nbytes, tables without
a capacity share what the others leave, too small a budget is a config error naming the tables
and their bytes, sizes read as "4GiB", and the auto config sizes tables from the data."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from embeddb.cli.common import load_config
from embeddb.config import (
    EmbeddingConfig,
    Eviction,
    OptimizerConfig,
    OptimizerKind,
    RamTierConfig,
    StoreConfig,
    TableConfig,
)
from embeddb.config._checks import as_bytes
from embeddb.config.ram_budget import (
    capacity_for_bytes,
    ram_bytes_per_row,
    split_budget,
    table_ram_bytes,
)
from embeddb.engine.shard import Shard
from embeddb.errors import ConfigError
from embeddb.trainer.launcher.auto_embedding import (
    AUTO_HEADROOM,
    AUTO_MIN_ROWS,
    AUTO_STRIPES,
    auto_capacities,
    auto_embedding_yaml,
    job_ram_budget,
)
from embeddb.trainer.launcher.job import EMBEDDING_FILE, JobConfig
from embeddb.trainer.launcher.validate import validate

MiB = 1 << 20


def arrays_nbytes(shard: Shard, table: str) -> int:
    """Every numpy array a table's stripes hold, summed (whatever the formula counts)."""
    stripes = shard._tables[table].stripes
    arrays = sum(
        value.nbytes
        for stripe in stripes
        for value in vars(stripe).values()
        if isinstance(value, np.ndarray)
    )
    sketches = sum(s.sketch.table.nbytes for s in stripes if s.sketch is not None)
    return arrays + sketches


@pytest.mark.parametrize("eviction", list(Eviction))
@pytest.mark.parametrize(
    ("capacity", "dim", "kind", "stripes"),
    [
        (1000, 16, OptimizerKind.SGD, 4),
        (4097, 8, OptimizerKind.ADAGRAD, 4),
        (70_001, 3, OptimizerKind.ADAM, 2),
        (5, 1, OptimizerKind.ADAGRAD, 64),
    ],
)
def test_the_byte_cost_is_the_real_arrays_nbytes(
    capacity: int,
    dim: int,
    kind: OptimizerKind,
    stripes: int,
    eviction: Eviction,
    tmp_path: Path,
) -> None:
    table = TableConfig(
        "t", dim, optimizer=OptimizerConfig(kind=kind), capacity=capacity, eviction=eviction
    )
    ram = RamTierConfig(stripes=stripes)
    config = EmbeddingConfig({"t": table}, store=StoreConfig(ram=ram))
    with Shard(config, tmp_path / "s") as shard:
        real = arrays_nbytes(shard, "t")
        stats = shard.stats()
    sketch = eviction is Eviction.TINYLFU
    assert table_ram_bytes(capacity, table.row_width, ram, sketch) == real
    assert config.ram_bytes() == {"t": real}
    assert stats.tables["t"].ram_bytes == real  # before: no ram_bytes in the stats
    assert stats.totals()["ram_bytes"] == real
    assert ram_bytes_per_row(table, ram) == real / capacity


def test_the_documented_example() -> None:
    ram = RamTierConfig(stripes=4)
    assert table_ram_bytes(1_000_000, 17, ram) == 126_554_432


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("4GiB", 4 << 30),
        ("512MiB", 512 << 20),
        ("512 mib", 512 << 20),
        ("1.5GB", 1_500_000_000),
        ("2097152", 2 << 20),
        ("3MB", 3_000_000),
        ("2048 KiB", 2 << 20),
    ],
)
def test_sizes_read_with_units(text: str, value: int) -> None:
    config = EmbeddingConfig.from_yaml_text(
        f"slots_config: {{a: {{dim: 4}}}}\nstore: {{ram_budget: {text}}}\n"
    )
    assert config.store.ram.budget == value
    assert as_bytes(value, "k") == value


@pytest.mark.parametrize("bad", ["4 GiBs", "GiB", "-1MiB", "1e3", "", "nan", True, 1.5])
def test_bad_sizes_are_refused(bad: Any) -> None:
    with pytest.raises(ConfigError, match=r"^ram_budget: must be a byte count"):
        RamTierConfig(budget=bad)


def test_a_budget_below_one_mib_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"ram_budget: must be at least 1048576 bytes, got 1000"):
        RamTierConfig(budget=1000)


SHARED = """\
slots_config:
  a: {dim: 16}
  b: {dim: 16}
tables:
  a: {capacity: 10000}
  c: {dim: 4, optimizer: {type: adam}}
store: {ram_budget: 64MiB, stripes: 4}
"""


def test_tables_without_a_capacity_share_what_the_others_leave() -> None:
    config = EmbeddingConfig.from_yaml_text(SHARED)
    ram = config.store.ram
    tables = config.tables
    assert tables["a"].capacity == 10000  # explicit: kept
    used = table_ram_bytes(10000, tables["a"].row_width, ram)
    share = (64 * MiB - used) // 2  # b and c: equal bytes
    for name in ("b", "c"):
        width = tables[name].row_width
        assert table_ram_bytes(tables[name].capacity, width, ram) <= share
        assert tables[name].capacity == capacity_for_bytes(share, width, ram)
    assert tables["c"].capacity > tables["b"].capacity  # 13 floats a row against 32
    assert sum(config.ram_bytes().values()) <= 64 * MiB
    again = EmbeddingConfig.from_dict(config.to_dict())  # written out: explicit, same sizes
    assert again == config


def test_capacity_for_bytes_is_the_most_rows_that_fit() -> None:
    ram = RamTierConfig(stripes=1)
    for allowance in (1000, 10_000, 123_456, 10 * MiB):
        rows = capacity_for_bytes(allowance, 17, ram)
        assert table_ram_bytes(rows, 17, ram) <= allowance
        assert all(table_ram_bytes(r, 17, ram) > allowance for r in range(rows + 1, rows + 50))
    assert capacity_for_bytes(100, 17, ram) == 0


def test_a_defaults_capacity_makes_every_table_explicit() -> None:
    text = SHARED.replace("tables:", "defaults: {capacity: 1000}\ntables:")
    config = EmbeddingConfig.from_yaml_text(text)
    assert [t.capacity for t in config.tables.values()] == [10000, 1000, 1000]


def test_explicit_capacities_over_the_budget_name_the_tables_bytes_and_line(
    tmp_path: Path,
) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(SHARED.replace("capacity: 10000", "capacity: 2000000"))
    with pytest.raises(ConfigError) as caught:
        EmbeddingConfig.from_yaml(path)
    width = 16 + 16  # adagrad by default
    need = table_ram_bytes(2_000_000, width, RamTierConfig(stripes=4))
    assert caught.value.key == "store.ram_budget"
    assert str(caught.value) == (
        f"store.ram_budget: {64 * MiB} bytes are less than the {need} bytes the RAM tiers of "
        f"the tables with an explicit capacity take: a (capacity 2000000: {need} bytes) "
        f"(in {path}:7)"
    )


def test_a_budget_that_leaves_no_row_for_a_shared_table_is_refused() -> None:
    ram = RamTierConfig(stripes=4)
    big = capacity_for_bytes(64 * MiB - 100, 32, ram)
    text = SHARED.replace("capacity: 10000", f"capacity: {big}")
    with pytest.raises(ConfigError, match=r"not one row for table\(s\) b, c"):
        EmbeddingConfig.from_yaml_text(text)


def test_a_config_built_in_code_is_checked_against_its_budget() -> None:
    store = StoreConfig(ram=RamTierConfig(budget=MiB))
    with pytest.raises(ConfigError, match=r"^store.ram_budget: 1048576 bytes are less than"):
        EmbeddingConfig({"t": TableConfig("t", 16, capacity=100_000)}, store=store)
    small = EmbeddingConfig({"t": TableConfig("t", 16, capacity=1000)}, store=store)
    assert small.tables["t"].capacity == 1000


def test_the_serve_flag_sizes_the_shared_tables(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(SHARED.replace("ram_budget: 64MiB, ", ""))
    assert load_config(path).tables["b"].capacity == 1_000_000  # no budget: the default
    sized = load_config(path, 16 * MiB)
    assert sized.store.ram.budget == 16 * MiB
    assert sum(sized.ram_bytes().values()) <= 16 * MiB < sum(load_config(path).ram_bytes().values())


def test_split_budget_gives_a_known_need_and_shares_the_rest() -> None:
    ram = RamTierConfig(stripes=2)
    widths = {"small": 17, "big": 17, "open": 17}
    rows = split_budget(100 * MiB, widths, ram, {"small": 5000, "big": 10**9})
    assert rows["small"] == 5000
    left = 100 * MiB - table_ram_bytes(5000, 17, ram)
    assert rows["big"] == rows["open"] == capacity_for_bytes(left // 2, 17, ram)
    lean = split_budget(100 * MiB, widths, ram, {"small": 10, "big": 20, "open": 30})
    assert lean == {"small": 10, "big": 20, "open": 30}  # the rest stays unallocated


def test_auto_tables_are_sized_from_their_distinct_ids() -> None:
    features = ("user", "city", "item")
    rows = auto_capacities(features, 16, 64 * MiB, shards=2, distinct={"city": 40, "user": 90_000})
    assert rows["city"] == AUTO_MIN_ROWS
    assert rows["user"] == math.ceil(90_000 * AUTO_HEADROOM / 2)
    ram = RamTierConfig(stripes=AUTO_STRIPES)
    assert rows["item"] == capacity_for_bytes(
        64 * MiB - table_ram_bytes(rows["city"], 17, ram) - table_ram_bytes(rows["user"], 17, ram),
        17,
        ram,
    )
    config = EmbeddingConfig.from_yaml_text(
        auto_embedding_yaml(features, 16, ram_budget=64 * MiB, shards=2, distinct={"city": 40})
    )
    assert config.store.ram.budget == 64 * MiB
    assert config.tables["city"].capacity == AUTO_MIN_ROWS
    assert sum(config.ram_bytes().values()) <= 64 * MiB
    # before: every auto table had 1,000,000 rows whatever the data and the machine
    assert config.tables["user"].capacity == config.tables["item"].capacity < 1_000_000


def test_auto_tables_of_known_small_features_leave_the_budget_unallocated() -> None:
    config = EmbeddingConfig.from_yaml_text(
        auto_embedding_yaml(("a", "b"), 8, distinct={"a": 3, "b": 5000})
    )
    assert [t.capacity for t in config.tables.values()] == [AUTO_MIN_ROWS, 6250]
    assert sum(config.ram_bytes().values()) < MiB


JOB = """\
dataset:
  format: csv
  train: train.csv
  test: train.csv
  label: {column: y}
  ids: [user, item]
model: builtin:dnn
embedding_config: auto
"""


def write_data(folder: Path, rows: int) -> None:
    lines = ["user,item,y"] + [f"u{k % 7},i{k},{k % 2}" for k in range(rows)]
    (folder / "train.csv").write_text("\n".join(lines) + "\n")


@pytest.mark.slow  # a fit: about a second
def test_fit_counts_the_distinct_ids_of_each_feature(tmp_path: Path) -> None:
    write_data(tmp_path, 300)
    (tmp_path / "job.yaml").write_text(JOB + "ram_budget: 64MiB\n")
    job = JobConfig.from_yaml(tmp_path / "job.yaml")
    assert job_ram_budget(job) == 64 * MiB
    assert job.dataset_spec.fit().distinct_ids == {"user": 7, "item": 300}  # every row read
    sampled = job.dataset_spec.fit(sample_rows=200)  # not every row: growing counts unknown
    assert sampled.distinct_ids == {"user": 7}


def test_the_job_budget_is_for_auto_tables_only(tmp_path: Path) -> None:
    write_data(tmp_path, 10)
    path = tmp_path / "job.yaml"
    path.write_text(JOB.replace("auto", "preset:adult") + "ram_budget: 1GiB\n")
    with pytest.raises(ConfigError, match=r"ram_budget: sizes the embedding_config: auto"):
        JobConfig.from_yaml(path)
    path.write_text(JOB + "ram_budget: lots\n")
    with pytest.raises(ConfigError, match=r"ram_budget: must be a byte count.*job.yaml:9"):
        JobConfig.from_yaml(path)


@pytest.mark.slow  # a fit: about a second
def test_the_validation_step_sizes_the_auto_tables_from_the_data(tmp_path: Path) -> None:
    write_data(tmp_path, 2000)
    (tmp_path / "job.yaml").write_text(JOB + "ram_budget: 64MiB\nshards: 2\n")
    job = JobConfig.from_yaml(tmp_path / "job.yaml")
    validate(job, tmp_path / "run", model=False)  # no config written ahead: the step writes it
    config = EmbeddingConfig.from_yaml(tmp_path / "run" / EMBEDDING_FILE)
    assert config.store.ram.budget == 64 * MiB
    # 7 users: the least rows; 2000 items over 2 shards, 25% headroom: 1250 rows a shard
    assert {n: t.capacity for n, t in config.tables.items()} == {"user": 1024, "item": 1250}
