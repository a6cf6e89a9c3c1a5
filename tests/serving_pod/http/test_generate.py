"""Triton's generate extension (``serving_pod.http.generate``): mapping, responses, streaming, bad input.

The mapping rules are Triton 2.51's (``src/http_server.cc``); the error answers that Triton 2.51 gives on the same
model are compared side by side (its generate endpoint crashes the python backend stub on BYTES inputs in that
release, so successful answers are checked against the rules instead), and so are the answers of a decoupled model
that mixes responses and errors: status 400 when the first answer is an error, every answer an event, and
``/generate``'s one-answer rule counting errors too. Triton's answers are recorded in ``MIXED`` and ``ERRORS``:
Ferry runs against them by default, a live Triton in the slow ``..._as_recorded`` tests.
"""

from __future__ import annotations

import json

import httpx
import numpy as np
import pytest

from serving_pod.core.errors import InvalidArgumentError
from serving_pod.core.types import InferResponse, Tensor
from serving_pod.http import generate
from serving_pod.http.generate import decode_generate_request, encode_generate_response
from support.python_models import COUNT_CONFIG, COUNT_MODEL
from support.server import write_model

TEXT_CONFIG = """
name: "textgen"
backend: "python"
max_batch_size: 0
input [ { name: "text_input" data_type: TYPE_STRING dims: [ 1 ] },
        { name: "max_tokens" data_type: TYPE_INT32 dims: [ 1 ] optional: true } ]
output [ { name: "text_output" data_type: TYPE_STRING dims: [ 1 ] },
         { name: "lengths" data_type: TYPE_INT32 dims: [ -1 ] } ]
"""

TEXT_MODEL = '''
import json
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for request in requests:
            text = pb_utils.get_input_tensor_by_name(request, "text_input").as_numpy()[0].decode()
            tokens = pb_utils.get_input_tensor_by_name(request, "max_tokens")
            count = int(tokens.as_numpy()[0]) if tokens is not None else 2
            params = json.loads(request.parameters())
            if text == "fail":
                out.append(pb_utils.InferenceResponse(error=pb_utils.TritonError("the model refused 'fail'")))
                continue
            reply = text + " | " + json.dumps(params, sort_keys=True)
            out.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("text_output", np.array([reply.encode()], dtype=np.object_)),
                pb_utils.Tensor("lengths", np.arange(count, dtype=np.int32))]))
        return out
'''

MIXED_CONFIG = COUNT_CONFIG.replace('"counter"', '"mixed"')

