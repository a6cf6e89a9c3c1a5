"""The response cache side by side with NVIDIA Triton 2.51 (``--cache-config local,size=<bytes>``, python models).

Every test runs against Ferry and, where it can be had, against Triton (``support.triton``; skipped with the
installer's reason otherwise), and expects the same: which requests are hits (the models answer with how many
times they executed, so a hit shows as an old count), the statistics' counts and which durations are non-zero,
the ``nv_cache_*`` metric families with their labels and counts, Triton's byte accounting of its local cache
(``nv_cache_util``, entries, evictions), and the load errors of decoupled and sequence models and of decoupled
ensembles. Durations are timing and only their presence is compared. Triton copies its cache's totals into the
gauges from a polling thread, so the gauges are read once ``nv_cache_num_lookups`` has caught up.

Kept apart from Triton on purpose (each asserted here, per server):

- Triton's cache key is the model, its version and each input's name and bytes: neither shapes nor requested
  outputs. It answers a [2, 2] request with the [1, 4] answer of the same bytes, and returns every output it
  stored to a request that asked for one (a classified output's request gets the raw outputs too). Ferry keys
  on shapes and on the names of the requested outputs (all listed = none listed; ``binary_data`` and
  classification are applied after the cache, so HTTP and gRPC clients share entries, as in Triton).
- Triton stores a failed response (a python model that raised or sent an error) and answers the next
  identical request with an empty success. Ferry stores successes only; both count the failed request as a
  miss.
- An entry no larger than the cache but larger than its free segment makes Triton evict every entry and then
  store nothing; Ferry refuses it without evicting.
- Triton's load error for a model that cannot use the cache (decoupled, sequence batching, an ensemble declared
  decoupled) is "failed to load '<name>', failed to poll from model repository" (HTTP 500 / INTERNAL), the reason
  only in its log; Ferry answers the same, then a colon and the reason Triton logs, and keeps it in the index. An
  ensemble that a decoupled step makes decoupled fails its version in both: HTTP 400 "load failed for model '<ens>':
  version 1 is at UNAVAILABLE state: Invalid argument: Response Cache does not currently support model <ens> with
  'decoupled' transaction policy. ...;", its index row version 1 UNAVAILABLE with that reason.
- Triton does not store a response with an empty output (it misses every time); Ferry stores it.
- An ensemble with a sequence-batching step and ``response_cache`` enabled: Triton caches it, so a sequence's
  later requests are answered from the cache (and one without a correlation id succeeds) while the stateful
  model never sees them; Ferry loads it with a warning and does not cache it (tests/serving_pod/test_cache.py).
"""

from __future__ import annotations

import contextlib
import re
import subprocess
import textwrap
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tritonclient.utils import InferenceServerException

# the live tritonserver half runs with -m slow (minutes of the default suite; Triton's own timing made it flaky)
SERVERS = ["ferry", pytest.param("triton", marks=pytest.mark.slow)]
#: 128 bytes of segment header + the 7 entries' blocks (224 + 224 + 256 + 224 + 128 + 128 + 144), as Triton reports
UTIL = 1456 / (1 << 20)

COUNTING = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """OUTPUT0 = INPUT0, OUTPUT1 = 2 * INPUT0, COUNT = how many requests this instance executed."""

    def initialize(self, args):
        self.executed = 0

    def execute(self, requests):
        responses = []
        for request in requests:
            self.executed += 1
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            if float(x.flat[0]) == 13.0:
                raise pb_utils.TritonModelException("unlucky 13")
            count = np.full(x.shape[:-1] + (1,), self.executed, np.int64)
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("OUTPUT0", x.copy()), pb_utils.Tensor("OUTPUT1", (x * 2).astype(x.dtype)),
                pb_utils.Tensor("COUNT", count)]))
        return responses
'''

TEXT = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.executed = 0

    def execute(self, requests):
        responses = []
        for request in requests:
            self.executed += 1
            text = pb_utils.get_input_tensor_by_name(request, "TEXT").as_numpy()
            upper = np.array([t.upper() for t in text.flat], dtype=object).reshape(text.shape)
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("UPPER", upper), pb_utils.Tensor("COUNT", np.array([self.executed], np.int64))]))
        return responses
'''

