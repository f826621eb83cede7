"""embeddb.features.stream: byte-range partitions, row filters, order thresholds and the
bounded shuffle buffer, through the real readers over real files."""

from __future__ import annotations

import gzip
import itertools
import random
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from embeddb.errors import ConfigError, CorruptDataError, InvalidArgumentError
from embeddb.features import ColumnSpec, CsvDialect, CsvReader, IDColumn, NumericColumn
from embeddb.features._block import Block, Ids
from embeddb.features._io import range_chunks
from embeddb.features.stream import (
    HashSplit,
    HeadRows,
    OrderSplit,
    Part,
    order_threshold,
    partition,
    shuffled,
)

SPEC = ColumnSpec(ids=(IDColumn("user"),), numeric=(NumericColumn(("n",), name="n"),))


def _write_csv(path: Path, first: int, rows: int, *, long_every: int = 0, final_nl: bool = True,
               compress: bool = False) -> list[int]:  # fmt: skip
    """A CSV of rows ``first .. first + rows - 1`` (column n), some with long padding."""
    rng = random.Random(first)
    lines = ["n,pad,user,when"]
    for n in range(first, first + rows):
        pad = "x" * (300 if long_every and n % long_every == 0 else rng.randint(0, 9))
        lines.append(f"{n},{pad},u{n % 7},2017-11-{1 + n % 28:02d} 09:{n % 60:02d}:00")
    text = "\n".join(lines) + ("\n" if final_nl else "")
    data = text.encode()
    path.write_bytes(gzip.compress(data) if compress else data)
    return list(range(first, first + rows))


def _rows(reader: CsvReader) -> list[int]:
    return [int(v) for b in reader for v in b.non_id_type_features[0].data.ravel()]


def _files(tmp_path: Path) -> tuple[list[Path], list[int]]:
    files, expected = [], []
    for i, (rows, final_nl) in enumerate([(1, True), (57, False), (3, True), (211, True)]):
        path = tmp_path / f"part{i}.csv"
        expected += _write_csv(path, 1000 * i, rows, long_every=13, final_nl=final_nl)
        files.append(path)
    return files, expected


def test_byte_range_ranks_read_every_line_exactly_once(tmp_path: Path) -> None:
    files, expected = _files(tmp_path)
    dialect = CsvDialect(chunk_bytes=64)  # lines of 300 bytes are longer than a chunk
    for world in (1, 2, 3, 5, 8, 40):
        seen: list[int] = []
        extents = []
        for rank in range(world):
            parts = partition(files, rank, world)
            extents.append(sum((p.stop or p.path.stat().st_size) - p.start for p in parts))
            if parts:
                seen += _rows(CsvReader(parts, SPEC, 16, dialect, requires_grad=False))
        assert sorted(seen) == expected, world
        assert max(extents) - min(extents) <= 1  # equal byte ranges of the concatenation


def test_byte_ranges_tile_a_file_into_its_lines(tmp_path: Path) -> None:
    path = tmp_path / "t.txt"
    lines = [b"a" * random.Random(i).randint(0, 40) for i in range(300)]
    path.write_bytes(b"\n".join(lines))  # no final newline
    size = path.stat().st_size
    for cuts in ([0, size], [0, 1, 2, 3, size], [0, 41, 42, 500, 501, 2000, size]):
        got: list[bytes] = []
        for start, stop in itertools.pairwise(cuts):
            for _, chunk in range_chunks(path, 7, start, stop):
                got += chunk.split(b"\n")[:-1]
        assert got == lines, cuts


def test_a_header_is_skipped_only_at_its_file_start_and_must_match(tmp_path: Path) -> None:
    files, _ = _files(tmp_path)
    reader = CsvReader(Part(files[3], 500), SPEC, 8, requires_grad=False)
    assert reader.names == ("n", "pad", "user", "when")  # from the file's first line
    assert all(n >= 3000 for n in _rows(reader))
    other = tmp_path / "other.csv"
    other.write_text("n,pad,who,when\n1,,u,x\n")
    with pytest.raises(ConfigError, match=r"other\.csv"):
        CsvReader([files[0], other], SPEC, 8, requires_grad=False)
    with pytest.raises(InvalidArgumentError, match="exactly one"):
        CsvReader(files[0], SPEC, 8, parts=files, requires_grad=False)


def test_errors_in_a_byte_range_name_the_true_line(tmp_path: Path) -> None:
    path = tmp_path / "big.csv"
    _write_csv(path, 0, 400)
    text = path.read_text().splitlines()
    text[301] = "300,,u1"  # line 302: a field short
    text[350] = "x349,,u1,t"  # line 351: not a number
    path.write_text("\n".join(text) + "\n")
    messages = []
    for rank in range(3):
        parts = partition([path], rank, 3)
        reader = CsvReader(parts, SPEC, 8, CsvDialect(chunk_bytes=128), requires_grad=False)
        try:
            _rows(reader)
        except CorruptDataError as exc:
            messages.append(str(exc))
    assert any("big.csv:302: 3 fields, expected 4" in m for m in messages), messages
    text[301] = "300,,u1,t"
    path.write_text("\n".join(text) + "\n")
    at = len("\n".join(text[:350]))  # the byte offset of line 351
    holder = [p for rank in range(3) for p in partition([path], rank, 3)
              if p.start <= at < (p.stop or 10**9)]  # fmt: skip
    assert holder[0].start > 0  # a range that starts mid-file
    reader = CsvReader(holder, SPEC, 8, CsvDialect(chunk_bytes=128), requires_grad=False)
    with pytest.raises(CorruptDataError, match=r"big.csv:351: column 'n': 'x349'"):
        _rows(reader)


