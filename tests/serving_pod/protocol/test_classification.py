"""Classification extension: ``classification: N`` outputs match Triton's "value:index:label" format.

A ``ferry_test`` identity model whose output has ``label_filename``; tritonclient's
``InferRequestedOutput(class_count=N)`` over HTTP and gRPC must return the same BYTES tensor Triton would.

Not compared (a side-by-side sweep, recorded live): tritonserver 2.51 crashes (SIGSEGV) on a classification of a
BYTES output, and on one of a zero-element output answered as HTTP JSON; Ferry refuses the first with the words it
gives BOOL, FP16 and BF16 ("class result not available for output due to unsupported type 'BYTES'") and answers the
second with an empty BYTES tensor, as Triton answers it over gRPC.
"""

from __future__ import annotations

import numpy as np
import pytest
from tritonclient.utils import InferenceServerException

from serving_pod.classification import classify, top_k
from serving_pod.core.types import Tensor
from support.server import write_model

LABELS = "cat\ndog\nbird\nfish\n"


def _config(name: str, max_batch_size: int, label_file: str = "labels.txt", datatype: str = "TYPE_FP32") -> str:
    return f"""
name: "{name}"
backend: "ferry_test"
max_batch_size: {max_batch_size}
input [ {{ name: "INPUT0" data_type: {datatype} dims: [ 4 ] }} ]
output [ {{ name: "OUTPUT0" data_type: {datatype} dims: [ 4 ] label_filename: "{label_file}" }} ]
"""


@pytest.fixture
def server(threaded_server, tmp_path):
    write_model(tmp_path, "cls", _config("cls", 8), files={"labels.txt": LABELS})
    write_model(tmp_path, "cls_nobatch", _config("cls_nobatch", 0), files={"labels.txt": "cat\ndog\n"})
    write_model(tmp_path, "cls_int", _config("cls_int", 8, datatype="TYPE_INT32"), files={"labels.txt": LABELS})
    write_model(tmp_path, "cls_escape", _config("cls_escape", 8, label_file="../../../../etc/hostname"))
    return threaded_server([tmp_path])


def _infer(server, protocol, model, data, count, datatype="FP32"):
    client, module = server.client(protocol), server.module(protocol)
    infer_input = module.InferInput("INPUT0", list(data.shape), datatype)
    infer_input.set_data_from_numpy(data)
    output = module.InferRequestedOutput("OUTPUT0", class_count=count)
    return client.infer(model, [infer_input], outputs=[output])


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_batched_top_k_with_labels(server, protocol):
    data = np.array([[0.1, 0.7, 0.05, 0.15], [0.5, 0.0, 0.25, 0.25]], dtype=np.float32)
    result = _infer(server, protocol, "cls", data, 3)
    out = result.as_numpy("OUTPUT0")
    assert out.shape == (2, 3)
    assert [s.decode() for s in out[0]] == ["0.700000:1:dog", "0.150000:3:fish", "0.100000:0:cat"]
    # ties keep the lower class index first
    assert [s.decode() for s in out[1]] == ["0.500000:0:cat", "0.250000:2:bird", "0.250000:3:fish"]
    meta = result.get_output("OUTPUT0")
    assert (meta["datatype"] if protocol == "http" else meta.datatype) == "BYTES"


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_non_batching_model_count_capped_and_missing_labels(server, protocol):
    data = np.array([3.0, 1.0, 4.0, 2.0], dtype=np.float32)
    out = _infer(server, protocol, "cls_nobatch", data, 10).as_numpy("OUTPUT0")
    assert out.shape == (4,)  # min(count, classes)
    # indices 2 and 3 have no line in the two-line label file: "value:index" only
    assert [s.decode() for s in out] == ["4.000000:2", "3.000000:0:cat", "2.000000:3", "1.000000:1:dog"]


#: (class counts of the two entries, protocol) -> OUTPUT0 as tritonserver 2.51 chose (recorded live with a python
#: add_sub model over both protocols): over HTTP an output's first entry decides (tritonclient sends a count of 0 as
#: no classification); over gRPC its first count does
OUTPUT_LISTED_TWICE = {
    ((1, 2), "http"): ["0.700000:1:dog"], ((1, 2), "grpc"): ["0.700000:1:dog"],
    ((0, 1), "http"): [0.1, 0.7, 0.05, 0.15], ((0, 1), "grpc"): ["0.700000:1:dog"],
    ((1, 0), "http"): ["0.700000:1:dog"], ((1, 0), "grpc"): ["0.700000:1:dog"],
}


@pytest.mark.parametrize(("counts", "protocol"), list(OUTPUT_LISTED_TWICE))
def test_an_output_listed_twice_keeps_its_first_entry(server, counts, protocol):
    """A requested output listed twice is answered once, as its first entry (or first count) asks, as Triton
    answers it; Ferry took the last (two classes for (1, 2))."""
    client, module = server.client(protocol), server.module(protocol)
    infer_input = module.InferInput("INPUT0", [1, 4], "FP32")
    infer_input.set_data_from_numpy(np.array([[0.1, 0.7, 0.05, 0.15]], dtype=np.float32))
    outputs = [module.InferRequestedOutput("OUTPUT0", class_count=count) for count in counts]
    out = client.infer("cls", [infer_input], outputs=outputs).as_numpy("OUTPUT0")[0]
    expected = OUTPUT_LISTED_TWICE[counts, protocol]
    assert (out.tolist() if out.dtype != np.object_ else [item.decode() for item in out]) == pytest.approx(expected)


def test_integer_outputs_print_as_integers(server):
    data = np.array([[5, -2, 9, 0]], dtype=np.int32)
    out = _infer(server, "http", "cls_int", data, 2, "INT32").as_numpy("OUTPUT0")
    assert [s.decode() for s in out[0]] == ["9:2:bird", "5:0:cat"]


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_label_file_outside_the_model_directory_is_refused(server, protocol):
    data = np.ones((1, 4), dtype=np.float32)
    with pytest.raises(InferenceServerException, match="outside the model directory"):
        _infer(server, protocol, "cls_escape", data, 1)


def test_bad_classification_parameter_is_refused(server):
    import httpx

    body = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}],
            "outputs": [{"name": "OUTPUT0", "parameters": {"classification": -1}}]}
    # (0 over HTTP is no classification, a plain output, as Triton's HTTP front end reads it)
    response = httpx.post(f"http://{server.http_url}/v2/models/cls/infer", json=body)
    assert response.status_code == 400
    assert "'classification' must be a positive integer" in response.json()["error"]


def test_unsupported_datatype_message_is_tritons():
    tensor = Tensor("OUT", "BOOL", np.array([True, False]))
    with pytest.raises(Exception, match="class result not available for output due to unsupported type 'BOOL'"):
        classify(tensor, 1, False, [])


def test_top_k_unit():
    assert top_k(np.array([1, 3, 2], dtype=np.uint8), 2, ["a", "", "c"]) == [b"3:1", b"2:2:c"]
