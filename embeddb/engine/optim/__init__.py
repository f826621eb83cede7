"""Server-side embedding optimizers (SGD, Adagrad, Adam) as compiled in-place row updates."""

from __future__ import annotations

from embeddb.engine.optim.optimizer import Optimizer

__all__ = ["Optimizer"]
