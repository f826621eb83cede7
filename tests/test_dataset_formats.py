"""DatasetSpec over formats and ranks, on real files: a libSVM dataset from YAML to readers,
ranks without any part of the input, and every train row read exactly once across ``world``
ranks (byte ranges, hash split, head-rows split), shuffled differently each epoch."""

from __future__ import annotations

import gzip
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from embeddb.errors import ConfigError, CorruptDataError
from embeddb.features import DatasetSpec, FeaturePipeline, partition
from embeddb.features.batch import Batch

ROW_ID = 1_000_000  # libSVM index of row r's unique feature: ROW_ID + r


def _where(key: str) -> str:
    return f"job.yaml:{len(key)}"


def _spec(node: object, base: Path) -> DatasetSpec:
    return DatasetSpec.from_yaml_node(node, base_dir=base, where=_where)


def _config_error(call: Callable[[], object]) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        call()
    return info.value


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".gz":
        with gzip.open(path, "wt") as fh:
            fh.write(text)
    else:
        path.write_text(text)
    return path


def _libsvm_rows(n: int, seed: int = 0) -> tuple[str, np.ndarray, np.ndarray]:
    """``n`` libSVM lines: label +1/-1, a categorical index in 100..119, index 7 numeric
    (absent in every 5th row), and the row's own index ``ROW_ID + r``."""
    rng = np.random.default_rng(seed)
    labels = rng.choice([-1, 1], n)
    x7 = np.round(rng.normal(50.0, 10.0, n), 3)
    lines = []
    for r in range(n):
        tokens = [f"{'+1' if labels[r] > 0 else '-1'}", f"{100 + r % 20}:1"]
        if r % 5:
            tokens.append(f"7:{x7[r]}")
        tokens.append(f"{ROW_ID + r}:1")
        lines.append(" ".join(tokens))
    return "\n".join(lines) + "\n", labels, np.where(np.arange(n) % 5 > 0, x7, np.nan)


def _row_ids(batches: list[Batch], name: str = "features") -> list[int]:
    if not batches:
        return []
    values = np.concatenate([b.feature(name).values for b in batches])
    ids: list[int] = (values[values >= ROW_ID] - ROW_ID).astype(np.int64).tolist()
    return ids


@pytest.mark.slow
@pytest.mark.parametrize("suffix", [".svm", ".svm.gz"])
def test_libsvm_yaml_to_fit_to_split_readers(tmp_path: Path, suffix: str) -> None:
    n = 600
    text, labels, x7 = _libsvm_rows(n)
    _write(tmp_path / "data" / f"apps{suffix}", text)
    node = yaml.safe_load(
        f"""
        format: libsvm
        train: data/apps{suffix}
        split: {{fraction: 0.25, seed: 3}}
        ids: [{{column: features, name: apps}}]
        numeric: [{{column: 7, transform: standardize, fill: 50}}]
        shuffle: {{buffer_rows: 64, seed: 1}}
        """
    )
    spec = _spec(node, tmp_path)
    pipeline = spec.fit()
    assert pipeline.id_features == ("apps",) and pipeline.non_id == (("7", 1),)
    filled = np.where(np.isnan(x7), 50.0, x7)
    ((mean, std),) = pipeline.spec.numeric[0].standardize or ()
    assert (mean, std) == pytest.approx((filled.mean(), filled.std()))

    train = list(spec.reader(pipeline, "train", 50, train=True))
    test = list(spec.reader(pipeline, "test", 50, train=False))
    train_ids, test_ids = _row_ids(train, "apps"), _row_ids(test, "apps")
    assert sorted(train_ids + test_ids) == list(range(n))
    assert not set(train_ids) & set(test_ids)
    assert 0.15 * n < len(test_ids) < 0.35 * n
    assert _row_ids(test, "apps") == sorted(test_ids)  # the test split is read in order
    # labels +1/-1 -> 1/0; index 7 left out of the ids, standardized (fill for absent rows)
    got = np.concatenate([b.labels[0].data for b in train]).ravel()
    assert got.tolist() == (labels[train_ids] > 0).astype(np.float32).tolist()
    ids = np.concatenate([b.feature("apps").values for b in train])
    assert 7 not in ids.tolist()
    dense = np.concatenate([b.non_id_type_features[0].data for b in train]).ravel()
    assert dense == pytest.approx((filled[train_ids] - mean) / std, abs=1e-5)
    # a rank's part of the training rows (world 2) is still disjoint and complete
    ranks = [
        _row_ids(list(spec.reader(pipeline, "train", 50, train=True, rank=r, world=2)), "apps")
        for r in range(2)
    ]
    assert sorted(ranks[0] + ranks[1]) == sorted(train_ids)


