"""The sequence batcher in depth, side by side with NVIDIA Triton 2.51: which requests share an execution.

One python model (``seq_depth`` of tests/serving_pod/data/sequence, one instance, each execution sleeping
``delay_ms``) answers every request with the whole batch it ran in: READY, CORRID, INPUT, START and END of each
request, in slot order. Variants of it cover the direct strategy (null slots with READY=0 below the highest busy
slot; ``max_queue_delay_microseconds`` with ``minimum_slot_utilization``), the oldest strategy (batches capped at
the largest ``preferred_batch_size``, ``max_candidate_sequences`` with a backlog, ``max_queue_delay_microseconds``),
more sequences than slots, ``max_sequence_idle_microseconds`` expiry, a START for an id that is still active, the
errors (no id, id 0, no START), unloading a model with active sequences, and statistics / ``nv_*`` metric deltas.
Requests are sent on a timeline whose steps fall mid-execution (hundreds of milliseconds from any batch edge), so
outcomes, never durations, are compared; every case runs over HTTP and gRPC against Ferry and Triton.

Not compared, on purpose (Ferry's behaviour is asserted alone):

- INPUT of a null slot: Triton hands the model uninitialised memory there, Ferry zeros.
- A CORRID control of TYPE_STRING: Triton 2.51 fails every request of such a model with "unexpected number of
  string elements 2 for inference input 'CORRID', expecting 1" (over gRPC an integer id even reads past the buffer:
  "expecting string of length 1071 but only 128 bytes available"); Ferry feeds the string id.
- Implicit state with a python model: Triton 2.51's python backend never updates a state (no
  ``TRITONBACKEND_StateUpdate``), so the model sees the initial state on every request; Ferry carries the state
  output into the sequence's next request, as Triton does for backends that update state.
- Response order on a gRPC stream is the grpc/ adapter's business (Triton writes a refused request's error in
  request order, after earlier responses); only the set of outcomes is compared there.
"""

from __future__ import annotations

import json
import queue
import re
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from tritonclient.utils import InferenceServerException

DATA = Path(__file__).resolve().parents[1] / "data" / "sequence"
S, E = {"sequence_start": True}, {"sequence_end": True}
SE = {"sequence_start": True, "sequence_end": True}
PROTOCOLS = ("http", "grpc")

#: model -> edit of seq_depth's config.pbtxt (the model's name is set by ``_repository``)
VARIANTS: dict[str, Callable[[str], str]] = {
    "seq_direct": lambda c: c,
    "seq_oldest": lambda c: c.replace(
        "max_sequence_idle_microseconds: 30000000", "max_sequence_idle_microseconds: 30000000\n  oldest { "
        "max_candidate_sequences: 3 preferred_batch_size: [ 2 ] max_queue_delay_microseconds: 0 }"),
    "seq_backlog": lambda c: c.replace("max_batch_size: 4", "max_batch_size: 2"),
    "seq_oldest_delay": lambda c: c.replace('"600"', '"200"').replace(
        "max_sequence_idle_microseconds: 30000000", "max_sequence_idle_microseconds: 30000000\n  oldest { "
        "max_candidate_sequences: 4 preferred_batch_size: [ 2 ] max_queue_delay_microseconds: 800000 }"),
    "seq_direct_delay": lambda c: c.replace('"600"', '"200"').replace(
        "max_sequence_idle_microseconds: 30000000", "max_sequence_idle_microseconds: 30000000\n  direct { "
        "max_queue_delay_microseconds: 800000 minimum_slot_utilization: 0.5 }"),
    "seq_idle": lambda c: c.replace("30000000", "1000000").replace('"600"', '"100"'),
    "seq_fast": lambda c: c.replace('"600"', '"50"'),
    "seq_stats": lambda c: c,
    "seq_unload": lambda c: c,
    "seq_string": lambda c: c.replace("TYPE_UINT64", "TYPE_STRING").replace('"600"', '"50"'),
    "seq_state": lambda c: c.replace('"600"', '"50"').replace("  ]\n}", """  ]
  state [ { input_name: "ACC_IN" output_name: "ACC_OUT" data_type: TYPE_INT32 dims: [ 1 ]
            initial_state { data_type: TYPE_INT32 dims: [ 1 ] zero_data: true name: "zero" } } ]
}""", 1),
}
TRITON_MODELS = [m for m in VARIANTS if m not in ("seq_string", "seq_state")]

