"""The statistics extension side by side with NVIDIA Triton 2.51: the same requests, the same ``model_stats``.

The python models of ``data/metrics`` and three written here (a BLS parent, a cached model, a sequence model) get
the same request sequence on Ferry and on Triton (``support.triton``; skipped with the installer's reason where it
cannot be had): batches of 1 and 2, a model that raises and one that answers with an error response, an ensemble
whose second step fails, a BLS child request, response-cache hits and misses, a sequence, queue timeouts, a
decoupled model over a gRPC stream, one version of two. Then every statistics answer is read over HTTP
(``GET /v2/models[/<m>[/versions/<v>]]/stats``) and gRPC (``ModelStatistics``) and compared with durations masked:
fields, their order and types (HTTP JSON numbers; gRPC JSON uint64 strings and zero fields left out), counts,
``batch_stats`` in batch-size order, empty ``response_stats`` and ``memory_usage`` (2.51's python backend reports
neither, decoupled or not), the ``last_inference`` a cache hit leaves alone, the models listed (every ready version,
ensembles included, an unloaded model gone), and the errors for an unknown model, a missing version and a version
string that does not parse. Ferry is checked against Triton's recorded answers always.

Difference fixed here: gRPC ``ModelStatistics`` with no model name and a version that does not parse (``-1``,
``abc``) is refused by Triton, which reads the version first; Ferry listed every model.

Kept different on purpose: Triton does not percent-decode a model name in the URL (``/v2/models/id%65nt/stats`` is
"requested model 'id%65nt' is not available", ``/versions/%31/stats`` a 404), so a model whose name needs escaping
cannot be addressed over HTTP; Ferry decodes the path as every HTTP server does.

Known differences outside the statistics code, not compared here: a request of a model without dynamic batching
whose gRPC client goes away while it waits for an instance is executed and counted a success by Triton, dropped
and counted one failure of reason ``CANCELED`` by Ferry (``schedulers/default.py``,
tests/serving_pod/schedulers/test_cancelled_requests_triton.py); an ensemble request whose client goes away while a step
runs is counted a success by Triton (which runs the steps to the end), one failure of reason ``CANCELED`` by
Ferry, which cancels the steps left (``schedulers/ensemble.py``); an explicit load of a model that
is already loaded and unchanged restarts its statistics in Triton (it reloads every version), Ferry keeps them
(``core/registry.py``).
"""

from __future__ import annotations

import contextlib
import shutil
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from support.traffic import int32_rows as _rows
from support.traffic import post_infer as _post
from support.traffic import stream_answers as _stream
from support.server import ServerThread, make_options, write_model

DATA = Path(__file__).resolve().parents[1] / "data" / "metrics"
COPIED = ("flaky", "timed", "dec", "ident", "ens", "ver")
MODELS = (*COPIED, "bls", "cached", "seq")
CACHE_BYTES = 1 << 20

BLS_MODEL = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X")
            child = pb_utils.InferenceRequest(model_name="ident", inputs=[x], requested_output_names=["Y"]).exec()
            if child.has_error():
                out.append(pb_utils.InferenceResponse(error=child.error()))
            else:
                out.append(pb_utils.InferenceResponse([pb_utils.get_output_tensor_by_name(child, "Y")]))
        return out
'''

ECHO_MODEL = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("Y", pb_utils.get_input_tensor_by_name(r, "X").as_numpy())])
                for r in requests]
'''

_IO = ('input [ { name: "X" data_type: TYPE_INT32 dims: [ 2 ] } ]\n'
       'output [ { name: "Y" data_type: TYPE_INT32 dims: [ 2 ] } ]\n')
BLS_CONFIG = ('name: "bls"\nbackend: "python"\nmax_batch_size: 0\n'
              'input [ { name: "X" data_type: TYPE_INT32 dims: [ 1, 2 ] } ]\n'
              'output [ { name: "Y" data_type: TYPE_INT32 dims: [ 1, 2 ] } ]\n')
