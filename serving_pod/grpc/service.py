"""The gRPC adapter: Triton's ``inference.GRPCInferenceService`` and ``grpc.health.v1`` over grpc.aio.

Each method decodes -> calls the engine -> encodes; ``ServerError`` maps through the same table as
HTTP. Where Triton's gRPC front end has words or an order of its own (a decoupled model over ``ModelInfer``,
the model looked up before the request is read, a stream's error messages), they are kept here. Triton's
protos come from tritonclient (registering a second copy would collide with it).

At ``--log-verbose`` 1 and above an inference request that could not start is logged as tritonserver's gRPC front
end logs it, ``[request id: <id>] Infer failed: <message>``: a ``ModelInfer`` or stream request refused before it
was queued (its model or its message refused), not one whose model failed it; only the error paths check the flag.
On the grpc.aio front end each RPC's ``Process for ...`` line is written by ``verbose.logged_servicer``, and a
stream's by ``ModelStreamInfer`` itself (``rpc_log``, once per stream); the native front end writes its own.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections import deque
from typing import Any, AsyncIterator

import grpc
from google.protobuf import json_format
from google.protobuf.message import DecodeError
from grpc_health.v1 import health_pb2, health_pb2_grpc
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc

from serving_pod import logging_settings
from serving_pod.core.engine import Engine
from serving_pod.core.errors import (
    DecoupledModelError, InvalidArgumentError, ServerError, UnsupportedError, grpc_code,
)
from serving_pod.core.parameters import forward_headers
from serving_pod.core.types import InferRequest
from serving_pod.grpc.codec import decode_infer_request, decode_serialized, encode_infer_response, encode_serialized
from serving_pod.grpc.extensions import ExtensionsMixin
from serving_pod.grpc.h2 import MAX_CONCURRENT_STREAMS
from serving_pod.grpc.unparsable import UnparsableRequests
from serving_pod.grpc.verbose import RpcLog, logged_servicer
from serving_pod.grpc.wire import takes_serialized
from serving_pod.trace import Frontend

log = logging.getLogger("ferry.grpc")

INT32_MAX = 2**31 - 1
SERVER_OPTIONS = [
    ("grpc.max_send_message_length", INT32_MAX),
    ("grpc.max_receive_message_length", INT32_MAX),
    ("grpc.so_reuseport", 0),
    ("grpc.max_concurrent_streams", MAX_CONCURRENT_STREAMS),  # the same limit as the native front end
]


async def _abort(context: grpc.aio.ServicerContext, error: ServerError) -> None:
    await context.abort(grpc_code(error), error.message)


async def _refuse_repository_name(request: Any, context: grpc.aio.ServicerContext) -> None:
    """Triton serves one merged repository: an index, load or unload naming one is refused before anything else
    is read (grpc_server.cc), not served from the merged one."""
    if request.repository_name:
        await _abort(context, UnsupportedError("'repository_name' specification is not supported"))


#: ``ModelInfer`` of a decoupled model, in Triton's gRPC words (its HTTP front end has its own)
_DECOUPLED = "ModelInfer RPC doesn't support models with decoupled transaction policy"
#: client metadata that turns a stream's response errors into the stream's status (Triton's ``triton_grpc_error``)
_GRPC_ERROR_KEY = "triton_grpc_error"


def _log_failed(request_id: str, error: ServerError) -> None:
    """tritonserver's verbose line for an inference request refused before it was queued (callers check
    ``logging_settings.VERBOSE``)."""
    logging_settings.log_infer_failed(log, request_id, error.message)


class _InOrder:
    """A stream request for a model that is not decoupled: its answer waits until the requests before it have theirs
    (tritonserver writes those in request order)."""

    __slots__ = ("items", "done")

    def __init__(self) -> None:
        self.items: list[Any] = []
        self.done = False


def _refused(message: pb.ModelInferRequest, error: ServerError) -> pb.ModelStreamInferResponse:
    """The stream message for a request refused before it was queued: only its id names it (tritonserver)."""
    return pb.ModelStreamInferResponse(error_message=error.message, infer_response=pb.ModelInferResponse(id=message.id))


def _failed(message: pb.ModelInferRequest, error: ServerError, final: bool) -> pb.ModelStreamInferResponse:
    """The stream message for an error response of a queued request: the request's model name, version (as the
    client wrote it) and id, and whether it was the request's last response (tritonserver)."""
    response = pb.ModelStreamInferResponse(
        error_message=error.message,
        infer_response=pb.ModelInferResponse(
            model_name=message.model_name, model_version=message.model_version, id=message.id
        ),
    )
    response.infer_response.parameters["triton_final_response"].bool_param = final
    return response


