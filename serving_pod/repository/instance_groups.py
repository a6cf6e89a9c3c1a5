"""Instance groups as Triton's core completes and checks them: kinds, GPU ids and instance names.

* ``complete`` (Triton's NormalizeInstanceGroup): one group named after the model where the config has
  none, ``<model>_<i>`` for a group without a name, KIND_AUTO resolved, the default count where a group gives
  none (Triton's SetDefaultInstanceCount: 2 for a KIND_CPU group of an onnxruntime or tensorflow model, else 1),
  and every visible GPU for a KIND_GPU group that lists none. KIND_AUTO becomes ``--default-instance-kind`` when that is
  set; otherwise KIND_GPU where GPUs are visible (and every GPU the group lists is one of them), else
  KIND_CPU. One difference from Triton, where every onnxruntime build has CUDA: an onnxruntime without the
  CUDA execution provider resolves KIND_AUTO to KIND_CPU.
* ``check`` (Triton's ValidateInstanceGroup): GPUs only in KIND_GPU groups, at least one there, only
  GPUs that are visible, and a ``profile`` on TensorRT models only; each refusal is Triton's message, a failure of
  each version (Triton checks the groups when it creates a version).
* ``placements``: the instances to create, in Triton's order and with Triton's names (``<group>_<i>``;
  a KIND_GPU group makes instance ``i`` once per GPU, under the same name).
* ``signature``: what an instance-group update matches instances by (Triton's instance signature).
* ``passive_indices``: the instances of ``passive: true`` groups, which Triton loads but neither warms up nor
  schedules (nor counts in the rate limiter).

The visible GPUs are those CUDA enumerates (NVML's, through ``CUDA_VISIBLE_DEVICES`` where it is set) of at
least ``--min-supported-compute-capability`` (default 6.0, as Triton's).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from tritonclient.grpc import model_config_pb2 as mc

from serving_pod.core.load_errors import VersionRefused

#: Triton's default ``--min-supported-compute-capability``
MIN_COMPUTE_CAPABILITY = 6.0
#: backends whose KIND_CPU groups get two instances when they give no count (Triton's default_cpu_instance_count)
_TWO_CPU_INSTANCES = ("onnxruntime", "tensorflow")


def visible_gpus(min_capability: float = MIN_COMPUTE_CAPABILITY) -> list[int]:
    """CUDA device ids this process may place instances on, as Triton's GetSupportedGPUs finds them: the
    devices CUDA enumerates (NVML's GPUs, through ``CUDA_VISIBLE_DEVICES`` where it is set) whose compute
    capability is at least ``min_capability``."""
    try:
        import pynvml  # provided by nvidia-ml-py
    except ImportError:
        return []
    try:
        pynvml.nvmlInit()
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(int(pynvml.nvmlDeviceGetCount()))]
    except pynvml.NVMLError:
        return []
    mask = os.environ.get("CUDA_VISIBLE_DEVICES")
    if mask is not None:
        handles = _masked(pynvml, handles, mask)
    return [cuda_id for cuda_id, handle in enumerate(handles) if _capability(pynvml, handle) >= min_capability]


def _masked(pynvml: Any, handles: list[Any], mask: str) -> list[Any]:
    """The devices CUDA enumerates under ``mask``: the listed ones, up to the first that is not here."""
    chosen = []
    for entry in mask_entries(mask):
        try:
            if isinstance(entry, int):
                if entry >= len(handles):
                    break
                chosen.append(handles[entry])
            else:
                chosen.append(pynvml.nvmlDeviceGetHandleByUUID(entry))
        except pynvml.NVMLError:  # a UUID that is not here (or an abbreviated one NVML cannot resolve)
            break
    return chosen


def mask_entries(mask: str) -> list[int | str]:
    """``CUDA_VISIBLE_DEVICES`` as CUDA reads it: indices and GPU-/MIG- UUIDs, up to the first invalid entry."""
    entries: list[int | str] = []
    for entry in (part.strip() for part in mask.split(",")):
        if entry.isdigit():
            entries.append(int(entry))
        elif entry.startswith(("GPU-", "MIG-")):
            entries.append(entry)
        else:
            break
    return entries


def _capability(pynvml: Any, handle: Any) -> float:
    """``major.minor`` as Triton compares it; a device NVML cannot answer for (a MIG slice) counts as supported."""
    try:
        major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
    except pynvml.NVMLError:
        return float("inf")
    return major + minor / 10


def complete(config: mc.ModelConfig, *, default_kind: str, gpus: Sequence[int], gpu_capable: bool,
             backend: str = "") -> None:
    """Fill in the config's instance groups in place (``gpu_capable``: the backend can run on a GPU; ``backend``: the
    model's backend, which sets the default count)."""
    if not config.instance_group:
        config.instance_group.add(name=config.name, kind=mc.ModelInstanceGroup.KIND_AUTO)
    for index, group in enumerate(config.instance_group):
        if not group.name:
            group.name = f"{config.name}_{index}"
        if group.kind == mc.ModelInstanceGroup.KIND_AUTO and default_kind != "KIND_AUTO":
            group.kind = mc.ModelInstanceGroup.Kind.Value(default_kind)
        if group.kind == mc.ModelInstanceGroup.KIND_AUTO:
            on_gpu = bool(gpus) and all(gpu in gpus for gpu in group.gpus)
            if on_gpu and not gpu_capable:
                del group.gpus[:]  # Ferry's difference: this onnxruntime cannot use the GPUs the group names
                on_gpu = False
            group.kind = mc.ModelInstanceGroup.KIND_GPU if on_gpu else mc.ModelInstanceGroup.KIND_CPU
        if group.count == 0:  # after the kind is resolved, as Triton
            two = group.kind == mc.ModelInstanceGroup.KIND_CPU and backend in _TWO_CPU_INSTANCES
            group.count = 2 if two else 1
        if group.kind == mc.ModelInstanceGroup.KIND_GPU and not group.gpus:
            group.gpus.extend(gpus)


def check(config: mc.ModelConfig, gpus: Sequence[int], min_capability: float = MIN_COMPUTE_CAPABILITY) -> None:
    """``VersionRefused`` (each version's failure, as Triton's) with Triton's message for a group whose GPUs do not fit
    its kind or this machine, or that names TensorRT profiles on another backend; and for a negative count, which
    Triton serves as its default count (Ferry refuses it)."""
    for group in config.instance_group:
        where = f"instance group {group.name} of model {config.name}"
        kind = mc.ModelInstanceGroup.Kind.Name(group.kind)
        if kind != "KIND_GPU":
            if group.gpus:
                raise VersionRefused(f"{where} has kind {kind} but specifies one or more GPUs")
        elif not group.gpus:
            raise VersionRefused(f"{where} has kind KIND_GPU but no GPUs are available")
        for gpu in group.gpus:
            if gpu not in gpus:
                raise VersionRefused(
                    f"{where} specifies invalid or unsupported gpu id {gpu}. GPUs with at least the minimum "
                    f"required CUDA compute compatibility of {min_capability:.6f} are: "
                    + ", ".join(str(g) for g in gpus)
                )
        if group.profile and config.backend != "tensorrt":  # Triton's words: no space after the platform
            raise VersionRefused(f"{where} and platform {config.platform}specifies profile field which is only "
                                 "supported for TensorRT models")
        if group.count < 0:
            raise VersionRefused(f"{where} specifies count {group.count}: it must be >= 1")


def placements(config: mc.ModelConfig) -> list[tuple[str, str, int, mc.ModelInstanceGroup]]:
    """``(instance name, kind name, device id, group)`` per instance, in the order Triton creates them."""
    result = []
    for group in config.instance_group:
        kind = mc.ModelInstanceGroup.Kind.Name(group.kind)
        devices = list(group.gpus) if kind == "KIND_GPU" else [0]
        for index in range(group.count):
            result.extend((f"{group.name}_{index}", kind, device, group) for device in devices)
    return result


def signature(group: mc.ModelInstanceGroup, device: int) -> bytes:
    """What identifies an instance across an instance-group update, as Triton's ``TritonModelInstance::Signature``:
    its device and its group with the group's name and count left out. A new config's instance whose signature an
    instance of the serving version has keeps that instance (its name included) instead of creating one."""
    normalized = mc.ModelInstanceGroup()
    normalized.CopyFrom(group)
    normalized.name = "[Normalized]"
    normalized.count = 1
    return device.to_bytes(4, "little", signed=True) + normalized.SerializeToString(deterministic=True)


def passive_indices(config: mc.ModelConfig) -> frozenset[int]:
    """Positions in ``placements`` of the instances of ``passive: true`` groups: loaded, never warmed up nor
    scheduled. Where every instance is passive, none is (Ferry's choice: Triton 2.51 crashes on the first request
    to such a model, recorded live, and its python backend serves nothing)."""
    placed = placements(config)
    passive = frozenset(index for index, (_, _, _, group) in enumerate(placed) if group.passive)
    return frozenset() if len(passive) == len(placed) else passive
