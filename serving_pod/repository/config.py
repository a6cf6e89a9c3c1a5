"""Model configuration: ``config.pbtxt`` -> Triton's own ``ModelConfig`` message, auto-complete and validation.

Parsing uses protobuf text_format into ``tritonclient.grpc.model_config_pb2.ModelConfig`` (Triton's proto,
as shipped by tritonclient), so every field name and enum is Triton's. Validation errors name the model
and the offending field, and are raised as ``ModelLoadError``; a config that cannot be read or parsed, names
another model, a platform Triton does not know or no backend Triton can tell is a ``PollRefused`` (Triton refuses it
while polling the repository: ``core.load_errors``). Backends fill missing I/O through ``Backend.auto_complete``
before validation runs.
"""

from __future__ import annotations

import json
from pathlib import Path

from google.protobuf import json_format, text_format
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from tritonclient.grpc import model_config_pb2 as mc

from serving_pod.core.load_errors import PollRefused

#: config platform -> backend name (Triton's own pairs).
PLATFORM_BACKENDS: dict[str, str] = {
    "onnxruntime_onnx": "onnxruntime",
    "tensorrt_plan": "tensorrt",
    "ensemble": "",
}
BACKEND_PLATFORMS: dict[str, str] = {
    "onnxruntime": "onnxruntime_onnx",
    "tensorrt": "tensorrt_plan",
}
#: model file name -> backend, used when the config names neither platform nor backend.
FILE_BACKENDS: dict[str, str] = {
    "model.onnx": "onnxruntime",
    "model.py": "python",
    "model.plan": "tensorrt",
}


def parse_config_text(text: str, model_name: str) -> mc.ModelConfig:
    """Parse ``config.pbtxt`` text into a ModelConfig; syntax errors name the model and line."""
    config = mc.ModelConfig()
    try:
        text_format.Parse(text, config)
    except text_format.ParseError as exc:
        raise PollRefused(f"failed to parse config.pbtxt of model '{model_name}': {exc}") from None
    return config


def parse_config_json(text: str, model_name: str) -> mc.ModelConfig:
    """Parse a JSON config (repository load ``"config"`` override) into a ModelConfig; a JSON value other than an
    object is refused in Triton's words (protobuf reads ``[]`` as an empty message, which Triton refuses)."""
    config = mc.ModelConfig()
    try:
        if not isinstance(_json_value(text), dict):
            raise json_format.ParseError("Root element must be a message.")
        json_format.Parse(text, config)
    except (json_format.ParseError, ValueError) as exc:
        raise PollRefused(f"failed to parse config override of model '{model_name}': {exc}") from None
    return config


_TRUE_WORDS = ("true", "t", "yes", "y", "1")
_FALSE_WORDS = ("false", "f", "no", "n", "0")


def as_triton_reads_json(value: dict, descriptor: Descriptor = mc.ModelConfig.DESCRIPTOR) -> dict:
    """A config dict with what Triton core's JSON reader (protobuf's C++ ``JsonStringToMessage``) takes and
    Python's ``json_format`` refuses made plain: a single value for a repeated field (``"dims": 3``), a bool
    written as a word (``"optional": "yes"``, its ``safe_strtob``: true/t/yes/y/1, false/f/no/n/0, any case) and an
    enum name in any case (``"type_fp32"``). Anything else is left for ``json_format`` to take or refuse."""
    out = dict(value)
    for key, item in value.items():
        field = descriptor.fields_by_name.get(key) or _by_json_name(descriptor, key)
        if field is None or item is None:  # null: the field's default, as json_format reads it
            continue
        entry = field.message_type
        if entry is not None and entry.GetOptions().map_entry:
            if isinstance(item, dict):
                out[key] = {k: _as_read(entry.fields_by_name["value"], v) for k, v in item.items()}
        elif field.is_repeated:
            out[key] = [_as_read(field, v) for v in (item if isinstance(item, list) else [item])]
        else:
            out[key] = _as_read(field, item)
    return out


def _by_json_name(descriptor: Descriptor, key: str) -> FieldDescriptor | None:
    return next((f for f in descriptor.fields if f.json_name == key), None)


def _as_read(field: FieldDescriptor, item: object) -> object:
    if field.type == FieldDescriptor.TYPE_MESSAGE and isinstance(item, dict):
        return as_triton_reads_json(item, field.message_type)
    if field.type == FieldDescriptor.TYPE_BOOL and isinstance(item, str):
        word = item.lower()
        return True if word in _TRUE_WORDS else False if word in _FALSE_WORDS else item
    if field.type == FieldDescriptor.TYPE_ENUM and isinstance(item, str):
        return next((v.name for v in field.enum_type.values if v.name.lower() == item.lower()), item)
    return item


