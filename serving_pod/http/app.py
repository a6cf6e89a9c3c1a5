"""The HTTP adapter: KServe V2 + Triton routes over FastAPI, with a lean path for ``/infer``.

Every route decodes -> calls the engine -> encodes, and maps ``ServerError`` through
``core.errors.STATUS_TABLE``. An inference request is answered by ``answer_infer``: straight from the
connection protocol (``http.protocol``) in the common case, else by ``InferEndpoint``, a plain ASGI
handler in front of FastAPI that skips the framework's routing and validation. Every other route is
ordinary FastAPI; the generate extension's two routes map their JSON in ``http.generate``.

Answers carry tritonserver 2.51's content types (``http.responses``): ``text/plain`` on the health and model
readiness routes, for unknown routes and for inference errors found before the body is parsed, else
``application/json``. As tritonserver looks the model up before it reads an inference body, a body refused for a
model that is unknown, not ready or decoupled gets the model's error (``_model_first``).

At ``--log-verbose`` 1 and above each request is logged as tritonserver logs it, ``HTTP request: <method> <path>``
(libevhtp's method number, the path as sent without its query; ``log_http_request``), first, whether it is answered
or refused: an infer request by ``answer_infer`` (or where its headers or body size are refused before it,
``log_infer_request``), any other by ``InferEndpoint`` (a protocol worker logs the requests it forwards, so the
server process does not log them again: ``FORWARDED``). An inference request tritonserver could not start is then
logged as its ``HandleInfer`` error callback logs it, ``[request id: <id>] Infer failed: <message>`` (``<id_unknown>``
when the body could not be parsed): a body that does not parse, or an engine refusal before the request was queued,
answered as JSON; not a refusal found before the body is read (model lookup, encoding, header length) nor an
error of the model's execution, which tritonserver answers without that callback. At level 0 that costs one flag
check per infer request.
"""

from __future__ import annotations

import logging
import re
import time
from typing import Any, Awaitable, Callable, NamedTuple, Protocol

import orjson
from fastapi import FastAPI, Request
from fastapi.responses import Response, StreamingResponse
from starlette.exceptions import HTTPException

from serving_pod import logging_settings
from serving_pod.core.engine import Engine
from serving_pod.core.errors import DecoupledModelError, InvalidArgumentError, ServerError, UnsupportedError
from serving_pod.core.parameters import forward_headers
from serving_pod.core.types import InferRequest, InferResponse
from serving_pod.http.codec import decode_base64, decode_infer_request, encode_infer_response
from serving_pod.http.generate import answer_generate
from serving_pod.http.raw import decode_raw_request, header_length as parse_header_length, transaction_config
from serving_pod.http.responses import (
    JSON, TEXT, before_parsing, error_body, infer_content_type, json_body, json_ok, json_response, read_body,
    send_response, text_response,
)
from serving_pod.http.compression import (
    ACCEPTED, UnsupportedEncodingError, choose_encoding, decode_body, encode_body, size_error,
)
from serving_pod.trace import Frontend

ASGIApp = Callable[[dict, Callable, Callable], Awaitable[None]]

log = logging.getLogger("ferry.http")
#: libevhtp's ``htp_method`` numbers, which tritonserver's verbose request line writes (any other method: 16)
_METHODS = {method: number for number, method in enumerate((
    "GET", "HEAD", "POST", "PUT", "DELETE", "MKCOL", "COPY", "MOVE", "OPTIONS", "PROPFIND", "PROPPATCH", "LOCK",
    "UNLOCK", "TRACE", "CONNECT", "PATCH"))}

# versions as tritonserver's routes match them, [0-9]+: any other is an unknown route (404 "Not Found", as
# ``_route_version``), not a version string the engine cannot parse (400)
_INFER_PATH = re.compile(r"^/v2/models/([^/]+)(?:/versions/([0-9]+))?/infer$")
#: the routes whose tritonserver handler sets no content type: their answers, errors included, are text/plain
_TEXT_ROUTE = re.compile(r"^/v2/health/(?:live|ready)$|^/v2/models/[^/]+(?:/versions/[0-9]+)?/(?:ready|infer)$")
#: tritonserver's HTTP answer to an inference request for a decoupled model (``CheckTransactionPolicy``)
DECOUPLED = "HTTP end point doesn't support models with decoupled transaction policy"


