"""A request checked against its model's config, in the order and words of Triton 2.51's core.

``Model.validate`` calls ``check``; the engine calls that for both protocols once the model is known. Triton's
``InferenceRequest`` refuses a repeated input as it is added, then ``Normalize`` checks the requested outputs,
the input count, each input's name, the batch dimension of every input, the batch size, and last each input's
datatype, shape and data size (``ValidateRequestInputs``, ``ValidateBytesInputs``). The codecs leave the data
size to this module (``datatypes.DataDefect``), so that a request wrong in two ways is refused for the same
one as by Triton, in the same words. Most refusals start with ``[request id: <id>] `` (``<id_unknown>`` for a
request without an id); an unknown input or output does not (Triton's ``Model::GetInput`` words them).

Triton keeps a request's inputs in a ``std::unordered_map`` and makes every check after the repeated-input one in
that map's order: for two inputs the reverse of the request's, in general libstdc++'s hash order
(``triton_order``). A refused request is checked again in that order, so the input named is Triton's (the other
one of two whose batch sizes differ, the second of two wrong ones); an accepted request never pays for it.

Where Triton takes what it should not, Ferry refuses in its own words: a required input missing beside an
optional one sent (Triton's model gets None), a batch of 0 (Triton runs it as a batch of one or mis-sizes it),
a BYTES element longer than its data (worded as Triton's python backend words it, after every other check).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from serving_pod.core.datatypes import WIRE_TO_NUMPY
from serving_pod.core.errors import InvalidArgumentError
from serving_pod.core.types import InferRequest, Tensor

if TYPE_CHECKING:
    from serving_pod.core.model import Model

#: the end of Triton's shape refusal for a model that batches
BATCH_NOTE = (
    "NOTE: Setting a non-zero max_batch_size in the model config requires a batch dimension to be prepended to "
    "each input shape. If you want to specify the full shape including the batch dim in your input dims config, "
    "try setting max_batch_size to zero. See the model configuration docs for more info on max_batch_size."
)


def dims(values) -> str:
    """Triton's ``DimsListToString``: ``[-1,16]``."""
    return "[" + ",".join(str(d) for d in values) + "]"


def prefix(request: InferRequest) -> str:
    """Triton's ``LogRequest()``: what its core puts before a refusal."""
    return f"[request id: {request.id or '<id_unknown>'}] "


def _names(names) -> str:
    return "[" + ",".join(f"'{name}'" for name in names) + "]"


def shape_matches(shape: tuple[int, ...], config: tuple[int, ...]) -> bool:
    if len(shape) != len(config):
        return False
    for got, want in zip(shape, config):
        if want != -1 and got != want:
            return False
    return True


#: libstdc++'s bucket counts for a ``std::unordered_map`` grown one element at a time: each holds up to its count
_BUCKETS = (13, 29, 59, 127, 257, 541, 1109, 2357, 5087)
_MASK = (1 << 64) - 1
_MUL = 0xC6A4A7935BD1E995


def _shift_mix(value: int) -> int:
    return value ^ (value >> 47)


def _hash(name: str) -> int:
    """libstdc++'s ``std::hash<std::string>`` (``_Hash_bytes``, 64-bit, seed ``0xc70f6907``)."""
    data = name.encode()
    size = len(data)
    aligned = size & ~7
    value = 0xC70F6907 ^ ((size * _MUL) & _MASK)
    for at in range(0, aligned, 8):
        word = int.from_bytes(data[at:at + 8], "little")
        value = ((value ^ ((_shift_mix((word * _MUL) & _MASK) * _MUL) & _MASK)) * _MUL) & _MASK
    if size & 7:
        value = ((value ^ int.from_bytes(data[aligned:], "little")) * _MUL) & _MASK
    return _shift_mix((_shift_mix(value) * _MUL) & _MASK)


def triton_order(names: list[str]) -> list[str]:
    """The order in which Triton's core visits inputs added in the order ``names``: a libstdc++
    ``std::unordered_map``'s, whose nodes are one list where a node goes first among those of its bucket, or
    first of all when its bucket is empty, and a rehash inserts the nodes again in list order. Past the
    buckets known here (5,087 inputs), the names' own order."""
    if len(names) > _BUCKETS[-1]:
        return list(names)
    hashes = {name: _hash(name) for name in names}
    nodes: list[str] = []
    buckets = 0

    def insert(into: list[str], name: str) -> None:
        bucket = hashes[name] % buckets
        for at, other in enumerate(into):
            if hashes[other] % buckets == bucket:
                into.insert(at, name)
                return
        into.insert(0, name)

    for count, name in enumerate(names, 1):
        if count > buckets:
            buckets = next(size for size in _BUCKETS if size >= count)
            old, nodes = nodes, []
            for other in old:
                insert(nodes, other)
        insert(nodes, name)
    return nodes


