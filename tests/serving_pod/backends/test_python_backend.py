"""The python backend runs Triton ``model.py`` files unmodified, in-process and isolated.

Models live in ``data/`` (copied to a temp dir per test, so they may write marker files) and
in ../shared/models when present. BLS goes through ``FakeEngine``: a test double for the
engine's thread-side API (``infer_from_thread`` / ``stream_from_thread``), so the backend is
tested on its own; the engine's own tests cover the real thing.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from serving_pod.backends import pb_utils
from serving_pod.backends.base import InstanceContext
from serving_pod.backends.python import PythonBackend, config_to_dict
from serving_pod.core import errors
from serving_pod.core.types import InferRequest, InferResponse, RequestedOutput, Tensor

DATA = Path(__file__).parent / "data"
SHARED = Path(__file__).resolve().parents[3].parent / "shared" / "models"


class FakeEngine:
    """Answers BLS calls: ``double`` doubles INPUT0, ``counter`` streams INPUT0 + 0, 1, 2."""

    def __init__(self) -> None:
        self.calls: list[InferRequest] = []

    def infer_from_thread(self, request: InferRequest) -> InferResponse:
        self.calls.append(request)
        if request.model_name != "double":
            raise errors.unknown_model(request.model_name)
        data = request.inputs[0].data
        return InferResponse("double", "1", [Tensor("OUTPUT0", "FP32", data * 2)], request.id)

    def stream_from_thread(self, request: InferRequest) -> Iterator[InferResponse]:
        self.calls.append(request)
        data = request.inputs[0].data
        for step in range(3):
            yield InferResponse("counter", "1", [Tensor("OUTPUT0", "FP32", data + step)], final=False)
        yield InferResponse("counter", "1", [], final=True)


class Collector:
    """A decoupled request's responder: records (response, final) and signals the final one."""

    def __init__(self) -> None:
        self.items: list[tuple[Any, bool]] = []
        self.done = threading.Event()

    def __call__(self, message: Any, final: bool) -> None:
        self.items.append((message, final))
        if final:
            self.done.set()


@pytest.fixture
def load(tmp_path: Path) -> Iterator[Callable[..., Any]]:
    """``load(name_or_dir, engine=..., edit=fn(config))`` -> a started instance (closed after)."""
    instances: list[Any] = []

    def _load(source: str | Path, *, engine: Any = None, edit: Callable[[Any], None] | None = None,
              kind: str = "KIND_CPU", auto_complete: bool = False) -> Any:
        source = Path(source) if isinstance(source, Path) else DATA / source
        model_dir = tmp_path / source.name
        if not model_dir.exists():
            shutil.copytree(source, model_dir, ignore=shutil.ignore_patterns("__pycache__"))
        config = parse_config(model_dir)
        if edit is not None:
            edit(config)
        backend = PythonBackend()
        if auto_complete:
            backend.auto_complete(config, model_dir, model_dir / "1")
        context = InstanceContext(
            model_name=config.name, model_version="1", model_dir=model_dir,
            version_dir=model_dir / "1", config=config, name=f"{config.name}_0_0",
            kind=kind, engine=engine,
        )
        instance = backend.create_instance(context)
        instances.append(instance)
        return instance

    yield _load
    for instance in instances:
        instance.close()


def parse_config(model_dir: Path) -> Any:
    return text_format.Parse((model_dir / "config.pbtxt").read_text(), model_config_pb2.ModelConfig())


def request(model: str, inputs: dict[str, tuple[str, np.ndarray]], **kwargs: Any) -> InferRequest:
    tensors = [Tensor(name, datatype, data) for name, (datatype, data) in inputs.items()]
    return InferRequest(model, "", tensors, **kwargs)


def outputs(response: Any) -> dict[str, Tensor]:
    assert isinstance(response, InferResponse), response
    return {t.name: t for t in response.outputs}


def isolated(config: Any) -> None:
    config.parameters["FERRY_ISOLATED"].string_value = "true"


# --------------------------------------------------------------------------- Triton's own models