def _grpc_error_mode(context: Any) -> bool:
    """Whether the client asked for ``triton_grpc_error: true``: a response error ends the stream with its status
    instead of travelling in ``error_message`` (requests refused before the model keep theirs, as in Triton 2.51)."""
    return any(key == _GRPC_ERROR_KEY and value == "true" for key, value in context.invocation_metadata() or ())


class InferenceService(ExtensionsMixin, service_pb2_grpc.GRPCInferenceServiceServicer):
    """Triton's inference service on top of the engine."""

    def __init__(self, engine: Engine, header_forward: re.Pattern[str] | None = None,
                 rpc_log: RpcLog | None = None) -> None:
        self.engine = engine
        #: ``--grpc-header-forward-pattern``: matching metadata becomes request parameters
        self.header_forward = header_forward
        #: the grpc.aio front end's verbose lines, which ``ModelStreamInfer`` writes here for a stream (the others:
        #: ``verbose.logged_servicer``); None: the native front end writes them
        self.rpc_log = rpc_log

    def _forward(self, request: InferRequest, context: Any) -> None:
        """``--grpc-header-forward-pattern``: matching metadata becomes request parameters, in the order of their
        names as tritonserver adds them (grpc++ keeps client metadata in a sorted multimap), not as they came."""
        metadata = sorted(context.invocation_metadata() or (), key=lambda item: item[0])
        forward_headers(request.parameters, metadata, self.header_forward)

    async def ServerLive(self, request, context):
        return pb.ServerLiveResponse(live=self.engine.is_live())

    async def ServerReady(self, request, context):
        return pb.ServerReadyResponse(ready=self.engine.is_ready())

    async def ModelReady(self, request, context):
        try:
            ready = self.engine.model_ready(request.name, request.version)
        except ServerError as error:  # a version string that cannot be parsed
            await _abort(context, error)
        return pb.ModelReadyResponse(ready=ready)

    async def ServerMetadata(self, request, context):
        meta = self.engine.server_metadata()
        return pb.ServerMetadataResponse(
            name=meta["name"], version=meta["version"], extensions=meta["extensions"]
        )

    async def ModelMetadata(self, request, context):
        try:
            meta = self.engine.model_metadata(request.name, request.version)
        except ServerError as error:
            await _abort(context, error)
        return pb.ModelMetadataResponse(
            name=meta["name"],
            versions=meta["versions"],
            platform=meta["platform"],
            inputs=[pb.ModelMetadataResponse.TensorMetadata(**t) for t in meta["inputs"]],
            outputs=[pb.ModelMetadataResponse.TensorMetadata(**t) for t in meta["outputs"]],
        )

    async def ModelConfig(self, request, context):
        try:
            config = self.engine.model_config(request.name, request.version)
        except ServerError as error:
            await _abort(context, error)
        return pb.ModelConfigResponse(config=config)

    async def ModelStatistics(self, request, context):
        try:
            stats = self.engine.statistics(request.name, request.version)
        except ServerError as error:
            await _abort(context, error)
        return json_format.ParseDict({"model_stats": stats}, pb.ModelStatisticsResponse())

    @takes_serialized
    async def ModelInfer(self, request: bytes | pb.ModelInferRequest, context) -> bytes | pb.ModelInferResponse:
        """Serialized in (the native front end), serialized out; a message in (grpc.aio), a message out.

        While tracing is on the engine sees a ``Frontend`` (GRPC_WAITREAD_* from here to the decoded request),
        and GRPC_SEND_* time the encoding: the transport sends what the method returns."""
        frontend = Frontend(self.engine, "GRPC") if self.engine.tracer.enabled else None
        serialized = type(request) is bytes
        try:
            try:
                infer_request = decode_serialized(request) if serialized else decode_infer_request(request)
                if self.header_forward is not None:
                    self._forward(infer_request, context)
            except ServerError as error:
                error = self._model_error(request, unary=True) or error
                if logging_settings.VERBOSE:
                    _log_failed("", error)
                await _abort(context, error)
            try:
                response = await (self.engine if frontend is None else frontend).infer(infer_request)
            except ServerError as error:
                if isinstance(error, DecoupledModelError):
                    error = UnsupportedError(_DECOUPLED)
                    error.refused_before_queue = True
                if logging_settings.VERBOSE and error.refused_before_queue:
                    _log_failed(infer_request.id, error)
                await _abort(context, error)
            if frontend is None:
                return encode_serialized(response) if serialized else encode_infer_response(response)
            start = time.monotonic_ns()
            encoded = encode_serialized(response) if serialized else encode_infer_response(response)
            frontend.sent(start)
            return encoded
        finally:
            if frontend is not None:
                frontend.done()

    def _model_error(self, request: bytes | pb.ModelInferRequest, *, unary: bool) -> ServerError | None:
        """For a request the codec refused: what Triton answers first, a model or version it cannot have, or a
        decoupled model over ``ModelInfer`` (its gRPC front end looks the model up before reading the request);
        None when the codec's error stands. Only on the error path: the request is parsed again if it came
        serialized."""
        if type(request) is bytes:
            try:
                request = pb.ModelInferRequest.FromString(request)
            except DecodeError:
                return None
        try:
            model = self.engine.registry.get(request.model_name, request.model_version)
        except ServerError as error:
            return error
        return UnsupportedError(_DECOUPLED) if unary and model.decoupled else None

    def _decoupled(self, message: pb.ModelInferRequest) -> bool:
        """Whether a stream request is for a decoupled model (one that cannot be looked up counts as not)."""
        try:
            return self.engine.registry.get(message.model_name, message.model_version).decoupled
        except ServerError:
            return False

    async def ModelStreamInfer(
        self, request_iterator: AsyncIterator[pb.ModelInferRequest], context
    ) -> AsyncIterator[pb.ModelStreamInferResponse]:
        """Bidirectional stream: the requests run at once; as tritonserver, a decoupled model's responses are sent as
        they are produced, and every other request's answer in the order the requests came (``_InOrder``). Errors
        are sent as Triton sends them: a request refused before the model named by its id alone (``_refused``), an
        error response by the request and its final flag (``_failed``), or the stream's status with
        ``triton_grpc_error``."""
        if logging_settings.VERBOSE and self.rpc_log is not None:
            self.rpc_log.started("ModelStreamInfer")
        queue: asyncio.Queue = asyncio.Queue()
        tasks: set[asyncio.Task] = set()
        reader_done = object()
        grpc_error = _grpc_error_mode(context)
        ordered: deque[_InOrder] = deque()  # non-decoupled requests not yet answered, in the order they came

        def send(item: Any, slot: _InOrder | None) -> None:
            if slot is None:
                queue.put_nowait(item)
            else:
                slot.items.append(item)

        def release(slot: _InOrder) -> None:
            slot.done = True
            while ordered and ordered[0].done:
                for item in ordered.popleft().items:
                    queue.put_nowait(item)

        def refused(message: pb.ModelInferRequest, error: ServerError, slot: _InOrder | None) -> None:
            if logging_settings.VERBOSE:
                _log_failed(message.id, error)
            send(_refused(message, error), slot)

        def failed(message: pb.ModelInferRequest, error: ServerError, final: bool, slot: _InOrder | None) -> None:
            send(error if grpc_error else _failed(message, error, final), slot)

        async def run_one(message: pb.ModelInferRequest, slot: _InOrder | None) -> None:
            try:
                await answer(message, slot)
            finally:
                if slot is not None:
                    release(slot)

        async def answer(message: pb.ModelInferRequest, slot: _InOrder | None) -> None:
            # tracing on: GRPC_WAITREAD_START now, _END once decoded (the engine sees ``frontend``)
            frontend = Frontend(self.engine, "GRPC") if self.engine.tracer.enabled else None
            try:
                infer_request = decode_infer_request(message)
                if self.header_forward is not None:
                    self._forward(infer_request, context)
            except ServerError as error:
                refused(message, self._model_error(message, unary=False) or error, slot)
                return
            try:
                enable_empty = bool(infer_request.parameters.get("triton_enable_empty_final_response"))
                async for response in (self.engine if frontend is None else frontend).stream_infer(infer_request):
                    if isinstance(response, ServerError):  # this response failed; the request goes on
                        failed(message, response, False, slot)
                        continue
                    # the final flag alone (a response with no outputs is sent as any response, as tritonserver)
                    if response.flag_only:
                        if not enable_empty:
                            continue
                        response.model_version = message.model_version  # the flag only: as the client named it
                    if frontend is not None:
                        start = time.monotonic_ns()
                    encoded = encode_infer_response(response)
                    # every stream response says whether it is its request's last, decoupled model or not (tritonserver)
                    encoded.parameters["triton_final_response"].bool_param = response.final
                    send(pb.ModelStreamInferResponse(infer_response=encoded), slot)
                    if frontend is not None:
                        frontend.sent(start)  # GRPC_SEND_START/END per response, as tritonserver
            except ServerError as error:
                if error.refused_before_queue:  # set by the engine (``core.engine.mark_refused``)
                    refused(message, error, slot)
                else:  # the request's last response
                    failed(message, error, True, slot)
            finally:
                if frontend is not None:
                    frontend.done()

        async def reader() -> None:
            try:
                async for message in request_iterator:
                    slot = None if self._decoupled(message) else _InOrder()
                    if slot is not None:
                        ordered.append(slot)
                    task = asyncio.create_task(run_one(message, slot))
                    tasks.add(task)
                    task.add_done_callback(tasks.discard)
            finally:
                if tasks:
                    await asyncio.gather(*tasks, return_exceptions=True)
                await queue.put(reader_done)

        reader_task = asyncio.create_task(reader())
        try:
            while True:
                item = await queue.get()
                if item is reader_done:
                    break
                if isinstance(item, ServerError):  # triton_grpc_error: the stream ends with the first one
                    await _abort(context, item)
                yield item
            # a request the stream could not deliver (a malformed message) ends the RPC with its error, after the
            # responses to the requests before it, instead of a silent OK
            await reader_task
        finally:
            reader_task.cancel()
            for task in tasks:
                task.cancel()

    async def RepositoryIndex(self, request, context):
        await _refuse_repository_name(request, context)
        rows = self.engine.repository_index(request.ready)
        return pb.RepositoryIndexResponse(
            models=[pb.RepositoryIndexResponse.ModelIndex(**row) for row in rows]
        )

    async def RepositoryModelLoad(self, request, context):
        await _refuse_repository_name(request, context)
        try:
            config, files = _load_parameters(request.parameters)
            await self.engine.load_model(request.model_name, config, files)
        except ServerError as error:
            await _abort(context, error)
        return pb.RepositoryModelLoadResponse()

    async def RepositoryModelUnload(self, request, context):
        await _refuse_repository_name(request, context)
        try:
            dependents = False
            if "unload_dependents" in request.parameters:
                param = request.parameters["unload_dependents"]
                if param.WhichOneof("parameter_choice") != "bool_param":
                    raise InvalidArgumentError(
                        "invalid value type for 'unload_dependents' parameter, expected bool_param."
                    )
                dependents = param.bool_param
            await self.engine.unload_model(request.model_name, dependents)
        except ServerError as error:
            await _abort(context, error)
        return pb.RepositoryModelUnloadResponse()


