"""Start, probe and stop the servers under test (Ferry's ``ferry-server``, NVIDIA's ``tritonserver``).

A :class:`ServerSpec` is the command line and environment; :class:`Server` runs it in its own process
group on fixed ports, times process start to ``/v2/health/ready`` = 200 and its models ready, samples RSS
of the whole process tree (Triton's python stubs are child processes, so they count) and stops it with SIGTERM (then SIGKILL of
the children it had). Neighbours: ``perfcsv`` (load generator), ``compare_triton`` / ``batching`` (drivers).
"""

from __future__ import annotations

import contextlib
import http.client
import json
import math
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

import psutil

BENCH_MODELS = Path(__file__).resolve().parent / "models"


class ServerError(RuntimeError):
    """A server did not start or died; the message quotes the end of its log."""


@dataclass(frozen=True)
class Ports:
    http: int
    grpc: int
    metrics: int

    def url(self, protocol: str) -> str:
        """``host:port`` of the ``http`` or ``grpc`` endpoint, as perf_analyzer's ``-u`` takes it."""
        return f"127.0.0.1:{self.http if protocol == 'http' else self.grpc}"


def free_ports() -> Ports:
    """Three distinct ports free right now (bound together so none repeats)."""
    sockets = [socket.socket() for _ in range(3)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        http_port, grpc_port, metrics_port = (s.getsockname()[1] for s in sockets)
    finally:
        for s in sockets:
            s.close()
    return Ports(http_port, grpc_port, metrics_port)


@dataclass(frozen=True)
class ServerSpec:
    """What to run: ``argv`` under ``env``; ``name`` labels it in tables and logs."""

    name: str
    argv: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))


def ferry_base_command() -> list[str]:
    """``ferry-server`` through this interpreter (what the console script runs, minus pyenv/venv shims)."""
    return [sys.executable, "-m", "serving_pod.cli"]


def ferry_spec(name: str, repositories: Sequence[Path], models: Sequence[str], ports: Ports,
               extra: Sequence[str] = ()) -> ServerSpec:
    """Ferry with tritonserver's flag names: explicit control, the given models, the given ports."""
    argv = [*ferry_base_command(), *(f"--model-repository={r}" for r in repositories),
            "--model-control-mode=explicit", *(f"--load-model={m}" for m in models),
            f"--http-port={ports.http}", f"--grpc-port={ports.grpc}", f"--metrics-port={ports.metrics}", *extra]
    env = dict(os.environ)
    repo_root = str(Path(__file__).resolve().parents[1])  # so `serving_pod` imports without an install
    env["PYTHONPATH"] = os.pathsep.join(p for p in (repo_root, env.get("PYTHONPATH", "")) if p)
    return ServerSpec(name, tuple(argv), env)


def triton_spec(name: str, command: Sequence[str], env: Mapping[str, str], repositories: Sequence[Path],
                models: Sequence[str], ports: Ports, extra: Sequence[str] = ()) -> ServerSpec:
    """NVIDIA Triton from ``tests.support.triton`` (``command`` carries ``--backend-directory``), on copies of
    ``repositories`` whose python models import the numpy its stub is built for (``triton_repositories``)."""
    from tests.support.triton import triton_args, triton_repositories

    args = triton_args(triton_repositories(repositories), models, http_port=ports.http, grpc_port=ports.grpc,
                       metrics_port=ports.metrics)
    return ServerSpec(name, (*command, *args, *extra), dict(env))


