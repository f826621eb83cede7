"""The server-side optimizer of one table: state layout plus a compiled update."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from embeddb.config import OptimizerConfig, OptimizerKind
from embeddb.engine.optim.kernels import (
    ADAGRAD,
    ADAM,
    CHUNK_ROWS,
    SGD,
    adagrad_update,
    adam_update,
    apply_rows,
    finite_rows,
    sgd_update,
)

_KIND_CODE = {OptimizerKind.SGD: SGD, OptimizerKind.ADAGRAD: ADAGRAD, OptimizerKind.ADAM: ADAM}

__all__ = ["Optimizer"]


class Optimizer:
    """Applies one table's optimizer to rows laid out as ``[vector | state]``.

    State layout per kind (``d = dim``)::

        sgd                      [w_0 .. w_d-1]
        adagrad                  [w_0 .. w_d-1 | acc_0 .. acc_d-1]
        adagrad (vector-wise)    [w_0 .. w_d-1 | acc]
        adam                     [w_0 .. w_d-1 | m_0 .. m_d-1 | v_0 .. v_d-1 | step]

    Args:
        config: the table's optimizer settings.
        dim: the table's vector width.
        weight_bound: clamp for vector elements after an update (``None``: no clamp).
    """

    def __init__(
        self, config: OptimizerConfig, dim: int, weight_bound: float | None = None
    ) -> None:
        self.config = config
        self.dim = dim
        self.state_dim = config.state_dim(dim)
        self._bound = float(weight_bound) if weight_bound is not None else 0.0

    @property
    def signature(self) -> tuple[OptimizerConfig, int, float]:
        """Equal for optimizers that update a row identically (settings, dim, weight bound):
        such tables' rows may be updated in one :meth:`apply`."""
        return self.config, self.dim, self._bound

    def initial_state(self, n: int) -> npt.NDArray[np.float32]:
        """The state of ``n`` freshly created rows (Adagrad: the initial accumulator)."""
        state = np.zeros((n, self.state_dim), dtype=np.float32)
        if self.config.kind is OptimizerKind.ADAGRAD:
            state.fill(self.config.initial_accumulator)
        return state

    def apply(
        self,
        rows: npt.NDArray[np.float32],
        index: npt.NDArray[np.int64],
        grads: npt.NDArray[np.float32],
    ) -> int:
        """Update ``rows[index[k]]`` in place with ``grads[k]``, skipping non-finite gradients
        and updates that would store a non-finite value (float32 overflow): those rows are left
        unchanged.

        ``index`` must be distinct; ``grads`` has shape ``(len(index), dim)``.

        Returns:
            The number of rows skipped because their gradient had a NaN or Inf, or their
            updated vector or state would have.
        """
        finite = np.empty(index.size, dtype=np.bool_)
        good = finite_rows(grads, finite)
        if good < index.size:
            index, grads = index[finite], np.ascontiguousarray(grads[finite])
        if index.size == 0:
            return int(finite.size - good)
        c = self.config
        overflowed = apply_rows(  # type: ignore[call-arg]
            _KIND_CODE[c.kind], rows, index, grads, *self._blocks(min(index.size, CHUNK_ROWS)),
            c.lr, c.weight_decay, c.eps, c.beta1, c.beta2, self._bound,
        )  # fmt: skip
        return int(finite.size - good) + int(overflowed)

    def _blocks(self, k: int) -> tuple[npt.NDArray[np.float32], ...]:
        """Empty ``(w, a, b, c)`` blocks for ``k`` rows, split per this optimizer's layout."""
        d = self.dim
        if self.config.kind is OptimizerKind.ADAM:
            widths = (d, d, d, 1)
        else:
            widths = (d, self.state_dim, 0, 0)
        return tuple(np.empty((k, c), dtype=np.float32) for c in widths)

    def update_blocks(
        self, blocks: tuple[npt.NDArray[np.float32], ...], grads: npt.NDArray[np.float32]
    ) -> None:
        """Update gathered ``(w, a, b, c)`` blocks in place with finite ``grads`` (the blocks
        may overflow to non-finite values: write them back with
        :func:`~embeddb.engine.optim.kernels.scatter_finite_blocks`)."""
        c = self.config
        w, a, b, t = blocks
        if c.kind is OptimizerKind.SGD:
            sgd_update(w, grads, c.lr, c.weight_decay, self._bound)
        elif c.kind is OptimizerKind.ADAGRAD:
            adagrad_update(w, a, grads, c.lr, c.weight_decay, c.eps, self._bound)
        else:
            adam_update(
                w, a, b, t, grads, c.lr, c.weight_decay, c.beta1, c.beta2, c.eps, self._bound
            )
