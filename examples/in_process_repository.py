"""Run a Triton model repository in-process: no HTTP, no gRPC, same engine as the server.

    python examples/in_process_repository.py [MODEL_REPOSITORY]

Defaults to the repository shipped with Ferry (serving_pod/default_models): ONNX and python models.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from serving_pod.pyapi import Engine

DEFAULT_REPOSITORY = Path(__file__).resolve().parents[1] / "serving_pod" / "default_models"


def sample_inputs() -> dict[str, dict[str, np.ndarray]]:
    """One request for each model of the default repository."""
    ints = np.arange(16, dtype=np.int32).reshape(1, 16)
    words = np.array([[str(i).encode() for i in range(16)]], dtype=object)
    return {
        "simple": {"INPUT0": ints, "INPUT1": np.ones_like(ints)},
        "simple_string": {"INPUT0": words, "INPUT1": words},
        "add_sub_py": {"INPUT0": np.arange(4, dtype=np.float32), "INPUT1": np.ones(4, np.float32)},
        "double_py": {"INPUT0": np.linspace(0, 1, 32, dtype=np.float32).reshape(2, 16)},
        "mlp_onnx": {"INPUT0": np.linspace(-1, 1, 512, dtype=np.float32).reshape(2, 256)},
    }


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    repository = argv[0] if argv else DEFAULT_REPOSITORY
    with Engine(repository) as engine:
        print("models:", [(row["name"], row.get("state")) for row in engine.models()])
        result = engine.infer("simple", sample_inputs()["simple"])
        print("simple OUTPUT0 (sum):", result["OUTPUT0"][0, :4].tolist(), "...")
        engine.unload("simple")
        print("simple ready after unload:", engine.is_ready("simple"))
        engine.load("simple")
        print("double_py:", engine.infer("double_py", sample_inputs()["double_py"])["OUTPUT0"][0, :3].tolist())
        stats = engine.statistics("double_py")[0]
        print("double_py inference_count:", stats["inference_count"])
        print([line for line in engine.metrics().splitlines() if line.startswith("nv_inference_count")])


if __name__ == "__main__":
    main()