BLOB = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """BLOB: N zero bytes; COUNT: how many requests this instance executed."""

    def initialize(self, args):
        self.executed = 0

    def execute(self, requests):
        responses = []
        for request in requests:
            self.executed += 1
            n = int(pb_utils.get_input_tensor_by_name(request, "N").as_numpy()[0])
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("BLOB", np.zeros([n], np.uint8)),
                pb_utils.Tensor("COUNT", np.array([self.executed], np.int64))]))
        return responses
'''

STREAM = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x.copy())]),
                        flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
'''

CACHED = "response_cache { enable: true }"
COUNTING_IO = """
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] }, { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ -1 ] },
         { name: "COUNT" data_type: TYPE_INT64 dims: [ 1 ] } ]
instance_group [ { kind: KIND_CPU count: 1 } ]
"""
#: what the cache-enabled models of the main repository are, and what each test loads
CACHED_MODELS = ["counting", "counting_dyn", "counting_nb", "text", "ens"]
LOADED = [*CACHED_MODELS, "plain"]


def _model(repository: Path, name: str, config: str, source: str | None = None) -> None:
    (repository / name / "1").mkdir(parents=True)
    (repository / name / "config.pbtxt").write_text(f'name: "{name}"\n' + textwrap.dedent(config))
    if source is not None:
        (repository / name / "1" / "model.py").write_text(source)


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("cache_triton")
    python = 'backend: "python"\n'
    _model(repo, "counting", f"{python}max_batch_size: 8\n{COUNTING_IO}{CACHED}\n", COUNTING)
    _model(repo, "counting_dyn", f"{python}max_batch_size: 8\n{COUNTING_IO}{CACHED}\ndynamic_batching {{ }}\n", COUNTING)
    _model(repo, "counting_nb", f"{python}max_batch_size: 0\n{COUNTING_IO}{CACHED}\n", COUNTING)
    _model(repo, "plain", f"{python}max_batch_size: 8\n{COUNTING_IO}", COUNTING)
    _model(repo, "counting_slow_batch", f"{python}max_batch_size: 8\n{COUNTING_IO}{CACHED}\n"
           "dynamic_batching { max_queue_delay_microseconds: 1500000 }\n", COUNTING)
    _model(repo, "seq", f"{python}max_batch_size: 8\n{COUNTING_IO}{CACHED}\nsequence_batching {{ }}\n", COUNTING)
    _model(repo, "text", f"""{python}max_batch_size: 0
        input [ {{ name: "TEXT" data_type: TYPE_STRING dims: [ -1 ] }} ]
        output [ {{ name: "UPPER" data_type: TYPE_STRING dims: [ -1 ] }}, {{ name: "COUNT" data_type: TYPE_INT64 dims: [ 1 ] }} ]
        instance_group [ {{ kind: KIND_CPU count: 1 }} ]
        {CACHED}
        """, TEXT)
    _model(repo, "blob", f"""{python}max_batch_size: 0
        input [ {{ name: "N" data_type: TYPE_INT32 dims: [ 1 ] }} ]
        output [ {{ name: "BLOB" data_type: TYPE_UINT8 dims: [ -1 ] }}, {{ name: "COUNT" data_type: TYPE_INT64 dims: [ 1 ] }} ]
        instance_group [ {{ kind: KIND_CPU count: 1 }} ]
        {CACHED}
        """, BLOB)
    _model(repo, "stream", f"""{python}max_batch_size: 0
        model_transaction_policy {{ decoupled: true }}
        input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
        output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
        {CACHED}
        """, STREAM)
    _model(repo, "ens", f"""platform: "ensemble"
        max_batch_size: 8
        input [ {{ name: "IN" data_type: TYPE_FP32 dims: [ -1 ] }} ]
        output [ {{ name: "OUT" data_type: TYPE_FP32 dims: [ -1 ] }}, {{ name: "CNT" data_type: TYPE_INT64 dims: [ 1 ] }} ]
        ensemble_scheduling {{ step [ {{ model_name: "plain" model_version: -1
          input_map {{ key: "INPUT0" value: "IN" }}
          output_map {{ key: "OUTPUT0" value: "OUT" }} output_map {{ key: "COUNT" value: "CNT" }} }} ] }}
        {CACHED}
        """)
    _model(repo, "stream_nc", f"""{python}max_batch_size: 0
        model_transaction_policy {{ decoupled: true }}
        input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
        output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
        """, STREAM)
    for name, step, declared in (("ens_dec", "stream_nc", ""), ("ens_declared", "plain", "decoupled: true")):
        _model(repo, name, f"""platform: "ensemble"
            max_batch_size: {0 if step == "stream_nc" else 8}
            model_transaction_policy {{ {declared} }}
            input [ {{ name: "IN" data_type: TYPE_FP32 dims: [ -1 ] }} ]
            output [ {{ name: "OUT" data_type: TYPE_FP32 dims: [ -1 ] }} ]
            ensemble_scheduling {{ step [ {{ model_name: "{step}" model_version: -1
              input_map {{ key: "INPUT0" value: "IN" }} output_map {{ key: "OUTPUT0" value: "OUT" }} }} ] }}
            {CACHED}
            """)
    return repo


