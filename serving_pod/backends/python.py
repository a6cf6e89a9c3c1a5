"""The python backend: runs Triton ``model.py`` files unmodified.

``PythonBackend`` implements ``backends.base.Backend``. By default a model runs in the server
process (``python_model.PythonModelInstance``): requests reach ``execute`` as thin wrappers
over the engine's numpy tensors, with no IPC — the speed edge over Triton's per-instance stub
processes. A model opts into a child process (``python_isolated``) with the config parameter
``FERRY_ISOLATED: "true"`` (own GIL, crash containment) or ``EXECUTION_ENV_PATH`` (its own
interpreter: a python executable, an environment directory, or a conda-pack ``.tar.gz``;
``$$TRITON_MODEL_DIRECTORY`` is expanded as in Triton).

The config reaches the model as Triton serializes it: compact JSON with proto field names, every
field printed (defaults included) in the ``.proto`` file's order and 64-bit integers as JSON numbers
(``config_to_dict``).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from serving_pod.backends.base import InstanceContext, ModelInstance, VersionLoadError
from serving_pod.core import errors
from serving_pod.core.datatypes import config_to_wire
from serving_pod.repository.config import config_to_dict, version_number

if TYPE_CHECKING:
    from tritonclient.grpc.model_config_pb2 import ModelConfig

_log = logging.getLogger(__name__)

ISOLATED_PARAMETER = "FERRY_ISOLATED"
ENV_PATH_PARAMETER = "EXECUTION_ENV_PATH"
_TRUE = ("1", "true", "yes", "on")


# --------------------------------------------------------------------------- config JSON


def config_json(config: Any) -> str:
    """``args["model_config"]``: Triton's text, compact as its printer writes it."""
    return json.dumps(config_to_dict(config), separators=(",", ":"))


# --------------------------------------------------------------------------- isolation


def _parameter(config: "ModelConfig", key: str) -> str:
    return config.parameters[key].string_value if key in config.parameters else ""


def isolated_executable(config: "ModelConfig", model_dir: Path) -> str | None:
    """The interpreter to run this model in a child process, or None for in-process."""
    import sys

    env_path = _parameter(config, ENV_PATH_PARAMETER).strip()
    if env_path:
        from serving_pod.backends.python_isolated import resolve_environment

        env_path = env_path.replace("$$TRITON_MODEL_DIRECTORY", str(model_dir))
        return resolve_environment(env_path, config.name)
    if _parameter(config, ISOLATED_PARAMETER).strip().lower() in _TRUE:
        return sys.executable
    return None


# --------------------------------------------------------------------------- backend


def _model_file(config: "ModelConfig", version_dir: Path) -> Path:
    return version_dir / (config.default_model_filename or "model.py")


def build_spec(context: InstanceContext) -> Any:
    """The plain-values description of one instance (see ``python_model.ModelSpec``)."""
    from tritonclient.grpc import model_config_pb2

    from serving_pod.backends.python_model import ModelSpec

    config = context.config
    outputs = tuple(
        (o.name, config_to_wire(model_config_pb2.DataType.Name(o.data_type)))
        for o in config.output
        if o.data_type != model_config_pb2.TYPE_INVALID
    )
    kind = context.kind[5:] if context.kind.startswith("KIND_") else context.kind
    return ModelSpec(
        model_name=context.model_name,
        model_version=str(context.model_version),
        model_dir=str(context.model_dir),
        version_dir=str(context.version_dir),
        model_file=str(_model_file(config, Path(context.version_dir))),
        instance_name=context.name,
        instance_kind=kind,
        device_id=context.device_id,
        config_json=config_json(config),
        decoupled=bool(config.model_transaction_policy.decoupled),
        output_types=outputs,
    )


class PythonBackend:
    """Backend ``python``: ``<version>/model.py`` defining ``TritonPythonModel``."""

    name = "python"

    def default_model_filename(self) -> str:
        return "model.py"

    def create_instance(self, context: InstanceContext) -> ModelInstance:
        spec = build_spec(context)
        if not Path(spec.model_file).is_file():
            raise errors.ModelLoadError(
                f"failed to load python model '{context.model_name}': {spec.model_file} not found"
            )
        executable = isolated_executable(context.config, Path(context.model_dir))
        if executable is not None:
            from serving_pod.backends.python_isolated import IsolatedInstance

            return IsolatedInstance(spec, context.engine, executable)
        from serving_pod.backends.python_model import PythonModelInstance

        return PythonModelInstance(spec, context.engine)

    def auto_complete(self, config: "ModelConfig", model_dir: Path, version_dir: Path | None) -> None:
        """Run the model's static ``auto_complete_config`` (if any) and keep its edits."""
        model_file = _find_model_file(config, Path(model_dir), version_dir)
        if model_file is None:
            return  # loading reports the missing file with the version it looked in
        executable = isolated_executable(config, Path(model_dir))
        label = config.name or Path(model_dir).name
        seen = config_json(normalized_view(config, self.default_model_filename()))
        if executable is not None:
            from serving_pod.backends.python_isolated import run_auto_complete

            edited = run_auto_complete(executable, str(model_file), seen, label)
        else:
            edited = _auto_complete_in_process(str(model_file), seen, label)
        if edited is None:
            return
        from google.protobuf import json_format
        from tritonclient.grpc import model_config_pb2

        from serving_pod.repository.config import as_triton_reads_json

        completed = model_config_pb2.ModelConfig()
        try:
            json_format.ParseDict(as_triton_reads_json(edited), completed)
        except json_format.ParseError as exc:  # Triton: "model configuration is not provided", which misleads
            raise VersionLoadError(
                f"auto_complete_config of python model '{label}' produced an invalid config: {exc}"
            ) from None
        keep_auto_completed(config, completed)