CACHED_CONFIG = f'name: "cached"\nbackend: "python"\nmax_batch_size: 8\n{_IO}response_cache {{ enable: true }}\n'
SEQ_CONFIG = (f'name: "seq"\nbackend: "python"\nmax_batch_size: 2\n{_IO}'
              'sequence_batching { control_input [ { name: "START" control [ '
              '{ kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] } ] }\n')


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("statistics_triton") / "models"
    for name in COPIED:
        shutil.copytree(DATA / name, repo / name, ignore=shutil.ignore_patterns("__pycache__"))
    (repo / "ens" / "1").mkdir()  # an ensemble's version folder is empty (git keeps no empty folder)
    write_model(repo, "bls", BLS_CONFIG, {"1/model.py": BLS_MODEL})
    write_model(repo, "cached", CACHED_CONFIG, {"1/model.py": ECHO_MODEL})
    write_model(repo, "seq", SEQ_CONFIG, {"1/model.py": ECHO_MODEL})
    return repo


@contextlib.contextmanager
def _ferry(repository: Path) -> Iterator[tuple[int, int]]:
    thread = ServerThread(make_options([repository], model_control_mode="explicit", load_models=MODELS,
                                       cache_config={"local": {"size": str(CACHE_BYTES)}}))
    handle = thread.start()
    try:
        yield handle.server.http_port, handle.server.grpc_port
    finally:
        thread.stop()


@contextlib.contextmanager
def _triton(repository: Path) -> Iterator[tuple[int, int]]:
    from support.triton import running_triton

    with running_triton(repository, MODELS, f"--cache-config=local,size={CACHE_BYTES}") as (http, grpc, _):
        yield http, grpc


# --- the request sequence ----------------------------------------------------------------------------------------
def _traffic(http: int, grpc: int) -> list[int]:
    """The module docstring's requests; their HTTP status codes and the stream's answer count."""
    codes = [
        _post(http, "ident", _rows([0, 0])),
        _post(http, "ident", _rows([0, 0], [1, 1])),
        _post(http, "flaky", _rows([0, 0])),
        _post(http, "flaky", _rows([0, 1])),                  # execute raises: a failure
        _post(http, "flaky", _rows([0, 2])),                  # an error response: a success
        _post(http, "ens", _rows([0, 0], [0, 0])),
        _post(http, "ens", _rows([0, 1])),                    # its second step raises: two failures
        _post(http, "ver/versions/1", _rows([0, 0])),
        _post(http, "bls", _rows([3, 4], shape=[1, 2])),      # and a child request of ident
        _post(http, "cached", _rows([1, 1])),                 # a miss
        _post(http, "cached", _rows([1, 1])),                 # a hit
        _post(http, "cached", _rows([1, 2], [3, 4])),         # a miss, batch of 2
        _post(http, "seq", _rows([1, 1], sequence_id=5, sequence_start=True)),
        _post(http, "seq", _rows([1, 1], sequence_id=5, sequence_end=True)),
        _post(http, "seq", _rows([1, 1])),                    # no sequence id: refused before the model
    ]
    with ThreadPoolExecutor(3) as pool:
        busy = pool.submit(_post, http, "timed", _rows([1000, 0]))
        time.sleep(0.3)
        late = [pool.submit(_post, http, "timed", _rows([0, 0])) for _ in range(2)]  # wait over 100 ms: REJECTED
        codes += [busy.result()] + [future.result() for future in late]
    codes.append(_stream(grpc, "dec", (3, 0, -1, -2, 1), 7))  # -1: execute raises, -2: a response and an error
    return codes


TRITON_CODES = [200, 200, 200, 500, 500, 200, 500, 200, 200, 200, 200, 200, 200, 200, 400, 200, 503, 503, 7]