@contextlib.contextmanager
def serving(server: str, repository: Path, models: list[str], cache_bytes: int | None) -> Iterator[tuple[int, int, int]]:
    """(http, grpc, metrics) ports of ``server`` serving ``models``, with a local cache of ``cache_bytes``."""
    if server == "triton":
        from support.triton import running_triton

        flags = ["--metrics-interval-ms=100"] + ([f"--cache-config=local,size={cache_bytes}"] if cache_bytes else [])
        with running_triton(repository, models, *flags) as ports:
            yield ports
        return
    from support.server import ServerThread, make_options

    cache = {"local": {"size": str(cache_bytes)}} if cache_bytes else {}
    thread = ServerThread(make_options([repository], cache_config=cache, model_control_mode="explicit",
                                       load_models=tuple(models)))
    handle = thread.start()
    try:
        yield handle.server.http_port, handle.server.grpc_port, handle.server.metrics_port
    finally:
        thread.stop()


class Clients:
    """A tritonclient of each protocol on one server."""

    def __init__(self, ports: tuple[int, int, int]) -> None:
        import tritonclient.grpc as grpcclient
        import tritonclient.http as httpclient

        self.modules = {"http": httpclient, "grpc": grpcclient}
        self.clients = {"http": httpclient.InferenceServerClient(f"127.0.0.1:{ports[0]}", network_timeout=60.0),
                        "grpc": grpcclient.InferenceServerClient(f"127.0.0.1:{ports[1]}")}
        self.metrics_port = ports[2]

    def close(self) -> None:
        for client in self.clients.values():
            client.close()

    def infer(self, protocol: str, model: str, inputs: dict[str, np.ndarray], outputs: list[str] | None = None,
              *, binary: bool = True, class_count: int = 0, **kwargs: Any) -> dict[str, Any] | str:
        """{output: value as a list} of the answer, or the error's message."""
        module, client = self.modules[protocol], self.clients[protocol]
        tensors = []
        for name, value in inputs.items():
            tensor = module.InferInput(name, list(value.shape), "BYTES" if value.dtype == object else
                                       {np.float32: "FP32", np.int32: "INT32"}[value.dtype.type])
            tensor.set_data_from_numpy(value)
            tensors.append(tensor)
        extra = {"binary_data": binary} if protocol == "http" else {}
        requested = None if outputs is None else [
            module.InferRequestedOutput(name, class_count=class_count, **extra) for name in outputs]
        try:
            result = client.infer(model, tensors, outputs=requested, **kwargs)
        except InferenceServerException as error:
            return error.message().split("\n")[0]
        names = [o["name"] if protocol == "http" else o.name for o in (
            result.get_response()["outputs"] if protocol == "http" else result.get_response().outputs)]
        return {name: result.as_numpy(name).tolist() for name in names}

    def stats(self, model: str) -> dict[str, Any]:
        """The counts of ``model``'s statistics over both protocols (which must agree), durations as present or not."""
        seen = []
        for protocol, client in self.clients.items():
            entry = (client.get_inference_statistics(model) if protocol == "http"
                     else client.get_inference_statistics(model, as_json=True))["model_stats"][0]
            inference = entry["inference_stats"]
            seen.append({
                "inference_count": int(entry.get("inference_count", 0)),
                "execution_count": int(entry.get("execution_count", 0)),
                **{key: (int(value.get("count", 0)), int(value.get("ns", 0)) > 0) for key, value in inference.items()},
                "batch_stats": [(int(b["batch_size"]), int(b["compute_infer"].get("count", 0)))
                                for b in entry.get("batch_stats", [])],
            })
        assert seen[0] == seen[1]
        return seen[0]

    def metrics(self, lookups: int | None = None) -> dict[str, float]:
        """The ``nv_cache_*`` series and the inference counts (``{model=..}`` labels kept), once the cache's gauges
        count ``lookups`` (Triton copies them from a polling thread)."""
        deadline = time.monotonic() + 15
        while True:
            text = urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=10).read().decode()
            series = {}
            for line in text.splitlines():
                match = re.match(r"(nv_cache_\w+|nv_inference_(?:exec_)?count)(\{[^}]*\})? (\S+)$", line)
                if match:
                    series[match[1] + (match[2] or "")] = float(match[3])
            if lookups is None or series.get("nv_cache_num_lookups") == lookups or time.monotonic() > deadline:
                families = set(re.findall(r"^# TYPE (nv_cache_\w+) (\w+)$", text, re.MULTILINE))
                return {**series, "families": sorted(families)}  # type: ignore[dict-item]
            time.sleep(0.1)


