"""The dynamic batcher and its queue policies beside NVIDIA Triton 2.51: the same requests, the same outcomes.

One python model (``dyn_probe`` of tests/serving_pod/data/dynamic) reports, for every request, which execution
ran it, how many requests that execution had and the request's place in it. A request whose first value is -1
holds its instance until the test opens a gate (a file), so the requests sent meanwhile wait in the queue
(``nv_inference_pending_request_count`` tells when they are all there) and the batches formed when the gate
opens do not depend on timing. Each case runs over HTTP and gRPC against Ferry always, and against Triton where
the installer can have it; outcomes (answers, error codes and words, statistics and metric deltas, which configs
load) must equal ``EXPECTED`` (Triton's) for both. Execution numbers are counted from the holding execution.

Covered: ``max_queue_size`` (Triton's refusal starts with ``[request id: <id>] ``, ``<id_unknown>`` without an
id, and is charged to no statistic or failure metric; a response cache hit is still answered), per-level
``priority_queue_policy``, ``timeout_action`` REJECT and DELAY (a DELAYed request still counts toward the
queue size), ``default_timeout_microseconds`` with and without ``allow_timeout_override`` (a request
``timeout`` only shortens a non-zero default), ``priority_levels`` with a request priority of 0 or above the
levels (the default level), rows filling ``max_batch_size``, ``preferred_batch_size`` with and without a queue
delay, Triton's prefetching (without a queue policy the batch waiting for an instance grows past a preferred
size: preferred [4] and 8 queued give 5 then 3; with one, 3 then 2 for preferred [2, 3]), different shapes on
a variable dim (never one batch; ``allow_ragged_batch`` lifts that), different optional input sets, batch
statistics and ``nv_inference_*`` counts, ``preserve_ordering``, requests queued while their model unloads,
and which bad ``dynamic_batching`` configs are refused at load (``preserve_ordering`` with a DELAY policy that
has a timeout among them).

Kept different on purpose, so not compared: why a load is refused (Triton answers "failed to load '<m>', failed
to poll from model repository" with 500 and logs the reason; Ferry answers 400 with the reason); a negative ``priority`` / ``timeout`` (Triton: 500 over HTTP, accepted over gRPC; Ferry: 400 /
INVALID_ARGUMENT); a queued request whose gRPC client gave up (deadline): Triton 2.51 still runs it and counts
a success, Ferry drops it unrun and counts it failed (reason CANCELED).
"""

from __future__ import annotations

import re
import shutil
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tritonclient.utils import InferenceServerException

PROBE = Path(__file__).resolve().parents[1] / "data" / "dynamic" / "dyn_probe"
WAIT_S = 30.0

