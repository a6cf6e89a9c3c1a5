"""ONNX Runtime sessions for the onnxruntime backend: options, execution providers, graph metadata.

Neighbours: ``backends/onnxruntime.py`` (the backend and its instances) builds sessions with these
functions; ``backends/graph_signature.py`` compares their graph metadata with the config.
Semantics follow Triton's onnxruntime backend:

* **Execution providers**: instance kind KIND_GPU uses CUDAExecutionProvider on ``device_id`` (a
  load error when this onnxruntime has no CUDA), preceded by TensorrtExecutionProvider when the config
  names a ``tensorrt`` gpu_execution_accelerator (``precision_mode``, ``max_workspace_size_bytes``,
  any ``trt_*`` key); a ``cuda`` accelerator's parameters go to the CUDA provider. KIND_CPU,
  KIND_MODEL and KIND_AUTO run on the CPU provider (the repository turns KIND_AUTO into a concrete
  kind before instances exist); an ``openvino`` cpu_execution_accelerator adds OpenVINO.
* **Session options** from config ``parameters``: ``intra_op_thread_count``, ``inter_op_thread_count``,
  ``execution_mode`` (0 sequential, 1 parallel), ``enable_mem_arena``, ``enable_mem_pattern``, any
  ``session.*`` key (session config entry, e.g. ``session.intra_op.allow_spinning``) and ``memory.*``
  key (run config entry); ``optimization.graph.level`` (-1 basic, 1 extended, 2 disabled, otherwise
  all). ``--backend-config=onnxruntime,<key>=<value>`` gives server-wide defaults for the two thread
  counts; model parameters win.
* **Default intra-op threads**: ONNX Runtime's own default (one spinning thread per physical core, in
  every session) oversubscribes a server that also decodes requests and runs several instances. We
  use half of the CPUs this process may use (affinity mask and cgroup quota), shared among the
  model's instances, clamped to 1..4. Measured on small models, one thread is fastest anyway; set
  ``intra_op_thread_count`` for large models on large machines.
"""

from __future__ import annotations

import functools
import logging
import math
import os
from pathlib import Path
from typing import Any, Mapping

from tritonclient.grpc import model_config_pb2 as mc

from serving_pod.backends.base import InstanceContext
from serving_pod.backends.graph_signature import TensorInfo
from serving_pod.core.errors import ModelLoadError

#: onnxruntime's type strings -> Triton config data types.
ORT_TO_CONFIG: dict[str, str] = {
    "tensor(bool)": "TYPE_BOOL",
    "tensor(uint8)": "TYPE_UINT8",
    "tensor(uint16)": "TYPE_UINT16",
    "tensor(uint32)": "TYPE_UINT32",
    "tensor(uint64)": "TYPE_UINT64",
    "tensor(int8)": "TYPE_INT8",
    "tensor(int16)": "TYPE_INT16",
    "tensor(int32)": "TYPE_INT32",
    "tensor(int64)": "TYPE_INT64",
    "tensor(float16)": "TYPE_FP16",
    "tensor(float)": "TYPE_FP32",
    "tensor(double)": "TYPE_FP64",
    "tensor(bfloat16)": "TYPE_BF16",
    "tensor(string)": "TYPE_STRING",
}
log = logging.getLogger(__name__)
_GRAPH_LEVELS = {-1: "ORT_ENABLE_BASIC", 1: "ORT_ENABLE_EXTENDED", 2: "ORT_DISABLE_ALL"}
_CUDA_LEGACY_PARAMS = ("cudnn_conv_algo_search", "gpu_mem_limit", "arena_extend_strategy", "do_copy_in_default_stream")
_TRT_KEYS = {
    "max_workspace_size_bytes": "trt_max_workspace_size",
    "int8_calibration_table_name": "trt_int8_calibration_table_name",
    "int8_use_native_calibration_table": "trt_int8_use_native_calibration_table",
}
_TRT_PRECISIONS = {"FP32": None, "FP16": "trt_fp16_enable", "BF16": "trt_bf16_enable", "INT8": "trt_int8_enable"}


def load_onnxruntime() -> Any:
    """The onnxruntime module, imported on first use."""
    import onnxruntime  # heavy: only when a model is loaded

    return onnxruntime


