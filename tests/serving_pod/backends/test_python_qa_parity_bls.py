"""Python backend behaviours that NVIDIA Triton's own QA models (``qa/python_models`` of Triton 2.51) check, with
models of ours (``data/qa_behaviours``, and ``iter_probe`` / ``countdown`` of tests/serving_pod/data/iterative) run
on Ferry and on Triton side by side: every key, value and type of ``initialize(args)`` (``model_config`` byte for
byte, ``model_instance_name`` ``<model>_0_0``, ``model_repository`` the model's folder); a sequence model's
answers and refusals request by request, unary and decoupled; BLS parameters passed down three calls; a model's
``NameError`` (``Failed to process the request(s) for model '<instance>', message:``); BLS from ``initialize``
failing the load and from ``finalize`` not failing the unload; and, from a BLS probe model, with ``exec()`` and
``exec(decoupled=True)``: a call missing an input, ``InferenceRequest`` without its required arguments, a call to
a model that is not there, a model's error response, thirty calls in a row, zero-length tensors, request
timeouts, rescheduling models called by BLS, and reading a decoupled call's response iterator in turns.

Difference found and fixed (commit a594799): the iterator of ``exec(decoupled=True)``: once all responses were
read, Triton's keeps them and a new ``for`` loop over it reads them all again (one broken out of resumes); the
last response (the final one) ends the iteration. Ferry's was spent: a second loop read nothing
(``test_a_bls_response_iterator_reads_its_responses_again``).

Kept different on purpose: Triton appends the model's traceback to the error a client gets (``\\n\\nAt:\\n
<server path>(line): function``); Ferry sends the exception alone (``test_python_qa_parity``). Compared with
it cut off.

Opt-in (``-m slow`` with ``FERRY_TRITON_SERVER_SOURCE``, a checkout of triton-inference-server/server at v2.51.0):
Triton's QA models unmodified, read from that tree at test time and laid out as its QA scripts do (``sequence_py``
twice, ``bls/model.py``'s ``PBBLSTest`` run by a wrapper of ours, with a ``torch`` stub), on Ferry and on Triton;
python_backend's ``square_int32`` is our ``repeat_int32`` under that name. Not run side by side (they need what a
CPU Triton 2.51 here cannot have: onnxruntime, a GPU, torch): ``bls_async``, ``bls_memory*``, ``bls_model_loading``,
``bls_onnx_warmup``, ``model_env`` and ``bls``'s ONNX sequence case run on Ferry alone
(test_python_qa_models_on_ferry.py); ``bls``'s GPU, DLPack and ``test_multiprocess`` cases nowhere.
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

DATA = Path(__file__).resolve().parent / "data" / "qa_behaviours"
ITERATIVE = Path(__file__).resolve().parents[1] / "data" / "iterative"

Case = Callable[[Any, Any], Any]


def _decoupled_copy(root: Path, source: str, name: str) -> None:
    shutil.copytree(root / source, root / name)
    config = root / name / "config.pbtxt"
    text = re.sub(r'^name: ".*"$', f'name: "{name}"', config.read_text(), count=1, flags=re.MULTILINE)
    config.write_text(text + ("\nmodel_transaction_policy { decoupled: true }\n" if "decoupled" in name else ""))


def _repository(root: Path) -> Path:
    """Our models (module docstring); ``seq_counter`` as ``seq_unary`` and ``seq_decoupled``."""
    shutil.copytree(DATA, root, dirs_exist_ok=True, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("iter_probe", "countdown"):
        shutil.copytree(ITERATIVE / name, root / name, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("seq_unary", "seq_decoupled"):
        _decoupled_copy(root, "seq_counter", name)
    shutil.rmtree(root / "seq_counter")
    return root


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _repository(tmp_path_factory.mktemp("qa_behaviours"))


def _start(repository: Path) -> Any:
    from support.server import ServerThread, make_options

    return ServerThread(make_options([repository], model_control_mode="explicit"))


@pytest.fixture(scope="module")
def server(repository: Path) -> Any:
    thread = _start(repository)
    yield thread.start()
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
    seen: dict[str, Any] = {"echo": _load(client, "init_args_echo")}
    tensor = module.InferInput("IN", [1, 1], "FP32")
    tensor.set_data_from_numpy(np.ones((1, 1), np.float32))
    echo = json.loads(client.infer("init_args_echo", [tensor]).as_numpy("OUT").astype(np.uint8).tobytes())
    repository = echo["args"].pop("model_repository")
    seen.update(echo, repository=repository.rsplit("/", 1)[-1], absolute=repository.startswith("/"))
    return seen


#: (sequence id, START, END) of the requests ``_sequence`` sends, one at a time
SEQUENCE_STEPS = [(7, True, False), (7, False, False), (8, False, False), (7, False, True), (7, True, False),
                  (9, True, True)]


def _sequence(unary: str, decoupled: str) -> Case:
    """``SEQUENCE_STEPS`` to both models, each answered before the next goes (no batching); HTTP: unary only."""
    def run(client: Any, module: Any) -> dict[str, Any]:
        from tritonclient.utils import InferenceServerException

        tensor = module.InferInput("INPUT0", [1, 1], "INT32")
        tensor.set_data_from_numpy(np.ones((1, 1), np.int32))
        seen: dict[str, Any] = {}
        for name in (unary, decoupled):
            seen[name] = [_load(client, name)]
            if not hasattr(client, "start_stream"):
                for sequence_id, start, end in SEQUENCE_STEPS if name == unary else []:
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
                for sequence_id, start, end in SEQUENCE_STEPS:
                    client.async_stream_infer(name, [tensor], sequence_id=sequence_id, sequence_start=start,
                                              sequence_end=end)
                    step: list[Any] = []
                    while len(step) < (3 if name == decoupled else 1):
                        step.append(answers.get(timeout=60))
                        if isinstance(step[-1], str):
                            break
                    seen[name].append(step)
            finally:
                client.stop_stream()
        for name in seen:  # the models keep their sequences: the next run starts afresh
            client.unload_model(name)
        return seen
    return run


def _sequence_expected(unary: str, decoupled: str, messages: dict[str, str], answers: list[Any],
                       protocol: str) -> dict[str, Any]:
    """What ``_sequence`` sees: for each step a count, or the key in ``messages`` of what refused it; a decoupled
    model's count comes three times."""
    def said(model: str, answer: int | str, sequence: int) -> Any:
        return messages[answer].format(sequence=sequence, model=model) if isinstance(answer, str) else [answer]

    steps = [(answer, sequence) for answer, (sequence, _, _) in zip(answers, SEQUENCE_STEPS)]
    if protocol == "http":  # no stream: the unary answers of the non-decoupled model
        return {unary: ["loaded", *(said(unary, a, s) for a, s in steps)], decoupled: ["loaded"]}
    return {name: ["loaded", *([said(name, a, s)] * (3 if name == decoupled and not isinstance(a, str) else 1)
                               for a, s in steps)] for name in (unary, decoupled)}


