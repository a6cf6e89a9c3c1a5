"""NVIDIA Triton's own python backend QA models (``qa/python_models`` of Triton 2.51, unmodified, in
``data/triton_qa``) run on Ferry and on Triton side by side: ``init_args``, ``sequence_py`` (as Triton's
``L0_sequence_batcher`` installs it: non-decoupled and decoupled), ``bls_parameters``, ``bls_undefined``,
``bls_init_error``, ``bls_finalize_error``, ``bls_request_rescheduling`` and the ``PBBLSTest`` cases of ``bls``
that need neither torch nor a GPU nor an ONNX model.

Difference found and fixed:

- The iterator of ``exec(decoupled=True)`` (``bls``'s ``test_response_iterator``): once all responses were
  read, Triton's keeps them and a new ``for`` loop over it reads them all again (one broken out of resumes);
  the last response (the final one) ends the iteration. Ferry's was spent: a second loop read nothing.

Everything else answered the same, and is kept here so it stays so: every key, value and type of
``initialize(args)`` (``model_config`` byte for byte, ``model_instance_name`` ``<model>_0_0``, ``model_repository``
the model's folder), a sequence model's answers and refusals request by request, BLS parameters passed down
three calls, a model's ``NameError`` (``Failed to process the request(s) for model '<instance>', message:``),
BLS from ``initialize`` failing the load, BLS from ``finalize`` not failing the unload.

Kept different on purpose: Triton appends the model's traceback to the error a client gets (``\\n\\nAt:\\n
<server path>(line): function``); Ferry sends the exception alone (``test_python_qa_parity``). Compared with
it cut off.

Not run (need what a CPU Triton 2.51 here cannot have): ``bls_async``, ``bls_memory_async`` and ``bls``'s GPU,
DLPack and ``onnx_nobatch_sequence_int32`` cases (torch, a GPU, ONNX models), ``bls_memory`` (1 GiB tensors),
``bls_model_loading`` and ``bls_onnx_warmup`` (ONNX models on Triton), ``bls``'s ``test_multiprocess`` (forks the
model's process). Those that sleep (``test_timeout``: 5 s a call; ``bls_request_rescheduling``: 20 s) run in the
side-by-side test only.
"""

from __future__ import annotations

import json
import queue
import re
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

QA = Path(__file__).resolve().parent / "data" / "triton_qa"

#: as ``qa/L0_backend_python/test.sh`` and ``bls/test.sh`` install them: ``<name>/1/model.py``
PLAIN = ("init_args", "bls_parameters", "bls_undefined", "bls_init_error", "bls_finalize_error", "add_sub",
         "execute_error", "identity_fp32", "identity_fp32_timeout", "square_int32", "wrong_return_type",
         "iterative_sequence", "request_rescheduling_addsub", "bls_request_rescheduling")

ECHO_MODEL = '''
import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """``init_args`` telling what it got: the JSON of ``initialize(args)``, one byte an element of ``OUT``."""

    def initialize(self, args):
        self.text = json.dumps({"keys": list(args), "types": [type(v).__name__ for v in args.values()],
                                "args": args})

    def execute(self, requests):
        data = np.frombuffer(self.text.encode(), np.uint8).astype(np.float32)[None, :]
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", data)]) for _ in requests]
'''

#: ``bls``'s ``PBBLSTest`` imports torch at the top; these cases never call it
TORCH_STUB = {
    "torch/__init__.py": "",
    "torch/utils/__init__.py": "",
    "torch/utils/dlpack.py": 'def from_dlpack(x):\n    raise RuntimeError("no torch here")\n\n\n'
                             'def to_dlpack(x):\n    raise RuntimeError("no torch here")\n',
}

BLS_RUNNER = '''
import json
import os
import unittest

import numpy as np
import triton_python_backend_utils as pb_utils

import qa_bls  # Triton's qa/python_models/bls/model.py, unmodified


class TritonPythonModel:
    """Runs one ``PBBLSTest`` case (``TEST``) as BLS_KIND ``decoupled`` (``KIND`` 1) or not; ``OUT``: "ok" or the
    last line of each failure."""

    def execute(self, requests):
        responses = []
        for request in requests:
            kind = int(pb_utils.get_input_tensor_by_name(request, "KIND").as_numpy()[0])
            test = pb_utils.get_input_tensor_by_name(request, "TEST").as_numpy()[0].decode()
            os.environ["BLS_KIND"] = "decoupled" if kind else "non_decoupled"
            result = unittest.TestResult()
            qa_bls.PBBLSTest(test).run(result)
            seen = [trace.strip().splitlines()[-1] for _, trace in result.failures + result.errors]
            text = json.dumps(seen or "ok").encode()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([text], np.object_))]))
        return responses
'''

