"""MIG: mixed / single / plain GPUs and invalid profiles per GPU, down to the rendered pod."""

from __future__ import annotations

import re

import pytest
from operator_support import body, validate_manifest

from ferry_operator import desired, mig
from ferry_operator.config import OperatorConfig
from ferry_operator.spec import GpuSpec, SpecError

PRODUCTS = {  # family -> GPU feature discovery product label as nodes carry it
    "A100-40GB": "NVIDIA-A100-SXM4-40GB",
    "A100-80GB": "NVIDIA-A100-SXM4-80GB",
    "H100-80GB": "NVIDIA-H100-80GB-HBM3",
    "H200-141GB": "NVIDIA-H200",
}


@pytest.mark.parametrize(
    ("product", "family"),
    [*((p, f) for f, p in PRODUCTS.items()), ("NVIDIA-A100-PCIE-40GB", "A100-40GB"), ("NVIDIA-H100-NVL", "H100-NVL-94GB"),
     ("NVIDIA-GH200-480GB", "GH200-96GB"), ("NVIDIA-A30", "A30-24GB"), ("H200-141GB", "H200-141GB")],
)
def test_product_families(product: str, family: str) -> None:
    assert mig.family(product) == family


@pytest.mark.parametrize(
    ("family", "valid", "invalid"),
    [
        ("A100-40GB", ["1g.5gb", "1g.5gb+me", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"], ["1g.10gb+me", "3g.40gb", "7g.80gb"]),
        ("A100-80GB", ["1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"], ["1g.5gb", "3g.20gb", "7g.40gb"]),
        ("H100-80GB", ["1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"], ["1g.5gb", "1g.18gb", "3g.47gb"]),
        ("H200-141GB", ["1g.18gb", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb"], ["1g.10gb", "3g.40gb", "7g.80gb"]),
    ],
)
def test_profiles_per_gpu(family: str, valid: list[str], invalid: list[str]) -> None:
    product = PRODUCTS[family]
    for profile in valid:
        for strategy in ("mixed", "single") if "+" not in profile else ("mixed",):  # +me: see below
            mig.resolve(GpuSpec(mig_profile=profile, mig_strategy=strategy, product=product))
    for profile in invalid:
        for strategy in ("mixed", "single"):
            with pytest.raises(SpecError, match=re.escape(f"unknown MIG profile '{profile}' for {product}")) as caught:
                mig.resolve(GpuSpec(mig_profile=profile, mig_strategy=strategy, product=product))
            assert caught.value.path == "spec.predictor.gpu.migProfile"
            assert valid[0] in str(caught.value)  # the message lists what would be valid


def test_mixed_strategy() -> None:
    res = mig.resolve(GpuSpec(mig_profile="1g.5gb", product="NVIDIA-A100-SXM4-40GB"))
    assert res.limits == {"nvidia.com/mig-1g.5gb": "1"}
    assert res.node_selector == {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB"}
    assert res.instance_kind == "KIND_GPU"
    assert mig.resolve(GpuSpec(mig_profile="1g.10gb+me")).limits == {"nvidia.com/mig-1g.10gb.me": "1"}
    assert mig.resolve(GpuSpec(mig_profile="3g.40gb")).node_selector == {}  # no product: any node with the slice


def test_single_strategy() -> None:
    res = mig.resolve(GpuSpec(mig_profile="3g.40gb", mig_strategy="single", product="NVIDIA-H100-80GB-HBM3"))
    assert res.limits == {"nvidia.com/gpu": "1"}
    assert res.node_selector == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3-MIG-3g.40gb"}


def test_plain_gpus() -> None:
    res = mig.resolve(GpuSpec(count=2, product="NVIDIA-H200"))
    assert res.limits == {"nvidia.com/gpu": "2"}
    assert res.node_selector == {"nvidia.com/gpu.product": "NVIDIA-H200"}
    assert res.tolerations == (mig.GPU_TOLERATION,)
    assert mig.resolve(None) == mig.GpuResources()


@pytest.mark.parametrize(
    ("gpu", "path", "message"),
    [
        (GpuSpec(mig_profile="1g.5gb", product="NVIDIA-T4"), "spec.predictor.gpu.product", "unknown or non-MIG GPU product 'NVIDIA-T4'"),
        (GpuSpec(mig_profile="5g.1gb"), "spec.predictor.gpu.migProfile", "unknown MIG profile '5g.1gb'"),
        (GpuSpec(mig_profile="1g.5gb", count=2), "spec.predictor.gpu.count", "count must be 1"),
        (GpuSpec(mig_profile="1g.5gb", mig_strategy="single"), "spec.predictor.gpu.product", "required with migStrategy single"),
    ],
)
def test_invalid_requests(gpu: GpuSpec, path: str, message: str) -> None:
    with pytest.raises(SpecError, match=message) as caught:
        mig.resolve(gpu)
    assert caught.value.path == path


def _pod(gpu: dict) -> dict:
    result = desired.compute(body({"predictor": {"model": {"storageUri": "s3://b/m"}, "gpu": gpu}}), {},
                             config=OperatorConfig(), gateway=False, now="t")
    deployment = result.applies[0].obj
    validate_manifest(deployment)
    return deployment["spec"]["template"]["spec"]


@pytest.mark.parametrize(
    ("gpu", "resource", "selector"),
    [
        ({"migProfile": "1g.5gb", "product": "NVIDIA-A100-SXM4-40GB"}, "nvidia.com/mig-1g.5gb", "NVIDIA-A100-SXM4-40GB"),
        ({"migProfile": "2g.20gb", "migStrategy": "single", "product": "NVIDIA-A100-SXM4-80GB"}, "nvidia.com/gpu",
         "NVIDIA-A100-SXM4-80GB-MIG-2g.20gb"),
        ({"migProfile": "1g.18gb", "migStrategy": "single", "product": "NVIDIA-H200"}, "nvidia.com/gpu", "NVIDIA-H200-MIG-1g.18gb"),
        ({"count": 1, "product": "NVIDIA-H100-80GB-HBM3"}, "nvidia.com/gpu", "NVIDIA-H100-80GB-HBM3"),
    ],
)
def test_rendered_pods(gpu: dict, resource: str, selector: str) -> None:
    pod = _pod(gpu)
    container = pod["containers"][0]
    assert container["resources"]["limits"][resource] == "1"
    assert pod["nodeSelector"]["nvidia.com/gpu.product"] == selector
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    assert {"name": "FERRY_INSTANCE_KIND", "value": "KIND_GPU"} in container["env"]


@pytest.mark.parametrize("family", list(PRODUCTS))
def test_invalid_profile_creates_nothing_and_says_why(family: str) -> None:
    spec = {"predictor": {"model": {"storageUri": "s3://b/m"}, "gpu": {"migProfile": "9g.999gb", "product": PRODUCTS[family]}}}
    result = desired.compute(body(spec), {}, config=OperatorConfig(), gateway=False, now="t")
    assert result.applies == ()
    ready = next(c for c in result.status["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "False" and ready["reason"] == "InvalidSpec"
    assert f"unknown MIG profile '9g.999gb' for {PRODUCTS[family]}" in ready["message"]
    assert [e.reason for e in result.events] == ["InvalidSpec"]


def test_single_strategy_with_a_media_profile_is_refused() -> None:
    # The single strategy's node label would be "<product>-MIG-1g.10gb+me": not a valid label value.
    with pytest.raises(SpecError, match="not a valid label value.*use mixed") as caught:
        mig.resolve(GpuSpec(mig_profile="1g.10gb+me", mig_strategy="single", product="NVIDIA-A100-SXM4-80GB"))
    assert caught.value.path == "spec.predictor.gpu.migStrategy"


@pytest.mark.parametrize("product", ["NVIDIA A100", "A" * 64])
def test_product_must_be_a_label_value(product: str) -> None:
    with pytest.raises(SpecError, match="not a valid label value") as caught:
        mig.resolve(GpuSpec(product=product))
    assert caught.value.path == "spec.predictor.gpu.product"


def _compute(model: dict) -> desired.Desired:
    return desired.compute(body({"predictor": {"model": {"storageUri": "s3://b/m", **model}}}), {},
                           config=OperatorConfig(), gateway=False, now="t")


@pytest.mark.parametrize("limits", [{"nvidia.com/gpu": 0}, {"nvidia.com/gpu": "0", "nvidia.com/mig-1g.5gb": "0"}])
def test_zero_gpus_written_in_resources_make_a_cpu_pod(limits: dict) -> None:
    """Found by a robustness sweep: ``nvidia.com/gpu: 0`` got the GPU toleration and FERRY_INSTANCE_KIND=KIND_GPU,
    so a CPU pod was scheduled onto tainted GPU nodes and told to run its models on a GPU it does not have."""
    deployment = _compute({"resources": {"limits": limits}}).applies[0].obj
    validate_manifest(deployment)
    pod = deployment["spec"]["template"]["spec"]
    assert "tolerations" not in pod
    assert not any(e["name"] == "FERRY_INSTANCE_KIND" for e in pod["containers"][0].get("env", []))


@pytest.mark.parametrize(
    ("limits", "path", "message"),
    [
        ({"nvidia.com/mig-9g.99gb": 1}, "nvidia.com/mig-9g.99gb", "unknown MIG resource"),
        ({"nvidia.com/mig-1g.5gb+me": 1}, "nvidia.com/mig-1g.5gb+me", "unknown MIG resource"),  # written .me
        ({"nvidia.com/mig-1g.5gb": 2}, "nvidia.com/mig-1g.5gb", "must be 1, got '2'"),
        ({"nvidia.com/mig-1g.5gb": 1, "nvidia.com/gpu": 1}, "nvidia.com/mig-1g.5gb", "conflicts with nvidia.com/gpu"),
        ({"nvidia.com/mig-1g.5gb": 1, "nvidia.com/mig-2g.10gb": 1}, "nvidia.com/mig-1g.5gb",
         "conflicts with nvidia.com/mig-2g.10gb"),
    ],
)
def test_mig_slices_written_in_resources_follow_the_gpu_block_rules(limits: dict, path: str, message: str) -> None:
    """Found by a robustness sweep: KServe users write MIG slices in resources.limits; a profile no GPU has left the
    pod Pending forever and two slices (or a slice and a GPU) gave one process devices it cannot use together."""
    result = _compute({"resources": {"limits": limits}})
    assert result.applies == ()
    ready = next(c for c in result.status["conditions"] if c["type"] == "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "InvalidSpec")
    assert ready["message"].startswith(f"spec.predictor.model.resources.limits.{path}: {message}")


def test_a_known_mig_slice_written_in_resources_is_served() -> None:
    pod = _compute({"resources": {"limits": {"nvidia.com/mig-1g.10gb.me": 1}}}).applies[0].obj["spec"]["template"]["spec"]
    assert pod["containers"][0]["resources"]["limits"] == {"nvidia.com/mig-1g.10gb.me": "1"}
    assert {"name": "FERRY_INSTANCE_KIND", "value": "KIND_GPU"} in pod["containers"][0]["env"]