def _chain(model: str, depth: str, out: str) -> Case:
    def run(client: Any, module: Any) -> list[Any]:
        tensor = module.InferInput(depth, [1], "UINT8")
        tensor.set_data_from_numpy(np.array([3], np.uint8))
        return [_load(client, model), json.loads(client.infer(model, [tensor]).as_numpy(out)[0])]
    return run


def _name_error(model: str) -> Case:
    def run(client: Any, module: Any) -> list[Any]:
        from tritonclient.utils import InferenceServerException

        tensor = module.InferInput("INPUT0", [2], "INT32")
        tensor.set_data_from_numpy(np.ones(2, np.int32))
        seen: list[Any] = [_load(client, model)]
        try:
            client.infer(model, [tensor])
        except InferenceServerException as exc:  # which of its two instances ran it is not the point
            seen.append(re.sub(rf"{model}_0_\d", f"{model}_0_N", _message(exc)))
        return seen
    return run


def _bls_lifecycle(square: str, init: str, fini: str) -> Case:
    """BLS from ``initialize`` fails the load; from ``finalize``, Triton logs the error and the unload goes on."""
    def run(client: Any, module: Any) -> list[Any]:
        seen: list[Any] = [_load(client, square), _load(client, init), client.is_model_ready(init), _load(client, fini)]
        client.unload_model(fini)
        deadline = time.monotonic() + 60
        while (rows := _rows(client, fini)) and rows[0]["state"] == "UNLOADING":  # Triton's unload returns at once
            assert time.monotonic() < deadline, rows
            time.sleep(0.2)
        return seen + [client.is_model_ready(fini), rows, _load(client, fini)]
    return run


