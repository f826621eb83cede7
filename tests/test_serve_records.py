"""Raw records as a server builds them (issue 22): a missing numeric value is the training
mean (recorded by ``fit``, with a fallback for pipelines saved before), an unknown key is
refused unless lenient, a number that is not finite or a string that is not Unicode is an
InvalidArgumentError naming the record and the column, and long strings hash in one compiled
pass (the same ids as the chain of the hashing module's docstring)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from embeddb.common.routing import mix64
from embeddb.errors import CorruptDataError, InvalidArgumentError
from embeddb.features import (
    ColumnSpec,
    DatasetSpec,
    FeaturePipeline,
    IDColumn,
    LabelColumn,
    NumericColumn,
    hash_strings,
)
from embeddb.features.hashing import hash_fields, namespace_seed
from embeddb.features.records import RecordStats

SPEC = ColumnSpec(
    ids=(IDColumn("user"), IDColumn("tags", separator="|")),
    numeric=(
        NumericColumn(("price",), name="price", log1p=True),
        NumericColumn(("age", "score"), name="profile", standardize=((35.5, 12.25), (0.1, 3.0))),
        NumericColumn(("hours",), name="hours", fill=-1.0),
    ),
    labels=(LabelColumn("clicked"),),
)
MEANS = {"price": (20.0,), "profile": (35.5, 0.1), "hours": (7.5,)}
FITTED = FeaturePipeline(SPEC, na_values=("NA",), means=MEANS)
FULL = {"user": "u1", "tags": "a|b", "price": 20.0, "age": 35.5, "score": 0.1, "hours": 7.5}


def _dense(pipeline: FeaturePipeline, records: list[dict[str, object]], **kw: object) -> list:
    batch = pipeline.batch_from_records(records, **kw)  # type: ignore[arg-type]
    return [f.data for f in batch.non_id_type_features]


# ------------------------------------------------------------------ missing numeric values
@pytest.mark.parametrize(
    "missing",
    [
        {k: v for k, v in FULL.items() if k in ("user", "tags")},  # absent keys
        {**FULL, "price": None, "age": None, "score": None, "hours": None},  # null
        {**FULL, "price": "NA", "age": "", "score": "NA", "hours": ""},  # markers, empty
    ],
)
def test_a_missing_numeric_value_is_the_training_mean(missing: dict[str, object]) -> None:
    stats = RecordStats()
    price, profile, hours = _dense(FITTED, [missing, FULL], stats=stats)
    assert stats.missing_filled == 4 and stats.unknown_keys == 0
    # exactly what the training transform makes of the mean: 0 after standardize
    assert profile[0].tolist() == [0.0, 0.0] == profile[1].tolist()
    assert price[0].tolist() == price[1].tolist() == [np.float32(np.log1p(20.0))]
    assert hours[0].tolist() == hours[1].tolist() == [7.5]
    # training's fill, on request (the text reader's behaviour): 0 before the transforms
    price, profile, hours = _dense(FITTED, [missing], missing="fill")
    assert price[0].tolist() == [0.0] and hours[0].tolist() == [-1.0]
    assert profile[0].tolist() == np.float32([-35.5 / 12.25, -0.1 / 3.0]).tolist()


def test_pipelines_saved_without_means_fill_the_standardize_mean_else_fill() -> None:
    doc = FITTED.to_json()
    assert [e["mean"] for e in doc["numeric"]] == [[20.0], [35.5, 0.1], [7.5]]
    for entry in doc["numeric"]:
        del entry["mean"]  # a features.json written before the means were recorded
    old = FeaturePipeline.from_json(json.loads(json.dumps(doc)))
    assert old.means == {}
    assert old.missing_fills() == {"price": 0.0, "age": 35.5, "score": 0.1, "hours": -1.0}
    stats = RecordStats()
    price, profile, hours = _dense(old, [{"user": "u"}], stats=stats)
    assert stats.missing_filled == 4
    assert profile[0].tolist() == [0.0, 0.0]  # the standardize mean is the training mean
    assert price[0].tolist() == [0.0] and hours[0].tolist() == [-1.0]  # training's fill
    assert FeaturePipeline.from_json(FITTED.to_json()) == FITTED


def test_means_must_be_finite_one_per_column() -> None:
    with pytest.raises(CorruptDataError, match=r"means\.profile"):
        FeaturePipeline.from_json(
            {**FITTED.to_json(), "numeric": [
                {**e, "mean": [1.0]} for e in FITTED.to_json()["numeric"]]}
        )  # fmt: skip
    with pytest.raises(Exception, match="finite"):
        FeaturePipeline(SPEC, means={"price": (float("inf"),)})


def test_mixed_columns_and_stripped_dialects_fill_too() -> None:
    pipeline = FeaturePipeline(SPEC, na_values=("NA",), strip=True, means=MEANS)
    records = [{**FULL, "price": " NA ", "age": " 40 "}, {**FULL, "price": 3, "age": "\t"}]
    stats = RecordStats()
    price, profile, _ = _dense(pipeline, records, stats=stats)
    assert stats.missing_filled == 2
    assert price.ravel().tolist() == np.float32(np.log1p([20.0, 3.0])).tolist()
    assert profile[:, 0].tolist() == np.float32([(40 - 35.5) / 12.25, 0.0]).tolist()


def test_fit_records_the_raw_training_means(tmp_path: Path) -> None:
    csv = tmp_path / "train.csv"
    csv.write_text("user,price,age,hours,y\na,3,20,1,1\nb,,30,2,0\nc,9,40,,1\nd,4,50,5,0\n")
    node = {
        "format": "csv",
        "train": str(csv),
        "split": {"fraction": 0.25},
        "label": {"column": "y"},
        "ids": ["user"],
        "numeric": [
            {"column": "price", "transform": "log1p"},
            {"column": "age", "transform": "standardize"},
            {"column": "hours", "fill": 10.0},
        ],
    }
    fitted = DatasetSpec.from_yaml_node(node, base_dir=tmp_path).fit()
    # raw (before log1p), missing values counted as their fill, as training fed them
    assert fitted.means["price"] == pytest.approx(((3 + 0 + 9 + 4) / 4,))
    assert fitted.means["age"] == pytest.approx((35.0,))
    assert fitted.means["hours"] == pytest.approx(((1 + 2 + 10 + 5) / 4,))
    (age,) = [n for n in fitted.spec.numeric if n.name == "age"]
    assert age.standardize is not None and age.standardize[0][0] == pytest.approx(35.0)
    again = FeaturePipeline.from_json(json.loads(json.dumps(fitted.to_json())))
    assert again.means == fitted.means
    price = fitted.batch_from_records([{"user": "a"}]).non_id_type_features[0].data
    assert price.tolist() == [[np.float32(np.log1p(4.0))]]


# ------------------------------------------------------------------------- unknown keys
def test_an_unknown_key_is_refused_unless_lenient() -> None:
    records = [FULL, {**FULL, "pirce": 3.0, "extra": 1}, {**FULL, "more": 2}]
    stats = RecordStats()
    with pytest.raises(InvalidArgumentError) as caught:
        FITTED.batch_from_records(records, stats=stats)
    message = str(caught.value)
    assert message.startswith("record 1: unknown keys 'extra', 'pirce' (did you mean 'price' for")
    assert "lenient_records" in message and "price" in message
    assert stats.unknown_keys == 3  # every record was counted before the refusal
    with pytest.raises(InvalidArgumentError, match=r"did you mean 'price'\?"):
        FITTED.batch_from_records([{**FULL, "pirce": 3.0}])
    lenient = RecordStats()
    batch = FITTED.batch_from_records(records, lenient=True, stats=lenient)
    assert batch.batch_size == 3 and lenient.unknown_keys == 3
    # the label column is a known key (with or without every record having it)
    assert FITTED.batch_from_records([{**FULL, "clicked": 1}, FULL]).batch_size == 2


# --------------------------------------------------------- non-finite numbers, surrogates
@pytest.mark.parametrize(
    ("value", "match"),
    [
        (float("inf"), r"record 1: column 'price': inf is not a finite number"),
        (float("-inf"), r"record 1: column 'price': -inf is not a finite number"),
        (int("9" * 4000), r"record 1: column 'price': 9{20}\.\.\.\(4000 digits\) is not a fin"),
        ("1e999", r"record 1: column 'price': '1e999' is not a finite number \(the text"),
        ("nan", r"record 1: column 'price': 'nan' is not a finite number"),
        ("-inf", r"record 1: column 'price': '-inf' is not a finite number"),  # log1p: 0
    ],
)
def test_numbers_that_are_not_finite_are_refused(value: object, match: str) -> None:
    for pipeline in (FITTED, FeaturePipeline(SPEC)):
        with pytest.raises(InvalidArgumentError, match=match):
            pipeline.batch_from_records([FULL, {**FULL, "price": value}])
    # training's fill mode still refuses what would reach the model as non-finite
    if value in ("1e999", "nan"):
        with pytest.raises(InvalidArgumentError, match=r"record 1: column 'price': '.*' gives"):
            FITTED.batch_from_records([FULL, {**FULL, "price": value}], missing="fill")


def test_a_float32_overflow_after_the_transform_is_refused() -> None:
    with pytest.raises(InvalidArgumentError, match=r"record 0: column 'score': 1e\+300 gives"):
        FITTED.batch_from_records([{**FULL, "score": 1e300}])
    with pytest.raises(InvalidArgumentError, match=r"record 0: column 'user': inf is not a fin"):
        FITTED.batch_from_records([{**FULL, "user": float("inf")}])  # an ID column too


@pytest.mark.parametrize(
    ("record", "column"),
    [
        ({**FULL, "user": "\ud800"}, "user"),
        ({**FULL, "tags": ["a", "b\udfff"]}, "tags"),
        ({**FULL, "price": "\udc00"}, "price"),
    ],
)
def test_a_lone_surrogate_is_refused_naming_the_field(record: dict, column: str) -> None:
    with pytest.raises(InvalidArgumentError, match=f"record 1: column '{column}': the string "):
        FITTED.batch_from_records([FULL, record])


# ------------------------------------------------------------------------------- hashing
def _reference(data: bytes, namespace: str) -> int:
    """The chain of the hashing module's docstring, one Python step per word."""
    h = namespace_seed(namespace)
    padded = data + bytes(-len(data) % 8)
    for k in range(0, len(data), 8):
        word = np.uint64(int.from_bytes(padded[k : k + 8], "little"))
        h = mix64(np.array([h ^ word], dtype=np.uint64))[0]
    return int(mix64(np.array([h ^ np.uint64(len(data))], dtype=np.uint64))[0])


