"""The float parser of text fields on the forms its fast paths take and refuse: every value
equals Python's ``float(text)`` bit for bit, and what Python refuses is refused."""

from __future__ import annotations

import random
import subprocess
import sys

import numpy as np
import pytest

from embeddb.features._fields import Fields


def _fields(values: list[str], delimiter: str = ",") -> Fields:
    data = delimiter.join(values).encode()
    lengths = [len(v.encode()) for v in values]
    starts = np.cumsum([0] + [n + 1 for n in lengths[:-1]])
    return Fields(np.frombuffer(data, np.uint8), starts, starts + np.array(lengths))


def _same_bits(values: np.ndarray, texts: list[str]) -> list[str]:
    want = np.array([float(t) for t in texts])
    return [t for t, v, w in zip(texts, values.tolist(), want.tolist(), strict=True)
            if np.float64(v).tobytes() != np.float64(w).tobytes()]  # fmt: skip


@pytest.mark.slow
def test_plain_decimals_equal_python_float_bit_for_bit() -> None:
    rng = random.Random(3)
    texts = [
        f"{rng.choice(['', '-', '+'])}{rng.randint(0, 10**w - 1)}.{rng.randint(0, 10**f - 1):0{f}d}"
        for w, f in ((rng.randint(1, 9), rng.randint(1, 9)) for _ in range(5000))
    ]
    texts += ["-.5", "+5.", "-0.0", "0.", ".0", "-0.", "000012.3400", "0.1", "0.3", "2.675"]
    texts += ["12345678.1234567", "123456789.1234567", "0.000000000000001"]  # 15, 16, 16 digits
    texts += ["9999999999999.99", "1.7976931348623157", "4.9406564584124654"]
    values, present = _fields(texts).parse_float()
    assert present.all()
    assert _same_bits(values, texts) == []


def test_forms_around_the_dot_go_to_the_slower_paths_unchanged() -> None:
    # Python accepts blanks around a number and digit underscores: so does the parser.
    texts = [" 1.5", "1.5 ", "1_0.5", "1.5e3", "1.e2", ".5E-1", "-1.5e-3"]
    values, _ = _fields(texts).parse_float()
    assert _same_bits(values, texts) == []


@pytest.mark.parametrize("bad", [".", "-.", "+.", "1..2", "1.2.", ".-5", "1.-5", "- 1.5", "1.x"])
def test_malformed_decimals_are_refused(bad: str) -> None:
    # A well-formed number in the next field (its dot) must not make a bad field parse.
    with pytest.raises(ValueError, match="not a number"):
        _fields([bad, "2.5"]).parse_float()
    with pytest.raises(ValueError, match="not a number"):
        _fields(["x", bad, "1.25"]).parse_float()


_WARM_UP_THEN_RECORDS = """
from embeddb.features import ColumnSpec, NumericColumn
from embeddb.features import _number_kernel
from embeddb.features.records import RecordsChunk
from embeddb.serving.warmup import warm_up_kernels

warm_up_kernels()
warmed = list(_number_kernel.plain_numbers.signatures)
spec = ColumnSpec(numeric=(NumericColumn(("price",)),))
chunk = RecordsChunk([{"price": "12.5"}, {"price": 3}], spec)
values, _ = chunk.floats(["price"])
assert values.ravel().tolist() == [12.5, 3.0], values
print(len(warmed), len(_number_kernel.plain_numbers.signatures))
"""


@pytest.mark.slow
def test_the_model_server_warm_up_compiles_the_number_parser_of_raw_records() -> None:
    # A fresh process: the first raw record with a number as text ("12.5") compiles nothing.
    out = subprocess.run(
        [sys.executable, "-c", _WARM_UP_THEN_RECORDS],
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    ).stdout.split()
    assert out[0] != "0" and out[0] == out[1], f"signatures after warm-up, after a record: {out}"