def _rows(client: Any, name: str) -> list[dict[str, str]]:
    index = client.get_model_repository_index()
    rows = index if isinstance(index, list) else [
        {"name": m.name, "version": m.version, "state": m.state, "reason": m.reason} for m in index.models]
    return [{"reason": "", **row} for row in rows if row["name"] == name]


PROBED = ("sum_diff_fp32", "repeat_int32", "mirror_fp32", "slow_mirror_fp32", "refuses_fp32", "iter_probe",
          "countdown", "bls_probe")


def _probe(*cases: tuple[str, tuple[bool, ...]]) -> Case:
    """``bls_probe``'s answer to each case with each of its kinds (``exec(decoupled=...)``)."""
    def run(client: Any, module: Any) -> dict[str, Any]:
        seen: dict[str, Any] = {m: _load(client, m) for m in PROBED}
        for case, kinds in cases:
            for decoupled in kinds:
                inputs = [module.InferInput("CASE", [1], "BYTES"), module.InferInput("DECOUPLED", [1], "BOOL")]
                inputs[0].set_data_from_numpy(np.array([case.encode()], np.object_))
                inputs[1].set_data_from_numpy(np.array([decoupled]))
                seen[f"{case}:{'decoupled' if decoupled else 'exec'}"] = json.loads(
                    client.infer("bls_probe", inputs).as_numpy("SEEN")[0])
        return seen
    return run


BOTH = (False, True)
PROBE_CASES = [("missing_input", BOTH), ("constructor_errors", (False,)), ("unknown_model", BOTH),
               ("error_in_model", BOTH), ("many_calls", BOTH), ("zero_length", BOTH), ("response_iterator", (True,)),
               ("timeout", BOTH), ("rescheduling", BOTH)]

# --------------------------------------------------------------------------- what Triton 2.51 answers (recorded)

#: the model_config JSON Triton 2.51 hands ``initialize`` for ``init_args_echo``'s config.pbtxt
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
INIT_ARGS = {
    "echo": "loaded",
    "keys": ["model_config", "model_instance_kind", "model_instance_name", "model_instance_device_id",
             "model_repository", "model_version", "model_name"],
    "types": ["str"] * 7,
    "args": {"model_config": INIT_ARGS_CONFIG, "model_instance_kind": "CPU",
             "model_instance_name": "init_args_echo_0_0", "model_instance_device_id": "0", "model_version": "1",
             "model_name": "init_args_echo"},
    "repository": "init_args_echo", "absolute": True,
}
NO_START = ("inference request for sequence {sequence} to model '{model}' must specify the START flag on the first "
            "request of the sequence")
SEQUENCE_MESSAGES = {
    "no_start": NO_START,
    "used": "Failed to process the request(s) for model '{model}_0', message: TritonModelException: sequence "
            "{sequence} was used before: start another one",
}
#: a count per step, or what the step was refused with
SEQUENCE_ANSWERS = [1, 2, "no_start", 3, "used", 1]
PARAMETERS = {f"{kind}_{i}": value for i in (1, 2, 3) for kind, value in (("bool", True), ("int", i), ("str", str(i)))}
LIFECYCLE = [
    "loaded", ("load failed for model '{init}': version 1 is at UNAVAILABLE state: Internal: TritonModelException: "
               "BLS is only supported during the 'execute' function.;\n"), False, "loaded",
    False, [{"name": "{fini}", "version": "1", "state": "UNAVAILABLE", "reason": "unloaded"}], "loaded"]


