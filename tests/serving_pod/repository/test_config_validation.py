"""config.pbtxt parsing into Triton's ModelConfig, Triton's defaults, and validation errors that name the model (a
tensor Triton refuses fails each version, in Triton's words: tests/serving_pod/core/test_registry_load_refusals.py)."""

from __future__ import annotations

import pytest

from serving_pod.core.errors import ModelLoadError
from serving_pod.repository.config import config_to_dict, parse_config_text
from serving_pod.repository.instance_groups import visible_gpus
from serving_pod.repository.prepare import prepare_config
from support.server import test_model_config, write_model


def test_parses_into_triton_model_config(tmp_path):
    model_dir = write_model(tmp_path, "m", test_model_config("m", extra="dynamic_batching { max_queue_delay_microseconds: 100 preferred_batch_size: [ 2, 4 ] }"))
    config, backend, versions = prepare_config("m", model_dir)
    assert backend == "ferry_test" and versions == [1]
    assert config.dynamic_batching.max_queue_delay_microseconds == 100
    assert list(config.dynamic_batching.preferred_batch_size) == [2, 4]
    # Triton's defaults: one instance group named after the model (its instance is <model>_0), KIND_CPU where
    # no GPU is visible and KIND_GPU on every visible GPU otherwise (tests/serving_pod/repository/test_instance_groups.py)
    (group,) = config.instance_group
    gpus = visible_gpus()
    assert (group.name, group.count, group.kind, list(group.gpus)) == ("m", 1, 1 if gpus else 2, gpus)
    data = config_to_dict(config)
    assert data["max_batch_size"] == 8 and isinstance(data["dynamic_batching"]["max_queue_delay_microseconds"], int)


def test_only_64_bit_integer_fields_become_json_numbers():
    config = parse_config_text(
        'name: "m" max_batch_size: 8 input [ { name: "I" data_type: TYPE_FP32 dims: [ -1, 16 ] } ] '
        'parameters { key: "p" value { string_value: "10" } } '
        "dynamic_batching { max_queue_delay_microseconds: 100 priority_queue_policy { key: 1 value { "
        "default_timeout_microseconds: 7 } } } version_policy { specific { versions: [ 1, 3 ] } }", "m")
    data = config_to_dict(config)
    assert data["parameters"]["p"] == {"string_value": "10"}  # a digit string parameter stays a string
    assert data["input"][0]["dims"] == [-1, 16]
    assert data["dynamic_batching"]["max_queue_delay_microseconds"] == 100
    assert data["dynamic_batching"]["priority_queue_policy"]["1"]["default_timeout_microseconds"] == 7
    assert data["version_policy"] == {"specific": {"versions": [1, 3]}}


def test_config_name_defaults_to_the_folder(tmp_path):
    model_dir = write_model(tmp_path, "folder_name", test_model_config("folder_name").replace('name: "folder_name"', ""))
    config, _, _ = prepare_config("folder_name", model_dir)
    assert config.name == "folder_name"


