"""Server reflection in both versions tools speak: ``grpc.reflection.v1`` (buf curl's default,
grpcurl's first try) and the older ``grpc.reflection.v1alpha``.

grpcio-reflection serves v1alpha only. The v1 service is the same protocol under another
package: ``grpc/reflection/v1/reflection.proto`` was published as a copy of the v1alpha file with
only the package renamed, so every message has the same fields with the same numbers and the
bytes of a v1 request or response are those of the v1alpha one. The v1 method is therefore
served by the v1alpha servicer itself, through a handler registered under the v1 path, and the v1
descriptors (needed when a tool asks reflection about reflection) are derived at import from
the v1alpha ones by renaming the package.
"""

from __future__ import annotations

from collections.abc import Iterable

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool
from google.protobuf.descriptor import FileDescriptor
from grpc_reflection.v1alpha import reflection
from grpc_reflection.v1alpha import reflection_pb2 as alpha_pb2

__all__ = ["SERVICE_NAMES", "V1ALPHA_SERVICE_NAME", "V1_SERVICE_NAME", "enable_reflection"]

V1ALPHA_SERVICE_NAME: str = reflection.SERVICE_NAME
V1_SERVICE_NAME = "grpc.reflection.v1.ServerReflection"
SERVICE_NAMES = (V1_SERVICE_NAME, V1ALPHA_SERVICE_NAME)
"""Both reflection services (callable without a token)."""

_ALPHA_PACKAGE = "grpc.reflection.v1alpha"
_V1_PACKAGE = "grpc.reflection.v1"
_V1_FILE = "grpc/reflection/v1/reflection.proto"
_METHOD = "ServerReflectionInfo"


def _renamed(type_name: str) -> str:
    prefix = f".{_ALPHA_PACKAGE}."
    return (
        f".{_V1_PACKAGE}.{type_name[len(prefix) :]}" if type_name.startswith(prefix) else type_name
    )


def _fix_types(messages: Iterable[descriptor_pb2.DescriptorProto]) -> None:
    for message in messages:
        for field in message.field:
            if field.type_name:
                field.type_name = _renamed(field.type_name)
        _fix_types(message.nested_type)


def v1_file(pool: descriptor_pool.DescriptorPool | None = None) -> FileDescriptor:
    """The ``grpc.reflection.v1`` file in ``pool`` (default: the default pool), added on the
    first call: v1alpha's file with its package renamed."""
    pool = pool or descriptor_pool.Default()
    try:
        return pool.FindFileByName(_V1_FILE)
    except KeyError:
        pass
    proto = descriptor_pb2.FileDescriptorProto()
    alpha_pb2.DESCRIPTOR.CopyToProto(proto)
    proto.name = _V1_FILE
    proto.package = _V1_PACKAGE
    proto.ClearField("options")  # v1alpha's language options name v1alpha packages
    _fix_types(proto.message_type)
    for service in proto.service:
        for method in service.method:
            method.input_type = _renamed(method.input_type)
            method.output_type = _renamed(method.output_type)
    pool.Add(proto)
    return pool.FindFileByName(_V1_FILE)


def enable_reflection(service_names: Iterable[str], server: grpc.Server) -> None:
    """Serve reflection v1 and v1alpha on ``server``, listing ``service_names`` and both
    reflection services."""
    v1_file()
    servicer = reflection.ReflectionServicer((*service_names, *SERVICE_NAMES))
    handler = grpc.stream_stream_rpc_method_handler(
        servicer.ServerReflectionInfo,
        request_deserializer=alpha_pb2.ServerReflectionRequest.FromString,
        response_serializer=alpha_pb2.ServerReflectionResponse.SerializeToString,
    )
    server.add_generic_rpc_handlers(
        tuple(
            grpc.method_handlers_generic_handler(name, {_METHOD: handler}) for name in SERVICE_NAMES
        )
    )