def _lifecycle_expected(init: str, fini: str) -> list[Any]:
    return json.loads(json.dumps(LIFECYCLE).replace("{init}", init).replace("{fini}", fini))


def _iterator_read_in_turns() -> dict[str, Any]:
    """``response_iterator``: 4 responses ``[4]`` then the empty final one (None)."""
    every = [[4]] * 4 + [None]
    return {"next": [4], "loop": every[1:], "after_loop": "StopIteration", "loops_again": [every] * 3,
            "broken_off": every[:2], "next_after_break": [4], "rest": every[3:], "after_rest": "StopIteration",
            "fresh": [4]}


def _error(message: str) -> dict[str, Any]:
    return {"error": message, "outputs": 0}


def _missing(model: str, given: list[str], missing: list[str]) -> dict[str, Any]:
    count = len(given) + len(missing)
    return _error(f"Model {model} - Error when running inference: [request id: <id_unknown>] expected {count} inputs "
                  f"but got {len(given)} inputs for model '{model}'. Got input(s) {given}, but missing required "
                  f"input(s) {missing}. Please provide all required input(s).")


#: ``bls_probe``'s answers, alike for ``exec()`` and ``exec(decoupled=True)`` unless a case says which
PROBE_ANSWERS = {
    "missing_input:exec": [_missing("sum_diff_fp32", ["A"], ["B"])],
    "missing_input:decoupled": [_missing("repeat_int32", [], ["IN"])],
    "constructor_errors:exec": dict.fromkeys(("model_name", "inputs", "requested_output_names"), "TypeError"),
    "unknown_model": [[_error("Model no_such_model - Error when running inference: Failed for execute the inference "
                              "request. Model 'no_such_model' is not ready.")], True],
    "error_in_model": [[_missing("refuses_fp32", [], ["X"])], [_error("refuses_fp32 refuses every request")]],
    "many_calls": 30,
    "zero_length": [[[1, 0], "float32"]],
    "response_iterator:decoupled": _iterator_read_in_turns(),
    "timeout": [_error("Request timeout expired"), [[1.0, 2.0]]],
    "rescheduling": {"refused": [_error(
        "Failed to process the request(s) for model 'iter_probe_0_0', message: Expected a None object in the "
        "execute function return list for reschduled request, found type "
        "'<class 'c_python_backend_utils.InferenceResponse'>'.")],
        "thrice": [[1, 0, 3]], "countdown": [[2], [1], [0]]},
}
PROBE = {**{m: "loaded" for m in PROBED}, **{
    f"{case}:{kind}": PROBE_ANSWERS.get(f"{case}:{kind}", PROBE_ANSWERS.get(case))
    for case, kinds in PROBE_CASES for kind in ("decoupled" if k else "exec" for k in kinds)}}

