"""The gRPC server's life: bound and started with the HTTP server's lifespan, in the same event
loop (so it calls the same inference service, batchers and metrics), stopped before the models
close.

It rides on the ASGI lifespan rather than on a second composition root: whatever serves the
app (``edgefleet agent``, the tests' uvicorn in a thread) starts and stops it alike.
"""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
from google.protobuf.message import DecodeError
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from agent.grpc.proto import grpc_service_pb2 as pb
from agent.grpc.servicer import Servicer
from agent.serving.access import ApiKeys, RateLimiter
from agent.serving.state import ServingState
from agent.shm.regions import SharedMemoryRegistry

log = logging.getLogger("edgefleet.agent.grpc")


class GrpcServer:
    """The gRPC endpoint of one agent; :attr:`port` is known once started."""

    def __init__(self, state: ServingState, registry: SharedMemoryRegistry) -> None:
        self.state = state
        self.registry = registry
        self.port: int | None = None
        self._server: grpc.aio.Server | None = None

    async def start(self) -> None:
        settings = self.state.settings
        config = settings.grpc
        server = grpc.aio.server(
            maximum_concurrent_rpcs=settings.max_concurrent_requests,
            options=[
                ("grpc.max_receive_message_length", config.max_receive_message_bytes),
                ("grpc.max_send_message_length", config.max_send_message_bytes),
                ("grpc.so_reuseport", 0),  # a port in use is an error, not a shared port
            ],
        )
        limiter = RateLimiter.from_settings(settings.rate_limit_per_s, settings.rate_limit_burst)
        keys = ApiKeys.from_settings(settings.api_key, settings.api_keys_file)
        servicer = Servicer(self.state, self.registry, keys, limiter)
        server.add_generic_rpc_handlers((handlers(servicer),))
        addresses = []
        if config.port is not None:
            host = f"[{config.host}]" if ":" in config.host else config.host
            self.port = server.add_insecure_port(f"{host}:{config.port}")
            if self.port == 0:
                raise OSError(f"gRPC: cannot listen on {config.host}:{config.port}")
            addresses.append(f"{config.host}:{self.port}")
        if config.uds is not None:
            _bind_unix(server, config.uds, config.uds_mode)
            addresses.append(f"unix:{config.uds}")
        await server.start()
        self._server = server
        log.info("grpc listening", extra={"address": ", ".join(addresses)})

    async def stop(self) -> None:
        if self._server is None:
            return
        await self._server.stop(self.state.settings.grpc.shutdown_grace_s)
        self._server = None
        uds = self.state.settings.grpc.uds
        if uds is not None:
            Path(uds).unlink(missing_ok=True)


def _bind_unix(server: grpc.aio.Server, path: Path, mode: int) -> None:
    if path.exists() and stat.S_ISSOCK(path.stat().st_mode):
        path.unlink()  # a socket left by a process that died
    old_umask = os.umask(0o177)  # never world-accessible, not even for an instant
    try:
        if server.add_insecure_port(f"unix:{path}") == 0:
            raise OSError(f"gRPC: cannot listen on unix:{path}")
    finally:
        os.umask(old_umask)
    os.chmod(path, mode)


SERVICE = "inference.GRPCInferenceService"


def handlers(servicer: Servicer) -> grpc.GenericRpcHandler:
    """The RPCs :class:`Servicer` defines; the others (CUDA shared memory, trace and log
    settings) are left out, which gRPC answers UNIMPLEMENTED.

    Requests arrive as bytes and are parsed here rather than by gRPC: a message that does not
    parse is the client's fault (INVALID_ARGUMENT), where gRPC's own deserializer would make
    it INTERNAL.
    """
    table: dict[str, grpc.RpcMethodHandler[Any, Any]] = {}
    for method in pb.DESCRIPTOR.services_by_name["GRPCInferenceService"].methods:
        if method.name not in vars(Servicer):
            continue
        request_type = getattr(pb, method.input_type.name)
        response_type = getattr(pb, method.output_type.name)
        impl = getattr(servicer, method.name)
        if method.client_streaming:
            table[method.name] = grpc.stream_stream_rpc_method_handler(
                _parse_stream(impl, request_type),
                response_serializer=response_type.SerializeToString,
            )
        else:
            table[method.name] = grpc.unary_unary_rpc_method_handler(
                _parse_unary(impl, request_type),
                response_serializer=response_type.SerializeToString,
            )
    return grpc.method_handlers_generic_handler(SERVICE, table)


Handler = Callable[[Any, Any], Awaitable[Any]]


async def _parse(raw: bytes, request_type: Any, context: Any) -> Any:
    try:
        return request_type.FromString(raw)
    except DecodeError as exc:
        await context.abort(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"the request is not a valid {request_type.DESCRIPTOR.full_name} ({exc})",
        )


def _parse_unary(impl: Handler, request_type: Any) -> Handler:
    async def call(raw: bytes, context: Any) -> Any:
        return await impl(await _parse(raw, request_type, context), context)

    return call


def _parse_stream(impl: Handler, request_type: Any) -> Handler:
    async def call(raws: AsyncIterator[bytes], context: Any) -> Any:
        async def parsed() -> AsyncIterator[Any]:
            async for raw in raws:
                yield await _parse(raw, request_type, context)

        return await impl(parsed(), context)

    return call


class WithGrpc:
    """ASGI middleware: the gRPC server starts when the app's lifespan has started, and stops
    when the lifespan is told to shut down, before the app closes its models."""

    def __init__(self, app: ASGIApp, server: GrpcServer) -> None:
        self.app = app
        self.server = server

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "lifespan":
            await self.app(scope, receive, send)
            return

        async def lifespan_receive() -> Message:
            message = await receive()
            if message["type"] == "lifespan.shutdown":
                await self.server.stop()
            return message

        async def lifespan_send(message: Message) -> None:
            if message["type"] == "lifespan.startup.complete":
                try:
                    await self.server.start()
                except Exception as exc:
                    log.exception("gRPC failed to start")
                    await send({"type": "lifespan.startup.failed", "message": str(exc)})
                    return
            await send(message)

        await self.app(scope, lifespan_receive, lifespan_send)
