"""A python model's ``auto_complete_config`` end to end, next to NVIDIA Triton 2.51 (checked side by side).

Each model below was loaded (explicit model control, over HTTP and gRPC) by Triton 2.51 and by Ferry; Ferry is
checked against the recorded answers always, and against Triton where it can be had (``support.triton``). The
differences found and fixed:

* what ``auto_complete_model_config.as_dict()`` shows: Triton hands the model its *normalized* config (named
  instance groups, ``version_policy``, ``optimization``, ``default_model_filename: "model.py"``, a batcher's
  ``preferred_batch_size``); Ferry handed the bare ``config.pbtxt``.
* what is kept of the returned config: Triton core's ``UpdateModelConfig`` keeps ``max_batch_size``, the inputs and
  outputs, a scheduler only where the config names none, and ``model_transaction_policy.decoupled``; anything else
  edited through ``as_dict()`` (the name, instance groups, parameters, the configured batcher's fields) is dropped.
  Ferry kept every edit (a model could rename itself).
* ``auto_complete_config`` returning something other than the ``ModelConfig`` fails the version as Triton words it
  (``version 1 is at UNAVAILABLE state: Internal: ...``); Ferry answered the bare sentence.
* the returned config is read as Triton core reads it, with protobuf's C++ JSON reader: a single value for a
  repeated field (``"dims": 4``), a bool as a word (``"optional": "Yes"``: true/t/yes/y/1, false/f/no/n/0, any
  case) and an enum name in any case (``"type_fp32"``); Ferry's Python ``json_format`` refused them.

Kept different on purpose (Ferry's clearer behaviour, asserted on Ferry only):

* a returned config that protobuf cannot read (an unknown field, a ``data_type`` that is no type): Triton says
  "Not found: model configuration is not provided"; Ferry names the model and the parse error.
* a returned config that drops or swaps the scheduler the config names: Triton's backend ignores the error core
  reports and silently loads the config as it was, without any of the model's edits (no inputs, no outputs);
  Ferry refuses the load and says why.
* errors keep no Python traceback (Triton appends ``At:`` and the stub's file paths; stripped before comparing).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Iterator

import pytest

from support.server import ServerThread, make_options

MODEL = '''
import json
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(auto_complete_model_config):
        c = auto_complete_model_config
{lines}

    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", pb_utils.get_input_tensor_by_name(
            r, "INPUT0").as_numpy())]) for r in requests]
'''
IO = '''        c.add_input({"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [4]})
        c.add_output({"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [4]})
'''
BATCHED = 'backend: "python"\nmax_batch_size: 2\ndynamic_batching { max_queue_delay_microseconds: 5 }\n'

#: model -> (config.pbtxt or None, body of auto_complete_config); ``{seen}`` is where it writes ``as_dict()``
MODELS: dict[str, tuple[str | None, str]] = {
    "seen": (BATCHED + 'instance_group [ { count: 2 kind: KIND_CPU } ]\n',
             '        open({seen!r}, "w").write(json.dumps(c.as_dict(), sort_keys=True))\n' + IO + "        return c"),
    "edits": (None, IO + '''        c.as_dict()["name"] = "other"
        c.as_dict()["instance_group"] = [{"count": 2, "kind": "KIND_CPU"}]
        c.as_dict()["parameters"] = {"k": {"string_value": "v"}}
        c.set_model_transaction_policy(dict(decoupled=True))
        return c'''),
    "batcher_edit": (BATCHED, IO + '        c.as_dict()["dynamic_batching"]["max_queue_delay_microseconds"] = 77\n'
                                   "        c.set_max_batch_size(4)\n        return c"),
    "policy_pop": ('backend: "python"\nmodel_transaction_policy { decoupled: true }\n',
                   IO + '        c.as_dict().pop("model_transaction_policy")\n        return c'),
    "returns_none": (None, IO + "        return None"),
    "returns_dict": (None, IO + "        return c.as_dict()"),
    "type_conflict": ('backend: "python"\ninput [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 4 ] } ]\n',
                      IO + "        return c"),
    "name_error": (None, IO + "        undefined_variable\n        return c"),
    # what protobuf's C++ JSON reader takes (Triton core reads the returned config with it): a dims number, a bool
    # word, an enum name in lower case
    "lenient": (None, '''        c.add_input({"name": "INPUT0", "data_type": "type_fp32", "dims": 4, "optional": "Yes"})
        c.add_output({"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [4]})
        return c'''),
}
#: Ferry only (see the module docstring): model -> (config.pbtxt or None, body, the load error it gets)
FERRY_ONLY: dict[str, tuple[str | None, str, str]] = {
    "unknown_field": (None, IO + '        c.as_dict()["bogus"] = 1\n        return c',
                      "load failed for model 'unknown_field': version 1 is at UNAVAILABLE state: Internal: "
                      "auto_complete_config of python model 'unknown_field' produced an invalid config: Message type "
                      '"inference.ModelConfig" has no field named "bogus"'),
    "scheduler_dropped": (BATCHED, IO + '        c.as_dict().pop("dynamic_batching")\n        return c',
                          "load failed for model 'scheduler_dropped': version 1 is at UNAVAILABLE state: Internal: "
                          "auto_complete_config of python model 'scheduler_dropped' cannot change the scheduling "
                          "choice: the configuration specifies 'dynamic_batching', the auto-completed one 'none'"),
}

#: ``as_dict()`` as Triton 2.51 hands it to the ``seen`` model
SEEN = {
    "backend": "python", "batch_input": [], "batch_output": [], "cc_model_filenames": {},
    "default_model_filename": "model.py",
    "dynamic_batching": {"default_priority_level": 0, "max_queue_delay_microseconds": 5, "preferred_batch_size": [2],
                         "preserve_ordering": False, "priority_levels": 0, "priority_queue_policy": {}},
    "input": [], "instance_group": [{"count": 2, "gpus": [], "host_policy": "", "kind": "KIND_CPU",
                                     "name": "seen_0", "passive": False, "profile": [], "secondary_devices": []}],
    "max_batch_size": 2, "metric_tags": {}, "model_warmup": [], "name": "seen",
    "optimization": {"eager_batching": False, "gather_kernel_buffer_threshold": 0,
                     "input_pinned_memory": {"enable": True}, "output_pinned_memory": {"enable": True},
                     "priority": "PRIORITY_DEFAULT"},
    "output": [], "parameters": {}, "platform": "", "runtime": "", "version_policy": {"latest": {"num_versions": 1}},
}
#: fields of the served config Triton 2.51 shows after each model loads (the rest is as for any python model)
SERVED = {
    "edits": {"name": "edits", "instance_group": [("edits", 1)], "parameters": {},
              "model_transaction_policy": {"decoupled": True}, "max_batch_size": 0},
    "batcher_edit": {"name": "batcher_edit", "max_batch_size": 4, "max_queue_delay_microseconds": 5},
    "policy_pop": {"name": "policy_pop", "model_transaction_policy": {"decoupled": True}},
    "seen": {"name": "seen", "instance_group": [("seen_0", 2)], "max_batch_size": 2},
}
#: the load errors Triton 2.51 answers (its traceback stripped)
REFUSED = {
    "returns_none": "load failed for model 'returns_none': version 1 is at UNAVAILABLE state: Internal: "
                    "auto_complete_config function in model 'returns_none' must return a valid pb.ModelConfig "
                    "object.;\n",
    "returns_dict": "load failed for model 'returns_dict': version 1 is at UNAVAILABLE state: Internal: "
                    "auto_complete_config function in model 'returns_dict' must return a valid pb.ModelConfig "
                    "object.;\n",
    "type_conflict": "load failed for model 'type_conflict': version 1 is at UNAVAILABLE state: Internal: "
                     "ValueError: unable to load model 'type_conflict', configuration expects datatype TYPE_INT32 "
                     "for input 'INPUT0', model provides TYPE_FP32;\n",
    "name_error": "load failed for model 'name_error': version 1 is at UNAVAILABLE state: Internal: NameError: "
                  "name 'undefined_variable' is not defined;\n",
}
PROTOCOLS = ("http", "grpc")


def _write(root: Path, seen: Path, models: dict[str, tuple[str | None, str]]) -> Path:
    for name, (config, body) in models.items():
        (root / name / "1").mkdir(parents=True)
        (root / name / "1" / "model.py").write_text(MODEL.replace("{lines}", body.replace("{seen!r}", repr(str(seen)))))
        if config is not None:
            (root / name / "config.pbtxt").write_text(config)
    return root


def _untraced(message: str) -> str:
    """Triton's load error without the Python traceback its stub appends."""
    return re.sub(r"\n\nAt:\n.*?(?=;\n$)", "", message, flags=re.S)


