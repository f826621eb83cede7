"""A small gRPC client of ``embeddb serve-model`` (no torch)::

    from embeddb.serving.client import ModelClient

    with ModelClient("127.0.0.1:7080", token=None) as model:
        scores = model.predict(batch)     # (n,) float32, one per sample of the Batch
        scores = model.predict_records([{"user": "u17", "price": 12.5}])   # raw records

Errors come back as :mod:`embeddb.errors` exceptions (``InvalidArgumentError`` for bad input,
``UnauthenticatedError``, ``ResourceExhaustedError``, ...), raised from the
:class:`grpc.RpcError`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import Any

import grpc
import numpy as np
import numpy.typing as npt

from embeddb.errors import EmbeddbError, InvalidArgumentError
from embeddb.features.batch import Batch
from embeddb.serving.codec import decode_scores, encode_request
from embeddb.transport.status import error_from_rpc
from embeddb.v1 import model_pb2 as mpb
from embeddb.v1 import model_pb2_grpc as mpb_grpc

__all__ = ["ModelClient"]


class ModelClient:
    """Calls ``ModelService.Predict`` on one model server.

    Args:
        address: ``host:port`` of the gRPC endpoint.
        token: bearer token (a read-only one is enough), or None.
        credentials: TLS channel credentials (``grpc.ssl_channel_credentials``); None: plain.
        timeout: seconds per call; None waits as long as it takes.
        max_message_bytes: the largest request or response.
    """

    def __init__(
        self,
        address: str,
        *,
        token: str | None = None,
        credentials: grpc.ChannelCredentials | None = None,
        timeout: float | None = 30.0,
        max_message_bytes: int = 64 << 20,
    ) -> None:
        self.address = address
        options = [
            ("grpc.max_receive_message_length", max_message_bytes),
            ("grpc.max_send_message_length", max_message_bytes),
        ]
        self._channel = (
            grpc.insecure_channel(address, options=options)
            if credentials is None
            else grpc.secure_channel(address, credentials, options=options)
        )
        self._stub = mpb_grpc.ModelServiceStub(self._channel)  # type: ignore[no-untyped-call]
        self._metadata = None if token is None else (("authorization", f"Bearer {token}"),)
        self._timeout = timeout

    def predict(self, batch: Batch) -> npt.NDArray[np.float32]:
        """Scores of every sample of ``batch``: ``(n,)`` float32 probabilities."""
        return self.predict_request(encode_request(batch))

    def predict_records(self, records: Sequence[Mapping[str, object]]) -> npt.NDArray[np.float32]:
        """Scores of JSON-shaped records (``records_json``): raw records when the served model
        has a feature pipeline, else pre-hashed ones (as HTTP's ``"records"``).

        Raises:
            InvalidArgumentError: ``records`` cannot be written as JSON (or a bad record, from
                the server).
        """
        try:
            text = json.dumps(list(records), allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise InvalidArgumentError(f"records cannot be sent as JSON: {exc}") from exc
        request = mpb.PredictRequest(num_records=len(records), records_json=text.encode())
        return self.predict_request(request)

    def describe(self) -> mpb.DescribeModelResponse:
        """The served model's inputs and the server's limits (``DescribeModel``)."""
        try:
            return self._stub.DescribeModel(  # type: ignore[no-any-return]
                mpb.DescribeModelRequest(), timeout=self._timeout, metadata=self._metadata
            )
        except grpc.RpcError as exc:
            raise _translate(exc, self.address, "DescribeModel") from exc

    def predict_request(self, request: mpb.PredictRequest) -> npt.NDArray[np.float32]:
        """Send a prepared request (:func:`~embeddb.serving.codec.encode_request`)."""
        try:
            response = self._stub.Predict(request, timeout=self._timeout, metadata=self._metadata)
        except grpc.RpcError as exc:
            raise _translate(exc, self.address, "Predict") from exc
        return decode_scores(response, int(request.num_records))

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> ModelClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def _translate(exc: Any, address: str, method: str) -> EmbeddbError:
    return error_from_rpc(exc, f"model server {address} {method} failed")
