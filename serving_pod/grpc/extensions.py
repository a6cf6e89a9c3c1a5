"""gRPC methods of the shared-memory, trace and logging extensions, mixed into ``InferenceService``.

Same verbs as the HTTP routes in ``serving_pod.http.extensions`` (``engine.shm``,
``engine.trace_settings``, ``engine.log_settings_update``); protobuf stays in this package.
"""

from __future__ import annotations

from typing import Any

import grpc
from tritonclient.grpc import service_pb2 as pb

from serving_pod.core.errors import InvalidArgumentError, ServerError, UnsupportedError, grpc_code
from serving_pod.logging_settings import FORMATS
from serving_pod.shm import CUDA, SYSTEM

#: LogSettings keys -> (the parameter they take, Triton's word for its type)
_LOG_TYPES = {"log_info": ("bool_param", "boolean"), "log_warning": ("bool_param", "boolean"),
              "log_error": ("bool_param", "boolean"), "log_verbose_level": ("uint32_param", "int32"),
              "log_format": ("string_param", "string")}


async def _abort(context: grpc.aio.ServicerContext, error: ServerError) -> None:
    await context.abort(grpc_code(error), error.message)


class ExtensionsMixin:
    """SystemSharedMemory*, CudaSharedMemory*, TraceSetting and LogSettings."""

    engine: Any

    async def SystemSharedMemoryStatus(self, request, context):
        try:
            regions = self.engine.shm.status(SYSTEM, request.name)
        except ServerError as error:
            await _abort(context, error)
        response = pb.SystemSharedMemoryStatusResponse()
        for region in regions:
            response.regions[region["name"]].CopyFrom(
                pb.SystemSharedMemoryStatusResponse.RegionStatus(**region)
            )
        return response

    async def SystemSharedMemoryRegister(self, request, context):
        try:
            self.engine.shm.register_system(request.name, request.key, request.offset, request.byte_size)
        except ServerError as error:
            await _abort(context, error)
        return pb.SystemSharedMemoryRegisterResponse()

    async def SystemSharedMemoryUnregister(self, request, context):
        try:
            self.engine.shm.unregister(SYSTEM, request.name)
        except ServerError as error:
            await _abort(context, error)
        return pb.SystemSharedMemoryUnregisterResponse()

    async def CudaSharedMemoryStatus(self, request, context):
        try:
            regions = self.engine.shm.status(CUDA, request.name)
        except ServerError as error:
            await _abort(context, error)
        response = pb.CudaSharedMemoryStatusResponse()
        for region in regions:
            response.regions[region["name"]].CopyFrom(pb.CudaSharedMemoryStatusResponse.RegionStatus(**region))
        return response

    async def CudaSharedMemoryRegister(self, request, context):
        try:
            self.engine.shm.register_cuda(request.name, request.raw_handle, request.device_id, request.byte_size)
        except ServerError as error:
            await _abort(context, error)
        return pb.CudaSharedMemoryRegisterResponse()

    async def CudaSharedMemoryUnregister(self, request, context):
        try:
            self.engine.shm.unregister(CUDA, request.name)
        except ServerError as error:
            await _abort(context, error)
        return pb.CudaSharedMemoryUnregisterResponse()

    async def TraceSetting(self, request, context):
        changes: dict[str, Any] = {}
        try:
            for key, setting in request.settings.items():
                values = list(setting.value)
                if key == "trace_level":
                    changes[key] = values or None
                elif len(values) > 1:  # Triton's words; the first value was taken silently
                    raise InvalidArgumentError(f"expect only 1 value for '{key}'")
                else:
                    changes[key] = values[0] if values else None
            settings = self.engine.trace_settings(request.model_name, changes)
        except ServerError as error:
            await _abort(context, error)
        response = pb.TraceSettingResponse()
        for key, value in settings.items():
            response.settings[key].value.extend(value if isinstance(value, list) else [value])
        return response

    async def LogSettings(self, request, context):
        changes: dict[str, Any] = {}
        try:
            for key, setting in request.settings.items():
                which = setting.WhichOneof("parameter_choice")
                if key == "log_file":  # of any type or none: tritonserver refuses it before looking at it
                    raise UnsupportedError("log file location can not be updated through network protocol")
                expected = _LOG_TYPES.get(key)
                if expected is not None and which != expected[0]:  # an empty value too: Triton refuses it
                    raise InvalidArgumentError(f"expect {expected[1]} for '{key}'")
                value = getattr(setting, which) if which else None
                if key == "log_format" and value not in FORMATS:
                    # Triton's gRPC words and code (its HTTP route says UNAVAILABLE "--log_format", as the engine)
                    raise InvalidArgumentError(f"invalid argument for log_format, got: {value}")
                changes[key] = value
            settings = self.engine.log_settings_update(changes)
        except ServerError as error:
            await _abort(context, error)
        response = pb.LogSettingsResponse()
        for key, value in settings.items():
            entry = response.settings[key]
            if isinstance(value, bool):
                entry.bool_param = value
            elif isinstance(value, int):
                entry.uint32_param = value
            else:
                entry.string_param = value
        return response
