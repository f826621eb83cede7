"""Settings of a training context: the mode, the staleness bound, the device and the rest.

The modes (one setting, same model and data)::

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
from collections.abc import Mapping
from dataclasses import dataclass, field

from embeddb.errors import ConfigError

from .embedding_worker import EmbeddingWorkerConfig
from .pooling import Pooling

__all__ = ["Mode", "TrainerConfig"]


class Mode(str, enum.Enum):
    """How stale embeddings and dense updates may be (see the module docstring)."""

    HYBRID = "hybrid"
    SYNC = "sync"
    ASYNC = "async"


@dataclass(frozen=True)
class TrainerConfig:
    """Settings of :class:`~embeddb.trainer.ctx.TrainCtx` and :class:`~.EvalCtx`.

    Attributes:
        mode: ``hybrid`` (default), ``sync`` or ``async`` (a plain string is converted).
        max_staleness: training batches that may be looked up with gradients not yet applied;
            ``sync`` uses 1 whatever is set; ``async`` also delays dense updates by this many
            steps.
        device: ``"cpu"``, ``"cuda"`` (``cuda:LOCAL_RANK``) or ``"cuda:N"``; ``None`` picks
            ``cuda:LOCAL_RANK`` when CUDA is available, else ``cpu``.
        mixed_precision: autocast to float16 and scale the loss (``torch.amp.GradScaler``);
            CUDA only. Embedding gradients are unscaled before they are sent.
        batch_timeout: seconds a looked-up training batch waits for its gradients before it
            expires in the embedding worker.
        lookup_timeout: seconds ``forward`` waits for a batch's embeddings before it raises.
        retries, retry_backoff, shard_timeout, fp16, pooling: the embedding worker's (see
            :class:`~embeddb.trainer.embedding_worker.EmbeddingWorkerConfig`).
        metrics_port: the embedding worker of local rank ``r`` serves its Prometheus metrics
            on ``metrics_port + r``; ``None``: not served.
        start_timeout: seconds the embedding worker may take to start.
        close_timeout: seconds ``close`` waits for pending gradient pushes.
        worker_log_level: logging level of the embedding worker process.
        token: the bearer token every client of the context sends to the shards (the
            embedding worker's lookups and pushes, ``save_checkpoint``'s snapshot calls): a
            read-write token; ``None`` when the shards require none. Never in ``repr``. Read
            it from a file at the composition root (the job's ``token_file``).
    """

    mode: Mode = Mode.HYBRID
    max_staleness: int = 4
    device: str | None = None
    mixed_precision: bool = False
    batch_timeout: float = 300.0
    lookup_timeout: float = 600.0
    retries: int = 3
    retry_backoff: float = 0.2
    shard_timeout: float = 10.0
    fp16: bool = False
    pooling: Mapping[str, Pooling] = field(default_factory=dict)
    metrics_port: int | None = None
    start_timeout: float = 120.0
    close_timeout: float = 120.0
    worker_log_level: str = "WARNING"
    token: str | None = field(default=None, repr=False)

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
        if not isinstance(self.max_staleness, int) or self.max_staleness < 1:
            raise ConfigError(
                "max_staleness", f"must be an integer >= 1, got {self.max_staleness!r}"
            )
        self.embedding_worker()  # validates the worker's settings now

    @property
    def embedding_staleness(self) -> int:
        """The embedding worker's staleness bound: 1 in ``sync`` mode, else ``max_staleness``."""
        return 1 if self.mode is Mode.SYNC else self.max_staleness

    @property
    def dense_delay(self) -> int:
        """Steps by which dense gradients are applied late: ``max_staleness`` in ``async``."""
        return self.max_staleness if self.mode is Mode.ASYNC else 0

    def embedding_worker(self, local_rank: int = 0) -> EmbeddingWorkerConfig:
        """The embedding worker's settings for the NN worker of ``local_rank``.

        Raises:
            ConfigError: an invalid worker setting.
        """
        port = None if self.metrics_port is None else self.metrics_port + local_rank
        return EmbeddingWorkerConfig(
            max_staleness=self.embedding_staleness,
            batch_timeout=self.batch_timeout,
            retries=self.retries,
            retry_backoff=self.retry_backoff,
            shard_timeout=self.shard_timeout,
            fp16=self.fp16,
            pooling=self.pooling,
            metrics_port=port,
            log_level=self.worker_log_level,
            token=self.token,
        )
