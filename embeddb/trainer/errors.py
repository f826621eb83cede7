"""The trainer's errors: a branch of the embeddb exception tree (:mod:`embeddb.errors`)::

    EmbeddbError
    └── TrainerError
        ├── EmbeddingWorkerError       the embedding worker process failed to start, died, or
        │                              did not answer in time
        ├── LookupFailedError          a batch's lookup failed after its retries (a shard down)
        └── GradientPushFailedError    a batch's gradients could not be applied after retries;
                                       raised by the next call of the training context

Errors inside the embedding worker process (client errors such as
:class:`~embeddb.errors.UnavailableError`) reach the NN worker as one of these, their message
naming the original type, which is also kept in ``cause``.
"""

from __future__ import annotations

from embeddb.errors import EmbeddbError

__all__ = [
    "EmbeddingWorkerError",
    "GradientPushFailedError",
    "LookupFailedError",
    "TrainerError",
]


class TrainerError(EmbeddbError):
    """Root of the trainer's errors.

    Attributes:
        cause: the name of the original exception type when the error crossed a process
            boundary (``"UnavailableError"``), else ``None``.
    """

    def __init__(self, message: str, cause: str | None = None) -> None:
        super().__init__(message)
        self.cause = cause


class EmbeddingWorkerError(TrainerError):
    """The embedding worker process failed to start, exited, or did not answer in time."""


class LookupFailedError(TrainerError):
    """The lookup of a batch failed after the worker's retries."""


class GradientPushFailedError(TrainerError):
    """A batch's embedding gradients could not be applied after the worker's retries."""
