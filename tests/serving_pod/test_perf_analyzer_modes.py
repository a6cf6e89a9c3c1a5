"""perf_analyzer 2.50's other load modes against ``ferry-server``, run as a Triton user runs them.

``test_perf_analyzer.py`` covers the default mode (sync concurrency) and trace settings, ``protocol/
test_shared_memory.py`` ``--shared-memory``. Here, one short run per mode (``--measurement-interval 500``, three
trials): request rate with a Poisson schedule, async concurrency, sequences, decoupled and non-decoupled gRPC
streaming, periodic concurrency, ensembles and BLS with their composing models, request parameters, every
datatype with variable dims and batching, the response cache's breakdown, and ``--collect-metrics`` with a
verbose CSV. Where it can, a run
makes perf_analyzer check the answers itself (``validation_data`` in an ``--input-data`` file: it exits 99 on
the first wrong output), or the test reads back what perf_analyzer recorded per request
(``--profile-export-file``). Each of these modes was run side by side with NVIDIA Triton 2.51 (python backend)
when this file was written; perf_analyzer's own limits (validation with ``-b`` > 1, with shared-memory outputs or
with sequences under ``--request-rate-range``) fail there the same way and are not exercised here.
"""

from __future__ import annotations

import csv
import json
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from benchmarks.servers import Ports
from support.perf_analyzer import perf_analyzer_cmd
from support.server import free_ports, stop_process, wait_ready

pytestmark = [pytest.mark.perf_analyzer, pytest.mark.timeout(240)]

BENCH_MODELS = Path(__file__).resolve().parents[2] / "benchmarks" / "models"
BENCH = ("double_py", "double_ensemble", "bls_double_py", "stream_py")

