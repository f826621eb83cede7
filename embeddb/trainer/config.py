"""Settings of a training context: the mode, the staleness bound, the device and the rest.

The modes (one setting, same model and data; ``max_staleness`` is the embedding worker's,
``TrainerConfig.worker.max_staleness``)::

    mode     embedding lookups                     embedding updates   dense updates
    ───────  ────────────────────────────────────  ──────────────────  ───────────────────────────
    sync     batch t+1 waits for t's updates       async push          all-reduced, every step
             (``max_staleness`` forced to 1)
    hybrid   up to ``max_staleness`` batches       async push          all-reduced, every step
             looked up with updates not applied
    async    as hybrid                             async push          the gradient of step t is
                                                                       applied at step t + s,
                                                                       s = ``max_staleness``

``async`` models a parameter server's stale dense updates deterministically: every rank applies
the same (all-reduced) gradient ``s`` steps late, so replicas stay identical, and the all-reduce
itself runs in the background for ``s`` steps (``async_op``), off the critical path.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field, replace

from embeddb.errors import ConfigError
from embeddb.trainer.embedding.worker import EmbeddingWorkerConfig

__all__ = ["BUILTIN_MODELS", "EMBEDDING_STAGES", "Mode", "TrainerConfig"]

#: Where the embedding stage may run (``TrainerConfig.embedding_stage``).
EMBEDDING_STAGES = ("process", "thread")

# The built-in dense models (``model: builtin:NAME``); embeddb.trainer.models builds them (torch).
BUILTIN_MODELS = ("dnn", "fm", "deepfm", "dlrm")


class Mode(str, enum.Enum):
    """How stale embeddings and dense updates may be (see the module docstring)."""

    HYBRID = "hybrid"
    SYNC = "sync"
    ASYNC = "async"


@dataclass(frozen=True)
class TrainerConfig:
    """Settings of :class:`~embeddb.trainer.ctx.TrainCtx` and :class:`~.EvalCtx`::

        TrainerConfig(mode="hybrid", device="cpu", worker=EmbeddingWorkerConfig(max_staleness=8))

    Attributes:
        mode: ``hybrid`` (default), ``sync`` or ``async`` (a plain string is converted).
        device: ``"cpu"``, ``"cuda"`` (``cuda:LOCAL_RANK``) or ``"cuda:N"``; ``None`` picks
            ``cuda:LOCAL_RANK`` when CUDA is available, else ``cpu``.
        mixed_precision: autocast to float16 and scale the loss (``torch.amp.GradScaler``);
            CUDA only. Embedding gradients are unscaled before they are sent.
        lookup_timeout: seconds ``forward`` waits for a batch's embeddings before it raises.
        start_timeout: seconds the embedding worker may take to start.
        close_timeout: seconds ``close`` waits for pending gradient pushes.
        worker: the embedding worker's settings
            (:class:`~embeddb.trainer.embedding.worker.EmbeddingWorkerConfig`), as the worker
            of local rank 0 gets them; :meth:`embedding_worker` derives each rank's. Its
            ``max_staleness`` is the training batches that may be looked up with gradients not
            yet applied (``sync`` uses 1 whatever is set; ``async`` also delays dense updates
            by this many steps); the worker of local rank ``r`` serves its Prometheus metrics
            on ``metrics_port + r``; its ``token`` (a read-write one, never in ``repr``) is
            sent by every client of the context: the embedding worker's lookups and pushes and
            ``save_checkpoint``'s snapshot calls. Read the token from a file at the
            composition root (the job's ``token_file``).
        torch_threads: torch intra-op threads of this NN worker, set by the context
            (``torch.set_num_threads``) and restored when it closes. ``None`` (default): the
            machine's core budget (:mod:`embeddb.trainer.cores`: 1 on 2 CPUs with a local
            shard), unless ``OMP_NUM_THREADS`` is set (by ``embeddb train``, torchrun or the
            user), which is then left to torch.
        embedding_stage: where the embedding stage (lookups, pooling, pushes) runs:
            ``"process"`` (default), its own process behind a pipe and shared-memory rings
            (:mod:`embeddb.trainer.embedding.process`); ``"thread"``, a thread of this NN
            worker process, no process crossing and no serialization of the batch's ids,
            embeddings and gradients (:mod:`embeddb.trainer.embedding.in_process`). Both talk
            to the shards over gRPC with the same staleness bound and failures.
    """

    mode: Mode = Mode.HYBRID
    device: str | None = None
    mixed_precision: bool = False
    lookup_timeout: float = 600.0
    start_timeout: float = 120.0
    close_timeout: float = 120.0
    worker: EmbeddingWorkerConfig = field(default_factory=EmbeddingWorkerConfig)
    torch_threads: int | None = None
    embedding_stage: str = "process"

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "mode", Mode(self.mode))
        except ValueError:
            modes = ", ".join(m.value for m in Mode)
            raise ConfigError("mode", f"must be one of {modes}, got {self.mode!r}") from None
        if not isinstance(self.mixed_precision, bool):
            raise ConfigError("mixed_precision", f"must be a bool, got {self.mixed_precision!r}")
        for name in ("lookup_timeout", "start_timeout", "close_timeout"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and value > 0):
                raise ConfigError(name, f"must be a positive number of seconds, got {value!r}")
        if self.device is not None and not isinstance(self.device, str):
            raise ConfigError(
                "device", f"must be a string such as 'cpu' or 'cuda:0', got {self.device!r}"
            )
        if self.torch_threads is not None and (
            isinstance(self.torch_threads, bool)
            or not isinstance(self.torch_threads, int)
            or self.torch_threads < 1
        ):
            raise ConfigError(
                "torch_threads", f"must be an integer >= 1 or None, got {self.torch_threads!r}"
            )
        if self.embedding_stage not in EMBEDDING_STAGES:
            raise ConfigError(
                "embedding_stage",
                f"must be one of {', '.join(EMBEDDING_STAGES)}, got {self.embedding_stage!r}",
            )
        if not isinstance(self.worker, EmbeddingWorkerConfig):
            raise ConfigError(
                "worker", f"must be an EmbeddingWorkerConfig, got {type(self.worker).__name__}"
            )

    @property
    def embedding_staleness(self) -> int:
        """The embedding worker's staleness bound: 1 in ``sync`` mode, else ``max_staleness``."""
        return 1 if self.mode is Mode.SYNC else self.worker.max_staleness

    @property
    def dense_delay(self) -> int:
        """Steps by which dense gradients are applied late: ``max_staleness`` in ``async``."""
        return self.worker.max_staleness if self.mode is Mode.ASYNC else 0

    def embedding_worker(self, local_rank: int = 0) -> EmbeddingWorkerConfig:
        """The embedding worker's settings for the NN worker of ``local_rank``: :attr:`worker`
        with the mode's staleness bound and the rank's metrics port.

        Raises:
            ConfigError: the rank's metrics port is not a TCP port.
        """
        port = self.worker.metrics_port
        return replace(
            self.worker,
            max_staleness=self.embedding_staleness,
            metrics_port=None if port is None else port + local_rank,
        )