@pytest.mark.skipif(not SHARED.is_dir(), reason="../shared/models is not present")
def test_triton_simple_identity_runs_unmodified(load: Callable[..., Any]) -> None:
    instance = load(SHARED / "triton-examples" / "simple_identity")
    text = np.array([[b"hello", b"", b"w\x00rld"]], dtype=object)
    [response] = instance.execute([request("simple_identity", {"INPUT0": ("BYTES", text)})])
    out = outputs(response)["OUTPUT0"]
    assert out.datatype == "BYTES"
    assert out.data.tolist() == text.tolist()


@pytest.mark.skipif(not SHARED.is_dir(), reason="../shared/models is not present")
def test_bench_double_py_runs_unmodified_on_a_batch(load: Callable[..., Any]) -> None:
    instance = load(SHARED / "bench" / "double_py")
    batch = [np.full((1, 16), i, np.float32) for i in range(3)]
    responses = instance.execute(
        [request("double_py", {"INPUT0": ("FP32", x)}, id=f"r{i}") for i, x in enumerate(batch)]
    )
    for i, (x, response) in enumerate(zip(batch, responses)):
        out = outputs(response)["OUTPUT0"]
        assert (response.id, response.model_name, response.model_version) == (f"r{i}", "double_py", "1")
        assert out.datatype == "FP32" and out.data.dtype == np.float32
        np.testing.assert_array_equal(out.data, x * 2)


# --------------------------------------------------------------------------- tensors and errors


def test_bytes_outputs_and_requested_outputs(load: Callable[..., Any]) -> None:
    instance = load("py_bytes")
    text = np.array([b"abc", "é".encode()], dtype=object)
    [everything, only_lengths] = instance.execute([
        request("py_bytes", {"TEXT": ("BYTES", text)}),
        request("py_bytes", {"TEXT": ("BYTES", text)}, outputs=[RequestedOutput("LENGTHS")]),
    ])
    out = outputs(everything)
    assert out["UPPER"].datatype == "BYTES" and out["UPPER"].data.tolist() == ["ABC", "É"]
    assert out["LENGTHS"].datatype == "INT32" and out["LENGTHS"].data.tolist() == [3, 2]
    assert list(outputs(only_lengths)) == ["LENGTHS"]


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        (0, "Failed to process the request(s) for model 'py_raises_0_0', message: ValueError: the model refuses this input"),
        (1, "Expected a list in the execute return, found type '<class 'dict'>'."),
        (2, "InferenceRequest(s) size is:2, and InferenceResponse(s) size is:0"),
        (3, "Expected an 'InferenceResponse' object in the execute function return list, found type '<class 'str'>'."),
        (4, "TritonModelException: explicit model exception"),
    ],
)
def test_a_failing_execute_fails_every_request_of_the_call(load: Callable[..., Any], mode: int, expected: str) -> None:
    instance = load("py_raises")
    batch = [request("py_raises", {"INPUT0": ("FP32", np.array([mode], np.float32))}) for _ in range(2)]
    results = instance.execute(batch)
    assert len(results) == 2
    for result in results:
        assert isinstance(result, errors.InternalError)
        assert expected in result.message


def test_an_error_response_fails_only_its_request(load: Callable[..., Any]) -> None:
    instance = load("py_error_response")
    values = [5, -1, 7]
    results = instance.execute(
        [request("py_error_response", {"INPUT0": ("INT32", np.array([[v]], np.int32))}) for v in values]
    )
    assert outputs(results[0])["OUTPUT0"].data.tolist() == [[5]]
    assert isinstance(results[1], errors.InvalidArgumentError)
    assert results[1].message == "negative input is not allowed"
    assert outputs(results[2])["OUTPUT0"].data.tolist() == [[7]]


def test_async_execute_and_async_initialize(load: Callable[..., Any]) -> None:
    instance = load("py_async")
    data = [np.arange(4, dtype=np.float32).reshape(1, 4) * i for i in range(3)]
    results = instance.execute([request("py_async", {"INPUT0": ("FP32", x)}) for x in data])
    for x, result in zip(data, results):
        np.testing.assert_array_equal(outputs(result)["OUTPUT0"].data, x + 1)
    # the per-instance loop is reused, not recreated
    again = instance.execute([request("py_async", {"INPUT0": ("FP32", data[1])})])
    np.testing.assert_array_equal(outputs(again[0])["OUTPUT0"].data, data[1] + 1)