#: a sequence model with Triton's START control: OUTPUT = INPUT + START, so a request whose START flag is wrong
#: answers wrongly
SEQ_CONFIG = """
name: "seq_py"
backend: "python"
max_batch_size: 8
sequence_batching {
  control_input [
    { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] },
    { name: "READY" control [ { kind: CONTROL_SEQUENCE_READY int32_false_true: [ 0, 1 ] } ] }
  ]
}
input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""
SEQ_MODEL = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT").as_numpy()
            start = pb_utils.get_input_tensor_by_name(request, "START").as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT", (x + start).astype(np.int32))]))
        return out
'''

#: every input comes back as ``<name>_OUT``; ``V`` has variable dims (perf_analyzer needs ``--shape``)
ECHO_TYPES = {"B": ("BOOL", "3"), "H": ("FP16", "3"), "U": ("UINT64", "3"), "I": ("INT16", "3"),
              "D": ("FP64", "3"), "S": ("STRING", "2"), "V": ("FP32", "-1")}
ECHO_CONFIG = 'name: "echo_py"\nbackend: "python"\nmax_batch_size: 4\n' + "".join(
    f'{kind} [ {{ name: "{name}{suffix}" data_type: TYPE_{dtype} dims: [ {dims} ] }} ]\n'
    for kind, suffix in (("input", ""), ("output", "_OUT")) for name, (dtype, dims) in ECHO_TYPES.items())
ECHO_MODEL = '''
import triton_python_backend_utils as pb_utils

NAMES = "BHUIDSV"


class TritonPythonModel:
    def execute(self, requests):
        echo = pb_utils.get_input_tensor_by_name
        return [pb_utils.InferenceResponse([pb_utils.Tensor(n + "_OUT", echo(r, n).as_numpy()) for n in NAMES])
                for r in requests]
'''

#: answers with the request's parameters as the python backend hands them over (a JSON string)
PARAMS_CONFIG = """
name: "params_py"
backend: "python"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "PARAMS" data_type: TYPE_STRING dims: [ 1 ] } ]
"""
PARAMS_MODEL = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("PARAMS", np.array([r.parameters()], dtype=np.object_))])
                for r in requests]
'''

LOCAL = {"seq_py": (SEQ_CONFIG, SEQ_MODEL), "echo_py": (ECHO_CONFIG, ECHO_MODEL),
         "params_py": (PARAMS_CONFIG, PARAMS_MODEL)}
#: ``double_py`` again, under the response cache (the server runs with ``--cache-config local,...``)
CACHED = "cached_py"


@dataclass(frozen=True)
class Run:
    """One finished perf_analyzer run: its exit code, text output, and the files it was asked to write."""

    returncode: int
    output: str
    csv_path: Path
    export_path: Path

    def rows(self) -> list[dict[str, str]]:
        return list(csv.DictReader(self.csv_path.open()))

    def requests(self) -> list[dict]:
        """The requests recorded by ``--profile-export-file`` (BYTES may hold any byte: decoded leniently)."""
        text = self.export_path.read_bytes().decode("utf-8", errors="replace")
        return [r for e in json.loads(text)["experiments"] for r in e["requests"]]


@pytest.fixture(scope="module")
def ferry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Ports]:
    perf_analyzer_cmd()  # skip before starting a server when perf_analyzer cannot be had
    root = tmp_path_factory.mktemp("perf_analyzer_modes")
    repo = root / "models"
    for name in BENCH:
        shutil.copytree(BENCH_MODELS / name, repo / name)
    shutil.copytree(BENCH_MODELS / "double_py", repo / CACHED)
    config = (repo / CACHED / "config.pbtxt").read_text().replace('name: "double_py"', f'name: "{CACHED}"')
    (repo / CACHED / "config.pbtxt").write_text(config + "response_cache { enable: true }\n")
    for name, (config, model) in LOCAL.items():
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "config.pbtxt").write_text(config)
        (repo / name / "1" / "model.py").write_text(model)
    http_port, grpc_port, metrics_port = free_ports(3)
    log = root / "ferry-server.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "serving_pod.cli", f"--model-repository={repo}", f"--http-port={http_port}",
             f"--grpc-port={grpc_port}", f"--metrics-port={metrics_port}", "--cache-config=local,size=1048576"],
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        try:
            wait_ready(http_port, proc)
        except AssertionError:
            pytest.fail(f"ferry-server not ready:\n{log.read_text()[-3000:]}")
        yield Ports(http_port, grpc_port, metrics_port)
    finally:
        stop_process(proc)


def _write_json(path: Path, content: dict) -> Path:
    path.write_text(json.dumps(content))
    return path


def _run(ferry: Ports, protocol: str, tmp_path: Path, *args: str) -> Run:
    """perf_analyzer with ``args`` (``-f`` always; ``--profile-export-file`` is ``tmp_path / "export.json"``
    where a mode asks for it), which must exit 0."""
    binary, env = perf_analyzer_cmd()
    csv_path = tmp_path / "perf.csv"
    argv = [str(binary), "-u", ferry.url(protocol), "-i", protocol, "--measurement-interval", "500",
            "--max-trials", "3", "--stability-percentage", "999", "-f", str(csv_path), *args]
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=180)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"perf_analyzer exit {proc.returncode}: {' '.join(argv[1:])}\n{output[-3000:]}"
    return Run(proc.returncode, output, csv_path, tmp_path / "export.json")


def _throughput(run: Run) -> float:
    (row,) = run.rows()
    return float(row["Inferences/Second"])


def _composing(run: Run, model: str) -> None:
    """The server breakdown lists ``model`` as a composing model with requests of its own."""
    assert "Composing models:" in run.output, run.output[-3000:]
    section = run.output.split("Composing models:")[1]
    assert f"{model}, version: 1" in section, section
    assert int(section.split("Successful request count:")[1].split()[0]) > 0, section


# --- the modes -------------------------------------------------------------------------------------------


def request_rate_poisson(ferry: Ports, protocol: str, tmp_path: Path) -> None:
    run = _run(ferry, protocol, tmp_path, "-m", "double_py", "--request-rate-range", "200",
               "--request-distribution", "poisson")
    assert "Request Rate: 200" in run.output
    assert 120 < _throughput(run) < 280, run.rows()


def async_concurrency(ferry: Ports, protocol: str, tmp_path: Path) -> None:
    run = _run(ferry, protocol, tmp_path, "-m", "double_py", "--async", "--concurrency-range", "4")
    assert "Using asynchronous calls for inference" in run.output
    assert _throughput(run) > 0 and "Server:" in run.output


def sequences_validated(ferry: Ports, protocol: str, tmp_path: Path) -> None:
    """Two equal-length streams of steps (perf_analyzer mis-indexes the expected outputs of unequal ones),
    three sequences at a time on ids 100..199; perf_analyzer checks every answer, so a START flag lost or sent
    on the wrong request fails the run."""
    streams = [[1, 2, 3], [5, 6, 7]]
    data = _write_json(tmp_path / "seq.json", {
        "data": [[{"INPUT": [v]} for v in s] for s in streams],
        "validation_data": [[{"OUTPUT": [v + (k == 0)]} for k, v in enumerate(s)] for s in streams]})
    extra = ["--streaming"] if protocol == "grpc" else []
    run = _run(ferry, protocol, tmp_path, "-m", "seq_py", "--input-data", str(data), "--concurrency-range", "3",
               "--sequence-id-range", "100:200", *extra)
    sequences = int(run.output.split("Sequence count:")[1].split()[0])
    requests = int(run.output.split("Request count:")[1].split()[0])
    # three requests a sequence; the measurement windows cut a few sequences in progress
    assert sequences > 0 and 2.8 < requests / sequences < 3.2, run.output[-2000:]


def serial_sequences(ferry: Ports, protocol: str, tmp_path: Path) -> None:
    run = _run(ferry, protocol, tmp_path, "-m", "seq_py", "--serial-sequences", "--sequence-length", "4",
               "--concurrency-range", "2", "--async")
    assert int(run.output.split("Sequence count:")[1].split()[0]) > 0, run.output[-2000:]


def decoupled_streaming(ferry: Ports, protocol: str, tmp_path: Path) -> None:
    """stream_py sends four responses and then the final flag alone: perf_analyzer (which asks for empty final
    responses) records five per request and counts four times as many responses as requests."""
    run = _run(ferry, protocol, tmp_path, "-m", "stream_py", "--streaming", "--concurrency-range", "2",
               "--profile-export-file", str(tmp_path / "export.json"))
    requests = run.requests()
    assert requests and {len(r["response_timestamps"]) for r in requests} == {5}
    rate = float(run.output.split("Throughput:")[1].split()[0])
    responses = float(run.output.split("Response Throughput:")[1].split()[0])
    assert 3.5 * rate < responses < 4.5 * rate, run.output[-2000:]


def periodic_concurrency(ferry: Ports, protocol: str, tmp_path: Path) -> None:
    run = _run(ferry, protocol, tmp_path, "-m", "stream_py", "--streaming", "--periodic-concurrency-range",
               "1:3:1", "--request-period", "2", "--profile-export-file", str(tmp_path / "export.json"))
    requests = run.requests()
    assert len(requests) >= 3 and {len(r["response_timestamps"]) for r in requests} == {5}


def streaming_non_decoupled(ferry: Ports, protocol: str, tmp_path: Path) -> None:
    data = _write_json(tmp_path / "double.json", {"data": [{"INPUT0": [k / 2 for k in range(16)]}],
                                                  "validation_data": [{"OUTPUT0": [float(k) for k in range(16)]}]})
    run = _run(ferry, protocol, tmp_path, "-m", "double_py", "--streaming", "--concurrency-range", "2",
               "--input-data", str(data))
    assert _throughput(run) > 0 and "Server:" in run.output


def ensemble_validated(ferry: Ports, protocol: str, tmp_path: Path) -> None:
    data = _write_json(tmp_path / "ens.json", {"data": [{"INPUT0": [k / 2 for k in range(16)]}],
                                               "validation_data": [{"OUTPUT0": [2.0 * k for k in range(16)]}]})
    run = _run(ferry, protocol, tmp_path, "-m", "double_ensemble", "--input-data", str(data))
    _composing(run, "double_py")


def bls_composing_models(ferry: Ports, protocol: str, tmp_path: Path) -> None:
    data = _write_json(tmp_path / "bls.json", {"data": [{"INPUT0": [k / 2 for k in range(16)]}],
                                               "validation_data": [{"OUTPUT0": [float(k) for k in range(16)]}]})
    run = _run(ferry, protocol, tmp_path, "-m", "bls_double_py", "--bls-composing-models", "double_py",
               "--input-data", str(data))
    _composing(run, "double_py")


def datatypes_batched(ferry: Ports, protocol: str, tmp_path: Path) -> None:
    """Random BOOL/FP16/UINT64/INT16/FP64/BYTES and a variable-dims FP32 tensor (``--shape``), batch 2: every
    output that perf_analyzer recorded is the input it sent, twice (it sends one sample per batch element and
    records the first). A BYTES tensor is recorded as its serialized bytes less the first length prefix, so the
    second copy comes after the prefix of a 12-byte string; perf_analyzer records FP16 as null."""
    run = _run(ferry, protocol, tmp_path, "-m", "echo_py", "-b", "2", "--shape", "V:5", "--string-length", "12",
               "--profile-export-file", str(tmp_path / "export.json"))
    requests = run.requests()
    assert requests
    for request in requests[:50]:
        sent = request["request_inputs"]
        expected = {f"{name}_OUT": value + "\x0c\x00\x00\x00" + value if isinstance(value, str)
                    else None if value is None else value * 2 for name, value in sent.items()}
        assert len(sent["S"]) == 2 * 12 + 4 and len(sent["V"]) == 5, sent
        assert request["response_outputs"] == [expected], request


def request_parameters(ferry: Ports, protocol: str, tmp_path: Path) -> None:
    run = _run(ferry, protocol, tmp_path, "-m", "params_py", "--request-parameter", "max_tokens:5:int",
               "--request-parameter", "topic:ferry:string", "--request-parameter", "greedy:true:bool",
               "--profile-export-file", str(tmp_path / "export.json"))
    (outputs,) = run.requests()[0]["response_outputs"]
    assert json.loads(outputs["PARAMS"]) == {"max_tokens": 5, "topic": "ferry", "greedy": True}


def metrics_and_verbose_csv(ferry: Ports, protocol: str, tmp_path: Path) -> None:
    """perf_analyzer scrapes Ferry's /metrics during the run (an unreachable or unparsable endpoint ends it) and
    writes its verbose CSV with the metric and percentile columns."""
    run = _run(ferry, protocol, tmp_path, "-m", "double_py", "--collect-metrics", "--metrics-url",
               f"127.0.0.1:{ferry.metrics}/metrics", "--metrics-interval", "100", "--percentile=95",
               "--verbose-csv", "--concurrency-range", "1:2")
    assert "Server Prometheus Metrics:" in run.output
    rows = run.rows()
    assert [row["Concurrency"] for row in rows] == ["1", "2"]
    assert {"Avg GPU Utilization", "Max GPU Memory Usage", "p95 latency"} <= set(rows[0])
    assert all(float(row["Inferences/Second"]) > 0 and float(row["Server Compute Infer"]) > 0 for row in rows)


def response_cache(ferry: Ports, protocol: str, tmp_path: Path) -> None:
    """The same zero input every time: perf_analyzer's cache breakdown (shown for a model whose config enables
    the response cache) counts the first requests as misses and the rest as hits. A batch size of its own per
    protocol, so that each run starts with a key not in the cache yet."""
    batch = "1" if protocol == "http" else "2"
    run = _run(ferry, protocol, tmp_path, "-m", CACHED, "--input-data", "zero", "--concurrency-range", "2",
               "-b", batch)
    server = run.output.split("Server:")[1]
    hits = int(server.split("Cache hit count:")[1].split()[0])
    misses = int(server.split("Cache miss count:")[1].split()[0])
    success = int(server.split("Successful request count:")[1].split()[0])
    assert 1 <= misses <= 2 < hits <= success, server
    assert "Average Cache Hit Latency:" in server and "Average Cache Miss Latency:" in server, server


MODES: list[tuple[Callable[[Ports, str, Path], None], tuple[str, ...]]] = [
    (request_rate_poisson, ("http", "grpc")),
    (async_concurrency, ("http",)),
    (sequences_validated, ("http", "grpc")),
    (serial_sequences, ("grpc",)),
    (decoupled_streaming, ("grpc",)),
    (periodic_concurrency, ("grpc",)),
    (streaming_non_decoupled, ("grpc",)),
    (ensemble_validated, ("http", "grpc")),
    (bls_composing_models, ("grpc",)),
    (datatypes_batched, ("http", "grpc")),
    (request_parameters, ("grpc",)),  # perf_analyzer 2.50 sends request parameters over gRPC only
    (metrics_and_verbose_csv, ("http",)),
    (response_cache, ("http", "grpc")),
]


@pytest.mark.parametrize("mode, protocol", [pytest.param(mode, protocol, id=f"{mode.__name__}-{protocol}")
                                            for mode, protocols in MODES for protocol in protocols])
def test_perf_analyzer_mode(ferry: Ports, mode: Callable[[Ports, str, Path], None], protocol: str,
                            tmp_path: Path) -> None:
    mode(ferry, protocol, tmp_path)
