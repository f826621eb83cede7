"""Per-split header settings and derived columns of a job's ``dataset:``: train and test files
that differ in their header line; an hour / weekday of a timestamp column (unix time or
ISO-8601) as an ID or numeric feature, computed the same way from a file at training and from
a raw record at serving; every mistake names its key and job line, or the data file and
line."""

from __future__ import annotations

import datetime as dt
import re
from pathlib import Path

import numpy as np
import pytest
import yaml

from embeddb.errors import ConfigError, InvalidArgumentError
from embeddb.features import DatasetSpec, hash_strings, load_pipeline, save_pipeline
from embeddb.features.batch import Batch
from embeddb.trainer.launcher.job_yaml import load_with_lines


def _load(tmp_path: Path, job: str) -> DatasetSpec:
    path = tmp_path / "job.yaml"
    path.write_text(job)
    raw, where = load_with_lines(path, "job.yaml")
    return DatasetSpec.from_yaml_node(raw["dataset"], base_dir=tmp_path, where=where)


def _mistake(tmp_path: Path, job: str) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        _load(tmp_path, job).fit()
    return info.value


def _all(spec: DatasetSpec, split: str) -> list[Batch]:
    pipeline = spec.fit()
    return list(spec.reader(pipeline, split, 1000, train=False))


# --------------------------------------------------------------------------------------------
# Per-split headers
# --------------------------------------------------------------------------------------------

HEADERS = """\
dataset:
  format: csv
  train: train.csv
  test: test.csv
  header: {train: true, test: false}
  label: clicked
  ids: [user]
  numeric: [price]
  shuffle: false
"""


def test_train_and_test_files_may_differ_in_their_header(tmp_path: Path) -> None:
    """Issue 22: one header setting covered both; a headerless test file lost its first row
    (or a train header was read as a row)."""
    (tmp_path / "train.csv").write_text("user,price,clicked\nu1,2,1\nu2,3,0\n")
    (tmp_path / "test.csv").write_text("u3,4,1\nu4,5,0\n")
    spec = _load(tmp_path, HEADERS)
    assert spec.dialect("test").names == ("user", "price", "clicked")  # the train header's
    (test,) = _all(spec, "test")
    assert test.feature("user").values.tolist() == hash_strings(["u3", "u4"], "user").tolist()
    assert test.non_id_type_features[0].data.ravel().tolist() == [4.0, 5.0]
    (train,) = _all(spec, "train")
    assert train.batch_size == 2
    # the other way round: a headerless train file takes the test file's header names
    (tmp_path / "train.csv").write_text("u1,2,1\nu2,3,0\n")
    (tmp_path / "test.csv").write_text("user,price,clicked\nu3,4,1\n")
    spec = _load(tmp_path, HEADERS.replace("{train: true, test: false}", "{train: false}"))
    (train,) = _all(spec, "train")
    assert train.feature("user").values.tolist() == hash_strings(["u1", "u2"], "user").tolist()
    assert [b.batch_size for b in _all(spec, "test")] == [1]


@pytest.mark.parametrize(
    ("header", "key", "line", "message"),
    [
        ("{train: true, tset: false}", "dataset.header.tset", 5, "is not a split"),
        ("{train: true, test: 0}", "dataset.header.test", 5, "must be true or false"),
        ("{train: false, test: false}", "dataset.names", 1, "needs its column names"),
        ("yes please", "dataset.header", 5, "must be true or false"),
    ],
)
def test_header_mistakes_name_the_key_and_its_line(
    tmp_path: Path, header: str, key: str, line: int, message: str
) -> None:
    error = _mistake(tmp_path, HEADERS.replace("{train: true, test: false}", header))
    assert error.key == key
    assert message in str(error) and f"(job.yaml:{line})" in str(error)


def test_a_test_header_without_test_files_is_a_mistake(tmp_path: Path) -> None:
    job = HEADERS.replace("  test: test.csv\n", "  split: {fraction: 0.5}\n")
    error = _mistake(tmp_path, job)
    assert error.key == "dataset.header.test" and "(job.yaml:5)" in str(error)
    assert "there are no test files" in str(error)
    error = _mistake(tmp_path, job.replace("{train: true, test: false}", "{train: false}"))
    assert error.key == "dataset.names" and "there are no test files" in str(error)


# --------------------------------------------------------------------------------------------
# Derived columns
# --------------------------------------------------------------------------------------------

DERIVED = """\
dataset:
  format: csv
  train: clicks.csv
  split: {fraction: 0.25, seed: 1}
  label: clicked
  ids: [user, {column: hour, kind: int}, weekday]
  numeric: [{column: hour, name: hour_x}, {column: month, transform: standardize}]
  derived:
    hour: {from: time, extract: hour}
    weekday: {from: time, extract: weekday}
    month: {from: time, extract: month, utc_offset: 5.5}
  shuffle: false
"""


