"""benchmarks/_arrow_csv.py: the pyarrow variant that benchmarks/data.py measures against the
own CSV reader reads the same blocks, and the reason the own reader stays (docs/own-data.md,
"Why the CSV reader is our own") holds: pyarrow's errors name neither the file nor the line,
and it reads text the own reader refuses."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from types import ModuleType

import pytest

from embeddb.errors import CorruptDataError
from embeddb.features import CsvReader

pytest.importorskip("pyarrow.csv", reason="the comparison needs pyarrow (the parquet extra)")

ROOT = Path(__file__).resolve().parents[1]
HEADER = "user,item,city,device,tags,price,age,clicked\n"


@pytest.fixture(scope="module")
def arrow_csv() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "_arrow_csv", ROOT / "benchmarks" / "_arrow_csv.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _clicks(path: Path, rows: int) -> Path:
    lines = [
        f"u{i % 97},i{i % 13},{['Bern', '', 'Chur'][i % 3]},ios,{['', 'a|b', 'c'][i % 3]},"
        f"{i * 1.25:.2f},{'' if i % 7 == 0 else 18 + i % 60},{i % 2}\n"
        for i in range(rows)
    ]
    path.write_text(HEADER + "".join(lines))
    return path


@pytest.mark.slow
def test_the_pyarrow_variant_reads_the_own_readers_blocks(
    arrow_csv: ModuleType, tmp_path: Path
) -> None:
    path = _clicks(tmp_path / "clicks.csv", 10_000)
    figures = arrow_csv.compare_readers(path, 1)
    assert figures["csv_bench_rows"] == 10_000
    assert figures["csv_pyarrow_same_blocks"] and figures["csv_pyarrow_typed_same_blocks"]
    for name in ("own", "pyarrow", "pyarrow_typed"):
        assert figures[f"csv_rows_per_s_{name}"] > 0 and figures[f"csv_mb_per_s_{name}"] > 0
    assert figures["csv_pyarrow_vs_own"] > 0


def test_pyarrow_errors_lack_the_file_and_line_that_the_own_reader_names(
    arrow_csv: ModuleType, tmp_path: Path
) -> None:
    path = _clicks(tmp_path / "clicks.csv", 10)
    path.write_text(path.read_text() + "\nu1,i1,Bern,ios,,1.5,30,1,extra\n")  # line 13
    with pytest.raises(CorruptDataError, match=re.escape(f"{path}:13: 9 fields, expected 8")):
        list(CsvReader(path, arrow_csv.CLICKS_SPEC, 4))
    with pytest.raises(Exception, match="Expected 8 columns, got 9") as caught:
        list(arrow_csv.ArrowCsvReader(path, arrow_csv.CLICKS_SPEC, 4))
    assert str(path) not in str(caught.value) and ":13" not in str(caught.value)


def test_pyarrow_reads_text_after_a_closing_quote_that_the_own_reader_refuses(
    arrow_csv: ModuleType, tmp_path: Path
) -> None:
    path = _clicks(tmp_path / "clicks.csv", 3)
    path.write_text(path.read_text() + 'u1,i1,"Bern"x,ios,,1.5,30,1\n')  # line 5
    with pytest.raises(
        CorruptDataError, match=rf"{re.escape(str(path))}:5: text after the closing"
    ):
        list(CsvReader(path, arrow_csv.CLICKS_SPEC, 4))
    blocks = list(arrow_csv.ArrowCsvReader(path, arrow_csv.CLICKS_SPEC, 4)._blocks())
    assert sum(b.size for b in blocks) == 4  # "Bern"x silently read (as Bernx)