def _summary(config: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": config["name"], "max_batch_size": config["max_batch_size"], "parameters": config["parameters"],
        "instance_group": [(group["name"], group["count"]) for group in config["instance_group"]],
        "model_transaction_policy": config.get("model_transaction_policy"),
        "max_queue_delay_microseconds": config.get("dynamic_batching", {}).get("max_queue_delay_microseconds"),
        "io": [(t["name"], t["data_type"], t["dims"]) for t in config["input"] + config["output"]],
        "optional": [t.get("optional", False) for t in config["input"]],
    }


def _answers(client: Any, protocol: str, names: list[str], seen: Path) -> dict[str, Any]:
    """Load each model over ``protocol``: its served config (summarized) or the load error; and ``as_dict()``."""
    from tritonclient.utils import InferenceServerException

    found: dict[str, Any] = {}
    for name in names:
        try:
            client.load_model(name)
        except InferenceServerException as exc:
            found[name] = _untraced(exc.message())
            continue
        config = client.get_model_config(name, **({"as_json": True} if protocol == "grpc" else {}))
        config = config["config"] if protocol == "grpc" else config
        if protocol == "grpc":  # protobuf's JSON: 64-bit numbers as strings, defaults left out
            config.setdefault("parameters", {})
            config["max_batch_size"] = int(config.get("max_batch_size", 0))
            for group in config["instance_group"]:
                group["count"] = int(group["count"])
            for tensor in config["input"] + config["output"]:
                tensor["dims"] = [int(d) for d in tensor["dims"]]
            batcher = config.get("dynamic_batching", {})
            if batcher:
                batcher["max_queue_delay_microseconds"] = int(batcher.get("max_queue_delay_microseconds", 0))
        found[name] = _summary(config)
        client.unload_model(name)
    found["as_dict"] = json.loads(seen.read_text())
    seen.unlink()
    return found


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("auto_complete")
    seen = root / "seen.json"
    return _write(root / "models", seen, {**MODELS, **{n: (c, b) for n, (c, b, _) in FERRY_ONLY.items()}}), seen


