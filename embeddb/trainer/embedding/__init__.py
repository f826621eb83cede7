"""The embedding stage of an NN worker (PERSIA's embedding worker), torch-free.

Owns: :mod:`.worker` (dedup, lookup, pool, buffer, push: the transport-free core, and
:class:`~embeddb.trainer.embedding.worker.EmbeddingWorkerConfig`), :mod:`.plan` (a batch's
lookup plan and pooling back, shared with the model server), :mod:`.process` (that core
in its own process and the NN worker's handle on it), :mod:`.protocol` (their messages),
:mod:`.channel` (shared-memory rings for their array buffers), :mod:`.spawn` (starting it
with multiprocessing ``spawn``), :mod:`.staleness` (the staleness bound), :mod:`.metrics`
(its Prometheus metrics).

May import: :mod:`embeddb.client`, :mod:`embeddb.features`, :mod:`embeddb.transport.rpc` (the
metrics endpoint), :mod:`embeddb.trainer.pooling` and :mod:`embeddb.trainer.errors`; never
torch (the process must start without it).
"""
