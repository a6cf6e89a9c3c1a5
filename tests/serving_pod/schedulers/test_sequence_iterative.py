"""Iterative sequences and request rescheduling, side by side with NVIDIA Triton 2.51.

``sequence_batching { iterative_sequence: true }`` gives a request without a correlation ID a sequence of its
own; a python model that calls ``request.set_release_flags(TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)`` has the
same request executed again on that sequence's slot (python backend README "Request Rescheduling"). Models of
tests/serving_pod/data/iterative (ours): ``countdown`` (decoupled: IN = n answers n - 1 .. 0, one response a run),
``addsub_reschedule_first`` (runs its first request twice) and ``iter_probe``, which reports the correlation ID
and flags the batcher gave each run. Every case runs over HTTP, gRPC and gRPC streaming against Ferry and against
Triton (skipped with the installer's reason where Triton cannot be had). Opt-in (``-m slow`` with
``FERRY_TRITON_SERVER_SOURCE``, a checkout of Triton's server repo at v2.51.0): the same cases with Triton's QA
models ``iterative_sequence`` and ``request_rescheduling_addsub`` unmodified, read from that tree; that
``iterative_sequence`` keeps one count for the whole model, so its second request answers ``[-1]`` at once.

Kept different on purpose:
- a model that is not an iterative sequence and reschedules: Triton 2.51 never answers the request (its client
  hangs; later Tritons send the error below); Ferry answers Triton's words "Request is released with
  TRITONSERVER_REQUEST_RELEASE_RESCHEDULE, while the model is not configured to handle such a flag." (400);
- statistics: Triton 2.51 also adds to ``fail`` for a model that reschedules (``addsub_reschedule_first``: 1
  after two requests that both succeeded, the first run twice); Ferry adds none. Every run is counted alike
  (inference, execution and success counts, batch_stats: compared).
- a non-decoupled model run in a child process (``FERRY_ISOLATED``) reschedules too; an ``async def execute`` of a decoupled
  model runs on after it returns, so a RESCHEDULE set there comes too late and is not honoured.
"""

from __future__ import annotations

import json
import queue
import shutil
import threading
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from tritonclient.utils import InferenceServerException

DATA = Path(__file__).resolve().parents[1] / "data" / "iterative"
#: the decoupled and the non-decoupled rescheduling model: ours, and Triton's QA models (opt-in)
OURS = ("countdown", "addsub_reschedule_first")
TRITON_QA = ("iterative_sequence", "request_rescheduling_addsub")
REFUSED = ("Request is released with TRITONSERVER_REQUEST_RELEASE_RESCHEDULE, while the model is not configured "
           "to handle such a flag.")


@pytest.fixture(scope="module")
def repository(tmp_path_factory) -> Path:
    repo = tmp_path_factory.mktemp("iterative")
    for name in (*OURS, "iter_probe"):
        shutil.copytree(DATA / name, repo / name)
    _variant(repo, "countdown", "countdown_sse", "sequence_batching {\n  iterative_sequence : true\n}")
    # Ferry only (Triton 2.51 hangs): the same models without an iterative sequence batcher
    _variant(repo, "countdown", "iterative_plain", "")
    _variant(repo, "countdown", "iterative_direct", "sequence_batching { direct { } }")
    for protocol in ("http", "grpc"):  # the model reschedules its first request only
        _variant(repo, "addsub_reschedule_first", f"addsub_plain_{protocol}", "")
    return repo


@pytest.fixture(scope="module")
def triton_qa_repository(tmp_path_factory) -> Path:
    """Triton's QA models from FERRY_TRITON_SERVER_SOURCE (skipped where unset), with our ``iter_probe``."""
    from support.python_models import install_triton_qa_model, triton_qa_models_or_skip

    models = triton_qa_models_or_skip()
    repo = tmp_path_factory.mktemp("iterative_triton_qa")
    for name in TRITON_QA:
        install_triton_qa_model(repo, models, name)
    shutil.copytree(DATA / "iter_probe", repo / "iter_probe")
    _variant(repo, "iterative_sequence", "iterative_sequence_sse",
             "sequence_batching {\n  iterative_sequence : true\n}")
    return repo