# --- reading the answers -----------------------------------------------------------------------------------------
def _http(http: int, path: str) -> tuple[int, str | None, Any]:
    answer = httpx.get(f"http://127.0.0.1:{http}/v2/models/{path}", timeout=10)
    body = answer.json() if answer.status_code == 200 else answer.text
    return answer.status_code, answer.headers.get("content-type"), body


def _grpc(grpc: int, name: str, version: str) -> Any:
    """The ``ModelStatistics`` answer as protobuf's JSON mapping (what a gRPC client's ``as_json`` gives), or the
    error's (code, details)."""
    import grpc as grpc_module
    import tritonclient.grpc as grpcclient
    from google.protobuf import json_format

    client = grpcclient.InferenceServerClient(f"127.0.0.1:{grpc}")
    try:
        request = grpcclient.service_pb2.ModelStatisticsRequest(name=name, version=version)
        return json_format.MessageToDict(client._client_stub.ModelStatistics(request))
    except grpc_module.RpcError as error:
        return error.code().name, error.details()
    finally:
        client.close()


def _masked(document: Any) -> Any:
    """``document`` with durations and timestamps replaced by whether they are set (``ns`` and ``last_inference`` /
    ``lastInference``, an HTTP number or a gRPC string): ``"set"``, or the zero as it was. Types and order stay."""
    if isinstance(document, dict):
        return {key: ("set" if int(value) else value) if key in _TIMED else _masked(value)
                for key, value in document.items()}
    if isinstance(document, (list, tuple)):
        return type(document)(_masked(item) for item in document)
    return document


_TIMED = frozenset({"ns", "last_inference", "lastInference"})


HTTP_PATHS = ("stats", "ident/stats", "ver/stats", "ver/versions/2/stats", "ens/stats", "dec/stats",
              "nope/stats", "nope/versions/1/stats", "ver/versions/9/stats", "ident/versions/0/stats",
              "ident/versions/abc/stats", "ident/versions/-1/stats")
GRPC_CASES = (("", ""), ("ident", ""), ("ver", ""), ("ver", "2"), ("ens", ""), ("dec", ""), ("nope", ""), ("nope", "1"), ("ver", "9"),
              ("ident", "0"), ("ident", "abc"), ("ident", "-1"), ("ident", "99999999999999999999"),
              ("", "9"), ("", "-1"), ("", "abc"))


