#!/usr/bin/env python3
"""Generate the ONNX models of the embedded default model repository (``serving_pod/default_models``).

The repository ships with the package so ``ferry-server`` can start on a fresh machine with no
external models. This script writes, deterministically (fixed opset, IR version and random seed),
each ONNX model's ``1/model.onnx`` and ``config.pbtxt``; the python models there (``add_sub_py``,
``double_py``) are plain source files and are left alone. The generated files are committed;
``--check`` verifies they are up to date (exit 1 naming the stale files otherwise).

    python tools/make_default_models.py            # rewrite serving_pod/default_models
    python tools/make_default_models.py --check    # compare, write nothing

Models (I/O as Triton's examples and ../shared/models/bench, so clients and perf commands carry over):
  simple          INT32 add/sub: INPUT0, INPUT1 [16] -> OUTPUT0 = sum, OUTPUT1 = difference; max_batch_size 8
  simple_string   the same on decimal strings (BYTES), like Triton's simple_string
  mlp_onnx        FP32 MLP 256 -> 128 (ReLU) -> 64, fixed-seed weights; max_batch_size 64, dynamic batching
Needs the ``onnx`` package (a test extra), not the server.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

OPSET = 13
IR_VERSION = 7  # readable by every onnxruntime the project supports (>= 1.16)
SEED = 20240601
DEFAULT_OUTPUT = Path(__file__).resolve().parent.parent / "serving_pod" / "default_models"

SIMPLE_CONFIG = """\
name: "{name}"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [
  {{ name: "INPUT0" data_type: {dtype} dims: [ 16 ] }},
  {{ name: "INPUT1" data_type: {dtype} dims: [ 16 ] }}
]
output [
  {{ name: "OUTPUT0" data_type: {dtype} dims: [ 16 ] }},
  {{ name: "OUTPUT1" data_type: {dtype} dims: [ 16 ] }}
]
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
"""

MLP_CONFIG = """\
name: "mlp_onnx"
platform: "onnxruntime_onnx"
max_batch_size: 64
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 256 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 64 ] } ]
dynamic_batching { max_queue_delay_microseconds: 200 }
instance_group [ { count: 1 kind: KIND_CPU } ]
"""


def _model(graph):  # type: ignore[no-untyped-def]
    from onnx import helper

    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="ferry")
    model.ir_version = IR_VERSION
    return model


def simple_model(string: bool = False):  # type: ignore[no-untyped-def]
    """Add/sub over two [batch, 16] tensors; ``string`` computes on decimal strings (Cast in and out)."""
    from onnx import TensorProto, helper

    io_type = TensorProto.STRING if string else TensorProto.INT32
    nodes = []
    a, b = "INPUT0", "INPUT1"
    if string:
        nodes += [
            helper.make_node("Cast", ["INPUT0"], ["a"], to=TensorProto.INT32),
            helper.make_node("Cast", ["INPUT1"], ["b"], to=TensorProto.INT32),
        ]
        a, b = "a", "b"
    sums, diffs = ("sum", "diff") if string else ("OUTPUT0", "OUTPUT1")
    nodes += [helper.make_node("Add", [a, b], [sums]), helper.make_node("Sub", [a, b], [diffs])]
    if string:
        nodes += [
            helper.make_node("Cast", ["sum"], ["OUTPUT0"], to=TensorProto.STRING),
            helper.make_node("Cast", ["diff"], ["OUTPUT1"], to=TensorProto.STRING),
        ]
    shape = ["batch", 16]
    graph = helper.make_graph(
        nodes,
        "simple_string" if string else "simple",
        [helper.make_tensor_value_info(name, io_type, shape) for name in ("INPUT0", "INPUT1")],
        [helper.make_tensor_value_info(name, io_type, shape) for name in ("OUTPUT0", "OUTPUT1")],
    )
    return _model(graph)


def mlp_model(sizes: tuple[int, ...] = (256, 128, 64), seed: int = SEED):  # type: ignore[no-untyped-def]
    """Dense layers with ReLU between them; weights from a fixed-seed generator, scaled for stable outputs."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    nodes, initializers = [], []
    current = "INPUT0"
    for index, (fan_in, fan_out) in enumerate(zip(sizes, sizes[1:])):
        weight = (rng.standard_normal((fan_in, fan_out)) / np.sqrt(fan_in)).astype(np.float32)
        bias = (rng.standard_normal(fan_out) * 0.01).astype(np.float32)
        initializers += [numpy_helper.from_array(weight, f"w{index}"), numpy_helper.from_array(bias, f"b{index}")]
        last = index == len(sizes) - 2
        nodes.append(helper.make_node("MatMul", [current, f"w{index}"], [f"mm{index}"]))
        nodes.append(helper.make_node("Add", [f"mm{index}", f"b{index}"], ["OUTPUT0" if last else f"pre{index}"]))
        if not last:
            nodes.append(helper.make_node("Relu", [f"pre{index}"], [f"h{index}"]))
            current = f"h{index}"
    graph = helper.make_graph(
        nodes,
        "mlp_onnx",
        [helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, ["batch", sizes[0]])],
        [helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, ["batch", sizes[-1]])],
        initializer=initializers,
    )
    return _model(graph)


def generated_files() -> dict[str, bytes]:
    """Relative path -> content of every generated file."""
    return {
        "simple/config.pbtxt": SIMPLE_CONFIG.format(name="simple", dtype="TYPE_INT32").encode(),
        "simple/1/model.onnx": simple_model().SerializeToString(),
        "simple_string/config.pbtxt": SIMPLE_CONFIG.format(name="simple_string", dtype="TYPE_STRING").encode(),
        "simple_string/1/model.onnx": simple_model(string=True).SerializeToString(),
        "mlp_onnx/config.pbtxt": MLP_CONFIG.encode(),
        "mlp_onnx/1/model.onnx": mlp_model().SerializeToString(),
    }


def write(output: Path) -> list[Path]:
    written = []
    for relative, content in generated_files().items():
        path = output / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)
        written.append(path)
    return written


def stale(output: Path) -> list[str]:
    """Generated files that are missing or differ in ``output`` (ONNX compared as parsed protos)."""
    import onnx

    problems = []
    for relative, content in generated_files().items():
        path = output / relative
        if not path.is_file():
            problems.append(f"{relative} (missing)")
        elif path.suffix == ".onnx":
            if onnx.load_from_string(path.read_bytes()) != onnx.load_from_string(content):
                problems.append(f"{relative} (differs)")
        elif path.read_bytes() != content:
            problems.append(f"{relative} (differs)")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT, help="model repository folder")
    parser.add_argument("--check", action="store_true", help="only verify the committed files are up to date")
    args = parser.parse_args(argv)
    if args.check:
        problems = stale(args.output)
        for problem in problems:
            print(f"stale: {problem}", file=sys.stderr)
        if problems:
            print("run: python tools/make_default_models.py", file=sys.stderr)
        return 1 if problems else 0
    for path in write(args.output):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