@contextlib.contextmanager
def clients(server: str, repository: Path, models: list[str], cache_bytes: int | None) -> Iterator[Clients]:
    with serving(server, repository, models, cache_bytes) as ports:
        handle = Clients(ports)
        try:
            yield handle
        finally:
            handle.close()


def _f32(*values: float, shape: tuple[int, ...] = (1, 4)) -> np.ndarray:
    return np.array(values, np.float32).reshape(shape)


def _count(answer: dict[str, Any] | str, name: str = "COUNT") -> Any:
    assert isinstance(answer, dict), answer
    return answer[name]


# --- hits and misses, statistics, metrics ----------------------------------------------------
@pytest.mark.parametrize("server", SERVERS)
def test_hits_misses_statistics_and_metrics_match_triton(repository: Path, server: str) -> None:
    x, base = _f32(0, 1, 2, 3), {"OUTPUT0": [[0.0, 1.0, 2.0, 3.0]], "OUTPUT1": [[0.0, 2.0, 4.0, 6.0]]}
    with clients(server, repository, LOADED, 1 << 20) as c:
        counts = []
        for protocol in ("http", "grpc"):  # the second protocol's requests all hit the first one's entries
            first = c.infer(protocol, "counting", {"INPUT0": x})
            assert first == {**base, "COUNT": [[1]]}, protocol
            for kwargs in ({}, {"model_version": "1"}, {"request_id": "r"}, {"parameters": {"p": protocol}},
                           {"priority": 0}):
                assert c.infer(protocol, "counting", {"INPUT0": x}, **kwargs) == first, (protocol, kwargs)
            for binary in (True, False):  # every output listed: what none listed asks, however encoded
                assert c.infer(protocol, "counting", {"INPUT0": x}, ["COUNT", "OUTPUT0", "OUTPUT1"],
                               binary=binary) == {**base, "COUNT": [[1]]}
            counts.append(_count(c.infer(protocol, "counting", {"INPUT0": x + 1})))  # other bytes: a miss
            rows = np.arange(8, dtype=np.float32).reshape(2, 4)
            counts.append(_count(c.infer(protocol, "counting", {"INPUT0": rows})))
            counts.append(_count(c.infer(protocol, "counting", {"INPUT0": rows})))
            counts.append(_count(c.infer(protocol, "counting_dyn", {"INPUT0": x})))
            counts.append(_count(c.infer(protocol, "plain", {"INPUT0": x})))  # no response_cache: always runs
            for words in ([b"ab", b"c"], [b"ab", b"c"], [b"a", b"bc"]):
                answer = c.infer(protocol, "text", {"TEXT": np.array(words, dtype=object)})
                counts.append((_count(answer, "UPPER"), _count(answer)))
            counts.append(_count(c.infer(protocol, "ens", {"IN": x}), "CNT"))  # top-level: runs "plain" once
        assert counts == [
            [[2]], [[3], [3]], [[3], [3]], [[1]], [[1]],
            ([b"AB", b"C"], [1]), ([b"AB", b"C"], [1]), ([b"A", b"BC"], [2]), [[2]],
            [[2]], [[3], [3]], [[3], [3]], [[1]], [[3]],
            ([b"AB", b"C"], [1]), ([b"AB", b"C"], [1]), ([b"A", b"BC"], [2]), [[2]],
        ]

        def stats(hits: int, misses: int, plain: int = 0, batches: list | None = None) -> dict:
            executed = misses + plain
            return {"inference_count": executed + (1 if batches else 0), "execution_count": executed,
                    "success": (hits + executed, True), "fail": (0, False), "queue": (hits + executed, True),
                    "compute_input": (executed, True), "compute_infer": (executed, True),
                    "compute_output": (executed, True), "cache_hit": (hits, hits > 0),
                    "cache_miss": (misses, misses > 0), "batch_stats": batches or [(1, executed)]}

        assert c.stats("counting") == stats(19, 3, batches=[(1, 2), (2, 1)])
        assert c.stats("counting_dyn") == stats(1, 1)
        assert c.stats("text") == stats(4, 2)
        assert c.stats("ens") == stats(1, 1)
        assert c.stats("plain") == stats(0, 0, plain=3)  # twice on its own, once for the ensemble
        metrics = c.metrics(lookups=32)
    per_model = {"counting": (19, 3, 4, 3), "counting_dyn": (1, 1, 1, 1), "text": (4, 2, 2, 2), "ens": (1, 1, 1, 1),
                 "plain": (None, None, 3, 3)}
    for model, (hits, misses, inferences, executions) in per_model.items():
        labels = f'{{model="{model}",version="1"}}'
        assert metrics.get(f"nv_cache_num_hits_per_model{labels}") == hits, model
        assert metrics.get(f"nv_cache_num_misses_per_model{labels}") == misses, model
        assert (f"nv_cache_hit_duration_per_model{labels}" in metrics) == (hits is not None), model
        assert (f"nv_cache_miss_duration_per_model{labels}" in metrics) == (misses is not None), model
        assert (metrics[f"nv_inference_count{labels}"], metrics[f"nv_inference_exec_count{labels}"]) == (
            inferences, executions), model
    assert metrics["families"] == [
        ("nv_cache_hit_duration_per_model", "counter"), ("nv_cache_insertion_duration", "gauge"),
        ("nv_cache_lookup_duration", "gauge"), ("nv_cache_miss_duration_per_model", "counter"),
        ("nv_cache_num_entries", "gauge"), ("nv_cache_num_evictions", "gauge"), ("nv_cache_num_hits", "gauge"),
        ("nv_cache_num_hits_per_model", "counter"), ("nv_cache_num_lookups", "gauge"),
        ("nv_cache_num_misses", "gauge"), ("nv_cache_num_misses_per_model", "counter"), ("nv_cache_util", "gauge"),
    ]
    gauges = {key: metrics[key] for key in ("nv_cache_num_entries", "nv_cache_num_hits", "nv_cache_num_misses",
                                            "nv_cache_num_lookups", "nv_cache_num_evictions", "nv_cache_util")}
    assert gauges == {"nv_cache_num_entries": 7, "nv_cache_num_hits": 25, "nv_cache_num_misses": 7,
                      "nv_cache_num_lookups": 32, "nv_cache_num_evictions": 0, "nv_cache_util": UTIL}
    assert metrics["nv_cache_lookup_duration"] > 0 and metrics["nv_cache_insertion_duration"] > 0


