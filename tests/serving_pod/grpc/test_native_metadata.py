"""Custom initial metadata from a servicer (``context.send_initial_metadata``) reaches a real gRPC client,
alike on the native front end and on grpc.aio; sending it twice is refused on both."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from serving_pod.grpc.native import NativeGrpcServer

METADATA = (("x-model-hint", "fast"), ("x-trace-bin", b"\x00\x01\xff"))


class Servicer(health_pb2_grpc.HealthServicer):
    async def Check(self, request, context):
        await context.send_initial_metadata(METADATA)
        if request.service == "twice":
            await context.send_initial_metadata(METADATA)
        return health_pb2.HealthCheckResponse(status=health_pb2.HealthCheckResponse.SERVING)


async def _native() -> tuple[object, int]:
    server = NativeGrpcServer([(health_pb2.DESCRIPTOR.services_by_name["Health"], Servicer())],
                              max_message_size=1 << 20, max_metadata_size=1 << 16)
    return server, await server.start("127.0.0.1", 0)


async def _grpcio() -> tuple[object, int]:
    server = grpc.aio.server()
    health_pb2_grpc.add_HealthServicer_to_server(Servicer(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, port


@pytest.mark.parametrize("front_end", [_native, _grpcio], ids=["native", "grpcio"])
def test_initial_metadata_reaches_the_client(front_end):
    async def run() -> None:
        server, port = await front_end()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                stub = health_pb2_grpc.HealthStub(channel)
                call = stub.Check(health_pb2.HealthCheckRequest())
                assert (await call).status == health_pb2.HealthCheckResponse.SERVING
                received = tuple(await call.initial_metadata())
                for item in METADATA:
                    assert item in received
                twice = stub.Check(health_pb2.HealthCheckRequest(service="twice"))
                with pytest.raises(grpc.aio.AioRpcError) as error:
                    await twice
                assert error.value.code() in (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN)
                # the server goes on serving
                assert (await stub.Check(health_pb2.HealthCheckRequest())).status == \
                    health_pb2.HealthCheckResponse.SERVING
        finally:
            await server.stop(0)

    asyncio.run(run())
