"""``embeddb populate``: rows exported by ``embeddb scan`` (csv, jsonl) or saved as ``.npz`` are
loaded into a fresh cluster of another shard count and scan back bit-exact; a bad row writes
nothing. Real shards served on 127.0.0.1 (port 0)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest

from embeddb.client import Client, ClientOptions
from tests.test_client import DIM, Cluster, serve_cluster, sgd_tables
from tests.test_inspect import CAPACITY, RO, RW, TOKENS, addresses, invoke, rows

Rows = dict[int, bytes]  # id -> the float32 vector's bytes (compared bit for bit)


@pytest.fixture
def source(tmp_path: Path) -> Iterator[Cluster]:
    """Two shards holding ``rows()``."""
    with serve_cluster(tmp_path / "source", 2, sgd_tables(capacity=CAPACITY)) as c:
        with Client(c.addresses) as client:
            client.assign("t", *rows())
        yield c


@pytest.fixture
def target(tmp_path: Path) -> Iterator[Cluster]:
    """Three empty shards (another shard count than ``source``)."""
    with serve_cluster(tmp_path / "target", 3, sgd_tables(capacity=CAPACITY)) as c:
        yield c


def as_rows(ids: npt.NDArray[np.uint64], vectors: npt.NDArray[np.float32]) -> Rows:
    return {int(i): v.tobytes() for i, v in zip(ids, vectors, strict=True)}


def scanned(c: Cluster, token: str | None = None) -> Rows:
    """Every row of ``c``'s table ``t``, read back with ``Client.scan``."""
    with Client(c.addresses, ClientOptions(token=token)) as client:
        return {k: v for page in client.scan("t", limit=97) for k, v in as_rows(*page).items()}


def expected_rows() -> Rows:
    return as_rows(*rows())


def export(source: Cluster, path: Path, fmt: str) -> None:
    """``path`` holds every row of ``source``: the output of ``embeddb scan`` (csv, jsonl) or
    ``np.savez`` of ``Client.scan``'s pages (npz)."""
    if fmt == "npz":
        with Client(source.addresses) as client:
            pages = list(client.scan("t"))
        ids = np.concatenate([p for p, _ in pages])
        np.savez(path, ids=ids, vectors=np.concatenate([v for _, v in pages]))
        return
    result = invoke("scan", *addresses(source), "--table", "t", "--format", fmt)
    assert result.exit_code == 0, result.output
    path.write_text(result.stdout)


def populate(c: Cluster, *args: str, stdin: str | None = None) -> tuple[int, str, str]:
    from click.testing import CliRunner

    from embeddb.cli.app import main

    result = CliRunner().invoke(
        main, ["populate", *addresses(c), "--table", "t", *args], input=stdin
    )
    return result.exit_code, result.stdout, result.stderr


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["csv", "jsonl", "npz"])
def test_scan_then_populate_copies_a_table_bit_exact(
    source: Cluster, target: Cluster, tmp_path: Path, fmt: str
) -> None:
    path = tmp_path / f"rows.{fmt}"
    export(source, path, fmt)
    code, out, err = populate(target, "--batch-rows", "64", str(path))
    assert code == 0, err
    n = len(expected_rows())
    assert f"wrote {n:,} rows into t" in out and "rows/s" in out
    assert scanned(target) == expected_rows()
    assert sum(s.stats().tables["t"].rows for s in target.shards) == n


@pytest.mark.slow
def test_format_flag_overrides_the_suffix_and_a_header_line_is_skipped(
    source: Cluster, target: Cluster, tmp_path: Path
) -> None:
    path = tmp_path / "rows.txt"
    export(source, path, "csv")
    header = "id," + ",".join(f"v{k}" for k in range(DIM))
    path.write_text(header + "\n" + path.read_text())
    code, _, err = populate(target, str(path))
    assert code == 2 and "--format" in err  # .txt: no format from the suffix
    code, _, err = populate(target, "--format", "csv", str(path))
    assert code == 0, err
    assert scanned(target) == expected_rows()


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
def test_standard_input_is_read_with_dash(source: Cluster, target: Cluster, fmt: str) -> None:
    scan = invoke("scan", *addresses(source), "--table", "t", "--format", fmt)
    assert scan.exit_code == 0, scan.output
    code, out, err = populate(
        target, "--format", fmt, "--batch-rows", "100", "-", stdin=scan.stdout
    )
    assert code == 0, err
    assert f"wrote {len(expected_rows()):,} rows" in out
    assert scanned(target) == expected_rows()


def csv_lines(n: int = 300) -> list[str]:
    """``n`` valid csv rows, ids 1..n."""
    values = np.arange(n * DIM, dtype=np.float32).reshape(n, DIM) / 7
    return [f"{i + 1}," + ",".join(np.char.mod("%.9g", v)) for i, v in enumerate(values)]


