"""The composition root: builds the engine, metrics and protocol servers, and runs their lifecycle.

Once the models have loaded it logs tritonserver's start-up tables (``Model | Version | Status``, then ``Option |
Value`` with the values Ferry has) and, where a model failed, ``Internal: failed to load all models``, all before
the ``Started ...`` lines, in tritonserver 2.51's order and layout.

``FerryServer`` is used both by the ``ferry-server`` command and in-process by tests (ports 0 give
free ports, read back from ``http_port`` / ``grpc_port`` / ``metrics_port``). On SIGTERM the server
turns not-ready, stops taking new inferences, drains in-flight ones up to ``--exit-timeout-secs``,
unloads every model (python models' ``finalize`` runs), and exits 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import re
import signal
from typing import Any

import uvicorn

from serving_pod import logging_settings
from serving_pod.core.engine import EXTENSIONS, SERVER_VERSION, Engine
from serving_pod.http.app import create_app
from serving_pod.http.limits import GuardedHttpToolsProtocol
from serving_pod.logging_settings import LogSettings, installed_log_settings
from serving_pod.metrics import build_registry, render
from serving_pod.options import ServerOptions
from serving_pod.sockets import bind_socket

log = logging.getLogger("ferry.server")


#: seconds an idle HTTP/1.1 keep-alive connection stays open after its last response
KEEP_ALIVE_S = 75
#: allocations (less deallocations) of tracked objects between two young-generation collections, for CPython's
#: 700: a request's objects are freed by their reference counts once it is answered, but with many requests in
#: flight (16 ensemble requests hold about 700) the count passes 700 over and over, and each young collection
#: then walks every live request's objects to find nothing (about 6.6 us per ``double_ensemble`` request at c=16)
GC_YOUNG_THRESHOLD = 10_000


def _uvicorn(app: Any, http: Any = "httptools", **extra: Any) -> uvicorn.Server:
    config = uvicorn.Config(
        app,
        loop="none",
        lifespan="off",
        http=http,
        **extra,
        log_level="warning",
        access_log=False,
        timeout_keep_alive=KEEP_ALIVE_S,
        timeout_graceful_shutdown=5,
        # per-request costs nobody here needs: X-Forwarded-* rewriting and a "server" header
        proxy_headers=False,
        server_header=False,
    )
    server = uvicorn.Server(config)
    # we own SIGTERM/SIGINT (drain first, then close): uvicorn must not capture them
    server.capture_signals = contextlib.nullcontext  # type: ignore[method-assign,assignment]
    return server


#: tritonserver 2.51's metrics endpoint: ``/metrics`` with an optional trailing slash (its ``api_regex_``)
METRICS_PATHS = ("/metrics", "/metrics/")
#: the content type tritonserver's metrics endpoint gives a scrape (no ``version=0.0.4``; Prometheus reads the
#: text format by default)
METRICS_CONTENT_TYPE = b"text/plain; charset=utf-8"


def metrics_app(registry: Any):
    """A tiny ASGI app serving ``GET /metrics`` as tritonserver's metrics endpoint serves it: ``/metrics/`` too, the
    scrape typed ``METRICS_CONTENT_TYPE``, any other method answered 405 ``{"error":"Method Not Allowed"}`` (typed
    text/plain, as there). Kept different on purpose: tritonserver answers 200 with an empty body on any other path
    (``/``, ``/foo``), Ferry 404."""

    async def app(scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        if logging_settings.VERBOSE:  # tritonserver's metrics endpoint logs its requests as its HTTP endpoint does
            from serving_pod.http.app import log_http_request

            log_http_request(scope["method"], scope.get("raw_path") or scope["path"].encode())
        if scope["method"] != "GET":
            status, body, content_type = 405, b'{"error":"Method Not Allowed"}', b"text/plain"
        elif scope["path"] in METRICS_PATHS:
            status, body, content_type = 200, render(registry), METRICS_CONTENT_TYPE
        else:
            status, body, content_type = 404, b"", b"text/plain"
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", content_type), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})

    return app


def table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    """Rows as tritonserver's start-up tables print them: columns as wide as their widest line, a cell of several
    lines on as many rows (the other cells blank), a rule above and below the header and at the end."""
    lines: list[tuple[str, ...]] = []
    for row in rows:
        cells = [cell.splitlines() or [""] for cell in row]
        lines += [tuple(cell[i] if i < len(cell) else "" for cell in cells) for i in range(max(map(len, cells)))]
    widths = [max([len(line[column]) for line in [header, *lines]]) for column in range(len(header))]
    rule = "+" + "+".join("-" * (width + 2) for width in widths) + "+"

    def text(line: tuple[str, ...]) -> str:
        return "|" + "|".join(f" {cell:<{width}} " for cell, width in zip(line, widths)) + "|"

    return "\n".join([rule, text(header), rule, *map(text, lines), rule]) + "\n"


def model_rows(engine: Engine) -> list[tuple[str, str, str]]:
    """tritonserver's model table: every version it tried to load, by name, with its state (and why, if any); a
    model refused before any version was tried has no row, as there."""
    rows = []
    for name, entry in sorted(engine.registry.entries.items()):
        for version, state in sorted(entry.versions.items()):
            status = f"{state.state}: {state.reason}" if state.reason else state.state
            rows.append((name, str(version), status))
    return rows


def option_rows(options: ServerOptions) -> list[tuple[str, str]]:
    """tritonserver's options table, with Ferry's values; no ``pinned_memory_pool_byte_size``: Ferry has no pinned
    memory pool (the flag is accepted with no effect)."""
    engine = options.engine
    return [
        ("server_id", engine.server_id),
        ("server_version", SERVER_VERSION),
        ("server_extensions", " ".join(EXTENSIONS)),
        *((f"model_repository_path[{index}]", path) for index, path in enumerate(engine.model_repositories)),
        ("model_control_mode", f"MODE_{engine.model_control_mode.upper()}"),
        ("strict_model_config", str(int(not engine.autocomplete))),
        ("model_config_name", engine.model_config_name),
        ("rate_limit", "EXEC_COUNT" if engine.rate_limit == "execution_count" else "OFF"),
        ("min_supported_compute_capability", f"{engine.min_compute_capability:.1f}"),
        ("strict_readiness", str(int(engine.strict_readiness))),
        ("exit_timeout", f"{engine.exit_timeout_secs:g}"),
        ("cache_enabled", str(int(bool(engine.cache_config)))),
    ]


def _pattern(text: str) -> re.Pattern[str] | None:
    """A header-forward pattern compiled, or None when the flag is unset."""
    return re.compile(text) if text else None


def http_transport(options: ServerOptions, engine: Engine, header_forward: re.Pattern[str] | None) -> dict[str, Any]:
    """uvicorn settings for the HTTP endpoint: Ferry's protocol (limits, direct infer path), TLS when configured."""
    import ssl

    from serving_pod.http.protocol import http_protocol

    settings: dict[str, Any] = {"http": http_protocol(
        engine=engine, max_input_size=options.http_max_input_size,
        max_header_bytes=options.http_max_header_size, read_timeout_s=options.http_read_timeout_secs,
        restrictions=options.http_restrictions, header_forward=header_forward,
    )}
    tls = options.http_tls
    if tls is not None:
        settings.update(
            ssl_certfile=tls.cert,
            ssl_keyfile=tls.key,
            ssl_ca_certs=tls.ca or None,
            ssl_cert_reqs=ssl.CERT_REQUIRED if tls.mutual else ssl.CERT_NONE,
        )
    return settings