#: each case: what a client sees, and what Triton 2.51 shows (Ferry's half runs by default)
CASES: dict[str, tuple[Case, Callable[[str], Any]]] = {
    "init_args": (_init_args, lambda protocol: INIT_ARGS),
    "sequence": (_sequence("seq_unary", "seq_decoupled"), lambda protocol: _sequence_expected(
        "seq_unary", "seq_decoupled", SEQUENCE_MESSAGES, SEQUENCE_ANSWERS, protocol)),
    "bls_parameters": (_chain("params_chain", "DEPTH", "PARAMS"), lambda protocol: ["loaded", PARAMETERS]),
    "name_error": (_name_error("name_error"), lambda protocol: [
        "loaded", ("Failed to process the request(s) for model 'name_error_0_N', message: NameError: name "
                   "'nowhere_defined' is not defined")]),
    "bls_init_and_finalize": (_bls_lifecycle("repeat_int32", "bls_at_initialize", "bls_at_finalize"),
                              lambda protocol: _lifecycle_expected("bls_at_initialize", "bls_at_finalize")),
    "bls": (_probe(*PROBE_CASES), lambda protocol: PROBE),
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_our_models_answer_as_on_triton(server: Any, protocol: str, case: str) -> None:
    ask, expected = CASES[case]
    assert ask(server.client(protocol), server.module(protocol)) == expected(protocol)


def test_a_bls_response_iterator_reads_its_responses_again(server: Any) -> None:
    """Once all were read, a new loop reads them all again; a loop broken out of resumes (commit a594799)."""
    seen = _probe(("response_iterator", (True,)))(server.client("grpc"), server.module("grpc"))
    assert seen["response_iterator:decoupled"] == _iterator_read_in_turns()


def _side_by_side(repository: Path, cases: dict[str, tuple[Case, Callable[[str], Any]]]) -> None:
    """Each case over HTTP and gRPC, on Triton 2.51 (skipped where it cannot be had) and on Ferry."""
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient
    from support.triton import running_triton

    seen: dict[str, dict[str, Any]] = {}
    with running_triton(repository, []) as (http, grpc, _):
        clients = {"http": (httpclient.InferenceServerClient(f"127.0.0.1:{http}", network_timeout=120.0), httpclient),
                   "grpc": (grpcclient.InferenceServerClient(f"127.0.0.1:{grpc}"), grpcclient)}
        seen["triton"] = {f"{case}:{p}": ask(*clients[p]) for case, (ask, _) in cases.items() for p in clients}
    seen["ferry"] = _on_ferry(repository, cases)
    assert seen["ferry"] == seen["triton"] == {f"{case}:{p}": expected(p) for case, (_, expected) in cases.items()
                                               for p in clients}


def _on_ferry(repository: Path, cases: dict[str, tuple[Case, Callable[[str], Any]]]) -> dict[str, Any]:
    thread = _start(repository)
    handle = thread.start()
    try:
        return {f"{case}:{p}": ask(handle.client(p), handle.module(p)) for case, (ask, _) in cases.items()
                for p in ("http", "grpc")}
    finally:
        thread.stop()


@pytest.mark.slow  # live NVIDIA Triton: Ferry's half runs by default against the same expected answers
def test_our_models_answer_the_same_on_nvidia_triton(repository: Path) -> None:
    _side_by_side(repository, CASES)


# --------------------------------------------------------------------------- opt-in: Triton's QA models unmodified

#: as ``qa/L0_backend_python/test.sh`` and ``bls/test.sh`` install them: ``<name>/1/model.py``
TRITON_QA = ("init_args", "bls_parameters", "bls_undefined", "bls_init_error", "bls_finalize_error", "add_sub",
             "execute_error", "identity_fp32", "identity_fp32_timeout", "wrong_return_type", "iterative_sequence",
             "request_rescheduling_addsub", "bls_request_rescheduling")

#: ``bls``'s ``PBBLSTest`` imports torch at the top; the cases run here never call it
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


@pytest.fixture(scope="module")
def triton_qa_repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Triton's QA models from FERRY_TRITON_SERVER_SOURCE (skipped where unset), as its QA scripts lay them out."""
    from support.python_models import install_triton_qa_model, triton_qa_models_or_skip

    models = triton_qa_models_or_skip()
    root = tmp_path_factory.mktemp("triton_qa")
    for name in TRITON_QA:
        install_triton_qa_model(root, models, name)
    for name in ("seqpy_nondecoupled", "seqpy_decoupled"):  # qa/L0_sequence_batcher/test.sh
        install_triton_qa_model(root, models, "sequence_py", name)
        if name == "seqpy_decoupled":
            with (root / name / "config.pbtxt").open("a") as config:
                config.write("\nmodel_transaction_policy { decoupled: true }\n")
    square = root / "square_int32"  # python_backend's examples/decoupled square model: ours in its place
    shutil.copytree(DATA / "repeat_int32", square, ignore=shutil.ignore_patterns("__pycache__"))
    (square / "config.pbtxt").write_text((square / "config.pbtxt").read_text().replace(
        'name: "repeat_int32"', 'name: "square_int32"'))
    runner = install_triton_qa_model(root, models, "bls", "bls_runner")
    (runner / "1" / "model.py").rename(runner / "1" / "qa_bls.py")
    (runner / "1" / "model.py").write_text(BLS_RUNNER)
    (runner / "config.pbtxt").write_text(BLS_RUNNER_CONFIG)
    for relative, text in TORCH_STUB.items():
        (runner / "1" / relative).parent.mkdir(parents=True, exist_ok=True)
        (runner / "1" / relative).write_text(text)
    return root


def _triton_init_args(client: Any, module: Any) -> str:
    """The unmodified model checks five keys, then fails on model_repository (it expects /opt/tritonserver/...)."""
    return _load(client, "init_args")


def _bls(tests: list[str]) -> Case:
    def run(client: Any, module: Any) -> dict[str, Any]:
        seen: dict[str, Any] = {m: _load(client, m) for m in BLS_LOADED}
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


#: bls's PBBLSTest cases that need neither torch, a GPU nor an ONNX model
QA_BLS = ["test_bls_wrong_inputs", "test_bls_incorrect_args", "test_zero_length_io", "test_bls_sync",
          "test_bls_execute_error", "test_multiple_bls", "test_response_iterator", "test_timeout"]
BLS_LOADED = ("add_sub", "execute_error", "identity_fp32", "identity_fp32_timeout", "square_int32", "bls_runner")
QA_SEQUENCE_MESSAGES = {
    "no_start": NO_START,
    "again": "Failed to process the request(s) for model '{model}_0', message: TritonModelException: Can't start a new "
             "sequence with existing ID",
    "need": "Failed to process the request(s) for model '{model}_0', message: TritonModelException: Need START flag "
            "for a sequence ID that doesn't already exist.",
}

TRITON_QA_CASES: dict[str, tuple[Case, Callable[[str], Any]]] = {
    "init_args": (_triton_init_args, lambda protocol: (
        "load failed for model 'init_args': version 1 is at UNAVAILABLE state: Internal: TritonModelException: "
        'model_repository does not contain correct value. Expected "/opt/tritonserver/qa/L0_backend_python/models/'
        'init_args, got <repo>/init_args;\n')),
    "sequence_py": (_sequence("seqpy_nondecoupled", "seqpy_decoupled"), lambda protocol: _sequence_expected(
        "seqpy_nondecoupled", "seqpy_decoupled", QA_SEQUENCE_MESSAGES, [1, 2, "no_start", 3, "again", "need"],
        protocol)),
    "bls_parameters": (_chain("bls_parameters", "NUMBER_PARAMETERS", "PARAMETERS_AGGREGATED"),
                       lambda protocol: ["loaded", PARAMETERS]),
    "bls_undefined": (_name_error("bls_undefined"), lambda protocol: [
        "loaded", ("Failed to process the request(s) for model 'bls_undefined_0_N', message: NameError: name "
                   "'undefined_variable' is not defined")]),
    "bls_init_and_finalize": (_bls_lifecycle("square_int32", "bls_init_error", "bls_finalize_error"),
                              lambda protocol: _lifecycle_expected("bls_init_error", "bls_finalize_error")),
    "bls": (_bls(QA_BLS), lambda protocol: {**{m: "loaded" for m in BLS_LOADED}, **{
        f"{test}:{kind}": "ok" for kind in ("non_decoupled", "decoupled") for test in QA_BLS}}),
    "bls_request_rescheduling": (_bls_request_rescheduling, lambda protocol: ["loaded"] * 4 + [[1.0]]),
}


@pytest.mark.slow  # opt-in: Triton's own QA models, from FERRY_TRITON_SERVER_SOURCE
def test_triton_qa_models_unmodified_on_ferry(triton_qa_repository: Path) -> None:
    assert _on_ferry(triton_qa_repository, TRITON_QA_CASES) == {
        f"{case}:{p}": expected(p) for case, (_, expected) in TRITON_QA_CASES.items() for p in ("http", "grpc")}


@pytest.mark.slow  # opt-in: Triton's own QA models, from FERRY_TRITON_SERVER_SOURCE, on live NVIDIA Triton too
def test_triton_qa_models_unmodified_answer_the_same_on_nvidia_triton(triton_qa_repository: Path) -> None:
    _side_by_side(triton_qa_repository, TRITON_QA_CASES)
