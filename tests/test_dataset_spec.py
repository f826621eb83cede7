"""DatasetSpec: the ``dataset:`` node of a job file -> fitted pipeline -> readers, on real
files; every mistake a ConfigError naming its key path and file:line; presets equal the
dataset readers they replace."""

from __future__ import annotations

import gzip
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from embeddb.errors import ConfigError
from embeddb.features import (
    AdultReader,
    CriteoReader,
    CsvDialect,
    CsvReader,
    DatasetSpec,
    MovieLensReader,
    RowRange,
    hash_strings,
)
from embeddb.features.batch import Batch

from .conftest import SHARED_DATA

CRITEO = SHARED_DATA / "criteo"
MOVIELENS = SHARED_DATA / "movielens-100k"

TRAIN = """user,tags,price,age,clicked
u1,a|b,12.5,31,1
u2,,3,40,0
u3,c,,22,1
u1,a,100,58,0
"""
TEST = """user,tags,price,age,clicked
u9,b,7,35,1
"""


def _where(key: str) -> str:
    """A fake line lookup: every key path gets a line of its own."""
    return f"job.yaml:{len(key)}"


def _spec(node: object, base: Path) -> DatasetSpec:
    return DatasetSpec.from_yaml_node(node, base_dir=base, where=_where)


def _node(**overrides: Any) -> dict[str, Any]:
    node: dict[str, Any] = {
        "format": "csv",
        "train": "data/train*.csv",
        "test": "data/test.csv",
        "label": {"column": "clicked"},
        "ids": ["user", {"column": "tags", "separator": "|"}],
        "numeric": [
            {"column": "price", "transform": "log1p"},
            {"column": "age", "transform": "standardize"},
        ],
        "shuffle": False,
    }
    node.update(overrides)
    return {k: v for k, v in node.items() if v is not None}


def _data(tmp_path: Path, train: str = TRAIN, test: str = TEST) -> Path:
    (tmp_path / "data").mkdir(exist_ok=True)
    (tmp_path / "data" / "train1.csv").write_text(train)
    (tmp_path / "data" / "test.csv").write_text(test)
    return tmp_path


def _same(a: list[Batch], b: list[Batch]) -> None:
    assert [x.batch_size for x in a] == [y.batch_size for y in b]
    for x, y in zip(a, b, strict=True):
        for fx, fy in zip(x.id_type_features, y.id_type_features, strict=True):
            assert fx.name == fy.name
            assert fx.values.tolist() == fy.values.tolist(), fx.name
            assert fx.counts().tolist() == fy.counts().tolist(), fx.name
        for nx, ny in zip(x.non_id_type_features, y.non_id_type_features, strict=True):
            assert nx.data.tobytes() == ny.data.tobytes()
        for lx, ly in zip(x.labels, y.labels, strict=True):
            assert lx.data.tobytes() == ly.data.tobytes()


def _config_error(call: Callable[[], object]) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        call()
    return info.value


def test_yaml_to_fit_to_readers_on_a_csv(tmp_path: Path) -> None:
    spec = _spec(_node(), _data(tmp_path))
    assert spec.train_files() == [tmp_path / "data" / "train1.csv"]
    pipeline = spec.fit()
    assert pipeline.id_features == ("user", "tags") and pipeline.non_id == (
        ("price", 1),
        ("age", 1),
    )
    (age,) = pipeline.spec.numeric[1].standardize or ()
    ages = np.array([31, 40, 22, 58.0])
    assert age == pytest.approx((ages.mean(), ages.std()))
    train = list(spec.reader(pipeline, "train", 3, train=True))
    direct = list(CsvReader(tmp_path / "data" / "train1.csv", pipeline.spec, 3))
    _same(train, direct)
    assert [b.batch_size for b in train] == [3, 1]
    got_age = np.concatenate([b.non_id_type_features[1].data for b in train]).ravel()
    assert got_age.tolist() == pytest.approx(((ages - ages.mean()) / ages.std()).tolist(), abs=1e-6)
    tags = np.concatenate([b.feature("tags").counts() for b in train])
    assert tags.tolist() == [2, 0, 1, 1]
    (test,) = list(spec.reader(pipeline, "test", 10, train=False))
    assert test.feature("user").values.tolist() == hash_strings(["u9"], "user").tolist()
    # The pipeline serves raw records exactly as the reader built the rows.
    records = [{"user": "u1", "tags": ["a", "b"], "price": 12.5, "age": 31, "clicked": 1}]
    served = pipeline.batch_from_records(records)
    row = train[0]
    assert served.non_id_type_features[1].data[0].tobytes() == (
        row.non_id_type_features[1].data[0].tobytes()
    )
    assert served.feature("tags").values.tolist() == row.feature("tags").sample(0).tolist()