def _variant(repo: Path, source: str, name: str, batching: str) -> None:
    shutil.copytree(repo / source, repo / name)
    config = (repo / name / "config.pbtxt").read_text().replace(f'name: "{source}"', f'name: "{name}"')
    config = config.replace("sequence_batching {\n  iterative_sequence : true\n}", batching)
    (repo / name / "config.pbtxt").write_text(config)


def _clients(http_url: str, grpc_url: str) -> tuple[Any, Any]:
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

    return httpclient.InferenceServerClient(http_url, network_timeout=60.0), grpcclient.InferenceServerClient(grpc_url)


def _stream(grpc_url: str, model: str, inputs: list, **parameters: Any) -> list:
    """(value of the first output, final) per response of one streamed request, or ("error", message)."""
    import tritonclient.grpc as grpcclient

    answers: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(grpc_url)
    client.start_stream(callback=lambda result, error: answers.put(error or result))
    try:
        client.async_stream_infer(model, inputs, enable_empty_final_response=True, **parameters)
        seen: list = []
        while len(seen) < 6:
            item = answers.get(timeout=30)
            if isinstance(item, InferenceServerException):
                seen.append(("error", item.message()))
                break
            final = item.get_response().parameters["triton_final_response"].bool_param
            output = item.get_response().outputs
            seen.append((item.as_numpy(output[0].name).tolist() if output else None, final))
            if final:
                break
        return seen
    finally:
        client.stop_stream(cancel_requests=True)
        client.close()


def _tensor(module: Any, name: str, value: np.ndarray) -> Any:
    tensor = module.InferInput(name, list(value.shape), {np.int32: "INT32", np.float32: "FP32"}[value.dtype.type])
    tensor.set_data_from_numpy(value)
    return tensor


PROBE_CASES: list[tuple[int, dict]] = [
    (3, {}),                                        # a sequence of its own, run 3 times
    (1, {}),
    (2, {"sequence_id": 900, "sequence_start": True}),  # the client's sequence: ended when released
    (2, {"sequence_id": 900}),                      # ... so a later request must START again
    (-1, {}),                                       # rescheduled, yet a response returned
    (2, {}),
]


def _probe(protocol: str, http: Any, grpc: Any, grpc_url: str, shift: int) -> list:
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

    module = httpclient if protocol == "http" else grpcclient
    outcomes: list = []
    for value, parameters in PROBE_CASES:
        if "sequence_id" in parameters:
            parameters = {**parameters, "sequence_id": parameters["sequence_id"] + shift}
        inputs = [_tensor(module, "IN", np.array([value], np.int32))]
        if protocol == "grpc_stream":
            outcomes.append(_stream(grpc_url, "iter_probe", inputs, **parameters))
            continue
        client = http if protocol == "http" else grpc
        try:
            outcomes.append(("ok", client.infer("iter_probe", inputs, **parameters).as_numpy("OUT").tolist()))
        except InferenceServerException as error:
            outcomes.append(("error", error.message()))
    return outcomes


def _addsub(protocol: str, http: Any, grpc: Any, grpc_url: str, model: str) -> Any:
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

    module = httpclient if protocol == "http" else grpcclient
    a, b = np.arange(16, dtype=np.float32), np.full(16, 0.5, np.float32)
    inputs = [_tensor(module, "INPUT0", a), _tensor(module, "INPUT1", b)]
    if protocol == "grpc_stream":
        return _stream(grpc_url, model, inputs)
    result = (http if protocol == "http" else grpc).infer(model, inputs)
    return result.as_numpy("OUTPUT0").tolist(), result.as_numpy("OUTPUT1").tolist()


def _generate_stream(http_url: str, model: str, value: int) -> list:
    response = httpx.post(f"http://{http_url}/v2/models/{model}/generate_stream", json={"IN": value}, timeout=60)
    events = [json.loads(line[len("data: "):]) for line in response.text.splitlines() if line.startswith("data: ")]
    return [response.status_code, [event.get("OUT", event.get("error")) for event in events]]


