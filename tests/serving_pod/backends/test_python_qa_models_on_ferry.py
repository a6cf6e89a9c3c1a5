"""Triton 2.51's own python backend QA models that a CPU Triton without onnxruntime cannot run, run on Ferry alone.

Opt-in (``-m slow`` with ``FERRY_TRITON_SERVER_SOURCE``, a checkout of triton-inference-server/server at v2.51.0):
the models are read unmodified from ``qa/python_models`` of that tree at test time, and the ONNX models they call
are made by that tree's ``qa/common/gen_qa_models.py --onnx`` (which Triton's QA runs to fill ``qa_model_repository``).
Each test lays the repository out as the QA script named in it does and asserts what that script asserts:

* ``qa/L0_backend_python/bls/test.sh``, for ``BLS_KIND`` ``non_decoupled`` and ``decoupled``: ``bls_memory`` and
  ``bls_memory_async`` (a 1 GiB and four 200 MiB tensors through BLS to ``identity_fp32``; ``OUTPUT0`` is ``[1]``, as
  ``test_infer_shm_leak.py`` asks over gRPC), ``bls_async`` (its CPU half: ``async_exec`` ten at a time with
  ``asyncio.gather``, then one ``async_exec`` and ``exec`` of the same request, run by a wrapper of ours since its
  ``execute`` also runs the GPU half with torch; ``dlpack_add_sub`` and ``dlpack_square`` need torch on CPU too, so
  Triton's ``add_sub`` and our ``repeat_int32`` serve under those names, as ``square_int32`` in
  test_python_qa_parity_bls.py), and ``bls_model_loading`` (``pb_utils.load_model`` / ``unload_model`` /
  ``is_model_ready`` on ``onnx_int32_int32_int32`` with versions 2 and 3 only, config and file overrides; its
  unittest runs in ``initialize`` and sleeps 30 s after each of its three cases, so its load takes 90 s), then
  the same model again with the script's ``model_warmup``;
* ``qa/L0_backend_python/test.sh``: ``model_env`` loads when the server's environment has ``MY_ENV=MY_ENV``;
* ``bls_onnx_warmup`` (no 2.51 script runs it): its one case through our wrapper; it execs
  ``onnx_nobatch_float32_float32_float32`` and then asserts the outputs are in GPU memory, which on CPU fails at
  exactly that assertion (``True is not false``), after the ONNX call answered both outputs;
* ``bls``'s ``test_bls_sequence`` asserts GPU outputs, so a probe of ours does what it does without those steps: two
  sequences at once through BLS to ``onnx_nobatch_sequence_int32`` (``gen_qa_implicit_models.py --onnx``, implicit
  state), for both ``BLS_KIND`` values, each answer the running sum.

``bls_async`` also runs with every python model isolated (``FERRY_ISOLATED``). Not run: ``python_version``
(``qa/L0_backend_python/env/test.sh``: conda-packed Python 3.6 to 3.11 environments with tensorflow), ``test_gpu_bls``,
``test_bls_tensor_lifecycle``, ``test_preferred_memory`` (GPU, libtorch), ``test_multiprocess`` (a ``Pool`` forked
from the model, here the server's process) and ``bls_async``'s GPU half (torch on CUDA). Ferry's answers are what
Triton's scripts require of Triton.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

BLS_KINDS = ("non_decoupled", "decoupled")
HERE = Path(__file__).resolve().parent
REPEAT_INT32 = HERE / "data" / "qa_behaviours" / "repeat_int32"

#: ``bls_async``'s CPU half; the module's functions are Triton's, unmodified
BLS_ASYNC_RUNNER = '''
import os

import numpy as np
import triton_python_backend_utils as pb_utils

import qa_bls_async  # Triton's qa/python_models/bls_async/model.py, unmodified


class TritonPythonModel:
    async def execute(self, requests):
        responses = []
        for _ in requests:
            if os.environ["BLS_KIND"] == "decoupled":
                passed = [await qa_bls_async.multiple_async_bls_square(gpu=False), await qa_bls_async.async_bls_square()]
            else:
                passed = [await qa_bls_async.multiple_async_bls_addsub(gpu=False),
                          await qa_bls_async.async_bls_add_sub()]
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", np.array([all(passed)]))]))
        return responses
'''

#: runs one unittest module's cases; ``OUTPUT0``: the last line of each failure, or "ok"
UNITTEST_RUNNER = '''
import json
import unittest

import numpy as np
import triton_python_backend_utils as pb_utils

import {module}  # Triton's qa/python_models/{source}/model.py, unmodified


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for _ in requests:
            result = unittest.TestResult()
            unittest.defaultTestLoader.loadTestsFromModule({module}).run(result)
            seen = [trace.strip().splitlines()[-1] for _, trace in result.failures + result.errors]
            text = json.dumps(seen or "ok").encode()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", np.array([text], np.object_))]))
        return responses
'''

#: ``bls``'s ``test_bls_sequence`` without its GPU and torch steps (ours): two sequences at once through BLS to
#: ``onnx_nobatch_sequence_int32``, START by ``exec()``, then ten steps and END by the ``BLS_KIND``'s call
BLS_SEQUENCE_PROBE = '''
import json
import os
import threading

import numpy as np
import triton_python_backend_utils as pb_utils


def _call(request, decoupled):
    if not decoupled:
        return request.exec(), []
    responses = request.exec(decoupled=True)
    first = next(responses)
    try:  # a new loop over the iterator would read the responses again: next(), as the QA model asks
        return first, [next(responses)]
    except StopIteration:
        return first, []


def _sequence(correlation_id, decoupled, seen):
    outputs = seen[correlation_id] = []
    for step, value in enumerate([1000, *range(10), 2000]):
        request = pb_utils.InferenceRequest(
            model_name="onnx_nobatch_sequence_int32", inputs=[pb_utils.Tensor("INPUT", np.array([value], np.int32))],
            requested_output_names=["OUTPUT"], correlation_id=correlation_id,
            flags=pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START if step == 0 else 0)
        if value == 2000:
            request.set_flags(pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_END)
        response, more = _call(request, decoupled and step > 0)
        if response.has_error() or more:
            outputs.append(response.error().message() if response.has_error() else len(more))
            return
        outputs.append(int(pb_utils.get_output_tensor_by_name(response, "OUTPUT").as_numpy()[0]))


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for _ in requests:
            seen = {}
            decoupled = os.environ["BLS_KIND"] == "decoupled"
            threads = [threading.Thread(target=_sequence, args=(i, decoupled, seen)) for i in (1000, 1001)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            text = json.dumps(seen).encode()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", np.array([text], np.object_))]))
        return responses
'''

RUNNER_CONFIG = '''name: "{name}"
backend: "python"
max_batch_size: 0
output [ {{ name: "OUTPUT0" data_type: {datatype} dims: [ 1 ] }} ]
instance_group [ {{ kind: KIND_CPU }} ]
'''

#: what ``bls/test.sh`` appends to ``bls_model_loading``'s config for its warmup run
MODEL_LOADING_WARMUP = '''model_warmup [{
    name : "regular sample"
    batch_size: 1
    inputs {
        key: "INPUT0"
        value: {
            data_type: TYPE_FP32
            dims: 4
            zero_data: false
        }
    }
    inputs {
        key: "INPUT1"
        value: {
            data_type: TYPE_FP32
            dims: 4
            zero_data: false
        }
    }
}]
'''

#: ``bls_async`` and ``bls_onnx_warmup`` import torch at the top; the cases run here never call it
TORCH_STUB = {
    "torch/__init__.py": "",
    "torch/utils/__init__.py": "",
    "torch/utils/dlpack.py": 'def from_dlpack(x):\n    raise RuntimeError("no torch here")\n\n\n'
                             'def to_dlpack(x):\n    raise RuntimeError("no torch here")\n',
}


def _qa_models() -> Path:
    from support.python_models import triton_qa_models_or_skip

    return triton_qa_models_or_skip()


def _install(root: Path, source: str, name: str | None = None) -> Path:
    from support.python_models import install_triton_qa_model

    return install_triton_qa_model(root, _qa_models(), source, name)


def _wrapped(root: Path, source: str, runner: str, datatype: str) -> None:
    """``source``'s model.py as module ``qa_<source>`` beside a runner model of ours named ``source``, and the torch
    stub."""
    target = _install(root, source)
    (target / "1" / "model.py").rename(target / "1" / f"qa_{source}.py")
    (target / "1" / "model.py").write_text(runner.format(module=f"qa_{source}", source=source))
    (target / "config.pbtxt").write_text(RUNNER_CONFIG.format(name=source, datatype=datatype))
    for relative, text in TORCH_STUB.items():
        (target / "1" / relative).parent.mkdir(parents=True, exist_ok=True)
        (target / "1" / relative).write_text(text)


def _renamed_copy(source: Path, target: Path, name: str) -> None:
    shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__"))
    config = target / "config.pbtxt"
    config.write_text(config.read_text().replace(f'name: "{source.name}"', f'name: "{name}"'))


@pytest.fixture(scope="module")
def onnx_qa_models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``gen_qa_models.py --onnx`` of the tree: Triton's QA ONNX models (``qa_model_repository``)."""
    return _generated(tmp_path_factory.mktemp("qa_model_repository"), "gen_qa_models.py")


