"""Sequences waiting for a slot of the sequence batcher (every slot held) when their model is unloaded (explicit model
control), direct and oldest strategies, over HTTP and gRPC, side by side with tritonserver 2.51.

Triton 2.51 (core r24.10 ``sequence_batch_scheduler.cc``): the unload answers at once and the version stays
``UNLOADING`` while requests hold it; the backlog is not failed. No request reaches the slotted sequence any more (its
model is not found), so the reaper releases it once it idled ``max_sequence_idle_microseconds``, and the backlogged
sequences take the slot in turn and run: their clients get their answers, each counted a success; no failure of any
reason is counted. Ferry answered them 503 ``model '<m>' is unloading`` and counted them nowhere; its unload waits for
the drain (Triton's does not), so it hands the slot of a sequence with nothing queued to the backlog at once instead
of after its idle time (``schedulers.sequence``). Requests that arrive after the unload get Triton's 404 in both.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support.python_models import in_out_config
from support.server import write_model

STRATEGIES = {"direct": "direct { }", "oldest": "oldest { max_candidate_sequences: 1 }"}

MODEL_PY = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        inputs = [pb_utils.get_input_tensor_by_name(request, "IN").as_numpy() for request in requests]
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", x)]) for x in inputs]
'''

#: the requests that wait for the slot sequence 1 holds: (key, sequence id, value, start, end), sent in this order
WAITING = (("seq2_start", 2, 20, True, False), ("seq2_end", 2, 21, False, True), ("seq3_start", 3, 30, True, False))
#: how long the requests are given to reach the backlog, one after the other (no timing is asserted)
_SETTLE_S = 0.15

_NOT_FOUND = "Request for unknown model: '{model}' has no available versions"
#: recorded from tritonserver 2.51 (test_triton_runs_the_backlog_of_an_unloaded_sequence_model), the same for each
#: strategy and protocol but the words' model name: every waiting request answered, the slot holder's next request
#: and a new sequence after the unload refused as for a model that is not loaded; the four requests count successes
EXPECTED: dict[str, Any] = {
    "waiting": {"seq2_start": [[20]], "seq2_end": [[21]], "seq3_start": [[30]]},
    "after_unload": {"http": ["404", _NOT_FOUND], "grpc": ["StatusCode.NOT_FOUND", _NOT_FOUND]},
    "counted": {"success": 4, "inference_count": 4,
                "failures": {"BACKEND": 0, "CANCELED": 0, "OTHER": 0, "REJECTED": 0}},
}


def _name(strategy: str) -> str:
    return f"seq_{strategy}"


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("sequence_unload_backlog")
    for strategy, text in STRATEGIES.items():
        scheduling = f"sequence_batching {{ max_sequence_idle_microseconds: 300000 {text} }}"
        config = in_out_config(_name(strategy), 1, scheduling)
        write_model(root, _name(strategy), config, {"1/model.py": MODEL_PY})
    return root


def _ask(protocol: str, url: str, model: str, sequence_id: int, value: int, start: bool = False,
         end: bool = False) -> Any:
    """OUT of one request, or the error's status and message."""
    from tritonclient.utils import InferenceServerException

    if protocol == "http":
        import tritonclient.http as module

        client: Any = module.InferenceServerClient(url, network_timeout=60.0, connection_timeout=60.0)
    else:
        import tritonclient.grpc as module  # type: ignore[no-redef]

        client = module.InferenceServerClient(url)
    tensor = module.InferInput("IN", [1, 1], "INT32")
    tensor.set_data_from_numpy(np.array([[value]], np.int32))
    try:
        result = client.infer(model, [tensor], sequence_id=sequence_id, sequence_start=start, sequence_end=end)
        return result.as_numpy("OUT").tolist()
    except InferenceServerException as exc:
        return [str(exc.status()), exc.message()]


def _unload_with_a_backlog(protocol: str, urls: dict[str, str], model: str) -> dict[str, Any]:
    """Sequence 1 takes the only slot; ``WAITING`` queue behind it; the model is unloaded. What each client got."""
    import tritonclient.http as httpclient

    url = urls[protocol]
    assert _ask(protocol, url, model, 1, 1, start=True) == [[1]]
    waiting: dict[str, Any] = {}
    threads = []
    for key, sequence_id, value, start, end in WAITING:
        thread = threading.Thread(target=lambda *a: waiting.__setitem__(a[0], _ask(protocol, url, model, *a[1:])),
                                  args=(key, sequence_id, value, start, end))
        thread.start()
        threads.append(thread)
        time.sleep(_SETTLE_S)
    httpclient.InferenceServerClient(urls["http"]).unload_model(model)
    after = {"next_of_seq1": _ask(protocol, url, model, 1, 2), "new_seq": _ask(protocol, url, model, 4, 40, start=True)}
    for thread in threads:
        thread.join(30)
    assert after["next_of_seq1"] == after["new_seq"]
    return {"waiting": waiting, "after_unload": after["new_seq"]}


def _expected(protocol: str, model: str) -> dict[str, Any]:
    status, words = EXPECTED["after_unload"][protocol]
    return {"waiting": EXPECTED["waiting"], "after_unload": [status, words.format(model=model)]}


@pytest.mark.parametrize("strategy", list(STRATEGIES))
@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_an_unload_runs_the_sequences_waiting_for_a_slot(threaded_server: Any, repository: Path, protocol: str,
                                                         strategy: str) -> None:
    """Each waiting request gets its answer (Ferry answered 503 'is unloading' and counted nothing); the four requests
    count successes, no failure of any reason."""
    model = _name(strategy)
    server = threaded_server([repository], model_control_mode="explicit", load_models=(model,))
    stats = server.engine.registry.entries[model].ready[0].stats  # what the metrics show; gone with the version
    urls = {"http": server.http_url, "grpc": server.grpc_url}
    assert _unload_with_a_backlog(protocol, urls, model) == _expected(protocol, model)
    counted = {"success": stats.success.count, "inference_count": stats.inference_count,
               "failures": dict(stats.failures)}
    assert counted == EXPECTED["counted"] and stats.fail.count == 0


@pytest.mark.slow  # live tritonserver: with -m slow
@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_triton_runs_the_backlog_of_an_unloaded_sequence_model(repository: Path, protocol: str) -> None:
    """Side by side with Triton 2.51 (skipped where it cannot be had): the answers ``EXPECTED`` records; the counts
    read from the metrics while the version is still UNLOADING (it is, a while after the last answer)."""
    import httpx

    from support.triton import running_triton

    models = [_name(strategy) for strategy in STRATEGIES]
    with running_triton(repository, models) as (http, grpc, metrics):
        urls = {"http": f"127.0.0.1:{http}", "grpc": f"127.0.0.1:{grpc}"}
        for model in models:
            assert _unload_with_a_backlog(protocol, urls, model) == _expected(protocol, model)
            counted: dict[str, Any] = {"failures": {}}
            for line in httpx.get(f"http://127.0.0.1:{metrics}/metrics", timeout=30).text.splitlines():
                if f'model="{model}"' not in line:
                    continue
                value = int(float(line.rsplit(" ", 1)[1]))
                if line.startswith("nv_inference_request_success{"):
                    counted["success"] = value
                elif line.startswith("nv_inference_count{"):
                    counted["inference_count"] = value
                elif line.startswith("nv_inference_request_failure{"):
                    counted["failures"][line.split('reason="')[1].split('"')[0]] = value
            assert counted == EXPECTED["counted"]
