"""What the sequence batcher needs from ``sequence_batching``, parsed once at load, and the tensors it adds.

Neighbours: ``schedulers/sequence.py`` (the scheduler: slots, backlog, idle reaper) uses ``SequenceSpec``
to read a request's sequence parameters and to build the control inputs (START / END / READY /
CORRID) and implicit-state inputs it places in each request before execution. Nothing here does I/O
on the request path; ``initial_state { data_file }`` is read from ``<model>/initial_state/`` at load.

Messages keep Triton's wording where Triton has one (clients match on them).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tritonclient.grpc import model_config_pb2 as mc

from serving_pod.core.datatypes import config_to_wire, numpy_dtype
from serving_pod.core.errors import InvalidArgumentError, ModelLoadError
from serving_pod.core.load_errors import PollRefused
from serving_pod.core.types import Tensor

SequenceKey = int | str

_KIND = mc.ModelSequenceBatching.Control
_BOOL_KINDS = {
    _KIND.CONTROL_SEQUENCE_START: "start",
    _KIND.CONTROL_SEQUENCE_END: "end",
    _KIND.CONTROL_SEQUENCE_READY: "ready",
}
_CORRID_TYPES = ("TYPE_UINT64", "TYPE_INT64", "TYPE_UINT32", "TYPE_INT32", "TYPE_STRING")
DEFAULT_IDLE_US = 1_000_000


class StateFileUnreadable(ModelLoadError):
    """An ``initial_state`` data file that cannot be read: as Triton 2.51, the version fails with an INTERNAL status
    (``Internal: failed to open text file for read <path>: <why>``)."""

    code = "INTERNAL"


@dataclass(frozen=True, slots=True)
class BoolControl:
    """A START / END / READY input: its name, wire datatype and the (false, true) values."""

    name: str
    datatype: str
    false_value: Any
    true_value: Any


@dataclass(frozen=True, slots=True)
class StateSpec:
    """One implicit state: fed as ``input_name``, read back from the response's ``output_name``."""

    input_name: str
    output_name: str
    datatype: str
    #: the state a sequence starts with, without the batch dim
    initial: np.ndarray


@dataclass(frozen=True, slots=True)
class SequenceSpec:
    """Everything the sequence scheduler reads from the config."""

    model_name: str
    batching: bool
    max_batch_size: int
    strategy: str  # "direct" | "oldest"
    idle_ns: int
    #: kind ("start" / "end" / "ready") -> control
    controls: dict[str, BoolControl]
    corrid_name: str
    corrid_datatype: str  # wire datatype, "" when the model has no CORRID control
    states: tuple[StateSpec, ...]
    #: sequence slots per instance: direct: one per batch index; oldest: max_candidate_sequences
    slots_per_instance: int
    queue_delay_ns: int
    minimum_slot_utilization: float
    preferred_batch_sizes: frozenset[int]
    #: ``iterative_sequence``: a request without a correlation ID starts a sequence of its own (``sequence_of``
    #: gives key 0 and START; the scheduler numbers it), which ends when the model releases it without RESCHEDULE
    iterative: bool = False

    # --- request parameters ------------------------------------------------------------------
    def sequence_of(self, parameters: dict[str, Any]) -> tuple[SequenceKey, bool, bool]:
        """``(sequence_id, start, end)`` of a request; Triton's error for a missing id."""
        key = parameters.get("sequence_id", 0)
        if isinstance(key, bool) or not isinstance(key, (int, str)):
            raise InvalidArgumentError(
                f"inference request to model '{self.model_name}': 'sequence_id' must be an unsigned "
                f"integer or a string, got {type(key).__name__}"
            )
        if isinstance(key, int) and (key < 0 or key >= 2**64):
            raise InvalidArgumentError(
                f"inference request to model '{self.model_name}': 'sequence_id' {key} is not a uint64"
            )
        if not key and self.iterative:
            return 0, True, False  # Triton's IterativeSequencer: a sequence of its own, START set
        if not key:
            raise InvalidArgumentError(
                f"inference request to model '{self.model_name}' must specify a non-zero or non-empty "
                "correlation ID"
            )
        start = _flag(parameters, "sequence_start", self.model_name)
        end = _flag(parameters, "sequence_end", self.model_name)
        if self.corrid_name:
            got = "BYTES" if isinstance(key, str) else "UINT64"
            if (got == "BYTES") != (self.corrid_datatype == "BYTES"):
                raise InvalidArgumentError(
                    f"sequence batching control '{self.corrid_name}' data-type is '{got}', but model "
                    f"'{self.model_name}' expects '{self.corrid_datatype}'"
                )
        return key, start, end

    # --- tensors the scheduler adds ----------------------------------------------------------
    def control_tensors(self, start: bool, end: bool, ready: bool, key: SequenceKey) -> list[Tensor]:
        """The control inputs of one request (shape [1, 1] when the model batches, else [1])."""
        shape = (1, 1) if self.batching else (1,)
        tensors = []
        for kind, flag in (("start", start), ("end", end), ("ready", ready)):
            control = self.controls.get(kind)
            if control is not None:
                value = control.true_value if flag else control.false_value
                tensors.append(
                    Tensor(control.name, control.datatype, np.full(shape, value, numpy_dtype(control.datatype)))
                )
        if self.corrid_name:
            if self.corrid_datatype == "BYTES":
                data = np.full(shape, str(key).encode() if ready else b"", dtype=np.object_)
            else:
                data = np.full(shape, corrid_value(key if ready else 0, self.corrid_datatype))
            tensors.append(Tensor(self.corrid_name, self.corrid_datatype, data))
        return tensors

    def initial_states(self) -> dict[str, np.ndarray]:
        """State input name -> the array fed on START (batch dim included when the model batches)."""
        return {
            state.input_name: state.initial[np.newaxis] if self.batching else state.initial
            for state in self.states
        }


