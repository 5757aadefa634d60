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
from collections.abc import AsyncIterator, Coroutine
from typing import Any, NoReturn

import grpc
from google.protobuf import json_format

from agent.errors import ModelNotFoundError, ModelNotReadyError, RequestError
from agent.grpc import codec, status
from agent.grpc.proto import grpc_service_pb2 as pb
from agent.grpc.proto import grpc_service_pb2_grpc as pb_grpc
from agent.grpc.proto import model_config_pb2 as mc
from agent.inference.service import InferRequest
from agent.inference.versions import LoadedVersion
from agent.serving.access import ApiKeys, RateLimiter
from agent.serving.failures import FailureLog
from agent.serving.metadata import EXTENSIONS, SERVER_NAME
from agent.serving.state import ServingState
from agent.serving.triton_config import triton_config
from agent.shm.regions import CUDA_UNSUPPORTED, SharedMemoryError, SharedMemoryRegistry
from agent.tracing import RequestSpan, SpanTiming
from common import __version__

log = logging.getLogger("edgefleet.agent.grpc")
FAILURES = FailureLog(log)
access = logging.getLogger("edgefleet.agent.access")
Context = grpc.aio.ServicerContext[Any, Any]
_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")
_SERVICE = "inference.GRPCInferenceService"
"""A request id a client may choose (``x-request-id`` metadata), as REST takes it."""
_STREAM_DEPTH = 64
"""Requests of one stream queued or running at once; the stream reads no more until one is
answered (flow control reaches the client)."""