def _generated(out: Path, script: str) -> Path:
    subprocess.run([sys.executable, script, "--onnx", "--models_dir", str(out)], cwd=_qa_models().parent / "common",
                   check=True, capture_output=True, timeout=120)
    return out


class Servers:
    """Ferry servers a test starts (``start(repository)``), all stopped after it or by ``stop()``."""

    def __init__(self) -> None:
        self.threads: list[Any] = []

    def start(self, repository: Path, *, explicit: bool = False) -> Any:
        from support.server import ServerThread, make_options

        options = make_options([repository], **({"model_control_mode": "explicit"} if explicit else {}))
        self.threads.append(ServerThread(options))
        return self.threads[-1].start()

    def stop(self) -> None:
        while self.threads:
            self.threads.pop().stop()


@pytest.fixture
def servers() -> Iterator[Servers]:
    started = Servers()
    yield started
    started.stop()


def _output0(handle: Any, model: str) -> list[Any]:
    """What ``test_infer_shm_leak.py`` reads: ``OUTPUT0`` of an inference with no inputs, over gRPC."""
    return handle.client("grpc").infer(model, [], client_timeout=240).as_numpy("OUTPUT0").tolist()


ISOLATED = 'parameters { key: "FERRY_ISOLATED" value { string_value: "true" } }\n'