# --- what the key holds, failures (kept apart from Triton on purpose: module docstring) -------
@pytest.mark.parametrize("server", SERVERS)
def test_key_failures_and_empty_outputs_as_each_server_keeps_them(repository: Path, server: str) -> None:
    triton = server == "triton"
    x = _f32(5, 6, 7, 8)
    first = {"OUTPUT0": [[5.0, 6.0, 7.0, 8.0]], "OUTPUT1": [[10.0, 12.0, 14.0, 16.0]], "COUNT": [[1]]}
    unlucky = "Failed to process the request(s) for model 'counting_0_0', message: TritonModelException: unlucky 13"
    with clients(server, repository, ["counting", "blob"], 1 << 20) as c:
        assert c.infer("http", "counting", {"INPUT0": x}) == first
        reshaped = c.infer("grpc", "counting", {"INPUT0": x.reshape(2, 2)})  # the same bytes as [2, 2]
        assert reshaped == (first if triton else {
            "OUTPUT0": [[5.0, 6.0], [7.0, 8.0]], "OUTPUT1": [[10.0, 12.0], [14.0, 16.0]], "COUNT": [[2], [2]]})
        for protocol in ("http", "grpc"):  # one output asked for
            assert c.infer(protocol, "counting", {"INPUT0": x}, ["OUTPUT1"]) == (
                first if triton else {"OUTPUT1": first["OUTPUT1"]})
        classified = c.infer("http", "counting", {"INPUT0": x}, ["OUTPUT0"], class_count=2)
        assert classified == ({**first, "OUTPUT0": [[b"8.000000:3", b"7.000000:2"]]} if triton
                              else {"OUTPUT0": [[b"8.000000:3", b"7.000000:2"]]})
        assert c.infer("http", "counting", {"INPUT0": _f32(13, 0, 0, 0)}) == unlucky
        assert c.infer("grpc", "counting", {"INPUT0": _f32(13, 0, 0, 0)}) == ({} if triton else unlucky)
        stats = c.stats("counting")
        assert (stats["cache_hit"][0], stats["cache_miss"][0], stats["fail"][0], stats["execution_count"]) == (
            (5, 2, 1, 2) if triton else (1, 6, 2, 6))
        empty = [_count(c.infer(p, "blob", {"N": np.array([0], np.int32)})) for p in ("http", "grpc")]
        assert empty == ([[1], [2]] if triton else [[1], [1]])
        assert c.metrics(lookups=9)["nv_cache_num_entries"] == (2 if triton else 5)  # Triton: x and the failure
        for protocol in ("http", "grpc"):  # a cache server refuses them as one without a cache does
            for model in ("stream", "seq", "ens_declared", "ens_dec"):
                assert _load_error(c, protocol, model) == _refusal(server, model, protocol)