BAD_CSV = {  # what replaces line 257 (beyond the first batch of 100), what the error says
    "wrong dim": ("257,1,2,3", "expected an id and 4 values (5 fields), got 4 fields"),
    "NaN": ("257,1,nan,3,4", "a value is NaN, infinite or beyond float32"),
    "too large": ("257,1,2,3,1e39", "a value is NaN, infinite or beyond float32"),
    "duplicate id": ("12,1,2,3,4", "id 12 is also on line 12"),
    "bad number": ("257,1,2,x3,4", "could not convert string 'x3' to float32 (field 4)"),
    "negative id": ("-5,1,2,3,4", "could not convert string '-5' to uint64 (field 1)"),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(BAD_CSV))
def test_a_bad_row_is_one_error_line_and_nothing_is_written(
    target: Cluster, tmp_path: Path, case: str
) -> None:
    with Client(target.addresses) as client:
        client.assign("t", [5, 1000], np.full((2, DIM), 3.0, dtype=np.float32))
    before = scanned(target)
    line, message = BAD_CSV[case]
    lines = csv_lines()
    lines[256] = line
    path = tmp_path / "rows.csv"
    path.write_text("\n".join(lines) + "\n")
    code, out, err = populate(target, "--batch-rows", "100", str(path))
    assert code == 1 and out == ""
    assert err.splitlines() == [f"Error: rows.csv line 257: {message}"]
    assert scanned(target) == before


def test_bad_jsonl_and_npz_name_their_line_or_row(target: Cluster, tmp_path: Path) -> None:
    records = [json.dumps({"id": i, "vector": [0.5] * DIM}) for i in range(1, 6)]
    records[3] = json.dumps({"id": 4, "vector": [0.5, "a", 0.5, 0.5]})
    path = tmp_path / "rows.jsonl"
    path.write_text("\n".join(records) + "\n")
    code, _, err = populate(target, "--batch-rows", "2", str(path))
    assert code == 1 and err.splitlines() == ["Error: rows.jsonl line 4: a value is not a number"]

    vectors = np.ones((6, DIM), dtype=np.float32)
    vectors[4, 2] = np.inf
    np.savez(tmp_path / "rows.npz", ids=np.arange(6, dtype=np.uint64), vectors=vectors)
    code, _, err = populate(target, str(tmp_path / "rows.npz"))
    assert code == 1
    assert err.splitlines() == ["Error: rows.npz row 4: a value is NaN, infinite or beyond float32"]
    np.savez(tmp_path / "dim.npz", ids=np.arange(6, dtype=np.uint64), vectors=vectors[:, :3])
    code, _, err = populate(target, str(tmp_path / "dim.npz"))
    assert code == 1 and "vectors must be floats of shape (6, 4)" in err
    assert scanned(target) == {}


def test_an_unknown_table_or_missing_file_is_one_error_line(
    target: Cluster, tmp_path: Path
) -> None:
    path = tmp_path / "rows.csv"
    path.write_text("\n".join(csv_lines(3)) + "\n")
    result = invoke("populate", *addresses(target), "--table", "nope", str(path))
    assert result.exit_code == 1
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: ") and "unknown table" in lines[0]
    code, _, err = populate(target, str(tmp_path / "missing.csv"))
    assert code == 1 and len(err.splitlines()) == 1 and "does not exist" in err


def test_an_ro_token_is_refused_and_an_rw_token_writes(tmp_path: Path) -> None:
    from embeddb.transport.rpc.listen import ListenConfig

    path = tmp_path / "rows.csv"
    path.write_text("\n".join(csv_lines(20)) + "\n")
    with serve_cluster(tmp_path / "secure", 2, listen=ListenConfig(tokens=TOKENS)) as c:
        for role, token in (("ro", RO), ("rw", RW)):
            token_file = tmp_path / f"{role}-token"
            token_file.write_text(token + "\n")
            token_file.chmod(0o600)
        code, _, err = populate(c, "--token-file", str(tmp_path / "ro-token"), str(path))
        assert code == 1  # the file checks out (a progress line), then Assign is refused
        assert [line for line in err.splitlines() if "Error" in line] == err.splitlines()[-1:]
        assert err.splitlines()[-1].startswith("Error: ") and "PERMISSION_DENIED" in err
        assert scanned(c, RW) == {}  # Scan needs replica or rw
        code, _, err = populate(c, "--token-file", str(tmp_path / "rw-token"), str(path))
        assert code == 0, err
        assert sorted(scanned(c, RW)) == list(range(1, 21))
