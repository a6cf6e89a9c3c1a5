"""The sequence batcher through tritonclient: slots and affinity, controls, implicit state, backlog, errors, idle release.

Models: ``seq_probe`` (python, tests/serving_pod/data/sequence: reports its instance, batch position and
control values, accumulates through implicit state), ONNX implicit-state accumulators built with
``support.models.make_state_model``, and ``ferry_test`` identity models for the oldest strategy.
"""

from __future__ import annotations

import shutil
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from tritonclient.utils import InferenceServerException

from support.models import make_state_model
from support.server import write_model

DATA = Path(__file__).resolve().parents[1] / "data" / "sequence"
INITIAL = 100  # seq_probe's initial state (initial_state/init.bin)


@pytest.fixture(scope="module")
def probe_repo(tmp_path_factory) -> Path:
    repo = tmp_path_factory.mktemp("sequence_repo")
    shutil.copytree(DATA / "seq_probe", repo / "seq_probe")
    (repo / "seq_probe" / "initial_state").mkdir()
    (repo / "seq_probe" / "initial_state" / "init.bin").write_bytes(np.array([INITIAL], np.int32).tobytes())
    _int32_corrid_probe(repo)
    make_state_model(repo / "onnx_acc")
    # without batching an instance has one slot: two instances for two interleaved sequences
    make_state_model(repo / "onnx_acc_nobatch", max_batch=0, extra_config="instance_group [ { count: 2 kind: KIND_CPU } ]")
    write_model(repo, "idle_seq", _ferry_seq("idle_seq", "max_sequence_idle_microseconds: 300000"))
    write_model(
        repo, "oldest_seq",
        _ferry_seq("oldest_seq", "oldest { max_candidate_sequences: 8 max_queue_delay_microseconds: 2000000 preferred_batch_size: [ 4 ] }",
                   delay_ms=50),
    )
    return repo


def _int32_corrid_probe(repo: Path) -> None:
    """``seq_probe_i32``: seq_probe with a TYPE_INT32 CORRID control and one instance."""
    shutil.copytree(repo / "seq_probe", repo / "seq_probe_i32")
    config = (repo / "seq_probe" / "config.pbtxt").read_text()
    config = config.replace('name: "seq_probe"', 'name: "seq_probe_i32"').replace("TYPE_UINT64", "TYPE_INT32")
    (repo / "seq_probe_i32" / "config.pbtxt").write_text(config.replace("count: 2", "count: 1"))


def _ferry_seq(name: str, sequence: str, delay_ms: int = 0) -> str:
    return f"""
name: "{name}"
backend: "ferry_test"
max_batch_size: 4
sequence_batching {{ {sequence} }}
input [ {{ name: "INPUT0" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 1 ] }} ]
parameters [ {{ key: "execute_delay_ms" value: {{ string_value: "{delay_ms}" }} }} ]
"""


@pytest.fixture(scope="module")
def server(probe_repo):
    from support.server import ServerThread, make_options

    thread = ServerThread(make_options([probe_repo]))
    handle = thread.start()
    assert not handle.engine.startup_failures, handle.engine.startup_failures
    yield handle
    thread.stop()


def _infer(handle, protocol, model, value, sequence_id, start=False, end=False, name="INPUT", client=None):
    module = handle.module(protocol)
    own = client is None
    client = client or handle.client(protocol)
    tensor = module.InferInput(name, [1, 1], "INT32")
    tensor.set_data_from_numpy(np.full([1, 1], value, np.int32))
    try:
        return client.infer(model, [tensor], sequence_id=sequence_id, sequence_start=start, sequence_end=end)
    finally:
        if own:
            client.close()


def _probe(handle, protocol, value, sequence_id, **flags) -> tuple[int, list[int]]:
    result = _infer(handle, protocol, "seq_probe", value, sequence_id, **flags)
    return int(result.as_numpy("SUM")[0][0]), [int(v) for v in result.as_numpy("PROBE")[0]]


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_sequences_keep_their_slot_controls_and_state(server, protocol: str) -> None:
    """4 concurrent sequences on 2 instances x 2 slots: each stays on one (instance, position)."""
    base = 500 if protocol == "http" else 600
    ids = [base + i for i in range(4)]
    steps = [1, 2, 3, 4, 5]
    seen: dict[int, list[tuple[int, list[int]]]] = {}

    def run(sequence_id: int) -> None:
        client = server.client(protocol)
        rows = []
        for index, value in enumerate(steps):
            result = _infer(server, protocol, "seq_probe", value * sequence_id, sequence_id,
                            start=index == 0, end=index == len(steps) - 1, client=client)
            rows.append((int(result.as_numpy("SUM")[0][0]), [int(v) for v in result.as_numpy("PROBE")[0]]))
        client.close()
        seen[sequence_id] = rows

    threads = [threading.Thread(target=run, args=(i,)) for i in ids]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    places = set()
    for sequence_id, rows in seen.items():
        sums = [total for total, _ in rows]
        assert sums == [INITIAL + sequence_id * sum(steps[: i + 1]) for i in range(len(steps))]
        slots = {(probe[0], probe[1]) for _, probe in rows}
        assert len(slots) == 1, f"sequence {sequence_id} moved between slots: {slots}"
        places |= slots
        assert [probe[3] for _, probe in rows] == [1, 0, 0, 0, 0]  # START
        assert [probe[4] for _, probe in rows] == [0, 0, 0, 0, 1]  # END
        assert all(probe[5] == 1 and probe[6] == sequence_id for _, probe in rows)  # READY, CORRID
    assert len(seen) == 4 and len(places) == 4  # four sequences, four distinct slots