#: model name -> (dynamic_batching body, max_batch_size, instances, allow_ragged_batch)
MODELS: dict[str, tuple[str, int, int, bool]] = {
    "qfull": ("default_queue_policy { max_queue_size: 2 }", 4, 1, False),
    "cached": ("default_queue_policy { max_queue_size: 1 }", 4, 1, False),  # with response_cache
    "prioq": (("priority_levels: 2 default_priority_level: 2 default_queue_policy { max_queue_size: 3 } "
              "priority_queue_policy { key: 1 value { max_queue_size: 1 } }"), 1, 1, False),
    "reject": (("default_queue_policy { timeout_action: REJECT default_timeout_microseconds: 100000 "
               "allow_timeout_override: true }"), 4, 1, False),
    "delay": (("default_queue_policy { timeout_action: DELAY default_timeout_microseconds: 20000000 "
              "allow_timeout_override: true }"), 1, 1, False),
    "delayfull": (("default_queue_policy { timeout_action: DELAY default_timeout_microseconds: 20000000 "
                  "allow_timeout_override: true max_queue_size: 2 }"), 1, 1, False),
    "nodefault": ("default_queue_policy { timeout_action: REJECT allow_timeout_override: true }", 1, 1, False),
    "nooverride": ("default_queue_policy { timeout_action: REJECT default_timeout_microseconds: 20000000 }",
                   1, 1, False),
    "prio": ("priority_levels: 3 default_priority_level: 2", 1, 1, False),
    "unbatched": ("default_queue_policy { max_queue_size: 1 }", 0, 1, False),
    "shapes": ("", 4, 1, False),
    "fill": ("", 4, 1, False),
    "preferred": ("preferred_batch_size: [ 2 ]", 4, 1, False),
    "preferred_delay": ("preferred_batch_size: [ 2, 3 ] max_queue_delay_microseconds: 2000000", 4, 1, False),
    "preferred_past": ("preferred_batch_size: [ 4 ] max_queue_delay_microseconds: 2000000", 8, 1, False),
    "preferred_delay_policy": (("preferred_batch_size: [ 2, 3 ] max_queue_delay_microseconds: 2000000 "
                               "default_queue_policy { max_queue_size: 100 }"), 4, 1, False),
    "ragged": ("", 4, 1, True),
    "optional": ("", 4, 1, False),  # with an optional INPUT1
    "stats": ("", 4, 1, False),
    "unload": ("", 4, 1, False),
    "ordered": ("preserve_ordering: true", 1, 2, False),
    "unordered": ("", 1, 2, False),
}
#: model name -> (dynamic_batching body, max_batch_size); loaded over the client, one by one
LOADS: dict[str, tuple[str, int]] = {
    "bad_preferred_above_max": ("preferred_batch_size: [ 8 ]", 4),
    "bad_preferred_zero": ("preferred_batch_size: [ 0 ]", 4),
    "bad_preferred_unbatched": ("preferred_batch_size: [ 2 ]", 0),
    "bad_default_level_zero": ("priority_levels: 2 default_priority_level: 0", 4),
    "bad_default_level_above": ("priority_levels: 2 default_priority_level: 3", 4),
    "bad_policy_level_above": (("priority_levels: 2 default_priority_level: 1 "
                               "priority_queue_policy { key: 3 value { max_queue_size: 1 } }"), 4),
    "bad_policy_level_zero": (("priority_levels: 2 default_priority_level: 1 "
                              "priority_queue_policy { key: 0 value { max_queue_size: 1 } }"), 4),
    # preserve_ordering with a DELAY policy that can time out (the default one, or a level's), recorded live
    "bad_ordered_delay": ("preserve_ordering: true default_queue_policy { timeout_action: DELAY "
                          "default_timeout_microseconds: 100 }", 4),
    "bad_ordered_level_delay": (("preserve_ordering: true priority_levels: 1 default_priority_level: 1 "
                                 "priority_queue_policy { key: 1 value { timeout_action: DELAY "
                                 "default_timeout_microseconds: 5 } }"), 4),
    "ok_ordered_delay_without_timeout": ("preserve_ordering: true default_queue_policy { timeout_action: DELAY }", 4),
    "ok_unbatched": ("", 0),
    "ok_default_level_without_levels": ("default_priority_level: 5", 4),
    "ok_repeated_preferred": ("preferred_batch_size: [ 2, 2, 4 ] max_queue_delay_microseconds: 100", 4),
    # without priority levels a priority queue policy is ignored (it loads)
    "ok_policy_without_levels": ("priority_queue_policy { key: 3 value { max_queue_size: 1 } }", 4),
}

FULL = "Exceeds maximum queue size"
EXPIRED = "Request timeout expired"
UNKNOWN = "[request id: <id_unknown>] "


def _ok(execution: int, size: int, position: int) -> tuple:
    return ("ok", execution, size, position)


def _error(code: str, message: str) -> tuple:
    return ("error", code, message)