def normalized_view(config: "ModelConfig", default_model_filename: str) -> "ModelConfig":
    """What ``auto_complete_model_config.as_dict()`` shows: Triton normalizes the config before the backend
    auto-completes it (named instance groups, version policy, optimization, default model file, a batcher's
    preferred sizes), so a model reads the defaults it will be served with. A copy: only the edits
    ``keep_auto_completed`` keeps reach the config."""
    from serving_pod.repository import instance_groups, prepare

    view = type(config)()
    view.CopyFrom(config)
    if not view.default_model_filename:
        view.default_model_filename = default_model_filename
    instance_groups.complete(view, default_kind="KIND_AUTO", gpus=instance_groups.visible_gpus(), gpu_capable=True)
    prepare._normalize(view)  # noqa: SLF001  (the same defaults the served config gets)
    return view


def keep_auto_completed(config: "ModelConfig", completed: "ModelConfig") -> None:
    """Triton core's ``UpdateModelConfig``: of what ``auto_complete_config`` returns only ``max_batch_size``, the
    inputs and outputs, a scheduler where the config names none and ``model_transaction_policy.decoupled`` are
    kept; any other edit made through ``as_dict()`` (name, instance groups, parameters...) is dropped."""
    config.max_batch_size = completed.max_batch_size
    del config.input[:]
    config.input.extend(completed.input)
    del config.output[:]
    config.output.extend(completed.output)
    choice = config.WhichOneof("scheduling_choice")
    updated = completed.WhichOneof("scheduling_choice")
    if choice is None:
        if updated is not None:
            getattr(config, updated).CopyFrom(getattr(completed, updated))
    elif choice != updated:  # Triton's backend drops this error (and every edit) and loads the config as it was
        raise VersionLoadError(
            f"auto_complete_config of python model '{config.name}' cannot change the scheduling choice: the "
            f"configuration specifies '{choice}', the auto-completed one '{updated or 'none'}'"
        )
    if completed.HasField("model_transaction_policy"):
        config.model_transaction_policy.decoupled = completed.model_transaction_policy.decoupled


def _find_model_file(config: "ModelConfig", model_dir: Path, version_dir: Path | None) -> Path | None:
    if version_dir is not None:
        path = _model_file(config, Path(version_dir))
        return path if path.is_file() else None
    versions = sorted(
        (p for p in model_dir.iterdir() if p.is_dir() and version_number(p.name) is not None),
        key=lambda p: int(p.name),
        reverse=True,
    ) if model_dir.is_dir() else []
    for candidate in versions:
        path = _model_file(config, candidate)
        if path.is_file():
            return path
    return None


def auto_complete_with_module(module: Any, config_text: str, label: str) -> dict[str, Any] | None:
    """Call ``TritonPythonModel.auto_complete_config`` of an imported model module.

    Returns the edited config dict, or None when the model has no ``auto_complete_config``.
    Raises ``ModelLoadError`` for a bad return value or a conflicting edit.
    """
    from serving_pod.backends import pb_utils

    model_class = getattr(module, "TritonPythonModel", None)
    if model_class is None:
        raise VersionLoadError(f"python model '{label}' does not define class TritonPythonModel")
    hook = getattr(model_class, "auto_complete_config", None)
    if hook is None:
        return None
    try:
        result = hook(pb_utils.ModelConfig(config_text))
    except BaseException as exc:  # sys.exit() in a model fails its load, never the server
        raise VersionLoadError(f"{type(exc).__name__}: {exc}") from None  # Triton's words: the bare exception
    if not isinstance(result, pb_utils.ModelConfig):
        raise VersionLoadError(
            f"auto_complete_config function in model '{label}' must return a valid pb.ModelConfig object."
        )
    return result.as_dict()


def _auto_complete_in_process(model_file: str, config_text: str, label: str) -> dict[str, Any] | None:
    from serving_pod.backends.python_model import describe, load_model_module, unload_module

    try:
        module = load_model_module(model_file, str(Path(model_file).parent), f"{label}_autocomplete")
    except BaseException as exc:  # sys.exit() in a model fails its load, never the server
        _log.error("python model '%s': importing %s failed: %s", label, model_file, describe(exc))
        raise VersionLoadError(describe(exc)) from None  # Triton's words: the bare exception
    try:
        return auto_complete_with_module(module, config_text, label)
    finally:
        unload_module(module)


def create_backend(backend_config: Mapping[str, str] | None = None) -> PythonBackend:
    """Entry point used by ``backends.registry`` (no ``--backend-config`` settings are used yet)."""
    return PythonBackend()