#: Triton's reason for refusing a model that cannot use the cache while it polls the repository (in its log; Ferry's
#: answer adds it after Triton's words)
REFUSALS = {
    "stream": "Response Cache does not currently support model stream with 'decoupled' transaction policy. "
              "Please disable the response cache.",
    "seq": "Response Cache does not currently support model seq with sequence batching scheduler. "
           "Please disable the response cache.",
    "ens_declared": "Response Cache does not currently support model ens_declared with 'decoupled' transaction "
                    "policy. Please disable the response cache.",
}
#: an ensemble a decoupled step makes decoupled: each version fails (Triton checks the derived policy per version)
ENS_DEC = ("load failed for model 'ens_dec': version 1 is at UNAVAILABLE state: Invalid argument: Response Cache does "
           "not currently support model ens_dec with 'decoupled' transaction policy. Please disable the response "
           "cache.;\n")


def _refusal(server: str, model: str, protocol: str) -> tuple[str, str]:
    """(status, message) of loading ``model`` over ``protocol``, as ``server`` answers it."""
    if model == "ens_dec":
        return ("400" if protocol == "http" else "StatusCode.INVALID_ARGUMENT"), ENS_DEC
    status = "500" if protocol == "http" else "StatusCode.INTERNAL"
    words = f"failed to load '{model}', failed to poll from model repository"
    return status, words if server == "triton" else f"{words}: {REFUSALS[model]}"


def _load_error(c: Clients, protocol: str, model: str) -> tuple[str, str] | None:
    try:
        c.clients[protocol].load_model(model)
    except InferenceServerException as error:
        return str(error.status()), error.message()
    return None


# --- Triton's byte accounting: a 1024-byte cache ---------------------------------------------
#: (N, COUNT answered, bytes in use, entries, evictions) after each request to ``blob``: each answer is one
#: 103 + N bytes serialized, in a block of that plus 8 rounded up to 16 (128 bytes for N = 2..17); the
#: segment's 128-byte header is in use from the start and its last 16 bytes hold nothing, so six such
#: entries fill a 1024-byte cache and each further one evicts the least recently used.
ACCOUNTING = [
    (2, 1, 256, 1, 0), (3, 2, 384, 2, 0), (4, 3, 512, 3, 0), (5, 4, 640, 4, 0), (6, 5, 768, 5, 0),
    (7, 6, 896, 6, 0), (8, 7, 896, 6, 1), (9, 8, 896, 6, 2),
    (2, 9, 896, 6, 3),     # evicted by 8: executed again, evicts 4
    (1000, 10, 896, 6, 3),  # 1103 bytes: larger than the cache, not stored, nothing evicted
    (5, 4, 896, 6, 3),     # still there: a hit
    (760, 11, 1008, 1, 9),  # a block of 880: room for it alone, evicts all six
]