class Infers(Protocol):
    """What the infer route needs of an engine: the server's ``Engine``, or a protocol worker's ``RemoteEngine``
    (which asks the server process for a model's configuration, needed by a raw binary request only)."""

    async def infer(self, request: InferRequest) -> InferResponse: ...

    def model_config_dict(self, name: str, version: str = "") -> dict[str, Any] | Awaitable[dict[str, Any]]: ...


#: ASGI scope extension: the request's header names as sent (``http.protocol`` sets it when headers are forwarded)
HEADER_NAMES = "ferry.header_names"
#: ASGI scope key of a request a protocol worker forwarded (``http.workers.run_asgi``): the worker logged it
FORWARDED = "ferry.forwarded"


class InferHead(NamedTuple):
    """What the infer route reads from the request headers."""

    #: ``Inference-Header-Content-Length`` read as tritonserver reads it (``raw.header_length``); None when absent
    header_length: int | None
    #: ``Content-Encoding`` as sent; None when absent (an empty one is refused as Triton refuses it)
    encoding: str | None
    accept: str
    #: (name, value) of the headers ``--http-header-forward-pattern`` matches: they become request parameters
    forwarded: tuple[tuple[str, str], ...] = ()
    #: the ``Inference-Header-Content-Length`` value as sent (tritonserver's range error quotes it)
    header_text: str = ""


def infer_head(headers: list[tuple[bytes, bytes]], limit: int, forward: re.Pattern[str] | None = None,
               names: list[bytes] | None = None) -> InferHead:
    """The infer route's headers; ``InvalidArgumentError`` on a declared body over ``limit``. A header sent twice
    counts once, its first value, as tritonserver's ``evhtp_kv_find`` finds it.

    ``forward`` matches ``names``, the header names as the client sent them (``headers`` has them in lower case,
    as uvicorn gives them), as Triton matches and forwards them; without ``names``, the lower-case ones.
    """
    header_length: int | None = None
    encoding: str | None = None
    accept: str | None = None
    header_text = ""
    content_length = -1
    for key, value in headers:
        if key == b"inference-header-content-length":  # never refused: any text is some length to atoi
            if header_length is None:
                header_length = parse_header_length(value)
                header_text = value.decode("latin-1")
        elif key == b"content-encoding":
            if encoding is None:
                encoding = value.decode("latin-1")
        elif key == b"accept-encoding":
            if accept is None:
                accept = value.decode("latin-1")
        elif key == b"content-length":
            content_length = int(value) if value.isdigit() else -1
    if content_length > limit:
        raise size_error(content_length, limit)
    if forward is None:
        return InferHead(header_length, encoding, accept or "", (), header_text)
    raw = names if names is not None and len(names) == len(headers) else [key for key, _ in headers]
    named = ((name.decode("latin-1"), value) for name, (_, value) in zip(raw, headers))
    forwarded = tuple((name, value.decode("latin-1")) for name, value in named if forward.search(name))
    return InferHead(header_length, encoding, accept or "", forwarded, header_text)


Answer = tuple[int, bytes, list[tuple[bytes, bytes]], bytes]


def log_http_request(method: str, path: bytes) -> None:
    """tritonserver's verbose line for a request received (callers check ``logging_settings.VERBOSE`` first)."""
    log.debug("HTTP request: %d %s", _METHODS.get(method, 16), path.decode("latin-1"), stacklevel=2)


def log_infer_request(model: str, version: str, path: bytes = b"") -> None:
    """``log_http_request`` for ``POST`` of ``path``, the infer route of ``model`` and ``version`` when not given."""
    log_http_request("POST", path or f"/v2/models/{model}{f'/versions/{version}' if version else ''}/infer".encode())


def _log_infer_failed(request_id: str, error: ServerError) -> None:
    """The ``Infer failed`` line (module docstring) for a request refused with ``error``, if tritonserver writes one:
    only its error callback, which answers JSON, does (callers check ``logging_settings.VERBOSE``)."""
    if infer_content_type(error) == JSON:
        logging_settings.log_infer_failed(log, request_id, error.message)