BLS_RUNNER_CONFIG = '''name: "bls_runner"
backend: "python"
max_batch_size: 0
input [ { name: "KIND" data_type: TYPE_INT32 dims: [ 1 ] }, { name: "TEST" data_type: TYPE_STRING dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_STRING dims: [ 1 ] } ]
'''


def _install(root: Path, name: str, source: str, files: dict[str, str] | None = None) -> Path:
    version = root / name / "1"
    version.mkdir(parents=True)
    shutil.copyfile(QA / source / "model.py", version / "model.py")
    shutil.copyfile(QA / source / "config.pbtxt", root / name / "config.pbtxt")
    for relative, text in (files or {}).items():
        (version / relative).parent.mkdir(parents=True, exist_ok=True)
        (version / relative).write_text(text)
    return root / name


def _repository(root: Path) -> Path:
    for name in PLAIN:
        _install(root, name, name)
    # qa/L0_sequence_batcher/test.sh: sequence_py as it is, and with the decoupled policy appended
    for mode in ("nondecoupled", "decoupled"):
        model = _install(root, f"seqpy_{mode}", "sequence_py")
        if mode == "decoupled":
            with (model / "config.pbtxt").open("a") as config:
                config.write("\nmodel_transaction_policy { decoupled: true }\n")
    echo = _install(root, "init_args_echo", "init_args")
    (echo / "1" / "model.py").write_text(ECHO_MODEL)
    config = echo / "config.pbtxt"
    config.write_text(config.read_text().replace('name: "init_args"', 'name: "init_args_echo"'))
    runner = root / "bls_runner"
    _install(root, "bls_runner", "bls", TORCH_STUB)
    (runner / "1" / "model.py").rename(runner / "1" / "qa_bls.py")
    (runner / "1" / "model.py").write_text(BLS_RUNNER)
    (runner / "config.pbtxt").write_text(BLS_RUNNER_CONFIG)
    return root


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _repository(tmp_path_factory.mktemp("triton_qa"))


@pytest.fixture(scope="module")
def server(repository: Path) -> Any:
    from support.server import ServerThread, make_options

    thread = ServerThread(make_options([repository], model_control_mode="explicit"))
    handle = thread.start()
    yield handle
    thread.stop()


# --------------------------------------------------------------------------- what a client sees


def _message(exc: Any) -> str:
    """An error's message without the traceback Triton appends, its repository paths as ``<repo>``."""
    text = re.sub(r"\n\nAt:\n(?:  .*\n)*", "", exc.message())
    return re.sub(r"got \S+/(\w+)", r"got <repo>/\1", text)


def _load(client: Any, name: str) -> str:
    from tritonclient.utils import InferenceServerException

    try:
        client.load_model(name)
    except InferenceServerException as exc:
        return _message(exc)
    return "loaded"


def _init_args(client: Any, module: Any) -> dict[str, Any]:
    seen: dict[str, Any] = {"init_args": _load(client, "init_args"), "echo": _load(client, "init_args_echo")}
    tensor = module.InferInput("IN", [1, 1], "FP32")
    tensor.set_data_from_numpy(np.ones((1, 1), np.float32))
    echo = json.loads(client.infer("init_args_echo", [tensor]).as_numpy("OUT").astype(np.uint8).tobytes())
    repository = echo["args"].pop("model_repository")
    seen.update(echo, repository=repository.rsplit("/", 1)[-1], absolute=repository.startswith("/"))
    return seen