# N's decimal digits, least significant first, are its answers: 1 a response (I = its position), 2 an error response
MIXED_MODEL = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            plan = int(pb_utils.get_input_tensor_by_name(request, "N").as_numpy()[0])
            sender = request.get_response_sender()
            position = 0
            while plan:
                step, plan = plan % 10, plan // 10
                if step == 1:
                    sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("I", np.array([position], np.int32))]))
                else:
                    sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(f"error {position}")))
                position += 1
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
'''


@pytest.fixture(scope="module")
def repository(tmp_path_factory):
    path = tmp_path_factory.mktemp("generate")
    write_model(path, "textgen", TEXT_CONFIG, files={"1/model.py": TEXT_MODEL})
    write_model(path, "counter", COUNT_CONFIG, files={"1/model.py": COUNT_MODEL})
    write_model(path, "mixed", MIXED_CONFIG, files={"1/model.py": MIXED_MODEL})
    return path


def _post(server, path: str, body) -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.post(f"http://{server.http_url}/v2/models/{path}", content=content, timeout=30)


# -- mapping (pure) ---------------------------------------------------------------------------------------

METADATA = {"inputs": [
    {"name": "text_input", "datatype": "BYTES", "shape": [-1, 1]},
    {"name": "pair", "datatype": "FP32", "shape": [-1, 2]},
    {"name": "flag", "datatype": "BOOL", "shape": [1]},
    {"name": "grid", "datatype": "INT64", "shape": [2, -1]},
]}


def test_keys_naming_inputs_become_tensors_and_the_rest_parameters():
    request = decode_generate_request(json.dumps({
        "id": "42", "text_input": "hi", "pair": [1, 2, 3, 4], "temperature": 0.5,
        "parameters": {"stream": False, "flag": True, "top_k": 3, "grid": [1, 2, 3, 4, 5, 6]},
    }).encode(), METADATA, "m", "", 1 << 20)
    tensors = {t.name: t for t in request.inputs}
    assert tensors["text_input"].data.tolist() == [[b"hi"]] and tensors["text_input"].datatype == "BYTES"
    assert tensors["pair"].data.shape == (2, 2) and tensors["pair"].data.dtype == np.float32  # batch dim takes 2
    assert tensors["flag"].data.tolist() == [True]
    assert tensors["grid"].data.shape == (2, 3)  # fixed 2, the variable dim takes the rest
    assert request.parameters == {"id": "42", "temperature": 0.5, "stream": False, "top_k": 3}
    assert request.id == "42"
    with pytest.raises(InvalidArgumentError, match="The document is empty"):  # no object at all, as Triton says
        decode_generate_request(b" ", METADATA, "m", "", 100)


@pytest.mark.parametrize(("body", "message"), [
    (b"[1]", "generate request must be a JSON object"),
    (b"{bad", "failed to parse the request JSON buffer"),
    (b'{"id": 7}', "'id' field must be a string"),
    (b'{"parameters": 5}', "Expected JSON object for keyword: 'parameters'"),
    (b'{"x": [1, 2]}', "parameter 'x' has invalid type. It should be either 'int', 'bool', or 'string'."),
    (b'{"x": {"a": 1}}', "parameter 'x' has invalid type"),
    (b'{"pair": [1, 2, 3]}', "The schema can not convert input 'pair' to tensor with proper shape"),
    (b'{"grid": [1, 2, 3]}', "The schema can not convert input 'grid' to tensor with proper shape"),
    (b'{"pair": [[1, 2], [3, 4]]}', "Unable to parse 'data': Shape does not match true shape of 'data' field"),
    (b'{"text_input": 5}', "input 'text_input': BYTES elements must be JSON strings"),
    (b'{"flag": 1}', "input 'flag': BOOL elements must be true or false"),
    (b'{"pair": ["a", "b"]}', "input 'pair': elements must be numbers for datatype FP32"),
    (b'{"grid": [1e30, 1]}', "input 'grid': data does not fit INT64"),
    (b'{"text_input": "' + b"x" * 200 + b'"}', "exceeds the maximum allowed input size of 100"),
])
def test_bad_generate_bodies_get_a_clear_error(body, message):
    with pytest.raises(InvalidArgumentError) as error:
        decode_generate_request(body, METADATA, "m", "", 100)
    assert message in error.value.message


def test_a_response_is_one_flat_object_in_key_order():
    response = InferResponse("m", "3", [
        Tensor("text_output", "BYTES", np.array([b"out"], dtype=np.object_)),
        Tensor("logits", "FP32", np.array([[0.5, 1.5]], np.float32)),
        Tensor("Z", "INT32", np.array([[7]], np.int32)),
    ], id="req", parameters={"finish": "stop", "tokens": 2})
    assert encode_generate_response(response) == (
        b'{"Z":7,"finish":"stop","id":"req","logits":[0.5,1.5],"model_name":"m","model_version":"3",'
        b'"text_output":"out","tokens":2}')


# -- served -----------------------------------------------------------------------------------------------


def test_generate_runs_the_model_and_answers_one_object(threaded_server, repository):
    server = threaded_server([repository])
    answer = _post(server, "textgen/generate", {"id": "7", "text_input": "hello", "parameters": {
        "max_tokens": 3, "temperature": 0.5}})
    assert answer.status_code == 200 and answer.headers["content-type"] == "application/json"
    assert answer.json() == {
        "id": "7", "lengths": [0, 1, 2], "model_name": "textgen", "model_version": "1",
        "text_output": 'hello | {"id": "7", "temperature": 0.5}',
    }
    # the version in the path, and a parameter at the top level
    answer = _post(server, "textgen/versions/1/generate", {"text_input": "x", "user": "u1"})
    assert answer.json()["text_output"] == 'x | {"user": "u1"}' and answer.json()["lengths"] == [0, 1]


def test_generate_stream_sends_each_response_as_an_event(threaded_server, repository):
    server = threaded_server([repository])
    answer = _post(server, "counter/generate_stream", {"N": 3})
    assert answer.status_code == 200 and answer.headers["content-type"] == "text/event-stream; charset=utf-8"
    assert answer.text == "".join(
        f'data: {{"I":{i},"model_name":"counter","model_version":"1"}}\n\n' for i in range(3))
    # a non-decoupled model streams its one response
    answer = _post(server, "textgen/generate_stream", {"text_input": "s"})
    events = [json.loads(line[6:]) for line in answer.text.split("\n\n") if line]
    assert [e["text_output"] for e in events] == ["s | {}"]
    # an error response is an event; the status is 400 when it is the model's first answer
    answer = _post(server, "counter/generate_stream", {"N": -2})
    assert answer.status_code == 200 and answer.text == (
        'data: {"I":0,"model_name":"counter","model_version":"1"}\n\ndata: {"error":"negative count"}\n\n')
    answer = _post(server, "counter/generate_stream", {"N": -1})
    assert answer.status_code == 400 and answer.headers["content-type"] == "text/event-stream; charset=utf-8"
    assert answer.text == 'data: {"error":"negative count"}\n\n'


def _i(position: int) -> str:
    return f'{{"I":{position},"model_name":"mixed","model_version":"1"}}'


ONE_RESPONSE = json.dumps({"error": generate.ONE_RESPONSE}, separators=(",", ":"))

#: mixed's plan -> (status, body) of /generate and of /generate_stream, as Triton 2.51 answers (recorded from a live
#: Triton; the slow ``test_errors_among_responses_match_nvidia_tritons`` compares a live one with it)
MIXED = {
    1: ((200, _i(0)), (200, f"data: {_i(0)}\n\n")),
    2: ((400, '{"error":"error 0"}'), (400, 'data: {"error":"error 0"}\n\n')),
    0: ((200, ONE_RESPONSE), (200, "")),
    11: ((200, ONE_RESPONSE), (200, f"data: {_i(0)}\n\ndata: {_i(1)}\n\n")),
    21: ((200, ONE_RESPONSE), (200, f'data: {_i(0)}\n\ndata: {{"error":"error 1"}}\n\n')),
    12: ((400, ONE_RESPONSE), (400, f'data: {{"error":"error 0"}}\n\ndata: {_i(1)}\n\n')),
    121: ((200, ONE_RESPONSE), (200, f'data: {_i(0)}\n\ndata: {{"error":"error 1"}}\n\ndata: {_i(2)}\n\n')),
    22: ((400, ONE_RESPONSE), (400, 'data: {"error":"error 0"}\n\ndata: {"error":"error 1"}\n\n')),
}


def _mixed_answers(url: str) -> dict[int, tuple]:
    answers = {}
    for plan in MIXED:
        pair = []
        for route, content_type in (("generate", "application/json"),
                                    ("generate_stream", "text/event-stream; charset=utf-8")):
            answer = httpx.post(f"{url}/v2/models/mixed/{route}", content=json.dumps({"N": plan}), timeout=30)
            assert answer.headers["content-type"] == content_type, (plan, route)
            pair.append((answer.status_code, answer.text))
        answers[plan] = tuple(pair)
    return answers


def test_errors_among_responses_are_answered_as_triton_does(threaded_server, repository):
    """A model error is one answer among the others: it sets the status when it comes first (400, whatever its
    code), it is an event of the stream, which goes on after it, and it counts in /generate's one-answer rule."""
    server = threaded_server([repository])
    assert _mixed_answers(f"http://{server.http_url}") == MIXED


@pytest.mark.slow  # live NVIDIA Triton: Ferry's half runs by default against the same expected answers
def test_errors_among_responses_match_nvidia_tritons(repository):
    """A live Triton 2.51 (skipped where it cannot be had) gives the recorded table."""
    from support.triton import running_triton

    with running_triton(repository, ["mixed"]) as (http, _, _):
        assert _mixed_answers(f"http://127.0.0.1:{http}") == MIXED


def test_generate_needs_exactly_one_response(threaded_server, repository):
    server = threaded_server([repository])
    assert _post(server, "counter/generate", {"N": 1}).json() == {"I": 0, "model_name": "counter", "model_version": "1"}
    for count in (0, 3, -2):  # -2: a response, then an error response
        answer = _post(server, "counter/generate", {"N": count})
        assert answer.status_code == 200 and answer.json() == {"error": (
            "generate expects model to produce exactly 1 response, use generate stream for model that generates "
            "various number of responses")}
    answer = _post(server, "counter/generate", {"N": -1})  # the error response is the one answer
    assert answer.status_code == 400 and answer.json() == {"error": "negative count"}


@pytest.mark.parametrize("route", ["generate", "generate_stream"])
def test_failures_before_inference_get_their_status(threaded_server, repository, route):
    server = threaded_server([repository])
    cases = [
        ("textgen", {"text_input": ["a", "b"]}, 400, "The schema can not convert input 'text_input'"),
        ("textgen", {"text_input": "x", "bad": [1]}, 400, "parameter 'bad' has invalid type"),
        ("textgen", {}, 400, "missing required input(s) ['text_input']"),
        ("counter", {}, 400, "missing required input(s) ['N']"),
        ("missing", {"a": 1}, 404, "Request for unknown model: 'missing' is not found"),
        ("textgen/versions/7", {"text_input": "v"}, 404, "Request for unknown model: 'textgen' version 7 is not found"),
    ]
    for model, body, status, message in cases:
        answer = _post(server, f"{model}/{route}", body)
        assert answer.status_code == status, (model, body, answer.text)
        assert answer.headers["content-type"] == "application/json" and message in answer.json()["error"]
    assert _post(server, "textgen/generate", {"text_input": "still"}).status_code == 200  # the server goes on


@pytest.mark.parametrize(("route", "body"), [("generate", '{"error":"the model refused \'fail\'"}'),
                                             ("generate_stream", 'data: {"error":"the model refused \'fail\'"}\n\n')])
def test_a_model_error_is_the_answer_with_status_400(threaded_server, repository, route, body):
    server = threaded_server([repository])
    answer = _post(server, f"textgen/{route}", {"text_input": "fail"})
    assert answer.status_code == 400 and answer.text == body


@pytest.mark.parametrize("encoding", ["gzip", "deflate", "br"])
def test_an_encoded_body_is_refused(threaded_server, repository, encoding):
    server = threaded_server([repository])
    for route in ("generate", "generate_stream"):
        answer = httpx.post(f"http://{server.http_url}/v2/models/counter/{route}", content=b'{"N": 1}',
                            headers={"Content-Encoding": encoding}, timeout=30)
        assert (answer.status_code, answer.json()) == (
            400, {"error": "Unsupported content-encoding, only 'identity' is supported."})
    answer = httpx.post(f"http://{server.http_url}/v2/models/counter/generate", content=b'{"N": 1}',
                        headers={"Content-Encoding": "identity"}, timeout=30)
    assert answer.status_code == 200


#: the failures Triton 2.51's generate endpoint answers correctly: (path, body, headers)
ERROR_CASES = [
    ("textgen/generate", {"text_input": ["a", "b"]}, {}),
    ("textgen/generate", {"text_input": "x", "bad": [1, 2]}, {}),
    ("missing/generate", {"a": 1}, {}),
    ("textgen/versions/7/generate", {"text_input": "v"}, {}),
    ("counter/generate_stream", {"N": -1}, {}),
    ("counter/generate", {"N": -2}, {}),
    ("counter/generate_stream", {"N": 1}, {"Content-Encoding": "gzip"}),
    ("missing/generate", {"N": 1}, {"Content-Encoding": "gzip"}),
]

_JSON, _EVENTS = "application/json", "text/event-stream; charset=utf-8"
#: (status, content type, body) of each of ``ERROR_CASES``, as Triton 2.51 answers (recorded from a live Triton; the
#: slow ``test_nvidia_tritons_error_answers_as_recorded`` compares a live one with them)
ERRORS = [
    (400, _JSON, '{"error":"The schema can not convert input \'text_input\' to tensor with proper shape"}'),
    (400, _JSON, '{"error":"parameter \'bad\' has invalid type. It should be either \'int\', \'bool\', or '
                 '\'string\'."}'),
    (404, _JSON, '{"error":"Request for unknown model: \'missing\' is not found"}'),
    (404, _JSON, '{"error":"Request for unknown model: \'textgen\' version 7 is not found"}'),
    (400, _EVENTS, 'data: {"error":"negative count"}\n\n'),
    (200, _JSON, '{"error":"generate expects model to produce exactly 1 response, use generate stream for model that '
                 'generates various number of responses"}'),
    (400, _JSON, '{"error":"Unsupported content-encoding, only \'identity\' is supported."}'),
    (404, _JSON, '{"error":"Request for unknown model: \'missing\' is not found"}'),
]


def _error_answers(url: str) -> list:
    got = []
    for path, body, headers in ERROR_CASES:
        answer = httpx.post(f"{url}/v2/models/{path}", content=json.dumps(body), headers=headers, timeout=30)
        got.append((answer.status_code, answer.headers["content-type"], answer.text))
    return got


def test_error_answers_match_nvidia_tritons(threaded_server, repository):
    """The failures Triton 2.51's generate endpoint answers correctly: same status, same message."""
    server = threaded_server([repository])
    assert _error_answers(f"http://{server.http_url}") == ERRORS


@pytest.mark.slow  # live NVIDIA Triton: Ferry's half runs by default against the same expected answers
def test_nvidia_tritons_error_answers_as_recorded(repository):
    from support.triton import running_triton

    with running_triton(repository, ["textgen", "counter"]) as (http, _, _):
        assert _error_answers(f"http://127.0.0.1:{http}") == ERRORS


# -- a response that JSON cannot hold, and the model's stream -------------------------------------------
# No model can make an unencodable response today (python models send only bool, int and str response
# parameters), so these feed ``http.generate`` a stream directly.

class _Engine:
    """What ``answer_generate`` asks of an engine, streaming ``items`` (responses and errors; an error last is
    raised, as the engine raises the error that ends a stream); ``closed`` notes that the stream was closed."""

    def __init__(self, *items) -> None:
        self.items = items
        self.closed: list[bool] = []

    def model_metadata(self, model: str, version: str) -> dict:
        return {"inputs": [{"name": "X", "datatype": "INT32", "shape": [1]}]}

    def stream_infer(self, request):
        async def stream():
            try:
                for index, item in enumerate(self.items):
                    if isinstance(item, dict):
                        yield InferResponse("m", "1", [Tensor("I", "INT32", np.array([index], np.int32))],
                                            parameters=item)
                    elif index == len(self.items) - 1:
                        raise item
                    else:
                        yield item
            finally:
                self.closed.append(True)
        return stream()


async def _generate(engine: _Engine, streaming: bool) -> tuple[int, bytes, bytes]:
    status, content_type, body = await generate.answer_generate(engine, b'{"X": 1}', "m", "", 1 << 20, streaming)
    if not isinstance(body, bytes):
        body = b"".join([event async for event in body])
    return status, content_type, body


BAD_PARAMETER = b'{"error":"Response parameter \'bad\' has type \'list\' which is not currently supported"}'


def _event(payload: bytes) -> bytes:
    return b"data: " + payload + b"\n\n"


async def test_an_unencodable_streamed_response_is_an_error_event_and_the_stream_goes_on():
    engine = _Engine({}, {"bad": [1]}, {})
    assert await _generate(engine, True) == (200, generate.EVENT_STREAM, b"".join([
        _event(b'{"I":0,"model_name":"m","model_version":"1"}'), _event(BAD_PARAMETER),
        _event(b'{"I":2,"model_name":"m","model_version":"1"}')]))
    assert engine.closed == [True]
    engine = _Engine({"bad": [1]}, {})  # the first answer fails: the status says so
    assert (await _generate(engine, True))[:2] == (400, generate.EVENT_STREAM)


async def test_an_unencodable_generate_response_is_an_error_object():
    assert await _generate(_Engine({"bad": [1]}), False) == (400, generate.JSON, BAD_PARAMETER)
    assert await _generate(_Engine({"ok": 1}), False) == (
        200, generate.JSON, b'{"I":0,"model_name":"m","model_version":"1","ok":1}')


async def test_an_error_response_between_responses_is_an_event_and_the_stream_goes_on():
    """The engine streams a model's non-final error response, and raises the one that ends the stream: both are
    events, the responses between them too."""
    from serving_pod.core.errors import InternalError, InvalidArgumentError

    engine = _Engine({}, InvalidArgumentError("an error between two responses"), {}, InternalError("the last"))
    assert await _generate(engine, True) == (200, generate.EVENT_STREAM, b"".join([
        _event(b'{"I":0,"model_name":"m","model_version":"1"}'), _event(b'{"error":"an error between two responses"}'),
        _event(b'{"I":2,"model_name":"m","model_version":"1"}'), _event(b'{"error":"the last"}')]))
    assert engine.closed == [True]


async def test_a_request_refused_before_inference_is_a_json_error_with_its_status():
    """An error the engine marks ``refused_before_queue`` is no answer of the model: its own status, as JSON."""
    from serving_pod.core.errors import NotFoundError

    refused = NotFoundError("refused")
    setattr(refused, "refused_before_queue", True)
    for streaming in (False, True):
        assert await _generate(_Engine(refused), streaming) == (404, generate.JSON, b'{"error":"refused"}')
        assert await _generate(_Engine(NotFoundError("the model's")), streaming) == (
            400, generate.EVENT_STREAM if streaming else generate.JSON,
            _event(b'{"error":"the model\'s"}') if streaming else b'{"error":"the model\'s"}')


async def test_a_client_gone_mid_stream_closes_the_models_stream():
    engine = _Engine({}, {}, {})
    status, _, events = await generate.answer_generate(engine, b'{"X": 1}', "m", "", 1 << 20, True)
    first = await events.__anext__()
    assert status == 200 and first.startswith(b"data: ") and engine.closed == []
    await events.aclose()  # what the server does when the client goes away
    assert engine.closed == [True]
