"""Trace extension: per-request timestamps, written as JSON (Triton's trace file) or to OpenTelemetry.

Settings follow Triton (``trace_level`` OFF | TIMESTAMPS | TENSORS, ``trace_rate`` = trace one
request in N, ``trace_count`` = traces left, -1 unlimited, ``log_frequency`` = traces per file,
0 = one file), globally and per model, through ``/v2[/models/{m}]/trace/setting`` and the
``TraceSetting`` RPC. The trace file is fixed at start (``--trace-config triton,file=...``); the
API refuses to move it (writing files where a client asks is how servers get owned).

The engine asks ``Tracer.start`` for a ``Trace`` only when tracing is on (one attribute check per
request otherwise), stamps stages with ``time.monotonic_ns`` and hands it back to ``finish``.
With ``mode=opentelemetry`` each trace becomes a span with one event per stage, exported over
OTLP/HTTP when the opentelemetry SDK and exporter are installed.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Any

from serving_pod.core.errors import InvalidArgumentError, UnsupportedError

log = logging.getLogger("ferry.trace")
LEVELS = ("OFF", "TIMESTAMPS", "TENSORS")


@dataclass(frozen=True, slots=True)
class TraceConfig:
    """Trace settings; ``level`` is a tuple of Triton level names (``("OFF",)`` = disabled)."""

    level: tuple[str, ...] = ("OFF",)
    rate: int = 1000
    count: int = -1
    log_frequency: int = 0
    file: str = ""
    mode: str = "triton"  # triton | opentelemetry
    otel_url: str = "http://localhost:4318/v1/traces"
    otel_resource: tuple[str, ...] = ()

    @property
    def enabled(self) -> bool:
        return self.level != ("OFF",) and bool(self.level)

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "trace_level": list(self.level),
            "trace_rate": str(self.rate),
            "trace_count": str(self.count),
        }
        if self.mode == "triton":
            out["log_frequency"] = str(self.log_frequency)
            out["trace_file"] = self.file
        out["trace_mode"] = self.mode
        return out


def parse_trace_config(values: list[str], base: TraceConfig | None = None) -> TraceConfig:
    """``--trace-config [<mode>,]<key>=<value>`` values (tritonserver's syntax) into a TraceConfig."""
    config = base or TraceConfig()
    for raw in values:
        mode, _, setting = raw.partition(",") if "," in raw else ("", "", raw)
        key, sep, value = setting.partition("=")
        if not sep:
            raise ValueError(f"invalid --trace-config '{raw}': expected [<mode>,]<setting>=<value>")
        key = key.strip().replace("_", "-")
        if mode == "opentelemetry":
            if key == "url":
                config = replace(config, otel_url=value)
            elif key == "resource":
                config = replace(config, otel_resource=config.otel_resource + (value,))
            continue  # other exporter knobs are accepted and ignored
        if mode not in ("", "triton"):
            raise ValueError(f"invalid --trace-config '{raw}': unknown trace mode '{mode}'")
        if key == "mode":
            if value not in ("triton", "opentelemetry"):
                raise ValueError(f"invalid trace mode '{value}': expected triton or opentelemetry")
            config = replace(config, mode=value)
        elif key == "file":
            config = replace(config, file=value)
        else:
            config = _updated(config, {_API_KEYS.get(key, key): value}, from_cli=True)
    return config


_API_KEYS = {"level": "trace_level", "rate": "trace_rate", "count": "trace_count", "log-frequency": "log_frequency"}


def _int(key: str, value: Any, low: int) -> int:
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise InvalidArgumentError(f"Unable to parse '{key}', got: {value}") from None
    if number < low or number > 2**31 - 1:
        raise InvalidArgumentError(f"Unable to parse '{key}', value is out of range [ {low}, {2**31 - 1} ], got: {value}")
    return number


def _updated(config: TraceConfig, changes: dict[str, Any], *, from_cli: bool = False) -> TraceConfig:
    """``config`` with API-style changes applied; raises InvalidArgumentError / UnsupportedError."""
    for key, value in changes.items():
        if key == "trace_file":
            if not from_cli and value is not None and value != config.file:
                raise UnsupportedError("trace file location can not be updated through network protocol")
        elif key == "trace_level":
            if isinstance(value, str):
                levels = [value]
            elif isinstance(value, (list, tuple)) and all(isinstance(lv, str) for lv in value):
                levels = list(value)
            else:
                raise InvalidArgumentError(
                    f"Unable to parse 'trace_level': expected a string or an array of strings, got {value!r}"
                )
            if from_cli:
                levels = [lv.upper() for lv in levels]
            if any(lv not in LEVELS for lv in levels):
                raise InvalidArgumentError(f"invalid trace level {levels}: expected OFF, TIMESTAMPS or TENSORS")
            if "OFF" in levels and len(levels) > 1:
                raise InvalidArgumentError("Expect only one trace level 'OFF' is specified")
            config = replace(config, level=tuple(dict.fromkeys(levels)) or ("OFF",))
        elif key == "trace_rate":
            config = replace(config, rate=max(1, _int(key, value, 0)))
        elif key == "trace_count":
            config = replace(config, count=_int(key, value, -1))
        elif key == "log_frequency":
            config = replace(config, log_frequency=_int(key, value, 0))
        elif key != "trace_mode":
            raise InvalidArgumentError(f"unknown trace setting '{key}'")
    return config


@dataclass(slots=True)
class Trace:
    """One traced request: identity and (stage, monotonic ns) pairs."""

    id: int
    model_name: str
    model_version: str
    request_id: str
    timestamps: list[tuple[str, int]] = field(default_factory=list)

    def stamp(self, name: str, ns: int | None = None) -> None:
        self.timestamps.append((name, time.monotonic_ns() if ns is None else ns))

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "model_name": self.model_name,
            "model_version": int(self.model_version) if self.model_version.isdigit() else self.model_version,
            "request_id": self.request_id,
            "timestamps": [{"name": n, "ns": ns} for n, ns in self.timestamps],
        }