def _sequence(client: Any, module: Any) -> dict[str, Any]:
    """Requests of sequences 7, 8, 9 one at a time (each answered before the next goes: no batching)."""
    from tritonclient.utils import InferenceServerException

    steps = [(7, True, False), (7, False, False), (8, False, False), (7, False, True), (7, True, False),
             (9, True, True)]
    tensor = module.InferInput("INPUT0", [1, 1], "INT32")
    tensor.set_data_from_numpy(np.ones((1, 1), np.int32))
    seen: dict[str, Any] = {}
    for name in ("seqpy_nondecoupled", "seqpy_decoupled"):
        seen[name] = [_load(client, name)]
        if not hasattr(client, "start_stream"):  # HTTP: unary, the non-decoupled one only
            if name == "seqpy_nondecoupled":
                for sequence_id, start, end in steps:
                    try:
                        answer = client.infer(name, [tensor], sequence_id=sequence_id, sequence_start=start,
                                              sequence_end=end).as_numpy("OUTPUT0").tolist()
                    except InferenceServerException as exc:
                        answer = _message(exc)
                    seen[name].append(answer)
            continue
        answers: queue.Queue = queue.Queue()
        client.start_stream(callback=lambda result, error, answers=answers: answers.put(
            _message(error) if error else result.as_numpy("OUTPUT0").tolist()))
        try:
            for sequence_id, start, end in steps:
                client.async_stream_infer(name, [tensor], sequence_id=sequence_id, sequence_start=start,
                                          sequence_end=end)
                step: list[Any] = []
                while len(step) < (3 if name == "seqpy_decoupled" else 1):
                    step.append(answers.get(timeout=60))
                    if isinstance(step[-1], str):
                        break
                seen[name].append(step)
        finally:
            client.stop_stream()
    for name in seen:  # the model keeps its sequences: the next run starts afresh
        client.unload_model(name)
    return seen


def _bls_parameters(client: Any, module: Any) -> list[Any]:
    tensor = module.InferInput("NUMBER_PARAMETERS", [1], "UINT8")
    tensor.set_data_from_numpy(np.array([3], np.uint8))
    return [_load(client, "bls_parameters"),
            json.loads(client.infer("bls_parameters", [tensor]).as_numpy("PARAMETERS_AGGREGATED")[0])]


def _bls_undefined(client: Any, module: Any) -> list[Any]:
    from tritonclient.utils import InferenceServerException

    tensor = module.InferInput("INPUT0", [2], "INT32")
    tensor.set_data_from_numpy(np.ones(2, np.int32))
    seen: list[Any] = [_load(client, "bls_undefined")]
    try:
        client.infer("bls_undefined", [tensor])
    except InferenceServerException as exc:  # which of its two instances ran it is not the point
        seen.append(re.sub(r"bls_undefined_0_\d", "bls_undefined_0_N", _message(exc)))
    return seen


def _bls_in_initialize_and_finalize(client: Any, module: Any) -> list[Any]:
    """BLS from ``initialize`` fails the load; from ``finalize``, Triton logs the error and the unload goes on."""
    seen: list[Any] = [_load(client, "square_int32"), _load(client, "bls_init_error"),
                       client.is_model_ready("bls_init_error"), _load(client, "bls_finalize_error")]
    client.unload_model("bls_finalize_error")
    deadline = time.monotonic() + 60
    while (rows := _rows(client, "bls_finalize_error")) and rows[0]["state"] == "UNLOADING":  # Triton's unload
        assert time.monotonic() < deadline, rows                                               # returns at once
        time.sleep(0.2)
    return seen + [client.is_model_ready("bls_finalize_error"), rows, _load(client, "bls_finalize_error")]


def _rows(client: Any, name: str) -> list[dict[str, str]]:
    index = client.get_model_repository_index()
    rows = index if isinstance(index, list) else [
        {"name": m.name, "version": m.version, "state": m.state, "reason": m.reason} for m in index.models]
    return [{"reason": "", **row} for row in rows if row["name"] == name]


#: bls's PBBLSTest cases that need neither torch, a GPU nor an ONNX model, quick ones first
QUICK_BLS = ["test_bls_wrong_inputs", "test_bls_incorrect_args", "test_zero_length_io", "test_bls_sync",
             "test_bls_execute_error", "test_multiple_bls", "test_response_iterator"]
SLOW_BLS = ["test_timeout"]


