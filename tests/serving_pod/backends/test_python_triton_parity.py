"""Python backend APIs that a model sees worded as NVIDIA Triton 2.51 words them.

A differential hunt ran the same ``model.py`` files on Triton 2.51 and on Ferry; these cases are the
differences fixed: the JSON of ``request.parameters()`` (compact), BLS requests refused before the
called model runs (``Model <name> - Error when running inference: ...``, code INTERNAL) and a decoupled
``execute`` that returns a value (the instance's name, no exception type). Served over HTTP and gRPC
(the streaming RPC for the decoupled model) against Triton's answers recorded in ``EXPECTED`` and ``RETURNED``; a live
Triton gives the same under ``-m slow``.
"""

from __future__ import annotations

import queue
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from support.server import write_model

def _config(name: str, input_: str, output: str, output_type: str = "TYPE_STRING", extra: str = "") -> str:
    """config.pbtxt of a python model with one INT32[1] input and one [1] output (no batching)."""
    return (f'name: "{name}"\nbackend: "python"\nmax_batch_size: 0\n{extra}'
            f'input [ {{ name: "{input_}" data_type: TYPE_INT32 dims: [ 1 ] }} ]\n'
            f'output [ {{ name: "{output}" data_type: {output_type} dims: [ 1 ] }} ]\n')


ECHO_CONFIG = _config("echo", "MODE", "TEXT")

# mode 0: the request's parameters; 1..3: a BLS request refused before the called model runs
ECHO_MODEL = '''
import numpy as np
import triton_python_backend_utils as pb_utils


def bls(model, name="MODE"):
    request = pb_utils.InferenceRequest(model_name=model, requested_output_names=["TEXT"],
                                        inputs=[pb_utils.Tensor(name, np.array([0], np.int32))])
    error = request.exec().error()
    return f"{error.code() == pb_utils.TritonError.INTERNAL}|{error.message()}"


class TritonPythonModel:
    def execute(self, requests):
        answers = []
        for request in requests:
            mode = int(pb_utils.get_input_tensor_by_name(request, "MODE").as_numpy()[0])
            text = [request.parameters, lambda: bls("missing"), lambda: bls("echo", "WRONG"),
                    lambda: bls("dec")][mode]()
            answers.append(pb_utils.InferenceResponse(
                [pb_utils.Tensor("TEXT", np.array([text.encode()], dtype=np.object_))]))
        return answers
'''

DEC_CONFIG = _config("dec", "MODE", "TEXT", extra="model_transaction_policy { decoupled: true }\n")

DEC_MODEL = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("TEXT", np.array([b"x"], dtype=np.object_))])]
'''

_PREFIX = "True|Model {0} - Error when running inference: "
#: Triton 2.51's texts from ``echo`` (and ``RETURNED``: its stream error from ``dec``), recorded from a live Triton;
#: the slow ``test_the_same_models_answer_the_same_on_nvidia_triton`` compares a live one with them
EXPECTED = [
    '{"pk":"pv"}',
    _PREFIX.format("missing") + "Failed for execute the inference request. Model 'missing' is not ready.",
    _PREFIX.format("echo") + "unexpected inference input 'WRONG' for model 'echo'",
    _PREFIX.format("dec") + "Model dec is using the decoupled. The current BLS request call doesn't support "
    "models using the decoupled transaction policy. Please use 'decoupled=True' argument to the 'exec' or "
    "'async_exec' calls for decoupled models.'",
]
RETURNED = ("Failed to process the request(s) for model 'dec_0', message: Python model 'dec_0' is using the "
            "decoupled mode and the execute function must return None.")


ISOLATED = 'parameters { key: "FERRY_ISOLATED" value { string_value: "true" } }\n'


def _repository(root: Path, extra: str = "") -> Path:
    write_model(root, "echo", ECHO_CONFIG + extra, {"1/model.py": ECHO_MODEL})
    write_model(root, "dec", DEC_CONFIG + extra, {"1/model.py": DEC_MODEL})
    return root


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _repository(tmp_path_factory.mktemp("parity"))


@pytest.fixture(scope="module")
def isolated_repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same models, each instance in its own process (BLS calls cross to the server's engine)."""
    return _repository(tmp_path_factory.mktemp("parity_isolated"), ISOLATED)


def _texts(client: Any, module: Any) -> list[str]:
    texts = []
    for mode in range(len(EXPECTED)):
        tensor = module.InferInput("MODE", [1], "INT32")
        tensor.set_data_from_numpy(np.array([mode], np.int32))
        result = client.infer("echo", [tensor], parameters={"pk": "pv"})
        texts.append(result.as_numpy("TEXT")[0].decode())
    return texts


def _stream_error(grpc_url: str) -> str:
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(grpc_url)
    answers: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        tensor = grpcclient.InferInput("MODE", [1], "INT32")
        tensor.set_data_from_numpy(np.array([0], np.int32))
        client.async_stream_infer("dec", [tensor])
        result, error = answers.get(timeout=30)
    finally:
        client.stop_stream()
    assert result is None
    return error.message()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_parameters_and_bls_refusals_are_worded_as_in_triton(threaded_server: Any, repository: Path,
                                                              protocol: str) -> None:
    server = threaded_server([repository])
    assert _texts(server.client(protocol), server.module(protocol)) == EXPECTED


def test_isolated_instances_word_them_the_same(threaded_server: Any, isolated_repository: Path) -> None:
    server = threaded_server([isolated_repository])
    assert _texts(server.client("grpc"), server.module("grpc")) == EXPECTED
    assert _stream_error(server.grpc_url) == RETURNED


def test_a_decoupled_execute_returning_a_value_is_worded_as_in_triton(threaded_server: Any,
                                                                      repository: Path) -> None:
    server = threaded_server([repository])
    assert _stream_error(server.grpc_url) == RETURNED
    assert _texts(server.client("grpc"), server.module("grpc"))[0] == EXPECTED[0]  # the server goes on


def _answers(http_url: str, grpc_url: str) -> list[Any]:
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

    return [_texts(httpclient.InferenceServerClient(http_url, network_timeout=60.0), httpclient),
            _texts(grpcclient.InferenceServerClient(grpc_url), grpcclient), _stream_error(grpc_url)]


@pytest.mark.slow  # live NVIDIA Triton: Ferry's half runs by default against the same expected answers
def test_the_same_models_answer_the_same_on_nvidia_triton(threaded_server: Any, repository: Path) -> None:
    """Side by side with Triton 2.51 (skipped where it cannot be had): the same answers, and the ones above."""
    from support.triton import running_triton

    with running_triton(repository, ["echo", "dec"]) as (http, grpc, _):
        triton = _answers(f"127.0.0.1:{http}", f"127.0.0.1:{grpc}")
    server = threaded_server([repository])
    assert _answers(server.http_url, server.grpc_url) == triton == [EXPECTED, EXPECTED, RETURNED]


CODE_CONFIG = _config("code", "CODE", "OUT", output_type="TYPE_INT32")

CODE_MODEL = '''
import triton_python_backend_utils as pb_utils