@pytest.mark.slow  # opt-in: Triton's own QA models, from FERRY_TRITON_SERVER_SOURCE
@pytest.mark.parametrize("kind", BLS_KINDS)
def test_bls_memory(tmp_path: Path, servers: Servers, monkeypatch: pytest.MonkeyPatch, kind: str) -> None:
    """bls/test.sh's first server: ``bls_memory`` and ``bls_memory_async`` answer ``OUTPUT0 == [1]``."""
    for source in ("bls_memory", "bls_memory_async", "identity_fp32"):
        _install(tmp_path, source)
    monkeypatch.setenv("BLS_KIND", kind)
    handle = servers.start(tmp_path)
    assert [_output0(handle, m) for m in ("bls_memory", "bls_memory_async")] == [[1.0], [1.0]]


@pytest.mark.slow  # opt-in: Triton's own QA models, from FERRY_TRITON_SERVER_SOURCE
@pytest.mark.parametrize("isolated", [False, True], ids=["in_process", "isolated"])
@pytest.mark.parametrize("kind", BLS_KINDS)
def test_bls_async(tmp_path: Path, servers: Servers, monkeypatch: pytest.MonkeyPatch, kind: str,
                   isolated: bool) -> None:
    """bls/test.sh's first server: ``bls_async``'s CPU half answers ``OUTPUT0 == [1]``, in the server's process and
    with every python model in its own (``FERRY_ISOLATED``, as each Triton model instance has its stub process)."""
    _install(tmp_path, "add_sub", "dlpack_add_sub")
    _renamed_copy(REPEAT_INT32, tmp_path / "dlpack_square", "dlpack_square")
    _wrapped(tmp_path, "bls_async", BLS_ASYNC_RUNNER, "TYPE_BOOL")
    for config in tmp_path.glob("*/config.pbtxt") if isolated else []:
        config.write_text(config.read_text() + ISOLATED)
    monkeypatch.setenv("BLS_KIND", kind)
    assert _output0(servers.start(tmp_path), "bls_async") == [True]


