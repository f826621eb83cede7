"""embeddb.features.libsvm: libSVM / libFM text read into ids, numeric columns and
labels, chunked, gzip, partitioned and split, with file:line in every error."""

from __future__ import annotations

import gzip
import random
from pathlib import Path

import numpy as np
import pytest

from embeddb.errors import ConfigError, CorruptDataError
from embeddb.features import (
    ColumnSpec,
    IDColumn,
    IdKind,
    LabelColumn,
    NumericColumn,
    hash_strings,
)
from embeddb.features.batch import Batch
from embeddb.features.libsvm import LibsvmReader, libsvm_spec
from embeddb.features.stream import HashSplit, Part, partition

TEXT = "1 3:1 17:0.5 2041:1\n-1 3:1 9:1\r\n\n+1   5:2\t17:0  8:1\n0\n0 17:4 9:0\n"


def _ids(batches: list[Batch], name: str = "features") -> tuple[list[int], list[int]]:
    feats = [b.feature(name) for b in batches]
    values = np.concatenate([f.values for f in feats]).tolist()
    return values, np.concatenate([f.counts() for f in feats]).tolist()


def _dense(batches: list[Batch]) -> np.ndarray:
    return np.concatenate([b.non_id_type_features[0].data for b in batches])


def _labels(batches: list[Batch]) -> list[float]:
    labels: list[float] = np.concatenate([b.labels[0].data for b in batches]).ravel().tolist()
    return labels


def test_labels_ids_and_numeric_indexes(tmp_path: Path) -> None:
    path = tmp_path / "a.libfm"
    path.write_text(TEXT)
    batches = list(LibsvmReader(path, None, 2, numeric=[17]))
    assert [b.batch_size for b in batches] == [2, 2, 1]  # the empty line is no row
    assert _labels(batches) == [1, 0, 1, 0, 0]
    ids, counts = _ids(batches)
    assert counts == [2, 2, 2, 0, 0]  # 17 is numeric; values 0 are absent
    assert ids == [3, 2041, 3, 9, 5, 8]
    assert _dense(batches).ravel().tolist() == [0.5, 0, 0, 0, 4]  # fill 0 where absent
    gz = tmp_path / "a.gz"
    gz.write_bytes(gzip.compress(TEXT.encode()))
    for chunk_bytes in (1, 5, 64):  # chunks smaller than a line
        again = list(LibsvmReader(gz, None, 3, numeric=[17], chunk_bytes=chunk_bytes))
        assert _ids(again) == (ids, counts) and _labels(again) == _labels(batches)


def test_a_spec_names_indexes_and_hashes_string_ids(tmp_path: Path) -> None:
    path = tmp_path / "a.txt"
    path.write_text(TEXT)
    spec = ColumnSpec(
        ids=(IDColumn("features", name="f", kind=IdKind.STRING),),
        numeric=(NumericColumn(("17", "9"), name="x", log1p=True, fill=-1.0),),
        labels=(LabelColumn("label"),),
    )
    batches = list(LibsvmReader(path, spec, 8))
    ids, counts = _ids(batches, "f")
    assert counts == [2, 1, 2, 0, 0]
    assert ids == hash_strings(["3", "2041", "3", "5", "8"], "f").tolist()
    dense = _dense(batches)
    assert np.allclose(dense[:, 0], np.log1p([0.5, 0, 0, 0, 4]))  # fill before log1p: clamped
    assert np.allclose(dense[:, 1], np.log1p([0, 1, 0, 0, 0]))
    assert libsvm_spec([4, 2]).numeric[0].columns == ("4", "2")
    with pytest.raises(ConfigError, match="not \\['user'\\]"):
        LibsvmReader(path, ColumnSpec(ids=(IDColumn("user"),)), 8, requires_grad=False)
    with pytest.raises(ConfigError):
        libsvm_spec([-1])


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("1 3-1 4:1", r"'3-1' is not index:value or field:index:value"),
        ("1 3:1:2:4", r"'3:1:2:4' is not index:value or field:index:value"),
        ("1 x:1:2", r"'x:1:2' is not field:index:value with a decimal field"),
        ("1 a:1", r"'a:1' is not index:value with a decimal index"),
        ("1 3:x", r"'3:x' is not index:value with a numeric value"),
        ("2 3:1", r"label '2' is not 1, 0, \+1 or -1"),
        ("3:1 4:1", r"column 'label': '3:1' is not a number"),
    ],
)
def test_malformed_lines_are_named_by_file_and_line(
    tmp_path: Path, line: str, message: str
) -> None:
    good = [f"{i % 2} {i}:1 {i + 1}:1" for i in range(200)]
    lines = [*good[:150], line, *good[150:]]
    path = tmp_path / "bad.svm"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(CorruptDataError, match=rf"bad.svm:151: {message}"):
        list(LibsvmReader(path, None, 16, chunk_bytes=100))
    offset = len("\n".join(lines[:150])) - 40  # a byte range that starts mid-file
    with pytest.raises(CorruptDataError, match=rf"bad.svm:151: {message}"):
        list(LibsvmReader(Part(path, offset), None, 16))


def test_partitions_and_hash_splits_read_every_row_once(tmp_path: Path) -> None:
    rng = random.Random(0)
    files, expected = [], []
    for i, rows in enumerate([120, 7, 260]):
        lines = []
        for n in range(1000 * i, 1000 * i + rows):
            feats = " ".join(f"{rng.randint(1, 10**6)}:1" for _ in range(rng.randint(0, 30)))
            lines.append(f"{n % 2} 0:{n} {feats}".rstrip())
            expected.append(n)
        path = tmp_path / f"p{i}.svm"
        path.write_text("\n".join(lines))
        files.append(path)

    def read(world: int, row_filter: HashSplit | None = None) -> list[int]:
        out: list[int] = []
        for rank in range(world):
            parts = partition(files, rank, world)
            if parts:
                reader = LibsvmReader(parts, None, 32, numeric=[0], chunk_bytes=512,
                                      row_filter=row_filter)  # fmt: skip
                out += [int(v) for b in reader for v in _dense([b]).ravel()]
        return sorted(out)

    for world in (1, 2, 5):
        assert read(world) == expected
    test = read(1, HashSplit(0.2, test=True))
    assert read(3, HashSplit(0.2, test=True)) == test
    assert sorted(test + read(2, HashSplit(0.2))) == expected
    assert 0.1 < len(test) / len(expected) < 0.3
