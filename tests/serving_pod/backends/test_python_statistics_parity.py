"""How a python model's failures are counted, as NVIDIA Triton 2.51 counts them (checked side by side).

Triton's python backend tells apart a request the model *answered* with an error
(``pb_utils.InferenceResponse(error=...)``: the execution succeeded, so ``success``,
``nv_inference_request_success`` and ``inference_count`` count it) from one whose ``execute`` raised
(``fail`` and ``nv_inference_request_failure{reason="BACKEND"}``, nothing in ``inference_count``); a decoupled
``execute`` that raises (or returns a value) fails its requests the same way. ``execution_count`` and the
batch statistics count every execution. Triton's figures are recorded (``EXPECTED``, ``SEEN``): Ferry runs against
them by default, a live Triton under ``-m slow``.
"""

from __future__ import annotations

import queue
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from support.server import write_model


def _config(name: str, extra: str = "") -> str:
    return (f'name: "{name}"\nbackend: "python"\nmax_batch_size: 4\n{extra}'
            'input [ { name: "MODE" data_type: TYPE_INT32 dims: [ 1 ] } ]\n'
            'output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]\n')


# MODE 0: the input back; 1: an error response
ANSWERS = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            mode = pb_utils.get_input_tensor_by_name(request, "MODE").as_numpy()
            if mode[0, 0] == 1:
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError("refused by the model")))
            else:
                responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", mode)]))
        return responses
'''

RAISES = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        raise pb_utils.TritonModelException("execute failed")
'''

DECOUPLED = 'model_transaction_policy { decoupled: true }\n'
ISOLATED = 'parameters { key: "FERRY_ISOLATED" value { string_value: "true" } }\n'
MODELS = ["answers", "raises", "decoupled_raises"]

#: Triton 2.51's figures after: "answers" twice (a batch of 2 each; the second answered with an error), "raises"
#: once and "decoupled_raises" once (streamed), each a batch of 2 (recorded from a live Triton, as ``SEEN``; the slow
#: ``test_tritons_figures`` compares a live one with both)
EXPECTED = {
    "answers": {"success": 2, "fail": 0, "inference_count": 4, "execution_count": 2, "batch_stats": [(2, 2)],
                "nv_inference_request_success": 2, "nv_inference_request_failure": 0, "nv_inference_count": 4,
                "nv_inference_exec_count": 2},
    **{name: {"success": 0, "fail": 1, "inference_count": 0, "execution_count": 1, "batch_stats": [(2, 1)],
              "nv_inference_request_success": 0, "nv_inference_request_failure": 1, "nv_inference_count": 0,
              "nv_inference_exec_count": 1} for name in ("raises", "decoupled_raises")},
}


def _repository(root: Path, extra: str = "") -> Path:
    write_model(root, "answers", _config("answers", extra), {"1/model.py": ANSWERS})
    write_model(root, "raises", _config("raises", extra), {"1/model.py": RAISES})
    write_model(root, "decoupled_raises", _config("decoupled_raises", DECOUPLED + extra), {"1/model.py": RAISES})
    return root


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _repository(tmp_path_factory.mktemp("python_statistics"))


@pytest.fixture(scope="module")
def isolated_repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _repository(tmp_path_factory.mktemp("python_statistics_isolated"), ISOLATED)


def _run(http: str, grpc: str) -> list[str]:
    """The requests of ``EXPECTED``; the errors the clients saw."""
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient
    from tritonclient.utils import InferenceServerException

    client = httpclient.InferenceServerClient(http, network_timeout=60.0)
    seen = []
    for model, mode in (("answers", 0), ("answers", 1), ("raises", 0)):
        tensor = httpclient.InferInput("MODE", [2, 1], "INT32")
        tensor.set_data_from_numpy(np.full((2, 1), mode, np.int32))
        try:
            client.infer(model, [tensor])
        except InferenceServerException as exc:
            seen.append(exc.message().split("\n")[0])  # Triton adds the traceback's lines
    stream = grpcclient.InferenceServerClient(grpc)
    answers: queue.Queue = queue.Queue()
    stream.start_stream(callback=lambda result, error: answers.put(error))
    try:
        tensor = grpcclient.InferInput("MODE", [2, 1], "INT32")
        tensor.set_data_from_numpy(np.zeros((2, 1), np.int32))
        stream.async_stream_infer("decoupled_raises", [tensor])
        seen.append(answers.get(timeout=30).message().split("\n")[0])
    finally:
        stream.stop_stream()
    return seen


