"""The benchmark models shipped in benchmarks/models: reproducible, loadable, same I/O as the reference bench."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from benchmarks import make_models

MODELS = Path(make_models.__file__).resolve().parent / "models"
REFERENCE = Path(__file__).resolve().parents[3] / "shared" / "models" / "bench"


def _config(path: Path) -> model_config_pb2.ModelConfig:
    return text_format.Parse(path.read_text(), model_config_pb2.ModelConfig())


def test_shipped_mlp_is_the_generator_output() -> None:
    pytest.importorskip("onnx")
    assert make_models.MLP_PATH.read_bytes() == make_models.build_mlp_bytes(), \
        "benchmarks/models/mlp_onnx/1/model.onnx is stale: run python -m benchmarks.make_models"


def test_mlp_runs_with_batched_io() -> None:
    ort = pytest.importorskip("onnxruntime")
    session = ort.InferenceSession(str(make_models.MLP_PATH), providers=["CPUExecutionProvider"])
    x = np.random.default_rng(0).standard_normal((5, 256)).astype(np.float32)
    (y,) = session.run(None, {"INPUT0": x})
    assert y.shape == (5, 64) and y.dtype == np.float32
    (y0,) = session.run(None, {"INPUT0": x[:1]})
    np.testing.assert_allclose(y[:1], y0, rtol=1e-4, atol=1e-5)  # rows are independent: batching is safe
    assert np.std(y) > 0.1  # not a degenerate all-zero network


@pytest.mark.parametrize("name", ["double_py", "mlp_onnx"])
def test_configs_parse_as_triton_model_config(name: str) -> None:
    config = _config(MODELS / name / "config.pbtxt")
    assert config.name == name and config.max_batch_size == 64
    assert config.HasField("dynamic_batching")
    assert [i.name for i in config.input] == ["INPUT0"] and [o.name for o in config.output] == ["OUTPUT0"]


@pytest.mark.parametrize("name", ["double_py", "mlp_onnx"])
def test_configs_match_the_reference_bench_when_present(name: str) -> None:
    reference = REFERENCE / name / "config.pbtxt"
    if not reference.exists():
        pytest.skip(f"reference bench models not present at {REFERENCE}")
    assert _config(MODELS / name / "config.pbtxt") == _config(reference)


def test_mlp_graph_io_matches_the_reference_when_present() -> None:
    onnx = pytest.importorskip("onnx")
    reference = REFERENCE / "mlp_onnx" / "1" / "model.onnx"
    if not reference.exists():
        pytest.skip(f"reference bench models not present at {REFERENCE}")

    def signature(model: Any) -> tuple:
        g = model.graph
        return ([n.op_type for n in g.node], [tuple(i.dims) for i in g.initializer],
                [(v.name, v.type.tensor_type.elem_type) for v in (*g.input, *g.output)])

    assert signature(onnx.load(str(make_models.MLP_PATH))) == signature(onnx.load(str(reference)))


def test_wide_mlp_is_written_as_a_model_with_the_shipped_config(tmp_path: Path) -> None:
    ort = pytest.importorskip("onnxruntime")
    assert make_models.main(["--wide", str(tmp_path)]) == 0
    config = _config(tmp_path / make_models.WIDE_NAME / "config.pbtxt")
    shipped = _config(MODELS / "mlp_onnx" / "config.pbtxt")
    assert config.name == make_models.WIDE_NAME
    shipped.name = config.name
    assert config == shipped  # only the name differs
    session = ort.InferenceSession(str(tmp_path / make_models.WIDE_NAME / "1" / "model.onnx"),
                                   providers=["CPUExecutionProvider"])
    x = np.random.default_rng(0).standard_normal((3, 256)).astype(np.float32)
    (y,) = session.run(None, {"INPUT0": x})
    assert y.shape == (3, 64) and np.std(y) > 0.1
    onnx = pytest.importorskip("onnx")
    model = onnx.load(str(tmp_path / make_models.WIDE_NAME / "1" / "model.onnx"))
    assert [tuple(t.dims) for t in model.graph.initializer if len(t.dims) == 2] == [(256, 2048), (2048, 2048), (2048, 64)]


#: the other shapes of work compare_triton measures: model -> (models loaded beside it, OUTPUT0 of each response
#: for an INPUT0 of x)
WORKLOADS = {
    "double_ensemble": (("double_py",), lambda x: [4 * x]),
    "bls_double_py": (("double_py",), lambda x: [2 * x]),
    "stream_py": ((), lambda x: [k * x for k in range(1, 5)]),
    "large_py": ((), lambda x: [x + 1]),
}


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_workload_models_answer_as_their_configs_say(threaded_server, name: str) -> None:
    """Served by a real Ferry as compare_triton serves them (explicit mode, the model and what it calls); every
    response's OUTPUT0 is checked, and ``sample_answer`` (the digest compare_triton compares between servers)
    reads the decoupled model's whole gRPC stream."""
    import tritonclient.grpc as grpcclient

    from benchmarks import servers

    also, expected = WORKLOADS[name]
    handle = threaded_server([MODELS], model_control_mode="explicit", load_models=(name, *also))
    config = _config(MODELS / name / "config.pbtxt")
    shape = [1, *config.input[0].dims] if config.max_batch_size else list(config.input[0].dims)
    x = np.random.default_rng(1).random(shape, dtype=np.float32)
    answers: list = []
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{handle.server.grpc_port}")
    try:
        client.start_stream(callback=lambda result, error: answers.append(error or result.as_numpy("OUTPUT0")))
        tensor = grpcclient.InferInput("INPUT0", shape, "FP32")
        tensor.set_data_from_numpy(x)
        client.async_stream_infer(name, [tensor])
    finally:
        client.stop_stream()  # waits for the stream to end
        client.close()
    assert len(answers) == len(expected(x))
    for got, want in zip(answers, expected(x)):
        np.testing.assert_allclose(got, want, rtol=1e-6)
    first = servers.sample_answer(handle.server.http_port, name, grpc_port=handle.server.grpc_port)
    assert len(first) == 16 and first == servers.sample_answer(handle.server.http_port, name,
                                                               grpc_port=handle.server.grpc_port)


def test_a_decoupled_models_answer_needs_the_grpc_port(threaded_server) -> None:
    from benchmarks import servers

    handle = threaded_server([MODELS], model_control_mode="explicit", load_models=("stream_py",))
    with pytest.raises(servers.ServerError, match="'stream_py' is decoupled: its answer is sampled over a gRPC"):
        servers.sample_answer(handle.server.http_port, "stream_py")
