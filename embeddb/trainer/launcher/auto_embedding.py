"""``embedding_config: auto``: the embedding config ``embeddb train`` writes for a job, one
table per ID feature (``RUN/embedding.yaml``, :data:`~embeddb.trainer.launcher.job.EMBEDDING_FILE`).

Who writes it: the launcher itself, before anything starts, when the job file names the ID
features (:func:`config_ahead`: a dataset with ``ids``, ``slots`` or a preset's columns), so
that the local shards start with it while the validation step runs; the validation step
then finds it there and fails (one ``embedding_config`` error line, the shards stopped) unless
the pipeline it fitted has exactly those features (:func:`check_ahead`). Otherwise (a libSVM
dataset without ``ids`` or ``slots``: its fields are found in the data) the validation step
writes it, and the shards start once it passed. PyYAML only: the launcher imports this.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import yaml

from embeddb.errors import ConfigError

if TYPE_CHECKING:
    from embeddb.trainer.launcher.job import JobConfig

__all__ = [
    "AUTO_HEADROOM",
    "AUTO_INITIALIZER",
    "AUTO_MIN_ROWS",
    "AUTO_OPTIMIZER",
    "AUTO_RAM_BUDGET",
    "AUTO_STRIPES",
    "auto_capacities",
    "auto_embedding_yaml",
    "check_ahead",
    "config_ahead",
    "job_ram_budget",
]

# The auto embedding config's table settings (the Criteo example's, proven on CTR data).
# Row-wise Adagrad: one accumulator per row, dim + 1 floats a row (docs/performance.md).
AUTO_OPTIMIZER = {
    "type": "adagrad",
    "lr": 0.05,
    "initial_accumulator": 0.01,
    "eps": 1e-10,
    "vectorwise_shared": True,
}
AUTO_INITIALIZER = {"type": "normal", "mean": 0.0, "std": 0.05}
# The RAM each shard's tables may take together (job key ``ram_budget``; docs/training.md):
# a fixed 1 GiB, not a share of the machine's RAM, so that the written config is the same on
# every machine (shards given by ``addresses`` get it too) and a small machine running the
# job's shards, NN workers and data loading side by side keeps room for them; about 7.6M rows
# of dim 16 (row-wise Adagrad: ~140 bytes a row), rows beyond it spill to the disk tier.
AUTO_RAM_BUDGET = 1 << 30
AUTO_HEADROOM = 1.25  # rows per distinct id a table gets (ids do not split evenly over shards)
AUTO_MIN_ROWS = 1024  # the fewest rows a table with a known cardinality gets on a shard
AUTO_STRIPES = 2


def job_ram_budget(job: JobConfig) -> int:
    """The RAM bytes per shard of the job's auto tables: its ``ram_budget``, else
    :data:`AUTO_RAM_BUDGET`."""
    return AUTO_RAM_BUDGET if job.ram_budget is None else int(job.ram_budget)


def auto_capacities(
    features: Sequence[str],
    dim: int,
    ram_budget: int = AUTO_RAM_BUDGET,
    shards: int = 1,
    distinct: Mapping[str, int] | None = None,
) -> dict[str, int]:
    """RAM rows per shard of each auto table: a feature whose number of distinct ids ``d`` is
    known (``distinct``) needs ``max(AUTO_MIN_ROWS, ceil(d * AUTO_HEADROOM / shards))`` rows
    and gets no more; the others share what is left of ``ram_budget`` in equal bytes
    (:func:`embeddb.config.ram_budget.split_budget`); what no table needs is not allocated.

    Raises:
        ConfigError: ``ram_budget``: it does not hold one row of every table.
    """
    from embeddb.config.ram_budget import split_budget
    from embeddb.config.store import RamTierConfig
    from embeddb.config.tables import OptimizerConfig

    optimizer = OptimizerConfig(
        kind=str(AUTO_OPTIMIZER["type"]),  # type: ignore[arg-type]  # converted on init
        vectorwise_shared=bool(AUTO_OPTIMIZER["vectorwise_shared"]),
    )
    width = dim + optimizer.state_dim(dim)
    needs = {
        name: max(AUTO_MIN_ROWS, math.ceil(count * AUTO_HEADROOM / shards))
        for name, count in (distinct or {}).items()
        if name in features
    }
    ram = RamTierConfig(stripes=AUTO_STRIPES)
    rows = split_budget(ram_budget, {name: width for name in features}, ram, needs)
    starved = [name for name, count in rows.items() if count == 0]
    if starved:
        raise ConfigError(
            "ram_budget", f"{ram_budget} bytes hold not one row of table(s) {', '.join(starved)}"
        )
    return rows


def auto_embedding_yaml(
    features: Sequence[str],
    dim: int,
    *,
    ram_budget: int = AUTO_RAM_BUDGET,
    shards: int = 1,
    distinct: Mapping[str, int] | None = None,
) -> str:
    """The ``embedding_config: auto`` YAML: one table per ID feature of width ``dim``, row-wise
    Adagrad (lr 0.05), normal init (std 0.05), each table's RAM rows per shard from
    ``ram_budget`` (bytes per shard, also the config's ``store.ram_budget``) and the
    features' distinct ids where known (:func:`auto_capacities`)."""
    bits = max(8, (len(features) - 1).bit_length())
    rows = auto_capacities(features, dim, ram_budget, shards, distinct)
    doc = {
        "feature_index_prefix_bit": bits,
        "seed": 0,
        "slots_config": {name: {"dim": dim} for name in features},
        "defaults": {"optimizer": AUTO_OPTIMIZER, "initializer": AUTO_INITIALIZER},
        "tables": {name: {"capacity": rows[name]} for name in features},
        "store": {"stripes": AUTO_STRIPES, "ram_budget": ram_budget},
    }
    header = "# Written by embeddb train (embedding_config: auto): one table per ID feature.\n"
    return header + yaml.safe_dump(doc, sort_keys=False)


def config_ahead(job: JobConfig) -> str | None:
    """The job's auto embedding config when the job file alone names its ID features (the
    text the validation step would write), else ``None`` (no ``auto``, or features found in
    the data)."""
    if not job.auto_embedding:
        return None
    names = job.dataset_spec.named_id_features
    if names is None:
        return None
    return auto_embedding_yaml(
        names, job.embedding_dim, ram_budget=job_ram_budget(job), shards=job.shard_count
    )


def check_ahead(
    written: str,
    features: Sequence[str],
    dim: int,
    *,
    ram_budget: int = AUTO_RAM_BUDGET,
    shards: int = 1,
) -> None:
    """The config the launcher wrote ahead (``written``: the data unseen, so the budget split
    equally) is the one of the fitted pipeline's ``features``.

    Raises:
        ConfigError: naming ``embedding_config``: the shards started with other features.
    """
    if written == auto_embedding_yaml(features, dim, ram_budget=ram_budget, shards=shards):
        return
    try:
        ahead = list(yaml.safe_load(written)["slots_config"])
    except (yaml.YAMLError, TypeError, KeyError):
        ahead = []
    raise ConfigError(
        "embedding_config",
        f"auto: the dataset's ID features ({', '.join(features) or '-'}) are not those of the "
        f"job file ({', '.join(map(str, ahead)) or '-'}) the shards were started with",
    )