async def answer_infer(engine: Infers, head: InferHead, body: bytes, model: str, version: str, limit: int,
                       path: bytes = b"") -> Answer:
    """(status, body, extra headers, content type) for one inference request; errors become their answer.
    ``path``: the request's path as sent, for the verbose line (by default the route ``model`` and ``version`` make)."""
    if logging_settings.VERBOSE:
        log_infer_request(model, version, path)
    try:
        request = await _decode(engine, head, body, model, version, limit)
    except ServerError as error:
        error = _http_worded(await _model_first(engine, model, version, error))
        if logging_settings.VERBOSE:
            _log_infer_failed("", error)
        return error_answer(error)
    try:
        response = await engine.infer(request)
        payload, json_length = encode_infer_response(response, request)
    except ServerError as error:
        error = _http_worded(error)
        if logging_settings.VERBOSE and error.refused_before_queue:
            _log_infer_failed(request.id, error)
        return error_answer(error)
    headers: list[tuple[bytes, bytes]] = []
    if json_length is not None:
        headers.append((b"inference-header-content-length", str(json_length).encode()))
        content_type = b"application/octet-stream"
    else:
        content_type = JSON
    chosen = choose_encoding(head.accept) if head.accept else ""
    if chosen:
        payload = encode_body(payload, chosen)
        headers.append((b"content-encoding", chosen.encode()))
    return 200, payload, headers, content_type


async def _decode(engine: Infers, head: InferHead, body: bytes, model: str, version: str, limit: int) -> InferRequest:
    """The request the body makes: decompressed, its header length checked, then parsed (JSON or raw binary)."""
    if head.encoding is not None:
        body = decode_body(body, head.encoding, limit)
    if head.header_length is not None and not 0 <= head.header_length <= len(body):
        raise before_parsing(InvalidArgumentError(  # Triton's words, quoting the header as sent
            f"inference header size should be in range (0, {len(body)}), got: {head.header_text}"))
    if (head.header_length if head.header_length is not None else len(body)) == 0:
        # tritonserver's raw binary request (``http.raw``): an empty JSON header, or an empty body
        request = await decode_raw_request(engine, body, model, version, DECOUPLED)
    else:
        request = decode_infer_request(body, head.header_length, model, version)
    if head.forwarded:
        forward_headers(request.parameters, head.forwarded)  # already matched by infer_head
    return request


async def _model_first(engine: Infers, model: str, version: str, error: ServerError) -> ServerError:
    """What tritonserver answers a request whose body (or its encoding or header length) is refused with ``error``:
    it looks the model up before it reads the body (``CheckTransactionPolicy``), so an unknown model or version, a
    model that is not ready, or a decoupled model, is reported instead. Only refused requests pay for the look-up
    (a protocol worker asks the server for it)."""
    try:
        await transaction_config(engine, model, version, DECOUPLED)
    except ServerError as lookup:
        return lookup
    return error


def error_answer(error: ServerError) -> Answer:
    """The answer to an inference request that failed with ``error``, as tritonserver words and types it."""
    status, body = error_body(error)
    headers = [ACCEPTED] if isinstance(error, UnsupportedEncodingError) else []
    return status, body, headers, infer_content_type(error)


def _http_worded(error: ServerError) -> ServerError:
    """``error`` in the HTTP front end's words: the engine's refusal of a decoupled model names the gRPC stream
    that serves one, tritonserver's HTTP endpoint says ``DECOUPLED`` (found before the body is parsed)."""
    if isinstance(error, DecoupledModelError):
        return before_parsing(UnsupportedError(DECOUPLED))
    return error


class InferEndpoint:
    """ASGI middleware answering ``POST /v2/models/{m}[/versions/{v}]/infer``; passes the rest on.

    The HTTP server's own protocol (``http.protocol``) answers most infer requests before they become ASGI;
    this endpoint takes the rest (pipelined requests, escaped paths) and serves ``--http-workers``.
    """

    def __init__(self, app: ASGIApp, engine: Infers, max_input_size: int,
                 header_forward: re.Pattern[str] | None = None) -> None:
        self.app = app
        self.engine = engine
        self.max_input_size = max_input_size
        self.header_forward = header_forward

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            match = _INFER_PATH.match(scope["path"])
            if match is not None:
                await self._infer(scope, receive, send, match.group(1), match.group(2) or "")  # answer_infer logs it
                return
        if logging_settings.VERBOSE and scope["type"] == "http" and FORWARDED not in scope:
            log_http_request(scope["method"], path_as_sent(scope))
        if scope["type"] == "http" and scope["method"] != "POST" and _INFER_PATH.match(scope["path"]):
            # as tritonserver: the infer route exists, only for POST (FastAPI has no such route, so it said 404)
            await send_response(send, 405, b'{"error":"Method Not Allowed"}', [], TEXT)
            return
        await self.app(scope, receive, send)

    async def _infer(self, scope: dict, receive: Callable, send: Callable, model: str, version: str) -> None:
        """While tracing is on the engine sees a ``Frontend``, which stamps the request read and written."""
        frontend = Frontend(self.engine, "HTTP") if self.engine.tracer.enabled else None
        limit = self.max_input_size
        try:
            try:
                names = (scope["extensions"].get(HEADER_NAMES) if self.header_forward and "extensions" in scope
                         else None)
                head = infer_head(scope["headers"], limit, self.header_forward, names)
                body = await read_body(receive, limit)
            except ServerError as error:
                if logging_settings.VERBOSE:  # refused before ``answer_infer``, which logs the others
                    log_infer_request(model, version, path_as_sent(scope))
                await send_response(send, *error_answer(error))
                return
            answer = await answer_infer(self.engine if frontend is None else frontend, head, body, model, version,
                                        limit, path_as_sent(scope))
            if frontend is None:
                await send_response(send, *answer)
                return
            start = time.monotonic_ns()
            await send_response(send, *answer)
            frontend.sent(start)
        finally:
            if frontend is not None:
                frontend.done()


