"""Model warmup of python models as NVIDIA Triton 2.51 runs it, side by side with Ferry.

Each model below was loaded by Triton 2.51 (CPU, python backend) and by Ferry over HTTP and gRPC (explicit model
control). Ferry is checked against the recorded answers always, and against Triton where it can be had
(``support.triton``): what the model's ``execute`` got (batches of one-element requests, a batch dim on control inputs
too, BYTES zero data as empty strings, a data file's bytes), the statistics after the load (Triton counts warmup
executions: ``inference_count``, ``execution_count``, success and ``batch_stats``, in its metrics too; a decoupled
model's as well), and each
refused load's status, message and index reason (a request check in the core's words, ``Internal: failed to open
text file for read`` for a missing data file, ``failed to run warmup sample '<s>': <error>; `` for a failed run).

Differences kept on purpose (Ferry's clearer behaviour), not compared:

* ``random_data`` of a float input: Triton fills random bytes (NaN and 1e31 reach the model); Ferry draws in [0, 1).
* ``input_data_file`` with ``..``: Triton reads whatever the path leads to; Ferry reads only ``<model>/warmup/``.
* ``batch_size`` above ``max_batch_size``: Triton's load never ends (above 0) or fails each run in the python
  backend's words (``batch size 3 for 'm_0', max allowed is 0``); Ferry refuses the sample before running it.
* a decoupled model sending an error response in warmup: Triton's load never ends; Ferry fails it with the error.
* a warmup run that fails (a model's error response or exception) fails Triton's load as recorded here when the model
  is loaded alone; after other python models loaded, Triton 2.51 stopped answering instead (its ports closed), so
  those two cases are compared with the recorded answers only.
* a short data file: Triton writes ``...provided from smallonly has 4 bytes``; Ferry puts the space back.
* a model's exception keeps no Python traceback (Triton appends ``At:`` and the stub's file paths).
"""

from __future__ import annotations

import json
import re
import struct
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from support.server import ServerThread, make_options, write_model

RECORDING_PY = '''
import json
from pathlib import Path

import triton_python_backend_utils as pb_utils

LOG = Path(__file__).resolve().parents[1] / "executions.log"


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.fail = config.get("parameters", {}).get("FAIL", {}).get("string_value", "")
        self.decoupled = config.get("model_transaction_policy", {}).get("decoupled", False)

    def execute(self, requests):
        batch = []
        for request in requests:
            seen = {}
            for tensor in request.inputs():
                array = tensor.as_numpy()
                values = [v.decode() if isinstance(v, bytes) else float(v) for v in array.flatten()]
                seen[tensor.name()] = [list(array.shape), str(array.dtype), values]
            batch.append(seen)
        with open(LOG, "a") as log:
            log.write(json.dumps(batch) + "\\n")
        if self.fail == "raise":
            raise ValueError("boom in execute")
        if self.decoupled:
            for request in requests:
                sender = request.get_response_sender()
                sender.send(self.response(request))
                sender.send(self.response(request))
                sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            return None
        return [self.response(request) for request in requests]

    def response(self, request):
        if self.fail == "error":
            return pb_utils.InferenceResponse(error=pb_utils.TritonError("error response"))
        data = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
        return pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", data)])
'''

SEQUENCE = ('sequence_batching { max_sequence_idle_microseconds: 5000000 control_input [ { name: "START" '
            'control [ { kind: CONTROL_SEQUENCE_START fp32_false_true: [ 0, 1 ] } ] } ] }')


def _input(kind: str, dims: str = "[ 4 ]", key: str = "INPUT0", datatype: str = "TYPE_FP32") -> str:
    return f'{{ key: "{key}" value {{ data_type: {datatype} dims: {dims} {kind} }} }}'


def _warmup(*samples: tuple[str, int, int, str]) -> str:
    """``model_warmup`` of (name, batch_size, count, inputs) samples."""
    return "model_warmup [ " + ", ".join(
        f'{{ name: "{name}" batch_size: {batch} count: {count} inputs [ {inputs} ] }}'
        for name, batch, count, inputs in samples) + " ]"


