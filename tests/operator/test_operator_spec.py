"""The typed spec: parsing, defaults, clear errors, and agreement with the CRD schema."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any, get_type_hints

import pytest
from operator_support import INVALID, KSERVE, SAMPLES, load, openapi_schema

from ferry_operator import desired, spec
from ferry_operator.config import OperatorConfig
from ferry_operator.specreader import json_names


def _props(*path: str) -> set[str]:
    node: Mapping[str, Any] = openapi_schema()["properties"]["spec"]
    for key in path:
        node = node["properties"][key]
    return set(node["properties"])


@pytest.mark.parametrize(
    ("cls", "path", "extra"),
    [
        (spec.InferenceServiceSpec, (), set(spec.UNSUPPORTED_COMPONENTS)),
        (spec.PredictorSpec, ("predictor",), {spec.LEGACY_MODEL_FIELD}),
        (spec.ModelSpec, ("predictor", "model"), set()),
        (spec.GpuSpec, ("predictor", "gpu"), set()),
        (spec.ServingOptions, ("predictor", "serving"), set()),
        (spec.ModelFormat, ("predictor", "model", "modelFormat"), set()),
        (spec.Resources, ("predictor", "model", "resources"), set()),
    ],
)
def test_typed_spec_and_crd_schema_agree(cls: type, path: tuple[str, ...], extra: set[str]) -> None:
    assert set(json_names(cls)) | extra == _props(*path)


def test_legacy_triton_has_the_model_fields_minus_format_and_runtime() -> None:
    assert _props("predictor", "triton") == set(json_names(spec.ModelSpec)) - set(spec.LEGACY_OMITS)


def test_schema_enums_match_the_parser() -> None:
    predictor = openapi_schema()["properties"]["spec"]["properties"]["predictor"]["properties"]
    assert tuple(predictor["scaleMetric"]["enum"]) == spec.SCALE_METRICS
    assert tuple(predictor["model"]["properties"]["protocolVersion"]["enum"]) == spec.PROTOCOLS
    assert tuple(predictor["model"]["properties"]["runtime"]["enum"]) == spec.RUNTIMES
    assert tuple(predictor["gpu"]["properties"]["migStrategy"]["enum"]) == spec.MIG_STRATEGIES
    assert tuple(predictor["serving"]["properties"]["modelControlMode"]["enum"]) == spec.CONTROL_MODES


def test_every_field_is_declared_for_the_crd() -> None:
    for cls in (spec.InferenceServiceSpec, spec.PredictorSpec, spec.ModelSpec, spec.GpuSpec, spec.ServingOptions):
        undeclared = [f.name for f in dataclasses.fields(cls) if "json" not in f.metadata]
        assert undeclared in ([], ["model_field"]), (cls, undeclared)
        assert get_type_hints(cls)  # annotations resolve


def test_defaults() -> None:
    parsed = spec.parse({"predictor": {"model": {"storageUri": "s3://b/m"}}}).predictor
    assert (parsed.min_replicas, parsed.max_replicas, parsed.scale_metric) == (1, None, "queue")
    assert (parsed.effective_min_replicas, parsed.effective_max_replicas) == (1, 1)
    assert parsed.canary_traffic_percent is None and parsed.gpu is None and parsed.model_field == "model"


def test_legacy_triton_and_model_parse_alike() -> None:
    model = spec.parse({"predictor": {"model": {"storageUri": "gs://b/m"}}}).predictor
    triton = spec.parse({"predictor": {"triton": {"storageUri": "gs://b/m"}}}).predictor
    assert model.model == triton.model and triton.model_field == "triton"


def test_scale_to_zero_is_served_as_one_replica() -> None:
    parsed = spec.parse({"predictor": {"minReplicas": 0, "maxReplicas": 3, "model": {}}}).predictor
    assert (parsed.effective_min_replicas, parsed.effective_max_replicas) == (1, 3)


def test_quantities_from_yaml_numbers() -> None:
    parsed = spec.parse({"predictor": {"model": {"resources": {"limits": {"cpu": 1, "memory": "8Gi"}}}}})
    assert parsed.predictor.model.resources.limits == {"cpu": "1", "memory": "8Gi"}


@pytest.mark.parametrize("path", SAMPLES + [k for k in KSERVE if "transformer" not in k.name], ids=lambda p: p.name)
def test_admitted_samples_parse(path: Path) -> None:
    assert spec.parse(load(path)["spec"]).predictor.model is not None


@pytest.mark.parametrize(
    ("predictor", "path", "message"),
    [
        ({}, "spec.predictor", "exactly one of 'model' or 'triton'"),
        ({"model": {}, "triton": {}}, "spec.predictor", "exactly one of"),
        ({"model": {}, "minReplicas": 3, "maxReplicas": 2}, "spec.predictor.minReplicas", "must be <= maxReplicas (3 > 2)"),
        ({"model": {}, "minReplicas": -1}, "spec.predictor.minReplicas", "must be >= 0"),
        ({"model": {}, "minReplicas": "2"}, "spec.predictor.minReplicas", "must be an integer"),
        ({"model": {}, "minReplicas": True}, "spec.predictor.minReplicas", "must be an integer"),
        ({"model": {}, "canaryTrafficPercent": 101}, "spec.predictor.canaryTrafficPercent", "must be <= 100"),
        ({"model": {}, "scaleMetric": "rps"}, "spec.predictor.scaleMetric", "needs Knative"),
        ({"model": {}, "scaleMetric": "latency"}, "spec.predictor.scaleMetric", "must be one of"),
        ({"model": {}, "scaleMetric": "cpu", "scaleTarget": 120}, "spec.predictor.scaleTarget", "1..100"),
        ({"model": {"storageUri": "hf://org/model"}}, "spec.predictor.model.storageUri", "unsupported URI"),
        # The API server reads the CRD pattern with RE2 ('$' is the end of the text): a trailing line break
        # (a YAML block scalar) is refused there, so here too.
        ({"model": {"storageUri": "s3://b/m\n"}}, "spec.predictor.model.storageUri", "unsupported URI"),
        ({"model": {"storageUri": "pvc:///x"}}, "spec.predictor.model.storageUri", "names no claim"),
        ({"model": {"runtime": "kserve-torchserve"}}, "spec.predictor.model.runtime", "is not served by Ferry"),
        ({"model": {"protocolVersion": "v1"}}, "spec.predictor.model.protocolVersion", "V2"),
        ({"model": {"args": ["--http-port=9000"]}}, "spec.predictor.model.args", "set by the operator"),
        ({"model": {"env": [{"value": "x"}]}}, "spec.predictor.model.env[0].name", "is required"),
        ({"model": {"resources": {"limits": {"memory": "lots"}}}}, "spec.predictor.model.resources.limits.memory",
         "must be a quantity"),
        ({"model": {"modelFormat": {}}}, "spec.predictor.model.modelFormat.name", "is required"),
        ({"triton": {"runtime": "triton"}}, "spec.predictor.triton.runtime", "unknown field"),
        ({"model": {}, "replicas": 2}, "spec.predictor.replicas", "unknown field"),
        ({"model": {}, "gpu": {"migProfile": "1g.5gb", "migStrategy": "dynamic"}}, "spec.predictor.gpu.migStrategy",
         "must be one of"),
        ({"model": {}, "gpu": {"migStrategy": "single"}}, "spec.predictor.gpu.migStrategy", "needs migProfile"),
        ({"model": {}, "serving": {"logVerbose": 11}}, "spec.predictor.serving.logVerbose", "must be <= 10"),
        # ferry-server (as tritonserver) refuses --load-model outside explicit mode: the pod would never start
        ({"model": {}, "serving": {"loadModels": ["a"]}}, "spec.predictor.serving.loadModels", "needs modelControlMode"),
        ({"model": {}, "serving": {"loadModels": ["a"], "modelControlMode": "poll"}}, "spec.predictor.serving.loadModels",
         "needs modelControlMode explicit"),
        ({"model": {}, "nodeSelector": {"a": 1}}, "spec.predictor.nodeSelector.a", "must be a string"),
        ({"model": []}, "spec.predictor.model", "must be an object"),
        # Found by fuzzing: each of these used to build a child object the API server refuses.
        ({"model": {}, "minReplicas": 2**40}, "spec.predictor.minReplicas", "must be <= 2147483647"),
        ({"model": {}, "maxReplicas": 2**31}, "spec.predictor.maxReplicas", "must be <= 2147483647"),
        ({"model": {}, "timeout": 99999 * 3600 + 1}, "spec.predictor.timeout", "must be <= 359996400"),
        ({"model": {"resources": {"limits": {"cpu": "-1"}}}}, "spec.predictor.model.resources.limits.cpu", "non-negative"),
        ({"model": {"resources": {"requests": {"memory": -5}}}}, "spec.predictor.model.resources.requests.memory",
         "non-negative"),
        ({"model": {"resources": {"requests": {"cpu": "2"}, "limits": {"cpu": "1500m"}}}},
         "spec.predictor.model.resources.requests.cpu", "must be <= limits.cpu (2 > 1500m)"),
        ({"model": {"resources": {"limits": {"gpus": "1"}}}}, "spec.predictor.model.resources.limits.gpus",
         "unknown resource"),
        ({"model": {"resources": {"limits": {"nvidia.com/gpu": "0.5"}}}},
         "spec.predictor.model.resources.limits.nvidia.com/gpu", "whole number"),
        ({"model": {"resources": {"requests": {"nvidia.com/gpu": "1"}}}},
         "spec.predictor.model.resources.limits.nvidia.com/gpu", "cannot be overcommitted"),
        ({"model": {"resources": {"requests": {"nvidia.com/gpu": "1"}, "limits": {"nvidia.com/gpu": "2"}}}},
         "spec.predictor.model.resources.requests.nvidia.com/gpu", "must equal limits"),
        ({"model": {"resources": {"limits": {"nvidia.com/gpu": "1"}}}, "gpu": {"migProfile": "1g.5gb"}},
         "spec.predictor.model.resources", "conflicts with spec.predictor.gpu"),
        ({"triton": {"resources": {"limits": {"nvidia.com/mig-1g.5gb": "1"}}}, "gpu": {"count": 2}},
         "spec.predictor.triton.resources", "conflicts with spec.predictor.gpu"),
        ({"model": {}, "nodeSelector": {"bad key": "x"}}, "spec.predictor.nodeSelector.bad key", "not a valid label key"),
        ({"model": {}, "nodeSelector": {"pool": "a b"}}, "spec.predictor.nodeSelector.pool", "not a valid label value"),
        ({"model": {}, "tolerations": [{"key": "k", "operator": "Exists", "value": "v"}]},
         "spec.predictor.tolerations[0].value", "must be empty when operator is Exists"),
        ({"model": {}, "tolerations": [{"operator": "Equal", "value": "v"}]}, "spec.predictor.tolerations[0]",
         "operator must be Exists when key is empty"),
        ({"model": {}, "tolerations": [{"key": "k", "effect": "NoSchedule", "tolerationSeconds": 5}]},
         "spec.predictor.tolerations[0].tolerationSeconds", "needs effect NoExecute"),
        ({"model": {}, "serviceAccountName": "Bad_SA"}, "spec.predictor.serviceAccountName", "not a valid object name"),
        ({"model": {}, "storageSecretName": "s3 creds"}, "spec.predictor.storageSecretName", "not a valid object name"),
        ({"model": {"storageUri": "pvc://Bad_Claim/m"}}, "spec.predictor.model.storageUri", "claim 'Bad_Claim' is not"),
        ({"model": {"env": [{"name": "A=B", "value": "1"}]}}, "spec.predictor.model.env[0].name", "contains '='"),
        ({"model": {"env": [{"name": "A", "value": "1", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}]}},
         "spec.predictor.model.env[0]", "mutually exclusive"),
        ({"model": {"image": " ferry:1"}}, "spec.predictor.model.image", "whitespace"),
    ],
)
def test_errors_name_the_field(predictor: dict[str, Any], path: str, message: str) -> None:
    with pytest.raises(spec.SpecError) as caught:
        spec.parse({"predictor": predictor})
    assert caught.value.path == path
    assert message in str(caught.value)


def test_the_v1alpha2_shape_is_named() -> None:
    """Found by a robustness sweep: KFServing's ``spec.default`` + ``spec.canaryTrafficPercent`` was reported as
    "spec.canaryTrafficPercent: unknown field", which does not say what to change."""
    old_shape = {"default": {"predictor": {"triton": {"storageUri": "s3://b/m"}}}, "canaryTrafficPercent": 10}
    with pytest.raises(spec.SpecError, match="v1alpha2 shape.*write spec.predictor") as caught:
        spec.parse(old_shape)
    assert caught.value.path == "spec.default"


def test_unsupported_components() -> None:
    with pytest.raises(spec.SpecError, match="spec.transformer: is not supported by Ferry"):
        spec.parse({"predictor": {"model": {}}, "transformer": {"containers": []}})


@pytest.mark.parametrize("path", INVALID, ids=lambda p: p.name)
def test_operator_also_refuses_what_the_crd_refuses(path: Path) -> None:
    """kmock and clusters without CEL do not validate: the operator must refuse on its own."""
    result = desired.compute(load(path), {}, config=OperatorConfig(), gateway=False, now="t")
    ready = next(c for c in result.status["conditions"] if c["type"] == "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "InvalidSpec")
    assert result.applies == () and result.deletes == ()
