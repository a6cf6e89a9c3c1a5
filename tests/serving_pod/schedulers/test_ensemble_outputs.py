"""An ensemble's responses and statistics as tritonserver 2.51 makes them (each case differed before).

- outputs in Triton's order (its ``unordered_map`` order, ``ensemble_order``), whatever the config or request says;
- a request asking for some outputs runs only the steps they need;
- a tensor gains or loses its batch dimension between batching and non-batching models;
- a failed request counts two failures, reason OTHER, and leaves ``last_inference`` alone; a successful one is
  one execution of its batch size.

The orders below were read from tritonserver 2.51 (``test_ensemble_side_by_side`` compares live).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from serving_pod.core.errors import ServerError
from serving_pod.core.types import InferRequest, RequestedOutput, Tensor
from serving_pod.schedulers.ensemble_order import response_order, string_hash
from support.server import test_model_config, write_model

#: output names in config order -> the order of tritonserver 2.51's response
TRITON_ORDERS = {
    ("zeta", "alpha", "mid", "b", "out_1"): ("out_1", "mid", "b", "alpha", "zeta"),
    ("OUT_A", "OUT_B", "OUT_C"): ("OUT_B", "OUT_C", "OUT_A"),
    ("c", "b", "a"): ("a", "b", "c"),
    ("OUTPUT0", "OUTPUT1"): ("OUTPUT1", "OUTPUT0"),
    ("SUM", "DIFF"): ("DIFF", "SUM"),
    tuple(f"o{i}" for i in range(1, 16)): ("o15", "o1", "o3", "o5", "o2", "o9", "o10", "o4", "o14", "o7", "o6",
                                           "o13", "o8", "o11", "o12"),
}


@pytest.mark.parametrize(("names", "expected"), TRITON_ORDERS.items())
def test_response_order_is_tritons(names, expected) -> None:
    assert response_order(names) == expected


def test_string_hash_is_libstdcxx() -> None:
    """``std::hash<std::string>`` values printed by a program built with g++ (libstdc++, 64-bit)."""
    assert string_hash("") == 6142509188972423790
    assert string_hash("OUTPUT0") == 16822774817438396338
    assert string_hash("a_name_longer_than_8") == 2408778083777553772


def _step(model: str, inputs: dict[str, str], outputs: dict[str, str]) -> str:
    imap = " ".join(f'input_map {{ key: "{k}" value: "{v}" }}' for k, v in inputs.items())
    omap = " ".join(f'output_map {{ key: "{k}" value: "{v}" }}' for k, v in outputs.items())
    return f'{{ model_name: "{model}" model_version: -1 {imap} {omap} }}'


def _ensemble(name: str, steps: list[str], outputs: tuple[str, ...], *, max_batch_size: int = 8) -> str:
    tensors = ", ".join(f'{{ name: "{n}" data_type: TYPE_FP32 dims: [ 4 ] }}' for n in outputs)
    return f"""