def _load_parameters(params) -> tuple[str | None, dict[str, bytes]]:
    config: str | None = None
    files: dict[str, bytes] = {}
    for key, value in params.items():
        which = value.WhichOneof("parameter_choice")
        if key == "config":
            if which != "string_param":
                raise InvalidArgumentError("invalid value type for load parameter 'config', expected string_param.")
            config = value.string_param
        elif key.startswith("file:"):
            if which != "bytes_param":
                raise InvalidArgumentError(f"invalid value type for load parameter '{key}', expected bytes_param.")
            files[key[5:]] = value.bytes_param
        else:  # Triton refuses what it does not know instead of loading without it
            raise InvalidArgumentError(f"unrecognized load parameter '{key}'.")
    return config, files


class HealthService(health_pb2_grpc.HealthServicer):
    """``grpc.health.v1.Health``: SERVING when the server is ready."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    async def Check(self, request, context):
        status = (
            health_pb2.HealthCheckResponse.SERVING
            if self.engine.is_ready()
            else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        return health_pb2.HealthCheckResponse(status=status)


def create_native_server(
    engine: Engine,
    *,
    restrictions: dict | None = None,
    max_message_size: int = INT32_MAX,
    max_metadata_size: int = 64 * 1024,
    ssl_context: Any = None,
    keepalive: Any = None,
    response_compression: str = "none",
    header_forward: re.Pattern[str] | None = None,
) -> Any:
    """The same services on the native front end (``serving_pod.grpc.native``); ``start(host, port)`` binds."""
    from serving_pod.grpc.native import NativeGrpcServer

    denied = None
    if restrictions:
        from serving_pod.security import grpc_denied

        def restricted(path: bytes, metadata: Any) -> str | None:
            return grpc_denied(restrictions, path.decode("latin-1"), metadata)

        denied = restricted

    services = [
        (pb.DESCRIPTOR.services_by_name["GRPCInferenceService"], InferenceService(engine, header_forward)),
        (health_pb2.DESCRIPTOR.services_by_name["Health"], HealthService(engine)),
    ]
    return NativeGrpcServer(services, denied=denied, max_message_size=max_message_size,
                            max_metadata_size=max_metadata_size, ssl_context=ssl_context, keepalive=keepalive,
                            response_compression=response_compression)


def create_server(
    engine: Engine,
    extra_services: list[Any] | None = None,
    *,
    restrictions: dict | None = None,
    max_message_size: int = INT32_MAX,
    max_metadata_size: int = 64 * 1024,
    keepalive: Any = None,
    response_compression: str = "none",
    reuse_port: bool = False,
    header_forward: re.Pattern[str] | None = None,
) -> grpc.aio.Server:
    """A grpc.aio server with the inference and health services (ports are added by the caller).

    ``restrictions`` (``security.parse_restrictions``) installs the restricted-protocol interceptor.
    """
    options = [
        ("grpc.max_send_message_length", max_message_size),
        ("grpc.max_receive_message_length", max_message_size),
        ("grpc.max_metadata_size", max_metadata_size),
        ("grpc.so_reuseport", int(reuse_port)),  # --reuse-grpc-port
        *[o for o in SERVER_OPTIONS if not o[0].endswith("_message_length") and o[0] != "grpc.so_reuseport"],
    ]
    if keepalive is not None:
        options += [
            ("grpc.keepalive_time_ms", keepalive.time_ms),
            ("grpc.keepalive_timeout_ms", keepalive.timeout_ms),
            ("grpc.keepalive_permit_without_calls", int(keepalive.permit_without_calls)),
            ("grpc.http2.max_pings_without_data", keepalive.max_pings_without_data),
            ("grpc.http2.min_recv_ping_interval_without_data_ms", keepalive.min_recv_ping_interval_without_data_ms),
            ("grpc.http2.max_ping_strikes", keepalive.max_ping_strikes),
        ]
        if keepalive.max_connection_age_ms:  # as Triton: only set when given (0 is gRPC's "never")
            options.append(("grpc.max_connection_age_ms", keepalive.max_connection_age_ms))
        if keepalive.max_connection_age_grace_ms:
            options.append(("grpc.max_connection_age_grace_ms", keepalive.max_connection_age_grace_ms))
    if response_compression != "none":
        options.append(("grpc.default_compression_level", {"low": 1, "med": 2, "high": 3}[response_compression]))
    interceptors: list[grpc.aio.ServerInterceptor] = [UnparsableRequests()]
    rpc_log = RpcLog()
    if restrictions:
        from serving_pod.security import RestrictedGrpc

        interceptors.append(RestrictedGrpc(restrictions, rpc_log))
    server = grpc.aio.server(options=options, interceptors=interceptors)
    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(
        logged_servicer(InferenceService(engine, header_forward, rpc_log), rpc_log), server)
    health_pb2_grpc.add_HealthServicer_to_server(logged_servicer(HealthService(engine), rpc_log), server)
    for add in extra_services or []:
        add(server)
    server.add_generic_rpc_handlers((_UnknownMethods(),))
    return server


class _UnknownMethods(grpc.GenericRpcHandler):
    """Any method no service has: UNIMPLEMENTED with no details, as Triton's grpc++ answers (grpc.aio's own
    answer says 'Method not found!'). Asked last."""

    def service(self, handler_call_details: Any) -> Any:
        return grpc.stream_stream_rpc_method_handler(_unimplemented)


async def _unimplemented(requests: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
    await context.abort(grpc.StatusCode.UNIMPLEMENTED, "")
    yield  # pragma: no cover - makes this an async generator