@pytest.fixture(scope="module")
def limited_server(probe_repo):
    """The same repository with ``--rate-limit=execution_count``: the scheduler gets a ``RateLimitedPool``."""
    from support.server import ServerThread, make_options

    thread = ServerThread(make_options([probe_repo], rate_limit="execution_count"))
    handle = thread.start()
    assert not handle.engine.startup_failures, handle.engine.startup_failures
    yield handle
    thread.stop()


@pytest.mark.parametrize("serving", ["server", "limited_server"])
def test_empty_direct_slot_gets_a_not_ready_null_request(serving: str, request: pytest.FixtureRequest) -> None:
    """Slot 0 of instance 0 freed, slot 1 busy: the batch is [null(READY=0), request] at position 1.

    Also through the rate limiter's pool, which used to fail that batch with an AttributeError (INTERNAL).
    """
    server = request.getfixturevalue(serving)
    _probe(server, "grpc", 1, 701, start=True)   # instance 0, slot 0
    _probe(server, "grpc", 1, 702, start=True)   # instance 1, slot 0
    _probe(server, "grpc", 1, 703, start=True)   # instance 0, slot 1
    _probe(server, "grpc", 1, 701, end=True)     # frees instance 0 slot 0
    total, probe = _probe(server, "grpc", 5, 703)
    assert total == INITIAL + 1 + 5
    assert probe[:3] == [0, 1, 2]  # instance 0, position 1 of a batch of 2 (position 0 is the null)
    _probe(server, "grpc", 0, 702, end=True)
    _probe(server, "grpc", 0, 703, end=True)


def test_backlogged_sequence_waits_for_a_free_slot(server) -> None:
    """A fifth sequence waits until one of the four slots frees, then takes exactly that slot."""
    ids = [801, 802, 803, 804]
    places = {i: tuple(_probe(server, "grpc", 1, i, start=True)[1][:2]) for i in ids}
    finished = threading.Event()
    outcome: dict = {}

    def late() -> None:
        outcome["result"] = _probe(server, "grpc", 7, 805, start=True)
        finished.set()

    thread = threading.Thread(target=late)
    thread.start()
    assert not finished.wait(0.5), "the fifth sequence ran although every slot was taken"
    _probe(server, "grpc", 1, 803, end=True)
    assert finished.wait(30)
    thread.join()
    total, probe = outcome["result"]
    assert total == INITIAL + 7 and tuple(probe[:2]) == places[803]
    for i in (801, 802, 804, 805):
        _probe(server, "grpc", 0, i, end=True)


