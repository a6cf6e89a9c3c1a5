"""What a load of a loaded model version changes, as Triton 2.51 decides it (model_lifecycle.cc ``AsyncLoad``).

A READY version of a model that is not an ensemble, whose own files are no newer (``repository.timestamps``) and
whose new config differs from its serving one in nothing but ``instance_group`` and ``version_policy``
(``ConfigChangeRequiresReload``), is updated in place: it keeps serving, and its statistics, without being created
again. With equal instance groups nothing else happens (no instance is initialized again); with other instance
groups the version keeps its statistics and the instances whose group setting is unchanged
(``instance_groups.signature``), and only the difference is created or finalized, as Triton's
``UpdateInstanceGroup`` (a sequence model creates all its instances again). Anything else is a full load of that
version. The registry applies the decision; this module only makes it.
"""

from __future__ import annotations

from tritonclient.grpc import model_config_pb2 as mc

#: config fields a loaded version follows without being created again
UPDATABLE_FIELDS = ("instance_group", "version_policy")


def _without(config: mc.ModelConfig, *fields: str) -> mc.ModelConfig:
    copy = mc.ModelConfig()
    copy.CopyFrom(config)
    for name in fields:
        copy.ClearField(name)
    return copy


def requires_reload(serving: mc.ModelConfig, new: mc.ModelConfig) -> bool:
    """Whether ``new`` differs from the ``serving`` config in more than ``UPDATABLE_FIELDS``."""
    return _without(serving, *UPDATABLE_FIELDS) != _without(new, *UPDATABLE_FIELDS)


def same_instances(serving: mc.ModelConfig, new: mc.ModelConfig) -> bool:
    """Whether the two configs place the same instances (their instance groups are equal)."""
    return list(serving.instance_group) == list(new.instance_group)
