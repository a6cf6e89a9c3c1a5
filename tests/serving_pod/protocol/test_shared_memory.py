"""System shared memory extension: tritonclient's shm utilities round-trip inputs and outputs over HTTP and gRPC.

Also: region status/unregister through both protocols, outputs too large for their region, and
perf_analyzer ``--shared-memory system`` (skipped when perf_analyzer cannot be installed here).
"""

from __future__ import annotations

import uuid

import numpy as np
import pytest
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

from support.server import test_model_config, write_model

PROTOCOLS = ["http", "grpc"]


@pytest.fixture
def server(threaded_server, tmp_path):
    write_model(tmp_path, "idt", test_model_config("idt"))
    write_model(tmp_path, "idt_int", test_model_config("idt_int", datatype="TYPE_INT32", dims="[ 16 ]"))
    return threaded_server([tmp_path], allow_client_shm=True)


@pytest.fixture
def regions():
    """Create tritonclient shm regions with unique keys; destroyed after the test."""
    made = []

    def make(name: str, byte_size: int):
        handle = shm.create_shared_memory_region(name, f"/ferry_{uuid.uuid4().hex[:12]}", byte_size)
        made.append(handle)
        return handle

    yield make
    for handle in made:
        shm.destroy_shared_memory_region(handle)


def _key(handle) -> str:
    return handle._shm_key


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_inputs_and_outputs_round_trip_through_shared_memory(server, regions, protocol):
    client, module = server.client(protocol), server.module(protocol)
    data = np.arange(8, dtype=np.float32).reshape(2, 4) * 1.5
    in_region = regions("in0", data.nbytes)
    out_region = regions("out0", data.nbytes + 16)
    shm.set_shared_memory_region(in_region, [data])
    client.unregister_system_shared_memory()
    client.register_system_shared_memory("in0", _key(in_region), data.nbytes)
    client.register_system_shared_memory("out0", _key(out_region), data.nbytes + 16)

    infer_input = module.InferInput("INPUT0", [2, 4], "FP32")
    infer_input.set_shared_memory("in0", data.nbytes)
    output = module.InferRequestedOutput("OUTPUT0")
    output.set_shared_memory("out0", data.nbytes, offset=16)
    result = client.infer("idt", [infer_input], outputs=[output])

    meta = result.get_output("OUTPUT0")
    shape = meta["shape"] if protocol == "http" else list(meta.shape)
    assert shape == [2, 4]
    got = shm.get_contents_as_numpy(out_region, np.float32, [2, 4], offset=16)
    np.testing.assert_array_equal(got, data)
    # the data went to shared memory only, not into the response
    if protocol == "http":
        assert set(meta) == {"name", "datatype", "shape"}
    else:
        assert result.get_response().raw_output_contents == [b""]

    status = client.get_system_shared_memory_status()
    names = sorted(r["name"] for r in status) if protocol == "http" else sorted(status.regions)
    assert names == ["in0", "out0"]
    client.unregister_system_shared_memory("in0")
    client.unregister_system_shared_memory()
    status = client.get_system_shared_memory_status()
    assert (status if protocol == "http" else list(status.regions)) == []


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_input_at_an_offset_and_mixed_with_regular_inputs(server, regions, protocol):
    client, module = server.client(protocol), server.module(protocol)
    data = np.arange(32, dtype=np.int32).reshape(2, 16)
    region = regions("both", 64 + data.nbytes)
    shm.set_shared_memory_region(region, [data], offset=64)
    client.register_system_shared_memory("both", _key(region), 64 + data.nbytes)
    try:
        infer_input = module.InferInput("INPUT0", [2, 16], "INT32")
        infer_input.set_shared_memory("both", data.nbytes, offset=64)
        result = client.infer("idt_int", [infer_input])  # output comes back in the response
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), data)
    finally:
        client.unregister_system_shared_memory()


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_output_larger_than_its_region_is_refused(server, regions, protocol):
    client, module = server.client(protocol), server.module(protocol)
    data = np.ones((2, 4), dtype=np.float32)
    small = regions("small", 8)
    client.register_system_shared_memory("small", _key(small), 8)
    try:
        infer_input = module.InferInput("INPUT0", [2, 4], "FP32")
        infer_input.set_data_from_numpy(data)
        output = module.InferRequestedOutput("OUTPUT0")
        output.set_shared_memory("small", 8)
        with pytest.raises(InferenceServerException, match="should be at least 32 bytes"):
            client.infer("idt", [infer_input], outputs=[output])
    finally:
        client.unregister_system_shared_memory()


def test_duplicate_region_name_is_already_exists(server, regions):
    client = server.client("grpc")
    region = regions("dup", 64)
    client.register_system_shared_memory("dup", _key(region), 64)
    try:
        with pytest.raises(InferenceServerException, match="already in manager") as info:
            client.register_system_shared_memory("dup", _key(region), 64)
        assert info.value.status() == "StatusCode.ALREADY_EXISTS"
    finally:
        client.unregister_system_shared_memory()


def test_cuda_shared_memory_without_a_gpu_is_unsupported_but_status_works(server):
    from serving_pod.core.errors import UnsupportedError
    from serving_pod.cuda_shm import _runtime

    try:
        _runtime()
    except UnsupportedError:
        pass  # no cuda-python, or no CUDA device visible to it
    else:
        pytest.skip("a CUDA device is visible here: test_cuda_shared_memory.py covers this host")
    for protocol in PROTOCOLS:
        client = server.client(protocol)
        with pytest.raises(InferenceServerException, match="CUDA shared memory is not supported"):
            client.register_cuda_shared_memory("gpu0", b"AAAA", 0, 64)
        client.unregister_cuda_shared_memory()  # perf_analyzer does this at start
        status = client.get_cuda_shared_memory_status()
        assert (status if protocol == "http" else list(status.regions)) == []


@pytest.mark.perf_analyzer
@pytest.mark.timeout(240)
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_perf_analyzer_shared_memory_system(server, protocol):
    from support.perf_analyzer import check_shared_memory_run

    check_shared_memory_run(server, protocol, "system")