SEEN = ["refused by the model",
        "Failed to process the request(s) for model 'raises_0', message: TritonModelException: execute failed",
        "Failed to process the request(s) for model 'decoupled_raises_0', message: TritonModelException: "
        "execute failed"]


def _counts(http: str, metrics: str) -> dict[str, dict[str, Any]]:
    """Each model's figures in ``EXPECTED``'s shape, from the statistics extension and the metrics endpoint."""
    scraped: dict[tuple[str, str], float] = {}
    for family in text_string_to_metric_families(httpx.get(f"http://{metrics}/metrics", timeout=10).text):
        for sample in family.samples:
            model = sample.labels.get("model")
            if model in MODELS and sample.labels.get("reason", "BACKEND") == "BACKEND":
                scraped[(model, sample.name.removesuffix("_total"))] = sample.value  # the parser's suffix
    counts = {}
    for model in MODELS:
        stats = httpx.get(f"http://{http}/v2/models/{model}/stats", timeout=10).json()["model_stats"][0]
        counts[model] = {
            "success": stats["inference_stats"]["success"]["count"],
            "fail": stats["inference_stats"]["fail"]["count"],
            "inference_count": stats["inference_count"],
            "execution_count": stats["execution_count"],
            "batch_stats": [(b["batch_size"], b["compute_infer"]["count"]) for b in stats["batch_stats"]],
            **{name: int(scraped[(model, name)]) for name in (
                "nv_inference_request_success", "nv_inference_request_failure", "nv_inference_count",
                "nv_inference_exec_count")},
        }
    return counts


#: what the python backend itself decides (``python_model``): the rest is counted by the scheduler (see below)
BACKEND_DECIDES = ("success", "fail", "execution_count", "nv_inference_request_success",
                   "nv_inference_request_failure", "nv_inference_exec_count")


def _decided(counts: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {model: {key: counts[model][key] for key in BACKEND_DECIDES} for model in ("raises", "decoupled_raises")}


def _served(server: Any) -> tuple[list[str], dict[str, dict[str, Any]]]:
    seen = _run(server.http_url, server.grpc_url)
    return seen, _counts(server.http_url, f"127.0.0.1:{server.server.metrics_port}")


@pytest.mark.parametrize("isolated", [False, True], ids=["in_process", "isolated"])
def test_an_execute_that_raises_fails_its_requests(threaded_server: Any, repository: Path,
                                                   isolated_repository: Path, isolated: bool) -> None:
    """A decoupled ``execute`` that raises fails its requests too (its error reaches the stream once)."""
    seen, counts = _served(threaded_server([isolated_repository if isolated else repository]))
    assert seen == SEEN
    assert _decided(counts) == _decided(EXPECTED)


def test_statistics_count_as_in_triton(threaded_server: Any, repository: Path) -> None:
    """An error the model sent as its response (``ServerError.sent_as_response``) is a success, and a failed
    request adds nothing to ``inference_count``."""
    assert _served(threaded_server([repository]))[1] == EXPECTED


@pytest.mark.slow  # live NVIDIA Triton: Ferry's half runs by default against the same expected answers
def test_tritons_figures(threaded_server: Any, repository: Path) -> None:
    """Side by side with Triton 2.51 (skipped where it cannot be had): ``EXPECTED`` are its figures."""
    from support.triton import running_triton

    with running_triton(repository, MODELS) as (http, grpc, metrics):
        seen = _run(f"127.0.0.1:{http}", f"127.0.0.1:{grpc}")
        counts = _counts(f"127.0.0.1:{http}", f"127.0.0.1:{metrics}")
    assert (seen, counts) == (SEEN, EXPECTED)
    assert _decided(_served(threaded_server([repository]))[1]) == _decided(counts)
