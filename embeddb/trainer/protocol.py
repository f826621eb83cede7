"""Messages between the NN worker and its embedding worker process (a duplex pipe).

Every message is a tuple whose first item is its kind; numpy arrays travel pickled (one copy
each way; measured in the module docstring of :mod:`embeddb.trainer.worker_process`).

NN worker -> embedding worker:

==============  =====================================================================
``LOOKUP``      ``(LOOKUP, batch_ref, train, features)``; ``features`` a tuple of
                ``(name, ids uint64, offsets int64 | None)`` in the batch's order
``GRADIENTS``   ``(GRADIENTS, batch_ref, grads, nonfinite)``; ``grads`` one float32 array
                (or ``None``) per feature in lookup order; ``nonfinite`` rows zeroed
``DISCARD``     ``(DISCARD, batch_ref)``: no gradients will come for this batch
``FLUSH``       ``(FLUSH, request)``: answer once every push so far has been answered
``STATS``       ``(STATS, request)``: answer with the worker's metrics
``CLOSE``       ``(CLOSE, request)``: drain pushes, answer with the final metrics, exit
==============  =====================================================================

Embedding worker -> NN worker:

=================  ==================================================================
``READY``          ``(READY, pid)``: the worker checked the cluster and serves
``START_FAILED``   ``(START_FAILED, error, message)``: it could not start; it exits
``POOLED``         ``(POOLED, batch_ref, pooled)``: one array or ``(array, mask)`` per
                   feature
``LOOKUP_FAILED``  ``(LOOKUP_FAILED, batch_ref, error, message, cause)``
``FAILURE``        ``(FAILURE, error, message, cause)``: an asynchronous failure (a push)
``REPLY``          ``(REPLY, request, payload)``: the answer to FLUSH, STATS or CLOSE
=================  ==================================================================

``error`` names a class of :mod:`embeddb.trainer.errors` or :mod:`embeddb.errors`; ``cause``
the type of the original exception. :func:`error_from` rebuilds the exception.
"""

from __future__ import annotations

from embeddb import errors as core_errors

from . import errors as trainer_errors

__all__ = [
    "CLOSE",
    "DISCARD",
    "FAILURE",
    "FLUSH",
    "GRADIENTS",
    "LOOKUP",
    "LOOKUP_FAILED",
    "POOLED",
    "READY",
    "REPLY",
    "START_FAILED",
    "STATS",
    "error_from",
]

LOOKUP = "lookup"
GRADIENTS = "gradients"
DISCARD = "discard"
FLUSH = "flush"
STATS = "stats"
CLOSE = "close"

READY = "ready"
START_FAILED = "start_failed"
POOLED = "pooled"
LOOKUP_FAILED = "lookup_failed"
FAILURE = "failure"
REPLY = "reply"


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
