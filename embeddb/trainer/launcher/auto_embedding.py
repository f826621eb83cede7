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

from collections.abc import Sequence
from typing import TYPE_CHECKING

import yaml

from embeddb.errors import ConfigError

if TYPE_CHECKING:
    from embeddb.trainer.launcher.job import JobConfig

__all__ = [
    "AUTO_CAPACITY",
    "AUTO_INITIALIZER",
    "AUTO_OPTIMIZER",
    "auto_embedding_yaml",
    "check_ahead",
    "config_ahead",
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
AUTO_CAPACITY = 1_000_000  # RAM rows per table and shard; colder rows spill to the disk tier


def auto_embedding_yaml(features: Sequence[str], dim: int) -> str:
    """The ``embedding_config: auto`` YAML: one table per ID feature of width ``dim``, row-wise
    Adagrad (lr 0.05), normal init (std 0.05), :data:`AUTO_CAPACITY` RAM rows per table."""
    bits = max(8, (len(features) - 1).bit_length())
    doc = {
        "feature_index_prefix_bit": bits,
        "seed": 0,
        "slots_config": {name: {"dim": dim} for name in features},
        "defaults": {
            "optimizer": AUTO_OPTIMIZER,
            "initializer": AUTO_INITIALIZER,
            "capacity": AUTO_CAPACITY,
        },
        "store": {"stripes": 2},
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
    return None if names is None else auto_embedding_yaml(names, job.embedding_dim)


def check_ahead(written: str, features: Sequence[str], dim: int) -> None:
    """The config the launcher wrote ahead (``written``) is the one of the fitted pipeline's
    ``features``.

    Raises:
        ConfigError: naming ``embedding_config``: the shards started with other features.
    """
    if written == auto_embedding_yaml(features, dim):
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