def _config(name: str, extra: str, *, max_batch_size: int = 8, datatype: str = "TYPE_FP32", dims: str = "[ 4 ]",
            fail: str = "") -> str:
    parameters = f'parameters {{ key: "FAIL" value {{ string_value: "{fail}" }} }}' if fail else ""
    return (f'name: "{name}"\nbackend: "python"\nmax_batch_size: {max_batch_size}\n'
            f'input [ {{ name: "INPUT0" data_type: {datatype} dims: {dims} }} ]\n'
            f'output [ {{ name: "OUTPUT0" data_type: {datatype} dims: {dims} }} ]\n{parameters}\n{extra}\n')


ZEROS = _input("zero_data: true")
STRING = {"datatype": "TYPE_STRING", "dims": "[ 2 ]"}
#: model -> (config.pbtxt, files beside it); each loads in both servers
LOADED: dict[str, tuple[str, dict[str, bytes]]] = {
    "zeros": (_config("zeros", _warmup(("z", 2, 3, ZEROS))), {}),
    "from_file": (_config("from_file", _warmup(("f", 1, 0, _input('input_data_file: "data"')))),
                  {"warmup/data": np.arange(5, dtype=np.float32).tobytes()}),
    "no_batching": (_config("no_batching", _warmup(("n", 1, 0, ZEROS)), max_batch_size=0), {}),
    "string_zeros": (_config("string_zeros", _warmup(("s", 1, 0, _input("zero_data: true", "[ 2 ]",
                                                                        datatype="TYPE_STRING"))), **STRING), {}),
    "string_file": (_config("string_file", _warmup(("s", 1, 0, _input('input_data_file: "text"', "[ 2 ]",
                                                                      datatype="TYPE_STRING"))), **STRING),
                    {"warmup/text": b"".join(struct.pack("<I", len(s)) + s for s in (b"ab", b"c"))}),
    "samples": (_config("samples", _warmup(("a", 1, 0, ZEROS), ("b", 3, 2, _input("random_data: true")),
                                           ("skipped", 0, 0, ZEROS))), {}),
    "instances": (_config("instances", _warmup(("z", 1, 0, ZEROS)) + " instance_group [ { count: 2 kind: KIND_CPU } ]"),
                  {}),
    "sequence_start": (_config("sequence_start", SEQUENCE + "\n" + _warmup(
        ("z", 1, 0, ZEROS + ", " + _input("zero_data: true", "[ 1 ]", key="START")))), {}),
    "decoupled": (_config("decoupled", "model_transaction_policy { decoupled: true }\n"
                          + _warmup(("z", 2, 2, ZEROS))), {}),
}
#: model -> (config.pbtxt, files beside it); each fails to load in both servers
REFUSED: dict[str, tuple[str, dict[str, bytes]]] = {
    "variable_dims": (_config("variable_dims", _warmup(("v", 1, 0, _input("zero_data: true", "[ -1 ]"))),
                              dims="[ -1 ]"), {}),
    "wrong_dims": (_config("wrong_dims", _warmup(("w", 1, 0, _input("zero_data: true", "[ 3 ]")))), {}),
    "wrong_type": (_config("wrong_type", _warmup(("t", 1, 0, _input("zero_data: true", datatype="TYPE_INT32")))), {}),
    "no_inputs": (_config("no_inputs", 'model_warmup [ { name: "e" batch_size: 1 } ]'), {}),
    "missing_file": (_config("missing_file", _warmup(("m", 1, 0, _input('input_data_file: "missing"')))), {}),
    "short_file": (_config("short_file", _warmup(("m", 1, 0, _input('input_data_file: "small"')))),
                   {"warmup/small": b"\0" * 4}),
    "no_data_kind": (_config("no_data_kind", _warmup(("k", 1, 0, _input("")))), {}),
    "error_response": (_config("error_response", _warmup(("z", 1, 0, ZEROS)), fail="error"), {}),
    "raises": (_config("raises", _warmup(("z", 2, 0, ZEROS)), fail="raise"), {}),
}

#: refused by Triton 2.51 as recorded below when loaded alone, but a failed warmup run after other python models
#: loaded made Triton stop answering (its ports closed)
UNSTABLE_IN_TRITON = ("error_response", "raises")

