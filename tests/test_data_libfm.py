"""libFM / libFFM ``field:index:value`` files and libSVM slots: each field (or index range)
becomes its own ID feature, hence its own table, from the reader to a job's fitted pipeline;
the plain libSVM reading (one ``features`` of every index) stays available; no token is ever
dropped silently; every slot mistake names its key and line."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pytest
import yaml

from embeddb.config import EmbeddingConfig
from embeddb.errors import ConfigError, CorruptDataError
from embeddb.features import (
    ColumnSpec,
    DatasetSpec,
    IDColumn,
    IdKind,
    LabelColumn,
    NumericColumn,
    hash_strings,
)
from embeddb.features.batch import Batch
from embeddb.features.libsvm import (
    LibsvmReader,
    field_column,
    range_column,
    sample_fields,
    slot_of,
)
from embeddb.features.stream import Part, partition
from embeddb.trainer.launcher.job_yaml import Where, load_with_lines

auto_embedding_yaml = pytest.importorskip(
    "embeddb.trainer.launcher.validate", reason="the auto tables (the trainer extra)"
).auto_embedding_yaml

FFM = "1 0:3:1 1:17:1 2:5:0.5\n-1 0:4:1 1:17:1\n0 1:9:1 2:5:1 2:6:1 7:1\n"


def _ids(batches: list[Batch], name: str) -> tuple[list[int], list[int]]:
    feats = [b.feature(name) for b in batches]
    values = np.concatenate([f.values for f in feats]).tolist()
    return values, np.concatenate([f.counts() for f in feats]).tolist()


def _slots(*fields: int, kind: IdKind = IdKind.INT) -> ColumnSpec:
    return ColumnSpec(
        ids=tuple(IDColumn(field_column(f), name=f"f{f}", kind=kind) for f in fields),
        numeric=(NumericColumn(("7",), name="seven"),),
        labels=(LabelColumn("label"),),
    )


def test_each_field_is_its_own_id_feature(tmp_path: Path) -> None:
    path = tmp_path / "a.ffm"
    path.write_text(FFM)
    batches = list(LibsvmReader(path, _slots(0, 1, 2), 2))
    assert [f.name for f in batches[0].id_type_features] == ["f0", "f1", "f2"]
    assert _ids(batches, "f0") == ([3, 4], [1, 1, 0])
    assert _ids(batches, "f1") == ([17, 17, 9], [1, 1, 1])
    assert _ids(batches, "f2") == ([5, 5, 6], [1, 0, 2])
    dense = np.concatenate([b.non_id_type_features[0].data for b in batches]).ravel()
    assert dense.tolist() == [0, 0, 1]  # index 7 (any field) read as a number, in no slot
    # string ids hash the index text per feature, like a csv column
    strings = list(LibsvmReader(path, _slots(0, 1, 2, kind=IdKind.STRING), 8))
    assert _ids(strings, "f1")[0] == hash_strings(["17", "17", "9"], "f1").tolist()
    # the plain libSVM reading: one feature of every index, fields ignored
    plain = list(LibsvmReader(path, None, 8, numeric=[7]))
    assert _ids(plain, "features") == ([3, 17, 5, 4, 17, 9, 5, 6], [3, 2, 3])
    # gzip, chunks smaller than a line, and byte ranges give the same rows
    gz = tmp_path / "a.gz"
    gz.write_bytes(gzip.compress(FFM.encode()))
    again = list(LibsvmReader(gz, _slots(0, 1, 2), 3, chunk_bytes=4))
    assert _ids(again, "f2") == _ids(batches, "f2")
    ranked = [
        list(LibsvmReader(None, _slots(0, 1, 2), 3, parts=partition([path], r, 3)))
        for r in range(3)
    ]
    assert sorted(v for part in ranked if part for v in _ids(part, "f1")[0]) == [9, 17, 17]


def test_a_token_no_slot_takes_is_an_error_not_dropped(tmp_path: Path) -> None:
    path = tmp_path / "a.ffm"
    path.write_text(FFM)
    spec = ColumnSpec(
        ids=(IDColumn(field_column(0), name="f0", kind=IdKind.INT),),
        labels=(LabelColumn("label"),),
    )
    message = (
        r"a.ffm:1: '1:17:1' is not taken by any slot \(its field 1 is in none of them; add a "
        r"slot for it, or 'features' to the ids to take the rest\)"
    )
    with pytest.raises(CorruptDataError, match=message):
        list(LibsvmReader(path, spec, 8))
    with pytest.raises(CorruptDataError, match=r"a.ffm:3: '1:9:1' is not taken"):
        list(LibsvmReader(Part(path, len(FFM.split("\n")[0]) + 3), spec, 8))
    # with features, the slots take their fields and features the rest
    rest = ColumnSpec(ids=(*spec.ids, IDColumn("features", kind=IdKind.INT)), labels=spec.labels)
    batches = list(LibsvmReader(path, rest, 8))
    assert _ids(batches, "f0") == ([3, 4], [1, 1, 0])
    assert _ids(batches, "features") == ([17, 5, 17, 9, 5, 6, 7], [2, 1, 4])


def test_index_range_slots_split_a_plain_libsvm_file(tmp_path: Path) -> None:
    """Frappe-style files: one index space, fields as ranges of it."""
    path = tmp_path / "frappe.libfm"
    path.write_text("1 3:1 960:1 5000:1\n-1 5:1 1000:1 5001:1\n")
    spec = ColumnSpec(
        ids=(
            IDColumn(range_column(0, 957), name="user", kind=IdKind.INT),
            IDColumn(range_column(958, 4999), name="item", kind=IdKind.INT),
            IDColumn(range_column(5000, 5381), name="context", kind=IdKind.INT),
        ),
        labels=(LabelColumn("label"),),
    )
    batches = list(LibsvmReader(path, spec, 8))
    assert _ids(batches, "user") == ([3, 5], [1, 1])
    assert _ids(batches, "item") == ([960, 1000], [1, 1])
    assert _ids(batches, "context") == ([5000, 5001], [1, 1])
    assert slot_of(range_column(0, 957)) == (-1, 0, 957)
    assert slot_of(field_column(12)) == (12, -1, -1)
    assert slot_of("indexes:9-3") is None and slot_of("field:x") is None
    assert sample_fields([path], 10) == ((), True)


def _node(text: str) -> object:
    return yaml.safe_load(text)


def test_a_job_gets_one_table_per_field(tmp_path: Path) -> None:
    """Issue 22: format: libsvm summed every index of a row into one feature; a
    field:index:value file failed outright."""
    rng = np.random.default_rng(0)
    lines = []
    for r in range(300):
        label = "1" if r % 3 else "-1"
        lines.append(
            f"{label} 0:{rng.integers(0, 50)}:1 1:{1000 + rng.integers(0, 20)}:1 2:{2000 + r % 4}:1"
        )
    (tmp_path / "train.ffm").write_text("\n".join(lines) + "\n")
    auto = DatasetSpec.from_yaml_node(
        _node("{format: libsvm, train: train.ffm, split: {fraction: 0.2}}"), base_dir=tmp_path
    )
    pipeline = auto.fit()
    assert pipeline.id_features == ("field_0", "field_1", "field_2")
    tables = EmbeddingConfig.from_yaml_text(auto_embedding_yaml(pipeline.id_features, 8))
    assert {n: f.table for n, f in tables.features.items()} == {
        "field_0": "field_0", "field_1": "field_1", "field_2": "field_2",
    }  # fmt: skip
    rows = sum(b.batch_size for s in ("train", "test") for b in auto.reader(pipeline, s, 64,
               train=s == "train"))  # fmt: skip
    assert rows == 300
    named = DatasetSpec.from_yaml_node(
        _node(
            """
            format: libsvm
            train: train.ffm
            split: {fraction: 0.2}
            slots: {user: {field: 0}, item: 1, context: {field: 2, kind: string}}
            """
        ),
        base_dir=tmp_path,
    )
    pipeline = named.fit()
    assert pipeline.id_features == ("user", "item", "context")
    batch = next(iter(named.reader(pipeline, "train", 300, train=True)))
    assert set(batch.feature("item").values.tolist()) <= set(range(1000, 1020))
    assert set(batch.feature("context").values.tolist()) <= set(
        hash_strings([str(2000 + i) for i in range(4)], "context").tolist()
    )
    # the plain reading, asked for: one feature of every index
    plain = DatasetSpec.from_yaml_node(
        _node("{format: libsvm, train: train.ffm, split: {fraction: 0.2}, ids: [features]}"),
        base_dir=tmp_path,
    )
    assert plain.fit().id_features == ("features",)


JOB = """\
dataset:
  format: libsvm
  train: train.ffm
  split: {fraction: 0.2}
  slots:
    user: {field: 0}
    item: {indexes: [10, 20]}
