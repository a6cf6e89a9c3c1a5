"""A decoupled model's last response: an empty response sent with the final flag vs the final flag alone.

Side by side with tritonserver 2.51 (skipped where it cannot be had). A python model may end its stream with a
real response that has no outputs (``sender.send(pb_utils.InferenceResponse(output_tensors=[]),
flags=TRITONSERVER_RESPONSE_COMPLETE_FINAL)``) or with the final flag alone (``sender.send(flags=...)``).
Triton treats the first as a response: gRPC streaming sends it (``triton_final_response`` true, the model's
version) whether or not the client set ``triton_enable_empty_final_response``, HTTP ``generate_stream`` sends it
as an event, and ``generate`` counts it (a data response before it makes two: 'exactly 1 response'). The flag
alone only ends the stream: gRPC sends an empty response for it (the version as the client named it) only when
the client set ``triton_enable_empty_final_response``; the generate endpoints send nothing for it. In an
ensemble, a step's response with no outputs is a flow whose tensors are all missing: as the last step's, it
becomes an ensemble response with no outputs (and without the ``sequence_*`` parameters Triton sets with each
output); before another step, that step runs without the input (here ``post`` refuses, failing the ensemble).

Cases: ``last_empty`` sends one response per element of ``IN`` then the empty final response, ``last_flag``
the same then the final flag alone, ``mid_empty`` an empty response without the flag then the flag alone,
``iso_empty`` is ``last_empty`` in a child process (``FERRY_ISOLATED``, which Triton ignores); each runs with a
data element and with none, directly and through ensembles (``via_empty``, ``via_flag``: one step;
``pipe_empty``: ``last_empty`` then ``post``), and a BLS caller (``bls_*``) reports the responses its
decoupled ``exec`` iterator gives (10 per output, 1 per error): one empty response at the end either way.
Statistics (counts, successes, failures) are compared after.
"""

from __future__ import annotations

import queue

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from support.server import write_model

#: one response per element of IN, then the stream's end as the config's ``last`` says: an empty response with
#: the final flag ("empty"), the final flag alone ("flag"), an empty response then the flag alone ("mid")
LAST_PY = '''
import json
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.last = json.loads(args["model_config"])["parameters"]["last"]["string_value"]

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            for value in pb_utils.get_input_tensor_by_name(request, "IN").as_numpy().flat:
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([value], dtype=np.int32))]))
            final = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
            if self.last == "empty":
                sender.send(pb_utils.InferenceResponse(output_tensors=[]), flags=final)
            elif self.last == "mid":
                sender.send(pb_utils.InferenceResponse(output_tensors=[]))
                sender.send(flags=final)
            else:
                sender.send(flags=final)
        return None
'''

#: models whose answers are compared over gRPC streaming and the generate endpoints
STREAMED = ("last_empty", "last_flag", "via_empty", "via_flag", "mid_empty", "iso_empty", "pipe_empty")
BLS = ("bls_empty", "bls_flag", "bls_mid")
MODELS = (*STREAMED, "post", *BLS)

#: INPUT0 x 10; refuses a request without INPUT0 (optional, so that Triton's ensemble may send one)
POST_PY = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0")
            if x is None:
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError("no INPUT0")))
                continue
            responses.append(pb_utils.InferenceResponse(
                [pb_utils.Tensor("OUTPUT0", (x.as_numpy() * 10).astype(np.int32))]))
        return responses
'''

POST = """
name: "post"
backend: "python"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 1 ] optional: true } ]
output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 1 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
"""

#: streams IN to the config's ``target`` through BLS; OUT: per response of the iterator, 10 per output + 1 if error
BLS_PY = '''
import json
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.target = json.loads(args["model_config"])["parameters"]["target"]["string_value"]

    def execute(self, requests):
        responses = []
        for request in requests:
            tensor = pb_utils.get_input_tensor_by_name(request, "IN")
            call = pb_utils.InferenceRequest(model_name=self.target, requested_output_names=["OUT"],
                                             inputs=[pb_utils.Tensor("IN", tensor.as_numpy())])
            seen = [len(r.output_tensors()) * 10 + int(r.has_error()) for r in call.exec(decoupled=True)]
            responses.append(pb_utils.InferenceResponse(
                [pb_utils.Tensor("OUT", np.array(seen or [-1], dtype=np.int32))]))
        return responses