# --------------------------------------------------------------------------- config


def test_auto_complete_config_fills_the_config(load: Callable[..., Any], tmp_path: Path) -> None:
    shutil.copytree(DATA / "py_autocomplete", tmp_path / "ac")
    config = parse_config(tmp_path / "ac")
    PythonBackend().auto_complete(config, tmp_path / "ac", None)
    assert config.max_batch_size == 16
    assert config.HasField("dynamic_batching")
    assert [(i.name, i.data_type, list(i.dims)) for i in config.input] == [("IN", model_config_pb2.TYPE_FP32, [3])]
    assert [o.name for o in config.output] == ["OUT"]
    instance = load("py_autocomplete", auto_complete=True)
    [result] = instance.execute([request("py_autocomplete", {"IN": ("FP32", np.ones((1, 3), np.float32))})])
    assert outputs(result)["OUT"].data.tolist() == [[3, 3, 3]]


def test_auto_complete_conflicting_with_the_config_is_a_load_error(tmp_path: Path) -> None:
    shutil.copytree(DATA / "py_autocomplete", tmp_path / "ac")
    config = parse_config(tmp_path / "ac")
    config.input.add(name="IN", data_type=model_config_pb2.TYPE_INT32, dims=[3])
    with pytest.raises(errors.ModelLoadError, match="configuration expects datatype TYPE_INT32 for input 'IN'"):
        PythonBackend().auto_complete(config, tmp_path / "ac", tmp_path / "ac" / "1")


def test_model_config_wrapper_rules() -> None:
    config = pb_utils.ModelConfig(json.dumps({"name": "m", "max_batch_size": 8, "input": [], "output": [],
                                              "sequence_batching": {}}))
    config.add_input({"name": "A", "data_type": "TYPE_FP32", "dims": [2]})
    config.add_input({"name": "A", "data_type": "TYPE_FP32", "dims": [2]})  # same again: fine
    assert len(config.as_dict()["input"]) == 1
    with pytest.raises(ValueError, match="the model expects dims \\[3\\] but the model configuration specifies dims \\[2\\]"):
        config.add_input({"name": "A", "data_type": "TYPE_FP32", "dims": [3]})
    with pytest.raises(ValueError, match="property other than"):
        config.add_output({"name": "B", "data_type": "TYPE_FP32", "dims": [1], "format": "x"})
    with pytest.raises(ValueError, match="missing 'dims'"):
        config.add_output({"name": "B", "data_type": "TYPE_FP32"})
    with pytest.raises(ValueError, match="specified max_batch_size 8"):
        config.set_max_batch_size(4)
    with pytest.raises(ValueError, match="sequence_batching"):
        config.set_dynamic_batching()
    config.set_model_transaction_policy({"decoupled": True})
    with pytest.raises(ValueError, match="trying to change decoupled"):
        config.set_model_transaction_policy({"decoupled": False})


def test_initialize_args_and_finalize(load: Callable[..., Any], tmp_path: Path) -> None:
    instance = load("py_lifecycle", kind="KIND_CPU")
    record = json.loads((tmp_path / "py_lifecycle" / "initialized.json").read_text())
    args = record["args"]
    assert all(isinstance(v, str) for v in args.values())
    assert {k: v for k, v in args.items() if k != "model_config"} == {
        "model_instance_kind": "CPU",
        "model_instance_name": "py_lifecycle_0_0",
        "model_instance_device_id": "0",
        "model_repository": str(tmp_path / "py_lifecycle"),
        "model_version": "1",
        "model_name": "py_lifecycle",
    }
    config = json.loads(args["model_config"])
    assert config["max_batch_size"] == 2 and config["input"][0]["dims"] == [2]  # numbers, as Triton prints
    assert config["parameters"]["greeting"]["string_value"] == "hello"
    assert config["input"][0]["optional"] is False  # defaults are printed
    assert record["model_dir"] == str(tmp_path / "py_lifecycle" / "1")
    [result] = instance.execute([request("py_lifecycle", {"INPUT0": ("INT64", np.array([[1, 2]], np.int64))})])
    assert outputs(result)["OUTPUT0"].datatype == "INT64"
    instance.close()
    instance.close()
    assert (tmp_path / "py_lifecycle" / "finalized.txt").read_text() == "py_lifecycle_0_0\n"