#: what Triton 2.51 answered (recorded; paths as ``<model>``)
EXPECTED_REFUSALS = {
    "variable_dims": "Invalid argument: warmup setting expects all variable-size dimensions are specified for input "
                     "'INPUT0'",
    "wrong_dims": "Invalid argument: [request id: <id_unknown>] unexpected shape for input 'INPUT0' for model "
                  "'wrong_dims'. Expected [-1,4], got [1,3]. NOTE: Setting a non-zero max_batch_size",
    "wrong_type": "Invalid argument: [request id: <id_unknown>] inference input 'INPUT0' data-type is 'INT32', but "
                  "model 'wrong_type' expects 'FP32'",
    "no_inputs": "Invalid argument: [request id: <id_unknown>] expected 1 inputs but got 0 inputs for model "
                 "'no_inputs'. Got input(s) [], but missing required input(s) ['INPUT0']. Please provide all required "
                 "input(s).",
    "missing_file": "Internal: failed to open text file for read <model>/warmup/missing: No such file or directory",
    "short_file": "Invalid argument: [request id: <id_unknown>] warmup setting expects 16 bytes, but the data provided "
                  "from small only has 4 bytes",
    "no_data_kind": "Invalid argument: [request id: <id_unknown>] warmup setting expects input 'INPUT0' to have "
                    "input_data_type set",
    "error_response": "Invalid argument: failed to run warmup sample 'z': error response; ",
    "raises": "Invalid argument: failed to run warmup sample 'z': Failed to process the request(s) for model "
              "'raises_0', message: ValueError: boom in execute; Failed to process the request(s) for model "
              "'raises_0', message: ValueError: boom in execute; ",
}


def _repository(path: Path) -> Path:
    for name, (config, files) in {**LOADED, **REFUSED}.items():
        write_model(path, name, config, files={"1/model.py": RECORDING_PY, **files})
    return path


def _normalized(message: str, repository: Path) -> str:
    message = re.sub(r"\n\nAt:\n(  .*\n)*", "", message)  # Triton's python traceback
    message = message.replace("smallonly", "small only")  # Triton's missing space (module docstring)
    return re.sub(re.escape(str(repository)) + r"/\w+", "<model>", message)


def _executions(model_dir: Path) -> list[Any]:
    log = model_dir / "executions.log"
    batches = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    for batch in batches:
        for request in batch:
            for name, (shape, dtype, values) in request.items():
                if name == "INPUT0" and dtype == "float32" and any(v not in (0.0, 1.0, 2.0, 3.0) for v in values):
                    request[name] = [shape, dtype, "random"]
    return batches


def _answers(http_port: int, grpc_port: int, metrics_port: int, repository: Path,
             skip: tuple[str, ...] = ()) -> dict[str, Any]:
    """Load every model but ``skip`` (HTTP; the refused ones over gRPC too): what each load answered, the statistics
    after it, the model's executions and its index row; the metrics of the first one."""
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    base = f"http://127.0.0.1:{http_port}/v2"
    grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}")
    answers: dict[str, Any] = {}
    for name in LOADED:
        response = httpx.post(f"{base}/repository/models/{name}/load", timeout=120)
        if response.status_code != 200:
            answers[name] = (response.status_code, response.text)
            continue
        stats = httpx.get(f"{base}/models/{name}/stats", timeout=60).json()["model_stats"][0]
        answers[name] = (response.status_code, stats["inference_count"], stats["execution_count"],
                         stats["inference_stats"]["success"]["count"], stats["inference_stats"]["fail"]["count"],
                         [(b["batch_size"], b["compute_infer"]["count"]) for b in stats["batch_stats"]],
                         stats["response_stats"], _executions(repository / name))
    for name in REFUSED:
        if name in skip:
            continue
        response = httpx.post(f"{base}/repository/models/{name}/load", timeout=120)
        try:
            grpc.load_model(name)
            over_grpc: tuple[str, str] = ("OK", "")
        except InferenceServerException as exc:
            over_grpc = (str(exc.status()), _normalized(exc.message(), repository))
        rows = [row for row in httpx.post(f"{base}/repository/index", timeout=60).json() if row["name"] == name]
        error = response.json().get("error", "") if response.content else ""  # a load that succeeded: no body
        answers[name] = (response.status_code, _normalized(error, repository), over_grpc,
                         [(row.get("state"), _normalized(row.get("reason", ""), repository)) for row in rows],
                         httpx.get(f"{base}/models/{name}/ready", timeout=60).status_code)
    grpc.close()
    metrics = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=60).text
    answers["metrics"] = sorted(line for line in metrics.splitlines() if 'model="zeros"' in line and re.match(
        r"nv_inference_(count|exec_count|request_success|request_failure)\{", line))
    return answers


