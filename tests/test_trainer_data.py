"""embeddb.features: parsers, hashing, the dataset readers, the generic readers, the
synthetic generator and the AUC. Real data comes from ../shared/data when it is there."""

from __future__ import annotations

import dataclasses
import gzip
import math
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from embeddb.common.evaluation import auc, log_loss
from embeddb.errors import ConfigError, CorruptDataError, InvalidArgumentError, NotFoundError
from embeddb.features import (
    AdultReader,
    ColumnSpec,
    CriteoConfig,
    CriteoReader,
    CsvDialect,
    CsvReader,
    IDColumn,
    LabelColumn,
    MovieLensConfig,
    MovieLensReader,
    NumericColumn,
    ParquetReader,
    RowRange,
    SyntheticCriteo,
    SyntheticCriteoConfig,
    ZipfSampler,
    hash_strings,
)
from embeddb.features._fields import Fields
from embeddb.features.batch import Batch, IDTypeFeatureWithSingleID

from .conftest import SHARED_DATA

CRITEO = SHARED_DATA / "criteo"
MOVIELENS = SHARED_DATA / "movielens-100k"
needs_criteo = pytest.mark.skipif(
    not (CRITEO / "sample.train.gz").is_file(),
    reason=f"the Criteo sample is not at {CRITEO} (../shared/data is not checked out here)",
)
needs_movielens = pytest.mark.skipif(
    not (MOVIELENS / "u.data.gz").is_file(),
    reason=f"MovieLens 100K is not at {MOVIELENS} (../shared/data is not checked out here)",
)


def _fields(values: list[str]) -> Fields:
    data = "\t".join(values).encode() + b"\n"
    lengths = [len(v.encode()) for v in values]
    starts = np.cumsum([0] + [n + 1 for n in lengths[:-1]])
    return Fields(np.frombuffer(data, np.uint8), starts, starts + np.array(lengths))


def _collect(batches: list[Batch], name: str) -> tuple[np.ndarray, np.ndarray]:
    """All ids and ids-per-sample of one feature over a list of batches."""
    feats = [b.feature(name) for b in batches]
    return np.concatenate([f.values for f in feats]), np.concatenate([f.counts() for f in feats])


# ------------------------------------------------------------------------------------------
# Parsers
# ------------------------------------------------------------------------------------------


def test_hex_and_decimal_parsers_match_python_on_random_and_edge_fields() -> None:
    rng = random.Random(0)
    hexes = [
        "".join(rng.choice("0123456789abcdefABCDEF") for _ in range(rng.randint(1, 16)))
        for _ in range(2000)
    ]
    values, present = _fields([*hexes, ""]).parse_hex()
    assert [int(v) for v in values[:-1]] == [int(h, 16) for h in hexes]
    assert present.tolist() == [True] * len(hexes) + [False]
    decimals = [str(rng.randint(0, min(10 ** rng.randint(1, 20), 2**64) - 1)) for _ in range(2000)]
    decimals += ["18446744073709551615", "0000000000000000001", "0"]
    values, _ = _fields(decimals).parse_uint()
    assert [int(v) for v in values] == [int(d) for d in decimals]
    for bad, parse in [
        ("18446744073709551616", Fields.parse_uint),
        ("-1", Fields.parse_uint),
        ("1.5", Fields.parse_uint),
        ("12345678901234567", Fields.parse_hex),
        ("g", Fields.parse_hex),
        ("é", Fields.parse_hex),
    ]:
        with pytest.raises(ValueError):
            parse(_fields(["1", bad]))