@pytest.mark.parametrize("server", SERVERS)
def test_byte_accounting_and_evictions_match_triton(repository: Path, server: str) -> None:
    with clients(server, repository, ["blob"], 1024) as c:
        assert c.metrics(lookups=0)["nv_cache_util"] == 128 / 1024
        seen = []
        for index, (n, *_) in enumerate(ACCOUNTING):
            answer = c.infer(("http", "grpc")[index % 2], "blob", {"N": np.array([n], np.int32)})
            metrics = c.metrics(lookups=index + 1)
            seen.append((n, _count(answer)[0], round(metrics["nv_cache_util"] * 1024),
                         metrics["nv_cache_num_entries"], metrics["nv_cache_num_evictions"]))
        assert seen == ACCOUNTING
        # fits the cache's 1024 bytes but never its segment: Triton evicts every entry, then stores nothing
        answer = c.infer("http", "blob", {"N": np.array([850], np.int32)})
        metrics = c.metrics(lookups=len(ACCOUNTING) + 1)
        assert (_count(answer), metrics["nv_cache_num_entries"], metrics["nv_cache_num_evictions"]) == (
            ([12], 0, 10) if server == "triton" else ([12], 1, 9))


# --- one batch with a request twice, a failing ensemble: which misses count -----------------
#: a cache with room for two ``counting`` answers (128 + 2 * 224 + 16 bytes; each [1, 4] answer is 208 serialized)
TWO_ENTRIES = 600


def _batch_of(c: Clients, model: str, values: list[float]) -> list[Any]:
    """COUNT of each answer to ``values`` sent 0.1 s apart, so that they form one batch of the model's 1.5 s delay."""
    answers: list[Any] = [None] * len(values)

    def send(index: int) -> None:
        answers[index] = c.infer("grpc", model, {"INPUT0": _f32(values[index], 0, 0, 0)})  # thread-safe, unlike HTTP

    threads = [threading.Thread(target=send, args=(index,)) for index in range(len(values))]
    for thread in threads:
        thread.start()
        time.sleep(0.1)
    for thread in threads:
        thread.join()
    return [_count(answer) for answer in answers]


@pytest.mark.parametrize("server", SERVERS)
def test_a_key_stored_meanwhile_and_failed_ensembles_are_no_cache_misses(repository: Path, server: str) -> None:
    """Triton 2.51's dynamic batcher counts a miss when it inserts the answer, and not when the insert finds the key
    already stored (ALREADY_EXISTS): a batch of A, B, A is two misses, and the entry of A keeps its place in the LRU
    order, so the next answer evicts A, not B. Its ensemble scheduler counts a miss for each answer it stores and
    none for a request that failed."""
    with clients(server, repository, ["counting_slow_batch", "ens", "plain"], TWO_ENTRIES) as c:
        assert _batch_of(c, "counting_slow_batch", [1, 2, 1]) == [[[1]], [[2]], [[3]]]  # one batch: all executed
        stats = c.stats("counting_slow_batch")
        assert (stats["cache_hit"][0], stats["cache_miss"][0], stats["batch_stats"]) == (0, 2, [(3, 1)])
        answers = [_count(c.infer(p, "counting_slow_batch", {"INPUT0": _f32(v, 0, 0, 0)}))
                   for p, v in (("grpc", 3), ("http", 2), ("grpc", 1))]
        assert answers == [[[4]], [[2]], [[5]]]  # C evicts A (the oldest); B is still there
        stats = c.stats("counting_slow_batch")
        assert (stats["cache_hit"][0], stats["cache_miss"][0], stats["execution_count"]) == (1, 4, 3)
        unlucky = ("in ensemble 'ens', Failed to process the request(s) for model 'plain_0_0', message: "
                   "TritonModelException: unlucky 13")
        for protocol in ("http", "grpc"):
            assert c.infer(protocol, "ens", {"IN": _f32(13, 0, 0, 0)}) == unlucky
        assert _count(c.infer("grpc", "ens", {"IN": _f32(6, 0, 0, 0)}), "CNT") == [[3]]
        stats = c.stats("ens")
        assert (stats["fail"][0], stats["cache_hit"][0], stats["cache_miss"], stats["success"][0]) == (4, 0, (1, True), 1)
        metrics = c.metrics(lookups=9)
    labels = '{{model="{}",version="1"}}'
    assert (metrics[f"nv_cache_num_misses_per_model{labels.format('counting_slow_batch')}"],
            metrics[f"nv_cache_num_misses_per_model{labels.format('ens')}"]) == (4, 1)
    assert (metrics["nv_cache_num_misses"], metrics["nv_cache_num_hits"], metrics["nv_cache_num_evictions"]) == (8, 1, 3)