def _bls(tests: list[str]) -> Callable[[Any, Any], dict[str, Any]]:
    def run(client: Any, module: Any) -> dict[str, Any]:
        seen: dict[str, Any] = {m: _load(client, m) for m in (
            "add_sub", "execute_error", "identity_fp32", "identity_fp32_timeout", "square_int32", "bls_runner")}
        for kind in (0, 1):
            for test in tests:
                inputs = [module.InferInput("KIND", [1], "INT32"), module.InferInput("TEST", [1], "BYTES")]
                inputs[0].set_data_from_numpy(np.array([kind], np.int32))
                inputs[1].set_data_from_numpy(np.array([test.encode()], np.object_))
                seen[f"{test}:{'decoupled' if kind else 'non_decoupled'}"] = json.loads(
                    client.infer("bls_runner", inputs).as_numpy("OUT")[0])
        return seen
    return run


def _bls_request_rescheduling(client: Any, module: Any) -> list[Any]:
    """Its unittest reloads two models (sleeping 10 s for each) and runs them through BLS; ``OUTPUT0``: passed."""
    loaded = [_load(client, m) for m in ("wrong_return_type", "request_rescheduling_addsub", "iterative_sequence",
                                         "bls_request_rescheduling")]
    return loaded + [client.infer("bls_request_rescheduling", []).as_numpy("OUTPUT0").tolist()]


SEQUENCE_ERRORS = {
    "no_start": "inference request for sequence 8 to model '{}' must specify the START flag on the first request "
                "of the sequence",
    "again": "Failed to process the request(s) for model '{}_0', message: TritonModelException: Can't start a new "
             "sequence with existing ID",
    "need": "Failed to process the request(s) for model '{}_0', message: TritonModelException: Need START flag for "
            "a sequence ID that doesn't already exist.",
}


def _sequence_expected(name: str, answers: int) -> list[Any]:
    """A stream's answers to the steps of ``_sequence``, ``answers`` for each request; ``0``: HTTP's unary ones."""
    no_start, again, need = (text.format(name) for text in SEQUENCE_ERRORS.values())
    if not answers:
        return ["loaded", [1], [2], no_start, [3], again, need]
    return ["loaded", [[1]] * answers, [[2]] * answers, [no_start], [[3]] * answers, [again], [need]]


#: the model_config JSON Triton 2.51 hands ``initialize`` for init_args' config.pbtxt (named init_args_echo)
INIT_ARGS_CONFIG = (
    '{"name":"init_args_echo","platform":"","backend":"python","runtime":"","version_policy":{"latest":'
    '{"num_versions":1}},"max_batch_size":64,"input":[{"name":"IN","data_type":"TYPE_FP32","format":"FORMAT_NONE",'
    '"dims":[-1],"is_shape_tensor":false,"allow_ragged_batch":false,"optional":false,"is_non_linear_format_io":false}],'
    '"output":[{"name":"OUT","data_type":"TYPE_FP32","dims":[-1],"label_filename":"","is_shape_tensor":false,'
    '"is_non_linear_format_io":false}],"batch_input":[],"batch_output":[],"optimization":{"priority":'
    '"PRIORITY_DEFAULT","input_pinned_memory":{"enable":true},"output_pinned_memory":{"enable":true},'
    '"gather_kernel_buffer_threshold":0,"eager_batching":false},"instance_group":[{"name":"init_args_echo_0",'
    '"kind":"KIND_CPU","count":1,"gpus":[],"secondary_devices":[],"profile":[],"passive":false,"host_policy":""}],'
    '"default_model_filename":"model.py","cc_model_filenames":{},"metric_tags":{},"parameters":{},"model_warmup":[]}'
)
INIT_ARGS_KEYS = ["model_config", "model_instance_kind", "model_instance_name", "model_instance_device_id",
                  "model_repository", "model_version", "model_name"]

BLS_LOADED = {name: "loaded" for name in (
    "add_sub", "execute_error", "identity_fp32", "identity_fp32_timeout", "square_int32", "bls_runner")}


def _passed(tests: list[str]) -> dict[str, str]:
    return {f"{test}:{kind}": "ok" for kind in ("non_decoupled", "decoupled") for test in tests}


