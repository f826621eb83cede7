"""Compiled optimizer updates on ``[vector | state]`` rows.

Each kernel updates dense blocks in place with ``grads`` (shape ``(k, dim)``), row by row:
``w`` (the vectors) and the optimizer's state blocks, each a separate ``(k, ·)`` array. Callers
gather the affected rows into these blocks first and scatter them back afterwards: random rows
touched by a long arithmetic loop leave the CPU no memory-level parallelism, and one array
holding both vector and state defeats LLVM's vectoriser (it cannot prove the column ranges
disjoint); a tight gather loop plus separate contiguous blocks run about five times faster.
Duplicate ids were summed and non-finite gradient rows dropped by the caller. After the
update each vector element is clamped to ``[-bound, bound]`` when ``bound > 0``. Arithmetic
is float32, like ``torch.optim`` on float32 parameters.

Finite gradients can still overflow float32 (a huge gradient squared into Adagrad's
accumulator, ``lr * g`` beyond 3.4e38): :func:`apply_rows` writes back only the rows whose
updated vector and state are all finite and counts the others, whose stored rows stay as they
were (like rows with a non-finite gradient).

The formulas follow ``torch.optim`` (SGD with L2 weight decay, Adagrad, Adam with bias
correction), applied per row; Adam's step counter lives in the row (``state[2 * dim]``), so a
row updated for the first time gets the full bias correction however long the table has been
training. The counter is a float32 and counts exactly to 2**24 updates of one row; beyond that
``1 - beta ** t`` equals 1 in float32 for every usable beta, so the saturation is harmless.
"""

from __future__ import annotations

import numba
import numpy as np
import numpy.typing as npt

__all__ = [
    "ADAGRAD",
    "ADAM",
    "CHUNK_ROWS",
    "SGD",
    "adagrad_update",
    "adam_update",
    "apply_rows",
    "finite_rows",
    "gather_blocks",
    "scatter_finite_blocks",
    "sgd_update",
]


@numba.njit(nogil=True, cache=True)
def gather_blocks(rows, slots, w, a, b, c):
    """Split ``rows[slots[k]]`` into consecutive column blocks ``w | a | b | c`` (row ``k`` each).

    Blocks are separate arrays so that the update kernels' loops vectorise (LLVM cannot prove
    two column ranges of one array disjoint). Unused blocks have zero columns.
    """
    nw, na, nb, nc = w.shape[1], a.shape[1], b.shape[1], c.shape[1]
    for k in range(slots.size):
        s = slots[k]
        for j in range(nw):
            w[k, j] = rows[s, j]
        for j in range(na):
            a[k, j] = rows[s, nw + j]
        for j in range(nb):
            b[k, j] = rows[s, nw + na + j]
        for j in range(nc):
            c[k, j] = rows[s, nw + na + nb + j]


@numba.njit(nogil=True, cache=True, inline="always")
def _block_finite(x, k):
    """Whether row ``k`` of block ``x`` is all finite: ``v * 0`` is 0 for a finite ``v`` and
    NaN for NaN or ±Inf, and a NaN makes the sum NaN (a branch-free loop that vectorises)."""
    acc = np.float32(0.0)
    zero = np.float32(0.0)
    for j in range(x.shape[1]):
        acc += x[k, j] * zero
    return acc == zero


@numba.njit(nogil=True, cache=True)
def scatter_finite_blocks(rows, slots, w, a, b, c):
    """Inverse of :func:`gather_blocks` for the rows whose blocks are all finite: write them
    back into ``rows[slots[k]]``; the other rows of ``rows`` are left unchanged. Returns the
    number of rows left unchanged."""
    nw, na, nb, nc = w.shape[1], a.shape[1], b.shape[1], c.shape[1]
    skipped = 0
    for k in range(slots.size):
        ok = _block_finite(w, k) and _block_finite(a, k)
        ok = ok and _block_finite(b, k) and _block_finite(c, k)
        if not ok:
            skipped += 1
            continue
        s = slots[k]
        for j in range(nw):
            rows[s, j] = w[k, j]
        for j in range(na):
            rows[s, nw + j] = a[k, j]
        for j in range(nb):
            rows[s, nw + na + j] = b[k, j]
        for j in range(nc):
            rows[s, nw + na + nb + j] = c[k, j]
    return skipped


_EXP_MASK = np.uint32(0x7F800000)


@numba.njit(nogil=True, cache=True)
def _finite_bits(bits, out):
    n, dim = bits.shape
    good = 0
    for k in range(n):
        bad = np.uint32(0)
        for j in range(dim):  # an all-ones exponent means NaN or ±Inf; integer ops vectorise
            bad |= np.uint32((bits[k, j] & _EXP_MASK) == _EXP_MASK)
        out[k] = bad == 0
        good += bad == 0
    return good