# --- a server without a (usable) cache ------------------------------------------------------
def _triton_refuses_a_cache_of_191_bytes(repository: Path) -> None:
    from support.server import free_ports
    from support.triton import triton_args, triton_or_skip

    triton = triton_or_skip()
    http, grpc, metrics = free_ports(3)
    args = triton_args([repository], [], http_port=http, grpc_port=grpc, metrics_port=metrics)
    done = subprocess.run(triton.command(*args, "--cache-config=local,size=191"), env=triton.env, check=False,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert "Failed to initialize LocalCache" in done.stderr + done.stdout


@pytest.mark.parametrize("server", SERVERS)
def test_without_a_usable_server_cache(repository: Path, server: str) -> None:
    """``response_cache { enable: true }`` on a server without a cache: the model loads and runs every request,
    keeps its per-model cache series (at 0), and there are no cache gauges; decoupled and sequence models that
    enable it are still refused. Triton cannot start with a local cache under 192 bytes; Ferry's command line
    refuses one too, and a server given one otherwise (options built in code) runs without a cache."""
    if server == "triton":
        _triton_refuses_a_cache_of_191_bytes(repository)
    else:
        from serving_pod.cli import build_parser

        with pytest.raises(SystemExit):
            build_parser().parse_args(["--cache-config", "local,size=191"])
        build_parser().parse_args(["--cache-config", "local,size=192"])
    with clients(server, repository, ["counting"], None if server == "triton" else 191) as c:
        counts = [_count(c.infer(p, "counting", {"INPUT0": _f32(1, 2, 3, 4)})) for p in ("http", "grpc")]
        assert counts == [[[1]], [[2]]]
        stats = c.stats("counting")
        assert (stats["cache_hit"], stats["cache_miss"], stats["execution_count"]) == ((0, False), (0, False), 2)
        metrics = c.metrics()
        labels = '{model="counting",version="1"}'
        assert {key: value for key, value in metrics.items() if key.startswith("nv_cache")} == {
            f"nv_cache_num_hits_per_model{labels}": 0, f"nv_cache_hit_duration_per_model{labels}": 0,
            f"nv_cache_num_misses_per_model{labels}": 0, f"nv_cache_miss_duration_per_model{labels}": 0,
        }
        assert [name for name, _ in metrics["families"]] == [
            "nv_cache_hit_duration_per_model", "nv_cache_miss_duration_per_model", "nv_cache_num_hits_per_model",
            "nv_cache_num_misses_per_model"]
        config = c.clients["http"].get_model_config("counting")
        assert config["response_cache"] == {"enable": True}
        grpc_config = c.clients["grpc"].get_model_config("counting", as_json=True)["config"]
        assert grpc_config["response_cache"] == {"enable": True}
        for protocol in ("http", "grpc"):
            for model in ("stream", "seq", "ens_declared", "ens_dec"):
                assert _load_error(c, protocol, model) == _refusal(server, model, protocol)
        index = {entry["name"]: entry for entry in c.clients["http"].get_model_repository_index()}
        if server == "triton":  # the reason is in Triton's log only
            assert index["stream"] == {"name": "stream"} and index["seq"] == {"name": "seq"}
        else:  # Ferry keeps it in view, with no version (core/test_registry_load_refusals.py)
            assert index["stream"]["reason"] == _refusal(server, "stream", "http")[1]
            assert index["seq"]["state"] == "UNAVAILABLE"
        assert (index["ens_dec"]["version"], index["ens_dec"]["state"]) == ("1", "UNAVAILABLE")
        assert index["ens_dec"]["reason"] == ENS_DEC.split("state: ")[1][:-2]
        assert index["stream_nc"]["state"] == "READY"  # loaded as the step: the ensemble's own version failed
