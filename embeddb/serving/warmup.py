"""Warm-up of a model server before it accepts calls: no request pays for a compilation.

numba compiles a kernel on its first call (or loads it from its on-disk cache, ``cache=True``):
the client's deduplication and routing kernels on the first lookup, the core's hash-index
kernels on the first lookup of a shard opened in this process
(:class:`~embeddb.serving.local_shards.LocalShards`). TorchScript optimises its graph
over its first calls. Before :func:`~embeddb.serving.server.build_model_server` binds
its ports it calls the predictor's ``warm_up`` (:meth:`InferCtx.warm_up
<embeddb.serving.InferCtx.warm_up>`)::

    warm_up_kernels()       embeddb.client.warm_up_client() + embeddb.engine.warmup.warm_up_core()
                            + the string hash and the number parser of raw records
    3 x one dummy record    id 0 of every ID feature, zeros for the non-ID inputs: lookup
                            (evaluation: nothing inserted), pooling, TorchScript forward
"""

from __future__ import annotations

import logging
import time

from embeddb.client import warm_up_client
from embeddb.engine.warmup import warm_up_core

__all__ = ["warm_up_kernels"]

logger = logging.getLogger(__name__)


def warm_up_kernels() -> float:
    """Compile (or load from numba's cache) every numba kernel a model server runs: the
    client's (:func:`embeddb.client.warm_up_client`), the core's
    (:func:`embeddb.engine.warmup.warm_up_core`, for shards opened in-process), the string hash and
    the number parser of raw records. Idempotent; cheap once warm.

    Returns:
        Seconds spent.
    """
    from embeddb.features._fields import warm_up_numbers  # the data package: loaded late
    from embeddb.features.hashing import hash_strings

    started = time.perf_counter()
    client = warm_up_client()
    core = warm_up_core()
    hashed = time.perf_counter()
    hash_strings(["warm-up"])  # compiles (or loads) the kernel raw records' strings hash with
    warm_up_numbers()  # and the one their numbers given as text ("12.5") are parsed with
    logger.debug(
        "numba kernels ready: client %.3f s, core %.3f s, string hash and numbers %.3f s",
        client,
        core,
        time.perf_counter() - hashed,
    )
    return time.perf_counter() - started