EXPECTED: dict[str, Any] = {
    "queue_full": {
        "hold": _ok(0, 1, 0), "a": _ok(1, 2, 0), "b": _ok(1, 2, 1),
        "c": _error("UNAVAILABLE", f"[request id: req-c] {FULL}"), "d": _error("UNAVAILABLE", UNKNOWN + FULL),
        "charged": {"fail": 0, "REJECTED": 0, "success": 3, "queue": 3, "pending": 0},
    },
    "queue_full_cached": {
        "first": _ok(-1, 1, 0), "hold": _ok(0, 1, 0), "a": _ok(1, 1, 0), "hit": _ok(-1, 1, 0),
        "miss": _error("UNAVAILABLE", UNKNOWN + FULL),
        "charged": {"success": 4, "fail": 0, "cache_hit": 1, "cache_miss": 3},
    },
    "queue_full_per_level": {
        "hold": _ok(0, 1, 0), "h1": _ok(1, 1, 0), "h2": _error("UNAVAILABLE", UNKNOWN + FULL),
        "l1": _ok(2, 1, 0), "l2": _ok(3, 1, 0), "l3": _ok(4, 1, 0), "l4": _error("UNAVAILABLE", UNKNOWN + FULL),
    },
    "timeout_reject": {
        "hold": _ok(0, 1, 0), "a": _error("UNAVAILABLE", EXPIRED), "b": _error("UNAVAILABLE", EXPIRED),
        "charged": {"fail": 2, "REJECTED": 2, "success": 1, "queue": 1, "pending": 0},
    },
    "timeout_delay": {"hold": _ok(0, 1, 0), "b": _ok(1, 1, 0), "a": _ok(2, 1, 0), "c": _ok(3, 1, 0)},
    "timeout_delay_full": {
        "hold": _ok(0, 1, 0), "b": _ok(1, 1, 0), "a": _ok(2, 1, 0), "c": _error("UNAVAILABLE", UNKNOWN + FULL),
    },
    "timeout_without_default": {"hold": _ok(0, 1, 0), "a": _ok(1, 1, 0)},
    "timeout_without_override": {"hold": _ok(0, 1, 0), "a": _ok(1, 1, 0)},
    "priority": {
        "hold": _ok(0, 1, 0), "p1": _ok(1, 1, 0), "p0": _ok(2, 1, 0), "p2": _ok(3, 1, 0), "p7": _ok(4, 1, 0),
        "none": _ok(5, 1, 0), "p3": _ok(6, 1, 0),
    },
    "shapes": {
        "hold": _ok(0, 1, 0), "a": _ok(1, 1, 0), "b": _ok(2, 1, 0), "c": _ok(3, 3, 0), "d": _ok(3, 3, 1),
        "e": _ok(3, 3, 2),
    },
    "unbatched": {"hold": _ok(0, 1, 0), "a": _ok(1, 1, 0), "b": _error("UNAVAILABLE", UNKNOWN + FULL)},
    "fill": {"hold": _ok(0, 1, 0), "a": _ok(1, 1, 0), "b": _ok(2, 2, 0), "c": _ok(2, 2, 1)},
    "preferred": {"hold": _ok(0, 1, 0), "a": _ok(1, 2, 0), "b": _ok(1, 2, 1), "c": _ok(2, 1, 0)},
    # prefetching (no queue policy): the waiting batch grows past the preferred size 3 by the next request
    "preferred_delay": {
        "hold": _ok(0, 1, 0), "a": _ok(1, 4, 0), "b": _ok(1, 4, 1), "c": _ok(1, 4, 2), "d": _ok(1, 4, 3),
        "e": _ok(2, 1, 0),
    },
    "preferred_past": {
        "hold": _ok(0, 1, 0),
        **{f"r{i}": _ok(1, 5, i) for i in range(5)},
        **{f"r{i}": _ok(2, 3, i - 5) for i in range(5, 8)},
    },
    # a queue policy turns prefetching off: the preferred size 3 goes, then the 2 left (preferred too)
    "preferred_delay_policy": {
        "hold": _ok(0, 1, 0), "a": _ok(1, 3, 0), "b": _ok(1, 3, 1), "c": _ok(1, 3, 2), "d": _ok(2, 2, 0),
        "e": _ok(2, 2, 1),
    },
    "ragged": {"hold": _ok(0, 1, 0), "a": _ok(1, 3, 0), "b": _ok(1, 3, 1), "c": _ok(1, 3, 2)},
    "optional": {"hold": _ok(0, 1, 0), "a": _ok(1, 1, 0), "b": _ok(2, 2, 0), "c": _ok(2, 2, 1), "d": _ok(3, 1, 0)},
    "statistics": {
        "execution_count": 6, "inference_count": 12, "success": 8, "fail": 0, "queue": 8,
        "nv_inference_exec_count": 6, "nv_inference_count": 12, "nv_inference_request_success": 8,
        "batch_stats": {1: (3, 3, 3), 2: (1, 1, 1), 3: (1, 1, 1), 4: (1, 1, 1)},
    },
    "preserve_ordering": {"ordered": False, "unordered": True},
    "unload": {
        "hold": _ok(0, 1, 0), "a": _ok(1, 1, 0), "unloaded": True,
        "c": _error("NOT_FOUND", "Request for unknown model: 'unload' has no available versions"),
    },
    "loads": {name: name.startswith("ok_") for name in LOADS},
}