@pytest.mark.parametrize("suffix", [".svm", ".svm.gz"])
def test_libsvm_malformed_token_names_file_and_line(tmp_path: Path, suffix: str) -> None:
    text, _, _ = _libsvm_rows(40)
    lines = text.splitlines()
    lines[22] = "1 101:1 7:abc"
    path = _write(tmp_path / f"bad{suffix}", "\n".join(lines) + "\n")
    node = {"format": "libsvm", "train": path.name, "split": {"fraction": 0.5}, "numeric": [7]}
    spec = _spec(node, tmp_path)
    err = _config_error(spec.fit)
    assert err.key == "dataset.train"
    assert f"{path}:23: '7:abc' is not index:value with a numeric value" in str(err)
    lines[22] = "1 101:1"
    _write(path, "\n".join(lines[:30]) + "\n")
    pipeline = spec.fit()
    _write(path, "\n".join([*lines[:30], "0 5:1", "1 5 6:1"]) + "\n")  # fitted, then broken
    with pytest.raises(CorruptDataError, match=f"{path}:32: '5' is not index:value"):
        list(spec.reader(pipeline, "train", 8, train=True))


@pytest.mark.parametrize(
    ("overrides", "key", "match"),
    [
        ({"names": ["a", "b"]}, "dataset.names", "applies to csv and tsv files, not libsvm"),
        ({"header": True}, "dataset.header", "not libsvm"),
        ({"delimiter": " "}, "dataset.delimiter", "not libsvm"),
        ({"na_values": ["?"]}, "dataset.na_values", "not libsvm"),
        ({"ids": ["user"]}, "dataset.ids[0]", "one id column, 'features'"),
        ({"ids": [{"column": "features", "separator": "|"}]}, "dataset.ids[0].separator", "libsvm"),
        ({"numeric": ["price"]}, "dataset.numeric[0]", "a libsvm feature index"),
        ({"numeric": [{"column": -3}]}, "dataset.numeric[0].column", "integer >= 0"),
        ({"numeric": [{"columns": [1, "x"], "name": "d"}]}, "dataset.numeric[0].columns[1]", "x"),
        ({"label": {"column": "y"}}, "dataset.label.column", "label column is 'label'"),
        ({"label": {"column": "label", "positive": [1]}}, "dataset.label", "no positive"),
    ],
)
def test_libsvm_keys_that_make_no_sense_name_key_and_line(
    tmp_path: Path, overrides: dict[str, Any], key: str, match: str
) -> None:
    _write(tmp_path / "a.svm", "1 3:1\n")
    node = {"format": "libsvm", "train": "a.svm", "test": "a.svm", **overrides}
    err = _config_error(lambda: _spec(node, tmp_path))
    assert err.key == key
    assert str(err).endswith(f"({_where(key)})")
    with pytest.raises(ConfigError, match=match):
        _spec(node, tmp_path)


def _csv(rows: range) -> str:
    return "rid,user,clicked\n" + "".join(f"{r},u{r % 37},{r % 2}\n" for r in rows)


def _rids(batches: list[Batch]) -> list[int]:
    if not batches:
        return []
    data = np.concatenate([b.non_id_type_features[0].data for b in batches]).ravel()
    rids: list[int] = np.rint(data).astype(np.int64).tolist()
    return rids


def _csv_node(**overrides: Any) -> dict[str, Any]:
    return {
        "format": "csv",
        "label": "clicked",
        "ids": ["user"],
        "numeric": ["rid"],
        "chunk_bytes": 4096,
        **overrides,
    }


def _read(
    spec: DatasetSpec,
    pipeline: FeaturePipeline,
    split: str,
    rank: int = 0,
    world: int = 1,
    **kw: int,
) -> list[int]:
    batches = spec.reader(
        pipeline, split, 100, train=split == "train", rank=rank, world=world, **kw
    )
    return _rids(list(batches))


