"""RFC 4180 quoting in the CSV / TSV reader: what Python's csv module (and pandas, R,
spreadsheets) writes reads back to the same values; quoted headers; every malformed quote and
every line break inside quotes is an error naming the file and its true line, also in a byte
range that starts mid-file; unquoted text keeps its fast path (the same batches as before)."""

from __future__ import annotations

import csv
import io
import re
from pathlib import Path

import numpy as np
import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from embeddb.errors import ConfigError, CorruptDataError
from embeddb.features import (
    ColumnSpec,
    CsvDialect,
    CsvReader,
    DatasetSpec,
    HashSplit,
    IDColumn,
    LabelColumn,
    NumericColumn,
    Part,
    hash_strings,
    partition,
)
from embeddb.features._lines import QuoteError, split_lines, split_record
from embeddb.features.delimited import TextChunk


def _values(chunks: list[TextChunk], columns: list[str]) -> list[list[str]]:
    """The text of ``columns`` of every row of the reader's chunks."""
    out: list[list[str]] = []
    for chunk in chunks:
        fields = chunk.text(columns)
        flat = fields.flat()
        width = len(columns)
        for row in range(chunk.size):
            out.append([flat.text(row * width + c) for c in range(width)])
    return out


def _chunks(reader: CsvReader) -> list[TextChunk]:
    chunks = list(reader.chunks())
    assert all(isinstance(c, TextChunk) for c in chunks)
    return chunks  # type: ignore[return-value]


def _write(rows: list[list[str]], delimiter: str = ",", quoting: int = csv.QUOTE_MINIMAL) -> str:
    out = io.StringIO()
    csv.writer(out, delimiter=delimiter, quoting=quoting, lineterminator="\r\n").writerows(rows)
    return out.getvalue()


SPEC = ColumnSpec(
    ids=(IDColumn("user name"), IDColumn("tags", separator="|")),
    numeric=(NumericColumn(("price",), name="price"),),
    labels=(LabelColumn("clicked"),),
)
ROWS = [
    ["user name", "tags", "price", "clicked"],
    ["Smith, J.", "a|b", "12.5", "1"],
    ['say "hi"', "", "3", "0"],
    ["", 'x|"y"', "", "1"],
    ["plain", "c", "7", "0"],
]


@pytest.mark.parametrize("quoting", [csv.QUOTE_MINIMAL, csv.QUOTE_ALL, csv.QUOTE_NONNUMERIC])
@pytest.mark.parametrize("delimiter", [",", "\t"])
def test_what_the_csv_module_writes_reads_back(
    tmp_path: Path, quoting: int, delimiter: str
) -> None:
    """Quoted headers, embedded delimiters and doubled quotes, every quoting style."""
    path = tmp_path / "q.csv"
    path.write_text(_write(ROWS, delimiter, quoting), encoding="utf-8")
    dialect = CsvDialect(delimiter=delimiter, chunk_bytes=24)  # chunks of a line or two
    reader = CsvReader(path, SPEC, 8, dialect, requires_grad=False)
    assert reader.names == tuple(ROWS[0])  # the header without its quotes
    assert _values(_chunks(reader), ROWS[0]) == ROWS[1:]
    (batch,) = list(reader)
    user = batch.feature("user name")
    assert (
        user.values.tolist()
        == hash_strings(["Smith, J.", 'say "hi"', "plain"], "user name").tolist()
    )
    assert user.counts().tolist() == [1, 1, 0, 1]  # "" (quoted or not) is missing
    tags = batch.feature("tags")
    assert tags.values.tolist() == hash_strings(["a", "b", "x", '"y"', "c"], "tags").tolist()
    assert batch.non_id_type_features[0].data.ravel().tolist() == [12.5, 3.0, 0.0, 7.0]


FIELD = st.text(alphabet=st.sampled_from(list('ab ,;"\t|é1.')), max_size=8)


@pytest.mark.slow
@given(rows=st.lists(st.lists(FIELD, min_size=3, max_size=3), min_size=1, max_size=30))
def test_any_table_the_csv_module_writes_reads_back(rows: list[list[str]]) -> None:
    """Property: split_lines on csv.writer's output gives csv.reader's fields."""
    text = _write([["a", "b", "c"], *rows]).encode("utf-8")
    body = text[text.index(b"\n") + 1 :]
    lines = split_lines(body, ord(","), 3, None, ord('"'))
    got = [
        [bytes(lines.buf[s:e]).decode("utf-8") for s, e in zip(lines.starts[:, r],
                                                                lines.ends[:, r], strict=True)]
        for r in range(lines.rows.size)
    ]  # fmt: skip
    assert got == list(csv.reader(io.StringIO(body.decode("utf-8"))))