def corrid_value(key: int, datatype: str) -> np.generic:
    """``key`` (a uint64) as the CORRID control's ``datatype``, cut to its width as Triton's C++ cast does.

    Triton 2.51 hands a model whose CORRID is TYPE_INT32 the low 32 bits of the id (2**40 + 7 -> 7) and a TYPE_INT64
    one the id's bits read as signed; a plain ``np.full`` would raise OverflowError there, failing the batch.
    """
    return np.uint64(key).astype(numpy_dtype(datatype))


def _flag(parameters: dict[str, Any], name: str, model: str) -> bool:
    value = parameters.get(name, False)
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    raise InvalidArgumentError(
        f"inference request to model '{model}': parameter '{name}' must be a boolean, got {value!r}"
    )


def parse_sequence_config(config: mc.ModelConfig, model_dir: Path | None) -> SequenceSpec:
    """``SequenceSpec`` of ``config``; ModelLoadError naming the model and field on a bad config (a bad control is
    a ``PollRefused``: Triton refuses it while polling the repository, before a version's scheduler is made)."""
    name = config.name
    sequence = config.sequence_batching
    controls: dict[str, BoolControl] = {}
    corrid_name, corrid_type = "", ""
    seen: set[str] = set()
    for control_input in sequence.control_input:
        if not control_input.name:
            raise PollRefused(f"sequence batching control tensor must have a name for {name}")
        if control_input.name in seen:
            raise PollRefused(
                f"sequence batching control tensor '{control_input.name}' is specified for multiple "
                f"control kinds for {name}"
            )
        seen.add(control_input.name)
        for control in control_input.control:
            kind_name = _KIND.Kind.Name(control.kind)
            if control.kind == _KIND.CONTROL_SEQUENCE_CORRID:
                if corrid_name:
                    raise PollRefused(f"sequence batching specifies multiple {kind_name} tensors for {name}")
                corrid_name, corrid_type = control_input.name, _corrid_type(control, name)
                continue
            kind = _BOOL_KINDS.get(control.kind)
            if kind is None:
                raise PollRefused(f"sequence batching control kind {kind_name} is not supported for {name}")
            if kind in controls:
                raise PollRefused(f"sequence batching specifies multiple {kind_name} tensors for {name}")
            controls[kind] = _bool_control(control_input.name, control, kind_name, name)
    strategy = "oldest" if sequence.HasField("oldest") else "direct"
    batching = config.max_batch_size > 0
    if strategy == "oldest":
        oldest = sequence.oldest
        slots = oldest.max_candidate_sequences or max(1, config.max_batch_size)
        delay_us, utilization = oldest.max_queue_delay_microseconds, 0.0
        preferred = frozenset(oldest.preferred_batch_size)
    else:
        direct = sequence.direct
        slots = max(1, config.max_batch_size)
        delay_us, utilization = direct.max_queue_delay_microseconds, direct.minimum_slot_utilization
        preferred = frozenset()
    idle_us = sequence.max_sequence_idle_microseconds or DEFAULT_IDLE_US
    return SequenceSpec(
        model_name=name,
        batching=batching,
        max_batch_size=config.max_batch_size,
        strategy=strategy,
        idle_ns=idle_us * 1000,
        controls=controls,
        corrid_name=corrid_name,
        corrid_datatype=config_to_wire(corrid_type) if corrid_name else "",
        states=tuple(_state(state, name, model_dir) for state in sequence.state),
        slots_per_instance=slots,
        queue_delay_ns=delay_us * 1000,
        minimum_slot_utilization=utilization,
        preferred_batch_sizes=preferred,
        iterative=sequence.iterative_sequence,
    )


