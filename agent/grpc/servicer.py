"""The RPCs of ``inference.GRPCInferenceService``, over the agent's inference service.

Every RPC checks the API key (metadata ``authorization: Bearer <key>`` or ``x-api-key``, the
keys REST takes) and the rate limit first, then runs what the REST route of the same name
runs. CUDA shared memory, trace and log settings are left UNIMPLEMENTED (the generated base
class's answer).
"""

from __future__ import annotations

import asyncio
import logging
import random
import re
import time
from collections.abc import AsyncIterator
from typing import Any, NoReturn

import grpc
from google.protobuf import json_format

from agent.api.access import ApiKeys, RateLimiter
from agent.api.state import ApiState
from agent.api.v2 import EXTENSIONS
from agent.errors import ModelNotFoundError, ModelNotReadyError, RequestError
from agent.grpc import codec, status
from agent.grpc.proto import grpc_service_pb2 as pb
from agent.grpc.proto import grpc_service_pb2_grpc as pb_grpc
from agent.grpc.proto import model_config_pb2 as mc
from agent.inference.service import InferRequest
from agent.inference.versions import LoadedVersion
from agent.shm.regions import SharedMemoryRegistry
from common import __version__

log = logging.getLogger("edgefleet.agent.grpc")
access = logging.getLogger("edgefleet.agent.access")
Context = grpc.aio.ServicerContext[Any, Any]
_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")
"""A request id a client may choose (``x-request-id`` metadata), as REST takes it."""
_STREAM_DEPTH = 64
"""Requests of one stream queued or running at once; the stream reads no more until one is
answered (flow control reaches the client)."""


