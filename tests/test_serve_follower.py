"""``embeddb serve --follow`` with real processes: a follower given neither ``--config`` nor
``--shard-index/--num-shards`` serves its primary's tables and place (before: the packaged
default tables, "unknown table 't'", and a refused start as shard 0 of 1), one shard of a
cluster can be inspected on its own, and a config that disagrees with the primary stops the
follower naming the difference."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from embeddb.client import Client, ClientOptions
from embeddb.common.routing import shard_of
from tests.support import START_TIMEOUT_S, StartServe, eventually, run_cli, serve_processes

# Starts processes or runs for seconds: the full suite's, not the fast tier's.
pytestmark = pytest.mark.slow

CONFIG = "tables: {t: {dim: 4, capacity: 64, optimizer: {type: adam, lr: 0.1}}}\n"
ONE_SHARD = ClientOptions(verify_topology=False)  # one shard of two


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[StartServe]:
    yield from serve_processes(tmp_path)


cli = run_cli


def test_a_follower_adopts_its_primarys_tables_and_place(serve: StartServe, tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(CONFIG)
    primary = serve(
        "--config", str(config), "--data-dir", str(tmp_path / "p"),
        "--shard-index", "1", "--num-shards", "2",
    )  # fmt: skip
    universe = np.arange(1, 301, dtype=np.uint64)
    ids = universe[shard_of(universe, 2) == 1]
    vectors = np.random.default_rng(1).standard_normal((ids.size, 4)).astype(np.float32)
    with Client([primary.address], ONE_SHARD) as writer:
        writer.assign("t", ids, vectors)
    follower = serve("--follow", primary.address, "--data-dir", str(tmp_path / "f"))

    def caught_up() -> bool:
        with Client([follower.address], ClientOptions(verify_topology=False, retries=0)) as c:
            return bool(np.array_equal(c.lookup("t", ids, train=False), vectors))

    eventually(caught_up, START_TIMEOUT_S, "the follower to serve the primary's table t")

    tables = cli("tables", "--addresses", follower.address, "--format", "json")
    assert tables.returncode == 0, tables.stderr
    assert f"{follower.address} is shard 1 of 2" in tables.stderr
    [table] = json.loads(tables.stdout)
    assert (table["table"], table["dim"], table["optimizer"], table["rows"]) == (
        "t", 4, "adam", ids.size,
    )  # fmt: skip
    peek = cli("peek", "--addresses", follower.address, "--table", "t", str(ids[0]))
    assert peek.returncode == 0, peek.stderr
    assert np.array_equal(np.array(peek.stdout.split(",")[1:], np.float32), vectors[0])

    other = tmp_path / "other.yaml"
    other.write_text(CONFIG.replace("dim: 4", "dim: 8"))
    refused = serve(
        "--follow", primary.address, "--config", str(other), "--data-dir", str(tmp_path / "g"),
        expect_exit=True,
    )  # fmt: skip
    assert refused.process.returncode == 1
    assert "table 't' has dim 4 on the primary, 8 in --config" in refused.stderr()
    wrong = serve(
        "--follow", primary.address, "--shard-index", "0", "--data-dir", str(tmp_path / "h"),
        expect_exit=True,
    )  # fmt: skip
    assert wrong.process.returncode == 1
    assert "serves shard 1 of 2; this follower was started as shard 0 of 2" in wrong.stderr()
