"""Trace settings: ``TraceConfig`` and how tritonserver 2.51 reads them from its flags and its trace API.

``parse_trace_config`` reads ``--trace-config [<mode>,]<setting>=<value>`` (and the deprecated ``--trace-*`` flags,
turned into such values by the CLI): Triton's level aliases (MIN, MAX, ON, TRUE = TIMESTAMPS, FALSE = OFF), repeated
levels ORed as tritonserver does (a deprecated ``--trace-level`` OFF turns tracing off whatever else is given, a
``--trace-config level=OFF`` does not: tritonserver's reading); a mode is read in any case and format errors are
tritonserver's words. In opentelemetry mode the settings also report the batch span processor's
``bsp_max_export_batch_size``, ``bsp_schedule_delay`` and ``bsp_max_queue_size`` (tritonserver's defaults,
OTEL_BSP_* or ``--trace-config opentelemetry,bsp_...``), which the exporter uses.

``updated`` applies the trace API's changes (``/v2[/models/{m}]/trace/setting``, the ``TraceSetting`` RPC) with
tritonserver's range checks and words; ``serving_pod.trace`` keeps the settings and samples requests.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import Any

from serving_pod.core.errors import InvalidArgumentError, UnsupportedError

LEVELS = ("OFF", "TIMESTAMPS", "TENSORS")
#: tritonserver's command-line level words (lower-cased there), beyond the level names
_CLI_LEVELS = {"MIN": "TIMESTAMPS", "MAX": "TIMESTAMPS", "ON": "TIMESTAMPS", "TRUE": "TIMESTAMPS", "FALSE": "OFF"}
_UINT32_MAX = 2**32 - 1
_INT32_MAX = 2**31 - 1
#: OpenTelemetry batch span processor settings as tritonserver reports them (this order), with their environment
#: variables and defaults
_BSP = {"bsp_max_export_batch_size": ("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", 512),
        "bsp_schedule_delay": ("OTEL_BSP_SCHEDULE_DELAY", 5000),
        "bsp_max_queue_size": ("OTEL_BSP_MAX_QUEUE_SIZE", 2048)}
_TRACE_CONFIG_FORMAT = "--trace-config option format is '<trace mode>,<setting>=<value>'. Got "


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
    #: (name, value) of the ``_BSP`` settings given (``--trace-config opentelemetry,bsp_...`` or OTEL_BSP_*)
    otel_bsp: tuple[tuple[str, int], ...] = ()

    @property
    def enabled(self) -> bool:
        return self.level != ("OFF",) and bool(self.level)

    @property
    def invalid(self) -> str:
        """Why this setting samples nothing (Triton's reasons), or ""."""
        if not self.enabled:
            return "tracing is disabled"
        if self.rate == 0:
            return "sample rate must be non-zero"
        if self.mode == "triton" and not self.file:
            return "trace file name is not given"
        return ""

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
        if self.mode == "opentelemetry":
            out.update((key, str(value)) for key, value in self.batch_span_processor.items())
        return out

    @property
    def batch_span_processor(self) -> dict[str, int]:
        """The ``_BSP`` settings, tritonserver's defaults where none was given."""
        return {**{key: default for key, (_, default) in _BSP.items()}, **dict(self.otel_bsp)}


def parse_trace_config(values: list[str], base: TraceConfig | None = None) -> TraceConfig:
    """``--trace-config [<mode>,]<key>=<value>`` values (tritonserver's syntax) into a TraceConfig; ValueError in
    tritonserver's words. As tritonserver, the mode before the comma and the value of ``mode=`` are read in any case."""
    config = base or TraceConfig()
    levels: list[str] = []
    batch_span_processor: dict[str, str] = {}  # read only in opentelemetry mode, as tritonserver
    for raw in values:
        mode, key, value = _trace_config_setting(raw)
        key = key.strip().replace("_", "-")
        if mode == "opentelemetry":
            if key.replace("-", "_") in _BSP:
                batch_span_processor[key.replace("-", "_")] = value
            else:
                config = _otel_setting(config, key, value)
            continue
        if key == "mode":
            config = replace(config, mode=_trace_mode(value))
        elif key == "file":
            config = replace(config, file=value)
        elif key == "level":  # tritonserver ORs repeated levels; OFF adds nothing here (unlike --trace-level)
            levels.append(cli_level(value))
        else:
            if key in _API_KEYS:
                _cli_int(value)
            config = updated(config, {_API_KEYS.get(key, key): value}, from_cli=True)
    if levels:
        chosen = tuple(level for level in ("TIMESTAMPS", "TENSORS") if level in levels)
        config = replace(config, level=chosen or ("OFF",))
    return _with_batch_span_processor(config, batch_span_processor) if config.mode == "opentelemetry" else config


def cli_level(word: str) -> str:
    """A command-line trace level word (any case, tritonserver's aliases too) as its level name."""
    level = _CLI_LEVELS.get(word.strip().upper(), word.strip().upper())
    if level not in LEVELS:
        raise ValueError(f"invalid value for trace level option: {word.lower()}")
    return level


def _trace_config_setting(raw: str) -> tuple[str, str, str]:
    """``(mode, setting, value)`` of one ``--trace-config`` value: mode "" (global), "triton" or "opentelemetry"."""
    mode, comma, setting = raw.partition(",") if "," in raw else ("", "", raw)
    if comma and not mode:
        raise ValueError("No trace mode specified. --trace-config option format is <trace mode>,<setting>=<value> "
                         f"or <setting>=<value>. Got {raw}")
    key, sep, value = setting.partition("=")
    if not sep or not key or not value:
        raise ValueError(_TRACE_CONFIG_FORMAT + raw)
    return _trace_mode(mode) if mode else "", key, value


def _trace_mode(word: str) -> str:
    mode = word.lower()
    if mode not in ("triton", "opentelemetry"):
        raise ValueError(f'invalid value for trace mode option: {mode}. Available options are "triton" and '
                         '"opentelemetry"')
    return mode


def _cli_int(value: str, high: int = _INT32_MAX) -> int:
    """An integer flag value, refused in tritonserver's words (its range checks come after, ``_updated``)."""
    try:
        number = int(value)
    except ValueError:
        raise ValueError(f"Invalid option value. Got {value}") from None
    if number > high:
        raise ValueError(f"Provided option value is out of bound. Got {value}")
    return number


def _otel_setting(config: TraceConfig, key: str, value: str) -> TraceConfig:
    """One ``--trace-config opentelemetry,<key>=<value>``; exporter knobs Ferry lacks are accepted and ignored."""
    if key == "url":
        return replace(config, otel_url=value)
    if key == "resource":
        return replace(config, otel_resource=config.otel_resource + (value,))
    return config


def _with_batch_span_processor(config: TraceConfig, given: dict[str, str]) -> TraceConfig:
    """The ``_BSP`` settings from ``--trace-config opentelemetry,bsp_...``, else from their OTEL_BSP_* variables,
    as tritonserver reads them (unsigned 32-bit numbers, refused in its words)."""
    settings: dict[str, int] = {}
    for key, (variable, _) in _BSP.items():
        source, text = (f"--trace-config opentelemetry,{key}", given[key]) if key in given else \
            (variable, os.environ.get(variable))
        if text is None:
            continue
        try:
            settings[key] = _cli_int(text, _UINT32_MAX)
            if settings[key] < 0:
                raise ValueError(f"Provided option value is out of bound. Got {text}")
        except ValueError as exc:
            raise ValueError(f'Bad option: "{source}". {exc}') from None
    return replace(config, otel_bsp=tuple(settings.items()))


_API_KEYS = {"level": "trace_level", "rate": "trace_rate", "count": "trace_count", "log-frequency": "log_frequency"}
#: trace API setting -> TraceConfig field
API_FIELDS = {"trace_level": "level", "trace_rate": "rate", "trace_count": "count", "log_frequency": "log_frequency"}


def _int(key: str, value: Any, low: int, high: int) -> int:
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise InvalidArgumentError(f"Unable to parse '{key}', got: {value}") from None
    if key == "trace_count" and number < low:  # tritonserver's words (its gRPC adds a space after "got:")
        raise InvalidArgumentError(f"Unable to parse 'trace_count'. Expecting value >= -1, got:{value}")
    if number < low or number > high:
        raise InvalidArgumentError(f"Unable to parse '{key}', value is out of range [ {low}, {high} ], got: {value}")
    return number


def updated(config: TraceConfig, changes: dict[str, Any], *, from_cli: bool = False) -> TraceConfig:
    """``config`` with API-style changes applied; raises InvalidArgumentError / UnsupportedError."""
    for key, value in changes.items():
        if key == "trace_file":
            if not from_cli:  # any value, even the current one or null, as tritonserver
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
            if any(lv not in LEVELS for lv in levels):
                raise InvalidArgumentError(f"invalid trace level {levels}: expected OFF, TIMESTAMPS or TENSORS")
            if "OFF" in levels and len(levels) > 1:
                raise InvalidArgumentError("Expect only one trace level 'OFF' is specified")
            # in tritonserver's order, whatever the request's (it keeps the levels as bits)
            config = replace(config, level=tuple(level for level in LEVELS if level in levels) or ("OFF",))
        elif key == "trace_rate":
            config = replace(config, rate=_int(key, value, 0, _UINT32_MAX))
        elif key == "trace_count":
            config = replace(config, count=_int(key, value, -1, _INT32_MAX))
        elif key == "log_frequency":
            config = replace(config, log_frequency=_int(key, value, 0, _UINT32_MAX))
        elif key != "trace_mode":
            raise InvalidArgumentError(f"unknown trace setting '{key}'")
    return config
