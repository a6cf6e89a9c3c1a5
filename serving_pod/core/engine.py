"""The protocol-neutral engine: every verb the HTTP and gRPC adapters expose, in one place.

Adapters decode -> call ``Engine.<verb>`` -> encode, and map ``ServerError`` through one table, so
readiness, validation, errors and statistics cannot differ between protocols. The engine owns the
registry (what is loaded) and the model-control policy (none / poll / explicit).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, AsyncIterator

from serving_pod.core.errors import (
    DecoupledModelError,
    InternalError,
    InvalidArgumentError,
    ServerError,
    UnavailableError,
)
from serving_pod import classification
from serving_pod.core.custom_metrics import CustomMetrics
from serving_pod.core.latency_metrics import LatencyMetricsSettings
from serving_pod.core.loop_watch import LoopWatch
from serving_pod.core import outputs, suspend
from serving_pod.core.parameters import check_request_parameters
from serving_pod.core.registry import ModelRegistry, parse_version
from serving_pod.core.types import FinalFlag, InferRequest, InferResponse
from serving_pod.repository.config import config_to_dict
from serving_pod.repository.instance_groups import MIN_COMPUTE_CAPABILITY
from serving_pod.repository.repository import ModelRepository, open_root
from serving_pod.logging_settings import LogSettings
from serving_pod.shm import SharedMemoryManager
from serving_pod.trace import Tracer
from serving_pod.trace_config import TraceConfig

log = logging.getLogger("ferry.engine")

SERVER_VERSION = "2.51.0"
#: the prefix of a ``startup_failures`` key naming a repository location that could not be read (``cli.run``)
REPOSITORY_FAILURE = "model repository "
#: the extensions this server implements (perf_analyzer needs "statistics").
EXTENSIONS = [
    "classification",
    "sequence",
    "model_repository",
    "model_repository(unload_dependents)",
    "schedule_policy",
    "model_configuration",
    "system_shared_memory",
    "cuda_shared_memory",
    "binary_tensor_data",
    "parameters",
    "statistics",
    "trace",
    "logging",
]


@dataclass(frozen=True, slots=True)
class EngineOptions:
    """Engine settings taken from the command line (tritonserver's names)."""

    model_repositories: tuple[str, ...] = ()
    model_control_mode: str = "none"  # none | poll | explicit
    load_models: tuple[str, ...] = ()
    repository_poll_secs: float = 15.0
    strict_readiness: bool = True
    exit_timeout_secs: float = 30.0
    autocomplete: bool = True
    #: the kind of instance groups that say KIND_AUTO (or no group at all): KIND_AUTO, KIND_CPU, KIND_GPU
    default_instance_kind: str = "KIND_AUTO"
    #: ``--min-supported-compute-capability``: GPUs below it are not visible to instance groups
    min_compute_capability: float = MIN_COMPUTE_CAPABILITY
    backend_config: dict[str, dict[str, str]] = field(default_factory=dict)
    server_id: str = "triton"
    #: ``--cache-config <cache>,<key>=<value>`` settings by cache name (only "local": size=<bytes>)
    cache_config: dict[str, dict[str, str]] = field(default_factory=dict)
    #: ``--rate-limit``: "off" or "execution_count"
    rate_limit: str = "off"
    #: ``--rate-limit-resource`` values, ``<name>:<count>[:<device>]``
    rate_limit_resources: tuple[str, ...] = ()
    #: client shared memory (register/unregister) is refused unless true (Triton 2.69+ default).
    allow_client_shm: bool = False
    trace: TraceConfig = field(default_factory=TraceConfig)
    #: ``--model-config-name``: each model's ``configs/<name>.pbtxt`` where it has one, else ``config.pbtxt``
    model_config_name: str = ""
    #: ``--metrics-config``: which latency metrics each model version keeps (``core.latency_metrics``)
    latency_metrics: LatencyMetricsSettings = field(default_factory=LatencyMetricsSettings)
    #: ``--model-load-retry-count``: further attempts at a version whose instances failed to load
    model_load_retry_count: int = 0


def mark_refused(error: ServerError) -> ServerError:
    """Sets ``error.refused_before_queue``: the request was refused before it was queued, because no model could
    be had for it or it did not suit the model (``Engine._admit``). A python model's BLS call words such errors as
    Triton's python backend words a request ``TRITONSERVER_ServerInferAsync`` refuses (``python_bridge``)."""
    error.refused_before_queue = True
    return error


class CancelFlag:
    """``InferRequest.cancelled``: set once when the client goes away; read with ``is_set()``.

    A plain flag (one writer, the event loop; readers poll) costs far less per request than a
    ``threading.Event``, and offers the same ``set`` / ``is_set`` that models and BLS use.
    """

    __slots__ = ("_set",)

    def __init__(self) -> None:
        self._set = False

    def set(self) -> None:
        self._set = True

    def is_set(self) -> bool:
        return self._set


class Engine:
    """Inference server core shared by every protocol adapter."""

    def __init__(self, options: EngineOptions) -> None:
        self.options = options
        self.repository = ModelRepository([open_root(p) for p in options.model_repositories])
        self.registry = ModelRegistry(
            self.repository,
            autocomplete=options.autocomplete,
            backend_config=options.backend_config,
            engine=self,
            default_instance_kind=options.default_instance_kind,
            min_compute_capability=options.min_compute_capability,
            config_name=options.model_config_name,
            latency_metrics=options.latency_metrics,
            load_retry_count=options.model_load_retry_count,
        )
        self.live = False
        self.shutting_down = False
        self.loop: asyncio.AbstractEventLoop | None = None
        self.loop_thread = 0
        self._loop_watch: LoopWatch | None = None
        self.initial_load_done = False
        self._inflight = 0
        self._idle = asyncio.Event()
        self._poller: asyncio.Task | None = None
        self.startup_failures: dict[str, str] = {}
        self.shm = SharedMemoryManager(allow=options.allow_client_shm)
        self.tracer = Tracer(options.trace)
        #: replaced by the composition root with the settings it installed (--log-* flags).
        self.log_settings = LogSettings()
        self.labels = classification.LabelCache(self._model_dir)
        self._override_dirs: dict[str, Any] = {}
        #: metric families models register (python ``pb_utils.MetricFamily``), exported on /metrics
        self.custom_metrics = CustomMetrics()

    # --- lifecycle ---------------------------------------------------------------------------
    async def start(self) -> None:
        """Load the initial models as the control mode says, then start polling if asked."""
        self.loop = asyncio.get_running_loop()
        self.loop_thread = threading.get_ident()
        #: names a model that holds the loop thread too long (an inline execution that blocks: core/loop_watch.py)
        if self._loop_watch is None:
            self._loop_watch = LoopWatch(self.loop_thread).start()
        self._idle.set()
        self.live = True
        mode = self.options.model_control_mode
        if mode in ("none", "poll"):
            self.startup_failures = await self.registry.poll()
        else:
            names = list(self.options.load_models)
            if "*" in names:
                names = sorted((await asyncio.to_thread(self.repository.scan))[0])
            self.startup_failures = await self.registry.load_many(names)
        self.initial_load_done = True
        if mode == "poll" and self.options.repository_poll_secs > 0:  # 0: no polling, as tritonserver
            self._poller = asyncio.create_task(self._poll_loop())

    async def _poll_loop(self) -> None:
        while not self.shutting_down:
            await asyncio.sleep(self.options.repository_poll_secs)
            try:
                await self.registry.poll()  # failures are logged by the registry
            except Exception:  # the poller must survive anything a repository throws
                log.exception("repository poll failed")
            self._forget_recovered()

    def _forget_recovered(self) -> None:
        """Poll mode: a start-up failure stops holding strict readiness back once it is gone (the repository reads,
        the model is READY); the registry's states say the rest. Triton, started without its repository, never
        becomes live."""
        for key in list(self.startup_failures):
            location = key.removeprefix(REPOSITORY_FAILURE)
            if location != key:
                gone = Path(location.removeprefix("file://")).expanduser().is_dir()
            else:
                gone = self.registry.is_ready(key)
            if gone:
                del self.startup_failures[key]

    async def shutdown(self) -> None:
        """Readiness false, wait for in-flight requests (up to exit-timeout), unload every model."""
        self.shutting_down = True
        if self._poller:
            self._poller.cancel()
        try:
            await asyncio.wait_for(self._idle.wait(), self.options.exit_timeout_secs)
        except asyncio.TimeoutError:
            log.warning("exit timeout: %d requests still in flight", self._inflight)
        await self.registry.close()
        self.shm.close()
        self.tracer.close()
        if self._loop_watch is not None:
            self._loop_watch.stop()
        self.live = False

    # --- health and metadata -----------------------------------------------------------------
    def is_live(self) -> bool:
        return self.live

    def is_ready(self) -> bool:
        """Live, not shutting down, initial models loaded (and, with strict readiness, all of them READY)."""
        if not self.live or self.shutting_down or not self.initial_load_done:
            return False
        if not self.options.strict_readiness:
            return True
        return not self._unusable_repository() and self.registry.all_ready()

    def _unusable_repository(self) -> bool:
        """A repository location that could not be read at start-up holds strict readiness back. A model that failed
        there does only through its state (``ModelRegistry.all_ready``), as Triton 2.51 reads its life cycle's models:
        with ``--exit-on-error=false`` a config refused at start-up leaves tritonserver ready, a version that failed
        to load does not."""
        return any(key.startswith(REPOSITORY_FAILURE) for key in self.startup_failures)

    def server_metadata(self) -> dict[str, Any]:
        return {"name": self.options.server_id, "version": SERVER_VERSION, "extensions": EXTENSIONS}

    def model_ready(self, name: str, version: str = "") -> bool:
        """Whether ``name`` (``version``) is ready; a version string Triton cannot parse is refused, not False."""
        if version:
            parse_version(version)
        return self.registry.is_ready(name, version)

    def model_metadata(self, name: str, version: str = "") -> dict[str, Any]:
        """KServe V2 model metadata; ``versions`` as Triton lists them: the version asked for, else every ready one."""
        model = self.registry.get(name, version)
        if version:
            return model.metadata([model.version_str])
        entry = self.registry.entries[name]
        versions = [m.version_str for m in sorted(entry.ready, key=lambda m: m.version)]
        return model.metadata(versions)

    def model_config(self, name: str, version: str = ""):
        """Triton's ModelConfig proto of a ready model version."""
        return self.registry.get(name, version).config

    def model_config_dict(self, name: str, version: str = "") -> dict[str, Any]:
        return config_to_dict(self.model_config(name, version))

    # --- inference ---------------------------------------------------------------------------
    async def infer(self, request: InferRequest) -> InferResponse:
        """Validate, schedule and run one request; raises ``ServerError``."""
        model, plan, trace = self._admit(request)
        latency = model.stats.latency  # the first (and only) response, success or error: Triton's histogram
        try:
            try:
                response = await self._submit(model, request)
            except ServerError:
                if latency is not None:
                    latency.responded(time.monotonic_ns() - request.arrival_ns)
                if trace is not None:
                    self.tracer.finish(trace)
                raise
            if latency is not None:
                latency.responded(time.monotonic_ns() - request.arrival_ns)
            if trace is not None:
                self.tracer.finish(trace, response)
            if response is not None and plan is not None:
                outputs.finish(response, plan, model, labels=self.labels, shm=self.shm)
            return response
        finally:
            if request.shm_held is not None:
                self._release_shm(request)

    def _admit(self, request: InferRequest) -> tuple[Any, outputs.OutputPlan | None, Any]:
        """The model, output plan and trace of a request; refuses it (stats charged) when invalid."""
        if self.shutting_down:
            raise UnavailableError("Server is shutting down, not accepting new requests")
        request.arrival_ns = time.monotonic_ns()
        try:
            return self._checked(request)
        except ServerError as error:
            mark_refused(error)
            raise

    def _checked(self, request: InferRequest) -> tuple[Any, outputs.OutputPlan | None, Any]:
        model = self.registry.get(request.model_name, request.model_version)
        if model.decoupled and request.responder is None:
            raise DecoupledModelError(
                f"model '{model.name}' is decoupled: use the gRPC streaming API (ModelStreamInfer)"
            )
        if request.parameters:  # the front end's check in Triton: refused before the model's statistics see it
            check_request_parameters(request.parameters)
        plan = None
        # a request refused here never reaches the model's scheduler: as in tritonserver, no statistic counts it
        # (nv_inference_request_failure stays as it was; "REJECTED" counts the scheduler's rejections)
        held = None  # the shared memory regions the request uses, held once it is admitted (``shm`` docstring)
        for tensor in request.inputs:
            if tensor.parameters and "shared_memory_region" in tensor.parameters:
                held = self.shm.read_inputs(request)  # before validation: it gives the tensors their data
                break
        if request.outputs:
            plan = outputs.plan_outputs(request.outputs, self.shm)
            if plan.shm_targets:
                held = (held or []) + [placement.region for placement in plan.shm_targets.values()]
        model.validate(request)
        # request.trace: an ensemble step's parent trace until here, then the request's own (schedulers stamp it);
        # a request refused above is not traced
        trace = request.trace = (
            self.tracer.start(model.name, model.version_str, request.id, request.arrival_ns, request.trace)
            if self.tracer.enabled else None
        )
        if trace is not None:
            trace.queued(request.inputs)
        request.model_version = model.version_str
        if request.cancelled is None:
            request.cancelled = CancelFlag()
        if held:
            self.shm.hold(held)
            request.shm_held = held
        return model, plan, trace

    def _release_shm(self, request: InferRequest) -> None:
        """The request has answered: the regions it held may be unregistered again."""
        held, request.shm_held = request.shm_held, None
        if held:
            self.shm.release(held)

    async def _submit(self, model: Any, request: InferRequest) -> InferResponse:
        """Hand an admitted request to its model's scheduler, counting it in flight."""
        self._inflight += 1
        self._idle.clear()
        request.queue_start_ns = time.monotonic_ns()
        try:
            return await model.scheduler.submit(request)
        except asyncio.CancelledError:
            request.cancelled.set()  # the client went away: a model still running can see it
            raise
        finally:
            self._inflight -= 1
            if not self._inflight:
                self._idle.set()

    async def stream_infer(self, request: InferRequest) -> AsyncIterator[InferResponse | ServerError]:
        """Responses of one request as they come (decoupled models send 0..N, others one).

        Every streamed response gets the same output handling as a unary one (``outputs.finish``).
        A response that fails it is yielded as its ``ServerError`` and the stream goes on, as
        Triton sends a per-response error; so is an error response the model sends without the final
        flag (more may follow). An error that is the request's last response ends the stream (raised).
        A decoupled model's final flag sent alone comes as a ``FinalFlag``, unlike a response with no outputs.
        """
        try:
            model = self.registry.get(request.model_name, request.model_version)
        except ServerError as error:
            raise mark_refused(error)
        if not model.decoupled:
            yield await self.infer(request)
            return
        queue: asyncio.Queue = asyncio.Queue()
        loop = asyncio.get_running_loop()

        def responder(item: InferResponse | ServerError | None, final: bool) -> None:
            loop.call_soon_threadsafe(queue.put_nowait, (item, final))

        request.responder = responder
        # refused here (validation, shared memory...) before the model sees it: the error ends the stream
        model, plan, trace = self._admit(request)
        if trace is not None:
            request.responder = trace.responder(responder)
        task = asyncio.create_task(self._execute_decoupled(model, request, trace))

        def failed(done: asyncio.Task) -> None:
            # a request refused by the scheduler (unknown sequence...) has no responder call: its
            # error ends the stream instead
            if not done.cancelled() and done.exception() is not None:
                error = done.exception()
                if not isinstance(error, ServerError):
                    error = InternalError(f"{type(error).__name__}: {error}")
                queue.put_nowait((error, True))

        task.add_done_callback(failed)
        final = False
        latency = model.stats.latency  # observes the first response, then None
        try:
            while not final:
                item, final = await queue.get()
                if latency is not None and item is not None:
                    latency.responded(time.monotonic_ns() - request.arrival_ns)
                    latency = None
                if isinstance(item, ServerError):
                    if final:
                        raise item  # the request's last response: the error ends its stream
                    yield item  # an error response the model sent before more (Triton streams both)
                    continue
                if item is not None:
                    item.final = final
                    if plan is not None:
                        try:
                            outputs.finish(item, plan, model, labels=self.labels, shm=self.shm)
                        except ServerError as error:
                            yield error
                            item = None
                    if item is not None:
                        yield item
                        continue
                if final:
                    yield FinalFlag(request.model_name, model.version_str, [], request.id)  # the flag alone
            try:
                await task  # the execution itself may end after its final response
            except ServerError:
                pass  # already delivered in the stream, or after the final response: nothing to add
        finally:
            if not final:
                request.cancelled.set()  # the consumer went away before the final response
            if not task.done():
                task.cancel()
            if request.shm_held is not None:
                self._release_shm(request)

    async def _execute_decoupled(self, model: Any, request: InferRequest, trace: Any) -> None:
        try:
            await self._submit(model, request)
        finally:
            if trace is not None:
                self.tracer.finish(trace)

    def infer_from_thread(self, request: InferRequest) -> InferResponse:
        """Blocking inference from a model instance thread (python BLS), or suspending inference from an
        execution the pool runs on the loop thread (``core/suspend.py``)."""
        return self._block_on(self.infer(request))

    def _block_on(self, coroutine: Any) -> Any:
        """``coroutine``'s result for synchronous model code: inside ``suspend.run`` the code suspends until it is in,
        on any other thread it blocks; elsewhere on the loop thread the call is refused (it would deadlock)."""
        if suspend.suspendable():
            return suspend.wait(coroutine)
        try:
            assert self.loop is not None
            self._refuse_on_loop_thread()
        except BaseException:
            coroutine.close()
            raise
        return suspend.block(asyncio.run_coroutine_threadsafe(coroutine, self.loop))

    def stream_from_thread(self, request: InferRequest):
        """Blocking iterator of a decoupled model's responses, from an instance thread (BLS); read inside
        ``suspend.run`` on the loop thread, each wait for the next response suspends instead.

        Any error ends the iteration (raised), one response's included: BLS outputs carry no
        classification or shared-memory parameters, so ``stream_infer`` yields none here.
        """
        assert self.loop is not None
        loop = self.loop
        if not suspend.suspendable():
            self._refuse_on_loop_thread()
        import queue as queue_module

        out: queue_module.Queue = queue_module.Queue()
        done = object()
        #: a reader suspended on the loop thread (``core/suspend.py``) waits on this for the next item
        wakeups: list[asyncio.Future] = []

        def put(item: Any) -> None:
            out.put(item)
            while wakeups:
                wakeup = wakeups.pop()
                if not wakeup.done():
                    wakeup.set_result(None)

        async def pump() -> None:
            try:
                async for response in self.stream_infer(request):
                    put(response)
            except ServerError as exc:
                put(exc)
            finally:
                put(done)

        asyncio.run_coroutine_threadsafe(pump(), loop)
        while True:
            if suspend.suspendable():
                while out.empty():
                    wakeup = loop.create_future()
                    wakeups.append(wakeup)
                    suspend.wait(wakeup)
                item = out.get_nowait()
            else:
                item = suspend.block_get(out)
            if item is done:
                return
            if isinstance(item, ServerError):
                raise item
            yield item

    def load_model_from_thread(
        self, name: str, config: str | None = None, files: dict[str, bytes] | None = None, wait: bool = True
    ) -> None:
        """Blocking ``load_model`` from a model instance thread (python ``pb_utils.load_model``)."""
        self._from_thread(self.load_model(name, config, files), "load", name, wait)

    def unload_model_from_thread(self, name: str, unload_dependents: bool = False, wait: bool = True) -> None:
        """Blocking ``unload_model`` from a model instance thread (python ``pb_utils.unload_model``)."""
        self._from_thread(self.unload_model(name, unload_dependents), "unload", name, wait)

    def _from_thread(self, coroutine: Any, verb: str, name: str, wait: bool) -> None:
        # without ``wait`` (a model acting on itself) only the mode is checked before returning
        try:
            self._check_explicit()
            assert self.loop is not None
        except BaseException:
            coroutine.close()
            raise
        if wait:
            self._block_on(coroutine)
            return
        future = asyncio.run_coroutine_threadsafe(coroutine, self.loop)

        def logged(done: Any) -> None:
            if not done.cancelled() and done.exception() is not None:
                log.error("background %s of '%s' failed: %s", verb, name, done.exception())

        future.add_done_callback(logged)

    def _refuse_on_loop_thread(self) -> None:
        # Waiting here on the loop thread would deadlock: the call needs the loop to make progress.
        if self.loop_thread == threading.get_ident():
            suspend.note_refusal()
            raise InternalError(
                "a blocking BLS call was made on the server's event loop thread; set the model's "
                "parameter ferry_execution_mode to 'thread'"
            )

    # --- statistics --------------------------------------------------------------------------
    def statistics(self, name: str = "", version: str = "") -> list[dict[str, Any]]:
        """``model_stats`` entries: every ready version, one model, or one version (Triton's errors: 400 for a
        model or version that is not serving; a version without a model is ignored, as Triton does, once it
        parses: tritonserver reads it first, so gRPC's ``name=""`` with ``version="-1"`` is refused)."""
        number = parse_version(version) if version else None
        if not name:
            models = self.registry.ready_models()
        else:
            entry = self.registry.entries.get(name)
            if entry is None or not entry.ready:
                raise InvalidArgumentError(f"requested model '{name}' is not available")
            models = [m for m in entry.ready if number is None or m.version == number]
            if not models:
                raise InvalidArgumentError(f"requested model version is not available for model '{name}'")
        return [model.stats.as_dict() for model in sorted(models, key=lambda m: (m.name, m.version))]

    # --- model repository --------------------------------------------------------------------
    def repository_index(self, ready_only: bool = False) -> list[dict[str, str]]:
        return self.registry.index(ready_only)

    async def load_model(
        self, name: str, config: str | None = None, files: dict[str, bytes] | None = None
    ) -> None:
        self._check_explicit()
        if files:
            from serving_pod.core.load_errors import PollFailed
            from serving_pod.repository.overrides import discard_override, materialize_override, safe_relative

            # refused where Triton 2.51 refuses them, at its repository poll (INTERNAL, its words), Ferry's reason
            # after them; Triton writes an absolute path inside the model directory, Ferry refuses it there too
            if config is None:
                raise PollFailed(name, "a 'config' parameter is required with file overrides")
            try:
                for path in files:
                    safe_relative(path)
            except InvalidArgumentError as error:
                raise PollFailed(name, str(error)) from None
            directory = materialize_override(name, files)
            try:
                await self.registry.load(name, config_override=config, model_dir=directory)
            except BaseException:
                discard_override(directory)
                raise
            discard_override(self._override_dirs.pop(name, None))
            self._override_dirs[name] = directory
            return
        await self.registry.load(name, config_override=config)
        if name in self._override_dirs:
            from serving_pod.repository.overrides import discard_override

            discard_override(self._override_dirs.pop(name))

    async def unload_model(self, name: str, unload_dependents: bool = False) -> None:
        """Unload ``name``; with ``unload_dependents`` an ensemble's composing models go too (Triton's extension)."""
        self._check_explicit()
        composing: list[str] = []
        entry = self.registry.entries.get(name)
        if unload_dependents and entry is not None and entry.ready:
            config = entry.ready[0].config
            composing = [step.model_name for step in config.ensemble_scheduling.step]
        await self.registry.unload(name)
        for step_model in dict.fromkeys(composing):
            step_entry = self.registry.entries.get(step_model)
            if step_entry is not None and step_entry.ready:
                await self.unload_model(step_model, unload_dependents=True)

    def _model_dir(self, model: Any) -> Any:
        """The directory a loaded model came from (for its label files)."""
        directory = getattr(model, "model_dir", None) or self._override_dirs.get(model.name)
        if directory is None:
            source = self.repository.scan()[0].get(model.name)
            directory = source.path if source is not None else None
        return directory

    # --- trace and logging extensions --------------------------------------------------------
    def trace_settings(self, model: str = "", changes: dict[str, Any] | None = None) -> dict[str, Any]:
        """Current trace settings (global, or of ``model``), after applying ``changes`` if given."""
        if model and not self.registry.is_ready(model, ""):  # Triton asks ModelIsReady: unloaded is unknown
            raise InvalidArgumentError(f"Request for unknown model : {model}")
        if changes:
            return self.tracer.update(model, changes)
        return self.tracer.settings(model)

    def log_settings_update(self, changes: dict[str, Any] | None = None) -> dict[str, Any]:
        if changes:
            return self.log_settings.update(changes)
        return self.log_settings.as_dict()

    def _check_explicit(self) -> None:
        if self.options.model_control_mode != "explicit":
            # tritonserver 2.51's words in both "none" and "poll" mode (checked against the real server)
            raise UnavailableError("explicit model load / unload is not allowed if polling is enabled")
