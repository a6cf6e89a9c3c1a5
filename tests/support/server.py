"""Test helpers shared by every suite: in-process servers on free ports, model folders, reference model paths.

``ServerHandle`` wraps a running ``FerryServer`` and hands out tritonclient HTTP and gRPC clients; ``write_model``
and ``test_model_config`` build small repositories under ``tmp_path``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import httpx

from serving_pod.core.engine import EngineOptions
from serving_pod.options import ServerOptions
from serving_pod.server import FerryServer

ROOT = Path(__file__).resolve().parents[2]
SHARED = ROOT.parent / "shared"
TRITON_EXAMPLES = SHARED / "models" / "triton-examples"
BENCH_MODELS = SHARED / "models" / "bench"
DEFAULT_MODELS = ROOT / "serving_pod" / "default_models"


@dataclass
class ServerHandle:
    """A running in-process server and ways to talk to it."""

    server: FerryServer
    #: set when the server runs in a background thread (``ServerThread``); ``call`` runs coroutines on its loop.
    thread: Any = None

    def call(self, coroutine: Any) -> Any:
        """Run an engine coroutine on the server's loop from a synchronous test."""
        return self.thread.call(coroutine)

    @property
    def engine(self):
        return self.server.engine

    @property
    def http_url(self) -> str:
        return f"127.0.0.1:{self.server.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.server.grpc_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.server.metrics_port}/metrics"

    def client(self, protocol: str):
        """A sync tritonclient for ``"http"`` or ``"grpc"``."""
        if protocol == "http":
            import tritonclient.http as httpclient

            return httpclient.InferenceServerClient(self.http_url, network_timeout=60.0, connection_timeout=60.0)
        import tritonclient.grpc as grpcclient

        return grpcclient.InferenceServerClient(self.grpc_url)

    def module(self, protocol: str):
        """The tritonclient module for ``protocol`` (for InferInput / InferRequestedOutput)."""
        if protocol == "http":
            import tritonclient.http as httpclient

            return httpclient
        import tritonclient.grpc as grpcclient

        return grpcclient


def make_options(repositories: list[Path | str], **engine_kwargs: Any) -> ServerOptions:
    server_kwargs = {
        key: engine_kwargs.pop(key)
        for key in list(engine_kwargs)
        if key in ServerOptions.__dataclass_fields__ and key != "engine"
    }
    return ServerOptions(
        engine=EngineOptions(model_repositories=tuple(str(r) for r in repositories), **engine_kwargs),
        http_port=0,
        grpc_port=0,
        metrics_port=0,
        http_address="127.0.0.1",
        grpc_address="127.0.0.1",
        metrics_address="127.0.0.1",
        **server_kwargs,
    )


async def in_thread(function: Callable[..., Any], *args: Any) -> Any:
    """Run a blocking client call without blocking the server's event loop (same process)."""
    return await asyncio.to_thread(function, *args)


def copy_models(destination: Path, source: Path, *names: str) -> Path:
    """Copy model folders from ``source`` into ``destination`` (a repository under tmp_path)."""
    destination.mkdir(parents=True, exist_ok=True)
    for name in names:
        shutil.copytree(source / name, destination / name)
    return destination


def write_model(
    repository: Path,
    name: str,
    config: str,
    files: dict[str, str | bytes] | None = None,
    versions: tuple[int, ...] = (1,),
) -> Path:
    """Write ``<repository>/<name>/config.pbtxt`` and version folders (``files`` are relative to the model dir)."""
    model_dir = repository / name
    model_dir.mkdir(parents=True, exist_ok=True)
    (model_dir / "config.pbtxt").write_text(config)
    for version in versions:
        (model_dir / str(version)).mkdir(exist_ok=True)
    for relative, content in (files or {}).items():
        path = model_dir / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)
    return model_dir


def test_model_config(name: str, datatype: str = "TYPE_FP32", dims: str = "[ 4 ]", max_batch_size: int = 8, extra: str = "") -> str:
    """config.pbtxt of a ``ferry_test`` identity model (INPUT0 -> OUTPUT0)."""
    return f"""
name: "{name}"
backend: "ferry_test"
max_batch_size: {max_batch_size}
input [ {{ name: "INPUT0" data_type: {datatype} dims: {dims} }} ]
output [ {{ name: "OUTPUT0" data_type: {datatype} dims: {dims} }} ]
{extra}
"""


test_model_config.__test__ = False  # type: ignore[attr-defined]  # a helper, not a test


