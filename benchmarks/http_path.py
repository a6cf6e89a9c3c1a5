"""Ferry's own CPU per HTTP inference, without sockets: the share of a request that is Ferry's Python.

``compare_triton`` and ``batching`` read the server's CPU per inference under perf_analyzer, which also
counts the kernel's socket work and the effects of a client on the same cores. This harness runs the
engine and the HTTP connection protocol (``http.protocol``) on one event loop with ``--connections``
fake connections, hands each one a whole infer request (the bytes perf_analyzer sends: binary input,
binary output requested) at the same moment, waits for every response, and repeats; it reports process
CPU per request. No perf_analyzer and no ports are needed::

    python -m benchmarks.http_path                         # mlp_onnx batched and unbatched, double_py
    python -m benchmarks.http_path --models double_py --requests 50000

``mlp_onnx`` is measured as the two copies ``batching`` generates (dynamic batching on and off); all
connections' requests arrive together, so the batched copy runs batches of ``--connections``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

from benchmarks import batching, servers

#: FP32 inputs of the models measured, by name: (input name, row width); outputs as the model defines them
INPUT_WIDTHS = {"mlp_onnx": ("INPUT0", 256), "double_py": ("INPUT0", 16), "double_ensemble": ("INPUT0", 16),
                "large_py": ("INPUT0", 262144)}
#: the models an ensemble's steps run on, copied beside it
COMPOSING = {"double_ensemble": ("double_py",)}


class _Transport:
    """The transport side of one fake connection: counts complete responses, keeps the last one."""

    def __init__(self, answered: Callable[[], None]) -> None:
        self.answered = answered
        self._last: tuple[bytes | memoryview, ...] = ()
        self.closing = False

    @property
    def last(self) -> bytes:
        return b"".join(self._last)

    def write(self, data: bytes) -> None:
        self._last = (data,)
        self.answered()

    def writelines(self, pieces: Any) -> None:  # a large body beside its head: kept apart, as a socket's writev
        self._last = tuple(pieces)
        self.answered()

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"sockname": ("127.0.0.1", 8000), "peername": ("127.0.0.1", 40000)}.get(name, default)

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


def infer_request(model: str, input_name: str, width: int, output: str) -> bytes:
    """One HTTP/1.1 infer request as perf_analyzer sends it (its headers, one binary row, binary output)."""
    binary = np.random.default_rng(0).random((1, width), dtype=np.float32).tobytes()
    header = json.dumps({  # perf_analyzer 2.50's JSON, key order and empty id included
        "id": "",
        "inputs": [{"name": input_name, "datatype": "FP32", "shape": [1, width],
                    "parameters": {"binary_data_size": len(binary)}}],
        "outputs": [{"name": output, "parameters": {"binary_data": True}}],
    }, separators=(",", ":")).encode()
    return (b"POST /v2/models/%s/infer HTTP/1.1\r\nHost: 127.0.0.1:8000\r\nUser-Agent: libcurl-agent/1.0\r\n"
            b"Accept: */*\r\nInference-Header-Content-Length: %d\r\nContent-Type: application/octet-stream\r\n"
            b"Content-Length: %d\r\n\r\n" % (model.encode(), len(header), len(header) + len(binary))) + header + binary


async def _asgi_unused(scope: dict, receive: Any, send: Any) -> None:
    raise RuntimeError("only the direct infer path is measured")


async def measure(repository: Path, model: str, request: bytes, connections: int, requests: int) -> float:
    """Microseconds of process CPU per request, after a warm-up; raises if a response is not 200."""
    import uvicorn
    from uvicorn.server import ServerState

    from serving_pod.core.engine import Engine, EngineOptions
    from serving_pod.http.protocol import http_protocol

    engine = Engine(EngineOptions(model_repositories=(str(repository),), model_control_mode="explicit",
                                  load_models=(model,), autocomplete=False))
    await engine.start()
    try:
        protocol = http_protocol(engine=engine, max_input_size=64 << 20, max_header_bytes=64 << 10,
                                 read_timeout_s=60.0)
        config = uvicorn.Config(_asgi_unused, loop="none", lifespan="off", http=protocol, log_level="warning",
                                access_log=False, timeout_keep_alive=75, proxy_headers=False,
                                server_header=False)
        config.load()
        state = ServerState()
        done = asyncio.Event()
        pending = 0

        def answered() -> None:
            nonlocal pending
            pending -= 1
            if not pending:
                done.set()

        pairs = []
        for _ in range(connections):
            connection = protocol(config=config, server_state=state, app_state={})
            transport = _Transport(answered)
            connection.connection_made(transport)  # type: ignore[arg-type]
            pairs.append((connection, transport))

        async def rounds(count: int) -> None:
            nonlocal pending
            for _ in range(max(1, count // connections)):
                done.clear()
                pending = connections
                for connection, _ in pairs:
                    connection.data_received(request)
                await done.wait()

        await rounds(min(requests, 2000))  # warm-up: inline execution mode, caches
        head, _, body = pairs[0][1].last.partition(b"\r\n\r\n")
        status = head.split(b"\r\n", 1)[0].decode("latin-1")
        if status != "HTTP/1.1 200 OK":
            raise RuntimeError(f"model '{model}' answered {status}: {body[:300].decode('latin-1')}")
        began = time.process_time()
        await rounds(requests)
        spent = time.process_time() - began
        for connection, _ in pairs:
            connection.connection_lost(None)
        return spent / (max(1, requests // connections) * connections) * 1e6
    finally:
        await engine.shutdown()


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.http_path", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="mlp_onnx,double_py", help=f"comma-separated, of {sorted(INPUT_WIDTHS)}")
    p.add_argument("--connections", type=int, default=16)
    p.add_argument("--requests", type=int, default=20000, help="measured requests per model")
    args = p.parse_args(argv)
    args.models = [m for m in args.models.split(",") if m]
    unknown = [m for m in args.models if m not in INPUT_WIDTHS]
    if unknown or not args.models:
        p.error(f"unknown model(s) {unknown}: choose from {sorted(INPUT_WIDTHS)}")
    if args.connections < 1 or args.requests < args.connections:
        p.error("--connections must be >= 1 and --requests >= --connections")
    return args


def main(argv: list[str] | None = None) -> int:
    import uvloop

    args = parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="ferry-http-path-") as tmp:
        repository = Path(tmp)
        variants: list[tuple[str, str]] = []  # (label, model name in ``repository``)
        for model in args.models:
            source = servers.BENCH_MODELS / model
            if model == "mlp_onnx":
                names = batching.make_repository(source, repository)
                variants += [(f"{model} {label}", name) for label, name in names.items()]
            else:
                for name in (*COMPOSING.get(model, ()), model):
                    shutil.copytree(servers.BENCH_MODELS / name, repository / name, dirs_exist_ok=True)
                variants.append((model, model))
        print(f"{'model':<20} {'connections':>11} {'requests':>9} {'CPU us/request':>15}")
        for label, name in variants:
            base = label.split()[0]
            input_name, width = INPUT_WIDTHS[base]
            request = infer_request(name, input_name, width, "OUTPUT0")
            cpu_us = uvloop.run(measure(repository, name, request, args.connections, args.requests))
            print(f"{label:<20} {args.connections:>11} {args.requests:>9} {cpu_us:>15.1f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
