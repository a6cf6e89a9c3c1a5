"""Triton's ``simple_sequence`` / ``simple_dyna_sequence`` examples give the results Triton's own clients check.

The expected values are those of Triton's client examples (simple_http_sequence_sync_infer_client.py,
simple_grpc_sequence_sync_infer_client.py, simple_grpc_sequence_stream_infer_client.py): two integer
sequences (ids 1000 and 1001, values [0, 11, 7, 5, 3, 2, 0, 1] and [100, -11, ...]) and, for the
non-dyna model, a string-id sequence; the dyna model adds the correlation id on the last request.
Skipped when the shared example models are absent.
"""

from __future__ import annotations

import queue
import threading
import uuid

import numpy as np
import pytest

from support.server import TRITON_EXAMPLES

pytestmark = pytest.mark.skipif(
    not (TRITON_EXAMPLES / "simple_sequence").is_dir(), reason="Triton example models not present"
)

VALUES = [11, 7, 5, 3, 2, 0, 1]


def expected(index: int, dyna: bool) -> tuple[int, int]:
    """Triton's client examples' expected (seq 1000, seq 1001) output for request ``index``."""
    seq0 = 1 if index == 0 else VALUES[index - 1]
    seq1 = 101 if index == 0 else -VALUES[index - 1]
    if dyna and index != 0 and VALUES[index - 1] == 1:
        seq0, seq1 = seq0 + 1000, seq1 + 1001
    return seq0, seq1


def string_expected(index: int) -> int:
    return 21 if index == 0 else -VALUES[index - 1]


@pytest.fixture(scope="module")
def examples():
    from support.server import ServerThread, make_options

    thread = ServerThread(make_options([TRITON_EXAMPLES]))
    handle = thread.start()
    yield handle
    thread.stop()


def _input(module, value: int):
    tensor = module.InferInput("INPUT", [1, 1], "INT32")
    tensor.set_data_from_numpy(np.full([1, 1], value, np.int32))
    return tensor


def _sync_send(handle, protocol: str, model: str, sequence_id, values: list[int]) -> list[int]:
    module, client = handle.module(protocol), handle.client(protocol)
    results = []
    for count, value in enumerate(values, 1):
        result = client.infer(
            model, [_input(module, value)], outputs=[module.InferRequestedOutput("OUTPUT")],
            sequence_id=sequence_id, sequence_start=count == 1, sequence_end=count == len(values),
        )
        results.append(int(result.as_numpy("OUTPUT")[0][0]))
    client.close()
    return results


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize("model", ["simple_sequence", "simple_dyna_sequence"])
def test_sync_sequences_match_triton_examples(examples, protocol: str, model: str) -> None:
    dyna = model == "simple_dyna_sequence"
    seq0 = _sync_send(examples, protocol, model, 1000, [0] + VALUES)
    seq1 = _sync_send(examples, protocol, model, 1001, [100] + [-v for v in VALUES])
    assert list(zip(seq0, seq1)) == [expected(i, dyna) for i in range(len(VALUES) + 1)]
    if not dyna:  # the string-id sequence of the examples (simple_sequence has no CORRID input)
        strings = _sync_send(examples, protocol, model, str(uuid.uuid4()), [20] + [-v for v in VALUES])
        assert strings == [string_expected(i) for i in range(len(VALUES) + 1)]


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize("model", ["simple_sequence", "simple_dyna_sequence"])
def test_concurrent_interleaved_sequences(examples, protocol: str, model: str) -> None:
    """Both sequences at once from two threads: each still gets its own results."""
    dyna = model == "simple_dyna_sequence"
    results: dict[int, list[int]] = {}

    def run(sequence_id: int, values: list[int]) -> None:
        results[sequence_id] = _sync_send(examples, protocol, model, sequence_id, values)

    threads = [
        threading.Thread(target=run, args=(1000, [0] + VALUES)),
        threading.Thread(target=run, args=(1001, [100] + [-v for v in VALUES])),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert list(zip(results[1000], results[1001])) == [expected(i, dyna) for i in range(len(VALUES) + 1)]


@pytest.mark.parametrize("model", ["simple_sequence", "simple_dyna_sequence"])
def test_grpc_stream_sequences_match_triton_example(examples, model: str) -> None:
    """simple_grpc_sequence_stream_infer_client.py: three sequences interleaved on one stream."""
    import tritonclient.grpc as grpcclient

    dyna = model == "simple_dyna_sequence"
    responses: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(examples.grpc_url)
    client.start_stream(callback=lambda result, error: responses.put(error or result))
    sequences: dict[str, list[int]] = {"1000": [0] + VALUES, "1001": [100] + [-v for v in VALUES]}
    if not dyna:
        sequences[str(uuid.uuid4())] = [20] + [-v for v in VALUES]
    for key, values in sequences.items():
        sequence_id = int(key) if key.isdigit() else key
        for count, value in enumerate(values, 1):
            client.async_stream_infer(
                model, [_input(grpcclient, value)], outputs=[grpcclient.InferRequestedOutput("OUTPUT")],
                request_id=f"{key}_{count}", sequence_id=sequence_id,
                sequence_start=count == 1, sequence_end=count == len(values),
            )
    got: dict[str, list[int]] = {key: [] for key in sequences}
    for _ in range(sum(len(v) for v in sequences.values())):
        item = responses.get(timeout=30)
        assert not isinstance(item, Exception), item
        got[item.get_response().id.rsplit("_", 1)[0]].append(int(item.as_numpy("OUTPUT")[0][0]))
    client.stop_stream()
    client.close()
    assert list(zip(got["1000"], got["1001"])) == [expected(i, dyna) for i in range(len(VALUES) + 1)]
    for key in sequences.keys() - {"1000", "1001"}:
        assert got[key] == [string_expected(i) for i in range(len(VALUES) + 1)]


def test_dyna_sequence_rejects_string_id_for_uint64_corrid(examples) -> None:
    from tritonclient.utils import InferenceServerException

    client = examples.client("grpc")
    with pytest.raises(InferenceServerException) as error:
        client.infer("simple_dyna_sequence", [_input(examples.module("grpc"), 1)], sequence_id="abc", sequence_start=True)
    assert "sequence batching control 'CORRID' data-type is 'BYTES', but model 'simple_dyna_sequence' expects 'UINT64'" in str(error.value)


def test_sequence_statistics_count_only_real_requests(examples) -> None:
    """Null (READY=0) fillers of empty direct slots are not charged as requests."""
    before = examples.engine.statistics("simple_sequence")[0]["inference_stats"]["success"]["count"]
    test_grpc_stream_sequences_match_triton_example(examples, "simple_sequence")
    after = examples.engine.statistics("simple_sequence")[0]["inference_stats"]["success"]["count"]
    assert after - before == 3 * (len(VALUES) + 1)
