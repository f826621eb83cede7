"""Reader of the UCI Adult dataset shipped in this folder (CC BY 4.0, see SOURCE.md)."""

from __future__ import annotations

import gzip
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from embeddb.errors import CorruptDataError

__all__ = ["ADULT_DIR", "COLUMNS", "AdultTable", "load_adult"]

ADULT_DIR = Path(__file__).resolve().parent

COLUMNS = (
    "age",
    "workclass",
    "fnlwgt",
    "education",
    "education_num",
    "marital_status",
    "occupation",
    "relationship",
    "race",
    "gender",
    "capital_gain",
    "capital_loss",
    "hours_per_week",
    "native_country",
    "income",
)
NUMERIC = ("age", "fnlwgt", "education_num", "capital_gain", "capital_loss", "hours_per_week")


@dataclass(frozen=True)
class AdultTable:
    """One split: string columns, float64 numeric columns and a 0/1 label (income > 50K)."""

    categorical: dict[str, npt.NDArray[np.str_]]
    numeric: dict[str, npt.NDArray[np.float64]]
    label: npt.NDArray[np.float32]

    def __len__(self) -> int:
        return int(self.label.size)


def load_adult(split: str = "train", directory: Path = ADULT_DIR) -> AdultTable:
    """Read ``adult.data.gz`` (``split="train"``) or ``adult.test.gz`` (``"test"``).

    Raises:
        ValueError: unknown split.
        CorruptDataError: a data line does not have 15 fields.
    """
    files = {"train": "adult.data.gz", "test": "adult.test.gz"}
    if split not in files:
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    path = directory / files[split]
    with gzip.open(path, "rt", encoding="ascii") as fh:
        lines = [ln for ln in fh.read().splitlines() if ln and not ln.startswith("|")]
    fields = [ln.split(", ") for ln in lines]
    bad = next((i for i, f in enumerate(fields) if len(f) != len(COLUMNS)), None)
    if bad is not None:
        raise CorruptDataError(f"{path}: data line {bad + 1} has {len(fields[bad])} fields, not 15")
    table = np.array(fields, dtype=np.str_)
    cols = {name: table[:, i] for i, name in enumerate(COLUMNS)}
    label = np.char.startswith(cols.pop("income"), ">50K").astype(np.float32)
    numeric = {name: cols.pop(name).astype(np.float64) for name in NUMERIC}
    return AdultTable(categorical=cols, numeric=numeric, label=label)