def grpc_credentials(tls: Any) -> Any:
    """``grpc.ServerCredentials`` for TLS (mutual TLS requires the client certificate)."""
    import grpc

    def read(path: str) -> bytes:
        with open(path, "rb") as handle:
            return handle.read()

    return grpc.ssl_server_credentials(
        [(read(tls.key), read(tls.cert))],
        root_certificates=read(tls.ca) if tls.ca else None,
        require_client_auth=tls.mutual,
    )


class FerryServer:
    """Engine + HTTP + gRPC + metrics endpoints, started and stopped together."""

    def __init__(self, options: ServerOptions) -> None:
        self.options = options
        self.engine = Engine(options.engine)
        self.engine.log_settings = installed_log_settings() or LogSettings(
            file=options.log_file, info=options.log_info, warning=options.log_warning,
            error=options.log_error, verbose=options.log_verbose, format=options.log_format,
        )
        self.http_port = 0
        self.grpc_port = 0
        self.metrics_port = 0
        self._http: uvicorn.Server | None = None
        self._metrics: uvicorn.Server | None = None
        self._grpc: Any = None
        self._bridge: Any = None
        self._workers: list[Any] = []
        self._tasks: list[asyncio.Task] = []
        self._stopped = asyncio.Event()

    async def start(self, *, load_models: bool = True) -> None:
        """Open the endpoints, then load the models (live at once, ready when loading is done)."""
        options = self.options
        if options.allow_http:
            sock = bind_socket(options.http_address, options.http_port, reuse_port=options.http_workers > 1 or options.reuse_http_port)
            self.http_port = sock.getsockname()[1]
            header_forward = _pattern(options.http_header_forward)
            app = create_app(
                self.engine, max_input_size=options.http_max_input_size, restrictions=options.http_restrictions,
                header_forward=header_forward,
            )
            self._http = _uvicorn(app, **http_transport(options, self.engine, header_forward))
            self._tasks.append(asyncio.create_task(self._http.serve(sockets=[sock])))
            if options.http_workers > 1:
                # extra protocol processes accept on the same port and forward to this app and engine
                from serving_pod.http import workers

                self._bridge = workers.Bridge(app, self.engine)
                await self._bridge.start()
                self._workers = workers.spawn_workers(
                    options.http_workers - 1, options.http_address, self.http_port, self._bridge.path,
                    max_input_size=options.http_max_input_size, max_header_bytes=options.http_max_header_size,
                    read_timeout_s=options.http_read_timeout_secs, restrictions=options.http_restrictions,
                    header_forward=options.http_header_forward, log_file=self.engine.log_settings.file,
                )
                # ready means every process takes its share of new connections
                await self._bridge.wait_for_workers(len(self._workers), timeout=60.0)
        if options.allow_grpc:
            await self._start_grpc(options)
        if options.allow_metrics:
            registry = build_registry(
                self.engine,
                gpu_metrics=options.allow_gpu_metrics,
                cpu_metrics=options.allow_cpu_metrics,
            )
            sock = bind_socket(options.metrics_address, options.metrics_port)
            self.metrics_port = sock.getsockname()[1]
            # the HTTP endpoint's header-size and read-deadline limits: the metrics port faces the same clients
            guarded = type("FerryMetricsProtocol", (GuardedHttpToolsProtocol,), {
                "max_header_bytes": options.http_max_header_size, "read_timeout_s": options.http_read_timeout_secs})
            self._metrics = _uvicorn(metrics_app(registry), http=guarded)
            self._tasks.append(asyncio.create_task(self._metrics.serve(sockets=[sock])))
        for server in (self._http, self._metrics):
            while server is not None and not server.started:
                await asyncio.sleep(0.005)
        if load_models:
            await self.engine.start()
            log.info("\n%s", table(("Model", "Version", "Status"), model_rows(self.engine)), extra={"table": True})
            log.info("\n%s", table(("Option", "Value"), option_rows(options)), extra={"table": True})
            if self.engine.startup_failures:
                log.error("Internal: failed to load all models")  # tritonserver's words
        if options.gc_freeze:
            # Everything alive after start-up (modules, models) lives as long as the server: move it out of
            # the collector's reach, so full collections under load scan only request garbage (tail latency).
            gc.collect()
            gc.freeze()
            gc.set_threshold(GC_YOUNG_THRESHOLD, *gc.get_threshold()[1:])
        # tritonserver's lines, in its order, one per service it started (scripts wait for them)
        if options.allow_grpc:
            log.info("Started GRPCInferenceService at %s:%d", options.grpc_address, self.grpc_port)
        if options.allow_http:
            log.info("Started HTTPService at %s:%d", options.http_address, self.http_port)
        if options.allow_metrics:
            log.info("Started Metrics Service at %s:%d", options.metrics_address, self.metrics_port)

    async def _start_grpc(self, options: ServerOptions) -> None:
        """The gRPC front end ``--grpc-server`` names, on the same services and limits either way."""
        limits: dict[str, Any] = {
            "restrictions": options.grpc_restrictions,
            "max_message_size": options.grpc_max_message_size,
            "max_metadata_size": options.grpc_max_metadata_size,
            "keepalive": options.grpc_keepalive,
            "response_compression": options.grpc_response_compression,
            "header_forward": _pattern(options.grpc_header_forward),
        }
        tls = options.grpc_tls
        if options.grpc_server == "native":
            from serving_pod.grpc.native import server_ssl_context
            from serving_pod.grpc.service import create_native_server

            ssl_context = None if tls is None else server_ssl_context(tls.cert, tls.key, tls.ca, tls.mutual)
            self._grpc = create_native_server(self.engine, ssl_context=ssl_context, **limits)
            self.grpc_port = await self._grpc.start(options.grpc_address, options.grpc_port,
                                                    reuse_port=options.reuse_grpc_port)
            return
        from serving_pod.grpc.service import create_server

        self._grpc = create_server(self.engine, reuse_port=options.reuse_grpc_port, **limits)
        host = f"[{options.grpc_address}]" if ":" in options.grpc_address else options.grpc_address
        address = f"{host}:{options.grpc_port}"
        if tls is not None:
            self.grpc_port = self._grpc.add_secure_port(address, grpc_credentials(tls))
        else:
            self.grpc_port = self._grpc.add_insecure_port(address)
        if self.grpc_port == 0:
            raise OSError(f"failed to bind gRPC port {options.grpc_port} on {options.grpc_address}")
        await self._grpc.start()

    async def stop(self) -> None:
        """Graceful shutdown: not ready -> drain -> close endpoints -> unload models."""
        await self.engine.shutdown()
        if self._grpc is not None:
            await self._grpc.stop(grace=1.0)
        for server in (self._http, self._metrics):
            if server is not None:
                server.should_exit = True
        if self._workers:
            from serving_pod.http import workers

            await asyncio.to_thread(workers.stop_workers, self._workers)
            self._workers = []
        if self._bridge is not None:
            await self._bridge.close()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        self._stopped.set()

    def install_signal_handlers(self) -> None:
        """Route SIGTERM/SIGINT to ``wait_for_signal`` (before ``start``, so no signal is missed)."""
        loop = asyncio.get_running_loop()
        self._signalled = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._signalled.set)

    async def wait_for_signal(self) -> None:
        """Return when SIGTERM or SIGINT arrives."""
        await self._signalled.wait()
        log.info("signal received: draining in-flight requests and unloading models")
