"""Checks a completed ``ModelConfig`` before any instance is created, with model-named errors.

Runs after the backend's auto-complete; what it accepts, the engine can rely on (data types known,
dims sane, batch settings coherent, version folders present). A bad ``max_batch_size`` or batcher setting is a
``PollRefused`` (Triton's ``ValidateModelConfig`` refuses it while polling the repository: ``core.load_errors``); a
tensor Triton's ``ValidateModelIOConfig`` refuses is a ``VersionRefused`` in its words (``validate_io``: each version's
failure, or a poll refusal under ``--disable-auto-complete-config``, as Triton's); a version policy that leaves no
version is a ``NoVersionAvailable`` load failure, as Triton's.
"""

from __future__ import annotations

import logging
from pathlib import Path

from tritonclient.grpc import model_config_pb2 as mc

from serving_pod.core.datatypes import WIRE_TO_NUMPY, config_to_wire
from serving_pod.core.errors import ModelLoadError
from serving_pod.core.load_errors import NoVersionAvailable, PollRefused, VersionRefused
from serving_pod.repository.config import version_number

log = logging.getLogger(__name__)


def validate_config(config: mc.ModelConfig) -> None:
    """Raise ``PollRefused`` for what Triton's ``ValidateModelConfig`` refuses while it polls the repository (batch
    settings), ``ModelLoadError`` for Ferry's own parameters."""
    name = config.name
    if config.max_batch_size < 0:
        raise PollRefused(
            f"model '{name}': max_batch_size must be >= 0, got {config.max_batch_size}"
        )
    _validate_batching(config)
    if "ferry_execution_mode" in config.parameters:
        mode = config.parameters["ferry_execution_mode"].string_value
        if mode not in ("auto", "thread", "inline"):
            raise ModelLoadError(
                f"model '{name}': parameter ferry_execution_mode must be auto, thread or inline, got '{mode}'"
            )


def validate_io(config: mc.ModelConfig) -> None:
    """Raise ``VersionRefused`` for the first tensor Triton's ``ValidateModelIOConfig`` refuses, in its order and
    words (``<why> for <model>``): each input, each output, then the batch inputs and outputs. Ferry refuses more, in
    the same form: a tensor named twice (Triton loads it), a data type it has no array type for, no output outside
    python models. An ensemble's tensors may be shape tensors or in a non-linear format (its steps' models say whether
    they can be)."""
    name = config.name
    trt = config.backend == "tensorrt" or config.platform == "tensorrt_plan"
    ensemble = config.platform == "ensemble"
    for kind, tensors in (("input", config.input), ("output", config.output)):
        seen: set[str] = set()
        for tensor in tensors:
            why = _tensor_refusal(kind, tensor, config.max_batch_size, trt, ensemble)
            if why is None and tensor.name in seen:
                why = f"model {kind} '{tensor.name}' is specified more than once"
            if why is not None:
                raise VersionRefused(f"{why} for {name}")
            seen.add(tensor.name)
    why = _batch_io_refusal(config)
    if why is not None:
        raise VersionRefused(f"{why} for {name}")
    if not ensemble and not config.output and config.backend != "python":
        raise VersionRefused(f"model must specify at least one output for {name}")  # Triton's python needs none


def _tensor_refusal(kind: str, tensor: mc.ModelInput | mc.ModelOutput, max_batch_size: int, trt: bool,
                    ensemble: bool) -> str | None:
    """Why Triton refuses one tensor (``ValidateIOShape``, then the format checks: a TensorRT model's, or none for an
    ensemble), without `` for <model>``."""
    if not tensor.name:
        return f"model {kind} must specify 'name'"
    prefix = f"model {kind} '{tensor.name}' "
    if tensor.data_type == mc.TYPE_INVALID:
        return prefix + "must specify 'data_type'"
    if config_to_wire(mc.DataType.Name(tensor.data_type)) not in WIRE_TO_NUMPY:
        return prefix + f"has data_type {mc.DataType.Name(tensor.data_type)}, which this server does not support"
    if not tensor.dims:
        return prefix + "must specify 'dims'"
    reshape = tensor.HasField("reshape")
    if reshape and not tensor.reshape.shape and max_batch_size == 0:
        return prefix + "cannot have empty reshape for non-batching model as scalar tensors are not supported"
    if any(dim < 1 and dim != -1 for dim in tensor.dims):
        return prefix + "dimension must be integer >= 1, or -1 to indicate a variable-size dimension"
    if reshape:
        why = _reshape_refusal(list(tensor.dims), list(tensor.reshape.shape))
        if why is not None:
            return prefix + why
    if kind == "input" and tensor.format in (mc.ModelInput.FORMAT_NHWC, mc.ModelInput.FORMAT_NCHW) \
            and len(tensor.dims) != 3:
        return "model input NHWC/NCHW require 3 dims"
    if ensemble:
        return None
    if not trt and tensor.is_shape_tensor:
        return "shape tensors are only supported for TensorRT platform"
    if tensor.is_non_linear_format_io:
        if not trt:
            return "Non-linear IO format is only supported for the TensorRT platform"
        if len(tensor.dims) != 3:
            return f"Non-linear IO format {kind} requires 3 dims"
    return None