# Triton's TritonError takes a member of its code enum, never a bare number
CODES = [pb_utils.TritonError.UNKNOWN, pb_utils.TritonError.INTERNAL, pb_utils.TritonError.NOT_FOUND,
         pb_utils.TritonError.INVALID_ARG, pb_utils.TritonError.UNAVAILABLE, pb_utils.TritonError.UNSUPPORTED,
         pb_utils.TritonError.ALREADY_EXISTS, pb_utils.TritonError.CANCELLED]


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse(error=pb_utils.TritonError(
            "failed with a code", CODES[int(pb_utils.get_input_tensor_by_name(r, "CODE").as_numpy()[0])]))
            for r in requests]
'''

#: pb_utils.TritonError code -> (tritonserver's HTTP status, its gRPC code): HttpCodeFromError answers 400 for
#: UNKNOWN, ALREADY_EXISTS and CANCELLED
TRITON_STATUS = {"UNKNOWN": (400, "UNKNOWN"), "INTERNAL": (500, "INTERNAL"), "NOT_FOUND": (404, "NOT_FOUND"),
                 "INVALID_ARG": (400, "INVALID_ARGUMENT"), "UNAVAILABLE": (503, "UNAVAILABLE"),
                 "UNSUPPORTED": (501, "UNIMPLEMENTED"), "ALREADY_EXISTS": (400, "ALREADY_EXISTS"),
                 "CANCELLED": (400, "CANCELLED")}


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_each_triton_error_code_reaches_the_client_with_tritons_status(threaded_server: Any, tmp_path: Path,
                                                                       protocol: str) -> None:
    import httpx
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    from serving_pod.backends import pb_utils

    write_model(tmp_path, "code", CODE_CONFIG, {"1/model.py": CODE_MODEL})
    server = threaded_server([tmp_path])
    for name, (status, grpc_code) in TRITON_STATUS.items():
        code = getattr(pb_utils.TritonError, name)
        if protocol == "http":
            body = {"inputs": [{"name": "CODE", "datatype": "INT32", "shape": [1], "data": [code]}]}
            answer = httpx.post(f"http://{server.http_url}/v2/models/code/infer", json=body, timeout=30)
            assert (answer.status_code, answer.json()) == (status, {"error": "failed with a code"}), name
        else:
            tensor = grpcclient.InferInput("CODE", [1], "INT32")
            tensor.set_data_from_numpy(np.array([code], np.int32))
            with pytest.raises(InferenceServerException) as raised:
                server.client("grpc").infer("code", [tensor])
            assert raised.value.status() == f"StatusCode.{grpc_code}" and "failed with a code" in str(raised.value), name


BLS_CODE_CONFIG = _config("bls_code", "CODE", "SEEN")

#: ``code`` as Triton loads it: its stub binds ``pb_utils.TritonError`` only after ``model.py`` is imported, so the
#: codes are looked up in ``execute`` (CODE_MODEL's module-level list fails Triton's load with an AttributeError)
CALLED_CODE_MODEL = '''
import triton_python_backend_utils as pb_utils