def _bool_control(tensor: str, control: Any, kind_name: str, model: str) -> BoolControl:
    choices = [
        (field, list(getattr(control, field)))
        for field in ("int32_false_true", "fp32_false_true", "bool_false_true")
        if len(getattr(control, field))
    ]
    if not choices:
        raise PollRefused(
            f"sequence batching must specify either 'int32_false_true', 'fp32_false_true' or "
            f"'bool_false_true' for {kind_name} for {model}"
        )
    if len(choices) > 1:
        raise PollRefused(
            f"sequence batching specifies more than one from 'int32_false_true', 'fp32_false_true' "
            f"and 'bool_false_true' for {kind_name} for {model}"
        )
    field, values = choices[0]
    if len(values) != 2:
        raise PollRefused(
            f"sequence batching control '{field}' must have exactly 2 entries for {kind_name} for {model}"
        )
    datatype = {"int32_false_true": "INT32", "fp32_false_true": "FP32", "bool_false_true": "BOOL"}[field]
    return BoolControl(tensor, datatype, values[0], values[1])


def _corrid_type(control: Any, model: str) -> str:
    if len(control.int32_false_true) or len(control.fp32_false_true) or len(control.bool_false_true):
        raise PollRefused(
            "sequence batching must not specify either 'int32_false_true', 'fp32_false_true' or "
            f"'bool_false_true' for CONTROL_SEQUENCE_CORRID for {model}"
        )
    type_name = mc.DataType.Name(control.data_type)
    if type_name not in _CORRID_TYPES:
        raise PollRefused(
            f"sequence batching control CONTROL_SEQUENCE_CORRID of model '{model}' must have data_type "
            f"TYPE_UINT64, TYPE_INT64, TYPE_UINT32, TYPE_INT32 or TYPE_STRING, got {type_name}"
        )
    return type_name


def _state(state: Any, model: str, model_dir: Path | None) -> StateSpec:
    if not state.input_name or not state.output_name:
        raise ModelLoadError(f"model '{model}': a sequence_batching state needs input_name and output_name")
    type_name = mc.DataType.Name(state.data_type)
    if state.data_type == mc.TYPE_INVALID:
        raise ModelLoadError(f"model '{model}': state '{state.input_name}' has no data_type")
    datatype = config_to_wire(type_name)
    dtype = numpy_dtype(datatype)
    dims = tuple(1 if d == -1 else d for d in state.dims)
    if not state.initial_state:
        return StateSpec(state.input_name, state.output_name, datatype, np.zeros(dims, dtype))
    if len(state.initial_state) > 1:
        raise ModelLoadError(f"State input name '{state.input_name}' specified more than once.")
    initial = state.initial_state[0]
    if initial.data_type != state.data_type:
        raise ModelLoadError(
            f"The data type used for 'initial_state' field of state '{state.input_name}' does not match "
            "the state data type."
        )
    if not initial.name:
        raise ModelLoadError(
            f"Field 'name' must be set when using initial_state for state input '{state.input_name}'."
        )
    if len(initial.dims) != len(state.dims):
        raise ModelLoadError(
            "Number of dimensions in 'initial_state' doesn't match the size of 'state' dimensions for "
            f"state input '{state.input_name}'. {len(initial.dims)} != {len(state.dims)}"
        )
    for got, want in zip(initial.dims, state.dims):
        if got == -1:
            raise ModelLoadError(
                f"'initial_state' field for state input name '{state.input_name}' contains variable "
                "dimensions."
            )
        if want != -1 and got != want:
            raise ModelLoadError(
                f"'initial_state' dim for input name '{state.input_name}' doesn't match 'state' dim "
                f"description. {got} != {want}"
            )
    shape = tuple(initial.dims)
    which = initial.WhichOneof("state_data")
    if which == "zero_data":
        array = np.zeros(shape, dtype) if datatype != "BYTES" else np.full(shape, b"", np.object_)
    elif which == "data_file":
        array = _read_state_file(model, datatype, shape, model_dir, initial.data_file)
    else:
        raise ModelLoadError(
            f"initial_state setting expects state '{state.input_name}' to have state_data set"
        )
    return StateSpec(state.input_name, state.output_name, datatype, array)


def _read_state_file(model: str, datatype: str, shape: tuple[int, ...], model_dir: Path | None, file: str) -> np.ndarray:
    if model_dir is None:
        raise ModelLoadError(f"model '{model}': initial_state data_file '{file}' needs the model directory")
    path = Path(model_dir) / "initial_state" / file
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise StateFileUnreadable(f"failed to open text file for read {path}: {exc.strerror}") from None
    if datatype == "BYTES":
        return np.full(shape, raw, dtype=np.object_)
    dtype = numpy_dtype(datatype)
    need = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if len(raw) < need:
        raise ModelLoadError(
            f"initial_state setting expects {need} bytes, but the data provided from {file} only has "
            f"{len(raw)} bytes."
        )
    return np.frombuffer(raw[:need], dtype=dtype).reshape(shape).copy()