def _batch_io_refusal(config: mc.ModelConfig) -> str | None:
    """Why Triton's ``ValidateBatchIO`` refuses the config's ``batch_input`` / ``batch_output`` (after the tensors,
    without `` for <model>``): one source input each, an INT32 or FP32 batch input, sources among the inputs, targets
    among the outputs, each target once."""
    inputs = {tensor.name for tensor in config.input}
    outputs = {tensor.name for tensor in config.output}
    for batch_input in config.batch_input:
        if len(batch_input.source_input) != 1:
            return (f"batch input kind '{mc.BatchInput.Kind.Name(batch_input.kind)}' expects 1 source input, got "
                    f"{len(batch_input.source_input)}")
        if batch_input.data_type not in (mc.TYPE_INT32, mc.TYPE_FP32):
            return "batch input data type must be TYPE_INT32 or TYPE_FP32"
        unknown = [source for source in batch_input.source_input if source not in inputs]
        if unknown:
            return f"unknown source input name '{unknown[0]}'"
    for batch_output in config.batch_output:
        if len(batch_output.source_input) != 1:
            return (f"batch output kind '{mc.BatchOutput.Kind.Name(batch_output.kind)}' expects 1 source input, got "
                    f"{len(batch_output.source_input)}")
        unknown = [source for source in batch_output.source_input if source not in inputs]
        if unknown:
            return f"unknown source input name '{unknown[0]}'"
        targets: set[str] = set()
        for target in batch_output.target_name:
            if target not in outputs:
                return f"unknown target output name '{target}'"
            if target in targets:
                return f"target output name '{target}' can only be specified once"
            targets.add(target)
    return None


def _reshape_refusal(dims: list[int], shape: list[int]) -> str | None:
    """Triton's reshape rules: dims of 1 or more (or -1), the same element count as ``dims`` (an empty reshape for a
    single element), and with variable dims the same count between each pair of them."""
    if any(dim < 1 and dim != -1 for dim in shape):
        return "reshape dimensions must be integer >= 1, or -1 to indicate a variable-size dimension"
    dims_count, shape_count = _count(dims), _count(shape)
    if dims_count != shape_count and (shape_count != 0 or dims_count != 1):
        return "has different size for dims and reshape"
    if dims_count == -1:
        dims_runs, shape_runs = _runs(dims), _runs(shape)
        if len(dims_runs) != len(shape_runs):
            return "has different number of variable-size dimensions for dims and reshape"
        if dims_runs != shape_runs:
            return "has different size for dims and reshape"
    return None


def _count(dims: list[int]) -> int:
    """Elements in ``dims`` as Triton counts them: -1 when any dim is variable, 0 for no dims."""
    if -1 in dims:
        return -1
    total = 1
    for dim in dims:
        total *= dim
    return total if dims else 0


def _runs(dims: list[int]) -> list[int]:
    """Element counts of the runs of fixed dims around each variable one (``[2, 4, -1, 6]`` -> ``[8, 6]``)."""
    runs, current = [], 1
    for dim in dims:
        if dim == -1:
            runs.append(current)
            current = 1
        else:
            current *= dim
    runs.append(current)
    return runs