def test_tsv_gz_without_header_constant_column_and_a_list_of_patterns(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    rows = "1\tx\t5\n0\ty\t5\n1\tx\t5\n"
    with gzip.open(tmp_path / "d" / "part-0.tsv.gz", "wt") as fh:
        fh.write(rows)
    (tmp_path / "d" / "part-1.tsv").write_text("0\tz\t5\n")
    (tmp_path / "t.tsv").write_text("1\tq\t5\n")
    node = {
        "format": "tsv",
        "names": ["y", "item", "n"],
        "train": ["d/part-0.tsv.gz", "d/part-1.tsv"],
        "test": "t.tsv",
        "label": "y",
        "ids": ["item"],
        "numeric": [{"column": "n", "transform": "standardize", "fill": 2}],
        "shuffle": {"buffer_rows": 0},
    }
    spec = _spec(node, tmp_path)
    assert spec.shuffle_rows == 0
    pipeline = spec.fit()
    assert pipeline.spec.numeric[0].standardize == ((5.0, 1.0),)  # std 0 -> 1
    (batch,) = list(spec.reader(pipeline, "train", 100, train=True))
    assert batch.feature("item").values.tolist() == hash_strings(list("xyxz"), "item").tolist()
    assert batch.non_id_type_features[0].data.ravel().tolist() == [0.0] * 4
    assert batch.labels[0].data.ravel().tolist() == [1, 0, 1, 0]
    assert spec.fit(sample_rows=2).spec.numeric[0].standardize == ((5.0, 1.0),)


def test_shuffle_is_on_by_default(tmp_path: Path) -> None:
    spec = _spec(_node(shuffle=None), _data(tmp_path))
    assert spec.shuffle_rows == 65536
    assert _spec(_node(shuffle={"buffer_rows": 8, "seed": 3}), tmp_path).shuffle_rows == 8


@pytest.mark.parametrize(
    ("overrides", "key", "match"),
    [
        ({"format": "xlsx"}, "dataset.format", "must be one of csv, tsv, parquet, libsvm"),
        ({"train": "data/nothing*.csv"}, "dataset.train", "no file matches"),
        ({"split": {"fraction": 0.2}}, "dataset.split", "not both"),
        ({"test": None, "split": {"fraction": 1.5}}, "dataset.split.fraction", r"in \(0, 1\)"),
        ({"test": None, "split": {"fraction": 0}}, "dataset.split.fraction", r"in \(0, 1\)"),
        ({"test": None}, "dataset.test", "is required unless split"),
        (
            {"numeric": ["price", {"column": "age", "transform": "sqrt"}]},
            "dataset.numeric[1].transform",
            "must be one of none, log1p, standardize, got 'sqrt'",
        ),
        ({"ids": ["user", {"column": "tags", "kind": "float"}]}, "dataset.ids[1].kind", "float"),
        (
            {"ids": ["user", {"column": "tags", "separator": "||"}]},
            "dataset.ids[1].separator",
            "one",
        ),
        ({"numeric": [{"column": "price", "fill": "zero"}]}, "dataset.numeric[0].fill", "a number"),
        ({"label": None}, "dataset.label", "is required"),
        ({"colour": "red"}, "dataset.colour", "is not a dataset setting"),
        ({"shuffle": "yes"}, "dataset.shuffle", "must be false, true"),
        ({"ids": ["user", "user"]}, "dataset.ids", "duplicate names"),
        ({"delimiter": ";;"}, "dataset.delimiter", "one ASCII character"),
        ({"header": False}, "dataset.names", "needs its column names"),
        ({"na_values": "NA", "format": "parquet", "strip": True}, "dataset.strip", "csv and tsv"),
    ],
)
def test_config_mistakes_name_the_key_and_its_line(
    tmp_path: Path, overrides: dict[str, Any], key: str, match: str
) -> None:
    _data(tmp_path)
    err = _config_error(lambda: _spec(_node(**overrides), tmp_path).fit())
    assert err.key == key
    assert str(err).startswith(f"{key}: ")
    assert str(err).endswith(f"({_where(key)})")
    with pytest.raises(ConfigError, match=match):
        _spec(_node(**overrides), tmp_path).fit()


def test_data_mistakes_name_the_column_or_the_file_and_line(tmp_path: Path) -> None:
    _data(tmp_path)
    err = _config_error(lambda: _spec(_node(ids=["user", "city"]), tmp_path).fit())
    assert err.key == "dataset.ids[1]"
    assert "column 'city' is not in" in str(err) and "train1.csv" in str(err)
    assert "it has ['user', 'tags', 'price', 'age', 'clicked']" in str(err)
    assert str(err).endswith(f"({_where('dataset.ids[1]')})")
    bad = TRAIN + "u5,d,cheap,30,1\n"
    _data(tmp_path, train=bad)
    err = _config_error(lambda: _spec(_node(), tmp_path).fit())
    assert err.key == "dataset.train"
    assert "train1.csv:6: column 'price': 'cheap' is not a number" in str(err)
    _data(tmp_path, train="user,tags,price,age,clicked\n" + "u1,a,1,2,\n" * 5)
    err = _config_error(lambda: _spec(_node(), tmp_path).fit())
    assert err.key == "dataset.label"
    assert "column 'clicked' is empty in all 5 sampled rows" in str(err)
    _data(tmp_path, train=TRAIN + "u7,a,1,2,\n")  # one empty label: its line
    err = _config_error(lambda: _spec(_node(), tmp_path).fit())
    assert err.key == "dataset.train" and "train1.csv:6: label column 'clicked' is empty" in str(
        err
    )
    _data(tmp_path, train=TRAIN + "u7,a,1,2,3\n")
    err = _config_error(lambda: _spec(_node(), tmp_path).fit())
    assert "train1.csv:6: label column 'clicked': 3.0 is not 1, 0 or -1" in str(err)
    _data(tmp_path, test="user,tags,price,clicked\nu9,b,7,1\n")  # test file lacks a column
    err = _config_error(lambda: _spec(_node(), tmp_path).fit())
    assert err.key == "dataset.numeric[1]" and "column 'age' is not in" in str(err)
    assert "test.csv" in str(err)


@pytest.mark.slow
def test_adult_preset_equals_the_adult_reader() -> None:
    spec = DatasetSpec.from_yaml_node({"preset": "adult", "shuffle": False}, base_dir=Path("."))
    pipeline = spec.fit()
    assert pipeline.positive == ">50K" and pipeline.non_id == (("dense", 6),)
    for split in ("train", "test"):
        got = list(spec.reader(pipeline, split, 4096, train=split == "train"))
        _same(got, list(AdultReader(4096, split, requires_grad=split == "train")))
    assert DatasetSpec.from_yaml_node("adult", base_dir=Path(".")).shuffle_rows == 65536


@pytest.mark.slow
@pytest.mark.skipif(
    not (CRITEO / "sample.train.gz").is_file(),
    reason=f"the Criteo sample is not at {CRITEO} (../shared/data is not checked out here)",
)
def test_criteo_preset_equals_the_criteo_reader_split_by_rows() -> None:
    legacy = DatasetSpec.from_legacy("criteo", CRITEO, train_rows=30_000)
    spec = DatasetSpec.from_yaml_node(
        {"preset": "criteo", "data_dir": str(CRITEO), "train_rows": 30_000, "shuffle": False},
        base_dir=Path("."),
    )
    assert legacy.parsed.split == spec.parsed.split and legacy.columns == spec.columns
    pipeline = spec.fit(sample_rows=1000)
    rows = CriteoReader(CRITEO / "sample.train.gz", 8192)
    _same(list(spec.reader(pipeline, "test", 8192, train=False)), list(RowRange(rows, 30_000)))
    _same(list(spec.reader(pipeline, "train", 8192, train=True)), list(RowRange(rows, 0, 30_000)))


@pytest.mark.skipif(
    not (MOVIELENS / "u1.test.gz").is_file(),
    reason=f"MovieLens 100K is not at {MOVIELENS} (../shared/data is not checked out here)",
)
def test_movielens_preset_equals_the_movielens_reader() -> None:
    spec = DatasetSpec.from_legacy("movielens", MOVIELENS, split="u2")
    pipeline = spec.fit()
    assert pipeline.id_features[:2] == ("user_id", "item_id") and pipeline.non_id == (("dense", 4),)
    got = list(spec.reader(pipeline, "test", 5000, train=False))
    _same(got, list(MovieLensReader(MOVIELENS, 5000, "u2.test", requires_grad=False)))


def test_legacy_keys_name_the_old_top_level_keys(tmp_path: Path) -> None:
    err = _config_error(lambda: DatasetSpec.from_legacy("criteo", tmp_path))
    assert err.key == "train_rows"
    err = _config_error(lambda: DatasetSpec.from_legacy("criteo", None, train_rows=5))
    assert err.key == "data_dir"
    err = _config_error(lambda: DatasetSpec.from_legacy("movielens", tmp_path, split="u9"))
    assert err.key == "split"
    err = _config_error(lambda: DatasetSpec.from_legacy("iris"))
    assert err.key == "dataset" and "adult, criteo, movielens" in str(err)
    err = _config_error(lambda: DatasetSpec.from_legacy("criteo", tmp_path, train_rows=5).fit())
    assert err.key == "data_dir" and "no file matches" in str(err)
    assert DatasetSpec.from_legacy("adult").preset == "adult"
    assert CsvDialect(na_values="NA").na_values == ("NA",)  # type: ignore[arg-type]  # YAML str