def path_as_sent(scope: dict) -> bytes:
    """The request's path as sent (without its query), as tritonserver's verbose line writes it."""
    return scope.get("raw_path") or scope["path"].encode()


def create_app(
    engine: Engine, *, max_input_size: int = 64 * 1024 * 1024, restrictions: dict | None = None,
    header_forward: re.Pattern[str] | None = None,
) -> ASGIApp:
    """The HTTP application for ``engine``: FastAPI routes behind the lean infer endpoint.

    ``restrictions`` (``security.parse_restrictions``) puts the restricted-API guard in front;
    ``header_forward`` is ``--http-header-forward-pattern``.
    """
    # no redirect of '/v2/x/' to '/v2/x': tritonserver answers 404, and a 307 sends some clients elsewhere
    app = FastAPI(title="Ferry", docs_url=None, redoc_url=None, openapi_url=None, redirect_slashes=False)

    @app.exception_handler(ServerError)
    async def _server_error(request: Request, error: ServerError) -> Response:
        status, body = error_body(error)
        if _TEXT_ROUTE.match(request.url.path):
            return text_response(status, body)
        return Response(body, status_code=status, media_type="application/json")

    @app.exception_handler(HTTPException)
    async def _routing_error(request: Request, error: HTTPException) -> Response:
        # unknown routes and wrong methods: Triton's {"error": ...} body (tritonclient reads 'error'), not 'detail';
        # an unknown route has no handler to set a type (text/plain), a wrong method gets its route's
        body = orjson.dumps({"error": error.detail})
        if error.status_code == 404 or _TEXT_ROUTE.match(request.url.path):
            return text_response(error.status_code, body, error.headers)
        return Response(body, status_code=error.status_code, media_type="application/json", headers=error.headers)

    @app.get("/v2/health/live")
    async def live() -> Response:
        return text_response(200 if engine.is_live() else 400)

    @app.get("/v2/health/ready")
    async def ready() -> Response:
        return text_response(200 if engine.is_ready() else 400)

    @app.get("/v2")
    async def server_metadata() -> Response:
        return json_response(engine.server_metadata())

    @app.get("/v2/models/stats")
    async def all_stats() -> Response:
        return json_response({"model_stats": engine.statistics()})

    async def _generate(request: Request, model: str, version: str, streaming: bool) -> Response:
        status, content_type, body = await answer_generate(
            engine, await request.body(), model, _route_version(version), max_input_size, streaming,
            request.headers.get("content-encoding"))
        if isinstance(body, bytes):
            return Response(body, status_code=status, media_type=content_type.decode())
        return StreamingResponse(body, status_code=status, media_type=content_type.decode())

    @app.post("/v2/models/{model}/generate")
    @app.post("/v2/models/{model}/versions/{version}/generate")
    async def generate(request: Request, model: str, version: str = "") -> Response:
        return await _generate(request, model, version, streaming=False)

    @app.post("/v2/models/{model}/generate_stream")
    @app.post("/v2/models/{model}/versions/{version}/generate_stream")
    async def generate_stream(request: Request, model: str, version: str = "") -> Response:
        return await _generate(request, model, version, streaming=True)

    @app.get("/v2/models/{model}/stats")
    @app.get("/v2/models/{model}/versions/{version}/stats")
    async def stats(model: str, version: str = "") -> Response:
        return json_response({"model_stats": engine.statistics(model, _route_version(version))})

    @app.get("/v2/models/{model}")
    @app.get("/v2/models/{model}/versions/{version}")
    async def model_metadata(model: str, version: str = "") -> Response:
        return json_response(engine.model_metadata(model, _route_version(version)))

    @app.get("/v2/models/{model}/ready")
    @app.get("/v2/models/{model}/versions/{version}/ready")
    async def model_ready(model: str, version: str = "") -> Response:
        if engine.model_ready(model, _route_version(version)):
            return text_response(200)
        return text_response(400, b'{"error":"Model version not ready"}')  # tritonserver's answer

    @app.get("/v2/models/{model}/config")
    @app.get("/v2/models/{model}/versions/{version}/config")
    async def model_config(model: str, version: str = "") -> Response:
        return json_response(engine.model_config_dict(model, _route_version(version)))

    # a repository named in the path (tritonserver's optional /v2/repository/<name>/...): the index ignores it, model
    # control refuses it
    @app.post("/v2/repository/index")
    @app.post("/v2/repository/{repository}/index")
    async def repository_index(request: Request, repository: str = "") -> Response:
        ready = (await json_body(request)).get("ready", False)
        if type(ready) is not bool:
            raise InvalidArgumentError(f"Invalid value for 'ready': expected a boolean, got {ready!r}")
        return json_response(engine.repository_index(ready))

    @app.post("/v2/repository/models/{model}/load")
    async def load(model: str, request: Request) -> Response:
        config, files = decode_load_parameters(_control_parameters(await json_body(request), "load"))
        await engine.load_model(model, config, files)
        return json_ok()

    @app.post("/v2/repository/models/{model}/unload")
    async def unload(model: str, request: Request) -> Response:
        dependents = _control_parameters(await json_body(request), "unload").get("unload_dependents", False)
        if type(dependents) is not bool:
            raise InvalidArgumentError(f"Unable to parse 'unload_dependents': expected a boolean, got {dependents!r}")
        await engine.unload_model(model, dependents)
        return json_ok()

    @app.post("/v2/repository/{repository}/models/{model}/load")
    @app.post("/v2/repository/{repository}/models/{model}/unload")
    async def named_repository_control(repository: str, model: str) -> Response:
        raise UnsupportedError("'repository_name' specification is not supported")

    from serving_pod.http.extensions import add_extension_routes

    add_extension_routes(app, engine)
    from serving_pod.http.limits import BodyLimit

    endpoint = InferEndpoint(BodyLimit(app, max_input_size), engine, max_input_size, header_forward)
    if restrictions:
        from serving_pod.security import RestrictedHttp

        return RestrictedHttp(endpoint, restrictions)
    return endpoint


