"""HTTP routes of the shared-memory, trace and logging extensions (added to the app by ``create_app``).

Each route decodes its JSON body -> calls the engine (``engine.shm``, ``engine.trace_settings``,
``engine.log_settings_update``) -> encodes the answer; errors are ``ServerError``s mapped by the
app's exception handler, as for every other route.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import Response

from serving_pod.core.engine import Engine
from serving_pod.core.errors import InvalidArgumentError
from serving_pod.http.codec import decode_base64
from serving_pod.http.responses import json_body, json_ok, json_response
from serving_pod.shm import CUDA, SYSTEM


#: the trace settings tritonserver reads as JSON strings only (a number is refused, not read as one)
_TRACE_STRINGS = ("trace_rate", "trace_count", "log_frequency")
#: sizeof(cudaIpcMemHandle_t)
CUDA_IPC_HANDLE_BYTES = 64


def _trace_changes(body: dict[str, Any]) -> dict[str, Any]:
    """The trace settings' changes of ``body``: a number, boolean, array or object where tritonserver 2.51 takes a
    string (or null) is refused (Triton: 500 "attempt to access JSON non-string as string"; Ferry read ``true`` and
    ``1.5`` as 1)."""
    for key in _TRACE_STRINGS:
        value = body.get(key)
        if value is not None and not isinstance(value, str):
            raise InvalidArgumentError(f"Unable to parse '{key}': expected a string, got {value!r}")
    return body


def _uint(body: dict[str, Any], key: str, *, required: bool, what: str) -> int:
    if key not in body:
        if required:
            raise InvalidArgumentError(f"{what} register request has no '{key}' field")
        return 0
    value = body[key]
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise InvalidArgumentError(f"{what} register request: '{key}' must be an unsigned integer, got {value!r}")
    return value


def _ipc_handle(text: str) -> bytes:
    """The ``raw_handle`` of a CUDA register request: base64 of a ``cudaIpcMemHandle_t``. Text that is not base64, or
    decodes to another size, gets tritonserver's 400 before any CUDA call (Ferry answered a handle of the wrong size
    with 501 where no CUDA device is visible, and worded bad base64 its own way)."""
    try:
        raw = decode_base64(text, "'raw_handle'")
    except InvalidArgumentError:
        raw = b""
    if len(raw) != CUDA_IPC_HANDLE_BYTES:
        raise InvalidArgumentError("'raw_handle' must be a valid base64 encoded cudaIpcMemHandle_t")
    return raw


def add_extension_routes(app: FastAPI, engine: Engine) -> None:
    """System/CUDA shared memory, trace setting and logging routes."""
    shm = engine.shm

    @app.get("/v2/systemsharedmemory/status")
    @app.get("/v2/systemsharedmemory/region/{region}/status")
    async def system_status(region: str = "") -> Response:
        return json_response(shm.status(SYSTEM, region))

    # the routes without a region exist so that a request without one gets Triton's 400, not an unknown route
    @app.post("/v2/systemsharedmemory/register")
    @app.post("/v2/systemsharedmemory/region/{region}/register")
    async def system_register(request: Request, region: str = "") -> Response:
        shm.require_allowed()
        shm.require_region(region, "system")  # before the body: a malformed one without a name gets this 400 too
        body = await json_body(request)
        key = body.get("key")
        if key is None:
            raise InvalidArgumentError("Shared memory register request has no 'key' field")
        if not isinstance(key, str):
            raise InvalidArgumentError("Shared memory register request: 'key' must be a string")
        offset = _uint(body, "offset", required=False, what="Shared memory")
        byte_size = _uint(body, "byte_size", required=True, what="Shared memory")
        shm.register_system(region, key, offset, byte_size)  # a duplicate name: ALREADY_EXISTS, HTTP 400 (Triton's)
        return json_ok()

    @app.post("/v2/systemsharedmemory/unregister")
    @app.post("/v2/systemsharedmemory/region/{region}/unregister")
    async def system_unregister(region: str = "") -> Response:
        shm.unregister(SYSTEM, region)
        return json_ok()

    @app.get("/v2/cudasharedmemory/status")
    @app.get("/v2/cudasharedmemory/region/{region}/status")
    async def cuda_status(region: str = "") -> Response:
        return json_response(shm.status(CUDA, region))

    @app.post("/v2/cudasharedmemory/register")
    @app.post("/v2/cudasharedmemory/region/{region}/register")
    async def cuda_register(request: Request, region: str = "") -> Response:
        shm.require_allowed()
        shm.require_region(region, "cuda")
        body = await json_body(request)
        if "raw_handle" not in body:
            raise InvalidArgumentError("Shared memory register request has no 'raw_handle' field")  # Triton's words
        handle = body["raw_handle"]
        if not isinstance(handle, dict) or not isinstance(handle.get("b64"), str):
            raise InvalidArgumentError("CUDA shared memory register request has no 'raw_handle' {'b64': ...} field")
        device_id = _uint(body, "device_id", required=True, what="CUDA shared memory")
        byte_size = _uint(body, "byte_size", required=True, what="CUDA shared memory")
        shm.register_cuda(region, _ipc_handle(handle["b64"]), device_id, byte_size)
        return json_ok()

    @app.post("/v2/cudasharedmemory/unregister")
    @app.post("/v2/cudasharedmemory/region/{region}/unregister")
    async def cuda_unregister(region: str = "") -> Response:
        shm.unregister(CUDA, region)
        return json_ok()

    @app.get("/v2/trace/setting")
    @app.get("/v2/models/{model}/trace/setting")
    async def trace_get(model: str = "") -> Response:
        return json_response(engine.trace_settings(model))

    @app.post("/v2/trace/setting")
    @app.post("/v2/models/{model}/trace/setting")
    async def trace_post(request: Request, model: str = "") -> Response:
        if model:  # tritonserver refuses an unknown model before it reads the body (Ferry named the body's fault)
            engine.trace_settings(model)
        return json_response(engine.trace_settings(model, _trace_changes(await json_body(request))))

    @app.get("/v2/logging")
    async def logging_get() -> Response:
        return json_response(engine.log_settings_update())

    @app.post("/v2/logging")
    async def logging_post(request: Request) -> Response:
        return json_response(engine.log_settings_update(await json_body(request)))