#: each case: what a client sees, and what Triton 2.51 shows (Ferry's half runs by default)
CASES: dict[str, tuple[Callable[[Any, Any], Any], Any]] = {
    "init_args": (_init_args, {
        # the unmodified model checks five keys, then fails on model_repository (it expects /opt/tritonserver/...)
        "init_args": "load failed for model 'init_args': version 1 is at UNAVAILABLE state: Internal: "
                     "TritonModelException: model_repository does not contain correct value. Expected "
                     '"/opt/tritonserver/qa/L0_backend_python/models/init_args, got <repo>/init_args;\n',
        "echo": "loaded", "keys": INIT_ARGS_KEYS, "types": ["str"] * 7,
        "args": {"model_config": INIT_ARGS_CONFIG, "model_instance_kind": "CPU",
                 "model_instance_name": "init_args_echo_0_0", "model_instance_device_id": "0",
                 "model_version": "1", "model_name": "init_args_echo"},
        "repository": "init_args_echo", "absolute": True,
    }),
    "sequence_py": (_sequence, {"seqpy_nondecoupled": _sequence_expected("seqpy_nondecoupled", 1),
                                "seqpy_decoupled": _sequence_expected("seqpy_decoupled", 3)}),
    "bls_parameters": (_bls_parameters, ["loaded", {
        f"{kind}_{i}": value for i in (1, 2, 3) for kind, value in (("bool", True), ("int", i), ("str", str(i)))}]),
    "bls_undefined": (_bls_undefined, ["loaded", ("Failed to process the request(s) for model 'bls_undefined_0_N', "
                                                  "message: NameError: name 'undefined_variable' is not defined")]),
    "bls_init_and_finalize": (_bls_in_initialize_and_finalize, [
        "loaded", ("load failed for model 'bls_init_error': version 1 is at UNAVAILABLE state: Internal: "
                   "TritonModelException: BLS is only supported during the 'execute' function.;\n"), False, "loaded",
        False, [{"name": "bls_finalize_error", "version": "1", "state": "UNAVAILABLE", "reason": "unloaded"}],
        "loaded"]),
    "bls": (_bls(QUICK_BLS), {**BLS_LOADED, **_passed(QUICK_BLS)}),
}

HTTP_SEQUENCE = {"seqpy_nondecoupled": _sequence_expected("seqpy_nondecoupled", 0), "seqpy_decoupled": ["loaded"]}

def _expected(case: str, protocol: str) -> Any:
    if case == "sequence_py" and protocol == "http":  # no stream: the unary answers of the non-decoupled one
        return HTTP_SEQUENCE
    return {**CASES, **SLOW_CASES}[case][1]


#: cases that sleep: in the side-by-side test only
SLOW_CASES: dict[str, tuple[Callable[[Any, Any], Any], Any]] = {
    "bls_timeout": (_bls(SLOW_BLS), {**BLS_LOADED, **_passed(SLOW_BLS)}),
    "bls_request_rescheduling": (_bls_request_rescheduling, ["loaded"] * 4 + [[1.0]]),
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_triton_qa_models_answer_as_on_triton(server: Any, protocol: str, case: str) -> None:
    ask, _ = CASES[case]
    assert ask(server.client(protocol), server.module(protocol)) == _expected(case, protocol)


def test_a_bls_response_iterator_reads_its_responses_again(server: Any) -> None:
    """``bls``'s ``test_response_iterator`` as decoupled: once all were read, a new loop reads them all again."""
    assert _bls(["test_response_iterator"])(server.client("grpc"), server.module("grpc"))[
        "test_response_iterator:decoupled"] == "ok"


@pytest.mark.slow  # live NVIDIA Triton: Ferry's half runs by default against the same expected answers
def test_the_same_qa_models_answer_the_same_on_nvidia_triton(server: Any, repository: Path) -> None:
    """Side by side with Triton 2.51 (skipped where it cannot be had), the sleeping cases included."""
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient
    from support.triton import running_triton

    cases = {**CASES, **SLOW_CASES}
    seen: dict[str, dict[str, Any]] = {}
    with running_triton(repository, []) as (http, grpc, _):
        clients = {"http": (httpclient.InferenceServerClient(f"127.0.0.1:{http}", network_timeout=120.0), httpclient),
                   "grpc": (grpcclient.InferenceServerClient(f"127.0.0.1:{grpc}"), grpcclient)}
        seen["triton"] = {f"{case}:{p}": ask(*clients[p]) for case, (ask, _) in cases.items() for p in clients}
    seen["ferry"] = {f"{case}:{p}": ask(server.client(p), server.module(p))
                     for case, (ask, _) in cases.items() for p in ("http", "grpc")}
    assert seen["ferry"] == seen["triton"] == {f"{case}:{p}": _expected(case, p) for case in cases for p in clients}