@functools.cache
def preload_cuda_libraries() -> None:
    """Load CUDA and cuDNN from the ``nvidia-*`` wheels where they are installed (onnxruntime >= 1.21):
    onnxruntime-gpu from pip finds them no other way on a machine without a system CUDA toolkit, and would
    fall back to the CPU. Where they are missing (a CUDA image), the system's libraries are found as usual."""
    preload = getattr(load_onnxruntime(), "preload_dlls", None)
    if preload is None:
        return
    try:
        preload(cuda=True, cudnn=True, msvc=False)
    except Exception as exc:  # a missing wheel or library: onnxruntime's own search follows
        log.info("onnxruntime.preload_dlls found no CUDA wheels (%s); using the system's CUDA libraries", exc)


def tensor_infos(nodes: Any, optional: bool = False) -> dict[str, TensorInfo]:
    """onnxruntime NodeArg list -> TensorInfo by name, in graph order (symbolic/unknown dims -> -1)."""
    return {
        node.name: TensorInfo(
            name=node.name,
            config_type=ORT_TO_CONFIG.get(node.type, ""),
            shape=tuple(dim if isinstance(dim, int) and dim >= 0 else -1 for dim in (node.shape or ())),
            optional=optional,
            source_type=node.type,
        )
        for node in nodes
    }


def graph_of(session: Any) -> tuple[dict[str, TensorInfo], dict[str, TensorInfo]]:
    """(inputs incl. overridable initializers, outputs) of an open session."""
    inputs = tensor_infos(session.get_inputs())
    inputs.update(tensor_infos(session.get_overridable_initializers(), optional=True))
    return inputs, tensor_infos(session.get_outputs())


def model_path(config: mc.ModelConfig, version_dir: Path) -> Path:
    """The model file of a version (a directory named like the file holds ``model.onnx``)."""
    path = version_dir / (config.default_model_filename or "model.onnx")
    if path.is_dir():
        path = path / "model.onnx"
    if not path.is_file():
        raise ModelLoadError(f"model '{config.name}': model file {path} not found")
    return path