def test_config_to_dict_prints_int64_as_numbers() -> None:
    config = text_format.Parse(
        'name: "m" max_batch_size: 4 input [{ name: "x" data_type: TYPE_FP32 dims: [ -1, 3 ] }] '
        'dynamic_batching { max_queue_delay_microseconds: 100 priority_queue_policy { key: 1 value { default_timeout_microseconds: 7 } } }',
        model_config_pb2.ModelConfig(),
    )
    data = config_to_dict(config)
    assert data["input"][0]["dims"] == [-1, 3]
    assert data["dynamic_batching"]["max_queue_delay_microseconds"] == 100
    assert data["dynamic_batching"]["priority_queue_policy"]["1"]["default_timeout_microseconds"] == 7


def test_request_parameters_correlation_id_flags_and_cancellation(load: Callable[..., Any]) -> None:
    instance = load("py_params")
    cancelled = threading.Event()
    cancelled.set()
    first, second = instance.execute([
        request("py_params", {"INPUT0": ("INT32", np.array([1], np.int32))}, id="req-1",
                parameters={"sequence_id": 42, "sequence_start": True, "sequence_end": True,
                            "priority": 1, "custom": "yes", "n": 3}),
        request("py_params", {"INPUT0": ("INT32", np.array([1], np.int32))},
                parameters={"sequence_id": "abc"}, cancelled=cancelled,
                outputs=[RequestedOutput("CORRELATION_ID"), RequestedOutput("CANCELLED"),
                         RequestedOutput("REQUESTED")]),
    ])
    out = outputs(first)
    assert out["REQUEST_ID"].data.tolist() == [b"req-1"]
    assert out["CORRELATION_ID"].data.tolist() == [b"42"]
    assert out["FLAGS"].data.tolist() == [3]
    assert json.loads(out["PARAMETERS"].data[0]) == {"custom": "yes", "n": 3}
    assert out["REQUESTED"].data[0].decode().split(",") == sorted([  # a set in Triton: the model sorts it
        "REQUEST_ID", "CORRELATION_ID", "FLAGS", "PARAMETERS", "REQUESTED", "CANCELLED"])
    assert out["CANCELLED"].data.tolist() == [False] and out["CANCELLED"].datatype == "BOOL"
    assert "NOT_IN_CONFIG" not in out  # only the config's outputs when none were requested
    assert first.parameters == {"answered": True}
    out = outputs(second)
    assert set(out) == {"CORRELATION_ID", "CANCELLED", "REQUESTED"}
    assert out["CORRELATION_ID"].data.tolist() == [b"'abc'"]
    assert out["CANCELLED"].data.tolist() == [True]
    assert out["REQUESTED"].data.tolist() == [b"CANCELLED,CORRELATION_ID,REQUESTED"]


def test_models_with_same_file_names_do_not_clash(load: Callable[..., Any]) -> None:
    a, b = load("py_sibling_a"), load("py_sibling_b")
    one = {"INPUT0": ("INT32", np.array([1], np.int32))}
    assert outputs(a.execute([request("py_sibling_a", one)])[0])["WHO"].data.tolist() == [b"a"]
    assert outputs(b.execute([request("py_sibling_b", one)])[0])["WHO"].data.tolist() == [b"b"]
    assert "helper" not in sys.modules