def test_float_parser_equals_python_float_for_every_form() -> None:
    rng = random.Random(1)
    texts = [
        *(f"{rng.uniform(-1e6, 1e6):.{rng.randint(0, 8)}f}" for _ in range(3000)),
        *(repr(rng.uniform(-1, 1)) for _ in range(1000)),  # 17 digits: Python's path
        *(f"{rng.uniform(0, 10):.6e}" for _ in range(500)),
        *(str(rng.randint(-(10**18), 10**18)) for _ in range(500)),
        *["1", "-2", "+3", ".5", "5.", "-0", "1E5", "1e+5", "-1.5e-3", "1e400", "1e-400"],
        *["nan", "inf", "-inf"],
    ]
    values, present = _fields([*texts, ""]).parse_float()
    want = np.array([float(t) for t in texts])
    same = (values[:-1] == want) | (np.isnan(values[:-1]) & np.isnan(want))
    assert same.all(), [t for t, ok in zip(texts, same, strict=True) if not ok][:5]
    assert np.signbit(values[texts.index("-0")])
    assert not present[-1]
    for bad in ["1.2.3", "abc", "1e", "--1", "1-", "e5", ".", "+", "1,5"]:
        with pytest.raises(ValueError):
            _fields([bad]).parse_float()


# ------------------------------------------------------------------------------------------
# Hashing
# ------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_string_ids_are_pinned_and_equal_from_every_source() -> None:
    # The ids live in embeddb's tables: these values must never change.
    assert int(hash_strings(["abc"])[0]) == 14695765370457432739
    assert int(hash_strings(["abc"], "C1")[0]) == 10036591056707293333
    assert int(hash_strings([""])[0]) == 12035550249420947055
    assert int(hash_strings(["a much longer string of 33 bytes!"], "x")[0]) == 14672141974929246562
    words = ["", "a", "Private", "État", "exactly8", "nine char", "x" * 40]
    from_list = hash_strings(words, "f")
    assert (hash_strings(np.array(words), "f") == from_list).all()  # numpy str_ (non-ASCII)
    assert (hash_strings([w.encode() for w in words], "f") == from_list).all()
    assert (hash_strings(np.array([w.encode() for w in words]), "f") == from_list).all()
    assert len(set(from_list.tolist())) == len(words)
    assert (hash_strings(words, "g") != from_list).all()  # namespaces separate features


@pytest.mark.slow
def test_string_ids_are_the_same_in_another_process() -> None:
    words = ["alpha", "β", "Self-emp-not-inc"]
    code = (
        "from embeddb.features import hash_strings;"
        f"print(hash_strings({words!r}, 'occupation').tolist())"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PYTHONHASHSEED": "12345", "PATH": ""},
        check=True,
    ).stdout
    assert eval(out) == hash_strings(words, "occupation").tolist()