BAD_CONFIGS = {
    "syntax": ("input [ { name: ", "failed to parse config.pbtxt of model 'bad'"),
    "unknown data type": (test_model_config("bad", "TYPE_FLOAT99"), "failed to parse config.pbtxt of model 'bad'"),
    "invalid data type": (test_model_config("bad", "TYPE_INVALID"), "version 1 is at UNAVAILABLE state: Invalid argument: model input 'INPUT0' must specify 'data_type' for bad;"),
    "zero dim": (test_model_config("bad", dims="[ 0 ]"), "model input 'INPUT0' dimension must be integer >= 1, or -1 to indicate a variable-size dimension for bad;"),
    "negative dim": (test_model_config("bad", dims="[ -2 ]"), "model input 'INPUT0' dimension must be integer >= 1, or -1 to indicate a variable-size dimension for bad;"),
    "negative batch": (test_model_config("bad", max_batch_size=-1), "model 'bad': max_batch_size must be >= 0, got -1"),
    "preferred above max": (test_model_config("bad", extra="dynamic_batching { preferred_batch_size: [ 16 ] }"),
                            "model 'bad': preferred batch size 16 must be in 1..max_batch_size (8)"),
    "priority default out of range": (test_model_config("bad", extra="dynamic_batching { priority_levels: 2 default_priority_level: 3 }"),
                                      "default_priority_level 3 must be in 1..priority_levels (2)"),
    "name mismatch": (test_model_config("other"), "model name 'other' in config.pbtxt does not match the model directory 'bad'"),
    "no outputs": ('name: "bad"\nbackend: "ferry_test"\ninput [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]', "Invalid argument: model must specify at least one output for bad;"),
    "duplicate input": (test_model_config("bad").replace("input [ {", 'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] }, {'),
                        "Invalid argument: model input 'INPUT0' is specified more than once for bad;"),
    "unknown platform": ('name: "bad"\nplatform: "caffe2_netdef"', "unexpected platform type 'caffe2_netdef' for bad"),
    "unknown backend": ('name: "bad"\nbackend: "nope"', "unable to find backend library for backend 'nope', try specifying runtime"),
    "no backend at all": ('name: "bad"', "Invalid model name: Could not determine backend for model 'bad' with no "
                                         "backend in model configuration. Expected model name of the form "
                                         "'model.<backend_name>'."),
    "both batchers": (test_model_config("bad", extra="dynamic_batching { }\nsequence_batching { }"),
                      'Field "sequence_batching" is specified along with field "dynamic_batching"'),
    "bad reshape": (test_model_config("bad").replace("dims: [ 4 ] }", "dims: [ 4 ] reshape: { shape: [ 3 ] } }", 1),
                    "model input 'INPUT0' has different size for dims and reshape for bad;"),
    # Triton 2.51's ValidateBatchIO (recorded live for the unknown source): each version fails; Ferry loaded them
    "batch input source unknown": (test_model_config("bad", extra='batch_input [ { kind: BATCH_ELEMENT_COUNT '
                                                                  'target_name: "X" data_type: TYPE_FP32 source_input: '
                                                                  '"NOPE" } ]'),
                                   "version 1 is at UNAVAILABLE state: Invalid argument: unknown source input name "
                                   "'NOPE' for bad;"),
    "batch input sources": (test_model_config("bad", extra='batch_input [ { kind: BATCH_ITEM_SHAPE target_name: "X" '
                                                           'data_type: TYPE_FP32 } ]'),
                            "Invalid argument: batch input kind 'BATCH_ITEM_SHAPE' expects 1 source input, got 0 for "
                            "bad;"),
    "batch input data type": (test_model_config("bad", extra='batch_input [ { kind: BATCH_ELEMENT_COUNT target_name: '
                                                             '"X" data_type: TYPE_INT64 source_input: "INPUT0" } ]'),
                              "Invalid argument: batch input data type must be TYPE_INT32 or TYPE_FP32 for bad;"),
    "batch output target unknown": (test_model_config("bad", extra='batch_output [ { kind: '
                                                                   'BATCH_SCATTER_WITH_INPUT_SHAPE target_name: "Y" '
                                                                   'source_input: "INPUT0" } ]'),
                                    "Invalid argument: unknown target output name 'Y' for bad;"),
    "batch output target twice": (test_model_config("bad", extra='batch_output [ { kind: '
                                                                 'BATCH_SCATTER_WITH_INPUT_SHAPE target_name: [ '
                                                                 '"OUTPUT0", "OUTPUT0" ] source_input: "INPUT0" } ]'),
                                  "Invalid argument: target output name 'OUTPUT0' can only be specified once for bad;"),
}


@pytest.mark.parametrize("case", list(BAD_CONFIGS))
def test_bad_configs_name_the_model_and_the_problem(tmp_path, case):
    text, fragment = BAD_CONFIGS[case]
    model_dir = write_model(tmp_path, "bad", text)
    with pytest.raises(ModelLoadError) as info:
        prepare_config("bad", model_dir)
    assert fragment in str(info.value)


def test_missing_version_folder_and_missing_model_file(tmp_path):
    model_dir = write_model(tmp_path, "noversion", test_model_config("noversion"), versions=())
    with pytest.raises(ModelLoadError) as info:  # tritonserver 2.51's words, exactly
        prepare_config("noversion", model_dir)
    assert info.value.message == ("load failed for model 'noversion': at least one version must be available under "
                                  "the version policy of model 'noversion'\n")
    onnx_dir = write_model(tmp_path, "nofile", 'name: "nofile"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 0\n'
                           'input [ { name: "x" data_type: TYPE_FP32 dims: [ 1 ] } ]\noutput [ { name: "y" data_type: TYPE_FP32 dims: [ 1 ] } ]')
    with pytest.raises(ModelLoadError, match=r"model 'nofile' version 1: model file .*model.onnx not found"):
        prepare_config("nofile", onnx_dir, autocomplete=False)