@pytest.fixture(scope="module")
def ferry_answers(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    repository = _repository(tmp_path_factory.mktemp("ferry"))
    thread = ServerThread(make_options([repository], model_control_mode="explicit"))
    handle = thread.start()
    try:
        return _answers(handle.server.http_port, handle.server.grpc_port, handle.server.metrics_port, repository)
    finally:
        thread.stop()


def test_warmup_executions_are_charged_and_shaped_as_tritons(ferry_answers: dict[str, Any]) -> None:
    """Ferry charged no warmup to the statistics, ran a sample's control input without its batch dim, refused a
    control input's type (``fp32_false_true`` has no ``data_type``) and failed a decoupled model's warmup."""
    zero4 = [[1, 4], "float32", [0.0] * 4]
    assert ferry_answers["zeros"] == (200, 6, 3, 6, 0, [(2, 3)], {}, [[{"INPUT0": zero4}] * 2] * 3)
    assert ferry_answers["samples"][1:6] == (7, 3, 7, 0, [(1, 1), (3, 2)])
    assert ferry_answers["instances"][1:3] == (2, 2)
    assert ferry_answers["no_batching"][-1] == [[{"INPUT0": [[4], "float32", [0.0] * 4]}]]
    assert ferry_answers["string_zeros"][-1] == [[{"INPUT0": [[1, 2], "object", ["", ""]]}]]
    assert ferry_answers["string_file"][-1] == [[{"INPUT0": [[1, 2], "object", ["ab", "c"]]}]]
    assert ferry_answers["from_file"][-1] == [[{"INPUT0": [[1, 4], "float32", [0.0, 1.0, 2.0, 3.0]]}]]
    assert ferry_answers["sequence_start"][:3] == (200, 1, 1)
    assert ferry_answers["sequence_start"][-1] == [[{"INPUT0": zero4, "START": [[1, 1], "float32", [0.0]]}]]
    assert ferry_answers["decoupled"][:7] == (200, 4, 2, 4, 0, [(2, 2)], {})
    counted = {line.split("{")[0]: line.rsplit(" ", 1)[1] for line in ferry_answers["metrics"] if "failure" not in line}
    assert counted == {"nv_inference_count": "6", "nv_inference_exec_count": "3", "nv_inference_request_success": "6"}


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_refused_warmups_answer_tritons_words(ferry_answers: dict[str, Any], name: str) -> None:
    """Each refusal's status and message over HTTP and gRPC, and the version's index reason, as Triton's (Ferry ran
    a sample with a wrong shape or no inputs, and worded the others its own way)."""
    status, message, over_grpc, rows, ready = ferry_answers[name]
    expected = EXPECTED_REFUSALS[name]
    assert status == 400 and ready == 400
    assert message.startswith(f"load failed for model '{name}': version 1 is at UNAVAILABLE state: {expected}")
    assert message.endswith(";\n")
    assert over_grpc[0] == "StatusCode.INVALID_ARGUMENT" and over_grpc[1] == message
    assert len(rows) == 1 and rows[0][0] == "UNAVAILABLE" and rows[0][1].startswith(expected)


@pytest.mark.slow  # live NVIDIA Triton: Ferry's half runs by default against the same expected answers
def test_warmup_answers_match_nvidia_tritons(ferry_answers: dict[str, Any], tmp_path: Path) -> None:
    """Every answer above side by side with Triton 2.51's."""
    from support.triton import running_triton, triton_or_skip

    triton_or_skip()
    repository = _repository(tmp_path / "triton")
    from support.perf_analyzer import tools_dir

    with running_triton(repository, []) as (http, grpc, metrics):
        served = tools_dir() / "triton-repositories" / repository.resolve().as_posix().strip("/").replace("/", "_")
        expected = _answers(http, grpc, metrics, served, skip=UNSTABLE_IN_TRITON)
    assert {k: v for k, v in ferry_answers.items() if k not in UNSTABLE_IN_TRITON} == expected
