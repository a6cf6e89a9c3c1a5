"""Restricted API groups (``--http-restricted-api`` / ``--grpc-restricted-protocol``), as tritonserver.

``<group>[,<group>...]:<header>=<value>`` restricts the endpoints of each group to requests that
carry ``<header>: <value>``; groups are health, metadata, inference, shared-memory, model-config,
model-repository, statistics, trace, logging. A refused HTTP request gets 403 and
``{"error": "This API is restricted, expecting header '<header>'"}``; a refused RPC gets
UNAVAILABLE with "This protocol is restricted, expecting header '<header>'" (Triton's words).

The HTTP guard is an ASGI middleware and the gRPC guard a server interceptor; both are installed
only when some group is restricted, so unrestricted servers pay nothing. At ``--log-verbose`` 1 and above a refused
request gets tritonserver's verbose line first (``http.app.log_http_request``, ``grpc.verbose``), as tritonserver
checks restrictions in the handler it has logged.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Awaitable, Callable

import grpc
import orjson

from serving_pod import logging_settings

GROUPS = (
    "health", "metadata", "inference", "shared-memory", "model-config",
    "model-repository", "statistics", "trace", "logging",
)


@dataclass(frozen=True, slots=True)
class Restriction:
    """The header (lower case) and value a restricted group requires."""

    header: str
    value: str


#: what tritonserver puts before the key of ``--grpc-restricted-protocol``: the metadata key a client must send
#: (``kRestrictedProtocolHeaderTemplate``, grpc_server.h); ``--http-restricted-api`` keys are used as given
GRPC_HEADER_PREFIX = "triton-grpc-protocol-"


def parse_restrictions(values: list[str] | tuple[str, ...], flag: str, prefix: str = "") -> dict[str, Restriction]:
    """Flag values -> ``{group: Restriction}`` whose header is ``prefix`` + the flag's key. Read as tritonserver reads
    them: the groups before the first ':', the key up to the next '=', the value (which may hold ':' and '=') after
    it, none of them empty; ValueError in tritonserver's words otherwise."""
    kind = "protocol" if "protocol" in flag else "api"
    out: dict[str, Restriction] = {}
    for raw in values:
        groups, sep, pair = raw.partition(":")
        header, eq, value = pair.partition("=")
        if not sep or not eq or not groups or not header.strip() or not value:
            raise ValueError(f"{flag} option format is '<config name>:<setting>=<value>'. Got {raw}")
        for group in (g.strip() for g in groups.split(",")):
            if group not in GROUPS:
                raise ValueError(f"unknown restricted {kind} '{group}'")
            if group in out:
                raise ValueError(f"restricted {kind} '{group}' can not be specified in multiple config groups")
            out[group] = Restriction(prefix + header.strip().lower(), value)
    return out


def http_group(path: str) -> str | None:
    """The restricted-API group of an HTTP path (None for paths outside the V2 API)."""
    if not path.startswith("/v2"):
        return None
    parts = path[3:].strip("/").split("/") if len(path) > 3 else []
    if not parts or parts == [""]:
        return "metadata"
    head = parts[0]
    if head == "health":
        return "health"
    if head == "repository":
        return "model-repository"
    if head in ("systemsharedmemory", "cudasharedmemory"):
        return "shared-memory"
    if head == "logging":
        return "logging"
    if head == "trace":
        return "trace"
    if head == "models":
        tail = parts[-1]
        if len(parts) == 2 and tail == "stats":
            return "statistics"
        if len(parts) == 2 or (len(parts) == 4 and parts[2] == "versions"):
            return "metadata"
        return {
            "ready": "health", "infer": "inference", "generate": "inference",
            "generate_stream": "inference", "config": "model-config", "stats": "statistics",
            "setting": "trace",
        }.get(tail)
    return None


def forbidden_message(restriction: Restriction) -> str:
    return f"This API is restricted, expecting header '{restriction.header}'"