def _count_error(model: Model, request: InferRequest, inputs: list[Tensor]) -> InvalidArgumentError:
    """Triton's refusal of a request without every required input (or with more inputs than the model has)."""
    sent = [tensor.name for tensor in inputs]
    missing = [name for name in model.inputs if name in model.required_inputs and name not in sent]
    total, required = len(model.inputs), len(model.required_inputs)
    expected = f"{total} inputs" if total == required else f"number of inputs between {required} and {total}"
    # Triton writes "missing required input(s) ]" when none is missing (it drops the "[" of an empty list); Ferry
    # writes "[]" on purpose (tests/serving_pod/core/test_validation_triton.py, FERRY_ONLY)
    return InvalidArgumentError(
        f"{prefix(request)}expected {expected} but got {len(sent)} inputs for model '{model.name}'. Got input(s) "
        f"{_names(sent)}, but missing required input(s) {_names(missing)}. Please provide all required input(s)."
    )


def check(model: Model, request: InferRequest) -> None:
    """InvalidArgumentError, in Triton's words, for the first thing Triton's core refuses in ``request``."""
    inputs = request.inputs
    if len(inputs) > 1 and len({tensor.name for tensor in inputs}) != len(inputs):
        seen: set[str] = set()
        for tensor in inputs:
            if tensor.name in seen:
                raise InvalidArgumentError(f"{prefix(request)}input '{tensor.name}' already exists in request")
            seen.add(tensor.name)
    try:
        _check(model, request, inputs)
        return
    except InvalidArgumentError as error:
        if len(inputs) < 2:
            raise
        refused = error
    by_name = {tensor.name: tensor for tensor in inputs}
    _check(model, request, [by_name[name] for name in triton_order(list(by_name))])
    raise refused  # not reached: the same inputs in another order are refused too


def _check(model: Model, request: InferRequest, inputs: list[Tensor]) -> None:
    """``check`` after the repeated-input one, visiting ``inputs`` in the order given."""
    name = model.name
    specs = model.inputs
    if request.outputs:
        for output in request.outputs:
            if output.name not in model.outputs:
                raise InvalidArgumentError(f"unexpected inference output '{output.name}' for model '{name}'")
    if len(inputs) > len(specs) or len(inputs) < len(model.required_inputs):
        raise _count_error(model, request, inputs)
    present = 0
    for tensor in inputs:
        if tensor.name not in specs:
            raise InvalidArgumentError(f"unexpected inference input '{tensor.name}' for model '{name}'")
        present += tensor.name in model.required_inputs
    if present != len(model.required_inputs):
        raise _count_error(model, request, inputs)
    max_batch = model.max_batch_size
    if max_batch > 0:
        batch = -1
        for tensor in inputs:
            shape = tensor.data.shape
            if not shape:
                raise InvalidArgumentError(
                    f"{prefix(request)}input '{tensor.name}' has no shape but model requires batch dimension "
                    f"for '{name}'"
                )
            if batch == -1:
                batch = shape[0]
            elif shape[0] != batch:
                raise InvalidArgumentError(
                    f"{prefix(request)}input '{tensor.name}' batch size does not match other inputs for '{name}'"
                )
        if batch > max_batch:
            raise InvalidArgumentError(
                f"{prefix(request)}inference request batch-size must be <= {max_batch} for '{name}'"
            )
        if batch < 1:
            raise InvalidArgumentError(f"{prefix(request)}inference request batch-size must be >= 1 for '{name}'")
    late = None
    for tensor in inputs:
        spec = specs[tensor.name]
        if tensor.datatype != spec.datatype:
            sent = tensor.datatype if tensor.datatype in WIRE_TO_NUMPY else "<invalid>"
            raise InvalidArgumentError(
                f"{prefix(request)}inference input '{tensor.name}' data-type is '{sent}', but model '{name}' "
                f"expects '{spec.datatype}'"
            )
        shape = tensor.data.shape
        if not shape_matches(shape[1:] if max_batch > 0 else shape, spec.dims):
            expected, note = ((-1, *spec.dims), BATCH_NOTE) if max_batch > 0 else (spec.dims, "")
            raise InvalidArgumentError(
                f"{prefix(request)}unexpected shape for input '{tensor.name}' for model '{name}'. Expected "
                f"{dims(expected)}, got {dims(shape)}. {note}"
            )
        defect = tensor.defect
        if defect is not None:
            if not defect.late:
                raise InvalidArgumentError(prefix(request) + defect.message(tensor.name, name))
            late = late or (tensor.name, defect)
    if late is not None:  # Triton's backend finds it as the model executes: answered as the model's error
        error = InvalidArgumentError(late[1].message(late[0], name))
        error.in_execution = True
        raise error
