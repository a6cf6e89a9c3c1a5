"""The asyncio form of the Python-first API: ``AsyncEngine`` (in-process) and ``AsyncServer`` (plus HTTP/gRPC).

``AsyncEngine`` runs the same ``serving_pod.core.engine.Engine`` the servers use, on the caller's
event loop: load/unload repository models, bind Python functions as models, infer with numpy
dicts, stream decoupled responses, read statistics and metrics. ``AsyncServer`` does the same on a
``FerryServer`` so the models also answer tritonclient over HTTP and gRPC. The blocking twins
(``Engine``, ``Server``) live in ``pyapi.sync`` and run these on a background loop thread.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any, AsyncIterator, Callable, Mapping, Sequence

import numpy as np

from serving_pod.core.datatypes import wire_datatype
from serving_pod.core.engine import Engine as CoreEngine, EngineOptions
from serving_pod.core.errors import ServerError
from serving_pod.core.types import InferRequest, InferResponse, RequestedOutput, Tensor as WireTensor
from serving_pod.pyapi.binding import Bindings
from serving_pod.pyapi.config import BoundModel, ModelConfig, Tensor

Repository = str | Path | Sequence[str | Path] | None


def engine_options(
    model_repository: Repository, model_control_mode: str, load_models: Sequence[str], extra: dict[str, Any]
) -> EngineOptions:
    """EngineOptions for the Python API: explicit control, every repository model loaded, by default."""
    if model_repository is None:
        repositories: tuple[str, ...] = ()
    elif isinstance(model_repository, (str, Path)):
        repositories = (str(model_repository),)
    else:
        repositories = tuple(str(p) for p in model_repository)
    if model_control_mode not in ("none", "poll", "explicit"):
        raise ValueError(f"model_control_mode must be 'none', 'poll' or 'explicit', got {model_control_mode!r}")
    unknown = sorted(set(extra) - set(EngineOptions.__dataclass_fields__))
    if unknown:
        raise ValueError(f"unknown engine option(s) {unknown}; see serving_pod.core.engine.EngineOptions")
    loads = tuple(load_models) if model_control_mode == "explicit" and repositories else ()
    return EngineOptions(
        model_repositories=repositories, model_control_mode=model_control_mode, load_models=loads, **extra
    )


def to_request(core: CoreEngine, model: str, inputs: Mapping[str, Any], version: str, outputs: Sequence[str] | None,
               parameters: Mapping[str, Any] | None, request_id: str) -> InferRequest:
    """Numpy inputs -> an engine request. Strings go as BYTES; datatypes otherwise come from the arrays."""
    if not isinstance(inputs, Mapping):
        raise TypeError(f"inputs must be a dict of input name -> numpy array, got {type(inputs).__name__}")
    declared = core.registry.get(model, version).inputs
    tensors = []
    for name, value in inputs.items():
        array = value if isinstance(value, np.ndarray) else np.asarray(value)
        spec = declared.get(name)
        if array.dtype.kind in "SU" or (array.dtype.kind == "O"):
            array = _as_bytes(array)
            datatype = "BYTES"
        elif spec is not None and spec.datatype == "BF16" and array.dtype == np.uint16:
            datatype = "BF16"
        else:
            datatype = wire_datatype(array)
        tensors.append(WireTensor(name, datatype, array))
    requested = [RequestedOutput(name) for name in outputs] if outputs is not None else None
    return InferRequest(model, version, tensors, requested, request_id, dict(parameters or {}))


def _as_bytes(array: np.ndarray) -> np.ndarray:
    if array.dtype.kind == "O" and all(isinstance(item, bytes) for item in array.flat):
        return array
    flat = [
        item if isinstance(item, bytes) else str(item).encode("utf-8") for item in array.ravel().tolist()
    ]
    converted = np.empty(len(flat), dtype=np.object_)
    converted[:] = flat
    return converted.reshape(array.shape)


def from_response(response: InferResponse | None) -> dict[str, np.ndarray]:
    return {} if response is None else {tensor.name: tensor.data for tensor in response.outputs}


class AsyncEngine:
    """The inference engine in this process, on the running event loop (no HTTP or gRPC).

    ``model_repository``: folder(s) of Triton models (or None); with ``model_control_mode="explicit"``
    (the default) the models in ``load_models`` ("*": all) load at start and ``load``/``unload`` work.
    Other keyword arguments are ``EngineOptions`` fields (tritonserver's option names).
    """

    def __init__(self, model_repository: Repository = None, *, model_control_mode: str = "explicit",
                 load_models: Sequence[str] = ("*",), **options: Any) -> None:
        self.options = engine_options(model_repository, model_control_mode, load_models, options)
        self._core: CoreEngine | None = None
        self._bindings: Bindings | None = None
        self._metrics: Any = None

    @property
    def core(self) -> CoreEngine:
        """The underlying ``serving_pod.core.engine.Engine`` (started)."""
        if self._core is None:
            raise RuntimeError("the engine is not started: use 'async with' or await start()")
        return self._core

    # --- lifecycle ---------------------------------------------------------------------------
    async def _open(self) -> CoreEngine:
        core = CoreEngine(self.options)
        await core.start()
        return core

    async def _close(self) -> None:
        await self.core.shutdown()

    async def start(self) -> "AsyncEngine":
        if self._core is not None:
            raise RuntimeError("the engine is already started")
        self._core = await self._open()
        self._bindings = Bindings(self._core)
        return self

    async def stop(self) -> None:
        """Drain in-flight requests, unload every model (bound ones too), remove temporary folders."""
        if self._core is None:
            return
        try:
            await self._close()
        finally:
            assert self._bindings is not None
            self._bindings.close()
            self._core = self._bindings = None

    async def __aenter__(self) -> "AsyncEngine":
        return await self.start()

    async def __aexit__(self, *exc: Any) -> None:
        await self.stop()

    @property
    def startup_failures(self) -> dict[str, str]:
        """Models that failed to load at start, with the reason."""
        return dict(self.core.startup_failures)

    # --- models ------------------------------------------------------------------------------
    async def bind(self, model_name: str, infer_func: Callable[..., Any] | Sequence[Callable[..., Any]],
                   inputs: Sequence[Tensor], outputs: Sequence[Tensor], config: ModelConfig | None = None) -> BoundModel:
        """Serve ``infer_func`` as model ``model_name`` (PyTriton's ``bind``); loaded when this returns."""
        self.core
        assert self._bindings is not None
        return await self._bindings.bind(model_name, infer_func, inputs, outputs, config)

    async def unbind(self, model_name: str) -> None:
        self.core
        assert self._bindings is not None
        await self._bindings.unbind(model_name)

    async def load(self, model_name: str, config: Mapping[str, Any] | str | None = None) -> None:
        """Load or reload a repository model (explicit mode), optionally with a JSON config override."""
        import json

        override = json.dumps(config) if isinstance(config, Mapping) else config
        await self.core.load_model(model_name, override)

    async def unload(self, model_name: str) -> None:
        if self._bindings is not None and model_name in self._bindings.models:
            await self._bindings.unbind(model_name)
            return
        await self.core.unload_model(model_name)

    def models(self) -> list[dict[str, str]]:
        """Repository index rows (name, version, state, reason), bound models included."""
        return self.core.repository_index()

    def is_ready(self, model_name: str = "", version: str = "") -> bool:
        return self.core.model_ready(model_name, version) if model_name else self.core.is_ready()

    def model_config(self, model_name: str, version: str = "") -> dict[str, Any]:
        return self.core.model_config_dict(model_name, version)

    def model_metadata(self, model_name: str, version: str = "") -> dict[str, Any]:
        return self.core.model_metadata(model_name, version)

    # --- inference ---------------------------------------------------------------------------
    async def infer(self, model_name: str, inputs: Mapping[str, Any], *, version: str = "",
                    outputs: Sequence[str] | None = None, parameters: Mapping[str, Any] | None = None,
                    request_id: str = "") -> dict[str, np.ndarray]:
        """One inference: input name -> array in, output name -> array out. Raises ``ServerError``."""
        request = to_request(self.core, model_name, inputs, version, outputs, parameters, request_id)
        return from_response(await self.core.infer(request))

    async def stream(self, model_name: str, inputs: Mapping[str, Any], *, version: str = "",
                     outputs: Sequence[str] | None = None, parameters: Mapping[str, Any] | None = None,
                     request_id: str = "") -> AsyncIterator[dict[str, np.ndarray]]:
        """The responses of a decoupled model as they come (one response for other models)."""
        request = to_request(self.core, model_name, inputs, version, outputs, parameters, request_id)
        async for response in self.core.stream_infer(request):
            if isinstance(response, ServerError):  # one response failed after the model sent it
                raise response
            if response.outputs or not response.final:
                yield from_response(response)

    # --- statistics --------------------------------------------------------------------------
    def statistics(self, model_name: str = "", version: str = "") -> list[dict[str, Any]]:
        """Triton's ``model_stats`` entries (inference_count, execution_count, inference_stats...)."""
        return self.core.statistics(model_name, version)

    def metrics(self) -> str:
        """Prometheus text with Triton's ``nv_*`` metric names, as the metrics endpoint serves it."""
        from serving_pod.metrics import build_registry, render

        if self._metrics is None:
            self._metrics = build_registry(self.core, gpu_metrics=False)
        return render(self._metrics).decode()


class AsyncServer(AsyncEngine):
    """``AsyncEngine`` whose models are also served over HTTP, gRPC and metrics endpoints.

    Ports default to Triton's (8000, 8001, 8002); 0 picks free ones (read ``http_port``...).
    """

    def __init__(self, model_repository: Repository = None, *, http_port: int = 8000, grpc_port: int = 8001,
                 metrics_port: int = 8002, address: str = "127.0.0.1", model_control_mode: str = "explicit",
                 load_models: Sequence[str] = ("*",), **options: Any) -> None:
        super().__init__(model_repository, model_control_mode=model_control_mode, load_models=load_models, **options)
        self.address = address
        self._ports = (http_port, grpc_port, metrics_port)
        self._server: Any = None

    async def _open(self) -> CoreEngine:
        from serving_pod.options import ServerOptions
        from serving_pod.server import FerryServer

        http, grpc, metrics = self._ports
        server = FerryServer(ServerOptions(
            engine=self.options, http_port=http, grpc_port=grpc, metrics_port=metrics,
            http_address=self.address, grpc_address=self.address, metrics_address=self.address,
        ))
        try:
            await server.start()
        except BaseException:
            with contextlib.suppress(Exception):  # close whatever endpoints did open
                await server.stop()
            raise
        self._server = server
        return server.engine

    async def _close(self) -> None:
        await self._server.stop()

    @property
    def http_port(self) -> int:
        return self._server.http_port

    @property
    def grpc_port(self) -> int:
        return self._server.grpc_port

    @property
    def metrics_port(self) -> int:
        return self._server.metrics_port

    @property
    def http_url(self) -> str:
        """``http://host:port``, ready for ``ModelClient``."""
        return f"http://{self._host()}:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"grpc://{self._host()}:{self.grpc_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://{self._host()}:{self.metrics_port}/metrics"

    def _host(self) -> str:
        host = "127.0.0.1" if self.address in ("0.0.0.0", "") else self.address
        return f"[{host}]" if ":" in host else host