def _json_value(text: str) -> object:
    """``text`` read as JSON, or an empty object where it is not JSON (``json_format.Parse`` words that error)."""
    try:
        return json.loads(text)
    except ValueError:
        return {}


#: fields of tritonclient's model_config.proto that Triton 2.51's lacks (message -> field names), for the ones
#: printed even when unset (no presence). Triton 2.51 cannot print them, so they are left out while at their
#: default; a value set in config.pbtxt is still shown. (``ModelConfig.model_metrics``, also newer, has presence.)
_NEWER_THAN_TRITON: dict[str, tuple[str, ...]] = {
    "inference.ModelEnsembling": ("max_inflight_requests",),
}


def config_to_dict(config: mc.ModelConfig) -> dict:
    """ModelConfig -> JSON-ready dict shaped as Triton prints it: proto field names, defaults shown, int64 as
    numbers and each message's fields in the ``.proto`` file's declaration order (``_as_triton_prints``)."""
    data = json_format.MessageToDict(
        config,
        preserving_proto_field_name=True,
        always_print_fields_with_no_presence=True,
    )
    _drop_newer_defaults(config, data)
    return _as_triton_prints(data, config.DESCRIPTOR)


def _drop_newer_defaults(message, data: dict) -> None:
    """Remove ``_NEWER_THAN_TRITON`` fields at their default from ``data`` (``message`` printed), recursively."""
    for name in _NEWER_THAN_TRITON.get(message.DESCRIPTOR.full_name, ()):
        field = message.DESCRIPTOR.fields_by_name[name]
        if getattr(message, name) == field.default_value:
            data.pop(name, None)
    for field, value in message.ListFields():
        if field.message_type is None or field.name not in data:
            continue
        if field.message_type.GetOptions().map_entry:
            if field.message_type.fields_by_name["value"].message_type is not None:
                for key, item in value.items():
                    _drop_newer_defaults(item, data[field.name][str(key)])
        elif isinstance(data[field.name], list):
            for item, printed in zip(value, data[field.name]):
                _drop_newer_defaults(item, printed)
        else:
            _drop_newer_defaults(value, data[field.name])


_INT64_TYPES = frozenset({
    FieldDescriptor.TYPE_INT64, FieldDescriptor.TYPE_UINT64, FieldDescriptor.TYPE_SINT64,
    FieldDescriptor.TYPE_FIXED64, FieldDescriptor.TYPE_SFIXED64,
})
_FLOAT_TYPES = frozenset({FieldDescriptor.TYPE_FLOAT, FieldDescriptor.TYPE_DOUBLE})
#: (message, field) of the 64-bit integers Triton 2.51 leaves as strings: its ModelConfigToJson turns a fixed list of
#: them back into numbers, and these are not on it
_INT64_KEPT_AS_STRINGS = frozenset({
    ("inference.ModelOptimizationPolicy.Cuda.GraphSpec.Shape", "dim"),
    ("inference.ModelSequenceBatching.InitialState", "dims"),
    ("inference.ModelInstanceGroup.SecondaryDevice", "device_id"),
})


def _as_triton_prints(value: dict, descriptor) -> dict:
    """``value`` (json_format's dict of a ``descriptor`` message) as Triton's JSON printer writes it.

    * json_format puts the fields that are set first and the defaults after them; Triton's printer (protobuf's
      C++ one, as ``/v2/models/<m>/config`` serves it) writes every message's fields in the order the ``.proto``
      file declares them (``ModelInstanceGroup``: name, kind, count, ...), except that a scalar member of a
      ``oneof`` comes after the other fields (``initial_state``: data_type, dims, name, zero_data). A map keeps its
      entries' order: Triton's is its hash map's, which no client can rely on.
    * json_format writes int64/uint64 fields as strings; Triton writes numbers, except ``_INT64_KEPT_AS_STRINGS``.
      Only fields declared 64-bit integers change: a string parameter such as ``"10"`` stays a string.
    * a whole float is written without a fraction (``fp32_false_true: [0,1]``, ``minimum_slot_utilization: 0``).
    """
    printed = {}
    scalar_oneofs = [f for f in descriptor.fields if f.containing_oneof is not None and f.message_type is None]
    for field in [f for f in descriptor.fields if f not in scalar_oneofs] + scalar_oneofs:
        if field.name not in value:
            continue
        item = value[field.name]
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            entry = field.message_type.fields_by_name["value"]
            if entry.message_type is not None:
                item = {key: _as_triton_prints(element, entry.message_type) for key, element in item.items()}
            elif entry.type in _INT64_TYPES:
                item = {key: int(element) for key, element in item.items()}
        elif field.message_type is not None:
            if isinstance(item, list):
                item = [_as_triton_prints(element, field.message_type) for element in item]
            else:
                item = _as_triton_prints(item, field.message_type)
        elif field.type in _INT64_TYPES and (descriptor.full_name, field.name) not in _INT64_KEPT_AS_STRINGS:
            item = [int(element) for element in item] if isinstance(item, list) else int(item)
        elif field.type in _FLOAT_TYPES:
            item = [_float(element) for element in item] if isinstance(item, list) else _float(item)
        printed[field.name] = item
    return printed


