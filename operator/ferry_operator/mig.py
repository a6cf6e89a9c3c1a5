"""GPU and MIG resources: the per-GPU MIG profile table and spec.gpu -> pod resources.

Device plugin strategies (NVIDIA k8s-device-plugin / GPU feature discovery):

- ``mixed``: each MIG profile is its own resource, ``nvidia.com/mig-<profile>`` (``+me`` -> ``.me``).
- ``single``: MIG slices are advertised as ``nvidia.com/gpu`` and the node is labelled
  ``nvidia.com/gpu.product=<product>-MIG-<profile>``, which a nodeSelector matches.
- no ``migProfile``: whole GPUs, ``nvidia.com/gpu``.

A CUDA process sees only one MIG instance, so a MIG request is one slice per pod; more
throughput means more replicas. Pure functions only.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from ferry_operator.spec import GpuSpec, SpecError
from ferry_operator.specreader import label_value_problem, quantity

GPU_RESOURCE = "nvidia.com/gpu"
PRODUCT_LABEL = "nvidia.com/gpu.product"
GPU_TOLERATION: Mapping[str, str] = MappingProxyType(
    {"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}
)


def _profiles(mem: tuple[int, int, int, int, int], total: int) -> Mapping[str, int]:
    one_small, one_big, two, three, four = mem
    return MappingProxyType({
        f"1g.{one_small}gb": 7, f"1g.{one_small}gb+me": 1, f"1g.{one_big}gb": 4,
        f"2g.{two}gb": 3, f"3g.{three}gb": 2, f"4g.{four}gb": 1, f"7g.{total}gb": 1,
    })


#: GPU family -> {profile: max instances per GPU}. Keys are the names users and docs use.
MIG_PROFILES: Mapping[str, Mapping[str, int]] = MappingProxyType({
    "A30-24GB": MappingProxyType({"1g.6gb": 4, "1g.6gb+me": 1, "2g.12gb": 2, "4g.24gb": 1}),
    "A100-40GB": _profiles((5, 10, 10, 20, 20), 40),
    "A100-80GB": _profiles((10, 20, 20, 40, 40), 80),
    "H100-80GB": _profiles((10, 20, 20, 40, 40), 80),
    "H100-NVL-94GB": _profiles((12, 24, 24, 47, 47), 94),
    "H100-96GB": _profiles((12, 24, 24, 48, 48), 96),
    "GH200-96GB": _profiles((12, 24, 24, 48, 48), 96),
    "H200-141GB": _profiles((18, 35, 35, 71, 71), 141),
    "GH200-144GB": _profiles((18, 36, 36, 72, 72), 144),
})

# GPU feature discovery product names (e.g. NVIDIA-A100-SXM4-40GB, NVIDIA-H100-80GB-HBM3,
# NVIDIA-H200) -> family; first match wins, so the more specific patterns come first.
_FAMILIES: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(pattern, re.IGNORECASE), family)
    for pattern, family in (
        (r"GH200.*144", "GH200-144GB"),
        (r"GH200", "GH200-96GB"),
        (r"H200", "H200-141GB"),
        (r"H100.*NVL", "H100-NVL-94GB"),
        (r"H100.*(94|96)GB", "H100-96GB"),
        (r"H100", "H100-80GB"),
        (r"A100.*80GB", "A100-80GB"),
        (r"A100", "A100-40GB"),
        (r"A30", "A30-24GB"),
    )
)


@dataclass(frozen=True)
class GpuResources:
    """What a GPU request adds to the serving pod."""

    limits: Mapping[str, str] = field(default_factory=dict)
    node_selector: Mapping[str, str] = field(default_factory=dict)
    tolerations: tuple[Mapping[str, str], ...] = ()
    instance_kind: str = "KIND_CPU"


def family(product: str) -> str | None:
    """The MIG table key for a GPU product name, or None when it is not a MIG-capable GPU."""
    if product in MIG_PROFILES:
        return product
    for pattern, name in _FAMILIES:
        if pattern.search(product):
            return name
    return None


def resource_name(profile: str) -> str:
    """``1g.5gb`` -> ``nvidia.com/mig-1g.5gb``; ``1g.10gb+me`` -> ``nvidia.com/mig-1g.10gb.me``."""
    return "nvidia.com/mig-" + profile.replace("+", ".")


def resolve(gpu: GpuSpec | None, path: str = "spec.predictor.gpu") -> GpuResources:
    """Pod resources for ``gpu``; raises SpecError for unknown products/profiles or bad counts."""
    if gpu is None:
        return GpuResources()
    tolerations = (GPU_TOLERATION,)
    # The product becomes a nodeSelector value: one the API server refuses would fail every apply.
    problem = label_value_problem(gpu.product) if gpu.product else None
    if problem:
        raise SpecError(f"{path}.product", f"must match the {PRODUCT_LABEL} node label: {problem}")
    if gpu.mig_profile is None:
        selector = {PRODUCT_LABEL: gpu.product} if gpu.product else {}
        return GpuResources({GPU_RESOURCE: str(gpu.count)}, selector, tolerations, "KIND_GPU")
    profile = gpu.mig_profile
    if gpu.count != 1:
        raise SpecError(
            f"{path}.count",
            f"a MIG slice ({profile}) is one CUDA device and a process can use only one: "
            "count must be 1; add replicas for more throughput",
        )
    known = _profiles_for(gpu, path)
    if profile not in known:
        raise SpecError(
            f"{path}.migProfile",
            f"unknown MIG profile {profile!r}{_for_product(gpu)}; valid: {', '.join(known)}",
        )
    if gpu.mig_strategy == "single":
        if not gpu.product:
            raise SpecError(
                f"{path}.product",
                "is required with migStrategy single: nodes are selected by "
                f"{PRODUCT_LABEL}=<product>-MIG-<profile>",
            )
        selector = {PRODUCT_LABEL: f"{gpu.product}-MIG-{profile}"}
        problem = label_value_problem(selector[PRODUCT_LABEL])
        if problem:  # '+me' profiles and long product names cannot be a label value
            raise SpecError(f"{path}.migStrategy", f"single selects nodes by {PRODUCT_LABEL}={problem}; use mixed")
        return GpuResources({GPU_RESOURCE: "1"}, selector, tolerations, "KIND_GPU")
    selector = {PRODUCT_LABEL: gpu.product} if gpu.product else {}
    return GpuResources({resource_name(profile): "1"}, selector, tolerations, "KIND_GPU")


def _for_product(gpu: GpuSpec) -> str:
    return f" for {gpu.product}" if gpu.product else ""


def _profiles_for(gpu: GpuSpec, path: str) -> tuple[str, ...]:
    if not gpu.product:
        seen: dict[str, None] = {}
        for table in MIG_PROFILES.values():
            seen.update(dict.fromkeys(table))
        return tuple(seen)
    name = family(gpu.product)
    if name is None:
        raise SpecError(
            f"{path}.product",
            f"unknown or non-MIG GPU product {gpu.product!r}; MIG-capable: {', '.join(MIG_PROFILES)}",
        )
    return tuple(MIG_PROFILES[name])


MIG_RESOURCE_PREFIX = "nvidia.com/mig-"


def has_gpu_resources(resources: Mapping[str, str]) -> bool:
    """True when user-written resources ask for at least one GPU or MIG slice (``nvidia.com/gpu: 0`` asks for none)."""
    return any(
        (name == GPU_RESOURCE or name.startswith(MIG_RESOURCE_PREFIX)) and (quantity(str(value)) or 0) > 0
        for name, value in resources.items()
    )


def check_written(limits: Mapping[str, str], path: str) -> None:
    """MIG slices written in ``resources.limits`` (KServe's way) follow the rules ``gpu.migProfile`` follows.

    A profile no GPU has is never advertised (the pod would stay Pending), and a process uses one
    CUDA device: one slice, not mixed with whole GPUs or with a slice of another profile.
    """
    known: dict[str, None] = {}
    for table in MIG_PROFILES.values():
        known.update(dict.fromkeys(resource_name(p) for p in table))
    slices = [name for name, value in limits.items() if name.startswith(MIG_RESOURCE_PREFIX)
              and (quantity(str(value)) or 0) > 0]
    for name in slices:
        if name not in known:
            raise SpecError(f"{path}.{name}", f"unknown MIG resource; valid: {', '.join(known)}")
        if quantity(str(limits[name])) != 1:
            raise SpecError(f"{path}.{name}", f"must be 1, got {limits[name]!r}: a MIG slice is one CUDA device and "
                                              "a process can use only one; add replicas for more throughput")
    whole = (quantity(str(limits.get(GPU_RESOURCE, "0"))) or 0) > 0
    if len(slices) > 1 or (slices and whole):
        other = slices[1] if len(slices) > 1 else GPU_RESOURCE
        raise SpecError(f"{path}.{slices[0]}", f"conflicts with {other}: a process can use only one CUDA device "
                                               "when it is a MIG slice")