@pytest.mark.parametrize("model", ["onnx_acc", "onnx_acc_nobatch"])
def test_onnx_implicit_state_accumulates_per_sequence(server, model: str) -> None:
    import tritonclient.grpc as grpcclient

    client = server.client("grpc")

    def send(value: int, sequence_id, start=False, end=False) -> int:
        shape = [1, 1] if model == "onnx_acc" else [1]
        tensor = grpcclient.InferInput("INPUT", shape, "INT32")
        tensor.set_data_from_numpy(np.full(shape, value, np.int32))
        result = client.infer(model, [tensor], sequence_id=sequence_id, sequence_start=start, sequence_end=end)
        assert [o.name for o in result.get_response().outputs] == ["OUTPUT"]  # the state output stays inside
        return int(result.as_numpy("OUTPUT").reshape(-1)[0])

    assert send(3, 11, start=True) == 3
    assert send(10, "text-id", start=True) == 10
    assert send(4, 11) == 7
    assert send(-1, "text-id") == 9
    assert send(5, 11, start=True) == 5  # a new START on a live sequence restarts it from the initial state
    assert send(1, 11, end=True) == 6
    assert send(1, "text-id", end=True) == 10
    client.close()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_request_errors(server, protocol: str) -> None:
    module = server.module(protocol)
    cases = [
        (dict(sequence_id=424242), "inference request for sequence 424242 to model 'seq_probe' must specify the START flag on the first request of the sequence"),
        (dict(sequence_id=0, sequence_start=True), "inference request to model 'seq_probe' must specify a non-zero or non-empty correlation ID"),
        (dict(sequence_start=True), "inference request to model 'seq_probe' must specify a non-zero or non-empty correlation ID"),
        (dict(sequence_id="abc", sequence_start=True), "sequence batching control 'CORRID' data-type is 'BYTES', but model 'seq_probe' expects 'UINT64'"),
    ]
    client = server.client(protocol)
    for kwargs, message in cases:
        tensor = module.InferInput("INPUT", [1, 1], "INT32")
        tensor.set_data_from_numpy(np.ones([1, 1], np.int32))
        with pytest.raises(InferenceServerException) as error:
            client.infer("seq_probe", [tensor], **kwargs)
        assert message in str(error.value)
    tensor = module.InferInput("INPUT", [2, 1], "INT32")
    tensor.set_data_from_numpy(np.ones([2, 1], np.int32))
    with pytest.raises(InferenceServerException) as error:
        client.infer("seq_probe", [tensor], sequence_id=9, sequence_start=True)
    assert "must specify batch-size 1 due to requirements of sequence batcher" in str(error.value)
    client.close()


def test_ended_sequence_needs_a_new_start(server) -> None:
    _probe(server, "http", 1, 901, start=True, end=True)
    with pytest.raises(InferenceServerException, match="must specify the START flag"):
        _probe(server, "http", 1, 901)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_idle_sequence_is_released(server, protocol: str) -> None:
    """max_sequence_idle_microseconds = 300 ms: a request after 1 s of silence is refused; an active one is not."""
    sequence_id = 1201 if protocol == "http" else 1202
    _infer(server, protocol, "idle_seq", 1, sequence_id, start=True, name="INPUT0")
    for _ in range(4):  # activity keeps it alive well past the idle limit
        time.sleep(0.12)
        _infer(server, protocol, "idle_seq", 1, sequence_id, name="INPUT0")
    time.sleep(1.0)
    with pytest.raises(InferenceServerException) as error:
        _infer(server, protocol, "idle_seq", 1, sequence_id, end=True, name="INPUT0")
    assert f"inference request for sequence {sequence_id} to model 'idle_seq' must specify the START flag" in str(error.value)
    assert "idle" in str(error.value)
    result = _infer(server, protocol, "idle_seq", 5, sequence_id, start=True, end=True, name="INPUT0")
    assert int(result.as_numpy("OUTPUT0")[0][0]) == 5


def test_oldest_strategy_batches_across_sequences(server) -> None:
    """Oldest: four sequences' first requests form one batch of 4 (preferred size), not four executions."""
    stats = lambda: server.engine.statistics("oldest_seq")[0]  # noqa: E731
    before = {b["batch_size"]: b["compute_infer"]["count"] for b in stats()["batch_stats"]}
    outputs: dict[int, int] = {}

    def run(sequence_id: int) -> None:
        result = _infer(server, "grpc", "oldest_seq", sequence_id, sequence_id, start=True, end=True, name="INPUT0")
        outputs[sequence_id] = int(result.as_numpy("OUTPUT0")[0][0])

    threads = [threading.Thread(target=run, args=(i,)) for i in (31, 32, 33, 34)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert outputs == {31: 31, 32: 32, 33: 33, 34: 34}
    after = {b["batch_size"]: b["compute_infer"]["count"] for b in stats()["batch_stats"]}
    assert after.get(4, 0) - before.get(4, 0) == 1, after


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_wide_sequence_id_on_an_int32_corrid_is_cut_to_32_bits(server, protocol: str) -> None:
    """The model sees the id's low 32 bits, as under Triton 2.51; it used to fail INTERNAL (OverflowError)
    and lose the sequence's slot, so that after four such requests no sequence of the model could start."""
    base = 2**40 + (10 if protocol == "http" else 20)
    for offset in range(6):  # more than the model's 2 slots: none may be lost
        sequence_id = base + offset
        result = _infer(server, protocol, "seq_probe_i32", 5, sequence_id, start=True)
        first = [int(v) for v in result.as_numpy("PROBE")[0]]
        result = _infer(server, protocol, "seq_probe_i32", 6, sequence_id, end=True)
        last = [int(v) for v in result.as_numpy("PROBE")[0]]
        assert int(result.as_numpy("SUM")[0][0]) == INITIAL + 5 + 6
        assert (first[3:], last[3:]) == ([1, 0, 1, sequence_id % 2**32], [0, 1, 1, sequence_id % 2**32])
