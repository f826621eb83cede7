"""Row-wise Adagrad (``vectorwise_shared: true``, issue 26 item 3): the update against a numpy
reference of TorchRec/FBGEMM's EXACT_ROWWISE_ADAGRAD, and the bytes a dim-16 row takes in RAM,
in the RocksDB disk tier, in update-log records and in snapshots (dim + 1 floats = 68 bytes)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from embeddb.config import EmbeddingConfig, OptimizerConfig, OptimizerKind
from embeddb.engine.durability import records
from embeddb.engine.shard import Shard
from embeddb.trainer.launcher.auto_embedding import AUTO_OPTIMIZER, auto_embedding_yaml
from tests.conftest import one_table_config

DIM = 16
ROW_BYTES = 4 * (DIM + 1)  # 68: the vector and one accumulator
ROWWISE = OptimizerConfig(
    kind=OptimizerKind.ADAGRAD, lr=0.05, initial_accumulator=0.01, vectorwise_shared=True
)


def fbgemm_rowwise(w: np.ndarray, acc: np.ndarray, g: np.ndarray, lr: float, eps: float) -> None:
    """EXACT_ROWWISE_ADAGRAD: ``acc += mean(g², row)``; ``w -= lr * g / (sqrt(acc) + eps)``."""
    acc += np.mean(g.astype(np.float64) ** 2, axis=1, keepdims=True)
    w -= lr * g / (np.sqrt(acc) + eps)


def test_the_row_wise_update_is_fbgemm_exact_rowwise_adagrad(tmp_path: Path) -> None:
    ids = np.arange(40, dtype=np.uint64)
    rng = np.random.default_rng(3)
    with Shard(one_table_config(dim=DIM, capacity=64, optimizer=ROWWISE), tmp_path / "s") as shard:
        shard.lookup("t", ids)
        rows = shard.peek("t", ids)[1]
        assert rows.shape == (ids.size, DIM + 1)  # the vector and one accumulator
        w, acc = rows[:, :DIM].astype(np.float64), rows[:, DIM:].astype(np.float64)
        for _ in range(3):
            g = rng.standard_normal((ids.size, DIM)).astype(np.float32) * 3
            shard.apply_gradients("t", ids, g)
            fbgemm_rowwise(w, acc, g.astype(np.float64), ROWWISE.lr, ROWWISE.eps)
        got = shard.peek("t", ids)[1]
    got_w, got_acc = got[:, :DIM], got[:, DIM:]
    np.testing.assert_allclose(got_acc, acc, rtol=1e-5)
    np.testing.assert_allclose(got_w, w, rtol=1e-4, atol=1e-6)
    # a sum instead of the mean would leave the accumulator DIM times larger
    assert float(got_acc.max()) < 0.01 + 3 * 9 * 2


def _row_bytes(optimizer: OptimizerConfig, tmp_path: Path) -> dict[str, set[int]]:
    """Bytes per row of a dim-16 table in RAM, on disk, in the log and in a snapshot."""
    config = one_table_config(dim=DIM, capacity=32, optimizer=optimizer)
    ids = np.arange(200, dtype=np.uint64)  # more than the RAM tier holds: rows spill to RocksDB
    with Shard(config, tmp_path / "s") as shard:
        shard.lookup("t", ids)
        shard.apply_gradients("t", ids, np.ones((ids.size, DIM), np.float32))
        stripes = shard._tables["t"].stripes
        ram = {s.rows.strides[0] for s in stripes} | {s.rows.shape[1] * 4 for s in stripes}
        log: set[int] = set()
        for record in shard.read_log(0):
            changes = records.decode(record.payload)
            assert all(c.op is records.Op.PUT and c.rows is not None for c in changes)
            log |= {c.rows.shape[1] * 4 for c in changes if c.rows is not None}
            # the record's bytes less each change's header (11 + name) and ids, per row
            framing = sum(11 + len(b"t") + 8 * c.ids.size for c in changes)
            n = sum(c.ids.size for c in changes)
            log.add((len(record.payload) - framing) // n)
        disk: set[int] = set()
        assert shard._disk is not None
        it = shard._disk._iterator("t")
        it.seek_to_first()
        while it.valid():
            disk.add(len(it.value()))
            it.next()
        info = shard.snapshot("s1").info
        resident = (Path(info.path) / "ram" / "t.ids").stat().st_size // 8
        snap = {(Path(info.path) / "ram" / "t.rows").stat().st_size // resident}
    return {"ram": ram, "log": log, "disk": disk, "snapshot": snap}


def test_a_row_wise_dim16_row_takes_68_bytes_everywhere(tmp_path: Path) -> None:
    places = ("ram", "log", "disk", "snapshot")
    assert _row_bytes(ROWWISE, tmp_path / "rowwise") == {p: {ROW_BYTES} for p in places}
    elementwise = OptimizerConfig(kind=OptimizerKind.ADAGRAD)
    assert _row_bytes(elementwise, tmp_path / "elementwise") == {p: {4 * 2 * DIM} for p in places}


def test_the_auto_embedding_config_is_row_wise_adagrad() -> None:
    assert AUTO_OPTIMIZER["vectorwise_shared"] is True
    config = EmbeddingConfig.from_yaml_text(auto_embedding_yaml(["a", "b"], DIM))
    for table in config.tables.values():
        assert table.optimizer.kind is OptimizerKind.ADAGRAD
        assert table.optimizer.vectorwise_shared
        assert table.row_width * 4 == ROW_BYTES
