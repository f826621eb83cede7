"""The feature pipeline: its JSON round trip, atomic save/load, and raw records built into
exactly the batch a text file with the same values gives."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from embeddb.errors import CorruptDataError, InvalidArgumentError, NotFoundError
from embeddb.features import (
    PIPELINE_FILE,
    ColumnSpec,
    CsvDialect,
    CsvReader,
    FeaturePipeline,
    IDColumn,
    IdKind,
    LabelColumn,
    NumericColumn,
    hash_strings,
    load_pipeline,
    save_pipeline,
)
from embeddb.features.batch import Batch

SPEC = ColumnSpec(
    ids=(
        IDColumn("user"),
        IDColumn("tags", separator="|", namespace="shared"),
        IDColumn("code", kind=IdKind.INT, missing_id=7),
        IDColumn("ad", kind="hex", name="ad_id"),
        IDColumn("city", namespace="shared"),
    ),
    numeric=(
        NumericColumn(("price",), name="price", log1p=True),
        NumericColumn(
            ("age", "score"), name="profile", fill=-1.0, standardize=((35.5, 12.25), (0.1, 3.0))
        ),
    ),
    labels=(LabelColumn("clicked"),),
)
PIPELINE = FeaturePipeline(SPEC, na_values=("NA", "null"), positive="click", strip=False)

HEADER = "user,tags,code,ad,city,price,age,score,clicked"
CSV_ROWS = [
    "u1,a|b,12,68fd1e64,Zürich,12.5,31,0.25,1",
    "u2,,,,,,,,-1",
    "NA,b||c,18446744073709551615,ABCDEF0123456789,null,1e-3,-4,-2.5e2,1",
    "u1,NA,0,0,Bern,3,120.75,NA,0",
    "日本,x,42,ff,Zürich,-7,0,2.5e30,-1",
]
RECORDS: list[dict[str, object]] = [
    {"user": "u1", "tags": ["a", "b"], "code": 12, "ad": "68fd1e64", "city": "Zürich",
     "price": 12.5, "age": 31, "score": 0.25, "clicked": 1},
    {"user": "u2", "tags": None, "ad": "", "city": None, "price": None, "age": "",
     "clicked": -1},
    {"user": "NA", "tags": "b||c", "code": "18446744073709551615", "ad": "ABCDEF0123456789",
     "city": "null", "price": "1e-3", "age": -4.0, "score": -250.0, "clicked": "1"},
    {"user": "u1", "tags": "NA", "code": 0, "ad": "0", "city": "Bern", "price": 3,
     "age": 120.75, "score": "NA", "clicked": 0},
    {"user": "日本", "tags": ["x", None, "NA"], "code": 42, "ad": "ff", "city": "Zürich",
     "price": -7, "age": False, "score": 2.5e30, "clicked": -1.0},
]  # fmt: skip


def _assert_same(a: Batch, b: Batch) -> None:
    assert a.batch_size == b.batch_size
    assert [f.name for f in a.id_type_features] == [f.name for f in b.id_type_features]
    for fa, fb in zip(a.id_type_features, b.id_type_features, strict=True):
        assert fa.values.tolist() == fb.values.tolist(), fa.name
        assert fa.counts().tolist() == fb.counts().tolist(), fa.name
    for na, nb in zip(a.non_id_type_features, b.non_id_type_features, strict=True):
        assert na.name == nb.name
        assert na.data.dtype == nb.data.dtype == np.float32
        assert na.data.tobytes() == nb.data.tobytes(), na.name  # bit for bit
    assert len(a.labels) == len(b.labels)
    for la, lb in zip(a.labels, b.labels, strict=True):
        assert la.data.tobytes() == lb.data.tobytes()


def _csv_batch(tmp_path: Path, rows: list[str], pipeline: FeaturePipeline) -> Batch:
    path = tmp_path / "rows.csv"
    path.write_text("\n".join([HEADER, *rows]) + "\n", encoding="utf-8")
    dialect = CsvDialect(na_values=pipeline.na_values, strip=pipeline.strip)
    (batch,) = list(CsvReader(path, pipeline.spec, 100, dialect, requires_grad=False))
    return batch


def test_json_round_trip_keeps_every_setting(tmp_path: Path) -> None:
    doc = json.loads(json.dumps(PIPELINE.to_json()))
    again = FeaturePipeline.from_json(doc)
    assert again == PIPELINE
    assert again.to_json() == PIPELINE.to_json()
    assert doc["ids"][2] == {"column": "code", "name": None, "kind": "int", "separator": None,
                             "namespace": None, "missing_id": 7}  # fmt: skip
    assert doc["numeric"][1]["standardize"] == [[35.5, 12.25], [0.1, 3.0]]
    assert doc["na_values"] == ["NA", "null"] and doc["positive"] == "click"
    assert PIPELINE.id_features == ("user", "tags", "code", "ad_id", "city")
    assert PIPELINE.non_id == (("price", 1), ("profile", 2))
    ordered = FeaturePipeline(SPEC, strip=True, order_threshold="2024-01-05")
    assert FeaturePipeline.from_json(ordered.to_json()) == ordered
    path = tmp_path / PIPELINE_FILE
    save_pipeline(PIPELINE, path)
    assert load_pipeline(path) == PIPELINE
    assert [p.name for p in tmp_path.iterdir()] == [PIPELINE_FILE]  # no temporary left


@pytest.mark.parametrize(
    ("edit", "match"),
    [
        (lambda d: d.pop("ids"), "missing key 'ids'"),
        (lambda d: d.update(version=2), "version 2"),
        (lambda d: d["ids"][0].update(kind="float"), "float"),
        (lambda d: d["numeric"][1].update(standardize=[[1.0, 0.0], [0.0, 1.0]]), "std > 0"),
        (lambda d: d["labels"][0].update(positive="yes"), "expected a list"),
        (lambda d: d.update(na_values=[3]), "expected a string"),
    ],
)
def test_malformed_documents_are_corrupt_data(edit: object, match: str, tmp_path: Path) -> None:
    doc = PIPELINE.to_json()
    edit(doc)  # type: ignore[operator]
    with pytest.raises(CorruptDataError, match=match):
        FeaturePipeline.from_json(doc, source="model/features.json")
    path = tmp_path / "features.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(CorruptDataError, match=str(path)):
        load_pipeline(path)
    path.write_text("{not json")
    with pytest.raises(CorruptDataError, match="not JSON"):
        load_pipeline(path)
    with pytest.raises(NotFoundError):
        load_pipeline(tmp_path / "absent.json")


@pytest.mark.slow
def test_records_equal_the_csv_rows_bit_for_bit(tmp_path: Path) -> None:
    plain = FeaturePipeline(SPEC)  # no markers: "NA" is a string like any other
    rows = [r.replace(",120.75,NA,", ",120.75,,") for r in CSV_ROWS]
    records = [{**r, "score": None} if r.get("score") == "NA" else r for r in RECORDS]
    records[4] = {**records[4], "tags": ["x", None, ""]}  # null and empty items: no id
    from_records = plain.batch_from_records(records, missing="fill")  # training's fill
    _assert_same(_csv_batch(tmp_path, rows, plain), from_records)
    assert from_records.feature("user").counts().tolist() == [1, 1, 1, 1, 1]
    assert from_records.feature("tags").counts().tolist() == [2, 0, 2, 1, 1]
    assert from_records.feature("city").counts().tolist() == [1, 0, 1, 1, 1]


def test_missing_value_markers_in_records_equal_the_csv_rows(tmp_path: Path) -> None:
    from_csv = _csv_batch(tmp_path, CSV_ROWS, PIPELINE)
    from_records = PIPELINE.batch_from_records(RECORDS, missing="fill")
    _assert_same(from_csv, from_records)
    # What the rows mean, pinned: hashing, missing values and transforms.
    user = from_records.feature("user")
    assert user.counts().tolist() == [1, 1, 0, 1, 1]  # "NA" is missing
    assert user.values.tolist() == hash_strings(["u1", "u2", "u1", "日本"], "user").tolist()
    tags = from_records.feature("tags")
    assert tags.counts().tolist() == [2, 0, 2, 0, 1]
    assert tags.values.tolist() == hash_strings(["a", "b", "b", "c", "x"], "shared").tolist()
    city = from_records.feature("city")
    assert city.values[0] == hash_strings(["Zürich"], "shared")[0]  # the shared namespace
    assert from_records.feature("code").values.tolist() == [12, 7, 2**64 - 1, 0, 42]
    assert from_records.feature("ad_id").values.tolist() == [
        0x68FD1E64, 0xABCDEF0123456789, 0, 0xFF]  # fmt: skip
    price = from_records.non_id_type_features[0].data.ravel()
    assert price.tolist() == np.log1p([12.5, 0.0, 1e-3, 3.0, 0.0]).astype(np.float32).tolist()
    profile = from_records.non_id_type_features[1].data
    assert profile[1].tolist() == np.float32([(-1 - 35.5) / 12.25, (-1 - 0.1) / 3.0]).tolist()
    assert from_records.labels[0].data.ravel().tolist() == [1, 0, 1, 0, 0]  # 1/-1 -> 1/0


def test_labels_are_kept_when_every_record_has_them(tmp_path: Path) -> None:
    spec = ColumnSpec(ids=(IDColumn("user"),), labels=(LabelColumn("y", positive=("yes",)),))
    pipeline = FeaturePipeline(spec)
    batch = pipeline.batch_from_records([{"user": "a", "y": "yes"}, {"user": "b", "y": "no"}])
    assert batch.labels[0].data.ravel().tolist() == [1, 0]
    assert pipeline.batch_from_records([{"user": "a", "y": "yes"}, {"user": "b"}]).labels == ()
    with pytest.raises(InvalidArgumentError, match=r"record 1: label column 'y' is empty"):
        pipeline.batch_from_records([{"user": "a", "y": "yes"}, {"user": "b"}], requires_grad=True)


def test_stripped_dialect_and_lists_without_separator(tmp_path: Path) -> None:
    spec = ColumnSpec(ids=(IDColumn("user"), IDColumn("tags"), IDColumn("n", kind="int")))
    pipeline = FeaturePipeline(spec, strip=True)
    path = tmp_path / "s.csv"
    path.write_text("user,tags,n\n  u1 , a ,3\nu2\t,b, 4 \n")
    dialect = CsvDialect(strip=True)
    (csv_batch,) = list(CsvReader(path, spec, 10, dialect, requires_grad=False))
    records = [{"user": "  u1 ", "tags": " a ", "n": 3}, {"user": "u2\t", "tags": "b", "n": " 4 "}]
    _assert_same(csv_batch, pipeline.batch_from_records(records))
    listed = pipeline.batch_from_records(
        [{"user": "u", "tags": ["a", " b", ""], "n": [1, 2]}, {"user": "v", "tags": "c", "n": 5}]
    )
    tags = listed.feature("tags")
    assert tags.counts().tolist() == [2, 1]  # a list: one id per item (empty items dropped)
    assert tags.values.tolist() == hash_strings(["a", "b", "c"], "tags").tolist()
    assert listed.feature("n").values.tolist() == [1, 2, 5]


@pytest.mark.parametrize(
    ("records", "match"),
    [
        ([], "at least one record"),
        ("abc", "a list of objects"),
        ([{"user": "a"}, ["user", "b"]], r"record 1: must be an object"),
        ([{"user": {"x": 1}}], r"record 0: column 'user': dict is not a string"),
        ([{"user": "a"}, {"user": "b", "price": [1.0]}], r"record 1: column 'price': a list"),
        ([{"user": "a", "tags": [["a"]]}], r"record 0: column 'tags': lists of lists"),
        ([{"user": "a"}, {"user": "b", "code": -3}], r"record 1: column 'code': '-3' is not"),
        ([{"user": "a"}, {"user": "b", "code": 1.5}], r"record 1: column 'code': '1.5' is not"),
        ([{"user": "a"}, {"user": "b", "ad": "xyz"}], r"record 1: column 'ad': 'xyz' is not"),
        ([{"user": "a", "price": "cheap"}], r"record 0: column 'price': 'cheap' is not a number"),
    ],
)
def test_bad_records_name_the_record_and_the_column(records: object, match: str) -> None:
    with pytest.raises(InvalidArgumentError, match=match):
        PIPELINE.batch_from_records(records)  # type: ignore[arg-type]


def test_bad_numeric_labels_name_the_row(tmp_path: Path) -> None:
    spec = ColumnSpec(ids=(IDColumn("user"),), labels=(LabelColumn("y"),))
    path = tmp_path / "l.csv"
    path.write_text("user,y\na,1\nb,-1\nc,+1\nd,2\n")
    with pytest.raises(CorruptDataError, match=r"l.csv:5: label column 'y': 2.0 is not 1, 0 or -1"):
        list(CsvReader(path, spec, 10))
    with pytest.raises(InvalidArgumentError, match=r"record 1: label column 'y': 0.5"):
        FeaturePipeline(spec).batch_from_records(
            [{"user": "a", "y": 1}, {"user": "b", "y": 0.5}], requires_grad=True
        )
