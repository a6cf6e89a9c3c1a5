"""Triton's own example models and our embedded default models, through tritonclient over HTTP and gRPC.

Results must equal running the model directly (onnxruntime for ONNX files, the arithmetic for python models).
The Triton examples come from ../shared (skipped when absent); the default models ship in the package.
"""

from __future__ import annotations

import shutil

import numpy as np
import onnxruntime as ort
import pytest

from support.server import DEFAULT_MODELS, TRITON_EXAMPLES, ServerThread, make_options

PROTOCOLS = ["http", "grpc"]
EXAMPLES = ["simple", "simple_string", "simple_identity", "simple_int8"]


@pytest.fixture(scope="module")
def examples(tmp_path_factory):
    if not TRITON_EXAMPLES.is_dir():
        pytest.skip(f"Triton's example models are not available at {TRITON_EXAMPLES}")
    repository = tmp_path_factory.mktemp("examples")
    for name in EXAMPLES:
        shutil.copytree(TRITON_EXAMPLES / name, repository / name)
    thread = ServerThread(make_options([repository]))
    yield thread.start()
    thread.stop()


@pytest.fixture(scope="module")
def defaults():
    thread = ServerThread(make_options([DEFAULT_MODELS]))
    yield thread.start()
    thread.stop()


def _infer(handle, protocol: str, model: str, arrays: dict[str, np.ndarray], datatypes: dict[str, str]):
    module = handle.module(protocol)
    inputs = []
    for name, array in arrays.items():
        tensor = module.InferInput(name, list(array.shape), datatypes[name])
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    return handle.client(protocol).infer(model, inputs)


def _onnx(path, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("dtype, datatype", [(np.int32, "INT32"), (np.int8, "INT8")])
def test_simple_add_sub(examples, protocol, dtype, datatype):
    model = "simple" if datatype == "INT32" else "simple_int8"
    a = np.arange(16, dtype=dtype).reshape(1, 16)
    b = np.full((1, 16), 3, dtype=dtype)
    result = _infer(examples, protocol, model, {"INPUT0": a, "INPUT1": b}, {"INPUT0": datatype, "INPUT1": datatype})
    direct = _onnx(TRITON_EXAMPLES / model / "1" / "model.onnx", {"INPUT0": a, "INPUT1": b})
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), direct[0])


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_simple_string(examples, protocol):
    # Triton's simple_string client: numbers as strings in, their sum and difference as strings out
    a = np.array([str(x).encode() for x in range(16)], dtype=np.object_).reshape(1, 16)
    b = np.array([b"1"] * 16, dtype=np.object_).reshape(1, 16)
    result = _infer(examples, protocol, "simple_string", {"INPUT0": a, "INPUT1": b}, {"INPUT0": "BYTES", "INPUT1": "BYTES"})
    sums = [int(x) for x in result.as_numpy("OUTPUT0").flat]
    diffs = [int(x) for x in result.as_numpy("OUTPUT1").flat]
    assert sums == [x + 1 for x in range(16)]
    assert diffs == [x - 1 for x in range(16)]


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_python_identity_model_runs_unmodified(examples, protocol):
    data = np.array([[b"hello", b"\x00binary\xff", "\u00fcnicode".encode()]], dtype=np.object_)
    result = _infer(examples, protocol, "simple_identity", {"INPUT0": data}, {"INPUT0": "BYTES"})
    assert [bytes(x) for x in result.as_numpy("OUTPUT0").flat] == [bytes(x) for x in data.flat]


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_default_models_match_direct_execution(defaults, protocol):
    rng = np.random.default_rng(7)
    # ONNX MLP: equal to onnxruntime run directly on the same file
    meta = defaults.client("http").get_model_metadata("mlp_onnx")
    (inp,) = meta["inputs"]
    features = int(inp["shape"][-1])
    x = rng.standard_normal((5, features)).astype(np.float32)
    result = _infer(defaults, protocol, "mlp_onnx", {inp["name"]: x}, {inp["name"]: "FP32"})
    (out,) = meta["outputs"]
    direct = _onnx(DEFAULT_MODELS / "mlp_onnx" / "1" / "model.onnx", {inp["name"]: x})
    np.testing.assert_allclose(result.as_numpy(out["name"]), direct[0], rtol=1e-5, atol=1e-6)

    # double_py: OUTPUT = 2 * INPUT, the benchmark model's I/O
    meta = defaults.client("http").get_model_metadata("double_py")
    names = [i["name"] for i in meta["inputs"]]
    arrays = {name: rng.standard_normal((3, 16)).astype(np.float32) for name in names}
    result = _infer(defaults, protocol, "double_py", arrays, dict.fromkeys(names, "FP32"))
    outputs = [o["name"] for o in meta["outputs"]]
    for input_name, output_name in zip(names, outputs):
        np.testing.assert_allclose(result.as_numpy(output_name), arrays[input_name] * 2, rtol=1e-6)

    # add_sub_py: Triton's python add_sub example
    meta = defaults.client("http").get_model_metadata("add_sub_py")
    shape = [int(d) if int(d) > 0 else 1 for d in meta["inputs"][0]["shape"]]
    a = rng.standard_normal(shape).astype(np.float32)
    b = rng.standard_normal(shape).astype(np.float32)
    result = _infer(defaults, protocol, "add_sub_py", {"INPUT0": a, "INPUT1": b}, {"INPUT0": "FP32", "INPUT1": "FP32"})
    np.testing.assert_allclose(result.as_numpy("OUTPUT0"), a + b, rtol=1e-6)
    np.testing.assert_allclose(result.as_numpy("OUTPUT1"), a - b, rtol=1e-6)
