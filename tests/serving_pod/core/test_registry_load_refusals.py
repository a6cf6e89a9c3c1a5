"""Load refusals as tritonserver 2.51 answers and lists them (explicit model control), side by side with Triton.

Measured on Triton 2.51 and matched here:
- an ensemble refused with its composing models (a batch size above a step's, a tensor a step does not have) answers
  ``load failed for model '<ens>': <why>`` and a newline, and the repository index lists no version of it;
- a model whose config is refused before any version is tried (config.pbtxt that does not parse, sequence batching
  controls) has no version in the index (Ferry listed an invented version 1 UNAVAILABLE, which need not exist), and
  its config / metadata answer 404 ``is not found``;
- a sequence ``state`` refused when the version's scheduler is made is a version's failure:
  ``load failed for model '<m>': version 1 is at UNAVAILABLE state: Invalid argument: <why>;`` and the index lists
  version 1 UNAVAILABLE with that reason.
- a load of a loaded model whose files did not change does nothing in Triton (HTTP and gRPC: no ``initialize``,
  statistics kept): Ferry already did so (tests/serving_pod/test_model_control.py). Triton seems to reset statistics
  at the first such load only because its python stub writes ``__pycache__`` into the version folder at the first load,
  which makes that version newer; with the bytecode already there it does nothing.

Kept different on purpose (clearer): the index row of a model refused before any version keeps ``state: UNAVAILABLE``
and the reason (no ``version``), where Triton's row holds the name only and the reason is in its log. A config refused while Triton polls the repository answers Triton's 500
``failed to poll from model repository`` with the reason only in its log; Ferry answers 400 with the reason. Later
attempts at the same refused ensemble answer in Triton ``failed to load '<ens>', no version is available`` (500,
reason lost); Ferry repeats the reason. Ferry's ensemble reasons name the step (``step 0 (model 'ident')``) and quote
names where Triton's do not. A model directory without a version folder leaves Triton's index altogether after its
failed load; Ferry keeps listing it, as any model of the repository.
"""

from __future__ import annotations

import httpx
import pytest
from tritonclient.utils import InferenceServerException

from support.server import ensemble_config, write_model

_IDENT_PY = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", pb_utils.get_input_tensor_by_name(
            r, "INPUT0").as_numpy())]) for r in requests]
"""
_SEQ = ('sequence_batching {{ control_input [ {{ name: "CORRID" control [ {{ kind: CONTROL_SEQUENCE_CORRID '
        'data_type: TYPE_INT32 }} ] }} ] {} }}')
#: loaded in this order over HTTP (Triton answers an ensemble's reason at its first attempt)
MODELS = ("ens_mbs", "badconfig", "seq_controls", "seq_state")


def _ident(name: str, extra: str = "") -> str:
    return f"""name: "{name}"
