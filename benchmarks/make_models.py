"""Generate ``benchmarks/models/mlp_onnx/1/model.onnx``: a 3-layer MLP, FP32[batch,256] -> FP32[batch,64].

Same graph and I/O as the reference bench model (MatMul/Add/Relu x3, widths 256-512-512-64, opset 17),
with weights drawn from a fixed seed so the file is reproducible byte for byte::

    python -m benchmarks.make_models            # (re)write the shipped model
    python -m benchmarks.make_models --check    # exit 1 if the shipped file differs from a fresh build
    python -m benchmarks.make_models --wide DIR # write DIR/mlp_wide_onnx (not shipped: 17 MB)

``mlp_wide_onnx`` has the same I/O and batching config with hidden widths 2048 (256-2048-2048-64): about
a millisecond per execution here, so its executions run on the instance's thread rather than inline on
the event loop (``schedulers/instances.py``); ``benchmarks.batching --model-repository DIR --model
mlp_wide_onnx`` measures that path.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

MLP_PATH = Path(__file__).resolve().parent / "models" / "mlp_onnx" / "1" / "model.onnx"
WIDTHS = (256, 512, 512, 64)
WIDE_WIDTHS = (256, 2048, 2048, 64)
WIDE_NAME = "mlp_wide_onnx"
SEED = 20261121


def build_mlp_bytes(seed: int = SEED, widths: tuple[int, ...] = WIDTHS) -> bytes:
    """Serialized ONNX model; deterministic for a given seed and onnx version."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    nodes: list[onnx.NodeProto] = []
    inits: list[onnx.TensorProto] = []
    current = "INPUT0"
    layers = len(widths) - 1
    for i, (fan_in, fan_out) in enumerate(zip(widths, widths[1:])):
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
        [helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, ["batch", widths[0]])],
        [helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, ["batch", widths[-1]])],
        initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="ferry-benchmarks")
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model.SerializeToString()


def write_wide(repository: Path) -> Path:
    """``repository/mlp_wide_onnx``: the wide MLP with the shipped ``mlp_onnx`` config renamed; the model path."""
    source = MLP_PATH.parent.parent / "config.pbtxt"
    config = source.read_text().replace('name: "mlp_onnx"', f'name: "{WIDE_NAME}"')
    config = config.replace("# Benchmark model (onnxruntime): 3-layer MLP",
                            "# Benchmark model (onnxruntime): wide 3-layer MLP (hidden widths 2048)")
    path = repository / WIDE_NAME / "1" / "model.onnx"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(build_mlp_bytes(widths=WIDE_WIDTHS))
    (repository / WIDE_NAME / "config.pbtxt").write_text(config)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="compare instead of writing")
    parser.add_argument("--wide", type=Path, metavar="DIR", help=f"write {WIDE_NAME} into this model repository")
    args = parser.parse_args(argv)
    if args.wide is not None:
        path = write_wide(args.wide)
        print(f"wrote {path.parent}")
        return 0
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
