"""Generate ``benchmarks/models/mlp_onnx/1/model.onnx``: a 3-layer MLP, FP32[batch,256] -> FP32[batch,64].

Same graph and I/O as the reference bench model (MatMul/Add/Relu x3, widths 256-512-512-64, opset 17),
with weights drawn from a fixed seed so the file is reproducible byte for byte::

    python -m benchmarks.make_models            # (re)write the shipped model
    python -m benchmarks.make_models --check    # exit 1 if the shipped file differs from a fresh build
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

MLP_PATH = Path(__file__).resolve().parent / "models" / "mlp_onnx" / "1" / "model.onnx"
WIDTHS = (256, 512, 512, 64)
SEED = 20261121


def build_mlp_bytes(seed: int = SEED) -> bytes:
    """Serialized ONNX model; deterministic for a given seed and onnx version."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    nodes: list[onnx.NodeProto] = []
    inits: list[onnx.TensorProto] = []
    current = "INPUT0"
    layers = len(WIDTHS) - 1
    for i, (fan_in, fan_out) in enumerate(zip(WIDTHS, WIDTHS[1:])):
        weight = (rng.standard_normal((fan_in, fan_out)) * np.sqrt(2.0 / fan_in)).astype(np.float32)
        bias = (rng.standard_normal(fan_out) * 0.01).astype(np.float32)
        inits += [numpy_helper.from_array(weight, f"w{i}"), numpy_helper.from_array(bias, f"b{i}")]
        last = i == layers - 1
        added = "OUTPUT0" if last else f"a{i}"
        nodes += [helper.make_node("MatMul", [current, f"w{i}"], [f"mm{i}"]),
                  helper.make_node("Add", [f"mm{i}", f"b{i}"], [added])]
        if not last:
            nodes.append(helper.make_node("Relu", [added], [f"h{i}"]))
            current = f"h{i}"
    graph = helper.make_graph(
        nodes, "mlp",
        [helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, ["batch", WIDTHS[0]])],
        [helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, ["batch", WIDTHS[-1]])],
        initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="ferry-benchmarks")
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model.SerializeToString()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="compare instead of writing")
    args = parser.parse_args(argv)
    fresh = build_mlp_bytes()
    if args.check:
        same = MLP_PATH.exists() and MLP_PATH.read_bytes() == fresh
        print(f"{MLP_PATH}: {'up to date' if same else 'DIFFERS from a fresh build'}")
        return 0 if same else 1
    MLP_PATH.parent.mkdir(parents=True, exist_ok=True)
    MLP_PATH.write_bytes(fresh)
    print(f"wrote {MLP_PATH} ({len(fresh)} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