name: "{name}"
platform: "ensemble"
max_batch_size: {max_batch_size}
input [ {{ name: "IN" data_type: TYPE_FP32 dims: [ 4 ] }} ]
output [ {tensors} ]
ensemble_scheduling {{ step [ {", ".join(steps)} ] }}
"""


FAIL_ON_MINUS_ONE = 'parameters { key: "fail_on_value" value { string_value: "-1" } }'


@pytest.fixture
async def engine(tmp_path: Path, server_factory):
    for name in ("a", "b", "c"):
        write_model(tmp_path, name, test_model_config(name, extra=FAIL_ON_MINUS_ONE))
    write_model(tmp_path, "flat", test_model_config("flat", max_batch_size=0))
    # IN -> a -> m; m -> b -> zeta; m -> c -> alpha
    write_model(tmp_path, "fork", _ensemble("fork", [
        _step("a", {"INPUT0": "IN"}, {"OUTPUT0": "m"}), _step("b", {"INPUT0": "m"}, {"OUTPUT0": "zeta"}),
        _step("c", {"INPUT0": "m"}, {"OUTPUT0": "alpha"})], ("zeta", "alpha")))
    write_model(tmp_path, "over_flat", _ensemble(
        "over_flat", [_step("flat", {"INPUT0": "IN"}, {"OUTPUT0": "OUT"})], ("OUT",)))
    write_model(tmp_path, "flat_over", _ensemble(
        "flat_over", [_step("a", {"INPUT0": "IN"}, {"OUTPUT0": "OUT"})], ("OUT",), max_batch_size=0))
    handle = await server_factory([tmp_path], model_control_mode="explicit", load_models=("fork", "over_flat", "flat_over"))
    return handle.engine


def _request(model: str, shape: tuple[int, ...], value: float = 1.0, outputs: list[str] | None = None) -> InferRequest:
    return InferRequest(model, "", [Tensor("IN", "FP32", np.full(shape, value, np.float32))],
                        None if outputs is None else [RequestedOutput(name) for name in outputs])


def _executions(engine, *models: str) -> tuple[int, ...]:
    return tuple(engine.registry.get(model).stats.execution_count for model in models)


async def test_outputs_come_in_tritons_order_whatever_the_request_lists(engine) -> None:
    everything = await engine.infer(_request("fork", (1, 4)))
    assert [tensor.name for tensor in everything.outputs] == ["alpha", "zeta"]  # config order: zeta, alpha
    listed = await engine.infer(_request("fork", (1, 4), outputs=["zeta", "alpha"]))
    assert [tensor.name for tensor in listed.outputs] == ["alpha", "zeta"]


async def test_a_request_for_some_outputs_runs_only_the_steps_they_need(engine) -> None:
    response = await engine.infer(_request("fork", (1, 4), outputs=["alpha"]))
    assert [tensor.name for tensor in response.outputs] == ["alpha"]
    assert _executions(engine, "a", "b", "c") == (1, 0, 1)
    await engine.infer(_request("fork", (1, 4), outputs=["zeta"]))
    assert _executions(engine, "a", "b", "c") == (2, 1, 1)


async def test_batch_dimension_follows_the_models_batching(engine) -> None:
    """A batching ensemble over a non-batching model: [1, 4] reaches it as [4] and comes back as [1, 4]; a
    non-batching ensemble over a batching model: [4] reaches it as [1, 4] and comes back as [4]."""
    response = await engine.infer(_request("over_flat", (1, 4), 2.0))
    assert response.outputs[0].data.shape == (1, 4) and response.outputs[0].data.tolist() == [[2.0] * 4]
    response = await engine.infer(_request("flat_over", (4,), 3.0))
    assert response.outputs[0].data.shape == (4,) and response.outputs[0].data.tolist() == [3.0] * 4


async def test_statistics_of_successes_and_failures(engine) -> None:
    stats = engine.registry.get("fork").stats
    await engine.infer(_request("fork", (2, 4)))
    last = stats.last_inference_ms
    with pytest.raises(ServerError) as error:
        await engine.infer(_request("fork", (1, 4), -1.0))
    assert error.value.message.startswith("in ensemble 'fork', ")
    entry = stats.as_dict()
    assert (entry["inference_count"], entry["execution_count"], entry["last_inference"]) == (2, 1, last)
    inference = entry["inference_stats"]
    assert [inference[key]["count"] for key in ("success", "fail", "queue", "compute_input", "compute_infer",
                                               "compute_output")] == [1, 2, 1, 1, 1, 1]
    assert stats.failures == {"REJECTED": 0, "CANCELED": 0, "BACKEND": 0, "OTHER": 2}
    assert [(row["batch_size"], row["compute_infer"]["count"]) for row in entry["batch_stats"]] == [(2, 1)]


async def test_compute_times_are_the_sums_over_the_steps(tmp_path: Path, server_factory) -> None:
    """Triton charges an ensemble request the compute_input / compute_infer / compute_output its steps' requests
    were charged, summed (a nested ensemble passes its sums on); Ferry charged each step's wall time, queueing
    included, as compute_infer. Composing models used only by the ensembles: their totals are the sums."""
    delay = 'parameters { key: "execute_delay_ms" value { string_value: "20" } }'
    write_model(tmp_path, "a", test_model_config("a", extra=delay + "\ndynamic_batching { max_queue_delay_microseconds: 5000 }"))
    write_model(tmp_path, "b", test_model_config("b", extra=delay))
    write_model(tmp_path, "seq", test_model_config("seq", extra="sequence_batching { }"))
    write_model(tmp_path, "inner", _ensemble("inner", [_step("a", {"INPUT0": "IN"}, {"OUTPUT0": "m"}),
                                                         _step("b", {"INPUT0": "m"}, {"OUTPUT0": "OUT"})], ("OUT",)))
    write_model(tmp_path, "outer", _ensemble("outer", [_step("inner", {"IN": "IN"}, {"OUT": "x"}),
                                                         _step("seq", {"INPUT0": "x"}, {"OUTPUT0": "OUT"})], ("OUT",)))
    handle = await server_factory([tmp_path], model_control_mode="explicit", load_models=("outer",))
    engine = handle.engine
    requests = [_request("outer", (1, 4)) for _ in range(4)]
    for index, request in enumerate(requests):
        request.parameters.update(sequence_id=index + 1, sequence_start=True, sequence_end=True)
    import asyncio

    await asyncio.gather(*(engine.infer(request) for request in requests))
    stats = {name: engine.registry.get(name).stats for name in ("a", "b", "seq", "inner", "outer")}
    assert stats["a"].execution_count < 4  # some steps were batched: each request is charged its whole batch
    for stage in ("compute_input", "compute_infer", "compute_output"):
        inner = getattr(stats["inner"], stage)
        assert (inner.count, inner.ns) == (4, getattr(stats["a"], stage).ns + getattr(stats["b"], stage).ns)
        outer = getattr(stats["outer"], stage)
        assert (outer.count, outer.ns) == (4, inner.ns + getattr(stats["seq"], stage).ns)
    assert stats["outer"].compute_infer.ns < stats["outer"].success.ns - stats["outer"].queue.ns