def test_version_folders_as_triton_reads_their_names(tmp_path, caplog):
    """Triton 2.51 (recorded live) ignores a folder whose name has a leading zero, with a warning: ``01`` alone leaves
    no version (its load error); ``0`` is version 0. Ferry read ``01`` as version 1 and then looked for ``1/model.py``."""
    model_dir = write_model(tmp_path, "lead", test_model_config("lead"), versions=())
    (model_dir / "01").mkdir()
    with pytest.raises(ModelLoadError) as info:
        prepare_config("lead", model_dir)
    assert info.value.message == ("load failed for model 'lead': at least one version must be available under the "
                                  "version policy of model 'lead'\n")
    assert "ignore version directory '01' which contains leading zeros in its directory name" in caplog.text
    (model_dir / "0").mkdir()
    (model_dir / "abc").mkdir()
    (model_dir / "warmup").mkdir()
    assert prepare_config("lead", model_dir)[2] == [0]
    assert "ignore version directory 'abc' which fails to convert to integral number" in caplog.text
    assert "'warmup'" not in caplog.text  # Triton's model sub-folders are no version folders, and no warning


def test_specific_version_policy_naming_a_missing_folder(tmp_path, caplog):
    """As Triton: the versions the policy names that have a folder load, each missing one is logged, and none
    left is the load error."""
    model_dir = write_model(tmp_path, "v", test_model_config("v", extra="version_policy { specific { versions: [ 4 ] } }"))
    with pytest.raises(ModelLoadError, match="at least one version must be available under the version policy of model 'v'"):
        prepare_config("v", model_dir)
    assert "version 4 is specified for model 'v', but the version directory is not present" in caplog.text
    model_dir = write_model(tmp_path, "w", test_model_config("w", extra="version_policy { specific { versions: [ 1, 4 ] } }"))
    assert prepare_config("w", model_dir)[2] == [1]


def test_parse_config_text_reports_the_line():
    with pytest.raises(ModelLoadError, match=r"'m'.*1:"):
        parse_config_text("max_batch_size: oops", "m")


def test_triton_normalization_defaults_are_filled_as_triton_serves_them(tmp_path):
    # Triton 2.51 serves these for any non-ensemble model whose config leaves them out.
    model_dir = write_model(tmp_path, "m", test_model_config("m"))
    config, _, _ = prepare_config("m", model_dir)
    data = config_to_dict(config)
    assert data["version_policy"] == {"latest": {"num_versions": 1}}
    assert data["optimization"]["input_pinned_memory"] == {"enable": True}
    assert data["optimization"]["output_pinned_memory"] == {"enable": True}


def test_normalization_keeps_what_the_config_sets(tmp_path):
    extra = ('optimization { input_pinned_memory { enable: false } }\nversion_policy { all { } }\n'
             'sequence_batching { max_sequence_idle_microseconds: 7 }')
    model_dir = write_model(tmp_path, "m", test_model_config("m", extra=extra))
    config, _, _ = prepare_config("m", model_dir)
    assert config.optimization.input_pinned_memory.enable is False
    assert config.version_policy.WhichOneof("policy_choice") == "all"
    assert config.sequence_batching.max_sequence_idle_microseconds == 7


def test_sequence_batching_idle_timeout_defaults_to_one_second(tmp_path):
    model_dir = write_model(tmp_path, "m", test_model_config("m", extra="sequence_batching { }"))
    config, _, _ = prepare_config("m", model_dir)
    assert config.sequence_batching.max_sequence_idle_microseconds == 1_000_000


PYTHON_IDENTITY = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(config):
        config.add_input({"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [4]})
        config.add_output({"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [4]})
        config.set_max_batch_size(8)
        return config

    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy())])
                for r in requests]
