"""``request.set_release_flags(TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)`` set after ``execute`` returned, side by side
with NVIDIA Triton 2.51: our ``countdown`` of tests/serving_pod/data/iterative (decoupled, iterative sequence: IN = n
answers n - 1 .. 0, one response a run) with an ``async def execute`` that awaits before it reschedules.

Triton 2.51 reads a request's release flags once the stub's execute call returned; a decoupled ``async def
execute`` runs on after that (pb_stub.cc: ``RunCoroutine(..., in_background)``), so the flag does nothing: the
request is released, its first response comes (``[2]``, not final) and the stream then waits for a final response
that never comes; the next request is a sequence of its own and counts down afresh (``[2]``). Ferry does the
same, and warns in its log that the flag came too late (Ferry said nothing: the client just hung). Flags set
before the coroutine's first ``await`` race Triton's read there (honoured now and then); Ferry ignores them as
well, always.
"""

from __future__ import annotations

import logging
import queue
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tritonclient.utils import InferenceServerException

DATA = Path(__file__).resolve().parents[1] / "data" / "iterative"
MODEL = "iterative_async"
#: how long a stream is watched for a further response after its last one (a negative check: Triton never sends it)
QUIET_S = 1.5
#: Triton 2.51's answers to two streamed requests IN 3 (recorded with ``test_triton_ignores_a_late_reschedule``)
RECORDED = [[[[2], False], "no final response"], [[[2], False], "no final response"]]
LATE = ("python model 'iterative_async_0_0': set_release_flags(TRITONSERVER_REQUEST_RELEASE_RESCHEDULE) after "
        "execute returned has no effect: the request was released already")


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("reschedule_late")
    shutil.copytree(DATA / "countdown", root / MODEL)
    config = root / MODEL / "config.pbtxt"
    config.write_text(config.read_text().replace('name: "countdown"', f'name: "{MODEL}"'))
    model = root / MODEL / "1" / "model.py"
    model.write_text(model.read_text().replace(
        "    def execute(self, requests):",
        "    async def execute(self, requests):\n        import asyncio\n\n        await asyncio.sleep(0.2)"))
    return root


def _stream(grpc_url: str, value: int) -> list:
    """[value, final] per response of one streamed request, then "no final response" where none came."""
    import tritonclient.grpc as grpcclient

    answers: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(grpc_url)
    client.start_stream(callback=lambda result, error: answers.put(error or result))
    tensor = grpcclient.InferInput("IN", [1], "INT32")
    tensor.set_data_from_numpy(np.array([value], np.int32))
    seen: list = []
    try:
        client.async_stream_infer(MODEL, [tensor], enable_empty_final_response=True)
        while len(seen) < 6:
            try:
                item = answers.get(timeout=30 if not seen else QUIET_S)
            except queue.Empty:
                seen.append("no final response")
                break
            if isinstance(item, InferenceServerException):
                seen.append(["error", item.message()])
                break
            final = item.get_response().parameters["triton_final_response"].bool_param
            outputs = item.get_response().outputs
            seen.append([item.as_numpy("OUT").tolist() if outputs else None, final])
            if final:
                break
        return seen
    finally:
        client.stop_stream(cancel_requests=True)
        client.close()


def _observe(grpc_url: str) -> list:
    return [_stream(grpc_url, 3) for _ in range(2)]


def test_a_late_reschedule_is_ignored_with_a_warning(threaded_server: Any, repository: Path,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="serving_pod.backends.pb_request")
    server = threaded_server([repository], model_control_mode="explicit", load_models=(MODEL,))
    assert _observe(server.grpc_url) == RECORDED
    assert [record.getMessage() for record in caplog.records
            if record.name == "serving_pod.backends.pb_request"] == [LATE, LATE]


@pytest.mark.slow  # live tritonserver: with -m slow
def test_triton_ignores_a_late_reschedule(repository: Path) -> None:
    """Side by side with Triton 2.51 (skipped where it cannot be had)."""
    from support.triton import running_triton

    with running_triton(repository, [MODEL]) as (_, grpc, _metrics):
        assert _observe(f"127.0.0.1:{grpc}") == RECORDED