class Servicer(pb_grpc.GRPCInferenceServiceServicer):
    def __init__(
        self,
        state: ServingState,
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
        request_id, _ = await self._admit_client(context, probe, take=True)
        return request_id

    async def _admit_client(
        self, context: Context, probe: str = "", *, take: bool
    ) -> tuple[str, str]:
        """:meth:`_admit`, and the client the rate limit counts (its key, else its peer);
        ``take=False`` checks the key only, for a stream whose every request takes a token."""
        if self.keys is None and self.limiter is None and not self.state.settings.access_log:
            return "", ""  # nothing reads the metadata: not even built (it costs on every call)
        metadata = {k.encode(): v for k, v in context.invocation_metadata() or ()}
        client = ""
        try:
            if self.keys is not None or self.limiter is not None:
                headers = {
                    k: v.encode("latin-1", "replace") for k, v in metadata.items() if type(v) is str
                }
                client = context.peer()
                # the health RPCs are open where REST's probes are (api_key_open_paths)
                if self.keys is not None and probe not in self._open_paths:
                    client = self.keys.client(headers)
                if self.limiter is not None and take:
                    self.limiter.take(client)
        except Exception as exc:
            await self._abort(context, exc)
        request_id = metadata.get(b"x-request-id")
        if not (isinstance(request_id, str) and _REQUEST_ID.match(request_id)):
            request_id = f"{random.getrandbits(128):032x}"  # as REST makes them
        # in the trailers, as REST answers the header: no extra frame on the wire
        context.set_trailing_metadata((("x-request-id", request_id),))
        return request_id, client

    async def _abort(self, context: Context, exc: Exception) -> NoReturn:
        code = status.code_of(exc)
        if code in (None, grpc.StatusCode.INTERNAL):  # a server fault: logged, in one line
            FAILURES.failed("gRPC request failed", exc)
        if code is None:
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
            name=SERVER_NAME, version=__version__, extensions=EXTENSIONS
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
        served = sorted(self.state.manager.models[lv.model].served)
        return pb.ModelConfigResponse(config=_model_config(lv, served))

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

    # -- CUDA shared memory: as a Triton without a GPU answers (perf_analyzer unregisters
    # CUDA regions at the end of every shared-memory run)

    async def CudaSharedMemoryStatus(
        self, request: pb.CudaSharedMemoryStatusRequest, context: Context
    ) -> Any:
        await self._admit(context)
        if request.name:
            await self._abort(
                context,
                SharedMemoryError(
                    f"no CUDA shared memory region named {request.name!r}: {CUDA_UNSUPPORTED}",
                    field="name",
                ),
            )
        return pb.CudaSharedMemoryStatusResponse()

    async def CudaSharedMemoryRegister(
        self, request: pb.CudaSharedMemoryRegisterRequest, context: Context
    ) -> Any:
        await self._admit(context)
        await self._abort(
            context, SharedMemoryError(f"{request.name}: {CUDA_UNSUPPORTED}", field="name")
        )

    async def CudaSharedMemoryUnregister(
        self, request: pb.CudaSharedMemoryUnregisterRequest, context: Context
    ) -> Any:
        await self._admit(context)
        return pb.CudaSharedMemoryUnregisterResponse()

    # -- inference -----------------------------------------------------------------------

    async def ModelInfer(self, request: pb.ModelInferRequest, context: Context) -> Any:
        span = self._span(context, "ModelInfer")
        request_id = await self._admit(context)
        try:
            response = await self._infer(request, request_id, span)
        except Exception as exc:
            if span is not None:
                code = status.code_of(exc) or grpc.StatusCode.INTERNAL
                span.end({"rpc.grpc.status_code": code.value[0]}, error=str(exc))
            await self._abort(context, exc)
        if span is not None:
            span.end({"rpc.grpc.status_code": 0, "edgefleet.request_id": request_id})
        return response

    def _span(self, context: Context, method: str) -> RequestSpan | None:
        """The RPC's server span where tracing is on, the child of the caller's
        ``traceparent`` metadata."""
        tracing = self.state.tracing
        if tracing is None:
            return None
        traceparent = dict(context.invocation_metadata() or ()).get("traceparent")
        attributes = {"rpc.system": "grpc", "rpc.service": _SERVICE, "rpc.method": method}
        parent = traceparent if isinstance(traceparent, str) else None
        return tracing.start(f"{_SERVICE}/{method}", parent, attributes)

    async def ModelStreamInfer(
        self, requests: AsyncIterator[pb.ModelInferRequest], context: Context
    ) -> None:
        """Requests are started as they arrive and answered in their order; a request's
        failure is its answer's ``error_message``, the stream goes on. Each request takes a
        token of the rate limit, as a unary call does; one refused is answered so."""
        request_id, client = await self._admit_client(context, take=False)
        pending: asyncio.Queue[asyncio.Task[pb.ModelInferResponse] | None] = asyncio.Queue(
            _STREAM_DEPTH
        )

        async def read() -> None:
            try:
                async for request in requests:
                    infer = self._infer(request, request_id)
                    if self.limiter is not None:
                        infer = self._limited(infer, client)
                    task = asyncio.create_task(infer, name="grpc-stream")
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
                    if status.code_of(exc) in (None, grpc.StatusCode.INTERNAL):
                        FAILURES.failed("gRPC stream request failed", exc)
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

    async def _limited(self, infer: Coroutine[Any, Any, Any], client: str) -> Any:
        """``infer`` once the client's bucket gives a token; the refusal otherwise."""
        assert self.limiter is not None
        try:
            self.limiter.take(client)
        except Exception as exc:
            infer.close()  # never started
            status.count_refusal(self.state.metrics, exc)
            raise
        return await infer

    async def _infer(
        self, request: pb.ModelInferRequest, request_id: str, span: RequestSpan | None = None
    ) -> Any:
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
                request.id or request_id or None,
            )
            # resolved above, with no await since: no swap came in between
            result = await service.submit(infer, lv)
            response = codec.encode(
                result.model, result.version, request.id, result.outputs, decoded.outputs, lease
            )
        finally:
            lease.release()
        if span is not None:
            answered = time.monotonic()
            timing = SpanTiming(
                result.queue_s, result.compute_s, answered, result.batch_rows, result.steps
            )
            span.served(result.model, result.version, lv.placement, timing)
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


def _model_config(lv: LoadedVersion, served: list[int]) -> mc.ModelConfig:
    """Triton's view of a served version, the document REST's config answers."""
    return json_format.ParseDict(triton_config(lv, served), mc.ModelConfig())
