"""ONNX Runtime backend (name ``onnxruntime``, platform ``onnxruntime_onnx``, file ``model.onnx``).

Neighbours: ``backends/base.py`` (the interface this implements), ``onnxruntime_session.py``
(session options, execution providers, thread defaults, graph metadata), ``graph_signature.py``
(auto-complete and config-vs-graph checks), ``batched.py`` (batch execution shared with tensorrt:
merge inputs, one run, split outputs, reshape, implicit-state outputs).

Each instance owns one InferenceSession (as in Triton) and runs a whole batch with one
``session.run``. ONNX Runtime's Python API carries only UTF-8 text in string tensors, so BYTES inputs
are decoded before the run (non-UTF-8 bytes -> INVALID_ARG) and string outputs come back as
``bytes``. BF16 rides as uint16 bit patterns and goes through OrtValues, since numpy has no bfloat16.
A failing run becomes an INTERNAL error for the requests of that run.
"""

from __future__ import annotations

import ctypes
from pathlib import Path
from typing import Any, Mapping

import numpy as np
from tritonclient.grpc import model_config_pb2 as mc

from serving_pod.backends import graph_signature as signature
from serving_pod.backends import onnxruntime_session as sessions
from serving_pod.backends.base import InstanceContext
from serving_pod.backends.batched import BatchedInstance, Converter, InstancePlan, build_plan
from serving_pod.backends.graph_signature import TensorInfo
from serving_pod.core.errors import InternalError, InvalidArgumentError, ModelLoadError

DEFAULT_MAX_BATCH_SIZE = 4  # Triton's onnxruntime ``default-max-batch-size``
_BF16 = 16  # onnx.TensorProto.BFLOAT16


class OnnxRuntimeBackend:
    """Creates ONNX Runtime instances; ``backend_config`` holds ``--backend-config=onnxruntime,...``."""

    name = "onnxruntime"
    platform = "onnxruntime_onnx"

    def __init__(self, *, backend_config: Mapping[str, str] | None = None) -> None:
        self.backend_config = dict(backend_config or {})

    def default_model_filename(self) -> str:
        return "model.onnx"

    def auto_complete(self, config: mc.ModelConfig, model_dir: Path, version_dir: Path | None) -> None:
        if version_dir is None or signature.is_complete(config):
            return
        raw = self.backend_config.get("default-max-batch-size", str(DEFAULT_MAX_BATCH_SIZE))
        try:
            default_max_batch = int(raw)
        except ValueError:
            raise ModelLoadError(
                f"backend config onnxruntime 'default-max-batch-size' must be an integer, got '{raw}'"
            ) from None
        inputs, outputs = sessions.read_graph(sessions.model_path(config, version_dir), config.name)
        signature.autocomplete(config, inputs, outputs, default_max_batch)

    def create_instance(self, context: InstanceContext) -> OnnxRuntimeInstance:
        config = context.config
        options, run_options = sessions.session_options(config, {**self.backend_config, **context.backend_config})
        providers = sessions.execution_providers(context, sessions.load_onnxruntime().get_available_providers())
        if context.kind == "KIND_GPU":
            sessions.preload_cuda_libraries()
        path = sessions.model_path(config, context.version_dir)
        session = sessions.open_session(path, options, providers, context.model_name)
        started = session.get_providers()
        for provider in (p[0] if isinstance(p, tuple) else p for p in providers):
            if provider not in started:  # onnxruntime falls back to the next provider with only a log line
                raise ModelLoadError(
                    f"model '{context.model_name}': onnxruntime could not start {provider} for instance "
                    f"'{context.name}'" + (f" on GPU {context.device_id}" if context.kind == "KIND_GPU" else "")
                    + f" (session providers: {', '.join(started)}; the server log has onnxruntime's reason)"
                )
        inputs, outputs = sessions.graph_of(session)
        signature.check_against_graph(config, inputs, outputs)
        plan = build_plan(context, inputs, outputs, input_steps=_input_steps, output_steps=_output_steps)
        bf16_outputs = any(info.config_type == "TYPE_BF16" for info in outputs.values())
        return OnnxRuntimeInstance(session, run_options, plan, use_ort_values=bf16_outputs)