def test_byte_ranges_and_hash_splits_of_a_quoted_file_read_every_row_once(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    rows = [["id", "text", "label"]]
    for i in range(3000):
        text = ["x, y", 'a "b" c', "plain", "", "comma,", '""'][int(rng.integers(0, 6))]
        rows.append([str(i), text, str(i % 2)])
    path = tmp_path / "big.csv"
    path.write_text(_write(rows))
    spec = ColumnSpec(ids=(IDColumn("text"),), numeric=(NumericColumn(("id",), name="id"),))
    dialect = CsvDialect(chunk_bytes=512)

    def ids(world: int, row_filter: HashSplit | None = None) -> list[int]:
        out: list[int] = []
        for rank in range(world):
            reader = CsvReader(None, spec, 64, dialect, parts=partition([path], rank, world),
                               row_filter=row_filter, requires_grad=False)  # fmt: skip
            for chunk in _chunks(reader):
                for id_, text in _values([chunk], ["id", "text"]):
                    assert text == rows[1 + int(id_)][1]
                    out.append(int(id_))
        return sorted(out)

    for world in (1, 2, 7):
        assert ids(world) == list(range(3000))
    test = ids(1, HashSplit(0.3, test=True))
    assert ids(5, HashSplit(0.3, test=True)) == test
    assert sorted(test + ids(3, HashSplit(0.3))) == list(range(3000))


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('7,"a', "unbalanced quotes: a quoted field must close on the line it starts on "
                 "(line breaks inside quoted fields are not supported)"),
        ('7,a"b"c,x', """a quote inside the unquoted field 'a"b"c' (RFC 4180: quote the whole """
                      "field and double the quotes inside it, or set quote: false to read "
                      "quotes as text)"),
        ('7,"a"b,x', """text after the closing quote of the field '"a"b'"""),
    ],
)  # fmt: skip
def test_malformed_quotes_name_the_file_and_true_line(
    tmp_path: Path, line: str, message: str
) -> None:
    lines = ["id,text,label", *(f"{i},t{i},1" for i in range(200))]
    lines.insert(151, line)  # line 152 of the file
    if line.endswith('"a'):  # the quoted field goes on over a line break
        lines.insert(152, 'b",1')
    path = tmp_path / "bad.csv"
    path.write_text("\n".join(lines) + "\n")
    spec = ColumnSpec(ids=(IDColumn("text"),))
    expected = re.escape(f"bad.csv:152: {message}")
    with pytest.raises(CorruptDataError, match=expected):
        list(CsvReader(path, spec, 16, CsvDialect(chunk_bytes=100), requires_grad=False))
    start = len("\n".join(lines[:140]))  # a byte range that starts mid-file
    with pytest.raises(CorruptDataError, match=expected):
        list(CsvReader(Part(path, start), spec, 16, requires_grad=False))


def test_a_line_break_inside_quotes_fails_in_every_byte_range(tmp_path: Path) -> None:
    """A rank whose range starts inside the quoted field (after its line break) sees the
    field's tail as an unbalanced line: it fails too, instead of reading garbage."""
    path = tmp_path / "nl.csv"
    path.write_text('id,text\n1,"first\nsecond",\n2,ok\n')
    spec = ColumnSpec(ids=(IDColumn("text"),))
    after = len('id,text\n1,"first\n')
    for part, line in ((Part(path, 0, after - 1), 2), (Part(path, after - 1), 3)):
        with pytest.raises(CorruptDataError, match=rf"nl.csv:{line}: unbalanced quotes"):
            list(CsvReader(None, spec, 4, parts=[part], requires_grad=False))