def _route_version(version: str) -> str:
    """``version`` of a model route; tritonserver's routes match versions as ``[0-9]+``, so any other is an
    unknown route to it (404 "Not Found"), where the engine would say the version string cannot be parsed."""
    if version and not (version.isascii() and version.isdigit()):
        raise HTTPException(404, "Not Found")
    return version


def _control_parameters(body: dict[str, Any], action: str) -> dict[str, Any]:
    """The ``parameters`` object of a load or unload request ({} when absent)."""
    params = body.get("parameters")
    if params is None:
        return {}
    if not isinstance(params, dict):
        raise InvalidArgumentError(f"{action} 'parameters' must be a JSON object")
    return params


def decode_load_parameters(params: dict[str, Any]) -> tuple[str | None, dict[str, bytes]]:
    """Load parameters (``_control_parameters``): ``config`` (JSON string) and ``file:<path>`` (base64) overrides."""
    config = params.get("config")
    if config is not None and not isinstance(config, str):
        # tritonserver refuses a config that is not a JSON string (an object included): so do we
        raise InvalidArgumentError("invalid value type for load parameter 'config', expected a string")
    files: dict[str, bytes] = {}
    for key, value in params.items():
        if key.startswith("file:"):
            if not isinstance(value, str):
                raise InvalidArgumentError(f"load parameter '{key}' must be base64 text")
            files[key[5:]] = decode_base64(value, f"load parameter '{key}'")
        elif key != "config":
            raise InvalidArgumentError(f"unrecognized load parameter '{key}'.")  # Triton's words (gRPC)
    return config, files