def test_gzip_files_go_whole_to_the_least_loaded_rank(tmp_path: Path) -> None:
    files, expected = [], []
    for i, rows in enumerate([300, 10, 120, 50, 7]):
        path = tmp_path / f"g{i}.csv.gz"
        expected += _write_csv(path, 1000 * i, rows, compress=True)
        files.append(path)
    plain = tmp_path / "plain.csv"
    expected += _write_csv(plain, 9000, 40)
    owners: dict[Path, int] = {}
    seen: list[int] = []
    for rank in range(2):
        parts = partition([*files, plain], rank, 2)
        for p in parts:
            if p.path != plain:
                assert p.whole and p.path not in owners
                owners[p.path] = rank
        seen += _rows(CsvReader(parts, SPEC, 32, requires_grad=False))
    assert sorted(seen) == sorted(expected)
    assert owners[files[0]] != owners[files[2]]  # the two largest are apart
    with pytest.raises(InvalidArgumentError, match="compressed"):
        list(range_chunks(files[0], 64, 10, 20))


def test_parquet_partition_by_row_groups_and_hash_split(tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow", reason="pyarrow (the parquet extra) is not installed")
    pq = pytest.importorskip("pyarrow.parquet")
    from embeddb.features import ParquetReader

    paths, expected = [], []
    for i, rows in enumerate([95, 40]):
        n = list(range(1000 * i, 1000 * i + rows))
        table = pa.table({"n": n, "user": [f"u{v % 5}" for v in n]})
        path = tmp_path / f"t{i}.parquet"
        pq.write_table(table, path, row_group_size=10)
        paths.append(path)
        expected += n

    def read(parts: list[Part], row_filter: HashSplit | None = None) -> list[int]:
        if not parts:  # more ranks than row groups
            return []
        reader = ParquetReader(parts, SPEC, 7, chunk_rows=4, row_filter=row_filter,
                               requires_grad=False)  # fmt: skip
        return [int(v) for b in reader for v in b.non_id_type_features[0].data.ravel()]

    for world in (1, 3, 20):
        got = [r for rank in range(world) for r in read(partition(paths, rank, world))]
        assert sorted(got) == expected
    test_once = read(partition(paths, 0, 1), HashSplit(0.3, seed=4, test=True))
    test_split = [
        r
        for rank in range(3)
        for r in read(partition(paths, rank, 3), HashSplit(0.3, seed=4, test=True))
    ]
    train = read(partition(paths, 0, 1), HashSplit(0.3, seed=4))
    assert sorted(test_split) == sorted(test_once)
    assert sorted(test_once + train) == expected and 0.15 < len(test_once) / 135 < 0.45


def test_hash_split_is_disjoint_and_the_same_under_any_partitioning(tmp_path: Path) -> None:
    files, expected = _files(tmp_path)

    def split(world: int, test: bool, seed: int = 1) -> list[int]:
        out: list[int] = []
        for rank in range(world):
            parts = partition(files, rank, world)
            dialect = CsvDialect(chunk_bytes=100)
            split = HashSplit(0.25, seed, test)
            reader = CsvReader(parts, SPEC, 16, dialect, row_filter=split, requires_grad=False)
            out += _rows(reader)
        return sorted(out)

    test, train = split(1, True), split(1, False)
    assert sorted(test + train) == expected
    assert 0.15 < len(test) / len(expected) < 0.35
    assert split(4, True) == test and split(3, False) == train
    assert split(1, True, seed=2) != test
    with pytest.raises(ConfigError, match="fraction"):
        HashSplit(1.5)


@pytest.mark.parametrize("column", ["n", "when"])
def test_order_split_by_a_streamed_threshold(tmp_path: Path, column: str) -> None:
    files, expected = _files(tmp_path)
    whole = CsvReader(files, SPEC, 16, CsvDialect(chunk_bytes=256), requires_grad=False)
    threshold = order_threshold(whole, column, 0.2, max_sample=1000)
    assert isinstance(threshold, float if column == "n" else str)
    small = order_threshold(whole, column, 0.2, max_sample=40, seed=3)
    assert type(small) is type(threshold)

    def part(test: bool) -> list[int]:
        reader = CsvReader(files, SPEC, 16, row_filter=OrderSplit(column, threshold, test),
                           requires_grad=False)  # fmt: skip
        return _rows(reader)

    test, train = part(True), part(False)
    assert sorted(test + train) == expected
    when = {n: f"2017-11-{1 + n % 28:02d} 09:{n % 60:02d}:00" for n in expected}
    key = (lambda n: float(n)) if column == "n" else (lambda n: when[n])
    assert min(key(n) for n in test) >= max(key(n) for n in train)  # type: ignore[operator]
    assert 0.1 < len(test) / len(expected) < 0.3
    with pytest.raises(ConfigError, match="nope"):
        CsvReader(files, SPEC, 16, row_filter=OrderSplit("nope", 1.0), requires_grad=False)


def test_missing_value_markers_are_missing_for_splits_too(tmp_path: Path) -> None:
    path = tmp_path / "na.csv"
    path.write_text("n,user,score\n" + "".join(
        f"{i},u,{'NA' if i % 4 == 0 else i}\n" for i in range(100)))  # fmt: skip
    reader = CsvReader(path, SPEC, 8, CsvDialect(na_values=("NA",)), requires_grad=False)
    threshold = order_threshold(reader, "score", 0.25)
    assert isinstance(threshold, float) and 70 <= threshold <= 80

    def rows(test: bool) -> list[int]:
        split = OrderSplit("score", threshold, test)
        dialect = CsvDialect(na_values=("NA",))
        return _rows(CsvReader(path, SPEC, 8, dialect, row_filter=split, requires_grad=False))

    test = rows(True)
    assert all(n % 4 and n >= threshold for n in test)  # NA rows are train
    assert sorted(test + rows(False)) == list(range(100))


def test_order_threshold_of_an_empty_column_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "e.csv"
    path.write_text("n,user,when\n1,a,\n2,b,\n")
    reader = CsvReader(path, SPEC, 4, requires_grad=False)
    with pytest.raises(ConfigError, match="'when' has no values"):
        order_threshold(reader, "when", 0.5)


@pytest.mark.slow
def test_head_rows_with_striped_chunks(tmp_path: Path) -> None:
    files, expected = _files(tmp_path)
    dialect = CsvDialect(chunk_bytes=90)
    for world in (1, 2, 3):
        for test in (False, True):
            got = []
            for rank in range(world):
                reader = CsvReader(files, SPEC, 8, dialect, row_filter=HeadRows(100, test),
                                   stripe=(rank, world), requires_grad=False)  # fmt: skip
                got += _rows(reader)
            assert sorted(got) == (expected[100:] if test else expected[:100])
    reader = CsvReader(partition(files, 1, 2), SPEC, 8, row_filter=HeadRows(5), requires_grad=False)
    with pytest.raises(InvalidArgumentError, match="whole input"):
        _rows(reader)
    plain = [
        r
        for rank in range(3)
        for r in _rows(CsvReader(files, SPEC, 8, dialect, stripe=(rank, 3), requires_grad=False))
    ]
    assert sorted(plain) == expected


# ------------------------------------------------------------------------------------------
# Shuffling
# ------------------------------------------------------------------------------------------


def _blocks(total: int, seed: int = 0) -> Iterator[Block]:
    rng = np.random.default_rng(seed)
    row = 0
    while row < total:
        size = min(int(rng.integers(1, 40)), total - row)
        rows = np.arange(row, row + size)
        counts = rows % 3
        offsets = np.zeros(size + 1, dtype=np.int64)
        np.cumsum(counts, out=offsets[1:])
        values = np.repeat(rows, counts).astype(np.uint64)
        ids = {"tags": Ids(values, offsets, False)}
        yield Block(size, ids, {"n": rows.astype(np.float32).reshape(-1, 1)}, {})
        row += size


def test_shuffled_emits_every_row_once_from_a_bounded_buffer() -> None:
    pulled = emitted = 0
    peak = 0

    def counted() -> Iterator[Block]:
        nonlocal pulled
        for block in _blocks(5000):
            pulled += block.size
            yield block

    order: list[int] = []
    for block in shuffled(counted(), 200, np.random.default_rng(7)):
        emitted += block.size
        peak = max(peak, pulled - emitted)
        n = block.dense["n"].ravel().astype(np.int64)
        tags = block.ids["tags"]
        counts = np.diff(tags.full_offsets())
        assert counts.tolist() == (n % 3).tolist()  # ragged ids travel with their row
        assert tags.values.tolist() == np.repeat(n, n % 3).tolist()
        order += n.tolist()
    assert sorted(order) == list(range(5000)) and order != sorted(order)
    assert peak <= 200 + 40  # the buffer plus one incoming block
    again = [
        int(v)
        for b in shuffled(_blocks(5000), 200, np.random.default_rng(7))
        for v in b.dense["n"].ravel()
    ]
    other = [
        int(v)
        for b in shuffled(_blocks(5000), 200, np.random.default_rng(8))
        for v in b.dense["n"].ravel()
    ]
    assert again == order and other != order
    moved = np.abs(np.array(order) - np.arange(5000))
    assert moved.max() > 200  # rows travel beyond one buffer's span


def test_shuffled_without_a_buffer_passes_blocks_through() -> None:
    through = [b.size for b in shuffled(_blocks(300), 0, np.random.default_rng(0))]
    assert through == [b.size for b in _blocks(300)]
    with pytest.raises(InvalidArgumentError):
        list(shuffled(_blocks(10), -1, np.random.default_rng(0)))
