"""The core budget of a training job on one machine: how many threads each process may use.

Every process of a job assumes by default that it has the machine to itself: torch starts one
OpenMP thread per core in every NN worker, a shard spreads large calls over every CPU, a data
loader would too. On a small machine they then fight for the same cores, and torch's OpenMP
threads spin-wait for a core while the embedding worker or the shard hold it (measured on 2
cores, benchmark model, batch 512: with 2 torch threads the hybrid step ran 32 % slower than
with 1). :func:`core_budget` splits the CPUs of this machine instead::

    process (count)            weight   threads
    ─────────────────────────  ──────   ─────────────────────────────────────────────────────
    NN worker (ranks)          2        torch_threads: what is left, split over the ranks
    local shard (local_shards) 1        shard_threads: cpus // (2 * ranks + local_shards)
    embedding worker (ranks)   light    worker_threads: 1, 2 from 8 CPUs per rank up
    data loader (per rank)     1        loader_processes: 0 below 4 CPUs per rank, else
                                        cpus // (4 * ranks), at most 4, and only while
                                        the shards leave each rank a core for torch

The embedding worker is light (it waits on the network most of the time) and shares the
cores: from 8 CPUs per rank up, half a core per rank is charged to it. Nothing is ever below
1, so a machine smaller than the job is oversubscribed, not refused. Examples::

    core_budget(2, 1, 1, False)   -> torch 1, worker 1, shard 1, loaders 0
    core_budget(16, 1, 1, True)   -> torch 6, worker 2, shard 5, loaders 4
    core_budget(16, 2, 0, True)   -> torch 5, worker 2, shard 4, loaders 2

Who applies it: :class:`~embeddb.trainer.ctx.TrainCtx` sets torch's threads
(``TrainerConfig.torch_threads``, or the budget when unset) and the embedding worker's;
``embeddb train`` (:mod:`embeddb.trainer.launcher.launch`) sets ``OMP_NUM_THREADS`` for its torchrun
ranks.
"""

from __future__ import annotations

import ipaddress
import os
import socket
from collections.abc import Iterable
from dataclasses import dataclass

from embeddb.errors import ConfigError

__all__ = ["CoreBudget", "available_cpus", "core_budget", "local_addresses"]

_MAX_LOADERS = 4


@dataclass(frozen=True)
class CoreBudget:
    """Threads per process of a job on one machine (see the module docstring).

    Attributes:
        torch_threads: torch intra-op threads of each NN worker.
        worker_threads: threads of each embedding worker (numba, its executor).
        shard_threads: threads each local shard may spread one call over.
        loader_processes: data loader processes of each NN worker (0: load in the NN worker).
    """

    torch_threads: int
    worker_threads: int
    shard_threads: int
    loader_processes: int


def available_cpus() -> int:
    """The CPUs this process may run on (its affinity mask), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def core_budget(cpus: int, ranks: int, local_shards: int, loaders: bool) -> CoreBudget:
    """Split ``cpus`` between the processes of a job on one machine.

    Args:
        cpus: CPUs of the machine (:func:`available_cpus`).
        ranks: NN workers on this machine (each with one embedding worker).
        local_shards: shard processes on this machine.
        loaders: whether the NN workers read their data through loader processes.

    Raises:
        ConfigError: ``cpus`` or ``ranks`` below 1, ``local_shards`` below 0.
    """
    for name, value, least in (("cpus", cpus, 1), ("ranks", ranks, 1)):
        if not isinstance(value, int) or value < least:
            raise ConfigError(name, f"must be an integer >= {least}, got {value!r}")
    if not isinstance(local_shards, int) or local_shards < 0:
        raise ConfigError("local_shards", f"must be an integer >= 0, got {local_shards!r}")
    worker_threads = 2 if cpus >= 8 * ranks else 1
    shard_threads = max(1, cpus // (2 * ranks + local_shards))
    loader_processes = (
        min(_MAX_LOADERS, cpus // (4 * ranks)) if loaders and cpus >= 4 * ranks else 0
    )
    # Loaders only where the shards leave each rank a core for torch.
    room = (cpus - local_shards * shard_threads) // ranks - 1
    loader_processes = max(0, min(loader_processes, room))
    spare = cpus - local_shards * shard_threads - ranks * loader_processes
    if cpus >= 8 * ranks:  # half a core per embedding worker, rounded up
        spare -= (ranks + 1) // 2
    torch_threads = max(1, spare // ranks)
    return CoreBudget(torch_threads, worker_threads, shard_threads, loader_processes)


def local_addresses(addresses: Iterable[str]) -> int:
    """How many of ``host:port`` addresses are on this machine (loopback or this host's
    name or addresses); names that do not resolve count as remote."""
    mine = {socket.gethostname(), socket.getfqdn(), "localhost"}
    count = 0
    for address in addresses:
        host = address.rsplit(":", 1)[0].strip("[]")
        if host in mine:
            count += 1
            continue
        try:
            ip = ipaddress.ip_address(host)
        except ValueError:
            continue
        if ip.is_loopback or ip.is_unspecified:
            count += 1
    return count
