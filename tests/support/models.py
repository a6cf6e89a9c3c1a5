"""Small ONNX test models written as Triton model directories (``config.pbtxt`` + ``<version>/model.onnx``).

Shared by every test that needs a real ONNX model: backend tests, scheduler and batching tests,
protocol parity tests. Built with the ``onnx`` package at test time (nothing binary is committed
for tests). Each ``make_*`` function writes ``<path>/config.pbtxt`` (unless ``config=False``, to
exercise auto-complete) and ``<path>/<version>/model.onnx`` and returns ``path``; the model name is
the folder name.

    make_add_sub_model(tmp_path / "add_sub", "TYPE_INT8", dims=(4,), max_batch=8)
    make_identity_model(tmp_path / "id_str", "TYPE_STRING", dims=(-1,), max_batch=0)
    make_state_model(tmp_path / "acc")       # implicit-state accumulator for the sequence batcher
    make_slow_model(tmp_path / "slow", iterations=2000)   # ~25 ms of CPU per execution
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import numpy as np

OPSET = 13
IR_VERSION = 7

#: Triton config type -> (onnx.TensorProto element type, numpy dtype used to feed it).
ONNX_TYPES: dict[str, tuple[int, Any]] = {
    "TYPE_BOOL": (9, np.bool_),
    "TYPE_UINT8": (2, np.uint8),
    "TYPE_UINT16": (4, np.uint16),
    "TYPE_UINT32": (12, np.uint32),
    "TYPE_UINT64": (13, np.uint64),
    "TYPE_INT8": (3, np.int8),
    "TYPE_INT16": (5, np.int16),
    "TYPE_INT32": (6, np.int32),
    "TYPE_INT64": (7, np.int64),
    "TYPE_FP16": (10, np.float16),
    "TYPE_FP32": (1, np.float32),
    "TYPE_FP64": (11, np.float64),
    "TYPE_BF16": (16, np.uint16),  # BF16 bit patterns ride as uint16, as on the wire
    "TYPE_STRING": (8, np.object_),
}
#: types onnx's Add/Sub accept directly at OPSET; others are computed in INT32 and cast back.
_ADD_SUB_NATIVE = {"TYPE_UINT32", "TYPE_UINT64", "TYPE_INT32", "TYPE_INT64", "TYPE_FP16", "TYPE_FP32", "TYPE_FP64"}


def tensor_config(name: str, dtype: str, dims: Sequence[int], reshape: Sequence[int] | None = None) -> str:
    """One ``input``/``output`` entry of config.pbtxt."""
    text = f'{{ name: "{name}" data_type: {dtype} dims: [ {", ".join(str(d) for d in dims)} ]'
    if reshape is not None:
        text += f' reshape: {{ shape: [ {", ".join(str(d) for d in reshape)} ] }}'
    return text + " }"


def config_text(
    name: str,
    max_batch: int,
    inputs: Sequence[str],
    outputs: Sequence[str],
    extra: str = "",
) -> str:
    """config.pbtxt for an ONNX model; ``inputs``/``outputs`` are ``tensor_config`` entries."""
    return (
        f'name: "{name}"\nplatform: "onnxruntime_onnx"\nmax_batch_size: {max_batch}\n'
        f"input [\n  {','.join(inputs)}\n]\noutput [\n  {','.join(outputs)}\n]\n{extra}"
    )


def write_model(path: Path, model: Any, config: str | None, version: int = 1) -> Path:
    """Write ``model`` (an onnx ModelProto) and ``config`` as a Triton model directory."""
    (path / str(version)).mkdir(parents=True, exist_ok=True)
    (path / str(version) / "model.onnx").write_bytes(model.SerializeToString())
    if config is not None:
        (path / "config.pbtxt").write_text(config)
    return path


def onnx_model(nodes: list[Any], inputs: list[Any], outputs: list[Any], initializers: Sequence[Any] = ()) -> Any:
    from onnx import helper

    graph = helper.make_graph(nodes, "test", inputs, outputs, initializer=list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = IR_VERSION
    return model


def value_info(name: str, dtype: str, dims: Sequence[int], max_batch: int) -> Any:
    """A graph input/output: ``dims`` plus a dynamic batch dim when ``max_batch > 0``; -1 -> dynamic."""
    from onnx import helper

    shape: list[Any] = [None if d == -1 else d for d in dims]
    if max_batch > 0:
        shape = ["batch", *shape]
    return helper.make_tensor_value_info(name, ONNX_TYPES[dtype][0], shape)


def make_add_sub_model(
    path: Path, dtype: str = "TYPE_INT32", dims: Sequence[int] = (16,), max_batch: int = 8, *, config: bool = True
) -> Path:
    """Triton's ``simple`` for any numeric type or STRING: OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1.

    Small integer types and STRING (decimal text) are computed in INT32 and cast back.
    """
    from onnx import helper

    if dtype in ("TYPE_BOOL", "TYPE_BF16"):
        raise ValueError(f"add/sub is not defined for {dtype}; use make_identity_model")
    nodes = []
    a, b, out0, out1 = "INPUT0", "INPUT1", "OUTPUT0", "OUTPUT1"
    if dtype not in _ADD_SUB_NATIVE:
        int32, back = ONNX_TYPES["TYPE_INT32"][0], ONNX_TYPES[dtype][0]
        nodes += [helper.make_node("Cast", ["INPUT0"], ["a"], to=int32), helper.make_node("Cast", ["INPUT1"], ["b"], to=int32)]
        nodes += [helper.make_node("Cast", ["sum"], ["OUTPUT0"], to=back), helper.make_node("Cast", ["diff"], ["OUTPUT1"], to=back)]
        a, b, out0, out1 = "a", "b", "sum", "diff"
    nodes += [helper.make_node("Add", [a, b], [out0]), helper.make_node("Sub", [a, b], [out1])]
    model = onnx_model(
        nodes,
        [value_info(name, dtype, dims, max_batch) for name in ("INPUT0", "INPUT1")],
        [value_info(name, dtype, dims, max_batch) for name in ("OUTPUT0", "OUTPUT1")],
    )
    text = config_text(
        path.name,
        max_batch,
        [tensor_config(name, dtype, dims) for name in ("INPUT0", "INPUT1")],
        [tensor_config(name, dtype, dims) for name in ("OUTPUT0", "OUTPUT1")],
    )
    return write_model(path, model, text if config else None)


def make_identity_model(
    path: Path,
    dtype: str = "TYPE_FP32",
    dims: Sequence[int] = (-1,),
    max_batch: int = 8,
    *,
    config: bool = True,
    inputs: int = 1,
    extra_config: str = "",
) -> Path:
    """OUTPUTi = INPUTi for ``inputs`` pairs, any datatype (BOOL, FP16, BF16, STRING included)."""
    from onnx import helper

    names = [(f"INPUT{i}", f"OUTPUT{i}") for i in range(inputs)]
    model = onnx_model(
        [helper.make_node("Identity", [i], [o]) for i, o in names],
        [value_info(i, dtype, dims, max_batch) for i, _ in names],
        [value_info(o, dtype, dims, max_batch) for _, o in names],
    )
    text = config_text(
        path.name,
        max_batch,
        [tensor_config(i, dtype, dims) for i, _ in names],
        [tensor_config(o, dtype, dims) for _, o in names],
        extra_config,
    )
    return write_model(path, model, text if config else None)


def make_state_model(path: Path, max_batch: int = 8, *, extra_config: str = "") -> Path:
    """Implicit-state accumulator: OUTPUT = INPUT + STATE_IN, and the new state STATE_OUT = that sum (INT32 [1]).

    The config declares ``sequence_batching { state [...] }`` with a zero initial state, as Triton's
    implicit-state docs do; the sequence scheduler feeds STATE_IN and keeps STATE_OUT.
    """
    from onnx import helper

    model = onnx_model(
        [helper.make_node("Add", ["INPUT", "STATE_IN"], ["OUTPUT"]), helper.make_node("Identity", ["OUTPUT"], ["STATE_OUT"])],
        [value_info("INPUT", "TYPE_INT32", (1,), max_batch), value_info("STATE_IN", "TYPE_INT32", (1,), max_batch)],
        [value_info("OUTPUT", "TYPE_INT32", (1,), max_batch), value_info("STATE_OUT", "TYPE_INT32", (1,), max_batch)],
    )
    sequence = (
        "sequence_batching {\n  state [ { input_name: \"STATE_IN\" output_name: \"STATE_OUT\" "
        "data_type: TYPE_INT32 dims: [ 1 ] initial_state: { data_type: TYPE_INT32 dims: [ 1 ] "
        "zero_data: true name: \"zeros\" } } ]\n}\n"
    )
    text = config_text(
        path.name,
        max_batch,
        [tensor_config("INPUT", "TYPE_INT32", (1,))],
        [tensor_config("OUTPUT", "TYPE_INT32", (1,))],
        sequence + extra_config,
    )
    return write_model(path, model, text)


def make_slow_model(path: Path, iterations: int = 2000, max_batch: int = 8, *, extra_config: str = "") -> Path:
    """FP32 [-1] identity that burns CPU in an ONNX ``Loop`` of ``iterations`` steps before answering.

    ONNX has no sleep: the delay is compute, about 10 us per iteration on one core (2000 -> ~25 ms),
    so use it where "slow" matters (queueing, batching under load), never for exact timing.
    """
    from onnx import TensorProto, helper, numpy_helper

    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]), helper.make_node("Add", ["acc_in", "one"], ["acc_out"])],
        "spin",
        [
            helper.make_tensor_value_info("i", TensorProto.INT64, []),
            helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
            helper.make_tensor_value_info("acc_in", TensorProto.FLOAT, [1]),
        ],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []), helper.make_tensor_value_info("acc_out", TensorProto.FLOAT, [1])],
        initializer=[numpy_helper.from_array(np.ones(1, np.float32), "one")],
    )
    nodes = [
        helper.make_node("Loop", ["trips", "cond", "zero"], ["spun"], body=body),
        helper.make_node("Mul", ["spun", "nil"], ["nothing"]),  # 0 * spun: keeps the loop in the graph
        helper.make_node("Add", ["INPUT0", "nothing"], ["OUTPUT0"]),
    ]
    initializers = [
        numpy_helper.from_array(np.array(iterations, np.int64), "trips"),
        numpy_helper.from_array(np.array(True), "cond"),
        numpy_helper.from_array(np.zeros(1, np.float32), "zero"),
        numpy_helper.from_array(np.zeros(1, np.float32), "nil"),
    ]
    model = onnx_model(
        nodes,
        [value_info("INPUT0", "TYPE_FP32", (-1,), max_batch)],
        [value_info("OUTPUT0", "TYPE_FP32", (-1,), max_batch)],
        initializers,
    )
    text = config_text(
        path.name,
        max_batch,
        [tensor_config("INPUT0", "TYPE_FP32", (-1,))],
        [tensor_config("OUTPUT0", "TYPE_FP32", (-1,))],
        extra_config,
    )
    return write_model(path, model, text)


def sample(dtype: str, shape: Sequence[int], seed: int = 0) -> np.ndarray:
    """Deterministic test data of a config type (small values, so add/sub stays in range)."""
    rng = np.random.default_rng(seed)
    numpy_type = ONNX_TYPES[dtype][1]
    if dtype == "TYPE_STRING":
        values = rng.integers(-50, 50, size=shape)
        out = np.empty(values.shape, dtype=np.object_)
        out.flat = [str(v).encode() for v in values.flat]
        return out
    if dtype == "TYPE_BOOL":
        return rng.integers(0, 2, size=shape).astype(np.bool_)
    if dtype == "TYPE_BF16":
        floats = rng.standard_normal(shape).astype(np.float32)
        return (floats.view(np.uint32) >> 16).astype(np.uint16)
    if dtype.startswith("TYPE_UINT"):
        return rng.integers(0, 50, size=shape).astype(numpy_type)
    if dtype.startswith("TYPE_INT"):
        return rng.integers(-50, 50, size=shape).astype(numpy_type)
    return rng.standard_normal(shape).astype(numpy_type)