# --------------------------------------------------------------------------- load errors


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("", "model.py not found"),
        ("x = 1\n", "does not define class TritonPythonModel"),
        ("class TritonPythonModel:\n    pass\n", "does not implement `execute` method"),
        ("def broken(:\n", "SyntaxError"),
        ("import not_a_module_anywhere\n", "ModuleNotFoundError: No module named 'not_a_module_anywhere'"),
        ("class TritonPythonModel:\n    def initialize(self, args):\n        raise KeyError('weights')\n"
         "    def execute(self, requests):\n        return []\n",
         "KeyError: 'weights'"),  # Triton's bare words; the registry adds the version's
    ],
)
@pytest.mark.parametrize("in_child", [False, True], ids=["in-process", "isolated"])
def test_broken_models_fail_to_load_clearly(
    load: Callable[..., Any], tmp_path: Path, source: str, expected: str, in_child: bool
) -> None:
    model_dir = tmp_path / "py_lifecycle"
    shutil.copytree(DATA / "py_lifecycle", model_dir)
    model_file = model_dir / "1" / "model.py"
    if source:
        model_file.write_text(source)
    else:
        model_file.unlink()
    with pytest.raises(errors.ModelLoadError) as info:
        load(model_dir, edit=isolated if in_child else None)
    assert expected in info.value.message