def _concurrent_probes(http_url: str) -> list:
    """Two iterative requests at once on a one-slot model: the second waits in the backlog, both complete."""
    import tritonclient.http as httpclient

    answers: list = []

    def one() -> None:
        client = httpclient.InferenceServerClient(http_url, network_timeout=60.0)
        try:
            answers.append(client.infer("iter_probe", [_tensor(httpclient, "IN", np.array([3], np.int32))])
                           .as_numpy("OUT").tolist())
        finally:
            client.close()

    threads = [threading.Thread(target=one) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    return answers


def _observe(http_url: str, grpc_url: str, models: tuple[str, str] = OURS) -> dict[str, Any]:
    countdown, addsub = models
    http, grpc = _clients(http_url, grpc_url)
    seen: dict[str, Any] = {}
    try:
        for shift, protocol in enumerate(("http", "grpc", "grpc_stream")):
            seen[f"probe/{protocol}"] = _probe(protocol, http, grpc, grpc_url, shift)
            seen[f"addsub/{protocol}"] = _addsub(protocol, http, grpc, grpc_url, addsub)
        concurrent = _concurrent_probes(http_url)  # which of the two gets which id is timing: not compared
        seen["concurrent"] = sorted([first, last, runs] for _, first, last, runs in concurrent)
        seen["concurrent_ids"] = len({cid for cid, *_ in concurrent})
        seen["iterative/grpc_stream"] = [
            _stream(grpc_url, countdown, [_tensor(grpc_module(), "IN", np.array([3], np.int32))])
            for _ in range(2)
        ]
        seen["iterative/http_generate_stream"] = _generate_stream(http_url, f"{countdown}_sse", 3)
        stats = http.get_inference_statistics(addsub)["model_stats"][0]
        seen["addsub/statistics"] = (
            stats["inference_count"], stats["execution_count"], stats["inference_stats"]["success"]["count"],
            [(batch["batch_size"], batch["compute_infer"]["count"]) for batch in stats["batch_stats"]],
        )
    finally:
        http.close()
        grpc.close()
    return seen


def grpc_module() -> Any:
    import tritonclient.grpc as grpcclient

    return grpcclient


def _expected_probe(protocol_index: int) -> list:
    base = 4 * protocol_index  # each protocol's run gives 4 requests ids of their own (HTTP first)
    sid = 900 + protocol_index
    no_start = (f"inference request for sequence {sid} to model 'iter_probe' must specify the START flag on the "
                "first request of the sequence")
    refused = ("Failed to process the request(s) for model 'iter_probe_0_0', message: Expected a None object in the "
               "execute function return list for reschduled request, found type "
               "'<class 'c_python_backend_utils.InferenceResponse'>'.")
    return [("ok", [base + 1, 1, 0, 3]), ("ok", [base + 2, 1, 1, 1]), ("ok", [sid, 1, 0, 2]),
            ("error", no_start), ("error", refused), ("ok", [base + 4, 1, 0, 2])]


def _ferry(repository: Path, models: tuple[str, str] = OURS) -> dict[str, Any]:
    from support.server import ServerThread, make_options

    thread = ServerThread(make_options([repository]))
    handle = thread.start()
    try:
        return _observe(handle.http_url, handle.grpc_url, models)
    finally:
        thread.stop()


#: each of two streamed requests IN 3: ours counts down per sequence; Triton's QA model once for the whole model
COUNTDOWNS = {OURS: [[([2], False), ([1], False), ([0], True)], [([2], False), ([1], False), ([0], True)]],
              TRITON_QA: [[([2], False), ([1], False), ([0], True)], [([-1], True)]]}


def _check(seen: dict[str, Any], models: tuple[str, str]) -> None:
    """What Ferry and Triton 2.51 answer alike (recorded)."""
    assert seen["probe/http"] == _expected_probe(0)
    assert seen["probe/grpc"] == _expected_probe(1)
    stream = [[(out, True)] if kind == "ok" else [(kind, out)] for kind, out in _expected_probe(2)]
    assert seen["probe/grpc_stream"] == stream
    a, b = np.arange(16, dtype=np.float32), np.full(16, 0.5, np.float32)
    assert seen["addsub/http"] == seen["addsub/grpc"] == ((a + b).tolist(), (a - b).tolist())
    assert seen["addsub/grpc_stream"] == [((a + b).tolist(), True)]
    assert seen["addsub/statistics"] == (4, 4, 4, [(1, 4)])  # the first request ran twice, each run counted
    assert seen["concurrent"] == [[1, 0, 3], [1, 0, 3]] and seen["concurrent_ids"] == 2
    assert seen["iterative/grpc_stream"] == COUNTDOWNS[models]
    assert seen["iterative/http_generate_stream"] == [200, [2, 1, 0]]


def test_iterative_sequences_in_ferry(repository: Path) -> None:
    _check(_ferry(repository), OURS)


def _side_by_side(repository: Path, models: tuple[str, str]) -> None:
    from support.triton import running_triton

    with running_triton(repository, [*models, f"{models[0]}_sse", "iter_probe"]) as (http, grpc, _):
        triton = _observe(f"127.0.0.1:{http}", f"127.0.0.1:{grpc}", models)
    ferry = _ferry(repository, models)
    _check(triton, models)  # what makes the comparison worth it
    assert ferry == triton


@pytest.mark.slow  # live NVIDIA Triton: Ferry's half runs by default against the same expected answers
def test_iterative_sequences_match_triton(repository: Path) -> None:
    _side_by_side(repository, OURS)


@pytest.mark.slow  # opt-in: Triton's own QA models, from FERRY_TRITON_SERVER_SOURCE
def test_triton_qa_models_unmodified_in_ferry(triton_qa_repository: Path) -> None:
    _check(_ferry(triton_qa_repository, TRITON_QA), TRITON_QA)


@pytest.mark.slow  # opt-in: Triton's own QA models, from FERRY_TRITON_SERVER_SOURCE, on live NVIDIA Triton too
def test_triton_qa_models_unmodified_match_triton(triton_qa_repository: Path) -> None:
    _side_by_side(triton_qa_repository, TRITON_QA)


def test_rescheduling_without_an_iterative_sequence_is_refused(repository: Path) -> None:
    """Ferry only: Triton 2.51 never answers these (module docstring)."""
    from support.server import ServerThread, make_options

    thread = ServerThread(make_options([repository], model_control_mode="explicit",
                                       load_models=("iterative_plain", "iterative_direct", "addsub_plain_http", "addsub_plain_grpc")))
    handle = thread.start()
    try:
        for model, parameters in (("iterative_plain", {}), ("iterative_direct", {"sequence_id": 5, "sequence_start": True})):
            inputs = [_tensor(grpc_module(), "IN", np.array([3], np.int32))]
            assert _stream(handle.grpc_url, model, inputs, **parameters) == [([2], False), ("error", REFUSED)]
        http, grpc = _clients(handle.http_url, handle.grpc_url)
        try:
            for protocol in ("http", "grpc"):
                module = handle.module(protocol)
                inputs = [_tensor(module, "INPUT0", np.ones(16, np.float32)), _tensor(module, "INPUT1", np.ones(16, np.float32))]
                with pytest.raises(InferenceServerException) as refused:
                    (http if protocol == "http" else grpc).infer(f"addsub_plain_{protocol}", inputs)
                assert refused.value.message() == REFUSED
                assert refused.value.status() == ("400" if protocol == "http" else "StatusCode.INVALID_ARGUMENT")
            # the model still serves: its next request is not rescheduled (the model reschedules its first only)
            inputs = [_tensor(grpc_module(), "INPUT0", np.ones(16, np.float32)),
                      _tensor(grpc_module(), "INPUT1", np.ones(16, np.float32))]
            assert grpc.infer("addsub_plain_grpc", inputs).as_numpy("OUTPUT0").tolist() == [2.0] * 16
        finally:
            http.close()
            grpc.close()
    finally:
        thread.stop()
