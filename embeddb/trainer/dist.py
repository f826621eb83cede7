"""Where this NN worker sits in the job (torchrun's environment) and its process group.

torchrun (and ``torch.multiprocessing`` harnesses) describe a rank with environment variables;
:meth:`DistEnv.from_environ` reads them once, at the training context's boundary::

    RANK=1 WORLD_SIZE=2 LOCAL_RANK=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500
    -> DistEnv(rank=1, world_size=2, local_rank=1, master_addr="127.0.0.1", master_port=29500)

Without ``WORLD_SIZE`` (a plain ``python train.py``) the job is one process of world size 1,
trained without DDP. The backend is NCCL on CUDA devices and gloo on CPU.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from dataclasses import dataclass

import torch
import torch.distributed as dist

from embeddb.errors import ConfigError

__all__ = ["DistEnv", "backend_for", "resolve_device"]


@dataclass(frozen=True)
class DistEnv:
    """One NN worker's place in the job.

    Attributes:
        rank: global rank, in ``[0, world_size)``.
        world_size: number of NN workers.
        local_rank: rank on this machine (picks the GPU).
        master_addr, master_port: rank 0's rendezvous address (needed when ``world_size > 1``).
        attempt: under torchrun's agent store (``TORCHELASTIC_USE_AGENT_STORE``), its restart
            count: the process group's keys are prefixed with it, so workers restarted after a
            failure never read the addresses their dead predecessors left in the store.
    """

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    master_addr: str | None = None
    master_port: int | None = None
    attempt: int | None = None

    def __post_init__(self) -> None:
        if self.world_size < 1:
            raise ConfigError("WORLD_SIZE", f"must be >= 1, got {self.world_size}")
        if not 0 <= self.rank < self.world_size:
            raise ConfigError("RANK", f"must be in [0, {self.world_size}), got {self.rank}")
        if self.local_rank < 0:
            raise ConfigError("LOCAL_RANK", f"must be >= 0, got {self.local_rank}")
        if self.world_size > 1 and (not self.master_addr or not self.master_port):
            raise ConfigError(
                "MASTER_ADDR", "MASTER_ADDR and MASTER_PORT are needed when WORLD_SIZE > 1"
            )

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> DistEnv:
        """Read torchrun's variables; without ``WORLD_SIZE``, a single process.

        Raises:
            ConfigError: a variable that is not an integer, or missing rendezvous variables.
        """
        if "WORLD_SIZE" not in environ:
            return cls()

        def integer(name: str, default: int | None = None) -> int:
            raw = environ.get(name)
            if raw is None:
                if default is None:
                    raise ConfigError(name, "is not set (torchrun sets it)")
                return default
            try:
                return int(raw)
            except ValueError:
                raise ConfigError(name, f"must be an integer, got {raw!r}") from None

        world_size = integer("WORLD_SIZE")
        port = environ.get("MASTER_PORT")
        return cls(
            rank=integer("RANK", 0 if world_size == 1 else None),
            world_size=world_size,
            local_rank=integer("LOCAL_RANK", 0),
            master_addr=environ.get("MASTER_ADDR"),
            master_port=integer("MASTER_PORT") if port is not None else None,
            attempt=(
                integer("TORCHELASTIC_RESTART_COUNT", 0)
                if environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
                else None
            ),
        )

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    def init_process_group(self, device: torch.device, timeout_s: float = 300.0) -> bool:
        """Join the job's process group unless it exists already or the job is one process.

        Returns:
            Whether this call created the group (and so should destroy it).

        Raises:
            ConfigError: an existing group disagrees with this environment.
        """
        if not self.distributed:
            return False
        if dist.is_initialized():
            if dist.get_world_size() != self.world_size or dist.get_rank() != self.rank:
                raise ConfigError(
                    "WORLD_SIZE",
                    f"the process group has rank {dist.get_rank()} of {dist.get_world_size()}, "
                    f"the environment says {self.rank} of {self.world_size}",
                )
            return False
        timeout = datetime.timedelta(seconds=timeout_s)
        if self.attempt is not None and self.master_addr and self.master_port:
            agent_store = dist.TCPStore(  # type: ignore[attr-defined]
                self.master_addr, self.master_port, self.world_size, False, timeout
            )
            dist.init_process_group(
                backend=backend_for(device),
                store=dist.PrefixStore(  # type: ignore[attr-defined]
                    f"embeddb/attempt_{self.attempt}", agent_store
                ),
                rank=self.rank,
                world_size=self.world_size,
                timeout=timeout,
            )
            return True
        dist.init_process_group(
            backend=backend_for(device),
            init_method=f"tcp://{self.master_addr}:{self.master_port}",
            rank=self.rank,
            world_size=self.world_size,
            timeout=timeout,
        )
        return True


def backend_for(device: torch.device) -> str:
    """``nccl`` for CUDA devices, ``gloo`` otherwise."""
    return "nccl" if device.type == "cuda" else "gloo"


def resolve_device(name: str | None, local_rank: int) -> torch.device:
    """The device of this NN worker: ``name`` (``"cuda"`` means ``cuda:local_rank``), or when
    ``None`` ``cuda:local_rank`` if CUDA is available, else ``cpu``.

    Raises:
        ConfigError: an unknown device, or CUDA asked for and not available.
    """
    if name is None:
        name = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        device = torch.device(name)
    except (RuntimeError, ValueError) as exc:
        raise ConfigError("device", f"unknown device {name!r}: {exc}") from exc
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError("device", f"{name!r} asked for, but CUDA is not available")
        if device.index is None:
            device = torch.device("cuda", local_rank)
        if device.index >= torch.cuda.device_count():
            raise ConfigError(
                "device", f"{device} does not exist ({torch.cuda.device_count()} GPUs)"
            )
    elif device.type != "cpu":
        raise ConfigError("device", f"must be cpu or cuda, got {name!r}")
    return device