"""


def test_python_models_get_no_dynamic_batching_unless_asked(tmp_path):
    # Triton's python backend never adds a scheduler, even when auto-complete sets max_batch_size 8.
    model_dir = write_model(tmp_path, "py", 'backend: "python"\n', files={"1/model.py": PYTHON_IDENTITY})
    config, backend, _ = prepare_config("py", model_dir)
    assert backend == "python" and config.max_batch_size == 8
    assert not config.HasField("dynamic_batching") and not config.HasField("sequence_batching")
    assert config.default_model_filename == "model.py"


def test_ensembles_get_the_version_policy_but_no_backend_defaults(tmp_path):
    write_model(tmp_path, "step", test_model_config("step"))
    model_dir = write_model(tmp_path, "ens", """
name: "ens"
platform: "ensemble"
max_batch_size: 8
input [ { name: "IN" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] } ]
ensemble_scheduling { step [ { model_name: "step" model_version: -1
  input_map { key: "INPUT0" value: "IN" } output_map { key: "OUTPUT0" value: "OUT" } } ] }
""")
    config, _, _ = prepare_config("ens", model_dir)
    assert config.version_policy.latest.num_versions == 1
    assert not config.HasField("optimization") and config.default_model_filename == ""


_NO_CONFIG_PY = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([7], np.int32))]) for _ in requests]
'''

#: Triton 2.51's answer to loading a model without config.pbtxt under --disable-auto-complete-config (recorded live,
#: HTTP 500 and gRPC INTERNAL); Ferry adds the reason Triton logs: "failed to open text file for read <path>/config.pbtxt:
#: No such file or directory"
_TRITON_NO_CONFIG = "failed to load 'noconfig', failed to poll from model repository"


def _no_config(root):
    model_dir = root / "noconfig"
    (model_dir / "1").mkdir(parents=True)
    (model_dir / "1" / "model.py").write_text(_NO_CONFIG_PY)
    return model_dir


def test_without_auto_complete_a_model_needs_its_config_file(tmp_path):
    """Triton 2.51 reads config.pbtxt without auto-complete and refuses the poll when there is none; Ferry loaded an
    empty config (python models then served)."""
    model_dir = _no_config(tmp_path)
    assert prepare_config("noconfig", model_dir)[1] == "python"
    with pytest.raises(ModelLoadError) as info:
        prepare_config("noconfig", model_dir, autocomplete=False)
    reason = f"failed to open text file for read {model_dir}/config.pbtxt: No such file or directory"
    assert info.value.message == reason


@pytest.mark.parametrize(("protocol", "status"), [("http", "500"), ("grpc", "StatusCode.INTERNAL")])
def test_without_auto_complete_loading_a_model_without_config_fails_the_poll(
    threaded_server, tmp_path, protocol, status
):
    from tritonclient.utils import InferenceServerException

    model_dir = _no_config(tmp_path)
    server = threaded_server([tmp_path], model_control_mode="explicit", autocomplete=False)
    with pytest.raises(InferenceServerException) as info:
        server.client(protocol).load_model("noconfig")
    reason = f"failed to open text file for read {model_dir}/config.pbtxt: No such file or directory"
    assert (info.value.status(), info.value.message()) == (status, f"{_TRITON_NO_CONFIG}: {reason}")


def test_json_values_read_as_tritons_protobuf_reads_them():
    """Triton core reads a JSON config (a python model's auto-completed one) with protobuf's C++ reader, which takes
    a single value for a repeated field, bool words (its safe_strtob) and enum names in any case (recorded live through
    ``auto_complete_config``: ``"optional": "yes"/"TRUE"/"no"``, ``"dims": 3``, ``"type_fp32"``; ``"optional": 1`` or
    ``"maybe"`` are refused); what it refuses is left for ``json_format`` to refuse."""
    from serving_pod.repository.config import as_triton_reads_json

    read = as_triton_reads_json({
        "input": [{"name": "I", "data_type": "type_fp32", "dims": 3, "optional": "No"}, {"optional": "maybe"}],
        "dynamic_batching": {"preferred_batch_size": 4, "preserve_ordering": "y"},
        "parameters": {"k": {"string_value": "v"}}, "maxBatchSize": 2, "bogus": "t",
    })
    assert read == {
        "input": [{"name": "I", "data_type": "TYPE_FP32", "dims": [3], "optional": False}, {"optional": "maybe"}],
        "dynamic_batching": {"preferred_batch_size": [4], "preserve_ordering": True},
        "parameters": {"k": {"string_value": "v"}}, "maxBatchSize": 2, "bogus": "t",
    }
