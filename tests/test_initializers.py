"""Deterministic row initialisers: per-id determinism, table keys, and the value distributions.

Statistical checks use fixed ids, so they are deterministic; their tolerances are six standard
errors of the estimate for the sample size used (noted at each check), so a correct generator
passes with a wide margin and a biased one (wrong scale, offset or shape) fails.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from embeddb.config import InitializerConfig, InitializerKind
from embeddb.engine.initializers import initial_vectors, table_key

UNIFORM = InitializerConfig(kind=InitializerKind.UNIFORM, low=-0.5, high=1.5)
NORMAL = InitializerConfig(kind=InitializerKind.NORMAL, mean=0.3, std=2.0)
ZEROS = InitializerConfig(kind=InitializerKind.ZEROS)
RANDOM_KINDS = {"uniform": UNIFORM, "normal": NORMAL}

KEY = table_key("user", 42)
U64_MAX = (1 << 64) - 1


def random_ids(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, U64_MAX, size=n, dtype=np.uint64, endpoint=True)


# ---------------------------------------------------------------- shape and dtype
@pytest.mark.parametrize("config", [UNIFORM, NORMAL, ZEROS], ids=["uniform", "normal", "zeros"])
@pytest.mark.parametrize(("n", "dim"), [(0, 4), (1, 1), (7, 16), (100, 3)])
def test_output_is_float32_of_shape_n_by_dim(config: InitializerConfig, n: int, dim: int) -> None:
    out = initial_vectors(random_ids(n, n + dim), dim, config, KEY)
    assert out.dtype == np.float32
    assert out.shape == (n, dim)
    assert np.isfinite(out).all()


def test_zeros_kind_gives_zeros() -> None:
    ids = np.concatenate([random_ids(300, 1), np.arange(100, dtype=np.uint64)])
    out = initial_vectors(ids, 12, ZEROS, KEY)
    assert out.shape == (400, 12) and out.dtype == np.float32
    assert np.count_nonzero(out) == 0
    assert not np.signbit(out).any()  # +0.0, not -0.0


# ---------------------------------------------------------------- determinism
@pytest.mark.parametrize("kind", sorted(RANDOM_KINDS))
def test_rows_do_not_depend_on_batch_order_composition_or_duplicates(kind: str) -> None:
    config = RANDOM_KINDS[kind]
    rng = np.random.default_rng(11)
    ids = np.concatenate([random_ids(400, 2), np.arange(100, dtype=np.uint64)])
    dim = 9
    full = initial_vectors(ids, dim, config, KEY)
    assert np.unique(full, axis=0).shape[0] == ids.size  # distinct ids get distinct rows

    perm = rng.permutation(ids.size)
    np.testing.assert_array_equal(initial_vectors(ids[perm], dim, config, KEY), full[perm])

    # split into uneven chunks computed separately
    cuts = np.sort(rng.choice(np.arange(1, ids.size), size=6, replace=False))
    parts = [initial_vectors(chunk, dim, config, KEY) for chunk in np.split(ids, cuts)]
    np.testing.assert_array_equal(np.concatenate(parts), full)

    # one id at a time
    for i in (0, 17, 250, ids.size - 1):
        np.testing.assert_array_equal(initial_vectors(ids[i : i + 1], dim, config, KEY)[0], full[i])

    # duplicates inside one batch get the same row as the id alone
    picks = rng.integers(0, ids.size, size=1000)
    np.testing.assert_array_equal(initial_vectors(ids[picks], dim, config, KEY), full[picks])

    # a second call with the same arguments repeats itself
    np.testing.assert_array_equal(initial_vectors(ids, dim, config, KEY), full)


@pytest.mark.slow
@settings(max_examples=60)
@given(
    ids=st.lists(st.integers(0, U64_MAX), min_size=1, max_size=30),
    data=st.data(),
    kind=st.sampled_from(sorted(RANDOM_KINDS)),
)
def test_each_row_depends_only_on_its_id(ids: list[int], data: st.DataObject, kind: str) -> None:
    config = RANDOM_KINDS[kind]
    arr = np.array(ids, dtype=np.uint64)
    batch = initial_vectors(arr, 5, config, KEY)
    order = data.draw(st.permutations(range(len(ids))), label="order")
    shuffled = initial_vectors(arr[list(order)], 5, config, KEY)
    for row, i in enumerate(order):
        np.testing.assert_array_equal(shuffled[row], batch[i])
    for i, x in enumerate(ids):
        alone = initial_vectors(np.array([x], dtype=np.uint64), 5, config, KEY)
        np.testing.assert_array_equal(alone[0], batch[i])


@pytest.mark.parametrize("kind", sorted(RANDOM_KINDS))
def test_element_j_of_a_row_does_not_depend_on_the_width(kind: str) -> None:
    """Element j is drawn from (id, key, j) alone, so a narrower row is a prefix of a wider one."""
    config = RANDOM_KINDS[kind]
    ids = random_ids(200, 5)
    wide = initial_vectors(ids, 32, config, KEY)
    for dim in (1, 4, 31):
        np.testing.assert_array_equal(initial_vectors(ids, dim, config, KEY), wide[:, :dim])


@pytest.mark.parametrize("kind", sorted(RANDOM_KINDS))
def test_int64_ids_give_the_rows_of_the_same_uint64_ids(kind: str) -> None:
    config = RANDOM_KINDS[kind]
    ids = np.arange(0, 5000, 37, dtype=np.int64)
    np.testing.assert_array_equal(
        initial_vectors(ids, 6, config, KEY),  # type: ignore[arg-type]
        initial_vectors(ids.astype(np.uint64), 6, config, KEY),
    )


# ---------------------------------------------------------------- table keys
def test_table_key_is_stable_for_the_same_name_and_seed() -> None:
    for name, seed in [("user", 42), ("item", 0), ("", 7), ("ünïcode-表", 123456789)]:
        first = table_key(name, seed)
        assert isinstance(first, np.uint64)
        assert all(table_key(name, seed) == first for _ in range(5))


@pytest.mark.slow
def test_table_key_is_stable_across_processes() -> None:
    """The key must not depend on per-process state such as Python's hash randomisation."""
    pairs = [("user", 42), ("item_tags", 0), ("ünïcode-表", 9)]
    script = (
        "from embeddb.engine.initializers import table_key\n"
        f"print(' '.join(str(int(table_key(n, s))) for n, s in {pairs!r}))\n"
    )
    want = " ".join(str(int(table_key(n, s))) for n, s in pairs)
    for hash_seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        done = subprocess.run(
            [sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True
        )
        assert done.stdout.strip() == want


def test_different_names_or_seeds_give_different_keys_and_vectors() -> None:
    keys = {
        ("user", 42): table_key("user", 42),
        ("item", 42): table_key("item", 42),
        ("user", 43): table_key("user", 43),
        ("user", 0): table_key("user", 0),
        ("users", 42): table_key("users", 42),
    }
    assert len({int(k) for k in keys.values()}) == len(keys)

    ids = np.concatenate([np.arange(300, dtype=np.uint64), random_ids(300, 8)])
    for config in RANDOM_KINDS.values():
        rows = {name: initial_vectors(ids, 8, config, key) for name, key in keys.items()}
        names = list(rows)
        for a in range(len(names)):
            for b in range(a + 1, len(names)):
                same_row = np.all(rows[names[a]] == rows[names[b]], axis=1)
                assert not same_row.any(), (names[a], names[b])
                # and the tables are unrelated element-wise, not just shifted a little
                same_value = rows[names[a]] == rows[names[b]]
                assert same_value.mean() < 0.01


# ---------------------------------------------------------------- distributions
N_ROWS, N_DIM = 10_000, 10  # 100k values per sample


def sample(config: InitializerConfig, ids_kind: str) -> np.ndarray:
    """The ``(N_ROWS, N_DIM)`` initial vectors of sequential or random ids, as float64."""
    ids = np.arange(N_ROWS, dtype=np.uint64) if ids_kind == "sequential" else random_ids(N_ROWS, 99)
    return initial_vectors(ids, N_DIM, config, KEY).astype(np.float64)


def six_se_correlation_bound(n: int) -> float:
    """Six standard errors of a sample correlation of independent variables (≈ 1/sqrt(n))."""
    return 6.0 / math.sqrt(n)


@pytest.mark.parametrize("ids_kind", ["sequential", "random"])
@pytest.mark.parametrize(("low", "high"), [(-0.5, 1.5), (-0.01, 0.01), (3.0, 3.25)])
def test_uniform_values_have_the_uniform_distribution(
    ids_kind: str, low: float, high: float
) -> None:
    config = InitializerConfig(kind=InitializerKind.UNIFORM, low=low, high=high)
    x = sample(config, ids_kind)
    n = x.size
    width = high - low
    # every value is a float32 rounding of a real in [low, high)
    assert x.min() >= np.float32(low) and x.max() <= np.float32(high)

    # mean: sd of a uniform is width/sqrt(12); SE of the mean is that / sqrt(n)
    se_mean = width / math.sqrt(12.0 * n)
    assert abs(x.mean() - (low + high) / 2) < 6 * se_mean

    # variance width^2/12; Var[(X-mu)^2] = width^4/80 - width^4/144 = width^4/180
    se_var = width**2 / math.sqrt(180.0 * n)
    assert abs(x.var() - width**2 / 12) < 6 * se_var

    # the whole range is used, edges included (to within a tiny fraction of the width)
    assert x.min() - low < 1e-3 * width and high - x.max() < 1e-3 * width

    # histogram over 20 equal bins is flat: chi-square(19) < df + 6 sqrt(2 df)
    u = np.clip((x - low) / width, 0.0, np.nextafter(1.0, 0.0))
    counts = np.bincount((u.ravel() * 20).astype(np.int64), minlength=20)
    expected = n / 20
    stat = float(((counts - expected) ** 2 / expected).sum())
    assert stat < 19 + 6 * math.sqrt(2 * 19)

    check_independence(x)


def check_independence(rows: np.ndarray) -> None:
    """Neighbouring elements of a row and the same element of neighbouring ids look unrelated."""
    bound = six_se_correlation_bound(rows.shape[0])
    for j in range(rows.shape[1] - 1):
        assert abs(np.corrcoef(rows[:, j], rows[:, j + 1])[0, 1]) < bound
    for j in (0, rows.shape[1] - 1):
        assert abs(np.corrcoef(rows[:-1, j], rows[1:, j])[0, 1]) < bound


@pytest.mark.parametrize("ids_kind", ["sequential", "random"])
@pytest.mark.parametrize(("mean", "std"), [(0.3, 2.0), (0.0, 0.01), (-5.0, 0.5)])
def test_normal_values_have_the_normal_distribution(ids_kind: str, mean: float, std: float) -> None:
    config = InitializerConfig(kind=InitializerKind.NORMAL, mean=mean, std=std)
    x = sample(config, ids_kind)
    n = x.size
    z = (x - mean) / std

    # mean: SE std/sqrt(n)
    assert abs(x.mean() - mean) < 6 * std / math.sqrt(n)
    # std: Var of the sample variance is 2 sigma^4/n, so SE(std) ≈ sigma / sqrt(2n)
    assert abs(x.std() - std) < 6 * std / math.sqrt(2.0 * n)

    # symmetric: half above the mean (SE 0.5/sqrt(n)); skewness ≈ 0 (SE sqrt(6/n))
    assert abs(np.mean(z > 0) - 0.5) < 6 * 0.5 / math.sqrt(n)
    assert abs(np.mean(z**3)) < 6 * math.sqrt(6.0 / n)
    # normal shape: excess kurtosis ≈ 0 (SE sqrt(24/n)); P(|z| < 1) = 0.6827, P(|z| < 2) = 0.9545
    assert abs(np.mean(z**4) - 3.0) < 6 * math.sqrt(24.0 / n)
    for k, p in ((1.0, 0.682689492), (2.0, 0.954499736)):
        assert abs(np.mean(np.abs(z) < k) - p) < 6 * math.sqrt(p * (1 - p) / n)
    # tails exist but stay plausible for 100k draws (|z| > 6 has probability 2e-9)
    assert np.abs(z).max() > 3.0 and np.abs(z).max() < 6.0

    check_independence(x)
