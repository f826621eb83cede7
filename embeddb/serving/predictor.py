"""What the model server needs of the model it serves (an :class:`~.infer.InferCtx`).

A module of its own so that both frontends (``server.py``'s gRPC servicer and ``http.py``'s
HTTP frontend) depend on it, and not on each other.
"""

from __future__ import annotations

from typing import Protocol

from embeddb.common.arrays import F32
from embeddb.features.batch import Batch
from embeddb.serving.codec import ModelInputs

__all__ = ["Predictor"]


class Predictor(Protocol):
    """What the server needs of an :class:`~embeddb.serving.InferCtx`."""

    @property
    def spec(self) -> ModelInputs: ...
    def predict(self, batch: Batch) -> F32: ...
    def batch_from_records(self, records: object) -> Batch: ...
    def batch_from_hashed_records(self, records: object) -> Batch: ...
