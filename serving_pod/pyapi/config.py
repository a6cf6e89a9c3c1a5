"""What a bound function declares (``Tensor``, ``ModelConfig``, ``DynamicBatcher``) and the Triton config made from it.

PyTriton's vocabulary with Triton's units in the names. Values are frozen dataclasses checked when
built, so a bad declaration fails at ``bind`` with a message naming the field, never at request time.
``triton_config`` turns a declaration into the JSON config the registry loads for backend
``ferry_callable`` (neighbour: ``serving_pod.backends.callable``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from serving_pod.core.datatypes import NUMPY_TO_WIRE, WIRE_TO_NUMPY, wire_to_config


def wire_type(dtype: Any) -> str:
    """A wire datatype (``FP32``) from a numpy dtype/type, ``bytes``/``str``/``object``, or a Triton name."""
    if isinstance(dtype, str):
        name = dtype.upper()
        name = name[5:] if name.startswith("TYPE_") else name
        name = "BYTES" if name == "STRING" else name
        if name in WIRE_TO_NUMPY:
            return name
    if dtype in (bytes, str, object, np.bytes_, np.str_, np.object_):
        return "BYTES"
    try:
        resolved = np.dtype(dtype)
    except TypeError:
        raise ValueError(f"unsupported tensor dtype {dtype!r}: use a numpy dtype, bytes, or a Triton type name") from None
    if resolved.kind in "OSU":
        return "BYTES"
    if resolved not in NUMPY_TO_WIRE:
        raise ValueError(f"unsupported tensor dtype {resolved}: Triton has no matching data type")
    return NUMPY_TO_WIRE[resolved]


@dataclass(frozen=True, slots=True)
class Tensor:
    """An input or output of a bound model. ``shape`` excludes the batch dimension; -1 is any size."""

    name: str
    dtype: Any
    shape: tuple[int, ...]
    optional: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"a Tensor needs a non-empty name, got {self.name!r}")
        object.__setattr__(self, "shape", tuple(self.shape))
        if not self.shape or any(not isinstance(d, (int, np.integer)) or d < -1 or d == 0 for d in self.shape):
            raise ValueError(
                f"Tensor '{self.name}': shape must be a non-empty sequence of sizes >= 1 or -1, got {self.shape}"
            )
        wire_type(self.dtype)  # fails early on an unusable dtype

    @property
    def datatype(self) -> str:
        """The wire datatype (``FP32``, ``BYTES``...)."""
        return wire_type(self.dtype)


@dataclass(frozen=True, slots=True)
class DynamicBatcher:
    """Triton's ``dynamic_batching`` settings (same names, same units)."""

    max_queue_delay_microseconds: int = 0
    preferred_batch_size: tuple[int, ...] = ()
    preserve_ordering: bool = False
    priority_levels: int = 0
    default_priority_level: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "preferred_batch_size", tuple(self.preferred_batch_size))
        if self.max_queue_delay_microseconds < 0:
            raise ValueError("DynamicBatcher: max_queue_delay_microseconds must be >= 0")
        if any(size < 1 for size in self.preferred_batch_size):
            raise ValueError(f"DynamicBatcher: preferred_batch_size entries must be >= 1, got {self.preferred_batch_size}")


@dataclass(frozen=True, slots=True)
class ModelConfig:
    """How a bound model batches and runs. ``batching=False`` (or ``max_batch_size=0``) means no batch dim.

    ``instances``: how many copies of the function run concurrently (each on its own thread);
    ``decoupled``: the function is a generator streaming responses; ``parameters``: config parameters.
    """

    batching: bool = True
    max_batch_size: int = 4
    batcher: DynamicBatcher | None = field(default_factory=DynamicBatcher)
    instances: int = 1
    decoupled: bool = False
    parameters: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.max_batch_size < 0:
            raise ValueError(f"ModelConfig: max_batch_size must be >= 0, got {self.max_batch_size}")
        if self.batching and self.max_batch_size == 0:
            object.__setattr__(self, "batching", False)
        if self.instances < 1:
            raise ValueError(f"ModelConfig: instances must be >= 1, got {self.instances}")
        if self.batcher is not None and self.batching:
            too_big = [s for s in self.batcher.preferred_batch_size if s > self.max_batch_size]
            if too_big:
                raise ValueError(
                    f"ModelConfig: preferred_batch_size {too_big} exceeds max_batch_size {self.max_batch_size}"
                )

    @property
    def effective_max_batch_size(self) -> int:
        return self.max_batch_size if self.batching else 0


@dataclass(frozen=True, slots=True)
class BoundModel:
    """Everything declared at ``bind``; made current while the function runs (decorators read it)."""

    name: str
    inputs: tuple[Tensor, ...]
    outputs: tuple[Tensor, ...]
    config: ModelConfig


def check_declaration(name: str, inputs: Sequence[Tensor], outputs: Sequence[Tensor]) -> None:
    if not isinstance(name, str) or not name or "/" in name or name.startswith("."):
        raise ValueError(f"invalid model name {name!r}: use a non-empty name without '/'")
    for kind, tensors in (("inputs", inputs), ("outputs", outputs)):
        if not tensors:
            raise ValueError(f"model '{name}': declare at least one of its {kind} (Tensor(name, dtype, shape))")
        for tensor in tensors:
            if not isinstance(tensor, Tensor):
                raise ValueError(f"model '{name}': {kind} must be Tensor values, got {type(tensor).__name__}")
        names = [t.name for t in tensors]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"model '{name}': {kind} {duplicates} are declared more than once")


def triton_config(bound: BoundModel, key: str, backend: str, key_parameter: str) -> dict[str, Any]:
    """The Triton model config (JSON form) loading ``bound`` through the callable backend."""
    config = bound.config

    def tensor(spec: Tensor) -> dict[str, Any]:
        entry: dict[str, Any] = {"name": spec.name, "data_type": wire_to_config(spec.datatype), "dims": list(spec.shape)}
        if spec.optional:
            entry["optional"] = True
        return entry

    result: dict[str, Any] = {
        "name": bound.name,
        "backend": backend,
        "max_batch_size": config.effective_max_batch_size,
        "input": [tensor(t) for t in bound.inputs],
        "output": [tensor(t) for t in bound.outputs],
        "instance_group": [{"count": config.instances, "kind": "KIND_CPU"}],
        "parameters": {key_parameter: {"string_value": key}}
        | {k: {"string_value": str(v)} for k, v in config.parameters.items()},
    }
    if config.decoupled:
        result["model_transaction_policy"] = {"decoupled": True}
    batcher = config.batcher
    if batcher is not None and config.batching:
        result["dynamic_batching"] = {
            "max_queue_delay_microseconds": batcher.max_queue_delay_microseconds,
            "preferred_batch_size": list(batcher.preferred_batch_size),
            "preserve_ordering": batcher.preserve_ordering,
            "priority_levels": batcher.priority_levels,
            "default_priority_level": batcher.default_priority_level,
        }
    return result
