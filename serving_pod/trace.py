"""Trace extension: per-request activities, written as Triton's JSON trace file or to OpenTelemetry.

Settings follow tritonserver 2.51 (``trace_level`` OFF | TIMESTAMPS | TENSORS, ``trace_rate`` = trace
every N-th request, the N-th first, ``trace_count`` = traces left, -1 unlimited, ``log_frequency`` =
traces per ``<file>.<n>``, 0 = all in ``<file>``), globally and per model, through
``/v2[/models/{m}]/trace/setting`` and the ``TraceSetting`` RPC. As in Triton a model setting keeps only
the fields set for it and follows the global setting for the others (a null clears a field; a model with
none left uses the global setting and its sampling counter), and every update starts a new setting:
sampling counts again from zero. Enabling a setting that cannot trace (rate 0, no trace file) is
refused: "Attempting to set invalid trace setting :<reason>"; so is one whose ``trace_count`` is 0, set or kept
from a setting whose count ran out, with no reason after the colon (tritonserver's ``TraceSetting::Valid()`` also
wants a count other than 0, ``Reason()`` has none for it): perf_analyzer's ``--trace-level`` without
``--trace-count`` after a ``--trace-count`` run is refused so.

The trace file is Triton's: one JSON array of records, per trace an identity record ``{"id",
"model_name", "model_version"[, "request_id"][, "parent_id"]}`` (``parent_id``: the ensemble request of
a composing model's trace), one ``{"id", "timestamps": [{"name", "ns"}]}`` per timestamp (REQUEST_START,
QUEUE_START, COMPUTE_START, COMPUTE_INPUT_END, COMPUTE_OUTPUT_START, COMPUTE_END,
INFER_RESPONSE_COMPLETE, REQUEST_END) and, at TENSORS level, one ``{"id", "activity":
"TENSOR_QUEUE_INPUT" | "TENSOR_BACKEND_OUTPUT", "tensor": {"name", "data", "shape", "dtype"}}`` per
tensor, ``data`` and ``shape`` comma-separated strings.

Kept different on purpose (tritonserver's behaviour is junk or hides traces):
- the file is a valid JSON array after every trace (Triton writes ``<file>`` when a setting is replaced or
  at exit, and a count that reaches 0 sends its traces to ``<file>.0``); ``<file>.<n>`` only with
  ``log_frequency``;
- records are written per trace in the order they happened (Triton's order follows its threads);
- a trace at TENSORS level alone still has its identity record (Triton writes none: nameless tensors);
- INT8/UINT8 data are numbers (Triton streams them as characters), FP16/BF16 data are their values
  (Triton leaves them empty), BYTES elements are quoted text;
- the API refuses unknown settings, unknown levels and a negative rate or log frequency (Triton ignores
  the first two and wraps the last to 4294967295); a level may be a string and a rate a number (Triton
  answers 500); an empty level list means OFF (Triton ignores it); the count error has one wording
  (tritonserver's gRPC puts a space after "got:").
The front ends add Triton's timestamps around the engine's: HTTP_RECV_START/HTTP_RECV_END (the request read:
from when the front end takes the message to its decoded request) and HTTP_SEND_START/HTTP_SEND_END (the answer
written), GRPC_WAITREAD_START/GRPC_WAITREAD_END and GRPC_SEND_START/GRPC_SEND_END (one pair per response sent on
a stream). A front end that sees tracing on hands the engine a ``Frontend`` (one ``enabled`` check per request;
nothing else on the untraced path); the trace it gets is written when both the engine and the front end are done
with it. An ``--http-workers`` process stamps its HTTP_* timestamps and hands them over with the request and after
its answer (``http.workers``; ``Tracer.listeners`` tell it when tracing turns on or off).
The settings and how the flags and the API set them are ``serving_pod.trace_config``'s.

The engine asks ``Tracer.start`` for a ``Trace`` only when tracing is on (one attribute check per request
otherwise), and the trace rides on ``InferRequest.trace`` so schedulers can stamp compute times.
With ``mode=opentelemetry`` each trace becomes a span with one event per timestamp, exported over
OTLP/HTTP when the opentelemetry SDK and exporter are installed.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from serving_pod.core.errors import InvalidArgumentError
from serving_pod.trace_config import API_FIELDS, TraceConfig, updated

log = logging.getLogger("ferry.trace")
def _data(tensor: Any) -> str:
    """A tensor's elements as Triton's trace writes them: comma-separated, floats as C++ streams them."""
    data = tensor.data
    if tensor.datatype == "BYTES":
        items = (item if isinstance(item, (bytes, bytearray)) else str(item).encode() for item in data.flat)
        return ",".join('"' + bytes(item).decode("utf-8", "backslashreplace") + '"' for item in items)
    if tensor.datatype == "BOOL":
        return ",".join("1" if item else "0" for item in data.flat)
    if tensor.datatype in ("FP16", "BF16", "FP32", "FP64"):
        return ",".join(f"{float(item):g}" for item in data.flat)
    return ",".join(str(int(item)) for item in np.asarray(data).flat)


@dataclass(slots=True)
class Trace:
    """One traced request: its identity and records, in the order they happened."""

    id: int
    model_name: str
    model_version: str
    request_id: str
    parent_id: int = 0
    timestamps: bool = True
    tensors: bool = False
    setting: Any = None
    records: list[dict[str, Any]] = field(default_factory=list)
    #: the front end's protocol ("HTTP", "GRPC") when one stamps it, else ""
    frontend: str = ""
    #: who must be done with the trace before it is written: the engine, and the front end if any
    holds: int = 1

    def stamp(self, name: str, ns: int | None = None) -> None:
        if self.timestamps:
            self.records.append({"id": self.id, "timestamps": [{"name": name, "ns": time.monotonic_ns()
                                                                 if ns is None else ns}]})

    def tensor(self, activity: str, tensor: Any) -> None:
        try:
            data = _data(tensor)
        except Exception:  # noqa: BLE001 - a tensor the writer cannot read must not fail the request
            data = ""
        self.records.append({"id": self.id, "activity": activity, "tensor": {
            "name": tensor.name, "data": data, "shape": ",".join(str(d) for d in tensor.data.shape),
            "dtype": tensor.datatype}})

    def queued(self, inputs: list[Any]) -> None:
        """QUEUE_START and, at TENSORS level, each input (TENSOR_QUEUE_INPUT)."""
        self.stamp("QUEUE_START")
        if self.tensors:
            for tensor in inputs:
                self.tensor("TENSOR_QUEUE_INPUT", tensor)

    def computed(self, start_ns: int, input_end_ns: int, output_start_ns: int, end_ns: int) -> None:
        """The four compute timestamps of the execution that ran this request."""
        for name, ns in (("COMPUTE_START", start_ns), ("COMPUTE_INPUT_END", input_end_ns),
                         ("COMPUTE_OUTPUT_START", output_start_ns), ("COMPUTE_END", end_ns)):
            self.stamp(name, ns)

    def responded(self, outputs: list[Any]) -> None:
        """At TENSORS level, each output of a response (TENSOR_BACKEND_OUTPUT)."""
        if self.tensors:
            for tensor in outputs:
                self.tensor("TENSOR_BACKEND_OUTPUT", tensor)

    def responder(self, responder: Callable[[Any, bool], None]) -> Callable[[Any, bool], None]:
        """A decoupled request's ``responder`` that also records each response's outputs."""
        def traced(item: Any, final: bool) -> None:
            if item is not None and hasattr(item, "outputs"):
                self.responded(item.outputs)
            responder(item, final)

        return traced

    def identity(self) -> dict[str, Any]:
        record: dict[str, Any] = {
            "id": self.id,
            "model_name": self.model_name,
            "model_version": int(self.model_version) if self.model_version.isdigit() else self.model_version,
        }
        if self.request_id:
            record["request_id"] = self.request_id
        if self.parent_id:
            record["parent_id"] = self.parent_id
        return record

    def as_records(self) -> list[dict[str, Any]]:
        return [self.identity(), *self.records]

    def stamped(self) -> list[tuple[str, int]]:
        """(name, ns) of each timestamp."""
        return [(r["timestamps"][0]["name"], r["timestamps"][0]["ns"]) for r in self.records if "timestamps" in r]


_FRONTEND_NAMES = {"HTTP": ("HTTP_RECV_START", "HTTP_RECV_END", "HTTP_SEND_START", "HTTP_SEND_END"),
                   "GRPC": ("GRPC_WAITREAD_START", "GRPC_WAITREAD_END", "GRPC_SEND_START", "GRPC_SEND_END")}


class Frontend:
    """One request a front end received while tracing was on: the engine it calls (``infer``, ``stream_infer`` and
    ``model_config_dict`` as the engine's), its receive timestamps, and the trace the engine starts for it.

    It rides on ``InferRequest.trace`` until the engine admits the request (``Tracer.start`` takes it as the
    parent); the front end then stamps what it sends (``Tracer.sent``) and ends with ``Tracer.done``.
    """

    __slots__ = ("engine", "protocol", "send_names", "stamps", "trace", "tracer")

    def __init__(self, engine: Any, protocol: str, start_ns: int | None = None) -> None:
        self.engine = engine
        self.tracer: Tracer = engine.tracer
        self.protocol = protocol
        names = _FRONTEND_NAMES[protocol]
        self.stamps = [(names[0], time.monotonic_ns() if start_ns is None else start_ns)]
        self.send_names = names[2:]
        self.trace: Trace | None = None

    def _read(self, request: Any) -> None:
        self.stamps.append((_FRONTEND_NAMES[self.protocol][1], time.monotonic_ns()))
        request.trace = self

    async def infer(self, request: Any) -> Any:
        self._read(request)
        return await self.engine.infer(request)

    def stream_infer(self, request: Any) -> Any:
        self._read(request)
        return self.engine.stream_infer(request)

    def model_config_dict(self, name: str, version: str = "") -> Any:
        return self.engine.model_config_dict(name, version)

    def sent(self, start_ns: int) -> None:
        """A response sent, from ``start_ns`` to now."""
        self.tracer.sent(self, start_ns, time.monotonic_ns())

    def done(self) -> None:
        self.tracer.done(self)


def _check_enabling(config: TraceConfig) -> None:
    """Refuse an update that turns tracing on with a setting that samples nothing (module docstring)."""
    if config.enabled and (config.invalid or config.count == 0):
        raise InvalidArgumentError(f"Attempting to set invalid trace setting :{config.invalid}")


class _Setting:
    """One live setting (Triton's TraceSetting): its config, sampling counter and traces not yet saved."""

    __slots__ = ("buffer", "config", "retired", "seen")

    def __init__(self, config: TraceConfig) -> None:
        self.config = config
        self.seen = 0
        #: finished traces' records, saved together as ``<file>.<n>`` every ``log_frequency`` traces
        self.buffer: list[list[dict[str, Any]]] = []
        self.retired = False


class Tracer:
    """Global and per-model trace settings, sampling, and the trace sink."""

    def __init__(self, config: TraceConfig, *, otel_tracer: Any = None) -> None:
        #: the startup settings: a global setting cleared through the API (a null value) returns to them
        self.initial = config
        self.global_setting = _Setting(config)
        #: per model: the fields set for it (the rest follow the global setting) and its live setting
        self.overrides: dict[str, dict[str, Any]] = {}
        self.model_settings: dict[str, _Setting] = {}
        self.enabled = not config.invalid
        #: called with ``enabled`` after each update (``http.workers`` tells its worker processes)
        self.listeners: list[Callable[[bool], None]] = []
        self._next_id = 1
        self._lock = threading.Lock()
        self._sink = TraceSink(config, otel_tracer=otel_tracer)

    @property
    def config(self) -> TraceConfig:
        return self.global_setting.config

    def settings(self, model: str = "") -> dict[str, Any]:
        return self.model_settings.get(model, self.global_setting).config.as_dict()

    def update(self, model: str, changes: dict[str, Any]) -> dict[str, Any]:
        """Apply API changes (a None value clears a field: a model's follows the global setting again)."""
        if "trace_file" in changes:  # refused before a null could clear it
            updated(self.config, {"trace_file": changes["trace_file"]})
        with self._lock:
            if model:
                overrides = {**self.overrides.get(model, {}), **changes}
                overrides = {k: v for k, v in overrides.items() if v is not None}
                config = updated(self.config, overrides)
                _check_enabling(config)
                self._retire(self.model_settings.pop(model, None))
                self.overrides.pop(model, None)
                if overrides:
                    self.overrides[model] = overrides
                    self.model_settings[model] = _Setting(config)
            else:
                cleared = {k: getattr(self.initial, API_FIELDS[k]) for k, v in changes.items() if v is None and k in API_FIELDS}
                config = updated(self.config, {**cleared, **{k: v for k, v in changes.items() if v is not None}})
                _check_enabling(config)
                # the models' settings are made again on the new global one (a model whose own fields no longer
                # make a valid setting samples nothing, as in tritonserver)
                models = {name: updated(config, self.overrides[name]) for name in self.model_settings}
                self._retire(self.global_setting)
                self.global_setting = _Setting(config)
                for name, model_config in models.items():
                    self._retire(self.model_settings[name])
                    self.model_settings[name] = _Setting(model_config)
            self.enabled = not self.config.invalid or any(not s.config.invalid for s in self.model_settings.values())
        for listener in self.listeners:
            listener(self.enabled)
        return self.settings(model)

    def start(self, model: str, version: str, request_id: str, arrival_ns: int, parent: Trace | None = None
              ) -> Trace | None:
        """A Trace for this request if its model's setting samples it (a composing model's request of a traced
        ensemble request always is, as its child), else None. ``parent`` may be the ``Frontend`` of a request
        a front end received while tracing was on: the trace gets its receive timestamps."""
        frontend = None
        if type(parent) is Frontend:
            frontend, parent = parent, None
        with self._lock:
            if parent is not None:
                setting, parent_id = parent.setting, parent.id
            else:
                setting, parent_id = self.model_settings.get(model, self.global_setting), 0
                config = setting.config
                if config.invalid or config.count == 0:
                    return None
                setting.seen += 1
                if setting.seen % config.rate:
                    return None
                if config.count > 0:
                    setting.config = replace(config, count=config.count - 1)
            trace_id = self._next_id
            self._next_id += 1
        level = setting.config.level
        trace = Trace(trace_id, model, version, request_id, parent_id, "TIMESTAMPS" in level, "TENSORS" in level,
                      setting)
        if frontend is not None:
            trace.frontend, trace.holds = frontend.protocol, 2
            for name, ns in frontend.stamps:
                trace.stamp(name, ns)
            frontend.trace = trace
        trace.stamp("REQUEST_START", arrival_ns)
        return trace

    def finish(self, trace: Trace, response: Any = None) -> None:
        """End ``trace``: its response's outputs (a unary request), INFER_RESPONSE_COMPLETE (not for an ensemble's
        composing model: its response stays inside the server), REQUEST_END; then write it."""
        if response is not None:
            trace.responded(response.outputs)
        if not trace.parent_id:
            trace.stamp("INFER_RESPONSE_COMPLETE")
        trace.stamp("REQUEST_END")
        self._release(trace)

    def sent(self, frontend: Frontend, start_ns: int, end_ns: int) -> None:
        """A response of ``frontend``'s request sent: ``<protocol>_SEND_START`` and ``_SEND_END``."""
        trace = frontend.trace
        if trace is not None:
            trace.stamp(frontend.send_names[0], start_ns)
            trace.stamp(frontend.send_names[1], end_ns)

    def done(self, frontend: Frontend) -> None:
        """The front end is done with ``frontend``'s request: its trace is written once the engine is too."""
        trace, frontend.trace = frontend.trace, None
        if trace is not None:
            self._release(trace)

    def _release(self, trace: Trace) -> None:
        with self._lock:
            trace.holds -= 1
            last = trace.holds == 0
        if last:
            self._sink.write(trace, trace.setting)

    def _retire(self, setting: _Setting | None) -> None:
        if setting is not None:
            setting.retired = True
            self._sink.flush(setting)

    def close(self) -> None:
        for setting in (self.global_setting, *self.model_settings.values()):
            self._sink.flush(setting)
        self._sink.close()


class TraceSink:
    """Writes finished traces: one JSON array in ``file`` (valid after every trace; appended, not rewritten)
    or ``file.<n>`` every ``log_frequency`` traces of a setting; or OTel spans."""

    def __init__(self, config: TraceConfig, *, otel_tracer: Any = None) -> None:
        self.file = config.file
        self.mode = config.mode
        self._handle: Any = None
        self._index = 0
        self._lock = threading.Lock()
        self._otel: Any = otel_tracer
        if self.mode == "opentelemetry" and otel_tracer is None:
            self._otel = _otel_tracer(config)

    def write(self, trace: Trace, setting: _Setting) -> None:
        if self._otel is not None:
            _emit_span(self._otel, trace)
            return
        if not self.file:
            return
        records = trace.as_records()
        with self._lock:
            if setting.config.log_frequency > 0:
                setting.buffer.append(records)
                if setting.retired or len(setting.buffer) >= setting.config.log_frequency:
                    self._save_indexed(setting)
            else:
                self._append(records)

    def flush(self, setting: _Setting) -> None:
        with self._lock:
            if setting.buffer and self.file:
                self._save_indexed(setting)

    def _save_indexed(self, setting: _Setting) -> None:
        records = [record for trace in setting.buffer for record in trace]
        setting.buffer = []
        path = f"{self.file}.{self._index}"
        self._index += 1
        try:
            with open(path, "w", encoding="utf-8") as handle:
                json.dump(records, handle, separators=(",", ":"))
        except OSError as exc:
            log.error("cannot write trace file %s: %s", path, exc)

    def _append(self, records: list[dict[str, Any]]) -> None:
        text = ",".join(json.dumps(r, separators=(",", ":")) for r in records).encode()
        try:
            if self._handle is None:
                self._handle = open(self.file, "wb")  # noqa: SIM115 - kept open for the server's life
                self._handle.write(b"[" + text + b"]")
            else:
                self._handle.seek(-1, 2)  # over the closing bracket
                self._handle.write(b"," + text + b"]")
            self._handle.flush()
        except OSError as exc:
            log.error("cannot write trace file %s: %s", self.file, exc)

    def close(self) -> None:
        with self._lock:
            if self._handle is not None:
                self._handle.close()
                self._handle = None


def _otel_tracer(config: TraceConfig) -> Any:
    try:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError:
        log.warning("trace mode opentelemetry needs opentelemetry-sdk; traces are not exported")
        return None
    attributes = dict(item.split("=", 1) for item in config.otel_resource if "=" in item)
    provider = TracerProvider(resource=Resource.create({"service.name": "ferry", **attributes}))
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
            OTLPSpanExporter,
        )

        bsp = config.batch_span_processor
        provider.add_span_processor(BatchSpanProcessor(
            OTLPSpanExporter(endpoint=config.otel_url), max_queue_size=bsp["bsp_max_queue_size"],
            schedule_delay_millis=bsp["bsp_schedule_delay"], max_export_batch_size=bsp["bsp_max_export_batch_size"]))
    except ImportError:
        log.warning("opentelemetry-exporter-otlp-proto-http is not installed; spans stay in process")
    return provider.get_tracer("ferry")


def _emit_span(tracer: Any, trace: Trace) -> None:
    # monotonic ns -> wall-clock ns, as OpenTelemetry wants epoch times
    offset = time.time_ns() - time.monotonic_ns()
    stamps = trace.stamped()
    if not stamps:
        return
    span = tracer.start_span(
        "InferRequest",
        start_time=stamps[0][1] + offset,
        attributes={"triton.model_name": trace.model_name, "triton.model_version": trace.model_version,
                    "triton.trace_id": trace.id, "triton.trace_parent_id": trace.parent_id,
                    "triton.request_id": trace.request_id},
    )
    for name, ns in stamps:
        span.add_event(name, timestamp=ns + offset)
    span.end(end_time=stamps[-1][1] + offset)
