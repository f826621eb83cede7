"""``profile_step.py --stage embedded``: the embedded-shard design measured without building
it into the library. A :class:`~embeddb.engine.shard.Shard` is opened in this process with its
update log (as ``embeddb serve`` opens it) and the thread stage's client talks to its
:class:`~embeddb.server.servicer.StoreServicer` through a channel stand-in: the request
messages passed by reference, no gRPC, no socket, no shard process."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from embeddb.client import AsyncClient, ClientOptions
from embeddb.config import EmbeddingConfig
from embeddb.engine.shard import Shard
from embeddb.server.servicer import StoreServicer
from embeddb.trainer.embedding.in_process import EmbeddingWorkerThread
from embeddb.transport import wire

__all__ = ["embedded_shard"]


class _InProcessChannel:
    """A ``grpc.aio`` channel stand-in calling a servicer of this process (``--stage
    embedded``): the request message passed by reference, answered in the loop's executor;
    a pre-serialized answer (``wire.Encoded``) parsed as the client parses the wire."""

    def __init__(self, servicer: Any) -> None:
        self._servicer = servicer

    def unary_unary(
        self, path: str, request_serializer: Any = None, response_deserializer: Any = None, **_: Any
    ) -> Callable[..., Any]:
        handler = getattr(self._servicer, path.rsplit("/", 1)[-1])

        async def call(request: Any, timeout: float | None = None, metadata: Any = None) -> Any:
            answer = await asyncio.get_running_loop().run_in_executor(None, handler, request, None)
            if isinstance(answer, wire.Encoded):
                return response_deserializer(answer.SerializeToString())
            return answer

        return call

    def unary_stream(self, path: str, *args: Any, **kwargs: Any) -> Callable[..., Any]:
        def refuse(*_: Any, **__: Any) -> Any:
            raise NotImplementedError(f"{path}: not in the embedded measurement")

        return refuse

    stream_unary = stream_stream = unary_stream

    async def close(self) -> None:
        return None


@contextlib.contextmanager
def embedded_shard(yaml_text: str, workdir: Path) -> Iterator[None]:
    """Patch the thread stage's client onto a shard opened in this process (``--stage
    embedded``), for the duration."""
    shard = Shard(
        EmbeddingConfig.from_yaml_text(yaml_text), workdir / f"shard-{time.monotonic_ns()}"
    )
    servicer = StoreServicer(shard)
    original = EmbeddingWorkerThread._client

    def client(self: EmbeddingWorkerThread) -> AsyncClient:
        cfg = self.config
        return AsyncClient(
            self._addresses,
            ClientOptions(timeout=cfg.shard_timeout, retry=cfg.retry_policy),
            channel_factory=lambda address: _InProcessChannel(servicer),
        )

    EmbeddingWorkerThread._client = client  # type: ignore[method-assign]
    try:
        yield
    finally:
        EmbeddingWorkerThread._client = original  # type: ignore[method-assign]
        servicer.close()
        shard.close()
