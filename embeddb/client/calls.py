"""The unit both clients execute: a :class:`ShardCall` (one request for one shard) and a
:class:`Plan` (calls plus how their answers merge). No I/O."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

__all__ = ["Plan", "ShardCall"]

T = TypeVar("T")


@dataclass(frozen=True)
class ShardCall:
    """One request for one shard. Only idempotent calls may be retried. ``timeout`` replaces
    the client's for this call."""

    shard: int
    method: str
    request: Any
    idempotent: bool
    timeout: float | None = None


@dataclass(frozen=True)
class Plan(Generic[T]):
    """Calls to make (in any order, or in parallel) and how to merge their responses."""

    calls: list[ShardCall]
    merge: Callable[[list[Any]], T]