backend: "python"
max_batch_size: 4
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] }} ]
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
{extra}
"""


def _repository(root):
    files = {"1/model.py": _IDENT_PY}
    write_model(root, "ident", _ident("ident"), files=files)
    write_model(root, "ens_mbs", ensemble_config("ens_mbs", ["ident"], max_batch_size=8))
    write_model(root, "badconfig", 'name: "badconfig" backend: "python" max_batch_size: [oops\n', files=files)
    write_model(root, "seq_controls", _ident("seq_controls", 'sequence_batching { control_input [ { name: "S" control [ '
                '{ kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1, 2 ] } ] } ] }'), files=files)
    write_model(root, "seq_state", _ident("seq_state", _SEQ.format(
        'state [ { input_name: "IS" output_name: "OS" data_type: TYPE_FP32 dims: [ 1 ] initial_state { '
        'data_type: TYPE_INT32 dims: [ 1 ] name: "init" zero_data: true } } ]')), files=files)
    (root / "noversion").mkdir()
    (root / "noversion" / "config.pbtxt").write_text(_ident("noversion"))
    return root


def _answers(http_port: int) -> dict[str, object]:
    base = f"http://127.0.0.1:{http_port}/v2"
    answers: dict[str, object] = {}
    for name in MODELS:
        response = httpx.post(f"{base}/repository/models/{name}/load", timeout=120)
        answers[name] = (response.status_code, response.json().get("error"))
    index = httpx.post(f"{base}/repository/index", timeout=60).json()
    answers["index"] = [row for row in index if row["name"] in MODELS]
    answers["config"] = {name: httpx.get(f"{base}/models/{name}/config", timeout=60).status_code for name in MODELS}
    return answers


STATE_REASON = ("Invalid argument: The data type used for 'initial_state' field of state 'IS' does not match the "
                "state data type.")
EXPECTED_INDEX = [{"name": "badconfig"}, {"name": "ens_mbs"}, {"name": "seq_controls"},
                  {"name": "seq_state", "version": "1", "state": "UNAVAILABLE", "reason": STATE_REASON}]


def _names_only(rows: list[dict[str, str]]) -> list[dict[str, str]]:
    """Rows without a version as Triton words them: the name only (Ferry adds state and reason: module docstring)."""
    return [row if "version" in row else {"name": row["name"]} for row in rows]


def test_load_refusals_and_their_index_rows_as_nvidia_tritons(threaded_server, tmp_path):
    from support.triton import running_triton

    repository = _repository(tmp_path / "models")
    server = threaded_server([repository], model_control_mode="explicit")
    got = _answers(server.server.http_port)
    assert got["ens_mbs"] == (400, "load failed for model 'ens_mbs': ensemble ens_mbs allows maximum batch size 8, "
                                   "but it contains model ident which only allows maximum batch size to be 4\n")
    assert got["seq_state"] == (400, f"load failed for model 'seq_state': version 1 is at UNAVAILABLE state: "
                                     f"{STATE_REASON};\n")
    assert _names_only(got["index"]) == EXPECTED_INDEX
    refused = {row["name"]: (row["state"], row["reason"]) for row in got["index"] if "version" not in row}
    assert refused["ens_mbs"] == ("UNAVAILABLE", got["ens_mbs"][1])
    assert refused["seq_controls"] == ("UNAVAILABLE", got["seq_controls"][1])
    assert got["config"] == dict.fromkeys(MODELS, 404)
    # kept clearer than Triton's 500 'failed to poll from model repository' (module docstring)
    assert got["badconfig"][0] == got["seq_controls"][0] == 400
    assert "int32_false_true" in got["seq_controls"][1]

    with running_triton(repository, []) as (http, _, _):
        expected = _answers(http)
    for name in ("badconfig", "seq_controls"):
        assert expected[name] == (500, f"failed to load '{name}', failed to poll from model repository")
        expected[name] = got[name]
    got["index"] = _names_only(got["index"])
    assert got == expected


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_refused_models_list_no_version_and_are_not_found(threaded_server, tmp_path, protocol):
    """Over both protocols: every attempt answers the same reason, and a model refused before any version (a model
    directory without a version folder included) is listed with its reason and no version, and unknown to config requests (Triton drops the
    directory without a version folder from its index: module docstring)."""
    server = threaded_server([_repository(tmp_path / "models")], model_control_mode="explicit")
    client = server.client(protocol)
    for name in ("ens_mbs", "noversion", "ens_mbs"):
        with pytest.raises(InferenceServerException) as error:
            client.load_model(name)
        if name == "ens_mbs":
            assert error.value.message().startswith("load failed for model 'ens_mbs': ensemble ens_mbs allows")
    rows = client.get_model_repository_index(**({"as_json": True} if protocol == "grpc" else {}))
    rows = rows["models"] if protocol == "grpc" else rows
    rows = {row["name"]: row for row in rows if row["name"] in ("ens_mbs", "noversion")}
    assert "version" not in rows["ens_mbs"] and "version" not in rows["noversion"]
    assert rows["ens_mbs"]["reason"].startswith("load failed for model 'ens_mbs': ensemble ens_mbs allows")
    assert "at least one version must be available" in rows["noversion"]["reason"]
    with pytest.raises(InferenceServerException, match="is not found"):
        client.get_model_config("noversion")
