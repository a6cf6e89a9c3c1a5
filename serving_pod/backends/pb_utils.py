"""Ferry's ``triton_python_backend_utils``: the API that Triton ``model.py`` files import.

The python backend (``serving_pod.backends.python``) installs this module as
``sys.modules["triton_python_backend_utils"]`` when it loads a python model (never at import
time of ``serving_pod``), so ``import triton_python_backend_utils as pb_utils`` in an unmodified
Triton model gets these classes. Names, signatures, flags and error wording follow Triton's
python_backend (``Tensor``, ``InferenceRequest``/``InferenceResponse``, ``TritonError``,
``TritonModelException``, ``Logger``, ``ModelConfig`` for ``auto_complete_config``...).

Unlike Triton, nothing here crosses a process boundary: a request wraps the engine's domain
``InferRequest`` and tensors wrap its numpy arrays without copies. BLS requests
(``InferenceRequest(model_name=...).exec()``) go to the engine of the instance that is running
(``engine.infer_from_thread`` / ``engine.stream_from_thread``); the bridging lives in
``python_bridge``. Auto-complete's ``ModelConfig`` lives in ``pb_model_config``, custom metrics
(``MetricFamily``) in ``pb_metrics``, the model loading API (``load_model``, ``unload_model``,
``is_model_ready``) in ``pb_model_loader``.
"""

from __future__ import annotations

import enum
import logging
from typing import Any

from serving_pod.backends.pb_metrics import Metric, MetricFamily
from serving_pod.backends.pb_model_config import ModelConfig
from serving_pod.backends.pb_model_loader import is_model_ready, load_model, unload_model
from serving_pod.backends.pb_request import (
    InferenceRequest,
    InferenceResponse,
    InferenceResponseSender,
    ResponseIterator,
    current_engine,
    get_model_dir,
)
from serving_pod.backends.pb_tensor import (
    TRITON_STRING_TO_NUMPY,
    TRITONSERVER_MEMORY_CPU,
    TRITONSERVER_MEMORY_GPU,
    TRITONSERVER_REQUEST_FLAG_SEQUENCE_END,
    TRITONSERVER_REQUEST_FLAG_SEQUENCE_START,
    TRITONSERVER_REQUEST_RELEASE_ALL,
    TRITONSERVER_REQUEST_RELEASE_RESCHEDULE,
    TRITONSERVER_RESPONSE_COMPLETE_FINAL,
    PreferredMemory,
    Tensor,
    TritonError,
    TritonModelException,
    deserialize_bytes_tensor,
    get_input_config_by_name,
    get_input_tensor_by_name,
    get_output_config_by_name,
    get_output_tensor_by_name,
    incompatible_arguments as _incompatible_arguments,
    numpy_to_triton_type,
    serialize_byte_tensor,
    triton_string_to_numpy,
    triton_to_numpy_type,
    using_decoupled_model_transaction_policy,
)

__all__ = [
    "Metric", "MetricFamily", "is_model_ready", "load_model", "unload_model",
    "ModelConfig", "InferenceRequest", "InferenceResponse",
    "InferenceResponseSender", "ResponseIterator", "current_engine", "get_model_dir",
    "TRITON_STRING_TO_NUMPY", "TRITONSERVER_MEMORY_CPU", "TRITONSERVER_MEMORY_GPU",
    "TRITONSERVER_REQUEST_FLAG_SEQUENCE_END", "TRITONSERVER_REQUEST_FLAG_SEQUENCE_START",
    "TRITONSERVER_REQUEST_RELEASE_ALL", "TRITONSERVER_REQUEST_RELEASE_RESCHEDULE",
    "TRITONSERVER_RESPONSE_COMPLETE_FINAL", "Tensor", "TritonError", "TritonModelException",
    "deserialize_bytes_tensor", "get_input_config_by_name", "get_input_tensor_by_name",
    "get_output_config_by_name", "get_output_tensor_by_name", "numpy_to_triton_type",
    "serialize_byte_tensor", "triton_string_to_numpy", "triton_to_numpy_type",
    "using_decoupled_model_transaction_policy", "Logger", "PreferredMemory",
]

_log = logging.getLogger("serving_pod.python_model")

# --------------------------------------------------------------------------- logging


class _LogLevel(enum.IntEnum):
    """``pb_utils.Logger.LogLevel``: Triton's pybind11 enum; a member compares and hashes as its number, and only a
    member is a level (``Logger.log("x", 0)`` is pybind11's ``TypeError``, as in Triton 2.51)."""

    INFO = 0
    WARNING = 1
    ERROR = 2
    VERBOSE = 3

    def __str__(self) -> str:
        return f"LogLevel.{self.name}"


_LogLevel.__name__ = "LogLevel"  # its repr: <LogLevel.INFO: 0> (__qualname__ kept for pickle)
_LOG_SIGNATURE = "(message: str, level: c_python_backend_utils.Logger.LogLevel = <LogLevel.INFO: 0>) -> None"


class Logger:
    """``pb_utils.Logger.log_info(msg)`` etc.; goes to the server's python logging."""

    LogLevel = _LogLevel
    INFO = _LogLevel.INFO
    WARNING = _LogLevel.WARNING
    ERROR = _LogLevel.ERROR
    VERBOSE = _LogLevel.VERBOSE

    _LEVELS = {0: logging.INFO, 1: logging.WARNING, 2: logging.ERROR, 3: logging.DEBUG}

    @staticmethod
    def log(message: str, level: _LogLevel = _LogLevel.INFO) -> None:
        if not isinstance(message, str) or type(level) is not _LogLevel:
            raise _incompatible_arguments(_LOG_SIGNATURE, (message, level), {}, "log")
        _log.log(Logger._LEVELS[level], "%s", message, stacklevel=2)

    @staticmethod
    def log_info(message: str) -> None:
        _log.info("%s", _text("log_info", message), stacklevel=2)

    @staticmethod
    def log_warn(message: str) -> None:
        _log.warning("%s", _text("log_warn", message), stacklevel=2)

    @staticmethod
    def log_error(message: str) -> None:
        _log.error("%s", _text("log_error", message), stacklevel=2)

    @staticmethod
    def log_verbose(message: str) -> None:
        _log.debug("%s", _text("log_verbose", message), stacklevel=2)


def _text(function: str, message: Any) -> str:
    """``message`` when it is a str; pybind11's refusal of the Logger call otherwise (Triton's binding)."""
    if not isinstance(message, str):
        raise _incompatible_arguments("(message: str) -> None", (message,), {}, function)
    return message