def test_quote_false_reads_quotes_as_text_and_strip_allows_blanks_around_quotes(
    tmp_path: Path,
) -> None:
    path = tmp_path / "h.csv"
    path.write_text('name,height\nann,5\'10"\n"bob",6\'1"\n')
    spec = ColumnSpec(ids=(IDColumn("name"), IDColumn("height")))
    reader = CsvReader(path, spec, 8, CsvDialect(quote=None), requires_grad=False)
    assert _values(_chunks(reader), ["name", "height"]) == [["ann", "5'10\""], ['"bob"', "6'1\""]]
    path.write_text('name , city\n "a, b" , x\n c ,  "d" \n')
    spec = ColumnSpec(ids=(IDColumn("name"), IDColumn("city")))
    reader = CsvReader(path, spec, 8, CsvDialect(strip=True), requires_grad=False)
    assert reader.names == ("name", "city")
    assert _values(_chunks(reader), ["name", "city"]) == [["a, b", "x"], ["c", "d"]]
    path.write_text('name,city\n "a, b",x\n')
    with pytest.raises(CorruptDataError, match=r"h\.csv:2: a quote inside the unquoted field"):
        list(CsvReader(path, spec, 8, CsvDialect(strip=False), requires_grad=False))
    with pytest.raises(ConfigError, match="quote"):
        CsvDialect(quote=",")


def test_a_spreadsheet_csv_with_a_byte_order_mark(tmp_path: Path) -> None:
    """Excel's "CSV UTF-8" starts with a byte order mark, before a quoted header."""
    path = tmp_path / "excel.csv"
    path.write_bytes(b'\xef\xbb\xbf"user","note"\r\n"a","x, y"\r\nb,z\r\n')
    spec = ColumnSpec(ids=(IDColumn("user"), IDColumn("note")))
    reader = CsvReader(path, spec, 8, requires_grad=False)
    assert reader.names == ("user", "note")
    assert _values(_chunks(reader), ["user", "note"]) == [["a", "x, y"], ["b", "z"]]
    path.write_bytes(b"\xef\xbb\xbfa,x\nb,z\n")  # and without a header
    reader = CsvReader(path, spec, 8, CsvDialect(header=False, names=("user", "note")),
                       requires_grad=False)  # fmt: skip
    assert _values(_chunks(reader), ["user"]) == [["a"], ["b"]]


def test_a_malformed_quoted_header_names_its_line(tmp_path: Path) -> None:
    path = tmp_path / "h.csv"
    path.write_text('# comment "\n"a","b\n1,2\n')
    spec = ColumnSpec(ids=(IDColumn("a"),))
    with pytest.raises(CorruptDataError, match=r"h\.csv:2: header: unbalanced quotes"):
        CsvReader(path, spec, 8, CsvDialect(comment="#"), requires_grad=False)
    assert split_record(b'"x""y",z\r\n', ord(","), ord('"')) == ('x"y', "z")
    with pytest.raises(QuoteError):
        split_record(b'"x"y,z', ord(","), ord('"'))


def test_a_pandas_style_quoted_csv_trains_from_yaml(tmp_path: Path) -> None:
    """Issue 22: quoted headers were refused with the headers listed with their quotes."""
    (tmp_path / "data").mkdir()
    rows = [["user", "city", "price", "clicked"]]
    rows += [[f"u{i % 7}", ["Zurich, CH", 'the "Big" Apple', "Bern"][i % 3], str(i), str(i % 2)]
             for i in range(40)]  # fmt: skip
    (tmp_path / "data" / "train.csv").write_text(_write(rows, quoting=csv.QUOTE_NONNUMERIC))
    node = yaml.safe_load(
        """
        format: csv
        train: data/train.csv
        split: {fraction: 0.25}
        label: {column: clicked}
        ids: [user, city]
        numeric: [{column: price, transform: standardize}]
        shuffle: false
        """
    )
    spec = DatasetSpec.from_yaml_node(node, base_dir=tmp_path)
    pipeline = spec.fit()
    batches = [*spec.reader(pipeline, "train", 64, train=True)]
    batches += [*spec.reader(pipeline, "test", 64, train=False)]
    assert sum(b.batch_size for b in batches) == 40
    cities = np.concatenate([b.feature("city").values for b in batches])
    assert set(cities.tolist()) == set(
        hash_strings(["Zurich, CH", 'the "Big" Apple', "Bern"], "city").tolist()
    )
    # a record at serving time carries the value itself, not its quoted text
    served = pipeline.batch_from_records([{"user": "u1", "city": 'the "Big" Apple', "price": 3}])
    assert (
        served.feature("city").values.tolist() == hash_strings(['the "Big" Apple'], "city").tolist()
    )
