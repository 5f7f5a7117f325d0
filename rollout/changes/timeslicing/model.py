"""`time-slicing:` a device-plugin sharing profile, its ConfigMap and its replicas."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field

from rollout.changes.model import ChangeModel
from rollout.deviceprofiles import MAX_REPLICAS, renames_by_default, shared_replicas
from rollout.inputs.fieldproblems import FieldProblem, describe_value
from rollout.inputs.fieldtypes import (
    Bool,
    DnsLabel,
    Int,
    KubeName,
    SpecModel,
    Str,
    check_label_value,
)
from rollout.operatornames import GPU_RESOURCE, OPERATOR_NAMESPACE, SHARED_GPU_RESOURCE
from rollout.plan import Advertised

_RESOURCE_NAME = re.compile(r"^nvidia\.com/[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")


def check_resource_name(value: str) -> str:
    """An extended resource the device plugin advertises: nvidia.com/gpu, nvidia.com/mig-..."""
    if not _RESOURCE_NAME.match(value):
        hint = f"write 'nvidia.com/{value}'" if "/" not in value and value else None
        raise FieldProblem(
            f"expected a resource name like 'nvidia.com/gpu', found {describe_value(value)}",
            hint=hint,
        )
    return value


def check_replicas(value: int) -> int:
    """2..MAX_REPLICAS: 1 shares nothing, and more than 64 slices of one GPU is a typo."""
    if value == 1:
        raise FieldProblem(
            "replicas: 1 means no sharing",
            hint="remove the time-slicing change, or use a profile without this resource",
        )
    if not 2 <= value <= MAX_REPLICAS:
        raise FieldProblem(f"expected replicas from 2 to {MAX_REPLICAS}, found {value}")
    return value


def check_profile(value: str) -> str:
    """A ConfigMap key that is also a node label value."""
    problem = check_label_value(value)
    if problem or not value:
        raise FieldProblem(
            f"the profile is the value of the node label nvidia.com/device-plugin.config:"
            f" {problem or 'it must not be empty'}"
        )
    return value


class ConfigMapRef(SpecModel):
    """The ConfigMap whose keys are device-plugin profiles (ClusterPolicy devicePlugin.config)."""

    namespace: DnsLabel = OPERATOR_NAMESPACE
    name: KubeName = "time-slicing-config"


class SharedResource(SpecModel):
    """One resource shared by time-slicing."""

    name: Annotated[Str, AfterValidator(check_resource_name)]
    replicas: Annotated[Int, AfterValidator(check_replicas)]


def _check_distinct_resources(value: tuple[SharedResource, ...]) -> tuple[SharedResource, ...]:
    names = [r.name for r in value]
    for index, name in enumerate(names):
        if name in names[:index]:
            raise FieldProblem(f"resource {name!r} is listed twice", at=(index, "name"))
    return value


class TimeSlicing(SpecModel):
    """The device plugin's `sharing.timeSlicing` block."""

    rename_by_default: Bool = Field(default=False, alias="renameByDefault")
    fail_requests_greater_than_one: Bool = Field(default=False, alias="failRequestsGreaterThanOne")
    resources: Annotated[
        tuple[SharedResource, ...], Field(min_length=1), AfterValidator(_check_distinct_resources)
    ]


class Sharing(SpecModel):
    """The device plugin's `sharing` block."""

    time_slicing: TimeSlicing = Field(alias="timeSlicing")


class DevicePluginConfig(SpecModel):
    """A device-plugin config as the GPU Operator's ConfigMap holds it under one profile key.

    Without `sharing` the profile shares nothing (`version: v1` alone): what moves nodes back
    to whole GPUs, and what a node without any config runs.
    """

    version: Literal["v1"] = "v1"
    sharing: Sharing | None = None


class TimeSlicingChange(ChangeModel):
    """Put `config` under key `profile` in the ConfigMap and label nodes with the profile."""

    configmap: ConfigMapRef = ConfigMapRef()
    profile: Annotated[Str, AfterValidator(check_profile)]
    config: DevicePluginConfig

    def replicas_for(self, resource: str) -> int:
        """How many slices each device of `resource` becomes: 1 when it is not shared."""
        return shared_replicas(self.config_document(), resource) or 1

    @property
    def rename_by_default(self) -> bool:
        """Whether shared GPUs move to nvidia.com/gpu.shared (never without sharing)."""
        return renames_by_default(self.config_document())

    def shared_gpus(self) -> tuple[str, int]:
        """The resource a GPU is advertised under with this profile (nvidia.com/gpu.shared with
        renameByDefault, when shared; else nvidia.com/gpu) and the slices each GPU becomes."""
        replicas = self.replicas_for(GPU_RESOURCE)
        renamed = self.rename_by_default and replicas > 1
        return (SHARED_GPU_RESOURCE if renamed else GPU_RESOURCE), replicas

    def advertises(self, now: Mapping[str, int], physical: int) -> Advertised:
        """The node's `physical` GPUs x replicas under shared_gpus' name, the other GPU name
        at 0 (the device plugin stops advertising it); MIG resources as they are `now`."""
        resource, replicas = self.shared_gpus()
        counts = {**now, GPU_RESOURCE: 0, SHARED_GPU_RESOURCE: 0, resource: physical * replicas}
        caveats = (
            f"{resource}: {replicas} time-slices per GPU share its memory and its faults "
            "(no isolation between the pods on one GPU)",
        )
        return Advertised(counts, caveats if replicas > 1 else ())

    def config_document(self) -> dict[str, Any]:
        """The config as the device plugin reads it (camelCase keys), for the ConfigMap."""
        return self.config.model_dump(mode="json", by_alias=True, exclude_none=True)
