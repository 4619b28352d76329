"""gRPC server reflection under both of its names: `grpc.reflection.v1` and `grpc.reflection.v1alpha`.

grpcio-reflection serves only `grpc.reflection.v1alpha.ServerReflection`,
while newer tools (grpcurl, Postman, grpcui, Kreya) ask
`grpc.reflection.v1.ServerReflection` first and some give up on its
UNIMPLEMENTED.  v1's proto is v1alpha's with the package renamed: the same
messages, field for field, number for number.  So one servicer answers
both, its messages (de)serialised with v1alpha's classes on either method,
and v1's own file descriptor (v1alpha's, renamed) joins the descriptor pool,
so that a tool describing every listed service finds both.

    server ─┬─ grpc.reflection.v1alpha.ServerReflection ─┐
            └─ grpc.reflection.v1.ServerReflection ──────┴─► ReflectionServicer(names)
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import Final

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool
from grpc_reflection.v1alpha import reflection, reflection_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2 as wire

V1ALPHA_SERVICE: Final[str] = reflection.SERVICE_NAME
V1_PACKAGE: Final = "grpc.reflection.v1"
V1_SERVICE: Final = f"{V1_PACKAGE}.ServerReflection"
V1_FILE: Final = "grpc/reflection/v1/reflection.proto"
_added = threading.Lock()


def enable_reflection(server: grpc.Server, service_names: Iterable[str]) -> None:
    """Reflection on `server` under v1 and v1alpha, listing `service_names` and both reflection services."""
    _add_v1_descriptor()
    names = (*service_names, V1_SERVICE, V1ALPHA_SERVICE)
    servicer = reflection.ReflectionServicer(names)
    reflection_pb2_grpc.add_ServerReflectionServicer_to_server(servicer, server)
    v1 = grpc.method_handlers_generic_handler(
        V1_SERVICE,
        {
            "ServerReflectionInfo": grpc.stream_stream_rpc_method_handler(
                servicer.ServerReflectionInfo,
                request_deserializer=wire.ServerReflectionRequest.FromString,
                response_serializer=wire.ServerReflectionResponse.SerializeToString,
            )
        },
    )
    server.add_generic_rpc_handlers((v1,))


def _add_v1_descriptor() -> None:
    """v1's file descriptor in the default pool (once): v1alpha's, its package renamed."""
    pool = descriptor_pool.Default()
    with _added:
        try:
            pool.FindFileByName(V1_FILE)
            return
        except KeyError:
            pass
        proto = descriptor_pb2.FileDescriptorProto()
        wire.DESCRIPTOR.CopyToProto(proto)
        old = f".{proto.package}."
        proto.name, proto.package = V1_FILE, V1_PACKAGE
        messages = list(proto.message_type)
        while messages:  # (nested ones too)
            message = messages.pop()
            messages.extend(message.nested_type)
            for f in message.field:
                if f.type_name.startswith(old):
                    f.type_name = f".{V1_PACKAGE}." + f.type_name[len(old) :]
        for service in proto.service:
            for m in service.method:
                m.input_type = f".{V1_PACKAGE}." + m.input_type[len(old) :]
                m.output_type = f".{V1_PACKAGE}." + m.output_type[len(old) :]
        pool.AddSerializedFile(proto.SerializeToString())
