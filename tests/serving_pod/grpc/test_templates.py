"""gRPC request templates (``serving_pod.grpc.templates``): a repeated ``ModelInferRequest`` is parsed once.

Covered: a request built from a template equals the one the full parse gives (fixed-size and BYTES inputs,
with and without outputs and parameters) and views the message's bytes; which messages never become
templates; messages of a template's size that are not built from it (another prefix, entries split
differently) get the full parse; what each bad message gets (a malformed protobuf: INTERNAL "Failed to parse
the request"; tensor bytes of the wrong size: the full parse's INVALID_ARG); the table's bound; and a served
model answering repeated requests from tritonclient over gRPC with the right outputs for each.
"""

from __future__ import annotations

import numpy as np
import pytest
from tritonclient.grpc import service_pb2 as pb

from serving_pod.core.datatypes import DataDefect
from serving_pod.core.errors import InternalError
from serving_pod.grpc import templates
from serving_pod.grpc.codec import decode_infer_request, decode_serialized
from support.infer import assert_same_request, infer_simple_repeatedly
from support.server import DEFAULT_MODELS


@pytest.fixture(autouse=True)
def _empty_table():
    templates.clear()
    yield
    templates.clear()


def _message(*inputs: tuple[str, str, list[int], bytes], outputs: tuple[str, ...] = ("Y",), request_id: str = "",
             parameters: dict | None = None) -> pb.ModelInferRequest:
    message = pb.ModelInferRequest(model_name="m", model_version="2", id=request_id)
    for name, datatype, shape, data in inputs:
        message.inputs.add(name=name, datatype=datatype, shape=shape)
        message.raw_input_contents.append(data)
    for name in outputs:
        message.outputs.add(name=name).parameters["classification"].int64_param = 2
    for key, value in (parameters or {}).items():
        message.parameters[key].string_param = value
    return message


def _elements(*items: bytes) -> bytes:
    return b"".join(len(item).to_bytes(4, "little") + item for item in items)


def test_a_repeated_message_is_built_from_its_template_with_the_same_result() -> None:
    def message(start: int, words: tuple[bytes, bytes]) -> pb.ModelInferRequest:
        return _message(("A", "INT32", [1, 4], np.arange(start, start + 4, dtype="<i4").tobytes()),
                        ("B", "BYTES", [2], _elements(*words)), parameters={"note": "x"})

    first = message(0, (b"ab", b"c")).SerializeToString()
    assert_same_request(decode_serialized(first), decode_infer_request(pb.ModelInferRequest.FromString(first)))
    second = message(10, (b"xy", b"z")).SerializeToString()
    assert len(second) == len(first) and templates.lookup(second) is not None
    built = decode_serialized(second)
    assert_same_request(built, decode_infer_request(pb.ModelInferRequest.FromString(second)))
    assert built.inputs[0].data.tolist() == [[10, 11, 12, 13]] and built.inputs[1].data.tolist() == [b"xy", b"z"]
    assert built.inputs[0].data.base.base is second  # a view of the message (reshaped), no copy
    assert built.outputs[0].parameters == {"classification": 2}
    other = decode_serialized(second)
    other.parameters["forwarded"] = "header"  # what header forwarding does to a request
    assert "forwarded" not in decode_serialized(second).parameters


def test_without_outputs_or_parameters_too() -> None:
    body = _message(("X", "FP32", [16], np.ones(16, "<f4").tobytes()), outputs=()).SerializeToString()
    decode_serialized(body)
    built = templates.lookup(body)
    assert built is not None and built.outputs is None and built.parameters == {}
    assert_same_request(built, decode_infer_request(pb.ModelInferRequest.FromString(body)))


def test_messages_that_never_become_templates() -> None:
    numbered = _message(("X", "FP32", [1], b"\0" * 4), request_id="7").SerializeToString()
    typed = pb.ModelInferRequest(model_name="m")
    typed.inputs.add(name="X", datatype="INT32", shape=[2]).contents.int_contents.extend([1, 2])
    shm = pb.ModelInferRequest(model_name="m")
    shm_input = shm.inputs.add(name="X", datatype="FP32", shape=[1])
    shm_input.parameters["shared_memory_region"].string_param = "r"
    shm_input.parameters["shared_memory_byte_size"].int64_param = 4  # required beside a region
    for body in (numbered, typed.SerializeToString(), shm.SerializeToString()):
        decode_serialized(body)
        assert templates.lookup(body) is None
    assert decode_serialized(numbered).id == "7"