def test_long_strings_hash_like_the_reference_chain() -> None:
    rng = np.random.default_rng(7)
    items = [bytes(rng.integers(0, 256, size=n, dtype=np.uint8)) for n in range(0, 41)]
    items += [b"x" * 4096 + b"y", "Zürich 日本".encode()]
    got = hash_strings(items, "user")
    assert got.tolist() == [_reference(b, "user") for b in items]
    long_id = "u" * (4 << 20) + "!"  # one compiled pass; a word loop in Python took seconds
    (value,) = hash_strings([long_id], "user").tolist()
    assert value == int(hash_strings(np.array([long_id]), "user")[0])
    assert value != int(hash_strings([long_id[:-1]], "user")[0])
    # fields of any shape hash like the list of their bytes
    from embeddb.features._fields import Fields

    buf = np.frombuffer(b"".join(items[:40]), dtype=np.uint8)
    ends = np.cumsum([len(b) for b in items[:40]])
    starts = ends - np.array([len(b) for b in items[:40]])
    fields = Fields(buf, starts.reshape(20, 2), ends.reshape(20, 2))
    ids = hash_fields(fields, namespace_seed("user"))
    assert ids.shape == (20, 2) and ids.ravel().tolist() == got[:40].tolist()


# ----------------------------------------------------------------- the lenient export flag
def test_lenient_records_is_a_job_key_and_a_model_json_field(tmp_path: Path) -> None:
    from embeddb.errors import ConfigError
    from embeddb.trainer.launcher.job import JobConfig
    from embeddb.trainer.model_spec import ModelSpec, NonIdSpec

    job = tmp_path / "job.yaml"
    job.write_text("model: builtin:dnn\nexport_dir: model\nlenient_records: true\n")
    assert JobConfig.from_yaml(job).lenient_records is True
    job.write_text("model: builtin:dnn\nlenient_records: sometimes\n")
    with pytest.raises(ConfigError, match=r"lenient_records: must be true or false.*job\.yaml:2"):
        JobConfig.from_yaml(job)
    spec = ModelSpec(("user",), (NonIdSpec("dense", (2,)),), pipeline="features.json")
    doc = spec.to_json()
    assert doc["lenient_records"] is False
    assert ModelSpec.from_json({**doc, "lenient_records": True}).lenient_records is True
    del doc["lenient_records"]  # a model.json written before the field existed: strict
    assert ModelSpec.from_json(doc).lenient_records is False
    with pytest.raises(CorruptDataError, match="lenient_records must be true or false"):
        ModelSpec.from_json({**doc, "lenient_records": "yes"})