class OnnxRuntimeInstance(BatchedInstance):
    """One InferenceSession executing batches of requests."""

    #: a session run never calls back into the engine: small graphs may run on the event loop
    #: thread (schedulers/instances.py decides from measured execution times)
    inline_safe = True
    #: a session run releases the GIL: an execution on the worker thread gets the GIL handed over
    releases_gil = True

    def __init__(self, session: Any, run_options: Any, plan: InstancePlan, *, use_ort_values: bool = False) -> None:
        self._session = session
        self._run_options = run_options
        self._plan = plan
        #: on the CPU provider alone a run only computes: its wall time past its CPU time is waiting for the
        #: GIL or a core, not for a device (schedulers/instances.py judges it by CPU time)
        self.cpu_bound = set(session.get_providers()) <= {"CPUExecutionProvider"}
        #: BF16 outputs cannot become numpy arrays inside onnxruntime: run with OrtValues instead
        self._use_ort_values = use_ort_values

    def _infer(self, feeds: dict[str, Any], names: list[str]) -> list[np.ndarray]:
        try:
            if self._use_ort_values:
                return _run_with_ort_values(self._session, names, feeds, self._run_options)
            return self._session.run(names, feeds, self._run_options)
        except Exception as exc:  # onnxruntime raises its own exception types
            raise InternalError(f"onnxruntime failed to run model '{self._plan.model_name}': {exc}") from None

    def close(self) -> None:
        self._session = None  # drop the session (and its memory) now, not at the next GC


def _input_steps(info: TensorInfo) -> list[Converter]:
    if info.config_type == "TYPE_STRING":
        return [_decoder(info.name)]
    if info.config_type == "TYPE_BF16":
        return [_bf16_value]
    return []


def _output_steps(info: TensorInfo) -> list[Converter]:
    return [_encode] if info.config_type == "TYPE_STRING" else []


def _decoder(name: str) -> Converter:
    def decode(array: np.ndarray, rows: int) -> np.ndarray:
        out = np.empty(array.size, dtype=np.object_)
        try:
            out[:] = [item.decode("utf-8") if isinstance(item, bytes) else item for item in array.flat]
        except UnicodeDecodeError as exc:
            raise InvalidArgumentError(
                f"input '{name}': ONNX Runtime string tensors hold UTF-8 text only: {exc}"
            ) from None
        return out.reshape(array.shape)

    return decode


def _encode(array: np.ndarray, rows: int) -> np.ndarray:
    out = np.empty(array.size, dtype=np.object_)
    out[:] = [item.encode("utf-8") if isinstance(item, str) else item for item in array.flat]
    return out.reshape(array.shape)


def _bf16_value(array: np.ndarray, rows: int) -> Any:
    ort = sessions.load_onnxruntime()
    return ort.OrtValue.ortvalue_from_numpy_with_onnx_type(np.ascontiguousarray(array, dtype="<u2"), _BF16)


def _run_with_ort_values(session: Any, names: list[str], feeds: dict[str, Any], run_options: Any) -> list[np.ndarray]:
    ort = sessions.load_onnxruntime()
    values = {
        name: value if isinstance(value, ort.OrtValue) else ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(value))
        for name, value in feeds.items()
    }
    arrays = []
    for value in session.run_with_ort_values(names, values, run_options):
        if value.element_type() != _BF16:
            arrays.append(value.numpy())
            continue
        shape = tuple(value.shape())
        count = int(np.prod(shape, dtype=np.int64))
        if count == 0:
            arrays.append(np.empty(shape, dtype="<u2"))
            continue
        buffer = (ctypes.c_uint16 * count).from_address(value.data_ptr())
        arrays.append(np.ctypeslib.as_array(buffer).reshape(shape).copy())
    return arrays


def create_backend(backend_config: Mapping[str, str] | None = None) -> OnnxRuntimeBackend:
    """Entry point used by ``backends.registry``."""
    return OnnxRuntimeBackend(backend_config=backend_config)