class Servicer(pb_grpc.GRPCInferenceServiceServicer):
    def __init__(
        self,
        state: ApiState,
        registry: SharedMemoryRegistry,
        keys: ApiKeys | None,
        limiter: RateLimiter | None,
    ) -> None:
        self.state = state
        self.registry = registry
        self.keys = keys
        self.limiter = limiter
        self._open_paths = frozenset(state.settings.api_key_open_paths)

    # -- admission and errors ------------------------------------------------------------

    async def _admit(self, context: Context, probe: str = "") -> str:
        """The request id (the client's ``x-request-id``, or a new one, returned in the
        trailing metadata); raises (aborts the RPC) for a missing key or an empty bucket.
        Without keys, rate limit and access log nothing reads it: the metadata is left alone
        and the id is empty."""
        if self.keys is None and self.limiter is None and not self.state.settings.access_log:
            return ""  # nothing reads the metadata: not even built (it costs on every call)
        metadata = {k.encode(): v for k, v in context.invocation_metadata() or ()}
        try:
            if self.keys is not None or self.limiter is not None:
                headers = {
                    k: v.encode("latin-1", "replace") for k, v in metadata.items() if type(v) is str
                }
                client = context.peer()
                # the health RPCs are open where REST's probes are (api_key_open_paths)
                if self.keys is not None and probe not in self._open_paths:
                    client = self.keys.client(headers)
                if self.limiter is not None:
                    self.limiter.take(client)
        except Exception as exc:
            await self._abort(context, exc)
        request_id = metadata.get(b"x-request-id")
        if not (isinstance(request_id, str) and _REQUEST_ID.match(request_id)):
            request_id = f"{random.getrandbits(128):032x}"  # as REST makes them
        # in the trailers, as REST answers the header: no extra frame on the wire
        context.set_trailing_metadata((("x-request-id", request_id),))
        return request_id

    async def _abort(self, context: Context, exc: Exception) -> NoReturn:
        code = status.code_of(exc)
        if code is None:
            log.error("gRPC request failed", exc_info=exc)
            await context.abort(grpc.StatusCode.INTERNAL, "internal error")
        status.count_refusal(self.state.metrics, exc)
        await context.abort(code, str(exc))
        raise AssertionError("unreachable: abort raises")

    # -- health and metadata ------------------------------------------------------------

    async def ServerLive(self, request: pb.ServerLiveRequest, context: Context) -> Any:
        await self._admit(context, probe="/v2/health/live")
        return pb.ServerLiveResponse(live=True)

    async def ServerReady(self, request: pb.ServerReadyRequest, context: Context) -> Any:
        await self._admit(context, probe="/v2/health/ready")
        return pb.ServerReadyResponse(ready=self.state.ready())

    async def ModelReady(self, request: pb.ModelReadyRequest, context: Context) -> Any:
        await self._admit(context)
        try:
            self.state.service.resolve(request.name, request.version or None)
        except (ModelNotFoundError, ModelNotReadyError):
            return pb.ModelReadyResponse(ready=False)  # as Triton: not an error
        return pb.ModelReadyResponse(ready=True)

    async def ServerMetadata(self, request: pb.ServerMetadataRequest, context: Context) -> Any:
        await self._admit(context)
        return pb.ServerMetadataResponse(
            name="edgefleet", version=__version__, extensions=EXTENSIONS
        )

    async def ModelMetadata(self, request: pb.ModelMetadataRequest, context: Context) -> Any:
        await self._admit(context)
        try:
            lv = self.state.service.resolve(request.name, request.version or None)
        except Exception as exc:
            await self._abort(context, exc)

        def tensors(specs: Any) -> list[pb.ModelMetadataResponse.TensorMetadata]:
            return [
                pb.ModelMetadataResponse.TensorMetadata(
                    name=t.name, datatype=t.datatype, shape=list(t.shape)
                )
                for t in specs
            ]

        served = sorted(self.state.manager.models[request.name].served)
        return pb.ModelMetadataResponse(
            name=lv.model,
            versions=[str(v) for v in served],
            platform=lv.platform,
            inputs=tensors(lv.signature.inputs),
            outputs=tensors(lv.signature.outputs),
        )

    async def ModelConfig(self, request: pb.ModelConfigRequest, context: Context) -> Any:
        await self._admit(context)
        try:
            lv = self.state.service.resolve(request.name, request.version or None)
        except Exception as exc:
            await self._abort(context, exc)
        return pb.ModelConfigResponse(config=_model_config(lv))

    async def ModelStatistics(self, request: pb.ModelStatisticsRequest, context: Context) -> Any:
        await self._admit(context)
        manager, service = self.state.manager, self.state.service
        try:
            if request.name and request.version:
                versions = [service.resolve(request.name, request.version)]
            elif request.name:
                service.resolve(request.name, None)
                versions = list(manager.models[request.name].served.values())
            else:
                versions = [lv for e in manager.models.values() for lv in e.served.values()]
        except Exception as exc:
            await self._abort(context, exc)
        response = pb.ModelStatisticsResponse()
        for lv in versions:
            json_format.ParseDict(
                lv.stats.to_dict(lv.model, str(lv.version)),
                response.model_stats.add(),
                ignore_unknown_fields=True,
            )
        return response

    # -- the repository ------------------------------------------------------------------

    async def RepositoryIndex(self, request: pb.RepositoryIndexRequest, context: Context) -> Any:
        await self._admit(context)
        rows = self.state.manager.index()
        if request.ready:
            rows = [r for r in rows if r["state"] == "READY"]
        return pb.RepositoryIndexResponse(
            models=[pb.RepositoryIndexResponse.ModelIndex(**row) for row in rows]
        )

    async def RepositoryModelLoad(
        self, request: pb.RepositoryModelLoadRequest, context: Context
    ) -> Any:
        await self._admit(context)
        try:
            if request.parameters:
                raise RequestError(
                    "parameters: loading models from the request is not supported; place "
                    "them in the repository",
                    field="parameters",
                )
            await self.state.manager.load(request.model_name)
        except Exception as exc:
            await self._abort(context, exc)
        return pb.RepositoryModelLoadResponse()

    async def RepositoryModelUnload(
        self, request: pb.RepositoryModelUnloadRequest, context: Context
    ) -> Any:
        await self._admit(context)
        try:
            await self.state.manager.unload(request.model_name)
        except Exception as exc:
            await self._abort(context, exc)
        return pb.RepositoryModelUnloadResponse()

    # -- system shared memory ------------------------------------------------------------

    async def SystemSharedMemoryStatus(
        self, request: pb.SystemSharedMemoryStatusRequest, context: Context
    ) -> Any:
        await self._admit(context)
        try:
            rows = self.registry.regions_named(request.name or None)
        except Exception as exc:
            await self._abort(context, exc)
        response = pb.SystemSharedMemoryStatusResponse()
        for region in rows:
            response.regions[region.name].CopyFrom(
                pb.SystemSharedMemoryStatusResponse.RegionStatus(
                    name=region.name,
                    key=region.key,
                    offset=region.offset,
                    byte_size=region.byte_size,
                )
            )
        return response

    async def SystemSharedMemoryRegister(
        self, request: pb.SystemSharedMemoryRegisterRequest, context: Context
    ) -> Any:
        await self._admit(context)
        try:
            self.registry.register(request.name, request.key, request.offset, request.byte_size)
        except Exception as exc:
            await self._abort(context, exc)
        return pb.SystemSharedMemoryRegisterResponse()

    async def SystemSharedMemoryUnregister(
        self, request: pb.SystemSharedMemoryUnregisterRequest, context: Context
    ) -> Any:
        await self._admit(context)
        self.registry.unregister(request.name or None)
        return pb.SystemSharedMemoryUnregisterResponse()

    # -- inference -----------------------------------------------------------------------

    async def ModelInfer(self, request: pb.ModelInferRequest, context: Context) -> Any:
        request_id = await self._admit(context)
        try:
            return await self._infer(request, request_id)
        except Exception as exc:
            await self._abort(context, exc)

    async def ModelStreamInfer(
        self, requests: AsyncIterator[pb.ModelInferRequest], context: Context
    ) -> None:
        """Requests are started as they arrive and answered in their order; a request's
        failure is its answer's ``error_message``, the stream goes on."""
        request_id = await self._admit(context)
        pending: asyncio.Queue[asyncio.Task[pb.ModelInferResponse] | None] = asyncio.Queue(
            _STREAM_DEPTH
        )

        async def read() -> None:
            try:
                async for request in requests:
                    task = asyncio.create_task(self._infer(request, request_id), name="grpc-stream")
                    await pending.put(task)
            finally:
                await pending.put(None)  # the end, or a failure (``await reader`` raises it)

        reader = asyncio.create_task(read(), name="grpc-stream-reader")
        started: list[asyncio.Task[pb.ModelInferResponse]] = []
        try:
            while (task := await pending.get()) is not None:
                started.append(task)
                try:
                    answer = pb.ModelStreamInferResponse(infer_response=await task)
                except Exception as exc:
                    if status.code_of(exc) is None:
                        log.error("gRPC stream request failed", exc_info=exc)
                    answer = pb.ModelStreamInferResponse(error_message=str(exc))
                started.pop()
                await context.write(answer)
            await reader
        finally:
            reader.cancel()
            while not pending.empty():
                queued = pending.get_nowait()
                if queued is not None:
                    started.append(queued)
            for task in started:
                task.cancel()
            await asyncio.gather(reader, *started, return_exceptions=True)

    async def _infer(self, request: pb.ModelInferRequest, request_id: str) -> Any:
        started = time.monotonic()
        service = self.state.service
        settings = self.state.settings
        lease = self.registry.lease()
        try:
            lv = service.resolve(request.model_name, request.model_version or None)
            decoded = codec.decode(request, lease, settings.max_tensor_elements)
            names = None if decoded.outputs is None else [o.name for o in decoded.outputs]
            infer = InferRequest(
                request.model_name,
                decoded.inputs,
                request.model_version or None,
                names,
                decoded.priority,
                decoded.timeout_us,
            )
            # resolved above, with no await since: no swap came in between
            result = await service.submit(infer, lv)
            response = codec.encode(
                result.model, result.version, request.id, result.outputs, decoded.outputs, lease
            )
        finally:
            lease.release()
        if settings.access_log:
            access.info(
                "grpc ModelInfer",
                extra={
                    "request_id": request_id or request.id,
                    "model": result.model,
                    "version": result.version,
                    "queue_ms": round(result.queue_s * 1000, 3),
                    "compute_ms": round(result.compute_s * 1000, 3),
                    "duration_ms": round((time.monotonic() - started) * 1000, 3),
                },
            )
        return response


def _model_config(lv: LoadedVersion) -> mc.ModelConfig:
    """Triton's view of a served version: dims leave the batch dimension out when batched."""
    batched = lv.batcher.batched

    def dims(shape: Any) -> list[int]:
        return list(shape)[1:] if batched else list(shape)

    def data_type(datatype: str) -> Any:
        return mc.DataType.Value("TYPE_STRING" if datatype == "BYTES" else f"TYPE_{datatype}")

    return mc.ModelConfig(
        name=lv.model,
        platform=lv.platform,
        max_batch_size=lv.batcher.max_rows if batched else 0,
        input=[
            mc.ModelInput(name=t.name, data_type=data_type(t.datatype), dims=dims(t.shape))
            for t in lv.signature.inputs
        ],
        output=[
            mc.ModelOutput(name=t.name, data_type=data_type(t.datatype), dims=dims(t.shape))
            for t in lv.signature.outputs
        ],
    )