def _validate_batching(config: mc.ModelConfig) -> None:
    name = config.name
    if config.HasField("sequence_batching") and config.sequence_batching.HasField("oldest"):
        for size in config.sequence_batching.oldest.preferred_batch_size:
            if size <= 0 or size > config.max_batch_size:
                raise PollRefused(
                    f"model '{name}': sequence batching preferred batch size {size} must be in 1..max_batch_size "
                    f"({config.max_batch_size})"
                )
    if config.HasField("dynamic_batching"):
        batching = config.dynamic_batching
        if config.max_batch_size == 0 and batching.preferred_batch_size:
            raise PollRefused(
                f"model '{name}': dynamic batching preferred_batch_size requires max_batch_size > 0"
            )
        for size in batching.preferred_batch_size:
            if size <= 0 or size > config.max_batch_size:
                raise PollRefused(
                    f"model '{name}': preferred batch size {size} must be in 1..max_batch_size "
                    f"({config.max_batch_size})"
                )
        if batching.preserve_ordering and batching.priority_levels > 1:
            raise PollRefused(
                f"model '{name}': only one priority level is allowed when 'preserve_ordering' is true "
                f"(priority_levels is {batching.priority_levels})"
            )
        policies = [batching.default_queue_policy, *batching.priority_queue_policy.values()]
        if batching.preserve_ordering and any(
            policy.default_timeout_microseconds and policy.timeout_action == mc.ModelQueuePolicy.DELAY
            for policy in policies
        ):  # Triton's words (its ValidateModelConfig)
            raise PollRefused(
                f"Queue policy can not have DELAY as timeout action when 'preserve_ordering' is true for {name}"
            )
        if batching.priority_levels and not (
            0 < batching.default_priority_level <= batching.priority_levels
        ):
            raise PollRefused(
                f"model '{name}': default_priority_level {batching.default_priority_level} must be "
                f"in 1..priority_levels ({batching.priority_levels})"
            )
        for level in batching.priority_queue_policy:  # without priority levels Triton loads and ignores them
            if batching.priority_levels and not 0 < level <= batching.priority_levels:
                raise PollRefused(
                    f"model '{name}': priority_queue_policy for level {level} outside "
                    f"1..priority_levels ({batching.priority_levels})"
                )


#: model sub-folders that are never versions (Triton skips them before it reads a folder name as one)
_NOT_VERSIONS = frozenset({"warmup", "initial_state", "configs"})


def _versions_on_disk(model_dir: Path) -> list[int]:
    """The model directory's version folders; another folder is ignored with Triton's warning (a name with a leading
    zero; one that is not a number, which Triton calls one that fails to convert to integral number)."""
    versions = []
    for entry in sorted(model_dir.iterdir()) if model_dir.is_dir() else []:
        if not entry.is_dir() or entry.name in _NOT_VERSIONS:
            continue
        version = version_number(entry.name)
        if version is not None:
            versions.append(version)
        elif entry.name.isascii() and entry.name.isdigit():
            log.warning("ignore version directory '%s' which contains leading zeros in its directory name", entry.name)
        else:
            log.warning("ignore version directory '%s' which fails to convert to integral number", entry.name)
    return versions


def select_versions(config: mc.ModelConfig, model_dir: Path) -> list[int]:
    """Version numbers to load under the config's version policy, as Triton picks them: ``latest`` (1 by default)
    the highest ``num_versions`` folders, ``all`` every one, ``specific`` those of its versions that have a folder
    (a missing one is logged, as Triton logs it). None at all is Triton's load error."""
    available = sorted(_versions_on_disk(model_dir))
    if not available and config.platform == "ensemble":
        return [1]
    policy = config.version_policy
    which = policy.WhichOneof("policy_choice")
    missing: list[int] = []
    if which == "all":
        chosen = available
    elif which == "specific":
        wanted = sorted(set(policy.specific.versions))
        missing = [v for v in wanted if v not in available]
        for version in missing:
            log.error("version %d is specified for model '%s', but the version directory is not present",
                      version, config.name)
        chosen = [v for v in wanted if v in available]
    else:
        count = policy.latest.num_versions if which == "latest" else 1
        chosen = available[-count:] if count > 0 else []
    if not chosen:  # Triton's words; what is missing goes to the log
        log.error("model '%s' has no version folder to load under its version policy in %s (numeric folders: %s)",
                  config.name, model_dir, available or "none")
        # a load failure, not a poll failure: an ensemble over it quotes it as a model "which has no loaded version"
        raise NoVersionAvailable(config.name)
    return chosen