def test_pb_utils_is_installed_only_when_a_model_loads() -> None:
    code = ("import sys, serving_pod.backends.python, serving_pod.backends.pb_utils; "
            "print('triton_python_backend_utils' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                            cwd=Path(__file__).resolve().parents[3])
    assert result.stdout.strip() == "False"


# --------------------------------------------------------------------------- decoupled


def test_decoupled_model_streams_through_the_responder(load: Callable[..., Any]) -> None:
    instance = load("py_decoupled")
    three, zero, late = Collector(), Collector(), Collector()
    results = instance.execute([
        request("py_decoupled", {"COUNT": ("INT32", np.array([3], np.int32))}, id="a", responder=three),
        request("py_decoupled", {"COUNT": ("INT32", np.array([0], np.int32))}, id="b", responder=zero),
        request("py_decoupled", {"COUNT": ("INT32", np.array([99], np.int32))}, id="c", responder=late),
    ])
    assert results == [None, None, None]
    assert [(outputs(m)["INDEX"].data.tolist(), m.final, f) for m, f in three.items[:3]] == [
        ([0], False, False), ([1], False, False), ([2], False, False)]
    assert three.items[3] == (None, True) and all(m.id == "a" for m, _ in three.items[:3])
    assert zero.items == [(None, True)]
    assert late.done.wait(5) and len(late.items) == 3  # sent from the model's own thread
    instance.close()
    assert instance._model.late_send_errors == [
        "Unable to send response. Response sender has been closed."] * 3


def test_decoupled_execute_error_goes_to_every_open_request(load: Callable[..., Any]) -> None:
    instance = load("py_decoupled")
    ok, bad = Collector(), Collector()
    results = instance.execute([
        request("py_decoupled", {"COUNT": ("INT32", np.array([1], np.int32))}, responder=ok),
        request("py_decoupled", {"COUNT": ("INT32", np.array([-1], np.int32))}, responder=bad),
        request("py_decoupled", {"COUNT": ("INT32", np.array([1], np.int32))}),  # no responder
    ])
    assert isinstance(results[2], errors.UnsupportedError)
    assert [f for _, f in ok.items] == [False, True]  # finished before the error: untouched
    [(error, final)] = bad.items
    assert final and isinstance(error, errors.InternalError) and "RuntimeError: negative count" in error.message
    # the execution failed: as in Triton its requests count as failures (the engine sends nothing more)
    assert [type(r) for r in results[:2]] == [errors.InternalError] * 2 and results[1].message == error.message


# --------------------------------------------------------------------------- BLS


@pytest.mark.parametrize(("mode", "factor", "offset"), [("sync", 2, 0), ("async", 2, 0), ("stream", 3, 3)])
def test_bls_calls_go_to_the_engine(load: Callable[..., Any], mode: str, factor: int, offset: int) -> None:
    engine = FakeEngine()
    instance = load("py_bls", engine=engine)
    x = np.arange(4, dtype=np.float32)
    [result] = instance.execute([request("py_bls", {"INPUT0": ("FP32", x)}, parameters={"mode": mode})])
    np.testing.assert_array_equal(outputs(result)["OUTPUT0"].data, x * factor + offset)
    [call] = engine.calls
    assert call.model_name == ("counter" if mode == "stream" else "double")
    assert call.model_version == "" and [o.name for o in call.outputs] == ["OUTPUT0"]
    assert call.inputs[0].datatype == "FP32"


def test_bls_errors_come_back_in_the_response(load: Callable[..., Any]) -> None:
    instance = load("py_bls", engine=FakeEngine())
    [result] = instance.execute([request("py_bls", {"INPUT0": ("FP32", np.zeros(4, np.float32))},
                                         parameters={"mode": "missing"})])
    assert isinstance(result, errors.NotFoundError)
    assert result.message == "BLS failed: Request for unknown model: 'missing_model' is not found"


def test_bls_without_an_engine_is_a_clear_error(load: Callable[..., Any]) -> None:
    instance = load("py_bls", engine=None)
    [result] = instance.execute([request("py_bls", {"INPUT0": ("FP32", np.zeros(4, np.float32))})])
    assert isinstance(result, errors.UnavailableError)
    assert "not attached to an inference engine" in result.message


# --------------------------------------------------------------------------- isolated mode


def test_isolated_model_runs_in_a_child_and_survives_a_crash(load: Callable[..., Any]) -> None:
    instance = load("py_crash")
    ok = {"INPUT0": ("INT32", np.array([0], np.int32))}
    [first] = instance.execute([request("py_crash", ok)])
    child_pid = int(outputs(first)["PID"].data[0])
    assert child_pid != os.getpid()
    crashed = instance.execute([request("py_crash", {"INPUT0": ("INT32", np.array([1], np.int32))}),
                                request("py_crash", ok)])
    for error in crashed:
        assert isinstance(error, errors.InternalError)
        assert "stopped unexpectedly: exit code 3" in error.message
        assert "about to crash on purpose" in error.message
    [after] = instance.execute([request("py_crash", ok)])  # a fresh child took over
    assert outputs(after)["OUTPUT0"].data.tolist() == [0]
    assert int(outputs(after)["PID"].data[0]) not in (child_pid, os.getpid())


def test_isolated_lifecycle_errors_and_finalize(load: Callable[..., Any], tmp_path: Path) -> None:
    instance = load("py_lifecycle", edit=isolated)
    record = json.loads((tmp_path / "py_lifecycle" / "initialized.json").read_text())
    assert record["args"]["model_name"] == "py_lifecycle"
    [result] = instance.execute([request("py_lifecycle", {"INPUT0": ("INT64", np.array([[4, 5]], np.int64))})])
    assert outputs(result)["OUTPUT0"].data.tolist() == [[4, 5]]
    instance.close()
    assert (tmp_path / "py_lifecycle" / "finalized.txt").read_text() == "py_lifecycle_0_0\n"
    raising = load("py_raises", edit=isolated)
    [error] = raising.execute([request("py_raises", {"INPUT0": ("FP32", np.array([0], np.float32))})])
    assert isinstance(error, errors.InternalError) and "ValueError: the model refuses this input" in error.message


def test_isolated_decoupled_and_bls(load: Callable[..., Any]) -> None:
    streaming = load("py_decoupled", edit=isolated)
    collector = Collector()
    assert streaming.execute([request("py_decoupled", {"COUNT": ("INT32", np.array([2], np.int32))},
                                      responder=collector)]) == [None]
    assert collector.done.wait(10)
    assert [(outputs(m)["INDEX"].data.tolist() if m else None, f) for m, f in collector.items] == [
        ([0], False), ([1], False), (None, True)]
    engine = FakeEngine()
    bls = load("py_bls", edit=isolated, engine=engine)
    x = np.arange(4, dtype=np.float32)
    for mode, expected in (("sync", x * 2), ("stream", x * 3 + 3)):
        [result] = bls.execute([request("py_bls", {"INPUT0": ("FP32", x)}, parameters={"mode": mode})])
        np.testing.assert_array_equal(outputs(result)["OUTPUT0"].data, expected)
    [missing] = bls.execute([request("py_bls", {"INPUT0": ("FP32", x)}, parameters={"mode": "missing"})])
    assert isinstance(missing, errors.NotFoundError) and "missing_model" in missing.message


def test_execution_env_path(load: Callable[..., Any], tmp_path: Path) -> None:
    def use_this_interpreter(config: Any) -> None:
        config.parameters["EXECUTION_ENV_PATH"].string_value = sys.executable

    instance = load("py_bytes", edit=use_this_interpreter)
    [result] = instance.execute([request("py_bytes", {"TEXT": ("BYTES", np.array([b"x"], dtype=object))})])
    assert outputs(result)["UPPER"].data.tolist() == ["X"]

    def missing_env(config: Any) -> None:
        config.parameters["EXECUTION_ENV_PATH"].string_value = "$$TRITON_MODEL_DIRECTORY/env.tar.gz"

    with pytest.raises(errors.ModelLoadError, match="EXECUTION_ENV_PATH '.*py_error_response/env.tar.gz'"):
        load("py_error_response", edit=missing_env)


def test_isolated_initialize_failure_is_a_load_error(load: Callable[..., Any], tmp_path: Path) -> None:
    model_dir = tmp_path / "py_crash"
    shutil.copytree(DATA / "py_crash", model_dir)
    (model_dir / "1" / "model.py").write_text(
        "import os\nclass TritonPythonModel:\n    def initialize(self, args):\n        os._exit(4)\n"
        "    def execute(self, requests):\n        return []\n")
    with pytest.raises(errors.ModelLoadError, match="exited during initialize \\(exit code 4"):
        load(model_dir)


# --------------------------------------------------------------------------- pb_utils API


def test_pb_utils_tensor_api() -> None:
    with pytest.raises(pb_utils.TritonModelException, match="Tensor name cannot be an empty string"):
        pb_utils.Tensor("", np.zeros(1))
    with pytest.raises(pb_utils.TritonModelException, match="NumPy dtype is not supported"):
        pb_utils.Tensor("c", np.zeros(1, np.complex64))
    matrix = pb_utils.Tensor("l", np.array([[1, 2]]))
    assert matrix.as_numpy().shape == (1, 2) and matrix.shape() == [1, 2] and matrix.is_cpu()
    array = np.arange(6, dtype=np.float32)
    tensor = pb_utils.Tensor("t", array)
    assert tensor.as_numpy() is array and tensor.name() == "t" and tensor.triton_dtype() == 11
    back = pb_utils.Tensor.from_dlpack("u", tensor.to_dlpack())
    np.testing.assert_array_equal(back.as_numpy(), array)
    assert pb_utils.Tensor.from_dlpack("v", array).as_numpy().dtype == np.float32
    assert pb_utils.numpy_to_triton_type(np.object_) == 13 and pb_utils.triton_to_numpy_type(8) is np.int32
    assert pb_utils.triton_string_to_numpy("TYPE_STRING") is np.object_
    packed = pb_utils.serialize_byte_tensor(np.array([b"ab", "c"], dtype=object))
    assert pb_utils.deserialize_bytes_tensor(packed).tolist() == [b"ab", b"c"]


def test_pb_utils_responses_and_senders() -> None:
    with pytest.raises(pb_utils.TritonModelException,
                       match="Expect parameters values to have type bool/int/str, found type <class .float.>"):
        pb_utils.InferenceResponse([], parameters={"x": 1.5})
    error = pb_utils.TritonError("nope")
    assert error.code() == pb_utils.TritonError.INTERNAL and error.message() == "nope"
    response = pb_utils.InferenceResponse(error=error)
    assert response.has_error() and response.output_tensors() == []
    orphan = pb_utils.InferenceRequest(model_name="m", inputs=[], requested_output_names=[])
    sender = orphan.get_response_sender()
    with pytest.raises(pb_utils.TritonModelException, match="Unsupported flag"):
        sender.send(flags=7)
    with pytest.raises(pb_utils.TritonModelException, match="must be provided"):
        sender.send()
    with pytest.raises(TypeError):
        pb_utils.InferenceRequest(inputs=[], requested_output_names=[])


def test_isolated_cancellation_and_decoupled_without_responder(load: Callable[..., Any]) -> None:
    instance = load("py_params", edit=isolated)
    cancelled = threading.Event()
    one = {"INPUT0": ("INT32", np.array([1], np.int32))}
    [before] = instance.execute([request("py_params", one, cancelled=cancelled)])
    cancelled.set()
    [after] = instance.execute([request("py_params", one, cancelled=cancelled)])
    assert outputs(before)["CANCELLED"].data.tolist() == [False]
    assert outputs(after)["CANCELLED"].data.tolist() == [True]
    streaming = load("py_decoupled", edit=isolated)
    [refused] = streaming.execute([request("py_decoupled", {"COUNT": ("INT32", np.array([1], np.int32))})])
    assert isinstance(refused, errors.UnsupportedError)


def test_execution_env_path_accepts_a_packed_environment(load: Callable[..., Any], tmp_path: Path) -> None:
    import tarfile

    env = tmp_path / "env"
    (env / "bin").mkdir(parents=True)
    wrapper = env / "bin" / "python3"
    wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    wrapper.chmod(0o755)
    model_dir = tmp_path / "py_bytes"
    shutil.copytree(DATA / "py_bytes", model_dir)
    with tarfile.open(model_dir / "env.tar.gz", "w:gz") as tar:
        tar.add(env / "bin", arcname="bin")

    def packed(config: Any) -> None:
        config.parameters["EXECUTION_ENV_PATH"].string_value = "$$TRITON_MODEL_DIRECTORY/env.tar.gz"

    instance = load(model_dir, edit=packed)
    [result] = instance.execute([request("py_bytes", {"TEXT": ("BYTES", np.array([b"packed"], dtype=object))})])
    assert outputs(result)["UPPER"].data.tolist() == ["PACKED"]


def test_pb_utils_custom_metrics_and_byte_order() -> None:
    family = pb_utils.MetricFamily("ferry_test_requests", "requests seen", pb_utils.MetricFamily.COUNTER)
    metric = family.Metric(labels={"model": "m"})
    metric.increment(2)
    metric.increment(3)
    assert metric.value() == 5
    with pytest.raises(pb_utils.TritonModelException, match="non-negative"):
        metric.increment(-1)
    with pytest.raises(pb_utils.TritonModelException, match="KIND_COUNTER does not support Set"):
        metric.set(1)
    with pytest.raises(pb_utils.TritonModelException, match="NumPy dtype is not supported"):
        pb_utils.Tensor("b", np.arange(3, dtype=">i4"))  # as Triton's stub: not native byte order


def test_non_decoupled_model_may_answer_through_the_sender(load: Callable[..., Any], tmp_path: Path) -> None:
    model_dir = tmp_path / "py_error_response"
    shutil.copytree(DATA / "py_error_response", model_dir)
    (model_dir / "1" / "model.py").write_text(
        "import triton_python_backend_utils as pb_utils\n"
        "class TritonPythonModel:\n"
        "    def execute(self, requests):\n"
        "        self.second_send = None\n"
        "        for request in requests:\n"
        "            data = pb_utils.get_input_tensor_by_name(request, 'INPUT0').as_numpy()\n"
        "            sender = request.get_response_sender()\n"
        "            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor('OUTPUT0', data * 10)]),\n"
        "                        flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)\n"
        "            try:\n"
        "                sender.send(pb_utils.InferenceResponse([]))\n"
        "            except pb_utils.TritonModelException as exc:\n"
        "                self.second_send = str(exc)\n"
        "        return None\n"
    )
    instance = load(model_dir)
    results = instance.execute([
        request("py_error_response", {"INPUT0": ("INT32", np.array([[v]], np.int32))}) for v in (1, 2)
    ])
    assert [outputs(r)["OUTPUT0"].data.tolist() for r in results] == [[[10]], [[20]]]
    assert instance._model.second_send == (
        "Unable to send response. Non-decoupled model cannot send more than one response.")