@pytest.fixture(scope="module")
def onnx_qa_sequence_models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``gen_qa_implicit_models.py --onnx`` of the tree (``qa_sequence_implicit_model_repository``)."""
    return _generated(tmp_path_factory.mktemp("qa_sequence_implicit_model_repository"), "gen_qa_implicit_models.py")


@pytest.mark.slow  # opt-in: Triton's QA ONNX model, made by the tree's generator
@pytest.mark.parametrize("kind", BLS_KINDS)
def test_bls_sequence_to_an_onnx_model(tmp_path: Path, servers: Servers, monkeypatch: pytest.MonkeyPatch,
                                       onnx_qa_sequence_models: Path, kind: str) -> None:
    """Each sequence adds its inputs up in the ONNX model's implicit state, as ``test_bls_sequence`` expects; its
    config asks for a GPU instance, which is a CPU one here."""
    target = tmp_path / "onnx_nobatch_sequence_int32"
    shutil.copytree(onnx_qa_sequence_models / target.name, target)
    config = target / "config.pbtxt"
    config.write_text(config.read_text().replace("KIND_GPU", "KIND_CPU"))
    (tmp_path / "bls_sequence" / "1").mkdir(parents=True)
    (tmp_path / "bls_sequence" / "1" / "model.py").write_text(BLS_SEQUENCE_PROBE)
    (tmp_path / "bls_sequence" / "config.pbtxt").write_text(RUNNER_CONFIG.format(name="bls_sequence",
                                                                                 datatype="TYPE_STRING"))
    monkeypatch.setenv("BLS_KIND", kind)
    expected = list(np.cumsum([1000, *range(10), 2000]))
    assert json.loads(_output0(servers.start(tmp_path), "bls_sequence")[0]) == {"1000": expected, "1001": expected}


@pytest.mark.slow  # opt-in: Triton's own QA models; 90 s of the model's own sleeps per load
def test_bls_model_loading(tmp_path: Path, servers: Servers, monkeypatch: pytest.MonkeyPatch,
                           onnx_qa_models: Path) -> None:
    """bls/test.sh: the load answers 200, ``OUTPUT0`` is ``[1]``; then, with the warmup appended, the load again
    (Ferry refused that sample's inputs, which the model does not declare: fixed in ab506ce)."""
    import tritonclient.http as httpclient

    models = tmp_path / "models"
    _install(models, "bls_model_loading")
    shutil.copytree(onnx_qa_models / "onnx_int32_int32_int32", models / "onnx_int32_int32_int32")
    shutil.rmtree(models / "onnx_int32_int32_int32" / "1")
    monkeypatch.chdir(tmp_path)  # the model opens models/onnx_int32_int32_int32/3/model.onnx from the server's cwd
    handle = servers.start(models, explicit=True)
    client = httpclient.InferenceServerClient(handle.http_url, network_timeout=300.0)  # curl waits as long
    client.load_model("bls_model_loading")
    assert _output0(handle, "bls_model_loading") == [1.0]
    with (models / "bls_model_loading" / "config.pbtxt").open("a") as config:
        config.write(MODEL_LOADING_WARMUP)
    servers.stop()  # the script starts a new server
    handle = servers.start(models, explicit=True)
    httpclient.InferenceServerClient(handle.http_url, network_timeout=300.0).load_model("bls_model_loading")
    assert _output0(handle, "bls_model_loading") == [1.0]


@pytest.mark.slow  # opt-in: Triton's own QA models, from FERRY_TRITON_SERVER_SOURCE
def test_model_env(tmp_path: Path, servers: Servers, monkeypatch: pytest.MonkeyPatch) -> None:
    """L0_backend_python/test.sh: with ``MY_ENV=MY_ENV`` in the server's environment the model loads; without it,
    its ``initialize`` raises and the load fails with that message."""
    from tritonclient.utils import InferenceServerException

    _install(tmp_path, "model_env")
    monkeypatch.delenv("MY_ENV", raising=False)
    client = servers.start(tmp_path, explicit=True).client("http")
    with pytest.raises(InferenceServerException) as refused:
        client.load_model("model_env")
    assert refused.value.message() == (
        "load failed for model 'model_env': version 1 is at UNAVAILABLE state: Internal: TritonModelException: "
        "MY_ENV doesn't exists or contains incorrect value;\n")
    monkeypatch.setenv("MY_ENV", "MY_ENV")
    client.load_model("model_env")
    assert client.is_model_ready("model_env")


@pytest.mark.slow  # opt-in: Triton's own QA models, from FERRY_TRITON_SERVER_SOURCE
def test_bls_onnx_warmup(tmp_path: Path, servers: Servers, onnx_qa_models: Path) -> None:
    """The ONNX call answers both outputs; the case then fails where it asks for GPU memory, as on any CPU server."""
    _wrapped(tmp_path, "bls_onnx_warmup", UNITTEST_RUNNER, "TYPE_STRING")
    shutil.copytree(onnx_qa_models / "onnx_nobatch_float32_float32_float32",
                    tmp_path / "onnx_nobatch_float32_float32_float32")
    handle = servers.start(tmp_path)
    assert json.loads(_output0(handle, "bls_onnx_warmup")[0]) == ["AssertionError: True is not false"]
    tensors = [np.arange(16, dtype=np.float32), np.ones(16, np.float32)]  # the model the case calls, directly
    import tritonclient.grpc as grpcclient

    inputs = [grpcclient.InferInput(f"INPUT{i}", [16], "FP32") for i in (0, 1)]
    for tensor, data in zip(inputs, tensors):
        tensor.set_data_from_numpy(data)
    result = handle.client("grpc").infer("onnx_nobatch_float32_float32_float32", inputs)
    assert sorted(result.as_numpy("OUTPUT0").tolist() + result.as_numpy("OUTPUT1").tolist()) == sorted(
        (tensors[0] - tensors[1]).tolist() + (tensors[0] + tensors[1]).tolist())

