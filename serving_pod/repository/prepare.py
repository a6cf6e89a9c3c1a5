"""Turns a model directory into a complete, validated ``ModelConfig`` ready for instance creation.

Order, as Triton: read config.pbtxt (or an override) -> resolve the backend -> backend auto-complete
(unless ``--disable-auto-complete-config``; dynamic batching for max_batch_size > 1 where the backend's
auto-complete adds it) -> the checks of Triton's repository poll (batch settings: ``PollRefused``) -> the checks
Triton makes per version (instance groups, tensors, label files: ``VersionRefused``, every version failing with it;
the tensors are the poll's without auto-complete, and an ensemble's are its own failure, ``EnsembleInvalid``) ->
Triton's normalization (version policy, optimization, default_model_filename, batcher defaults). Runs on a loader
thread, never on the request path.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from tritonclient.grpc import model_config_pb2 as mc

from serving_pod.backends.base import VersionLoadError
from serving_pod.backends.registry import get_backend
from serving_pod.core.errors import ModelLoadError
from serving_pod.core.load_errors import (
    EnsembleInvalid,
    PollRefused,
    VersionRefused,
    VersionsUnavailable,
    version_reason,
)
from serving_pod.repository import instance_groups
from serving_pod.repository.config import (
    load_config,
    parse_config_json,
    resolve_backend,
)
from serving_pod.repository.validation import (
    select_versions,
    validate_config,
    validate_io,
)


def prepare_config(
    name: str,
    model_dir: Path,
    *,
    autocomplete: bool = True,
    override_json: str | None = None,
    backend_config: dict[str, dict[str, str]] | None = None,
    default_instance_kind: str = "KIND_AUTO",
    min_compute_capability: float = instance_groups.MIN_COMPUTE_CAPABILITY,
    config_name: str = "",
    poll_checks: Callable[[mc.ModelConfig], None] | None = None,
) -> tuple[mc.ModelConfig, str, list[int]]:
    """The completed config, its backend name and the versions to load (``config_name``: ``--model-config-name``;
    ``poll_checks``: the caller's further refusals of Triton's repository poll, made after this module's own)."""
    if not model_dir.is_dir():
        raise ModelLoadError(f"model '{name}': directory {model_dir} does not exist")
    if override_json is not None:
        config = parse_config_json(override_json, name)
        if config.name and config.name != name:
            raise PollRefused(
                f"model name '{config.name}' in the config override does not match '{name}'"
            )
        config.name = name
    else:
        config = load_config(model_dir, name, config_name, autocomplete)
    backend_name = resolve_backend(config, model_dir)
    versions = select_versions(config, model_dir)
    ensemble = backend_name == "ensemble"
    if not ensemble:
        try:
            backend = get_backend(backend_name, backend_settings(backend_config, backend_name))
            if autocomplete:
                version_dir = model_dir / str(versions[-1])
                backend.auto_complete(config, model_dir, version_dir if version_dir.is_dir() else None)
        except VersionLoadError as exc:  # Triton fails each version with it
            exc.versions = versions
            raise
        if (
            autocomplete
            and backend_name not in _NO_DEFAULT_BATCHER
            and config.max_batch_size > 1
            and not config.HasField("dynamic_batching")
            and not config.HasField("sequence_batching")
        ):
            config.dynamic_batching.SetInParent()
        _check_model_files(config, model_dir, versions, backend.default_model_filename())
    validate_config(config)
    if poll_checks is not None:
        poll_checks(config)
    try:
        if not autocomplete:  # Triton checks the tensors while it polls the repository then
            _io_at_poll(config)
        _complete_instance_groups(config, backend_name, default_instance_kind, min_compute_capability)
        validate_io(config)
        if not ensemble:
            _check_label_files(config, model_dir)
    except VersionRefused as exc:
        if ensemble:  # Triton finds an ensemble's bad tensors with its steps: the ensemble is not valid
            raise EnsembleInvalid(name, str(exc)) from None
        # as Triton: every version is tried, and each fails for the same reason
        raise VersionsUnavailable(name, dict.fromkeys(versions, version_reason(exc))) from None
    if not ensemble and not config.default_model_filename:
        config.default_model_filename = backend.default_model_filename()
    _normalize(config)
    return config, backend_name, versions


def _io_at_poll(config: mc.ModelConfig) -> None:
    """The tensors checked as Triton checks them without auto-complete: a refusal is the poll's."""
    try:
        validate_io(config)
    except VersionRefused as exc:
        raise PollRefused(str(exc)) from None


#: backends whose Triton auto-complete leaves the scheduler alone: Triton's python backend never adds
#: ``dynamic_batching`` (a python model batches only when its config asks for it).
_NO_DEFAULT_BATCHER = frozenset({"python"})


def _normalize(config: mc.ModelConfig) -> None:
    """Triton core's NormalizeModelConfig defaults, so the served config reads as Triton's does
    (Model Analyzer and perf_analyzer read these fields)."""
    if not config.HasField("version_policy"):
        config.version_policy.latest.num_versions = 1  # Triton: the latest version only
    if config.platform == "ensemble":
        # Triton's ensemble validation always sets the policy (decoupled when a step's model is), so its served
        # config has {"decoupled": false} even where config.pbtxt has none. A value given is kept here: Triton
        # replaces a given true, but only after its response-cache check has read it (cache.refuse_unsupported)
        config.model_transaction_policy.SetInParent()
        return
    optimization = config.optimization
    if not optimization.HasField("input_pinned_memory"):
        optimization.input_pinned_memory.enable = True
    if not optimization.HasField("output_pinned_memory"):
        optimization.output_pinned_memory.enable = True
    # Triton serves a batcher's preferred sizes as [max_batch_size] where none are given (core's normalization,
    # with or without auto-complete); the batchers read an empty list the same way
    batchers = []
    if config.HasField("dynamic_batching"):
        batchers.append(config.dynamic_batching)
    if config.HasField("sequence_batching") and config.sequence_batching.HasField("oldest"):
        batchers.append(config.sequence_batching.oldest)
    for batcher in batchers:
        if config.max_batch_size > 0 and not batcher.preferred_batch_size:
            batcher.preferred_batch_size.append(config.max_batch_size)
    if config.HasField("sequence_batching") and not config.sequence_batching.max_sequence_idle_microseconds:
        config.sequence_batching.max_sequence_idle_microseconds = 1_000_000  # Triton's idle timeout: 1 s


def backend_settings(backend_config: dict[str, dict[str, str]] | None, backend: str) -> dict[str, str]:
    """Global ``--backend-config=<key>=<value>`` settings overlaid by the backend's own."""
    if not backend_config:
        return {}
    return {**backend_config.get("", {}), **backend_config.get(backend, {})}


def _check_model_files(
    config: mc.ModelConfig, model_dir: Path, versions: list[int], default_file: str
) -> None:
    filename = config.default_model_filename or default_file
    if not filename:
        return
    for version in versions:
        path = model_dir / str(version) / filename
        if not path.exists():
            raise ModelLoadError(
                f"model '{config.name}' version {version}: model file {path} not found"
            )


def _check_label_files(config: mc.ModelConfig, model_dir: Path) -> None:
    """Triton reads every output's ``label_filename`` (in the model directory) when a version loads: one it cannot
    open fails each version, INTERNAL, in Triton's words. A name that leaves the directory is left to
    ``classification``, which refuses to read it."""
    root = model_dir.resolve()
    for output in config.output:
        path = model_dir / output.label_filename
        inside = path.resolve().is_relative_to(root)
        if output.label_filename and inside and not path.is_file():
            raise VersionRefused(f"failed to open text file for read {path}: No such file or directory",
                                 code="INTERNAL")


def _complete_instance_groups(config: mc.ModelConfig, backend: str, default_kind: str, min_capability: float) -> None:
    """Triton's instance group normalization and checks (:mod:`serving_pod.repository.instance_groups`)."""
    if config.platform == "ensemble":
        return
    gpus = instance_groups.visible_gpus(min_capability)
    instance_groups.complete(config, default_kind=default_kind, gpus=gpus,
                             gpu_capable=bool(gpus) and _backend_can_use_gpu(backend), backend=backend)
    instance_groups.check(config, gpus, min_capability)


def _backend_can_use_gpu(backend: str) -> bool:
    """Every backend places instances on GPUs as Triton's do, except an onnxruntime without CUDA."""
    if backend != "onnxruntime":
        return True
    import onnxruntime

    return "CUDAExecutionProvider" in onnxruntime.get_available_providers()