NAMES = ["UNKNOWN", "INTERNAL", "NOT_FOUND", "INVALID_ARG", "UNAVAILABLE", "UNSUPPORTED", "ALREADY_EXISTS", "CANCELLED"]


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse(error=pb_utils.TritonError("failed with a code", getattr(
            pb_utils.TritonError, NAMES[int(pb_utils.get_input_tensor_by_name(r, "CODE").as_numpy()[0])])))
            for r in requests]
'''

BLS_CODE_MODEL = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for r in requests:
            called = pb_utils.InferenceRequest(model_name="code", inputs=[pb_utils.get_input_tensor_by_name(r, "CODE")],
                                               requested_output_names=["OUT"]).exec()
            seen = "%s %s %s" % (called.has_error(), called.error().code().name, called.error().message())
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("SEEN", np.array([seen.encode()], np.object_))]))
        return responses
'''


def _bls_codes(http: str) -> dict[str, str]:
    """What ``bls_code`` saw of ``code``'s error response, for each code ``code`` answered with."""
    import httpx

    from serving_pod.backends import pb_utils

    seen = {}
    for name in TRITON_STATUS:
        body = {"inputs": [{"name": "CODE", "datatype": "INT32", "shape": [1], "data": [getattr(pb_utils.TritonError,
                                                                                               name)]}]}
        answer = httpx.post(f"http://{http}/v2/models/bls_code/infer", json=body, timeout=30)
        assert answer.status_code == 200, answer.text
        seen[name] = answer.json()["outputs"][0]["data"][0]
    return seen


#: Triton 2.51 (recorded live): a BLS caller reads INTERNAL whatever code the called model's error response had
TRITON_BLS_CODES = dict.fromkeys(TRITON_STATUS, "True INTERNAL failed with a code")


def test_a_bls_error_response_keeps_the_code_the_called_model_gave(threaded_server: Any, tmp_path: Path) -> None:
    """Kept different on purpose: Triton 2.51 hands a BLS caller the called model's error message with code
    INTERNAL every time (``TRITON_BLS_CODES``: the code does not cross its stub), though the same error reaches a
    client with its own status (the test above). Ferry keeps the code the model gave, which a caller can act on; a
    model written for Triton reads the same ``has_error()`` and ``message()``."""
    write_model(tmp_path, "code", CODE_CONFIG, {"1/model.py": CALLED_CODE_MODEL})
    write_model(tmp_path, "bls_code", BLS_CODE_CONFIG, {"1/model.py": BLS_CODE_MODEL})
    server = threaded_server([tmp_path])
    assert _bls_codes(server.http_url) == {name: f"True {name} failed with a code" for name in TRITON_STATUS}


@pytest.mark.slow  # live NVIDIA Triton: the record the Ferry-only test above departs from
def test_tritons_bls_caller_reads_internal_for_every_code(tmp_path: Path) -> None:
    from support.triton import running_triton

    write_model(tmp_path, "code", CODE_CONFIG, {"1/model.py": CALLED_CODE_MODEL})
    write_model(tmp_path, "bls_code", BLS_CODE_CONFIG, {"1/model.py": BLS_CODE_MODEL})
    with running_triton(tmp_path, ["code", "bls_code"]) as (http, _, _):
        assert _bls_codes(f"127.0.0.1:{http}") == TRITON_BLS_CODES


_UNDECLARED = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([7], np.int32))]) for _ in requests]
'''


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_config_without_outputs_answers_none_of_the_models_outputs(threaded_server: Any, tmp_path: Path,
                                                                     protocol: str) -> None:
    """Triton 2.51 (recorded live, HTTP and gRPC): a request naming no outputs asks for the config's, so a python model
    whose config declares none answers no output (HTTP ``"outputs": []``), whatever it returns; Ferry passed every
    output the model returned. Naming one is refused ('unexpected inference output')."""
    from tritonclient.utils import InferenceServerException

    write_model(tmp_path, "nooutputs", 'name: "nooutputs"\nbackend: "python"\nmax_batch_size: 0\n',
                {"1/model.py": _UNDECLARED})
    server = threaded_server([tmp_path])
    client, module = server.client(protocol), server.module(protocol)
    result = client.infer("nooutputs", [])
    assert result.as_numpy("OUT") is None
    with pytest.raises(InferenceServerException, match="unexpected inference output 'OUT' for model 'nooutputs'"):
        client.infer("nooutputs", [], outputs=[module.InferRequestedOutput("OUT")])