def sample_answer(port: int, model: str, *, grpc_port: int = 0) -> str:
    """A digest of ``model``'s answer to one request of seeded data (binary tensors, -1 dims as 1), so that runs
    can check every server computed the same thing: over HTTP, or for a decoupled model every response of a gRPC
    stream (on ``grpc_port``). ServerError when an output comes back empty although its shape has elements: a
    server answering without the model's work (Triton 2.51's stub under numpy 2 did)."""
    import hashlib

    import numpy as np
    import tritonclient.http as httpclient
    from tritonclient.utils import triton_to_np_dtype

    client = httpclient.InferenceServerClient(f"127.0.0.1:{port}", network_timeout=30)
    try:
        metadata = client.get_model_metadata(model)
        decoupled = client.get_model_config(model).get("model_transaction_policy", {}).get("decoupled", False)
    finally:
        client.close()
    rng = np.random.default_rng(0)
    inputs = []
    for spec in metadata["inputs"]:
        shape = [1 if dim < 0 else dim for dim in spec["shape"]]
        if spec["datatype"] == "BYTES":
            data = np.full(shape, b"ferry", dtype=np.object_)
        else:
            data = (rng.random(shape) * 100).astype(triton_to_np_dtype(spec["datatype"]))
        inputs.append((spec["name"], shape, spec["datatype"], data))
    names = [output["name"] for output in metadata["outputs"]]
    if decoupled:
        if not grpc_port:
            raise ServerError(f"'{model}' is decoupled: its answer is sampled over a gRPC stream (no gRPC port)")
        results = _streamed(grpc_port, model, inputs, names)
    else:
        results = [_unary(port, model, inputs, names)]
    digest = hashlib.sha256()
    for outputs in results:
        for name, shape, data in outputs:
            if math.prod(shape) and data.size == 0:
                raise ServerError(f"'{model}' answered output '{name}' of shape {shape} with no data")
            digest.update(name.encode() + np.ascontiguousarray(data).tobytes())
    return digest.hexdigest()[:16]


#: one output as received: (name, shape the server announced, data)
Received = tuple[str, list[int], Any]


def _unary(port: int, model: str, inputs: list[tuple], names: list[str]) -> list[Received]:
    import numpy as np
    import tritonclient.http as httpclient

    client = httpclient.InferenceServerClient(f"127.0.0.1:{port}", network_timeout=30)
    try:
        tensors = []
        for name, shape, datatype, data in inputs:
            tensor = httpclient.InferInput(name, shape, datatype)
            tensor.set_data_from_numpy(data, binary_data=True)
            tensors.append(tensor)
        result = client.infer(model, tensors, outputs=[httpclient.InferRequestedOutput(n, binary_data=True)
                                                     for n in names])
    finally:
        client.close()
    received = []
    for output in result.get_response()["outputs"]:
        size = (output.get("parameters") or {}).get("binary_data_size")
        data = result.as_numpy(output["name"]) if size else np.empty(0)
        received.append((output["name"], output["shape"], data))
    return received


def _streamed(port: int, model: str, inputs: list[tuple], names: list[str]) -> list[list[Received]]:
    """Every response of one request on a gRPC stream, in order, up to the final flag."""
    import queue

    import tritonclient.grpc as grpcclient

    answers: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{port}")
    try:
        client.start_stream(callback=lambda result, error: answers.put((result, error)))
        tensors = []
        for name, shape, datatype, data in inputs:
            tensor = grpcclient.InferInput(name, shape, datatype)
            tensor.set_data_from_numpy(data)
            tensors.append(tensor)
        client.async_stream_infer(model, tensors, outputs=[grpcclient.InferRequestedOutput(n) for n in names],
                                  enable_empty_final_response=True)
        received: list[list[Received]] = []
        while True:
            result, error = answers.get(timeout=30)
            if error is not None:
                raise ServerError(f"'{model}' answered with an error: {error}")
            response = result.get_response()
            outputs = [(o.name, list(o.shape), result.as_numpy(o.name)) for o in response.outputs]
            if outputs:
                received.append(outputs)
            final = response.parameters.get("triton_final_response")
            if final is not None and final.bool_param:
                return received
    finally:
        client.stop_stream()
        client.close()