#: scenario -> (model, [(seconds from start, sequence id, INPUT, parameters)]); ids are offset per protocol.
#: Executions of 600 ms start at 0, 0.6, 1.2, ...: a step at 0.25 / 0.85 / 1.45 queues for the next one.
SCENARIOS: dict[str, tuple[str, list[tuple[float, Any, int, dict]]]] = {
    # slots 0..2 (A, B, C), then D takes C's freed slot 2: null slots below the highest busy one have READY=0
    "direct": ("seq_direct", [
        (0.0, 11, 1, S),
        (0.25, 12, 2, S), (0.3, 13, 3, S),
        (0.85, 11, 4, {}), (0.9, 13, 5, E),
        (1.45, 14, 6, S), (1.5, 12, 7, E),
        (2.05, 11, 8, E), (2.1, 14, 9, E),
    ]),
    # 3 candidates, the 4th sequence waits for a slot; a batch never passes the preferred size 2
    "oldest": ("seq_oldest", [
        (0.0, 21, 1, S),
        (0.25, 22, 2, S), (0.3, 23, 3, S), (0.35, 24, 4, S),
        (0.85, 21, 5, E),
        (2.05, 22, 6, E), (2.1, 23, 7, E), (2.15, 24, 8, E),
    ]),
    # 2 slots, 3 sequences: the third takes slot 0 once the first ends
    "backlog": ("seq_backlog", [
        (0.0, 31, 1, S), (0.1, 32, 2, S), (0.15, 33, 3, S),
        (0.85, 33, 4, {}), (0.9, 31, 5, E),
        (2.05, 32, 6, E), (2.65, 33, 7, E),
    ]),
    # the first request waits (up to 800 ms) for a second; the last one waits alone
    "oldest_delay": ("seq_oldest_delay", [(0.0, 91, 1, S), (0.3, 92, 2, S), (1.0, 93, 3, S),
                                          (2.2, 91, 4, E), (2.25, 92, 5, E), (2.3, 93, 6, E)]),
    "direct_delay": ("seq_direct_delay", [(0.0, 94, 1, S), (0.3, 95, 2, S), (1.0, 96, 3, S),
                                          (2.2, 94, 4, E), (2.25, 95, 5, E), (2.3, 96, 6, E)]),
    # idle for 1 s: released; the next request needs START again
    "idle": ("seq_idle", [(0.0, 81, 1, S), (2.6, 81, 2, {}), (2.9, 81, 3, S), (3.2, 81, 4, E), (3.5, 81, 5, E)]),
    # a START for an id still active restarts it in the same slot; the errors
    "restart": ("seq_fast", [(0.0, 51, 1, S), (0.3, 51, 2, S), (0.6, 51, 3, {}), (0.9, 51, 4, E), (1.2, 51, 5, {})]),
    "errors": ("seq_fast", [(0.0, None, 1, {}), (0.3, 61, 1, SE), (0.6, 62, 1, {}), (0.9, 63, 1, E),
                            (1.2, 0, 1, S), (1.5, None, 1, SE)]),
}


def _repository(root: Path) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    source = DATA / "seq_depth"
    for name, edit in VARIANTS.items():
        shutil.copytree(source, root / name, ignore=shutil.ignore_patterns("__pycache__"))
        config = (source / "config.pbtxt").read_text().replace('name: "seq_depth"', f'name: "{name}"')
        (root / name / "config.pbtxt").write_text(edit(config))
    return root


class Clients:
    """tritonclient modules and client factories for one server."""

    def __init__(self, http_url: str, grpc_url: str, metrics_url: str) -> None:
        self.urls = {"http": http_url, "grpc": grpc_url}
        self.metrics_url = metrics_url

    def module(self, protocol: str) -> Any:
        import tritonclient.grpc as grpcclient
        import tritonclient.http as httpclient

        return httpclient if protocol == "http" else grpcclient

    def client(self, protocol: str) -> Any:
        module = self.module(protocol)
        if protocol == "http":
            return module.InferenceServerClient(self.urls["http"], network_timeout=60.0)
        return module.InferenceServerClient(self.urls["grpc"])