def _clicks(tmp_path: Path, n: int = 400) -> list[tuple[str, str, int]]:
    """Rows (user, time text, label): the time as unix seconds, ISO with a space, with T and
    Z, with an offset, and empty, in turn."""
    rng = np.random.default_rng(5)
    rows = []
    for i in range(n):
        t = dt.datetime.fromtimestamp(int(rng.integers(1e9, 2e9)), dt.timezone.utc)
        form = i % 5
        text = [
            str(int(t.timestamp())),
            t.strftime("%Y-%m-%d %H:%M:%S"),
            t.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
            (t + dt.timedelta(hours=-3)).strftime("%Y-%m-%dT%H:%M-03:00"),
            "",
        ][form]
        rows.append((f"u{i % 13}", text, i % 2))
    lines = ["user,time,clicked", *(f"{u},{t},{c}" for u, t, c in rows)]
    (tmp_path / "clicks.csv").write_text("\n".join(lines) + "\n")
    return rows


def _expected(text: str) -> tuple[int, int, int] | None:
    """(hour, weekday, month at UTC+5:30) by Python's datetime, None for an empty time."""
    if not text:
        return None
    if text.isdigit():
        t = dt.datetime.fromtimestamp(int(text), dt.timezone.utc)
    else:
        t = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
        t = t.replace(tzinfo=t.tzinfo or dt.timezone.utc).astimezone(dt.timezone.utc)
    month = (t + dt.timedelta(hours=5.5)).month
    return t.hour, t.weekday(), month


def test_hour_and_weekday_of_a_timestamp_train_and_serve_alike(tmp_path: Path) -> None:
    """Issue 22: no derived column (an hour from a timestamp) could be declared."""
    rows = _clicks(tmp_path)
    spec = _load(tmp_path, DERIVED)
    pipeline = spec.fit()
    assert pipeline.id_features == ("user", "hour", "weekday")
    assert pipeline.spec.columns() == ["user", "time", "clicked"]
    save_pipeline(pipeline, tmp_path / "features.json")
    served = load_pipeline(tmp_path / "features.json")
    assert served == pipeline
    splits = [spec.reader(pipeline, s, 64, train=True) for s in ("train", "test")]
    assert sum(b.batch_size for reader in splits for b in reader) == len(rows)
    # one batch of every row, in file order: the test reader of a split-free spec
    whole = _load(tmp_path, DERIVED.replace("split: {fraction: 0.25, seed: 1}", "test: clicks.csv"))
    (batch,) = list(whole.reader(whole.fit(), "test", 1000, train=True))
    expected = [_expected(t) for _, t, _ in rows]
    present = [e is not None for e in expected]
    hour = batch.feature("hour")
    assert hour.counts().tolist() == [int(p) for p in present]
    assert hour.values.tolist() == [e[0] for e in expected if e is not None]
    weekday = batch.feature("weekday")
    assert (
        weekday.values.tolist()
        == hash_strings([str(e[1]) for e in expected if e is not None], "weekday").tolist()
    )
    hour_x = batch.non_id_type_features[0].data.ravel()
    assert hour_x.tolist() == [e[0] if e is not None else 0.0 for e in expected]
    # serving: the raw records (time as text, or as a JSON number) give the same batch
    records: list[dict[str, object]] = [
        {"user": u, "time": int(t) if t.isdigit() else (t or None), "clicked": c}
        for u, t, c in rows
    ]
    from_records = served.batch_from_records(records, missing="fill", requires_grad=True)
    for name in ("user", "hour", "weekday"):
        assert from_records.feature(name).values.tolist() == batch.feature(name).values.tolist()
        assert from_records.feature(name).counts().tolist() == batch.feature(name).counts().tolist()
    for a, b in zip(from_records.non_id_type_features, batch.non_id_type_features, strict=True):
        assert a.data.tobytes() == b.data.tobytes()