def http_ready(port: int, timeout: float = 1.0, path: str = "/v2/health/ready") -> bool:
    """``GET path`` (server readiness by default) answered 200."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("GET", path)
        return conn.getresponse().status == 200
    except (OSError, http.client.HTTPException):
        return False
    finally:
        conn.close()


def wait_bindable(ports: Ports, timeout: float = 30.0) -> None:
    """Wait until the previous server has released the ports (A B A B reuses them)."""
    deadline = time.monotonic() + timeout
    for port in (ports.http, ports.grpc, ports.metrics):
        while True:
            with socket.socket() as s:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                try:
                    s.bind(("0.0.0.0", port))
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise ServerError(f"port {port} still in use after {timeout:.0f} s") from None
            time.sleep(0.1)


def model_stats(port: int, model: str) -> list[dict]:
    """The ``model_stats`` entries of ``GET /v2/models/<model>/stats`` (both servers answer it).

    Raises OSError or ValueError when the statistics cannot be read.
    """
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/models/{model}/stats", timeout=10) as resp:
        return list(json.load(resp)["model_stats"])


def process_tree(pid: int) -> list[psutil.Process]:
    """A process and its descendants, the root first, then by pid ([] once it is gone)."""
    try:
        root = psutil.Process(pid)
        return [root, *sorted(root.children(recursive=True), key=lambda p: p.pid)]
    except psutil.NoSuchProcess:
        return []


def tree_rss_bytes(pid: int) -> int:
    """Resident set size of a process and all its descendants (0 once it is gone)."""
    total = 0
    for proc in process_tree(pid):
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
            total += proc.memory_info().rss
    return total


class Server:
    """A running server process; use as a context manager so it is always stopped."""

    def __init__(self, spec: ServerSpec, ports: Ports, log_path: Path) -> None:
        self.spec, self.ports, self.log_path = spec, ports, log_path
        self.proc: subprocess.Popen[bytes] | None = None
        self.startup_s = float("nan")
        self.began = float("nan")

    def start(self, timeout: float = 120.0, models: Sequence[str] = ()) -> float:
        """Launch and wait for readiness; returns seconds from spawn to ``/v2/health/ready`` = 200.

        With ``models``, also until each ``/v2/models/<m>/ready`` = 200: a server may call itself ready
        before the models it was told to load are (seen with Ferry), and a benchmark needs them.
        """
        paths = ["/v2/health/ready", *(f"/v2/models/{m}/ready" for m in models)]
        wait_bindable(self.ports)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = self.log_path.open("wb")
        began = self.began = time.monotonic()
        self.proc = subprocess.Popen(self.spec.argv, env=dict(self.spec.env), stdout=log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True)
        log.close()
        while not all(http_ready(self.ports.http, 0.5, path) for path in paths):
            if self.proc.poll() is not None:
                raise ServerError(f"{self.spec.name} exited with {self.proc.returncode} before ready: {self.log_tail()}")
            if time.monotonic() - began > timeout:
                self.stop()
                raise ServerError(f"{self.spec.name} not ready after {timeout:.0f} s: {self.log_tail()}")
            time.sleep(0.01)
        self.startup_s = time.monotonic() - began
        return self.startup_s

    @property
    def pid(self) -> int:
        if self.proc is None:
            raise ServerError(f"{self.spec.name} is not running")
        return self.proc.pid

    def rss_bytes(self) -> int:
        return tree_rss_bytes(self.proc.pid) if self.proc else 0

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout: float = 30.0) -> int | None:
        """SIGTERM, wait (SIGKILL after ``timeout``), then kill any of its children still running."""
        proc, self.proc = self.proc, None
        if proc is None:
            return None
        children: list[psutil.Process] = []
        with contextlib.suppress(psutil.Error):
            children = psutil.Process(proc.pid).children(recursive=True)
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
        for child in children:  # leftovers (e.g. Triton's python stubs); is_running() guards pid reuse
            with contextlib.suppress(psutil.Error):
                if child.is_running():
                    child.kill()
        return proc.returncode

    def log_tail(self, lines: int = 15) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.strip().splitlines()[-lines:])

    def __enter__(self) -> Server:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