def test_fewer_whole_files_than_ranks_share_rows_instead(tmp_path: Path) -> None:
    """Two .gz files, three ranks: no rank idles (an idle rank would end every epoch at its
    first step); each keeps every third row of the whole input, disjoint, nothing lost."""
    a = _write(tmp_path / "d" / "part-0.csv.gz", _csv(range(0, 300)))
    b = _write(tmp_path / "d" / "part-1.csv.gz", _csv(range(300, 500)))
    assert partition([a, b], 2, 3) == []
    _write(tmp_path / "t.csv", _csv(range(500, 510)))
    for node in (
        _csv_node(train="d/part-*.csv.gz", test="t.csv"),
        _csv_node(train="d/part-*.csv.gz", split={"fraction": 0.2}),
    ):
        spec = _spec(node, tmp_path)
        pipeline = spec.fit()
        per_rank = [_read(spec, pipeline, "train", r, 3) for r in range(3)]
        assert all(per_rank)
        assert max(map(len, per_rank)) - min(map(len, per_rank)) <= 1 + len(per_rank[0]) // 4
        union = per_rank[0] + per_rank[1] + per_rank[2]
        whole = sorted(_read(spec, pipeline, "train", 0, 1))
        assert sorted(union) == whole != []
        assert len(set(union)) == len(union)


@pytest.mark.parametrize("world", [1, 2, 3])
def test_every_train_row_once_across_ranks_and_shuffled_per_epoch(
    tmp_path: Path, world: int
) -> None:
    n = 3000
    _write(tmp_path / "data" / "a.csv", _csv(range(0, 1800)))
    _write(tmp_path / "data" / "b.csv", _csv(range(1800, n)))
    node = _csv_node(
        train="data/*.csv", split={"fraction": 0.2}, shuffle={"buffer_rows": 256, "seed": 5}
    )
    spec = _spec(node, tmp_path)
    pipeline = spec.fit()
    test = _read(spec, pipeline, "test", 0, world)
    assert test == sorted(test) and 0.15 * n < len(test) < 0.25 * n
    per_rank = [_read(spec, pipeline, "train", r, world) for r in range(world)]
    train = [rid for rows in per_rank for rid in rows]
    assert len(train) == len(set(train))  # no row twice, in a rank or across ranks
    assert sorted(train + test) == list(range(n))
    assert not set(train) & set(test)
    for rank, rows in enumerate(per_rank):
        again = _read(spec, pipeline, "train", rank, world, epoch=0)
        next_epoch = _read(spec, pipeline, "train", rank, world, epoch=1)
        assert again == rows  # reproducible
        assert next_epoch != rows and sorted(next_epoch) == sorted(rows)
        assert rows != sorted(rows)  # shuffled


def _criteo_like(rows: range) -> str:
    """Criteo TSV lines: label, I1..I13 (I1 the row id), C1..C26 hex."""
    lines = []
    for r in rows:
        ints = [str(r)] + [str((r * k) % 50) if (r + k) % 7 else "" for k in range(2, 14)]
        cats = [f"{(r * 2654435761 + k) % (1 << 32):08x}" for k in range(26)]
        lines.append("\t".join([str(r % 2), *ints, *cats]))
    return "\n".join(lines) + "\n"


@pytest.mark.slow
@pytest.mark.parametrize("world", [1, 2, 3])
def test_criteo_preset_head_rows_split_across_ranks(tmp_path: Path, world: int) -> None:
    n, head = 3000, 2200
    _write(tmp_path / "criteo" / "train.txt.gz", _criteo_like(range(n)))
    node = {"preset": "criteo", "data_dir": "criteo", "train_rows": head, "chunk_bytes": 8192}
    spec = _spec(node, tmp_path)
    pipeline = spec.fit(sample_rows=500)

    def rids(split: str, rank: int = 0, epoch: int = 0) -> list[int]:
        batches = spec.reader(
            pipeline, split, 128, train=split == "train", rank=rank, world=world, epoch=epoch
        )
        dense = [b.non_id_type_features[0].data[:, 0] for b in batches]
        if not dense:
            return []
        values = np.expm1(np.concatenate(dense).astype(np.float64))
        out: list[int] = np.rint(values).astype(np.int64).tolist()
        return out

    assert rids("test") == list(range(head, n))
    per_rank = [rids("train", r) for r in range(world)]
    train = [rid for rows in per_rank for rid in rows]
    assert sorted(train) == list(range(head))  # each head row once, across ranks
    if world > 1:
        assert all(per_rank)  # the chunks are striped: every rank has some
    assert sorted(rids("train", 0, epoch=1)) == sorted(per_rank[0]) != rids("train", 0, epoch=1)
    # training stops reading at the end of the head: a broken test row does not reach it
    _write(tmp_path / "criteo" / "train.txt.gz", _criteo_like(range(n)) + "1\t2\n")
    assert sorted(rid for r in range(world) for rid in rids("train", r)) == list(range(head))
    with pytest.raises(CorruptDataError, match=f"train.txt.gz:{n + 1}: 2 fields, expected 40"):
        rids("test")