def test_same_size_messages_that_do_not_fit_a_template_get_the_full_parse() -> None:
    def two(first: bytes, second: bytes) -> bytes:
        return _message(("A", "BYTES", [1], _elements(first)), ("B", "BYTES", [1], _elements(second))).SerializeToString()

    learned = two(b"x" * 10, b"y" * 20)
    decode_serialized(learned)
    resplit = two(b"x" * 15, b"y" * 15)  # same prefix and size, the entries split elsewhere
    assert len(resplit) == len(learned) and templates.lookup(resplit) is None
    assert decode_serialized(resplit).inputs[1].data.tolist() == [b"y" * 15]
    renamed = _message(("A", "BYTES", [1], _elements(b"x" * 10)),
                       ("C", "BYTES", [1], _elements(b"y" * 20))).SerializeToString()
    assert len(renamed) == len(learned) and templates.lookup(renamed) is None
    assert [t.name for t in decode_serialized(renamed).inputs] == ["A", "C"]
    assert templates.lookup(renamed) is not None  # two templates of one size, each found


def test_bad_messages_get_the_parse_error() -> None:
    decode_serialized(_message(("X", "FP32", [1, 16], b"\0" * 64)).SerializeToString())  # a template beside
    with pytest.raises(InternalError) as raised:
        decode_serialized(b"\xff\xff\xff\xff")
    assert raised.value.message == "Unable to parse request"  # Triton 2.51's words (grpc++)


@pytest.mark.parametrize(("body", "defect"), [
    (_message(("X", "FP32", [1, 16], b"\0" * 60)).SerializeToString(), DataDefect("byte_size", 64, 60)),
    (_message(("X", "BYTES", [2], _elements(b"a"))).SerializeToString(), DataDefect("too_few_strings", 2, 1)),
])
def test_data_that_does_not_fit_is_left_to_the_model(body: bytes, defect: DataDefect) -> None:
    # the model refuses it, after its own checks (Triton's order: ``core.validation``); no template is kept of it
    decode_serialized(_message(("X", "FP32", [1, 16], b"\0" * 64)).SerializeToString())  # a template beside
    assert decode_serialized(body).inputs[0].defect == defect
    assert templates.lookup(body) is None


def _wrapped(data: bytes, wrapper: str) -> bytes:
    """A message whose tensor data comes first, then a field that ends with bytes equal to its entry."""
    message = _message(("X", "FP32", [1, 16], b"\0" * 64), outputs=())
    tail = b"\x3a\x40" + data  # what an entry of 64 bytes looks like
    if wrapper == "unknown field":
        field = b"\xa2\x06" + bytes([len(tail)]) + tail  # field 100, length-delimited
    else:
        field = pb.ModelInferRequest(outputs=[pb.ModelInferRequest.InferRequestedOutputTensor(
            name=tail.decode())]).SerializeToString()
    return message.SerializeToString() + field


@pytest.mark.parametrize("wrapper", ["unknown field", "output name"])
def test_entries_that_end_another_field_are_not_a_template(wrapper: str) -> None:
    # the message's bytes end as its entry would (the prefix is not whole fields): a template of it would take
    # the next message's tensor data from that other field
    first = _wrapped(b"\0" * 64, wrapper)
    assert pb.ModelInferRequest.FromString(first).raw_input_contents[0] == first[-64:]
    decode_serialized(first)
    second = _wrapped(b"\x01" * 64, wrapper)
    assert templates.lookup(second) is None
    assert_same_request(decode_serialized(second), decode_infer_request(pb.ModelInferRequest.FromString(second)))
    assert decode_serialized(second).inputs[0].data.tolist() == [[0.0] * 16]


def test_bytes_elements_are_checked_for_every_message() -> None:
    good = _message(("B", "BYTES", [2], _elements(b"ab", b"c"))).SerializeToString()
    decode_serialized(good)
    bad = _message(("B", "BYTES", [2], _elements(b"abcdefg"))).SerializeToString()  # one element for a shape of 2
    assert len(bad) == len(good)
    assert decode_serialized(bad).inputs[0].defect == DataDefect("too_few_strings", 2, 1)


def test_the_table_is_bounded() -> None:
    for index in range(templates.MAX_TEMPLATES + 3):
        decode_serialized(_message((f"I{index}", "FP32", [1], b"\0" * 4)).SerializeToString())
    assert 0 < sum(len(group) for group in templates._templates.values()) <= templates.MAX_TEMPLATES


@pytest.mark.parametrize("grpc_server", ["native", "grpcio"])
def test_repeated_grpc_requests_get_the_answer_for_their_own_data(threaded_server, grpc_server: str) -> None:
    server = threaded_server([DEFAULT_MODELS], model_control_mode="explicit", load_models=("simple",),
                             grpc_server=grpc_server)
    infer_simple_repeatedly(server, "grpc")
    assert (sum(len(group) for group in templates._templates.values()) > 0) == (grpc_server == "native")