@pytest.fixture(scope="module")
def ferry(repository: tuple[Path, Path]) -> Iterator[Any]:
    thread = ServerThread(make_options([repository[0]], model_control_mode="explicit"))
    server = thread.start()
    try:
        yield server
    finally:
        thread.stop()


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_auto_complete_as_triton_answers(ferry: Any, repository: tuple[Path, Path], protocol: str) -> None:
    found = _answers(ferry.client(protocol), protocol, list(MODELS), repository[1])
    assert found["as_dict"] == SEEN
    for name, expected in SERVED.items():
        assert {key: found[name][key] for key in expected} == expected, name
    assert found["seen"]["io"] == found["edits"]["io"] == [("INPUT0", "TYPE_FP32", [4]), ("OUTPUT0", "TYPE_FP32", [4])]
    assert (found["lenient"]["io"], found["lenient"]["optional"]) == (found["edits"]["io"], [True])
    for name, message in REFUSED.items():
        assert found[name] == message


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_refusals_kept_clearer_than_tritons(ferry: Any, protocol: str) -> None:
    from tritonclient.utils import InferenceServerException

    client = ferry.client(protocol)
    for name, (_, _, message) in FERRY_ONLY.items():
        with pytest.raises(InferenceServerException) as refused:
            client.load_model(name)
        assert refused.value.message().startswith(message), refused.value.message()
        assert not client.is_model_ready(name)
    client.load_model("edits")  # the server goes on loading others
    assert client.is_model_ready("edits")
    client.unload_model("edits")


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.slow  # live NVIDIA Triton: Ferry's half runs by default against Triton's recorded answers
def test_auto_complete_side_by_side_with_triton(ferry: Any, repository: tuple[Path, Path], protocol: str) -> None:
    """The same loads on Triton 2.51 (skipped without it): the same configs, ``as_dict()`` and errors."""
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

    from support.triton import running_triton

    root, seen = repository
    ours = _answers(ferry.client(protocol), protocol, list(MODELS), seen)
    with running_triton(root, []) as (http, grpc, _):
        client = (httpclient.InferenceServerClient(f"127.0.0.1:{http}", network_timeout=120.0) if protocol == "http"
                  else grpcclient.InferenceServerClient(f"127.0.0.1:{grpc}"))
        triton = _answers(client, protocol, list(MODELS), seen)
    assert ours == triton
