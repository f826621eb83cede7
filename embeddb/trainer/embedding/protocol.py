"""Messages between the NN worker and its embedding worker process (a duplex pipe).

Every message is a small frozen dataclass, pickled with protocol 5; its large numpy arrays
travel through shared memory beside the pipe (:mod:`embeddb.trainer.embedding.channel`).

NN worker -> embedding worker (:data:`ToWorker`):

==================  ===================================================================
:class:`Lookup`     ``batch_ref, train, features``; ``features`` a tuple of
                    ``(name, ids uint64, offsets int64 | None)`` in the batch's order
:class:`Gradients`  ``batch_ref, grads, nonfinite``; ``grads`` one float32 array (or
                    ``None``) per feature in lookup order; ``nonfinite`` rows zeroed
:class:`Discard`    ``batch_ref``: no gradients will come for this batch
:class:`Flush`      ``request``: answer once every push so far has been answered
:class:`Stats`      ``request``: answer with the worker's metrics
:class:`Close`      ``request``: drain pushes, answer with the final metrics, exit
==================  ===================================================================

Embedding worker -> NN worker (:data:`FromWorker`):

=========================  =========================================================
:class:`Ready`             ``pid``: the worker checked the cluster and serves
:class:`StartFailed`       ``error, message``: it could not start; it exits
:class:`PooledEmbeddings`  ``batch_ref, pooled``: one array or ``(array, mask)`` per
                           feature
:class:`LookupFailed`      ``batch_ref, error, message, cause``
:class:`AsyncFailure`      ``error, message, cause``: an asynchronous failure (a push)
:class:`Reply`             ``request, payload``: the answer to :class:`Flush` (no
                           metrics), :class:`Stats` or :class:`Close`
=========================  =========================================================

``error`` names a class of :mod:`embeddb.trainer.errors` or :mod:`embeddb.errors`; ``cause``
the type of the original exception. :func:`error_from` rebuilds the exception.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TypeAlias

from embeddb import errors as core_errors
from embeddb.common.arrays import F32
from embeddb.trainer import errors as trainer_errors
from embeddb.trainer.embedding.plan import IdFeature
from embeddb.trainer.pooling import Pooled

__all__ = [
    "AsyncFailure",
    "Close",
    "Discard",
    "Flush",
    "FromWorker",
    "Gradients",
    "Lookup",
    "LookupFailed",
    "PooledEmbeddings",
    "Ready",
    "Reply",
    "Request",
    "StartFailed",
    "Stats",
    "ToWorker",
    "error_from",
]


# ---------------------------------------------------------------------- NN worker -> worker
@dataclass(frozen=True)
class Lookup:
    """Look up and pool a batch's ID features; a training batch then waits for its gradients."""

    batch_ref: int
    train: bool
    features: tuple[IdFeature, ...] = field(repr=False)


@dataclass(frozen=True)
class Gradients:
    """A batch's embedding gradients, one per feature in lookup order (``None``: none)."""

    batch_ref: int
    grads: tuple[F32 | None, ...] = field(repr=False)
    nonfinite: int


@dataclass(frozen=True)
class Discard:
    """No gradients will come for this training batch: release it."""

    batch_ref: int


@dataclass(frozen=True)
class Flush:
    """Answer (an empty :class:`Reply`) once every push received so far has been answered."""

    request: int


@dataclass(frozen=True)
class Stats:
    """Answer with the worker's metrics."""

    request: int


@dataclass(frozen=True)
class Close:
    """Drain pending pushes, answer with the final metrics, exit."""

    request: int


Request: TypeAlias = Flush | Stats | Close
"""The messages answered by a :class:`Reply` of the same ``request``."""

ToWorker: TypeAlias = Lookup | Gradients | Discard | Request


# ---------------------------------------------------------------------- worker -> NN worker
@dataclass(frozen=True)
class Ready:
    """The worker checked the cluster and serves."""

    pid: int


@dataclass(frozen=True)
class StartFailed:
    """The worker could not start; it exits."""

    error: str
    message: str


@dataclass(frozen=True)
class PooledEmbeddings:
    """A batch's pooled embeddings: one array or ``(array, mask)`` per feature."""

    batch_ref: int
    pooled: list[Pooled] = field(repr=False)


@dataclass(frozen=True)
class LookupFailed:
    """A batch's lookup failed (after its retries)."""

    batch_ref: int
    error: str
    message: str
    cause: str | None


@dataclass(frozen=True)
class AsyncFailure:
    """An asynchronous failure (a gradient push), raised by the NN worker's next call."""

    error: str
    message: str
    cause: str | None


@dataclass(frozen=True)
class Reply:
    """The answer to the :data:`Request` of id ``request``: the worker's metrics (empty for
    :class:`Flush`)."""

    request: int
    payload: dict[str, float]


FromWorker: TypeAlias = Ready | StartFailed | PooledEmbeddings | LookupFailed | AsyncFailure | Reply


def error_from(name: str, message: str, cause: str | None = None) -> core_errors.EmbeddbError:
    """The exception a message names: a trainer error (with ``cause``), an embeddb error
    constructible from its message, or else :class:`~embeddb.trainer.errors.TrainerError`."""
    trainer_cls = getattr(trainer_errors, name, None)
    if isinstance(trainer_cls, type) and issubclass(trainer_cls, trainer_errors.TrainerError):
        return trainer_cls(message, cause=cause)
    if name == "ConfigError":
        return core_errors.ConfigError("", message)
    core_cls = getattr(core_errors, name, None)
    if (
        isinstance(core_cls, type)
        and issubclass(core_cls, core_errors.EmbeddbError)
        and core_cls is not core_errors.TableNotFoundError
    ):
        return core_cls(message)
    return trainer_errors.TrainerError(f"{name}: {message}", cause=cause or name)