def _float(value: float | str) -> float | int | str:
    """A float as Triton's printer writes it: a whole number without ``.0`` (``NaN`` and the like stay strings)."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return int(value)
    return value


def version_number(folder: str) -> int | None:
    """The version a model directory's sub-folder holds, as Triton 2.51 reads its name (``VersionsToLoad``): ASCII
    digits without a leading zero (``0`` itself is version 0; Triton ignores ``01`` with a warning); None for any
    other name (Triton would read ``2a`` as 2 and ``-1`` as -1, then never finish loading them)."""
    if not (folder.isascii() and folder.isdigit()) or (len(folder) > 1 and folder.startswith("0")):
        return None
    return int(folder)


def config_path(model_dir: Path, config_name: str = "") -> Path:
    """The model's configuration file: ``configs/<config_name>.pbtxt`` when ``--model-config-name`` names one
    that exists in the model directory (Triton's custom configurations), else ``config.pbtxt``."""
    if config_name:
        custom = model_dir / "configs" / f"{config_name}.pbtxt"
        if custom.is_file():
            return custom
    return model_dir / "config.pbtxt"


def load_config(model_dir: Path, model_name: str, config_name: str = "", autocomplete: bool = True) -> mc.ModelConfig:
    """Read the model's configuration file (``config_path``; an empty config when absent: auto-complete fills it;
    without auto-complete Triton's poll refuses a model that has none, in its words)."""
    path = config_path(model_dir, config_name)
    shown = path.relative_to(model_dir)
    if not path.exists():
        if not autocomplete:
            raise PollRefused(f"failed to open text file for read {path}: No such file or directory")
        config = mc.ModelConfig()
    else:
        try:
            text = path.read_text()
        except (OSError, UnicodeDecodeError) as exc:
            raise PollRefused(f"failed to read {shown} of model '{model_name}': {exc}") from None
        config = parse_config_text(text, model_name)
    if config.name and config.name != model_name:
        raise PollRefused(
            f"model name '{config.name}' in {shown} does not match the model directory '{model_name}'"
        )
    config.name = model_name
    return config


def resolve_backend(config: mc.ModelConfig, model_dir: Path) -> str:
    """Backend name from ``backend``, ``platform`` or the model file present; fills both fields as Triton does."""
    if config.backend:
        backend = config.backend
    elif config.platform:
        if config.platform not in PLATFORM_BACKENDS:  # Triton's ValidateModelConfig, while it polls
            raise PollRefused(f"unexpected platform type '{config.platform}' for {config.name}")
        backend = PLATFORM_BACKENDS[config.platform]
    else:
        backend = _backend_from_files(config, model_dir)
        if not backend:  # Triton's words, while it polls (no version folder holds one of FILE_BACKENDS)
            raise PollRefused(f"Invalid model name: Could not determine backend for model '{config.name}' with no "
                              "backend in model configuration. Expected model name of the form 'model.<backend_name>'.")
    if config.platform == "ensemble":
        return "ensemble"
    config.backend = backend
    if not config.platform and backend in BACKEND_PLATFORMS:
        config.platform = BACKEND_PLATFORMS[backend]
    return backend


def _backend_from_files(config: mc.ModelConfig, model_dir: Path) -> str:
    names = [config.default_model_filename] if config.default_model_filename else list(FILE_BACKENDS)
    for version_dir in sorted(model_dir.iterdir() if model_dir.is_dir() else []):
        if not version_dir.is_dir() or version_number(version_dir.name) is None:
            continue
        for name in names:
            if (version_dir / name).exists() and name in FILE_BACKENDS:
                return FILE_BACKENDS[name]
    return ""
