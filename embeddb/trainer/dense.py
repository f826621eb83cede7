"""Dense updates of the NN worker: synchronous (DDP) or delayed (the ``async`` mode).

:class:`SyncDense` (``hybrid`` and ``sync``): the model is wrapped in
:class:`~torch.nn.parallel.DistributedDataParallel` when the job has several NN workers, so
gradients are all-reduced during ``backward`` (overlapped with it); every step applies them.

:class:`DelayedDense` (``async``): the gradient of step ``t`` is all-reduced in the background
(``async_op``) and applied at step ``t + delay``::

    step t:   backward -> flatten grads -> all_reduce(async) -> queue  [g_t-delay+1 ... g_t]
              apply g_(t-delay) (waits for its all-reduce, long done)

Every rank applies the same averaged gradients in the same order, so replicas stay identical
(parameters and buffers are broadcast from rank 0 once, as DDP does). Buffers (BatchNorm
statistics) are not synchronised after that. ``flush`` applies what is still queued.

With mixed precision the loss is scaled (``GradScaler``); dense gradients are unscaled before
they are applied (delayed: before they are queued, and a non-finite one is skipped when due).
"""

from __future__ import annotations

from collections import deque

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

__all__ = ["DelayedDense", "DenseUpdater", "SyncDense"]


class DenseUpdater:
    """How the dense model is called, back-propagated and stepped.

    Attributes:
        module: what ``forward`` calls (the DDP wrapper or the model itself).
        model: the user's model.
    """

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        scaler: torch.amp.GradScaler | None,
    ) -> None:
        self.model = model
        self.module: nn.Module = model
        self.optimizer = optimizer
        self.scaler = scaler
        self.skipped_steps = 0

    def backward(self, loss: torch.Tensor) -> None:
        """Back-propagate ``loss`` (scaled under mixed precision)."""
        scaled = self.scaler.scale(loss) if self.scaler is not None else loss
        torch.autograd.backward(scaled)

    def loss_scale(self) -> float:
        """What the loss was multiplied by before ``backward`` (1 without mixed precision)."""
        return float(self.scaler.get_scale()) if self.scaler is not None else 1.0

    def step(self) -> None:
        raise NotImplementedError

    def flush(self) -> None:
        """Apply whatever updates are still pending."""


class SyncDense(DenseUpdater):
    """Gradients applied at every step; all-reduced by DDP when ``distributed``."""

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        scaler: torch.amp.GradScaler | None,
        *,
        distributed: bool,
        device: torch.device,
    ) -> None:
        super().__init__(model, optimizer, scaler)
        if distributed:
            ids = [device.index] if device.type == "cuda" else None
            self.module = DistributedDataParallel(model, device_ids=ids)

    def step(self) -> None:
        if self.scaler is not None:
            scale = self.scaler.get_scale()
            self.scaler.step(self.optimizer)
            self.scaler.update()
            if self.scaler.get_scale() < scale:  # the step was skipped: inf/NaN gradients
                self.skipped_steps += 1
        else:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)


class DelayedDense(DenseUpdater):
    """The gradient of step ``t`` applied at step ``t + delay`` (see the module docstring)."""

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        scaler: torch.amp.GradScaler | None,
        *,
        delay: int,
        distributed: bool,
    ) -> None:
        super().__init__(model, optimizer, scaler)
        self.delay = delay
        self._distributed = distributed
        self._world_size = dist.get_world_size() if distributed else 1
        self._groups: dict[torch.dtype, list[nn.Parameter]] = {}
        for p in model.parameters():
            if p.requires_grad:
                self._groups.setdefault(p.dtype, []).append(p)
        self._queue: deque[list[tuple[torch.Tensor, dist.Work | None]]] = deque()
        if distributed:
            with torch.no_grad():
                for tensor in model.state_dict().values():
                    dist.broadcast(tensor, src=0)

    def step(self) -> None:
        if self.scaler is not None:
            self.scaler.unscale_(self.optimizer)
        flats: list[tuple[torch.Tensor, dist.Work | None]] = []
        for params in self._groups.values():
            flat = torch.cat(
                [
                    (p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1)
                    for p in params
                ]
            )
            work = dist.all_reduce(flat, async_op=True) if self._distributed else None
            flats.append((flat, work))
        self._queue.append(flats)
        self.optimizer.zero_grad(set_to_none=True)
        if self.scaler is not None:
            self.scaler.update()  # the scale follows this step's overflow
        while len(self._queue) > self.delay:
            self._apply(self._queue.popleft())

    def flush(self) -> None:
        while self._queue:
            self._apply(self._queue.popleft())

    def _apply(self, flats: list[tuple[torch.Tensor, dist.Work | None]]) -> None:
        for flat, work in flats:
            if work is not None:
                work.wait()
                flat /= self._world_size
        if not all(bool(torch.isfinite(flat).all()) for flat, _ in flats):
            self.skipped_steps += 1
            return
        for (flat, _), params in zip(flats, self._groups.values(), strict=True):
            offset = 0
            for p in params:
                n = p.numel()
                p.grad = flat[offset : offset + n].view_as(p)
                offset += n
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