def _send(clients: Clients, protocol: str, client: Any, model: str, sequence_id: Any, value: int,
          parameters: dict) -> Any:
    module = clients.module(protocol)
    tensor = module.InferInput("INPUT", [1, 1], "INT32")
    tensor.set_data_from_numpy(np.full([1, 1], value, np.int32))
    kwargs = dict(parameters)
    if sequence_id is not None:
        kwargs["sequence_id"] = sequence_id
    try:
        result = client.infer(model, [tensor], **kwargs)
    except InferenceServerException as error:
        return ("error", error.message())
    return _report(result.as_numpy("OUT"))


def _report(out: np.ndarray) -> Any:
    """(position, batch) with a null slot's INPUT dropped (Triton leaves it uninitialised); state when there is one."""
    report = json.loads(out.reshape(-1)[0])
    batch = [row if row[0] else [row[0], row[1], None, row[3], row[4]] for row in report["batch"]]
    if "state" in report:
        return ("ok", report["position"], batch, report["state"])
    return ("ok", report["position"], batch)


def _offset(sequence_id: Any, protocol: str) -> Any:
    if protocol == "http" or not sequence_id:
        return sequence_id
    return sequence_id + 1000 if isinstance(sequence_id, int) else sequence_id + "-grpc"


def _timeline(clients: Clients, protocol: str, model: str, steps: list) -> list:
    results: list = [None] * len(steps)
    t0 = time.monotonic()

    def one(index: int, offset_s: float, sequence_id: Any, value: int, parameters: dict) -> None:
        time.sleep(max(0.0, t0 + offset_s - time.monotonic()))
        client = clients.client(protocol)
        try:
            results[index] = _send(clients, protocol, client, model, _offset(sequence_id, protocol), value, parameters)
        finally:
            client.close()

    threads = [threading.Thread(target=one, args=(i, *step)) for i, step in enumerate(steps)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


# --- statistics and metrics --------------------------------------------------------------------------------------
_METRICS = ("nv_inference_request_success", "nv_inference_request_failure", "nv_inference_count",
            "nv_inference_exec_count", "nv_inference_pending_request_count")


def _statistics(clients: Clients, model: str) -> dict:
    client = clients.client("http")
    try:
        stats = client.get_inference_statistics(model)["model_stats"][0]
    finally:
        client.close()
    inference = stats["inference_stats"]
    summary: dict = {"inference_count": stats["inference_count"], "execution_count": stats["execution_count"]}
    summary.update({key: inference[key]["count"] for key in ("success", "fail", "queue", "compute_input",
                                                             "compute_infer", "compute_output")})
    summary["batch_stats"] = {b["batch_size"]: b["compute_infer"]["count"] for b in stats.get("batch_stats", [])}
    return summary


def _metrics(url: str, model: str) -> dict[str, float]:
    found: dict[str, float] = {}
    for line in httpx.get(url, timeout=30.0).text.splitlines():
        name = line.split("{", 1)[0]
        if name in _METRICS and f'model="{model}"' in line:
            reason = re.search(r'reason="([^"]*)"', line)
            found[name + (f":{reason.group(1)}" if reason else "")] = float(line.rsplit(" ", 1)[1])
    return found


def _delta(before: dict, after: dict) -> dict:
    out = {}
    for key in set(before) | set(after):
        old, new = before.get(key, 0), after.get(key, 0)
        out[key] = {k: new.get(k, 0) - old.get(k, 0) for k in new} if isinstance(new, dict) else new - old
    return out


STATS_STEPS = [(0.0, 41, 1, S), (0.25, 42, 2, S), (0.3, 43, 3, S), (0.85, 41, 4, E), (0.9, 42, 5, E),
               (0.95, 43, 6, E), (1.6, 44, 1, {}), (1.7, None, 1, {}), (1.8, 45, 1, SE)]


def _stats_case(clients: Clients, protocol: str) -> dict:
    before = (_statistics(clients, "seq_stats"), _metrics(clients.metrics_url, "seq_stats"))
    results = _timeline(clients, protocol, "seq_stats", STATS_STEPS)
    after = (_statistics(clients, "seq_stats"), _metrics(clients.metrics_url, "seq_stats"))
    return {"results": results, "statistics": _delta(before[0], after[0]), "metrics": _delta(before[1], after[1])}


# --- unload ------------------------------------------------------------------------------------------------------
def _unload_case(clients: Clients, protocol: str) -> list:
    """A sequence left active, one executing and one queued when the model unloads; after, and after a reload."""
    base = 0 if protocol == "http" else 1000
    control = clients.client(protocol)
    outcomes = [_send(clients, protocol, control, "seq_unload", base + 1, 1, S)]
    box: dict = {}

    def later(key: str, sequence_id: int, parameters: dict) -> None:
        client = clients.client(protocol)
        try:
            box[key] = _send(clients, protocol, client, "seq_unload", sequence_id, 2, parameters)
        finally:
            client.close()

    threads = [threading.Thread(target=later, args=("executing", base + 2, S)),
               threading.Thread(target=later, args=("queued", base + 1, {}))]
    for thread in threads:
        thread.start()
        time.sleep(0.1)
    time.sleep(0.1)
    control.unload_model("seq_unload")
    for thread in threads:
        thread.join()
    outcomes += [box["executing"], box["queued"]]
    outcomes.append(_send(clients, protocol, control, "seq_unload", base + 1, 3, {}))
    control.load_model("seq_unload")
    outcomes.append(_send(clients, protocol, control, "seq_unload", base + 1, 4, {}))
    outcomes.append(_send(clients, protocol, control, "seq_unload", base + 1, 5, SE))
    control.close()
    return outcomes


def _run_all(clients: Clients) -> dict:
    outcomes: dict = {}
    for protocol in PROTOCOLS:
        for name, (model, steps) in SCENARIOS.items():
            outcomes[protocol, name] = _timeline(clients, protocol, model, steps)
        outcomes[protocol, "stats"] = _stats_case(clients, protocol)
        outcomes[protocol, "unload"] = _unload_case(clients, protocol)
    return outcomes


@pytest.fixture(scope="module")
def repository(tmp_path_factory) -> Path:
    return _repository(tmp_path_factory.mktemp("sequence_depth"))


@pytest.fixture(scope="module")
def ferry(repository: Path):
    from support.server import ServerThread, make_options

    thread = ServerThread(make_options([repository], model_control_mode="explicit", load_models=tuple(VARIANTS)))
    handle = thread.start()
    try:
        yield Clients(handle.http_url, handle.grpc_url, handle.metrics_url)
    finally:
        thread.stop()


@pytest.fixture(scope="module")
def ferry_outcomes(ferry: Clients) -> dict:
    return _run_all(ferry)


@pytest.fixture(scope="module")
def triton_outcomes(repository: Path) -> dict:
    from support.triton import running_triton

    with running_triton(repository, TRITON_MODELS) as (http, grpc, metrics):
        return _run_all(Clients(f"127.0.0.1:{http}", f"127.0.0.1:{grpc}", f"http://127.0.0.1:{metrics}/metrics"))


# --- side by side ------------------------------------------------------------------------------------------------
@pytest.mark.slow  # live tritonserver side by side: with -m slow (the fixes have fast tests in test_sequence_batches)
@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_batches_match_triton(scenario: str, protocol: str, ferry_outcomes: dict, triton_outcomes: dict) -> None:
    steps = SCENARIOS[scenario][1]
    for step, theirs, ours in zip(steps, triton_outcomes[protocol, scenario], ferry_outcomes[protocol, scenario]):
        assert ours == theirs, (scenario, protocol, step)


@pytest.mark.slow  # runs every timeline (about a minute) for one check; test_sequence_batches has the fast one
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_oldest_batches_stop_at_the_largest_preferred_size(protocol: str, ferry_outcomes: dict) -> None:
    """What Triton 2.51 does with preferred_batch_size [ 2 ] and three heads ready: 2, then 1 (Ferry's own run)."""
    base = 0 if protocol == "http" else 1000
    last = ferry_outcomes[protocol, "oldest"][-3:]  # the ENDs of 22, 23 and 24, sent together
    assert [[row[1] for row in outcome[2]] for outcome in last] == [[base + 22, base + 23]] * 2 + [[base + 24]]


@pytest.mark.slow  # live tritonserver side by side: with -m slow (the fixes have fast tests in test_sequence_batches)
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_statistics_and_metrics_match_triton(protocol: str, ferry_outcomes: dict, triton_outcomes: dict) -> None:
    ours, theirs = ferry_outcomes[protocol, "stats"], triton_outcomes[protocol, "stats"]
    assert ours["results"] == theirs["results"]
    # the padded direct batch [null, B, C] is batch_stats size 3; inference_count counts 2 for it
    assert theirs["statistics"]["batch_stats"].get(3) == 2 and theirs["statistics"]["inference_count"] == 7
    assert ours["statistics"] == theirs["statistics"]
    assert ours["metrics"] == theirs["metrics"]


@pytest.mark.slow  # live tritonserver side by side: with -m slow (the fixes have fast tests in test_sequence_batches)
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_unload_with_active_sequences_matches_triton(protocol: str, ferry_outcomes: dict,
                                                     triton_outcomes: dict) -> None:
    assert ferry_outcomes[protocol, "unload"] == triton_outcomes[protocol, "unload"]


# --- Ferry alone (module docstring) ------------------------------------------------------------------------------
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_string_correlation_ids(protocol: str, ferry: Clients) -> None:
    client = ferry.client(protocol)
    key = f"session-{protocol}"
    try:
        outcomes = [_send(ferry, protocol, client, "seq_string", *step) for step in [
            (key, 1, S), (key, 2, {}), (key + "-other", 3, {}), (key, 4, E), (7, 5, S), ("", 6, S)]]
    finally:
        client.close()
    assert outcomes == [
        ("ok", 0, [[1, key, 1, 1, 0]]),
        ("ok", 0, [[1, key, 2, 0, 0]]),
        ("error", (f"inference request for sequence {key}-other to model 'seq_string' must specify the START "
                   "flag on the first request of the sequence")),
        ("ok", 0, [[1, key, 4, 0, 1]]),
        ("error", "sequence batching control 'CORRID' data-type is 'UINT64', but model 'seq_string' expects 'BYTES'"),
        ("error", "inference request to model 'seq_string' must specify a non-zero or non-empty correlation ID"),
    ]


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_implicit_state_is_carried_and_restarts(protocol: str, ferry: Clients) -> None:
    client = ferry.client(protocol)
    key = 70 if protocol == "http" else 1070
    try:
        outcomes = [_send(ferry, protocol, client, "seq_state", key, value, parameters)
                    for value, parameters in [(1, S), (2, {}), (3, S), (4, {}), (5, E)]]
    finally:
        client.close()
    # ACC_IN: initial 0, then the running sum; a START for the active id starts from the initial state again
    assert [outcome[3] for outcome in outcomes] == [0, 1, 0, 3, 7]
    assert all(outcome[0] == "ok" for outcome in outcomes)


@pytest.mark.slow  # live tritonserver side by side: with -m slow (the fixes have fast tests in test_sequence_batches)
def test_grpc_stream_outcomes_match_triton(repository: Path, ferry: Clients) -> None:
    from support.triton import running_triton

    def run(url: str) -> list:
        import tritonclient.grpc as grpcclient

        client = grpcclient.InferenceServerClient(url)
        answers: queue.Queue = queue.Queue()
        client.start_stream(callback=lambda result, error: answers.put((result, error)))
        sends = [(5001, S), (5001, {}), (5002, {}), (None, {}), (5003, SE), (5001, E), (5001, {})]
        try:
            for index, (sequence_id, parameters) in enumerate(sends):
                tensor = grpcclient.InferInput("INPUT", [1, 1], "INT32")
                tensor.set_data_from_numpy(np.full([1, 1], index, np.int32))
                kwargs = dict(parameters, sequence_id=sequence_id) if sequence_id else dict(parameters)
                client.async_stream_infer("seq_direct", [tensor], request_id=str(index), **kwargs)
                if index == 0:
                    time.sleep(0.25)  # mid-execution of the START: the rest queue for the next batches
            outcomes = []
            for _ in sends:
                result, error = answers.get(timeout=60)
                if error is not None:
                    outcomes.append(("error", "", error.message()))
                else:
                    outcomes.append(("ok", result.get_response().id, repr(_report(result.as_numpy("OUT")))))
        finally:
            client.stop_stream()
            client.close()
        return sorted(outcomes)

    ours = run(ferry.urls["grpc"])
    with running_triton(repository, ["seq_direct"]) as (_, grpc, _):
        theirs = run(f"127.0.0.1:{grpc}")
    assert ours == theirs