def _config(name: str, gate: Path, batching: str, max_batch: int, instances: int, ragged: bool) -> str:
    dims = "[ -1 ]" if max_batch else "[ -1, -1 ]"
    optional = f', {{ name: "INPUT1" data_type: TYPE_INT32 dims: {dims} optional: true }}' if name == "optional" else ""
    probe = "[ 3 ]" if max_batch else "[ -1, 3 ]"
    return f"""name: "{name}"
backend: "python"
max_batch_size: {max_batch}
input [ {{ name: "INPUT0" data_type: TYPE_INT32 dims: {dims} allow_ragged_batch: {str(ragged).lower()} }}{optional} ]
output [
  {{ name: "OUTPUT0" data_type: TYPE_INT32 dims: {dims} }},
  {{ name: "PROBE" data_type: TYPE_INT32 dims: {probe} }}
]
instance_group [ {{ count: {instances} kind: KIND_CPU }} ]
parameters {{ key: "gate" value {{ string_value: "{gate}" }} }}
dynamic_batching {{ {batching} }}
"""


@pytest.fixture(scope="module")
def repository(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("dynamic_triton")
    repo = root / "repository"
    models = dict(MODELS)
    models.update({name: (batching, max_batch, 1, False) for name, (batching, max_batch) in LOADS.items()})
    for name, (batching, max_batch, instances, ragged) in models.items():
        gate = root / "gates" / name
        gate.mkdir(parents=True)
        shutil.copytree(PROBE / "1", repo / name / "1", ignore=shutil.ignore_patterns("__pycache__"))
        config = _config(name, gate, batching, max_batch, instances, ragged)
        if name == "cached":
            config += "response_cache { enable: true }\n"
        (repo / name / "config.pbtxt").write_text(config)
    return repo


Ports = tuple[int, int, int]


@pytest.fixture(scope="module")
def ferry(repository: Path) -> Iterator[Ports]:
    from support.server import ServerThread, make_options

    thread = ServerThread(make_options(
        [repository], model_control_mode="explicit", load_models=tuple(MODELS),
        cache_config={"local": {"size": "1048576"}},
    ))
    handle = thread.start()
    try:
        yield handle.server.http_port, handle.server.grpc_port, handle.server.metrics_port
    finally:
        thread.stop()


@pytest.fixture(scope="module")
def triton(repository: Path) -> Iterator[Ports | None]:
    from support.triton import cached_triton, running_triton

    if not cached_triton().ok:  # Ferry is still checked against EXPECTED
        yield None
        return
    with running_triton(repository, list(MODELS), "--cache-config=local,size=1048576") as ports:
        yield ports


class Server:
    """One server over one protocol: inference with tritonclient, statistics, the pending-request gauge."""

    def __init__(self, protocol: str, ports: Ports) -> None:
        import tritonclient.grpc as grpcclient
        import tritonclient.http as httpclient

        http, grpc, metrics = ports
        self.protocol = protocol
        self.module: Any = httpclient if protocol == "http" else grpcclient
        self.url = f"127.0.0.1:{http if protocol == 'http' else grpc}"
        self.metrics_url = f"http://127.0.0.1:{metrics}/metrics"

    def client(self) -> Any:
        if self.protocol == "http":
            return self.module.InferenceServerClient(self.url, network_timeout=60.0)
        return self.module.InferenceServerClient(self.url)

    def infer(self, model: str, rows: list[list[int]], *, optional: bool = False, **kwargs: Any) -> tuple:
        """``rows`` as INPUT0 (and as the optional INPUT1 too with ``optional``); the PROBE row, or the error."""
        data = np.array(rows, np.int32)
        client = self.client()
        try:
            tensors = []
            for name in ("INPUT0", "INPUT1") if optional else ("INPUT0",):
                tensors.append(self.module.InferInput(name, list(data.shape), "INT32"))
                tensors[-1].set_data_from_numpy(data)
            probe = client.infer(model, tensors, **kwargs).as_numpy("PROBE")[0]
            return ("ok", *(int(value) for value in probe))
        except InferenceServerException as error:
            return _error(_code(error.status()), error.message())
        finally:
            client.close()

    def metric(self, name: str, model: str, extra: str = "") -> int:
        text = urllib.request.urlopen(self.metrics_url, timeout=10).read().decode()
        pattern = rf'^{name}\{{model="{model}",{extra}version="1"\}} (\d+)'
        match = re.search(pattern, text, re.MULTILINE)
        return int(match.group(1)) if match else -1

    def wait_pending(self, model: str, count: int) -> None:
        deadline = time.monotonic() + WAIT_S
        while (pending := self.metric("nv_inference_pending_request_count", model)) != count:
            assert time.monotonic() < deadline, f"{model}: {pending} requests pending, waited for {count}"
            time.sleep(0.01)

    def stats(self, model: str) -> dict[str, Any]:
        client = self.client()
        try:
            if self.protocol == "grpc":
                return client.get_inference_statistics(model, as_json=True)["model_stats"][0]
            return client.get_inference_statistics(model)["model_stats"][0]
        finally:
            client.close()

    def charged(self, model: str) -> dict[str, int]:
        stats = self.stats(model)["inference_stats"]
        counts = {key: int(stats[key].get("count", 0)) for key in ("success", "fail", "queue")}
        counts["REJECTED"] = self.metric("nv_inference_request_failure", model, 'reason="REJECTED",')
        counts["pending"] = self.metric("nv_inference_pending_request_count", model)
        return counts


def _code(status: str | None) -> str:
    """Protocol-neutral error code: gRPC's status name, or the one an HTTP status stands for."""
    by_http = {"400": "INVALID_ARGUMENT", "404": "NOT_FOUND", "500": "INTERNAL", "503": "UNAVAILABLE"}
    status = str(status)
    return status.removeprefix("StatusCode.") if status.startswith("StatusCode.") else by_http.get(status, status)


class Scene:
    """Hold a model's instance, queue requests behind it, then open the gate and collect the outcomes."""

    def __init__(self, server: Server, repository: Path, model: str) -> None:
        self.server, self.model = server, model
        self.gate = repository.parent / "gates" / model
        for path in self.gate.iterdir():
            path.unlink()
        self.threads: list[threading.Thread] = []
        self.results: dict[str, tuple] = {}

    def start(self, key: str, rows: list[list[int]], **kwargs: Any) -> threading.Thread:
        def run() -> None:
            self.results[key] = self.server.infer(self.model, rows, **kwargs)

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        self.threads.append(thread)
        return thread

    def hold(self, *marks: int) -> None:
        """Occupy the instance (``marks``: more values, so that a cached model sees a new request)."""
        self.start("hold", [[-1, *marks]])
        deadline = time.monotonic() + WAIT_S
        while not any(self.gate.glob("started_*")):
            assert time.monotonic() < deadline, f"{self.model}: the holding request never started"
            time.sleep(0.01)

    def queue(self, key: str, rows: list[list[int]], pending: int, **kwargs: Any) -> None:
        self.start(key, rows, **kwargs)
        self.server.wait_pending(self.model, pending)

    def now(self, key: str, rows: list[list[int]], **kwargs: Any) -> None:
        self.results[key] = self.server.infer(self.model, rows, **kwargs)

    def release(self) -> dict[str, tuple]:
        (self.gate / "open").touch()
        for thread in self.threads:
            thread.join(WAIT_S)
        first = self.results["hold"][1]
        return {
            key: ("ok", result[1] - first, *result[2:]) if result[0] == "ok" else result
            for key, result in self.results.items()
        }


def _queue_full(server: Server, repository: Path) -> dict[str, Any]:
    before = server.charged("qfull")
    scene = Scene(server, repository, "qfull")
    scene.hold()
    scene.queue("a", [[1]], 1)
    scene.queue("b", [[2]], 2)
    scene.now("c", [[3]], request_id="req-c")
    scene.now("d", [[4]])
    outcomes: dict[str, Any] = scene.release()
    after = server.charged("qfull")
    outcomes["charged"] = {key: after[key] - before[key] for key in after}
    return outcomes


def _queue_full_cached(server: Server, repository: Path) -> dict[str, Any]:
    """A response cache hit is answered while the queue is full; a miss is refused (the lookup comes first)."""
    base = 100 if server.protocol == "grpc" else 0  # values new to the cache for each protocol
    before = server.stats("cached")["inference_stats"]
    scene = Scene(server, repository, "cached")
    scene.now("first", [[7 + base]])
    scene.hold(base)
    scene.queue("a", [[1 + base]], 1)
    scene.now("hit", [[7 + base]])
    scene.now("miss", [[8 + base]])
    outcomes: dict[str, Any] = scene.release()
    after = server.stats("cached")["inference_stats"]
    outcomes["charged"] = {
        key: int(after[key].get("count", 0)) - int(before[key].get("count", 0))
        for key in ("success", "fail", "cache_hit", "cache_miss")
    }
    return outcomes


def _queue_full_per_level(server: Server, repository: Path) -> dict[str, Any]:
    scene = Scene(server, repository, "prioq")
    scene.hold()
    scene.queue("h1", [[1]], 1, priority=1)
    scene.now("h2", [[2]], priority=1)  # level 1 holds 1
    scene.queue("l1", [[3]], 2)
    scene.queue("l2", [[4]], 3, priority=5)  # above the levels: the default level 2
    scene.queue("l3", [[5]], 4, priority=2)
    scene.now("l4", [[6]], priority=0)  # level 2 holds 3
    return scene.release()


def _timeout_reject(server: Server, repository: Path) -> dict[str, Any]:
    before = server.charged("reject")
    scene = Scene(server, repository, "reject")
    scene.hold()
    scene.queue("a", [[1]], 1, request_id="ra", timeout=60_000_000)  # longer than the default: not taken
    scene.queue("b", [[2]], 2)
    time.sleep(0.3)  # past the 100 ms default timeout while the instance is held
    outcomes: dict[str, Any] = scene.release()
    after = server.charged("reject")
    outcomes["charged"] = {key: after[key] - before[key] for key in after}
    return outcomes


def _timeout_delay(server: Server, repository: Path) -> dict[str, Any]:
    scene = Scene(server, repository, "delay")
    scene.hold()
    scene.queue("a", [[1]], 1, timeout=1000)
    scene.queue("b", [[2]], 2)
    scene.queue("c", [[3]], 3, timeout=1000)
    time.sleep(0.2)  # a and c expire: DELAY puts them behind b
    return scene.release()


def _timeout_delay_full(server: Server, repository: Path) -> dict[str, Any]:
    """A DELAYed request still counts toward ``max_queue_size``."""
    scene = Scene(server, repository, "delayfull")
    scene.hold()
    scene.queue("a", [[1]], 1, timeout=1000)
    scene.queue("b", [[2]], 2)
    time.sleep(0.2)
    scene.now("c", [[3]])
    return scene.release()


def _timeout_not_applied(model: str) -> Any:
    def case(server: Server, repository: Path) -> dict[str, Any]:
        scene = Scene(server, repository, model)
        scene.hold()
        scene.queue("a", [[1]], 1, timeout=1000)
        time.sleep(0.2)
        return scene.release()

    return case


def _priority(server: Server, repository: Path) -> dict[str, Any]:
    scene = Scene(server, repository, "prio")
    scene.hold()
    for index, priority in enumerate([3, 0, 2, 1, 7]):
        scene.queue(f"p{priority}", [[index]], index + 1, priority=priority)
    scene.queue("none", [[9]], 6)
    return scene.release()


def _shapes(server: Server, repository: Path) -> dict[str, Any]:
    scene = Scene(server, repository, "shapes")
    scene.hold()
    scene.queue("a", [[1, 1]], 1)
    scene.queue("b", [[1, 1, 1]], 2)
    scene.queue("c", [[2, 2]], 3)
    scene.queue("d", [[3, 3], [4, 4]], 4)
    scene.queue("e", [[5, 5]], 5)
    return scene.release()


def _unbatched(server: Server, repository: Path) -> dict[str, Any]:
    scene = Scene(server, repository, "unbatched")
    scene.hold()
    scene.queue("a", [[1]], 1)
    scene.now("b", [[2]])
    return scene.release()


def _fill(server: Server, repository: Path) -> dict[str, Any]:
    """Rows, not requests, fill ``max_batch_size``: 3 + 2 rows do not fit 4, so the 3 go alone."""
    scene = Scene(server, repository, "fill")
    scene.hold()
    scene.queue("a", [[1]] * 3, 1)
    scene.queue("b", [[2]] * 2, 2)
    scene.queue("c", [[3]], 3)
    return scene.release()


def _preferred(server: Server, repository: Path) -> dict[str, Any]:
    """Without a queue delay the largest preferred size reached goes first, the rest after."""
    scene = Scene(server, repository, "preferred")
    scene.hold()
    for index, key in enumerate("abc"):
        scene.queue(key, [[index]], index + 1)
    return scene.release()


def _queued_behind(model: str, keys: list[str]) -> Any:
    """A case: ``keys`` queued one by one (one row each) while the instance is held, then the gate opens."""

    def case(server: Server, repository: Path) -> dict[str, Any]:
        scene = Scene(server, repository, model)
        scene.hold()
        for index, key in enumerate(keys):
            scene.queue(key, [[index]], index + 1)
        return scene.release()

    return case


def _ragged(server: Server, repository: Path) -> dict[str, Any]:
    scene = Scene(server, repository, "ragged")
    scene.hold()
    scene.queue("a", [[1, 1]], 1)
    scene.queue("b", [[1, 1, 1]], 2)
    scene.queue("c", [[2, 2]], 3)
    return scene.release()


def _optional(server: Server, repository: Path) -> dict[str, Any]:
    """Requests that send different sets of inputs never share a batch."""
    scene = Scene(server, repository, "optional")
    scene.hold()
    scene.queue("a", [[1]], 1)
    scene.queue("b", [[2]], 2, optional=True)
    scene.queue("c", [[3]], 3, optional=True)
    scene.queue("d", [[4]], 4)
    return scene.release()


def _batch_stats(stats: dict[str, Any]) -> dict[int, tuple[int, int, int]]:
    return {
        int(entry["batch_size"]): tuple(
            int(entry[phase].get("count", 0)) for phase in ("compute_input", "compute_infer", "compute_output")
        )
        for entry in stats.get("batch_stats", [])  # gRPC JSON leaves an empty list out
    }


def _statistics(server: Server, repository: Path) -> dict[str, Any]:
    metrics = ("nv_inference_exec_count", "nv_inference_count", "nv_inference_request_success")
    counted = {name: server.metric(name, "stats") for name in metrics}
    before = server.stats("stats")
    for rows in (1, 2, 1, 3):  # one at a time
        server.infer("stats", [[0]] * rows)
    scene = Scene(server, repository, "stats")
    scene.hold()
    scene.queue("a", [[1]], 1)
    scene.queue("b", [[2], [2]], 2)
    scene.queue("c", [[3]], 3)
    scene.release()  # one execution of 4 rows
    after = server.stats("stats")
    def count(stats: dict[str, Any], key: str) -> int:
        return int(stats.get(key, 0))

    def phase(stats: dict[str, Any], key: str) -> int:
        return int(stats["inference_stats"][key].get("count", 0))

    old, new = _batch_stats(before), _batch_stats(after)
    return {
        **{key: count(after, key) - count(before, key) for key in ("execution_count", "inference_count")},
        **{key: phase(after, key) - phase(before, key) for key in ("success", "fail", "queue")},
        **{name: server.metric(name, "stats") - counted[name] for name in metrics},
        "batch_stats": {
            size: tuple(n - o for n, o in zip(counts, old.get(size, (0, 0, 0))))
            for size, counts in new.items()
            if counts != old.get(size)
        },
    }


def _preserve_ordering(server: Server, repository: Path) -> dict[str, Any]:
    """Whether the second request's answer comes while the first (on the other instance) is still held."""
    outcomes = {}
    for model in ("ordered", "unordered"):
        before = int(server.stats(model).get("execution_count", 0))
        scene = Scene(server, repository, model)
        scene.hold()
        second = scene.start("second", [[5]])
        deadline = time.monotonic() + WAIT_S
        while int(server.stats(model).get("execution_count", 0)) == before:  # the second has executed
            assert time.monotonic() < deadline, f"{model}: the second request never executed"
            time.sleep(0.01)
        second.join(0.5 if model == "ordered" else WAIT_S)  # its answer, held back or not
        outcomes[model] = not second.is_alive()
        results = scene.release()
        assert results["second"][0] == results["hold"][0] == "ok", results
    return outcomes


def _unload(server: Server, repository: Path) -> dict[str, Any]:
    """Requests queued when their model is unloaded still run; a request sent after the unload is refused."""
    scene = Scene(server, repository, "unload")
    scene.hold()
    scene.queue("a", [[1]], 1)

    def unload() -> None:
        own = server.client()  # tritonclient's HTTP client stays on the thread that made it
        own.unload_model("unload")
        own.close()

    unloading = threading.Thread(target=unload, daemon=True)
    unloading.start()
    client = server.client()
    deadline = time.monotonic() + WAIT_S
    while client.is_model_ready("unload"):  # the unload has begun
        assert time.monotonic() < deadline, "the model stayed ready"
        time.sleep(0.01)
    scene.now("c", [[3]])
    outcomes: dict[str, Any] = scene.release()
    unloading.join(WAIT_S)
    outcomes["unloaded"] = not unloading.is_alive() and not client.is_model_ready("unload")
    client.load_model("unload")
    client.close()
    return outcomes


def _loads(server: Server, repository: Path) -> dict[str, bool]:
    client = server.client()
    loaded = {}
    try:
        for name in LOADS:
            try:
                client.load_model(name)
            except InferenceServerException:
                loaded[name] = False
            else:
                loaded[name] = bool(client.is_model_ready(name))
                client.unload_model(name)
    finally:
        client.close()
    return loaded


CASES = {
    "queue_full": _queue_full,
    "queue_full_cached": _queue_full_cached,
    "queue_full_per_level": _queue_full_per_level,
    "timeout_reject": _timeout_reject,
    "timeout_delay": _timeout_delay,
    "timeout_delay_full": _timeout_delay_full,
    "timeout_without_default": _timeout_not_applied("nodefault"),
    "timeout_without_override": _timeout_not_applied("nooverride"),
    "priority": _priority,
    "unbatched": _unbatched,
    "fill": _fill,
    "preferred": _preferred,
    "preferred_delay": _queued_behind("preferred_delay", list("abcde")),
    "preferred_past": _queued_behind("preferred_past", [f"r{index}" for index in range(8)]),
    "preferred_delay_policy": _queued_behind("preferred_delay_policy", list("abcde")),
    "shapes": _shapes,
    "ragged": _ragged,
    "optional": _optional,
    "statistics": _statistics,
    "preserve_ordering": _preserve_ordering,
    "unload": _unload,
    "loads": _loads,
}


def _outcomes(server: Server, repository: Path) -> dict[str, Any]:
    return {case: run(server, repository) for case, run in CASES.items()}


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_dynamic_batcher_answers_as_recorded_from_triton(protocol: str, repository: Path, ferry: Ports) -> None:
    ours = _outcomes(Server(protocol, ferry), repository)
    assert {case: ours[case] for case in EXPECTED if ours[case] != EXPECTED[case]} == {}


@pytest.mark.slow  # live tritonserver (with -m slow): its batches depend on its own timing under a loaded machine
@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_dynamic_batcher_matches_triton(protocol: str, repository: Path, ferry: Ports, triton: Ports | None) -> None:
    if triton is None:
        pytest.skip("tritonserver cannot be had here")
    ours = _outcomes(Server(protocol, ferry), repository)
    theirs = _outcomes(Server(protocol, triton), repository)
    assert {case: (theirs[case], ours[case]) for case in EXPECTED if theirs[case] != ours[case]} == {}
