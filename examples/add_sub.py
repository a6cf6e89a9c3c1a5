"""Serve a Python function over HTTP and gRPC with dynamic batching (PyTriton-style).

    python examples/add_sub.py --http-port 8000 --grpc-port 8001    # Ctrl-C to stop

then, from another shell:

    python -c "import numpy as np; from serving_pod.pyapi import ModelClient; \
print(ModelClient('grpc://127.0.0.1:8001', 'add_sub').infer_sample(a=np.ones(3, np.float32), b=np.ones(3, np.float32)))"

``@batch`` hands the function every queued request stacked along dim 0 and splits its outputs
back, so concurrent clients share one call.
"""

from __future__ import annotations

import argparse

import numpy as np

from serving_pod.pyapi import DynamicBatcher, ModelConfig, Server, Tensor, batch


@batch
def add_sub(a: np.ndarray, b: np.ndarray) -> dict[str, np.ndarray]:
    return {"add": a + b, "sub": a - b}


def bind_models(target) -> None:
    """Bind this example's model on an ``Engine`` or ``Server``."""
    target.bind(
        "add_sub",
        add_sub,
        inputs=[Tensor("a", np.float32, (-1,)), Tensor("b", np.float32, (-1,))],
        outputs=[Tensor("add", np.float32, (-1,)), Tensor("sub", np.float32, (-1,))],
        config=ModelConfig(max_batch_size=16, batcher=DynamicBatcher(max_queue_delay_microseconds=2000)),
    )


def sample_inputs() -> dict[str, dict[str, np.ndarray]]:
    """Model -> a batch of inputs (used by the tests to compare in-process and served answers)."""
    a = np.arange(8, dtype=np.float32).reshape(2, 4)
    return {"add_sub": {"a": a, "b": np.full((2, 4), 0.5, np.float32)}}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--http-port", type=int, default=8000)
    parser.add_argument("--grpc-port", type=int, default=8001)
    parser.add_argument("--metrics-port", type=int, default=8002)
    args = parser.parse_args(argv)
    with Server(http_port=args.http_port, grpc_port=args.grpc_port, metrics_port=args.metrics_port) as server:
        bind_models(server)
        print(f"serving add_sub at {server.http_url} and {server.grpc_url}", flush=True)
        server.serve()
    print("stopped", flush=True)


if __name__ == "__main__":
    main()