def ensemble_config(
    name: str,
    steps: list[str],
    *,
    tensors: tuple[str, str] = ("IN", "OUT"),
    ports: tuple[str, str] = ("INPUT0", "OUTPUT0"),
    max_batch_size: int = 8,
    extra: str = "",
) -> str:
    """config.pbtxt of an ensemble passing one FP32 [4] tensor through ``steps`` in turn: its input ``tensors[0]``
    -> steps[0] -> t0 -> ... -> steps[-1] -> its output ``tensors[1]``. Each step reads its input ``ports[0]`` and
    writes its output ``ports[1]``: a ``test_model_config`` model's by default, or an ensemble's made here
    (``ports`` = that ensemble's ``tensors``)."""
    names = [tensors[0]] + [f"t{index}" for index in range(len(steps) - 1)] + [tensors[1]]
    step_text = ", ".join(
        f'{{ model_name: "{model}" model_version: -1 input_map {{ key: "{ports[0]}" value: "{names[index]}" }} '
        f'output_map {{ key: "{ports[1]}" value: "{names[index + 1]}" }} }}'
        for index, model in enumerate(steps)
    )
    return f"""
name: "{name}"
platform: "ensemble"
max_batch_size: {max_batch_size}
input [ {{ name: "{tensors[0]}" data_type: TYPE_FP32 dims: [ 4 ] }} ]
output [ {{ name: "{tensors[1]}" data_type: TYPE_FP32 dims: [ 4 ] }} ]
ensemble_scheduling {{ step [ {step_text} ] }}
{extra}
"""


def _server_loop() -> asyncio.AbstractEventLoop:
    """uvloop's loop, as ``ferry-server`` runs (``serving_pod.cli``): transports behave as in production
    (uvloop refuses a write to a closed transport, where asyncio's only warns); asyncio's without uvloop."""
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


class ServerThread:
    """A ``FerryServer`` running on its own event loop in a background thread, for synchronous tests.

    tritonclient's sync HTTP client (gevent) must stay on the thread that created it, so tests that use sync
    clients run the server here and call the clients from the test's own thread.
    """

    def __init__(self, options: ServerOptions) -> None:
        import threading

        self.server = FerryServer(options)
        self.loop = _server_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="ferry-test-server", daemon=True)
        self._thread.start()

    def call(self, coroutine: Any, timeout: float = 120.0) -> Any:
        """Run ``coroutine`` on the server's loop and return its result."""
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout)

    def start(self) -> "ServerHandle":
        self.call(self.server.start())
        return ServerHandle(self.server, self)

    def stop(self) -> None:
        try:
            self.call(self.server.stop())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(10)


def free_ports(count: int) -> list[int]:
    """``count`` currently free TCP ports on 127.0.0.1 (for servers started as subprocesses)."""
    sockets = []
    for _ in range(count):
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        sockets.append(sock)
    ports = [s.getsockname()[1] for s in sockets]
    for sock in sockets:
        sock.close()
    return ports


def wait_ready(port: int, process: subprocess.Popen, timeout: float = 60.0) -> None:
    """Poll ``/v2/health/ready`` until 200; fail with the server's stderr (when piped) if it exits first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            stderr = process.stderr.read() if process.stderr is not None else ""
            raise AssertionError(f"server exited early ({process.returncode}): {stderr}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/v2/health/ready", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise AssertionError("server did not become ready")


def wait_for(predicate: Callable[[], bool], timeout: float = 20.0) -> None:
    """Poll ``predicate`` every 50 ms until it holds; AssertionError after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError("condition not reached in time")


def kill_process_group(process: subprocess.Popen) -> None:
    """Kill ``process`` (started with ``start_new_session=True``) and everything in its process group: NVIDIA
    Triton's python backend stubs outlive a killed tritonserver, a Ferry server's HTTP workers their server."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
    process.kill()
    process.wait()


def stop_process(process: subprocess.Popen, timeout: float = 10.0) -> None:
    """Terminate a subprocess started by a test, killing it if it does not exit within ``timeout``."""
    process.terminate()
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def assert_load_refused(server: ServerHandle, protocol: str, refused: str, message: str, loads: str) -> None:
    """Explicit model control over ``protocol``: loading ``refused`` fails with ``message`` (a regex), then
    ``loads`` still loads and is ready while ``refused`` is not (the server goes on)."""
    from tritonclient.utils import InferenceServerException

    client = server.client(protocol)
    try:
        client.load_model(refused)
    except InferenceServerException as exc:
        assert re.search(message, str(exc)), str(exc)
    else:
        raise AssertionError(f"loading '{refused}' succeeded; expected a refusal matching {message!r}")
    client.load_model(loads)
    assert client.is_model_ready(loads) and not client.is_model_ready(refused)