def _collect(http: int, grpc: int) -> dict[str, Any]:
    """Everything this module compares, read from one server."""
    started_ms = time.time_ns() // 1_000_000
    answers: dict[str, Any] = {"codes": _traffic(http, grpc)}
    answers["window_ms"] = (started_ms, time.time_ns() // 1_000_000)
    time.sleep(0.3)  # Triton reports a stream's last statistics after its final response
    for path in HTTP_PATHS:
        answers[f"http {path}"] = _http(http, path)
    for name, version in GRPC_CASES:
        answers[f"grpc {name}/{version}"] = _grpc(grpc, name, version)
    before = _http(http, "cached/stats")[2]["model_stats"][0]["last_inference"]
    time.sleep(0.05)
    answers["http escaped"] = _http(http, "id%65nt/stats")
    answers["cache hit"] = _post(http, "cached", _rows([1, 1]))
    after = _http(http, "cached/stats")[2]["model_stats"][0]
    answers["cache hit last_inference"] = (before, after["last_inference"], after["inference_stats"]["cache_hit"]["count"])
    unload = httpx.post(f"http://127.0.0.1:{http}/v2/repository/models/ver/unload", timeout=30)
    answers["unload"] = unload.status_code
    answers["http after unload"] = _http(http, "ver/stats")
    answers["grpc after unload"] = _grpc(grpc, "ver", "1")
    listed = _http(http, "stats")[2]["model_stats"]
    answers["listed after unload"] = [(entry["name"], entry["version"]) for entry in listed]
    return answers


@pytest.fixture(scope="module")
def ferry(repository: Path) -> dict[str, Any]:
    with _ferry(repository) as (http, grpc):
        return _collect(http, grpc)


@pytest.fixture(scope="module")
def triton(repository: Path) -> dict[str, Any]:
    with _triton(repository) as (http, grpc):
        return _collect(http, grpc)


# --- Triton's recorded answers -----------------------------------------------------------------------------------
def _counts(entry: dict[str, Any]) -> tuple:
    """An HTTP ``model_stats`` entry's counts: (inference, execution, {stat: count} of the non-zero ones,
    [(batch_size, compute_infer count)], last_inference set)."""
    stats = {key: value["count"] for key, value in entry["inference_stats"].items() if value["count"]}
    batches = [(batch["batch_size"], batch["compute_infer"]["count"]) for batch in entry["batch_stats"]]
    return entry["inference_count"], entry["execution_count"], stats, batches, entry["last_inference"] > 0


def _computed(count: int, **more: int) -> dict[str, int]:
    return {"success": count, "queue": count, "compute_input": count, "compute_infer": count,
            "compute_output": count, **more}


#: what Triton 2.51 answered after ``_traffic`` (name, version) -> ``_counts``
TRITON_COUNTS = {
    ("bls", "1"): (1, 1, _computed(1), [(1, 1)], True),
    ("cached", "1"): (3, 2, {**_computed(2, success=3, queue=3), "cache_hit": 1, "cache_miss": 2}, [(1, 1), (2, 1)],
                      True),
    ("dec", "1"): (4, 5, _computed(4, fail=1), [(1, 5)], True),
    ("ens", "1"): (2, 1, _computed(1, fail=2), [(2, 1)], True),
    ("flaky", "1"): (4, 5, _computed(3, fail=2), [(1, 4), (2, 1)], True),
    ("ident", "1"): (7, 5, _computed(5), [(1, 3), (2, 2)], True),
    ("seq", "1"): (2, 2, _computed(2), [(1, 2)], True),
    ("timed", "1"): (1, 1, _computed(1, fail=2), [(1, 1)], True),
    ("ver", "1"): (1, 1, _computed(1), [(1, 1)], True),
    ("ver", "2"): (0, 0, {}, [], False),
}

NOT_AVAILABLE = "requested model 'nope' is not available"
NOT_AVAILABLE_BODY = f'{{"error":"{NOT_AVAILABLE}"}}'
BAD_VERSION = ("failed to get model version from specified version string '{}' (details: stol), version should be "
               "an integral value > 0")
#: Triton's errors: HTTP (status, content type, body), gRPC (code, details)
TRITON_ERRORS = {
    "http nope/stats": (400, "application/json", NOT_AVAILABLE_BODY),
    "http nope/versions/1/stats": (400, "application/json", NOT_AVAILABLE_BODY),
    "http ver/versions/9/stats": (400, "application/json",
                                  '{"error":"requested model version is not available for model \'ver\'"}'),
    "http ident/versions/0/stats": (400, "application/json",
                                    '{"error":"requested model version is not available for model \'ident\'"}'),
    "http ident/versions/abc/stats": (404, "text/plain", '{"error":"Not Found"}'),
    "http ident/versions/-1/stats": (404, "text/plain", '{"error":"Not Found"}'),
    "grpc nope/": ("INVALID_ARGUMENT", NOT_AVAILABLE),
    "grpc nope/1": ("INVALID_ARGUMENT", NOT_AVAILABLE),
    "grpc ver/9": ("INVALID_ARGUMENT", "requested model version is not available for model 'ver'"),
    "grpc ident/0": ("INVALID_ARGUMENT", "requested model version is not available for model 'ident'"),
    "grpc ident/abc": ("INVALID_ARGUMENT", BAD_VERSION.format("abc")),
    "grpc ident/-1": ("INVALID_ARGUMENT",
                      "invalid model version specified '-1' , version should be an integral value > 0"),
    "grpc ident/99999999999999999999": ("INVALID_ARGUMENT", BAD_VERSION.format("99999999999999999999")),
    "grpc /-1": ("INVALID_ARGUMENT", "invalid model version specified '-1' , version should be an integral value > 0"),
    "grpc /abc": ("INVALID_ARGUMENT", BAD_VERSION.format("abc")),
}

HTTP_FIELDS = ["name", "version", "last_inference", "inference_count", "execution_count", "inference_stats",
               "response_stats", "batch_stats", "memory_usage"]
STAT_FIELDS = ["success", "fail", "queue", "compute_input", "compute_infer", "compute_output", "cache_hit",
               "cache_miss"]


# --- Ferry against the recorded answers ----------------------------------------------------------------------------
def test_counts_after_the_same_requests(ferry: dict[str, Any]) -> None:
    """Every ready version is listed, in (name, version) order, ensembles included, each with Triton's counts."""
    assert ferry["codes"] == TRITON_CODES
    status, content_type, body = ferry["http stats"]
    assert (status, content_type) == (200, "application/json")
    assert {(e["name"], e["version"]): _counts(e) for e in body["model_stats"]} == TRITON_COUNTS
    assert [(e["name"], e["version"]) for e in body["model_stats"]] == sorted(TRITON_COUNTS)


def test_http_fields_and_types(ferry: dict[str, Any]) -> None:
    """HTTP JSON: Triton's field order, uint64 as JSON numbers, empty ``response_stats`` and ``memory_usage`` also
    for the decoupled model, ``batch_stats`` in batch-size order, ``last_inference`` in ms since the epoch."""
    for entry in ferry["http stats"][2]["model_stats"]:
        assert list(entry) == HTTP_FIELDS
        assert list(entry["inference_stats"]) == STAT_FIELDS
        assert all(type(entry[key]) is int for key in ("last_inference", "inference_count", "execution_count"))
        for duration in entry["inference_stats"].values():
            assert list(duration) == ["count", "ns"] and {type(v) for v in duration.values()} == {int}
            assert (duration["count"] > 0) == (duration["ns"] > 0)
        assert entry["response_stats"] == {} and entry["memory_usage"] == []
        sizes = [batch["batch_size"] for batch in entry["batch_stats"]]
        assert sizes == sorted(sizes)
        for batch in entry["batch_stats"]:
            assert list(batch) == ["batch_size", "compute_input", "compute_infer", "compute_output"]
        if entry["last_inference"]:
            start, end = ferry["window_ms"]
            assert start <= entry["last_inference"] <= end


def _listed(ferry: dict[str, Any], protocol: str, name: str, version: str) -> list[tuple[str, str, int, int]]:
    """(name, version, inference_count, execution_count) of each entry of one answer, as ints."""
    if protocol == "http":
        path = f"{name}/versions/{version}/stats" if version else f"{name}/stats"
        entries = ferry[f"http {path}"][2]["model_stats"]
        return [(e["name"], e["version"], e["inference_count"], e["execution_count"]) for e in entries]
    entries = ferry[f"grpc {name}/{version}"]["modelStats"]
    return [(e["name"], e["version"], int(e.get("inferenceCount", 0)), int(e.get("executionCount", 0)))
            for e in entries]


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_one_model_and_one_version(ferry: dict[str, Any], protocol: str) -> None:
    """A model's answer lists its ready versions; a version filter, that version; the same over both protocols."""
    def expected(*keys: tuple[str, str]) -> list[tuple[str, str, int, int]]:
        return [(*key, *TRITON_COUNTS[key][:2]) for key in keys]

    assert _listed(ferry, protocol, "ident", "") == expected(("ident", "1"))
    assert _listed(ferry, protocol, "ver", "") == expected(("ver", "1"), ("ver", "2"))
    assert _listed(ferry, protocol, "ver", "2") == expected(("ver", "2"))
    assert _listed(ferry, protocol, "ens", "") == expected(("ens", "1"))
    assert _listed(ferry, protocol, "dec", "") == expected(("dec", "1"))


def test_grpc_json_leaves_zero_fields_out(ferry: dict[str, Any]) -> None:
    """gRPC (protobuf's JSON mapping): uint64 as strings, zero counts and an unused version's ``lastInference``,
    counts and ``batchStats`` left out, ``inferenceStats`` always there."""
    entries = {(e["name"], e["version"]): e for e in ferry["grpc /"]["modelStats"]}
    assert sorted(entries) == sorted(TRITON_COUNTS)
    unused = entries["ver", "2"]
    empty = ["success", "fail", "queue", "computeInput", "computeInfer", "computeOutput", "cacheHit", "cacheMiss"]
    assert unused == {"name": "ver", "version": "2", "inferenceStats": {key: {} for key in empty}}
    ident = entries["ident", "1"]
    assert [ident["inferenceCount"], ident["executionCount"]] == ["7", "5"]
    assert ident["inferenceStats"]["fail"] == {} and ident["inferenceStats"]["success"]["count"] == "5"
    assert [(b["batchSize"], b["computeInfer"]["count"]) for b in ident["batchStats"]] == [("1", "3"), ("2", "2")]
    assert "responseStats" not in ident and "memoryUsage" not in ident


@pytest.mark.parametrize("key", sorted(TRITON_ERRORS))
def test_errors(ferry: dict[str, Any], key: str) -> None:
    """An unknown model, a version that is not there, a version string that does not parse (gRPC: also with no
    model name, which Triton refuses where Ferry listed every model); HTTP routes only digits."""
    assert tuple(ferry[key]) == TRITON_ERRORS[key]


def test_a_percent_encoded_name_is_decoded(ferry: dict[str, Any]) -> None:
    """Kept different on purpose (module docstring): Triton looks up ``id%65nt`` as it is."""
    status, _, body = ferry["http escaped"]
    assert status == 200 and [(e["name"], e["version"]) for e in body["model_stats"]] == [("ident", "1")]


def test_a_version_without_a_model_is_ignored(ferry: dict[str, Any]) -> None:
    assert ferry["grpc /9"] == ferry["grpc /"]


def test_a_cache_hit_leaves_last_inference(ferry: dict[str, Any]) -> None:
    before, after, hits = ferry["cache hit last_inference"]
    assert ferry["cache hit"] == 200 and hits == 2
    assert after == before > 0


def test_an_unloaded_model_is_gone(ferry: dict[str, Any]) -> None:
    assert ferry["unload"] == 200
    assert tuple(ferry["http after unload"]) == (400, "application/json",
                                                 '{"error":"requested model \'ver\' is not available"}')
    assert tuple(ferry["grpc after unload"]) == ("INVALID_ARGUMENT", "requested model 'ver' is not available")
    assert ferry["listed after unload"] == [key for key in sorted(TRITON_COUNTS) if key[0] != "ver"]


# --- Ferry against Triton itself -----------------------------------------------------------------------------------
@pytest.mark.slow  # live NVIDIA Triton: Ferry's half runs by default against the same expected answers
def test_every_answer_matches_nvidia_tritons(ferry: dict[str, Any], triton: dict[str, Any]) -> None:
    """Every answer read, durations masked, equal field for field (order and types included), over HTTP and gRPC."""
    assert triton["codes"] == TRITON_CODES
    skipped = {"window_ms", "http escaped"}
    assert triton["http escaped"] == (400, "application/json",
                                      '{"error":"requested model \'id%65nt\' is not available"}')
    assert sorted(ferry) == sorted(triton)
    for key in sorted(set(triton) - skipped):
        expected, got = _masked(triton[key]), _masked(ferry[key])
        if key == "cache hit last_inference":
            expected, got = (expected[0] == expected[1], expected[2]), (got[0] == got[1], got[2])
        assert repr(got) == repr(expected), key
    for key, answer in TRITON_ERRORS.items():
        assert tuple(triton[key]) == answer, key
    assert {(e["name"], e["version"]): _counts(e) for e in triton["http stats"][2]["model_stats"]} == TRITON_COUNTS
