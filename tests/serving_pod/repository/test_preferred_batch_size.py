"""A batcher with no ``preferred_batch_size`` is served with ``[max_batch_size]``, as tritonserver 2.51 serves it.

Triton core's normalization fills it (dynamic batching, and the sequence batcher's ``oldest`` strategy) when
max_batch_size > 0, with or without auto-complete; Model Analyzer reads it from ``/v2/models/<m>/config``.
Ferry served ``[]``. Ferry's served configs are checked by default against ``TRITON``, recorded from Triton 2.51
on python models; the slow ``test_nvidia_tritons_served_configs_as_recorded`` checks a live Triton against it.
"""

from __future__ import annotations

import httpx
import pytest

from serving_pod.repository.prepare import prepare_config
from support.server import test_model_config, write_model

#: model -> its scheduling lines
BATCHERS = {
    "dyn": (8, "dynamic_batching { }"),
    "dyn_unbatched": (0, "dynamic_batching { }"),
    "dyn_given": (8, "dynamic_batching { preferred_batch_size: [ 4, 2 ] }"),
    "oldest": (8, "sequence_batching { oldest { max_candidate_sequences: 4 } }"),
    "direct": (8, "sequence_batching { direct { } }"),
}
#: what tritonserver 2.51 serves for each (python models, with and without --disable-auto-complete-config), recorded
#: from a live Triton; ``test_nvidia_tritons_served_configs_as_recorded`` (slow) compares a live one with it
TRITON = {"dyn": [8], "dyn_unbatched": [], "dyn_given": [4, 2], "oldest": [8], "direct": None}

PY = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", pb_utils.get_input_tensor_by_name(
            request, "INPUT0").as_numpy())]) for request in requests]
"""


def _preferred(config: dict) -> list[int] | None:
    if "dynamic_batching" in config:
        return [int(size) for size in config["dynamic_batching"].get("preferred_batch_size", [])]
    oldest = config.get("sequence_batching", {}).get("oldest")
    return None if oldest is None else [int(size) for size in oldest.get("preferred_batch_size", [])]


@pytest.mark.parametrize("autocomplete", [True, False])
def test_served_preferred_batch_sizes(tmp_path, autocomplete: bool) -> None:
    from serving_pod.repository.config import config_to_dict

    served = {}
    for name, (max_batch_size, batcher) in BATCHERS.items():
        model_dir = write_model(tmp_path, name, test_model_config(name, max_batch_size=max_batch_size, extra=batcher))
        config, _, _ = prepare_config(name, model_dir, autocomplete=autocomplete)
        served[name] = _preferred(config_to_dict(config))
    assert served == TRITON


@pytest.fixture
def python_repository(tmp_path):
    for name, (max_batch_size, batcher) in BATCHERS.items():
        config = test_model_config(name, max_batch_size=max_batch_size, extra=batcher).replace(
            'backend: "ferry_test"', 'backend: "python"')
        write_model(tmp_path, name, config, {"1/model.py": PY})
    return tmp_path


def _served(port: int) -> dict:
    return {name: _preferred(httpx.get(f"http://127.0.0.1:{port}/v2/models/{name}/config", timeout=60).json())
            for name in BATCHERS}


@pytest.mark.parametrize("flags", [(), ("--disable-auto-complete-config",)])
def test_served_configs_match_nvidia_tritons(threaded_server, python_repository, flags) -> None:
    server = threaded_server([python_repository], model_control_mode="explicit", load_models=tuple(BATCHERS),
                             autocomplete=not flags)
    assert _served(server.server.http_port) == TRITON


@pytest.mark.slow  # live NVIDIA Triton: Ferry's half runs by default against the same expected answers
@pytest.mark.parametrize("flags", [(), ("--disable-auto-complete-config",)])
def test_nvidia_tritons_served_configs_as_recorded(python_repository, flags) -> None:
    from support.triton import running_triton

    with running_triton(python_repository, list(BATCHERS), *flags) as (http, _, _):
        assert _served(http) == TRITON


@pytest.mark.parametrize("autocomplete", [True, False])
def test_auto_complete_turns_dynamic_batching_on(tmp_path, autocomplete: bool) -> None:
    """A batching model with no scheduler gets ``dynamic_batching`` from auto-complete (as Triton's onnxruntime
    backend gives it), with the preferred size above; not a python model, not max_batch_size 1, not without
    auto-complete (``--disable-auto-complete-config``). Regression: a refactor once left this unreachable."""
    from serving_pod.repository.config import config_to_dict

    models = {"batching": (8, 'backend: "ferry_test"'), "single": (1, 'backend: "ferry_test"'),
              "python": (8, 'backend: "python"')}
    served = {}
    for name, (max_batch_size, backend) in models.items():
        text = test_model_config(name, max_batch_size=max_batch_size).replace('backend: "ferry_test"', backend)
        model_dir = write_model(tmp_path, name, text, {"1/model.py": PY} if "python" in backend else None)
        served[name] = config_to_dict(prepare_config(name, model_dir, autocomplete=autocomplete)[0]).get(
            "dynamic_batching")
    batched = served.pop("batching")
    assert served == {"single": None, "python": None}
    assert (batched is not None and batched["preferred_batch_size"] == [8]) == autocomplete
    assert autocomplete or batched is None