"""


@pytest.mark.parametrize(
    ("change", "key", "line", "message"),
    [
        ("    item: {indexes: [10, 20]}", "dataset.slots", 5,
         "give every slot a field or every slot an index range, not both"),
        ("    item: {field: 0}", "dataset.slots.item.field", 7, "field 0 is slot 'user' too"),
        ("    item: {indexes: [20, 10]}", "dataset.slots.item.indexes[1]", 7,
         "must be an integer >= 20"),
        ("    item: {fields: 1}", "dataset.slots.item.fields", 7, "is not a slot setting"),
        ("    item: {field: 1, kind: hex}", "dataset.slots.item.kind", 7, "must be int or string"),
        ("    item: [1, 2]", "dataset.slots.item", 7, "must be {field: N} or {indexes"),
    ],
)  # fmt: skip
def test_slot_mistakes_name_the_key_and_its_line(
    tmp_path: Path, change: str, key: str, line: int, message: str
) -> None:
    text = JOB.replace("    item: {indexes: [10, 20]}", change)
    path = tmp_path / "job.yaml"
    path.write_text(text)
    raw, where = load_with_lines(path, "job.yaml")
    with pytest.raises(ConfigError) as info:
        DatasetSpec.from_yaml_node(raw["dataset"], base_dir=tmp_path, where=where)
    assert info.value.key == key
    assert message in str(info.value) and f"(job.yaml:{line})" in str(info.value)


def test_ranges_must_not_overlap_and_slots_are_libsvm_only(tmp_path: Path) -> None:
    where = Where("job.yaml", {"dataset.slots.b.indexes": 9, "dataset.slots": 4})
    node = {
        "format": "libsvm",
        "train": "x",
        "split": {"fraction": 0.5},
        "slots": {"a": {"indexes": [0, 10]}, "b": {"indexes": [10, 12]}},
    }
    with pytest.raises(ConfigError, match=r"\[10, 12\] overlaps slot 'a' \[0, 10\] \(job.yaml:9\)"):
        DatasetSpec.from_yaml_node(node, base_dir=tmp_path, where=where)
    node = {**node, "format": "csv", "label": "y", "slots": {"a": 0}}
    with pytest.raises(ConfigError, match=r"dataset.slots: applies to libsvm files"):
        DatasetSpec.from_yaml_node(node, base_dir=tmp_path, where=where)