@pytest.mark.slow
def test_data_modules_never_import_torch() -> None:
    code = (
        "import sys, embeddb.features, embeddb.common.evaluation, embeddb.features.batch;"
        "print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "False", out.stderr


# ------------------------------------------------------------------------------------------
# Criteo
# ------------------------------------------------------------------------------------------

CRITEO_LINES = [
    "1\t5\t\t-1\t0\t\t\t\t\t\t\t\t\t7\t68fd1e64\t\t" + "\t".join(f"{i:08x}" for i in range(24)),
    "0\t\t2\t3\t\t\t\t\t\t\t\t\t\t\tFFFFFFFF\t0a\t" + "\t".join(["00000001"] * 24),
    "0\t1\t2\t3\t4\t5\t6\t7\t8\t9\t10\t11\t12\t13\t" + "\t".join(["deadbeef"] * 26),
]


def _write(tmp_path: Path, name: str, text: str, compress: bool = False) -> Path:
    path = tmp_path / name
    data = text.encode()
    path.write_bytes(gzip.compress(data) if compress else data)
    return path


def test_criteo_reader_exact_values_on_a_written_file(tmp_path: Path) -> None:
    plain = _write(tmp_path, "day.txt", "\n".join(CRITEO_LINES))  # no final newline
    zipped = _write(tmp_path, "day.gz", "\r\n".join(CRITEO_LINES) + "\r\n", compress=True)
    raw = CriteoConfig(log1p=False, chunk_bytes=64)  # several chunks, lines cut across reads
    for path in (plain, zipped):
        batches = list(CriteoReader(path, 2, raw))
        assert [b.batch_size for b in batches] == [2, 1]
        b0 = batches[0]
        assert b0.labels[0].name == "label" and b0.labels[0].data.tolist() == [[1.0], [0.0]]
        dense = b0.non_id_type_features[0].data
        assert dense.dtype == np.float32 and dense.shape == (2, 13)
        assert dense[0].tolist() == [5, 0, -1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 7]
        c1, c2, c3 = (b0.feature(f"C{i}") for i in (1, 2, 3))
        assert isinstance(c1, IDTypeFeatureWithSingleID)
        assert c1.values.tolist() == [0x68FD1E64, 0xFFFFFFFF]
        assert c2.values.tolist() == [0x0A] and c2.offsets.tolist() == [0, 0, 1]  # empty first
        assert c3.values.tolist() == [0, 1]
        assert batches[1].feature("C26").values.tolist() == [0xDEADBEEF]
    logged = next(iter(CriteoReader(plain, 8))).non_id_type_features[0].data
    assert logged[0].tolist() == pytest.approx(
        [math.log1p(max(x, 0)) for x in [5, 0, -1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 7]]
    )
    filled = next(iter(CriteoReader(plain, 8, CriteoConfig(missing_id=2**32))))
    assert filled.feature("C2").values.tolist() == [2**32, 0x0A, 0xDEADBEEF]
    assert all(isinstance(f, IDTypeFeatureWithSingleID) for f in filled.id_type_features)


def test_criteo_reader_reports_bad_lines_with_their_number(tmp_path: Path) -> None:
    short = _write(tmp_path, "short.txt", "\n".join([CRITEO_LINES[0], "1\t2\t3"]) + "\n")
    with pytest.raises(CorruptDataError, match=r"short.txt:2: 3 fields, expected 40"):
        list(CriteoReader(short, 4))
    bad_hex = CRITEO_LINES[2].replace("deadbeef", "deadbeeg", 1)
    path = _write(tmp_path, "bad.txt", "\n".join([CRITEO_LINES[0], bad_hex]) + "\n")
    with pytest.raises(CorruptDataError, match=r"bad.txt:2: column 'C1': 'deadbeeg' is not a hex"):
        list(CriteoReader(path, 4))
    with pytest.raises(NotFoundError):
        CriteoReader(tmp_path / "absent.txt", 4)
    with pytest.raises(InvalidArgumentError):
        CriteoReader(short, 0)


@needs_criteo
def test_criteo_sample_rows_match_the_file_and_batches_cover_it() -> None:
    with gzip.open(CRITEO / "sample.train.gz", "rt") as fh:
        head = [fh.readline().rstrip("\n").split("\t") for _ in range(3)]
    batches = list(CriteoReader(CRITEO / "sample.train.gz", 4096, CriteoConfig(log1p=False)))
    assert [b.batch_size for b in batches] == [4096, 4096, 1808]
    assert all(b.requires_grad for b in batches)
    labels = np.concatenate([b.labels[0].data for b in batches])
    # ../shared/data/criteo/SOURCE.md: 2,182 positives
    assert labels.shape == (10_000, 1) and labels.sum() == 2182
    first = batches[0]
    for row, fields in enumerate(head):
        assert first.labels[0].data[row, 0] == float(fields[0])
        want = [float(x) if x else 0.0 for x in fields[1:14]]
        assert first.non_id_type_features[0].data[row].tolist() == want
        for j, text in enumerate(fields[14:]):
            got = first.feature(f"C{j + 1}").sample(row).tolist()
            assert got == ([int(text, 16)] if text else [])
    values, counts = _collect(batches, "C12")
    assert counts.sum() == values.size and 0 < (counts == 0).sum() < 10_000  # some empty


@needs_criteo
def test_criteo_unlabelled_test_file_needs_requires_grad_false() -> None:
    config = CriteoConfig(labelled=False)
    with pytest.raises(InvalidArgumentError, match="requires_grad"):
        CriteoReader(CRITEO / "sample.test.gz", 1000, config)
    batches = list(CriteoReader(CRITEO / "sample.test.gz", 3000, config, requires_grad=False))
    assert [b.batch_size for b in batches] == [3000, 3000, 3000, 1000]
    assert not batches[0].labels and not batches[0].requires_grad


# ------------------------------------------------------------------------------------------
# Adult
# ------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_adult_reader_rows_labels_and_splits() -> None:
    train = list(AdultReader(10_000))
    assert [b.batch_size for b in train] == [10_000, 10_000, 10_000, 2561]
    assert sum(float(b.labels[0].data.sum()) for b in train) == 7841
    # First line: 39, State-gov, 77516, Bachelors, 13, Never-married, Adm-clerical,
    # Not-in-family, White, Male, 2174, 0, 40, United-States, <=50K
    first = train[0]
    for name, text in [("workclass", "State-gov"), ("gender", "Male"), ("race", "White")]:
        assert first.feature(name).values[0] == hash_strings([text], name)[0]
    assert first.non_id_type_features[0].data[0].tolist() == pytest.approx(
        np.log1p([39, 77516, 13, 2174, 0, 40]).tolist(), rel=1e-6
    )
    assert first.labels[0].data[0, 0] == 0.0
    test = list(AdultReader(20_000, "test"))  # skips "|1x3 Cross validator"; ">50K." counts
    assert test[0].batch_size == 16_281 and test[0].labels[0].data.sum() == 3846
    occupation = hash_strings(["Machine-op-inspct"], "occupation")[0]
    assert test[0].feature("occupation").values[0] == occupation
    if (SHARED_DATA / "adult" / "adult.data.gz").is_file():
        other = list(AdultReader(10_000, directory=SHARED_DATA / "adult"))
        assert all(
            (a.feature(n).values == b.feature(n).values).all()
            for a, b in zip(train, other, strict=True)
            for n in ("education", "native_country")
        )
    with pytest.raises(InvalidArgumentError):
        AdultReader(8, "validation")


@pytest.mark.slow
@pytest.mark.parametrize(("start", "stop"), [(0, 1000), (1000, None), (999, 30_001), (0, 0)])
def test_row_range_is_exactly_those_rows_of_the_source(start: int, stop: int | None) -> None:
    """A positional train/test split: rows start:stop of the source, in any batch size, with
    block boundaries (64 KiB chunks of text here, ~60 blocks) anywhere inside the range."""
    full = next(iter(AdultReader(50_000)))
    small = AdultReader(7)
    small.dialect = dataclasses.replace(small.dialect, chunk_bytes=1 << 16)
    assert len(list(small._blocks())) > 50
    part = list(RowRange(small, start, stop, batch_size=300))
    want = full.feature("education").values[start:stop]
    got = np.concatenate([b.feature("education").values for b in part] or [np.empty(0, "u8")])
    assert got.tolist() == want.tolist()
    labels = np.concatenate([b.labels[0].data for b in part] or [np.empty((0, 1), "f4")])
    assert labels.ravel().tolist() == full.labels[0].data[start:stop].ravel().tolist()
    assert all(b.batch_size == 300 for b in part[:-1])
    with pytest.raises(InvalidArgumentError, match="row range"):
        RowRange(AdultReader(8), 10, 5)


# ------------------------------------------------------------------------------------------
# MovieLens
# ------------------------------------------------------------------------------------------


@pytest.mark.slow
@needs_movielens
def test_movielens_joins_users_and_items_for_known_rows() -> None:
    reader = MovieLensReader(MOVIELENS, 1000, "u.data")
    batches = list(reader)
    assert len(batches) == 100 and sum(float(b.labels[0].data.sum()) for b in batches) == 55_375
    first = batches[0]  # u.data line 1: 196 242 3 881250949; user 196: 49|M|writer|55105
    row = {f.name: f.sample(0).tolist() for f in first.id_type_features}
    assert row["user_id"] == [196] and row["item_id"] == [242]
    assert row["genres"] == [5]  # Kolya (1996): Comedy
    assert row["occupation"] == hash_strings(["writer"], "occupation").tolist()
    assert row["gender"] == hash_strings(["M"], "gender").tolist()
    assert row["age_bucket"] == [45]
    assert row["zip_prefix"] == hash_strings(["551"], "zip_prefix").tolist()
    assert first.labels[0].data[0, 0] == 0.0  # rating 3 < 4
    dense = first.non_id_type_features[0].data[0]
    assert dense[0] == pytest.approx(0.49) and 0 < dense[1] < 0.05
    _, counts = _collect(batches, "genres")
    assert counts.min() >= 1 and counts.max() <= 6 and counts.max() > 1  # ragged
    sizes = {s: sum(b.batch_size for b in MovieLensReader(MOVIELENS, 50_000, s)) for s in (
        "u1.base", "u1.test", "ua.test")}  # fmt: skip
    assert sizes == {"u1.base": 80_000, "u1.test": 20_000, "ua.test": 9_430}
    strict = MovieLensReader(MOVIELENS, 100_000, "u1.test", MovieLensConfig(positive_rating=5))
    assert next(iter(strict)).labels[0].data.mean() < 0.25
    with pytest.raises(InvalidArgumentError):
        MovieLensReader(MOVIELENS, 10, "u6.base")


# ------------------------------------------------------------------------------------------
# Generic CSV and Parquet
# ------------------------------------------------------------------------------------------

CSV_TEXT = (
    "# exported by a test\n"
    "user,tags,views,clicked,country\n"
    "u1,a|b,3,yes,de\n"
    "u2,,,no,\n"
    "\n"
    "u1,b| c||,1.5,yes,fr\r\n"
    "u3,a,-2,no,de\n"
    "u4,d,1e1,no,it"
)
CSV_SPEC = ColumnSpec(
    ids=(
        IDColumn("user"),
        IDColumn("tags", separator="|"),
        IDColumn("country", name="geo", missing_id=7),
    ),
    numeric=(NumericColumn(("views",), name="counts", fill=-1.0),),
    labels=(LabelColumn("clicked", positive=("yes",)),),
)


def _csv_batches(path: Path, batch_size: int, chunk_bytes: int = 1 << 20) -> list[Batch]:
    dialect = CsvDialect(comment="#", strip=True, chunk_bytes=chunk_bytes)
    return list(CsvReader(path, CSV_SPEC, batch_size, dialect))


def test_csv_reader_spec_missing_values_multi_values_and_chunking(tmp_path: Path) -> None:
    path = _write(tmp_path, "log.csv", CSV_TEXT)
    batches = _csv_batches(path, 2)
    assert [b.batch_size for b in batches] == [2, 2, 1]
    users, _ = _collect(batches, "user")
    assert users.tolist() == hash_strings(["u1", "u2", "u1", "u3", "u4"], "user").tolist()
    tags, counts = _collect(batches, "tags")
    assert counts.tolist() == [2, 0, 2, 1, 1]  # "" -> no id; "b| c||" -> b, c (stripped)
    assert tags.tolist() == hash_strings(["a", "b", "b", "c", "a", "d"], "tags").tolist()
    geo, geo_counts = _collect(batches, "geo")
    assert geo_counts.tolist() == [1] * 5 and geo[1] == 7  # missing_id fills the empty field
    counts_feature = np.concatenate([b.non_id_type_features[0].data for b in batches])
    assert counts_feature.ravel().tolist() == [3, -1, 1.5, -2, 10]  # fill=-1
    labels = np.concatenate([b.labels[0].data for b in batches]).ravel()
    assert labels.tolist() == [1, 0, 1, 0, 0]
    for chunk in (8, 20, 64):  # chunks smaller than a line, lines cut anywhere
        again = _csv_batches(path, 2, chunk)
        for name in ("user", "tags", "geo"):
            assert _collect(again, name)[0].tolist() == _collect(batches, name)[0].tolist()
    assert [b.batch_size for b in CsvReader(path, CSV_SPEC, 2, CsvDialect(
        comment="#", strip=True), drop_last=True)] == [2, 2]  # fmt: skip
    assert [b.batch_size for b in _csv_batches(path, 2)] == [2, 2, 1]  # a second epoch


def test_csv_reader_errors_name_the_file_line_and_column(tmp_path: Path) -> None:
    path = _write(tmp_path, "log.csv", CSV_TEXT)
    with pytest.raises(ConfigError, match="no column"):
        CsvReader(path, ColumnSpec(ids=(IDColumn("nope"),)), 4, requires_grad=False)
    bad = _write(tmp_path, "bad.csv", "user,views,clicked\nu1,3,1\nu2,x3,0\n")
    spec = ColumnSpec(
        ids=(IDColumn("user"),),
        numeric=(NumericColumn(("views",)),),
        labels=(LabelColumn("clicked"),),
    )
    with pytest.raises(CorruptDataError, match=r"bad.csv:3: column 'views': 'x3' is not a number"):
        list(CsvReader(bad, spec, 4))
    no_label = _write(tmp_path, "nolabel.csv", "user,views,clicked\nu1,3,\n")
    with pytest.raises(CorruptDataError, match="label column 'clicked' is empty"):
        list(CsvReader(no_label, spec, 4))
    with pytest.raises(InvalidArgumentError, match="requires_grad"):
        CsvReader(path, ColumnSpec(ids=(IDColumn("user"),)), 4)
    with pytest.raises(ConfigError):
        ColumnSpec(ids=(IDColumn("a"), IDColumn("b", name="a")))
    with pytest.raises(ConfigError):
        IDColumn("a", kind="float")
    with pytest.raises(ConfigError):
        CsvDialect(header=False)


def test_parquet_reader_matches_the_csv_reader(tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow", reason="pyarrow (the parquet extra) is not installed")
    pq = pytest.importorskip("pyarrow.parquet")
    table = pa.table(
        {
            "user": ["u1", "u2", "u1", "u3", "u4"],
            "tags": [["a", "b"], [], ["b", "c"], None, ["d", None]],
            "tag_text": ["a|b", None, "b|c", "", "d"],
            "ints": pa.array([[1, 2], [3], [], None, [2**63]], pa.list_(pa.uint64())),
            "country": pa.array(["de", None, "fr", "de", "it"]).dictionary_encode(),
            "views": [3.0, None, 1.5, -2.0, 10.0],
            "clicked": ["yes", "no", "yes", "no", "no"],
        }
    )
    path = tmp_path / "log.parquet"
    pq.write_table(table, path, row_group_size=2)
    spec = ColumnSpec(
        ids=(
            IDColumn("user"),
            IDColumn("tags"),
            IDColumn("tag_text", name="tags2", separator="|", namespace="tags"),
            IDColumn("ints", kind="int"),
            IDColumn("country", name="geo", missing_id=7),
        ),
        numeric=(NumericColumn(("views",), name="counts", fill=-1.0),),
        labels=(LabelColumn("clicked", positive=("yes",)),),
    )
    batches = list(ParquetReader(path, spec, 3, chunk_rows=2))
    assert [b.batch_size for b in batches] == [3, 2]
    csv = _csv_batches(_write(tmp_path, "log.csv", CSV_TEXT), 3)
    for name in ("user", "geo"):
        assert _collect(batches, name)[0].tolist() == _collect(csv, name)[0].tolist()
    tags, counts = _collect(batches, "tags")
    assert counts.tolist() == [2, 0, 2, 0, 1]  # null list and null item: no ids
    assert tags.tolist() == hash_strings(["a", "b", "b", "c", "d"], "tags").tolist()
    assert _collect(batches, "tags2")[0][:4].tolist() == tags[:4].tolist()
    ints, counts = _collect(batches, "ints")
    assert ints.tolist() == [1, 2, 3, 2**63] and counts.tolist() == [2, 1, 0, 0, 1]
    dense = np.concatenate([b.non_id_type_features[0].data for b in batches]).ravel()
    assert dense.tolist() == [3, -1, 1.5, -2, 10]
    labels = np.concatenate([b.labels[0].data for b in batches]).ravel()
    assert labels.tolist() == [1, 0, 1, 0, 0]


# ------------------------------------------------------------------------------------------
# Synthetic data
# ------------------------------------------------------------------------------------------


def test_zipf_sampler_follows_the_power_law_even_for_a_billion_ids() -> None:
    small = ZipfSampler(5000, 1.2, head=100)
    assert small.probability(np.arange(1, 5001)).sum() == pytest.approx(1.0, rel=1e-9)
    sampler = ZipfSampler(10**9, 1.1)
    n = 400_000
    ranks = sampler.sample(np.random.default_rng(0), n)
    assert ranks.min() >= 1 and ranks.max() <= 10**9 and ranks.max() > 10**6
    for k in (1, 2, 10, 100):  # head ranks: exact probabilities, within 5 sigma
        p = float(sampler.probability([k])[0])
        assert abs((ranks == k).sum() - n * p) < 5 * math.sqrt(n * p * (1 - p)) + 1
    for lo, hi in ((10**4, 10**5), (10**6, 10**8)):  # tail decades: the integral's mass
        p = float(sampler._integral(lo + 0.5, hi + 0.5)) / sampler.normaliser
        got = ((ranks > lo) & (ranks <= hi)).sum()
        assert abs(got - n * p) < 5 * math.sqrt(n * p) + 1
    # The log-log slope of the rank frequencies is -exponent.
    p1, p100 = (float(sampler.probability([k])[0]) for k in (1, 100))
    assert math.log(p1 / p100) / math.log(100) == pytest.approx(1.1)


@pytest.mark.slow
def test_synthetic_is_deterministic_and_independent_of_batch_size() -> None:
    cfg = SyntheticCriteoConfig(cardinality=(10**9,) * 13 + (1000,) * 13, chunk_size=1000)
    data = SyntheticCriteo(cfg)
    a = list(data.batches(2500, 700))
    b = list(SyntheticCriteo(cfg).batches(2500, 1024))
    assert [x.batch_size for x in a] == [700, 700, 700, 400]
    for name in ("C1", "C26"):
        assert (_collect(a, name)[0] == _collect(b, name)[0]).all()
    assert a[0].non_id_type_features[0].data.shape == (700, 13)
    assert a[0].labels[0].data.shape == (700, 1)
    samples = data.generate(2500)
    assert (samples.ids[:, 0] == _collect(a, "C1")[0]).all()
    tail = data.generate(600, start=1900)  # random access across a chunk boundary
    assert (tail.ids == samples.ids[1900:]).all() and (tail.label == samples.label[1900:]).all()
    test = data.generate(2500, "test")
    assert not (test.ids[:, 0] == samples.ids[:, 0]).all()
    # The most frequent id of feature 0 is the id of rank 1.
    values, counts = np.unique(data.generate(20_000).ids[:, 0], return_counts=True)
    assert values[np.argmax(counts)] == data.id_of_rank(0, [1])[0]
    assert len(np.unique(samples.ids[:, 20])) <= 1000  # cardinality 1000


@pytest.mark.slow
def test_synthetic_teacher_auc_is_the_best_and_consistent_with_labels() -> None:
    data = SyntheticCriteo(SyntheticCriteoConfig(cardinality=10**6, ctr=0.25, logit_std=1.5))
    assert sum(b.batch_size for b in data.batches(65_536, 4096)) == 65_536
    test = data.generate(50_000, "test")
    best = data.best_auc(50_000, "test")
    assert best == auc(labels=test.label, scores=test.probability)
    assert 0.75 < best < 0.9
    assert test.label.mean() == pytest.approx(0.25, abs=0.01)  # calibrated ctr
    assert test.probability.mean() == pytest.approx(test.label.mean(), abs=0.01)
    # Scores that are not the true probability do worse: noise, and a logistic regression on
    # the dense features alone (trained on the train stream).
    noisy = test.probability + np.random.default_rng(0).normal(0, 0.1, test.label.size)
    assert auc(labels=test.label, scores=noisy) < best
    train = data.generate(50_000, "train")
    w = _logistic_regression(train.dense, train.label)
    assert auc(labels=test.label, scores=test.dense @ w[:-1] + w[-1]) < best - 0.05
    # The log loss of the truth is the lowest too.
    assert log_loss(labels=test.label, scores=test.probability) < log_loss(
        labels=test.label, scores=np.full(test.label.size, test.label.mean())
    )


def _logistic_regression(x: np.ndarray, y: np.ndarray, steps: int = 100) -> np.ndarray:
    """Weights (last: bias) of a logistic regression on standardised ``x``, by gradient descent;
    returned for raw ``x``."""
    mean, std = x.mean(0), x.std(0)
    z = np.hstack([(x - mean) / std, np.ones((x.shape[0], 1))])
    w = np.zeros(z.shape[1])
    for _ in range(steps):
        p = 1 / (1 + np.exp(-(z @ w)))
        w -= 0.5 * z.T @ (p - y) / y.size
    return np.append(w[:-1] / std, w[-1] - (w[:-1] * mean / std).sum())


def test_synthetic_config_is_validated() -> None:
    with pytest.raises(ConfigError):
        SyntheticCriteoConfig(cardinality=(10, 10))
    with pytest.raises(ConfigError):
        SyntheticCriteoConfig(exponent=0)
    with pytest.raises(ConfigError):
        SyntheticCriteoConfig(teacher_dim=6)
    with pytest.raises(InvalidArgumentError):
        SyntheticCriteo(SyntheticCriteoConfig(cardinality=10)).batches(10, 4, split="dev")


# ------------------------------------------------------------------------------------------
# AUC
# ------------------------------------------------------------------------------------------


def test_auc_matches_the_pairwise_definition_with_ties() -> None:
    rng = np.random.default_rng(3)
    scores = rng.integers(0, 5, 300).astype(np.float64)  # many ties
    labels = (rng.random(300) < 0.4).astype(np.float32)
    pos, neg = scores[labels > 0.5], scores[labels < 0.5]
    pairs = (pos[:, None] > neg[None, :]).sum() + 0.5 * (pos[:, None] == neg[None, :]).sum()
    assert auc(labels=labels, scores=scores) == pytest.approx(
        pairs / (pos.size * neg.size), abs=1e-12
    )
    assert auc(labels=labels.reshape(-1, 1), scores=scores.reshape(-1, 1)) == auc(
        labels=labels, scores=scores
    )
    with pytest.raises(InvalidArgumentError):
        auc(labels=[1, 1], scores=[0.1, 0.2])
    with pytest.raises(InvalidArgumentError):
        auc(labels=[1], scores=[0.1, 0.2])


def test_docstring_examples_run() -> None:
    import doctest

    from embeddb.features import hashing, synthetic

    for module in (hashing, synthetic):
        result = doctest.testmod(module, extraglobs={"np": np})
        assert result.attempted and not result.failed, module.__name__