def available_cpus() -> int:
    """CPUs this process may use: affinity mask, capped by a cgroup CPU quota (containers, Kubernetes limits)."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
        if quota != "max":
            cpus = min(cpus, math.ceil(int(quota) / int(period)))
    except (OSError, ValueError):
        pass
    return max(1, cpus)


def default_intra_op_threads(instance_count: int) -> int:
    """Half the usable CPUs shared among the model's instances, clamped to 1..4 (see module doc)."""
    return max(1, min(4, available_cpus() // (2 * max(1, instance_count))))


def _instance_count(config: mc.ModelConfig) -> int:
    total = 0
    for group in config.instance_group:
        total += max(1, group.count) * (len(group.gpus) if group.kind == mc.ModelInstanceGroup.KIND_GPU and group.gpus else 1)
    return total or 1


def _int_setting(model: str, key: str, params: Mapping[str, str], backend_config: Mapping[str, str]) -> int | None:
    raw = params.get(key, backend_config.get(key))
    if raw is None or raw == "":
        return None
    try:
        return int(raw)
    except ValueError:
        raise ModelLoadError(f"model '{model}': parameter '{key}' must be an integer, got '{raw}'") from None


def session_options(
    config: mc.ModelConfig, backend_config: Mapping[str, str] | None = None
) -> tuple[Any, Any]:
    """(SessionOptions, RunOptions) for ``config`` as Triton's onnxruntime backend reads it."""
    ort = load_onnxruntime()
    backend_config = backend_config or {}
    model = config.name
    params = {key: value.string_value for key, value in config.parameters.items()}
    options = ort.SessionOptions()
    options.log_severity_level = 3  # errors only: warnings would flood the server log
    level = _GRAPH_LEVELS.get(config.optimization.graph.level, "ORT_ENABLE_ALL")
    options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, level)
    mode = _int_setting(model, "execution_mode", params, {}) or 0
    if mode not in (0, 1):
        raise ModelLoadError(
            f"model '{model}': parameter 'execution_mode' must be 0 (sequential) or 1 (parallel), got {mode}"
        )
    options.execution_mode = ort.ExecutionMode.ORT_PARALLEL if mode else ort.ExecutionMode.ORT_SEQUENTIAL
    intra = _int_setting(model, "intra_op_thread_count", params, backend_config)
    options.intra_op_num_threads = default_intra_op_threads(_instance_count(config)) if intra is None else max(0, intra)
    inter = _int_setting(model, "inter_op_thread_count", params, backend_config)
    if inter:
        options.inter_op_num_threads = max(0, inter)
    for key, attribute in (("enable_mem_arena", "enable_cpu_mem_arena"), ("enable_mem_pattern", "enable_mem_pattern")):
        value = _int_setting(model, key, params, {})
        if value is not None:
            setattr(options, attribute, bool(value))
    run_options = ort.RunOptions()
    run_options.log_severity_level = 3
    for key, value in params.items():
        if key.startswith("session."):
            options.add_session_config_entry(key, value)
        elif key.startswith("memory."):
            run_options.add_run_config_entry(key, value)
    return options, run_options


def execution_providers(context: InstanceContext, available: list[str]) -> list[Any]:
    """The providers list for an instance; a clear ``ModelLoadError`` when its kind cannot be served."""
    config, model = context.config, context.model_name
    accelerators = config.optimization.execution_accelerators
    params = {key: value.string_value for key, value in config.parameters.items()}
    providers: list[Any] = []
    if context.kind == "KIND_GPU":
        if "CUDAExecutionProvider" not in available:
            raise ModelLoadError(
                f"model '{model}': instance '{context.name}' has kind KIND_GPU but this onnxruntime has no "
                f"CUDA support (available providers: {', '.join(available)}); install the GPU extra "
                "(pip install ferry[gpu]) on a CUDA machine, or use instance_group kind KIND_CPU"
            )
        cuda = {"device_id": str(context.device_id)}
        cuda.update({key: params[key] for key in _CUDA_LEGACY_PARAMS if key in params})
        for accelerator in accelerators.gpu_execution_accelerator:
            if accelerator.name == "tensorrt":
                if "TensorrtExecutionProvider" not in available:
                    raise ModelLoadError(
                        f"model '{model}': gpu_execution_accelerator 'tensorrt' needs onnxruntime's "
                        f"TensorrtExecutionProvider (available providers: {', '.join(available)})"
                    )
                providers.append(("TensorrtExecutionProvider", _tensorrt_options(model, accelerator, context.device_id)))
            elif accelerator.name == "cuda":
                cuda.update(dict(accelerator.parameters))
            else:
                raise ModelLoadError(
                    f"model '{model}': unknown gpu_execution_accelerator '{accelerator.name}' "
                    "(onnxruntime supports 'tensorrt' and 'cuda')"
                )
        providers.append(("CUDAExecutionProvider", cuda))
    else:
        for accelerator in accelerators.cpu_execution_accelerator:
            if accelerator.name != "openvino":
                raise ModelLoadError(
                    f"model '{model}': unknown cpu_execution_accelerator '{accelerator.name}' "
                    "(onnxruntime supports 'openvino')"
                )
            if "OpenVINOExecutionProvider" not in available:
                raise ModelLoadError(
                    f"model '{model}': cpu_execution_accelerator 'openvino' needs onnxruntime's "
                    f"OpenVINOExecutionProvider (available providers: {', '.join(available)})"
                )
            providers.append(("OpenVINOExecutionProvider", dict(accelerator.parameters)))
    providers.append("CPUExecutionProvider")
    return providers


def _tensorrt_options(model: str, accelerator: Any, device_id: int) -> dict[str, str]:
    options = {"device_id": str(device_id)}
    for key, value in accelerator.parameters.items():
        if key == "precision_mode":
            if value.upper() not in _TRT_PRECISIONS:
                raise ModelLoadError(
                    f"model '{model}': TensorRT precision_mode must be one of "
                    f"{', '.join(_TRT_PRECISIONS)}, got '{value}'"
                )
            flag = _TRT_PRECISIONS[value.upper()]
            if flag:
                options[flag] = "True"
        elif key in _TRT_KEYS:
            options[_TRT_KEYS[key]] = value
        elif key.startswith("trt_"):
            options[key] = value
        else:
            raise ModelLoadError(f"model '{model}': unknown TensorRT accelerator parameter '{key}'")
    return options


def open_session(path: Path, options: Any, providers: list[Any], model: str) -> Any:
    try:
        return load_onnxruntime().InferenceSession(str(path), sess_options=options, providers=providers)
    except Exception as exc:  # onnxruntime raises its own exception types (Fail, InvalidGraph, ...)
        raise ModelLoadError(f"failed to load model '{model}': {exc}") from None


def read_graph(path: Path, model: str) -> tuple[dict[str, TensorInfo], dict[str, TensorInfo]]:
    """Inputs and outputs of the graph at ``path`` (a light CPU session: no optimizations, one thread)."""
    ort = load_onnxruntime()
    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.intra_op_num_threads = 1
    return graph_of(open_session(path, options, ["CPUExecutionProvider"], model))