class Tracer:
    """Global and per-model trace settings, sampling, and the trace sinks."""

    def __init__(self, config: TraceConfig, *, otel_tracer: Any = None) -> None:
        self.config = config
        #: the startup settings: a global setting cleared through the API (a null value) returns to them
        self.initial = config
        self.models: dict[str, TraceConfig] = {}
        self.enabled = config.enabled
        self._seen: dict[str, int] = {}
        self._next_id = 1
        self._sink = TraceSink(config, otel_tracer=otel_tracer)

    def settings(self, model: str = "") -> dict[str, Any]:
        return self.models.get(model, self.config).as_dict() if model else self.config.as_dict()

    def update(self, model: str, changes: dict[str, Any]) -> dict[str, Any]:
        """Apply API changes (a None value resets a model's setting to the global one)."""
        if model:
            current = self.models.get(model, self.config)
            if any(v is None for v in changes.values()):
                current = _updated(current, {k: getattr(self.config, _FIELD[k]) for k, v in changes.items()
                                             if v is None and k in _FIELD})
            self.models[model] = _updated(current, {k: v for k, v in changes.items() if v is not None})
        else:
            # as Triton: a null clears the setting back to its startup value (it was ignored)
            cleared = {k: getattr(self.initial, _FIELD[k]) for k, v in changes.items() if v is None and k in _FIELD}
            self.config = _updated(self.config, {**cleared, **{k: v for k, v in changes.items() if v is not None}})
        self.enabled = self.config.enabled or any(c.enabled for c in self.models.values())
        return self.settings(model)

    def start(self, model: str, version: str, request_id: str, arrival_ns: int) -> Trace | None:
        """A Trace for this request if its model's settings sample it, else None."""
        config = self.models.get(model, self.config)
        if not config.enabled or config.count == 0:
            return None
        seen = self._seen.get(model, 0) + 1
        self._seen[model] = seen
        if (seen - 1) % config.rate:
            return None
        if config.count > 0:
            config = replace(config, count=config.count - 1)
            if model in self.models:
                self.models[model] = config
            else:
                self.config = config
        trace = Trace(self._next_id, model, version, request_id)
        self._next_id += 1
        trace.stamp("REQUEST_START", arrival_ns)
        return trace

    def finish(self, trace: Trace) -> None:
        trace.stamp("REQUEST_END")
        self._sink.write(trace, self.models.get(trace.model_name, self.config))

    def close(self) -> None:
        self._sink.close()


_FIELD = {"trace_level": "level", "trace_rate": "rate", "trace_count": "count", "log_frequency": "log_frequency"}


class TraceSink:
    """Writes finished traces: a JSON array file (rotated every ``log_frequency`` traces) or OTel spans."""

    def __init__(self, config: TraceConfig, *, otel_tracer: Any = None) -> None:
        self.file = config.file
        self.mode = config.mode
        self._buffer: list[dict[str, Any]] = []
        self._written: list[dict[str, Any]] = []
        self._index = 0
        self._lock = threading.Lock()
        self._otel: Any = otel_tracer
        if self.mode == "opentelemetry" and otel_tracer is None:
            self._otel = _otel_tracer(config)

    def write(self, trace: Trace, config: TraceConfig) -> None:
        if self._otel is not None:
            _emit_span(self._otel, trace)
            return
        if not self.file:
            return
        with self._lock:
            if config.log_frequency > 0:
                self._buffer.append(trace.as_dict())
                if len(self._buffer) >= config.log_frequency:
                    self._dump(f"{self.file}.{self._index}", self._buffer)
                    self._index += 1
                    self._buffer = []
            else:
                self._written.append(trace.as_dict())
                self._dump(self.file, self._written)

    @staticmethod
    def _dump(path: str, traces: list[dict[str, Any]]) -> None:
        try:
            with open(path, "w", encoding="utf-8") as handle:
                json.dump(traces, handle)
        except OSError as exc:
            log.error("cannot write trace file %s: %s", path, exc)

    def close(self) -> None:
        with self._lock:
            if self._buffer and self.file:
                self._dump(f"{self.file}.{self._index}", self._buffer)
                self._buffer = []


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
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=config.otel_url)))
    except ImportError:
        log.warning("opentelemetry-exporter-otlp-proto-http is not installed; spans stay in process")
    return provider.get_tracer("ferry")


def _emit_span(tracer: Any, trace: Trace) -> None:
    # monotonic ns -> wall-clock ns, as OpenTelemetry wants epoch times
    offset = time.time_ns() - time.monotonic_ns()
    start = trace.timestamps[0][1] + offset
    end = trace.timestamps[-1][1] + offset
    span = tracer.start_span(
        "InferRequest",
        start_time=start,
        attributes={"triton.model_name": trace.model_name, "triton.model_version": trace.model_version,
                    "triton.trace_id": trace.id, "triton.request_id": trace.request_id},
    )
    for name, ns in trace.timestamps:
        span.add_event(name, timestamp=ns + offset)
    span.end(end_time=end)