def finite_rows(grads: npt.NDArray[np.float32], out: npt.NDArray[np.bool_]) -> int:
    """``out[k]`` = all of ``grads[k]`` is finite (``grads`` C-contiguous float32).

    Returns:
        The number of finite rows.
    """
    return int(_finite_bits(grads.view(np.uint32), out))


@numba.njit(nogil=True, cache=True, inline="always")
def _clamp(x, bound):
    return min(max(x, -bound), bound) if bound > 0 else x


@numba.njit(nogil=True, cache=True, error_model="numpy")
def sgd_update(w, grads, lr, weight_decay, bound):
    """``w -= lr * (g + weight_decay * w)``."""
    n, dim = grads.shape
    lr = np.float32(lr)
    wd = np.float32(weight_decay)
    b = np.float32(bound)
    for k in range(n):
        for j in range(dim):
            x = w[k, j]
            w[k, j] = _clamp(x - lr * (grads[k, j] + wd * x), b)


@numba.njit(nogil=True, cache=True, error_model="numpy")
def adagrad_update(w, acc, grads, lr, weight_decay, eps, bound):
    """``acc += g*g; w -= lr * g / (sqrt(acc) + eps)``.

    ``acc`` has ``dim`` columns, or one (row-wise Adagrad, PERSIA's ``vectorwise_shared``: the
    row's single accumulator is fed with ``mean(g*g)`` over the row, as FBGEMM's
    ``EXACT_ROWWISE_ADAGRAD``).
    """
    n, dim = grads.shape
    lr = np.float32(lr)
    wd = np.float32(weight_decay)
    eps = np.float32(eps)
    b = np.float32(bound)
    if acc.shape[1] == 1:
        for k in range(n):
            sq = np.float32(0.0)
            for j in range(dim):
                g = grads[k, j] + wd * w[k, j]
                sq += g * g
            total = acc[k, 0] + sq / np.float32(dim)
            acc[k, 0] = total
            denom = np.sqrt(total) + eps
            for j in range(dim):
                x = w[k, j]
                w[k, j] = _clamp(x - lr * (grads[k, j] + wd * x) / denom, b)
    else:
        for k in range(n):
            for j in range(dim):
                x = w[k, j]
                g = grads[k, j] + wd * x
                total = acc[k, j] + g * g
                acc[k, j] = total
                w[k, j] = _clamp(x - lr * g / (np.sqrt(total) + eps), b)


@numba.njit(nogil=True, cache=True, error_model="numpy")
def adam_update(w, m, v, step, grads, lr, weight_decay, beta1, beta2, eps, bound):
    """Adam with L2 weight decay and a per-row step counter ``step[k, 0]``."""
    n, dim = grads.shape
    wd = np.float32(weight_decay)
    b1 = np.float32(beta1)
    b2 = np.float32(beta2)
    eps = np.float32(eps)
    b = np.float32(bound)
    one = np.float32(1.0)
    for k in range(n):
        t = step[k, 0] + one
        step[k, 0] = t
        step_size = np.float32(lr / (1.0 - beta1 ** np.float64(t)))
        bc2_sqrt = np.float32(np.sqrt(1.0 - beta2 ** np.float64(t)))
        for j in range(dim):
            x = w[k, j]
            g = grads[k, j] + wd * x
            mk = b1 * m[k, j] + (one - b1) * g
            vk = b2 * v[k, j] + (one - b2) * g * g
            m[k, j] = mk
            v[k, j] = vk
            w[k, j] = _clamp(x - step_size * mk / (np.sqrt(vk) / bc2_sqrt + eps), b)


SGD = 0
ADAGRAD = 1
ADAM = 2
CHUNK_ROWS = 128


@numba.njit(nogil=True, cache=True)
def apply_rows(kind, rows, slots, grads, w, a, b, c, lr, weight_decay, eps, beta1, beta2, bound):
    """Update ``rows[slots[k]]`` with ``grads[k]`` in chunks of ``w.shape[0]`` rows.

    Each chunk is gathered into the blocks ``w | a | b | c``, updated, and scattered back while
    its rows are still in cache, so random rows are read from memory once. A row whose update
    is not all finite (float32 overflow) is not written back.

    Returns:
        The number of rows left unchanged because their update overflowed.
    """
    n = slots.size
    size = w.shape[0]
    skipped = 0
    for start in range(0, n, size):
        m = min(size, n - start)
        sl = slots[start : start + m]
        g = grads[start : start + m]
        wm, am, bm, cm = w[:m], a[:m], b[:m], c[:m]
        gather_blocks(rows, sl, wm, am, bm, cm)
        if kind == SGD:
            sgd_update(wm, g, lr, weight_decay, bound)
        elif kind == ADAGRAD:
            adagrad_update(wm, am, g, lr, weight_decay, eps, bound)
        else:
            adam_update(wm, am, bm, cm, g, lr, weight_decay, beta1, beta2, eps, bound)
        skipped += scatter_finite_blocks(rows, sl, wm, am, bm, cm)
    return skipped