class RestrictedHttp:
    """ASGI middleware refusing restricted-group requests that lack the group's header."""

    def __init__(self, app: Callable[..., Awaitable[None]], restrictions: dict[str, Restriction]) -> None:
        self.app = app
        self.restrictions = restrictions

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] == "http":
            group = http_group(scope["path"])
            restriction = self.restrictions.get(group) if group else None
            if restriction is not None:
                wanted = restriction.header.encode("latin-1")
                value = next((v for k, v in scope["headers"] if k == wanted), None)
                if value is None or value.decode("latin-1") != restriction.value:
                    if logging_settings.VERBOSE:
                        from serving_pod.http.app import FORWARDED, log_http_request, path_as_sent

                        if FORWARDED not in scope:
                            log_http_request(scope["method"], path_as_sent(scope))
                    body = orjson.dumps({"error": forbidden_message(restriction)})
                    await send({"type": "http.response.start", "status": 403, "headers": [
                        (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
                    await send({"type": "http.response.body", "body": body})
                    return
        await self.app(scope, receive, send)


GRPC_GROUPS: dict[str, str] = {
    **{m: "health" for m in ("ServerLive", "ServerReady", "ModelReady")},
    **{m: "metadata" for m in ("ServerMetadata", "ModelMetadata")},
    **{m: "inference" for m in ("ModelInfer", "ModelStreamInfer")},
    "ModelConfig": "model-config",
    "ModelStatistics": "statistics",
    **{m: "model-repository" for m in ("RepositoryIndex", "RepositoryModelLoad", "RepositoryModelUnload")},
    **{f"{kind}SharedMemory{verb}": "shared-memory"
       for kind in ("System", "Cuda") for verb in ("Status", "Register", "Unregister")},
    "TraceSetting": "trace",
    "LogSettings": "logging",
}


def grpc_group(method: str) -> str | None:
    """Group of a full gRPC method name such as ``/inference.GRPCInferenceService/ModelInfer``."""
    service, _, name = method.rpartition("/")
    if service == "/grpc.health.v1.Health":
        return "health"
    if service == "/inference.GRPCInferenceService":
        return GRPC_GROUPS.get(name)
    return None


def grpc_denied(restrictions: dict[str, Restriction], method: str, metadata: Any) -> str | None:
    """Why a call of ``method`` with ``metadata`` is refused, or None when it may go on."""
    group = grpc_group(method)
    restriction = restrictions.get(group) if group else None
    if restriction is None:
        return None
    for key, value in metadata or ():
        if key == restriction.header and value == restriction.value:
            return None
    return f"This protocol is restricted, expecting header '{restriction.header}'"


class RestrictedGrpc(grpc.aio.ServerInterceptor):
    """Server interceptor refusing restricted-group RPCs without the group's metadata header."""

    def __init__(self, restrictions: dict[str, Restriction], rpc_log: Any = None) -> None:
        self.restrictions = restrictions
        #: the front end's ``grpc.verbose.RpcLog``: a refused RPC's verbose line
        self.rpc_log = rpc_log

    async def intercept_service(self, continuation: Callable, details: Any) -> Any:
        handler = await continuation(details)
        denied = grpc_denied(self.restrictions, details.method, details.invocation_metadata)
        if denied is None or handler is None:
            return handler
        if logging_settings.VERBOSE and self.rpc_log is not None:
            self.rpc_log.started(details.method)
        return _denied(handler, denied)


def _denied(handler: Any, message: str) -> Any:
    async def unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
        await context.abort(grpc.StatusCode.UNAVAILABLE, message)

    async def streaming(request_iterator: Any, context: grpc.aio.ServicerContext) -> Any:
        await context.abort(grpc.StatusCode.UNAVAILABLE, message)
        yield  # pragma: no cover - makes this an async generator

    kwargs = {"request_deserializer": handler.request_deserializer,
              "response_serializer": handler.response_serializer}
    if handler.unary_unary:
        return grpc.unary_unary_rpc_method_handler(unary, **kwargs)
    if handler.unary_stream:
        return grpc.unary_stream_rpc_method_handler(streaming, **kwargs)
    if handler.stream_unary:
        return grpc.stream_unary_rpc_method_handler(unary, **kwargs)
    return grpc.stream_stream_rpc_method_handler(streaming, **kwargs)