'''


def _decoupled(name: str, last: str) -> str:
    return f"""
name: "{name}"
backend: "python"
max_batch_size: 0
model_transaction_policy {{ decoupled: true }}
input [ {{ name: "IN" data_type: TYPE_INT32 dims: [ -1 ] }} ]
output [ {{ name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
parameters {{ key: "last" value: {{ string_value: "{last}" }} }}
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
"""


def _ensemble(name: str, step: str) -> str:
    return f"""
name: "{name}"
platform: "ensemble"
max_batch_size: 0
input [ {{ name: "IN" data_type: TYPE_INT32 dims: [ -1 ] }} ]
output [ {{ name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
ensemble_scheduling {{ step [
  {{ model_name: "{step}" model_version: -1 input_map {{ key: "IN" value: "IN" }}
    output_map {{ key: "OUT" value: "OUT" }} }}
] }}
"""


@pytest.fixture(scope="module")
def repository(tmp_path_factory):
    repository = tmp_path_factory.mktemp("decoupled_final")
    write_model(repository, "last_empty", _decoupled("last_empty", "empty"), {"1/model.py": LAST_PY})
    write_model(repository, "last_flag", _decoupled("last_flag", "flag"), {"1/model.py": LAST_PY})
    write_model(repository, "via_empty", _ensemble("via_empty", "last_empty"))
    write_model(repository, "via_flag", _ensemble("via_flag", "last_flag"))
    write_model(repository, "mid_empty", _decoupled("mid_empty", "mid"), {"1/model.py": LAST_PY})
    isolated = _decoupled("iso_empty", "empty").replace(
        "instance_group", 'parameters { key: "FERRY_ISOLATED" value: { string_value: "true" } }\ninstance_group')
    write_model(repository, "iso_empty", isolated, {"1/model.py": LAST_PY})
    write_model(repository, "post", POST, {"1/model.py": POST_PY})
    write_model(repository, "pipe_empty", _ensemble("pipe_empty", "last_empty").replace(
        'value: "OUT" } }', 'value: "one" } },\n  { model_name: "post" model_version: -1 input_map { key: "INPUT0" '
        'value: "one" } output_map { key: "OUTPUT0" value: "OUT" } }'))
    for name, target in (("bls_empty", "last_empty"), ("bls_flag", "last_flag"), ("bls_mid", "mid_empty")):
        write_model(repository, name, f"""
name: "{name}"
backend: "python"
max_batch_size: 0
input [ {{ name: "IN" data_type: TYPE_INT32 dims: [ -1 ] }} ]
output [ {{ name: "OUT" data_type: TYPE_INT32 dims: [ -1 ] }} ]
parameters {{ key: "target" value: {{ string_value: "{target}" }} }}
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
""", {"1/model.py": BLS_PY})
    return repository


def _parameters(message) -> dict[str, object]:
    return {key: getattr(value, value.WhichOneof("parameter_choice")) for key, value in message.parameters.items()}


def _stream(grpc_url: str, model: str, values: list[int], empty_final: bool) -> list[object]:
    """A stream request's responses as (version, id, outputs, parameters), or 'no more' when none came for a
    while without the final flag."""
    answers: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(grpc_url)
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    tensor = grpcclient.InferInput("IN", [len(values)], "INT32")
    tensor.set_data_from_numpy(np.array(values, dtype=np.int32))
    client.async_stream_infer(model, [tensor], request_id="r1", enable_empty_final_response=empty_final)
    got: list[object] = []
    try:
        while True:
            try:
                result, error = answers.get(timeout=30 if empty_final else 3)
            except queue.Empty:
                got.append("no more")
                break
            if error is not None:
                got.append(("error", str(error)))
                break
            response = result.get_response()
            outputs = {tensor.name: result.as_numpy(tensor.name).tolist() for tensor in response.outputs}
            parameters = _parameters(response)
            got.append((response.model_name, response.model_version, response.id, outputs, parameters))
            if parameters.get("triton_final_response"):
                break
    finally:
        client.stop_stream()
        client.close()
    return got


def _answers(http_port: int, grpc_port: int) -> dict[str, object]:
    base = f"http://127.0.0.1:{http_port}"
    grpc_url = f"127.0.0.1:{grpc_port}"
    answers: dict[str, object] = {}
    for model in STREAMED:
        for values in ([7], []):
            for empty_final in (True, False):
                answers[f"grpc {model} {values} {empty_final}"] = _stream(grpc_url, model, values, empty_final)
            for route in ("generate_stream", "generate"):
                generated = httpx.post(f"{base}/v2/models/{model}/{route}", json={"IN": values}, timeout=60)
                answers[f"{route} {model} {values}"] = (generated.status_code, generated.text)
    for model in BLS:
        for values in ([7], []):
            generated = httpx.post(f"{base}/v2/models/{model}/generate", json={"IN": values}, timeout=60)
            answers[f"bls {model} {values}"] = (generated.status_code, generated.json().get("OUT"))
    for model in (*STREAMED, "post"):
        entry = httpx.get(f"{base}/v2/models/{model}/stats", timeout=60).json()["model_stats"][0]
        stats = entry["inference_stats"]
        answers[f"stats {model}"] = (entry["inference_count"], entry["execution_count"], stats["success"]["count"],
                                     stats["fail"]["count"], entry.get("response_stats"))
    return answers


ONE = ("generate expects model to produce exactly 1 response, use generate stream for model that generates "
       "various number of responses")
SEQUENCE = {"sequence_end": False, "sequence_id": 0, "sequence_start": False}


def _data(model: str, out: int, ensemble: bool) -> tuple[tuple[object, ...], str]:
    """A data response as ``_stream`` and generate give it."""
    parameters = {**SEQUENCE, "triton_final_response": False} if ensemble else {"triton_final_response": False}
    tail = ',"sequence_end":false,"sequence_id":0,"sequence_start":false}' if ensemble else "}"
    text = f'{{"OUT":{out},"model_name":"{model}","model_version":"1"' + tail
    return (model, "1", "r1", {"OUT": [out]}, parameters), text


def _expected() -> dict[str, object]:
    """Triton 2.51's answers (``_answers``' keys)."""
    expected: dict[str, object] = {}
    for model in ("last_empty", "last_flag", "via_empty", "via_flag", "mid_empty", "iso_empty"):
        data, data_json = _data(model, 7, model.startswith("via"))
        empty = (model, "1", "r1", {}, {"triton_final_response": True})
        empty_json = f'{{"model_name":"{model}","model_version":"1"}}'
        flag_only = (model, "", "r1", {}, {"triton_final_response": True})  # the version as the client named it
        if model == "mid_empty":  # an empty response, then the flag alone
            before = (model, "1", "r1", {}, {"triton_final_response": False})
            expected[f"grpc {model} [7] True"] = [data, before, flag_only]
            expected[f"grpc {model} [7] False"] = [data, before, "no more"]
            expected[f"grpc {model} [] True"] = [before, flag_only]
            expected[f"grpc {model} [] False"] = [before, "no more"]
        if model.endswith("empty"):  # a response: sent whatever the client asked, counted by generate
            if model != "mid_empty":
                for flag in (True, False):
                    expected[f"grpc {model} [7] {flag}"] = [data, empty]
                    expected[f"grpc {model} [] {flag}"] = [empty]
            expected[f"generate_stream {model} [7]"] = (200, f"data: {data_json}\n\ndata: {empty_json}\n\n")
            expected[f"generate_stream {model} []"] = (200, f"data: {empty_json}\n\n")
            expected[f"generate {model} [7]"] = (200, f'{{"error":"{ONE}"}}')
            expected[f"generate {model} []"] = (200, empty_json)
        else:  # the flag alone: sent on request only
            expected[f"grpc {model} [7] True"] = [data, flag_only]
            expected[f"grpc {model} [7] False"] = [data, "no more"]
            expected[f"grpc {model} [] True"] = [flag_only]
            expected[f"grpc {model} [] False"] = ["no more"]
            expected[f"generate_stream {model} [7]"] = (200, f"data: {data_json}\n\n")
            expected[f"generate_stream {model} []"] = (200, "")
            expected[f"generate {model} [7]"] = (200, data_json)
            expected[f"generate {model} []"] = (200, f'{{"error":"{ONE}"}}')
    # pipe_empty: the empty final response of its first step runs ``post`` without INPUT0, which refuses it
    data, data_json = _data("pipe_empty", 70, True)
    refused = "in ensemble 'pipe_empty', no INPUT0"
    for flag in (True, False):
        expected[f"grpc pipe_empty [7] {flag}"] = [data, ("error", refused)]
        expected[f"grpc pipe_empty [] {flag}"] = [("error", refused)]
    expected["generate_stream pipe_empty [7]"] = (200, f'data: {data_json}\n\ndata: {{"error":"{refused}"}}\n\n')
    expected["generate_stream pipe_empty []"] = (400, f'data: {{"error":"{refused}"}}\n\n')
    expected["generate pipe_empty [7]"] = (200, f'{{"error":"{ONE}"}}')
    expected["generate pipe_empty []"] = (400, f'{{"error":"{refused}"}}')
    # BLS: the iterator ends with one empty response whichever way the stream ended
    expected.update({
        "bls bls_empty [7]": (200, [10, 0]), "bls bls_empty []": (200, 0),
        "bls bls_flag [7]": (200, [10, 0]), "bls bls_flag []": (200, 0),
        "bls bls_mid [7]": (200, [10, 0, 0]), "bls bls_mid []": (200, [0, 0]),
    })
    # (inference, execution, success, fail, response_stats): 8 requests on each streamed model (4 gRPC, 4 generate),
    # one success each whichever way its stream ended, plus the steps' runs (``last_empty``: 8 through ``via_empty``,
    # 8 through ``pipe_empty``, 2 through BLS; ``post`` once per flow, refusing or not); a failed ensemble request
    # counts two failures; no per-response statistics from the python backend
    expected.update({
        "stats last_empty": (26, 26, 26, 0, {}), "stats last_flag": (18, 18, 18, 0, {}),
        "stats via_empty": (8, 8, 8, 0, {}), "stats via_flag": (8, 8, 8, 0, {}),
        "stats mid_empty": (10, 10, 10, 0, {}), "stats iso_empty": (8, 8, 8, 0, {}),
        "stats pipe_empty": (0, 0, 0, 16, {}), "stats post": (12, 12, 12, 0, {}),
    })
    return expected


EXPECTED = _expected()


def _differing(got: dict[str, object]) -> dict[str, object]:
    return {key: (got.get(key), value) for key, value in EXPECTED.items() if got.get(key) != value}


def test_empty_final_response_is_a_response(threaded_server, repository) -> None:
    server = threaded_server([repository], model_control_mode="explicit", load_models=MODELS)
    got = _answers(server.server.http_port, server.server.grpc_port)
    assert set(got) == set(EXPECTED)
    assert _differing(got) == {}


@pytest.mark.slow  # live NVIDIA Triton: Ferry's half runs by default against the same expected answers
def test_answers_match_nvidia_tritons(repository) -> None:
    from support.triton import running_triton

    with running_triton(repository, list(MODELS)) as (http, grpc, _):
        got = _answers(http, grpc)
    assert _differing(got) == {}
