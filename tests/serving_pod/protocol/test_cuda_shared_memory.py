"""CUDA shared memory extension on a GPU: tritonclient's cuda_shared_memory utilities and perf_analyzer.

Marker ``gpu`` (deselected by default; skipped where cuda-python sees no device). The client allocates
device memory and hands the server (``ferry-server`` in its own process, as CUDA IPC needs) its CUDA IPC
handle; inputs are read from it and outputs written into
it, over HTTP and gRPC. Also: the status of each region (device id, byte size), unregistering, a region
larger than its allocation and a handle that is not one (each refused with a message, the server goes on),
and perf_analyzer ``--shared-memory cuda``.
"""

from __future__ import annotations

import base64
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from tritonclient.utils import InferenceServerException

from support.server import free_ports, stop_process, test_model_config, wait_ready, write_model

PROTOCOLS = ["http", "grpc"]
pytestmark = pytest.mark.gpu


def _cudashm():  # type: ignore[no-untyped-def]
    from serving_pod.core.errors import UnsupportedError
    from serving_pod.cuda_shm import _runtime

    try:
        _runtime()
    except UnsupportedError as exc:
        pytest.skip(str(exc))
    import tritonclient.utils.cuda_shared_memory as cudashm

    return cudashm


class _Server:
    """``ferry-server`` in its own process: CUDA cannot open an IPC handle in the process that made it."""

    def __init__(self, repository: Path, log: Path) -> None:
        self.http, self.grpc, metrics = free_ports(3)
        self.log = log
        self.process = subprocess.Popen(
            [sys.executable, "-m", "serving_pod", f"--model-repository={repository}", f"--http-port={self.http}",
             f"--grpc-port={self.grpc}", f"--metrics-port={metrics}", "--http-address=127.0.0.1",
             "--grpc-address=127.0.0.1", "--metrics-address=127.0.0.1", "--allow-client-shm=true"],
            stdout=log.open("w"), stderr=subprocess.STDOUT, text=True,
        )
        wait_ready(self.http, self.process)
        self.http_url, self.grpc_url = f"127.0.0.1:{self.http}", f"127.0.0.1:{self.grpc}"

    def module(self, protocol: str):  # type: ignore[no-untyped-def]
        import tritonclient.grpc
        import tritonclient.http

        return tritonclient.http if protocol == "http" else tritonclient.grpc

    def client(self, protocol: str):  # type: ignore[no-untyped-def]
        return self.module(protocol).InferenceServerClient(self.http_url if protocol == "http" else self.grpc_url)


@pytest.fixture
def server(tmp_path):
    _cudashm()
    write_model(tmp_path / "repo", "idt", test_model_config("idt"))
    running = _Server(tmp_path / "repo", tmp_path / "server.log")
    yield running
    stop_process(running.process)


@pytest.fixture
def regions():
    cudashm = _cudashm()
    made = []

    def make(name: str, byte_size: int):  # type: ignore[no-untyped-def]
        handle = cudashm.create_shared_memory_region(name, byte_size, 0)
        made.append(handle)
        return handle

    yield make
    for handle in made:
        cudashm.destroy_shared_memory_region(handle)


def _names(status, protocol: str) -> dict[str, tuple[int, int]]:  # type: ignore[no-untyped-def]
    if protocol == "http":
        return {r["name"]: (int(r["device_id"]), int(r["byte_size"])) for r in status}
    return {name: (r.device_id, r.byte_size) for name, r in status.regions.items()}


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_inputs_and_outputs_round_trip_through_cuda_shared_memory(server, regions, protocol):
    cudashm = _cudashm()
    client, module = server.client(protocol), server.module(protocol)
    data = np.arange(8, dtype=np.float32).reshape(2, 4) * 1.5
    in_region = regions("gin", data.nbytes)
    out_region = regions("gout", data.nbytes + 64)
    cudashm.set_shared_memory_region(in_region, [data])
    client.unregister_cuda_shared_memory()
    client.register_cuda_shared_memory("gin", cudashm.get_raw_handle(in_region), 0, data.nbytes)
    client.register_cuda_shared_memory("gout", cudashm.get_raw_handle(out_region), 0, data.nbytes + 64)
    try:
        infer_input = module.InferInput("INPUT0", [2, 4], "FP32")
        infer_input.set_shared_memory("gin", data.nbytes)
        output = module.InferRequestedOutput("OUTPUT0")
        output.set_shared_memory("gout", data.nbytes, offset=64)
        for _ in range(3):
            result = client.infer("idt", [infer_input], outputs=[output])
            meta = result.get_output("OUTPUT0")
            assert (meta["shape"] if protocol == "http" else list(meta.shape)) == [2, 4]
            region = cudashm.get_contents_as_numpy(out_region, np.float32, [16 + 8])  # no offset argument
            np.testing.assert_array_equal(region[16:].reshape(2, 4), data)  # written 64 bytes in
        status = client.get_cuda_shared_memory_status()
        assert _names(status, protocol) == {"gin": (0, data.nbytes), "gout": (0, data.nbytes + 64)}
        client.unregister_cuda_shared_memory("gin")
        assert list(_names(client.get_cuda_shared_memory_status(), protocol)) == ["gout"]
    finally:
        client.unregister_cuda_shared_memory()
    assert _names(client.get_cuda_shared_memory_status(), protocol) == {}


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_bad_cuda_registrations_are_refused_and_the_server_goes_on(server, regions, protocol):
    cudashm = _cudashm()
    client, module = server.client(protocol), server.module(protocol)
    region = regions("small", 256)
    raw = cudashm.get_raw_handle(region)
    # larger than the allocation behind the handle (the driver rounds allocations up; 1 MiB is past it)
    with pytest.raises(InferenceServerException, match="failed to register shared memory region 'big': invalid args"):
        client.register_cuda_shared_memory("big", raw, 0, 1 << 20)
    with pytest.raises(InferenceServerException, match="failed to register shared memory region 'junk': invalid args"):
        client.register_cuda_shared_memory("junk", base64.b64encode(b"\x01" * 64), 0, 64)  # 64 bytes, no handle
    assert "failed to open CUDA IPC handle" in server.log.read_text()  # the detail goes to the log, as Triton's
    client.register_cuda_shared_memory("small", raw, 0, 256)
    try:
        with pytest.raises(InferenceServerException, match="already in manager"):
            client.register_cuda_shared_memory("small", raw, 0, 256)
        infer_input = module.InferInput("INPUT0", [1, 4], "FP32")
        infer_input.set_data_from_numpy(np.ones((1, 4), np.float32))
        output = module.InferRequestedOutput("OUTPUT0")
        output.set_shared_memory("small", 8)
        with pytest.raises(InferenceServerException, match="should be at least 16 bytes"):
            client.infer("idt", [infer_input], outputs=[output])
        np.testing.assert_array_equal(client.infer("idt", [infer_input]).as_numpy("OUTPUT0"), np.ones((1, 4)))
    finally:
        client.unregister_cuda_shared_memory()


@pytest.mark.perf_analyzer
@pytest.mark.timeout(240)
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_perf_analyzer_shared_memory_cuda(server, protocol):
    from support.perf_analyzer import check_shared_memory_run

    check_shared_memory_run(server, protocol, "cuda")