def test_a_bad_timestamp_names_the_file_line_and_column(tmp_path: Path) -> None:
    _clicks(tmp_path, 50)
    lines = (tmp_path / "clicks.csv").read_text().splitlines()
    lines[31] = "u1,2017-02-30 10:00,1"  # line 32: no such day
    (tmp_path / "clicks.csv").write_text("\n".join(lines) + "\n")
    error = _mistake(tmp_path, DERIVED)
    assert error.key == "dataset.train"
    assert "clicks.csv:32: column 'time': '2017-02-30 10:00' is not a timestamp" in str(error)
    spec = _load(tmp_path, DERIVED.replace("clicks.csv", "ok.csv"))
    (tmp_path / "ok.csv").write_text("user,time,clicked\nu1,1510047038,1\nu2,1510047038,0\n")
    pipeline = spec.fit()
    with pytest.raises(InvalidArgumentError, match="record 1: column 'time': 'noon' is not a"):
        pipeline.batch_from_records([{"user": "a", "time": 1}, {"user": "b", "time": "noon"}])
    far = "record 0: column 'time': 1000000000000000.0 is not a timestamp"  # after 9999
    with pytest.raises(InvalidArgumentError, match=re.escape(far)):
        pipeline.batch_from_records([{"user": "a", "time": 1e15}])


@pytest.mark.parametrize(
    ("entry", "key", "message"),
    [
        (
            "{from: time, extract: weekly}",
            "dataset.derived.hour.extract",
            "must be one of hour, weekday, day, month, year, got 'weekly'",
        ),
        (
            "{from: nowhere, extract: hour}",
            "dataset.derived.hour.from",
            "column 'nowhere' is not in",
        ),
        ("{from: time}", "dataset.derived.hour.extract", "is required"),
        (
            "{from: time, extract: hour, unit: days}",
            "dataset.derived.hour.unit",
            "must be one of seconds, milliseconds",
        ),
        (
            "{from: time, extract: hour, utc_offset: 30}",
            "dataset.derived.hour.utc_offset",
            "must be hours in [-24, 24]",
        ),
        (
            "{from: time, extract: hour, every: 2}",
            "dataset.derived.hour.every",
            "is not a derived-column setting",
        ),
        ("{from: hour, extract: hour}", "dataset.derived.hour", "cannot replace its source"),
        ("[time, hour]", "dataset.derived.hour", "must be {from: COLUMN, extract: PART}"),
    ],
)
def test_derived_mistakes_name_the_key_and_its_line(
    tmp_path: Path, entry: str, key: str, message: str
) -> None:
    _clicks(tmp_path, 10)
    error = _mistake(tmp_path, DERIVED.replace("{from: time, extract: hour}", entry))
    assert error.key == key
    assert message in str(error) and "(job.yaml:9)" in str(error)


def test_a_derived_name_may_not_hide_a_file_column(tmp_path: Path) -> None:
    _clicks(tmp_path, 10)
    job = (
        DERIVED.replace("    hour: {from: time", "    user: {from: time")
        .replace("ids: [user, {column: hour, kind: int}, weekday]", "ids: [user, weekday]")
        .replace("{column: hour, name: hour_x}", "{column: user, name: hour_x}")
    )
    error = _mistake(tmp_path, job)
    assert error.key == "dataset.derived.user" and "has a column 'user' already" in str(error)
    libsvm = (
        "dataset:\n  format: libsvm\n  train: x.svm\n  split: {fraction: 0.5}\n"
        "  derived: {hour: {from: '3', extract: hour}}\n"
    )
    error = _mistake(tmp_path, libsvm)
    assert error.key == "dataset.derived" and "not libsvm" in str(error)


def test_timestamps_of_a_parquet_column_of_any_type(tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    t = [dt.datetime(2017, 11, 7, 9, 30, 38), dt.datetime(2020, 2, 29, 23, 59, 59), None]
    table = pa.table(
        {
            "stamp": pa.array(t, pa.timestamp("us")),
            "seconds": pa.array(
                [int(x.replace(tzinfo=dt.timezone.utc).timestamp()) if x else None for x in t],
                pa.int64(),
            ),
            "label": pa.array([1, 0, 1], pa.int8()),
        }
    )
    pq.write_table(table, tmp_path / "t.parquet")
    job = yaml.safe_dump(
        {
            "dataset": {
                "format": "parquet",
                "train": "t.parquet",
                "test": "t.parquet",
                "label": "label",
                "ids": [
                    {"column": "h1", "kind": "int"},
                    {"column": "h2", "kind": "int"},
                    {"column": "d", "kind": "int"},
                ],
                "derived": {
                    "h1": {"from": "stamp", "extract": "hour"},
                    "h2": {"from": "seconds", "extract": "hour"},
                    "d": {"from": "stamp", "extract": "day"},
                },
                "shuffle": False,
            }
        }
    )
    spec = _load(tmp_path, job)
    (batch,) = _all(spec, "test")
    assert batch.feature("h1").values.tolist() == [9, 23]
    assert batch.feature("h1").counts().tolist() == [1, 1, 0]
    assert batch.feature("h2").values.tolist() == [9, 23]
    assert batch.feature("d").values.tolist() == [7, 29]
