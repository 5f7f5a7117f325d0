"""`driver-upgrade:` a GPU driver version, from host packages or the GPU Operator."""

from __future__ import annotations

import re
from collections.abc import Mapping
from enum import Enum
from typing import Annotated, Any

from pydantic import AfterValidator, Field, PlainValidator, model_validator

from rollout.changes.model import ChangeModel
from rollout.inputs.fieldproblems import FieldProblem, describe_value
from rollout.inputs.fieldtypes import Bool, Int, KubeName, Str
from rollout.plan import Advertised

_DRIVER_VERSION = re.compile(r"^[0-9]{3}\.[0-9]{1,3}\.[0-9]{1,3}$")
_DEB_PACKAGE = re.compile(r"^[a-z0-9][a-z0-9+.-]+$")
DEFAULT_DRIVER_PACKAGES = ("nvidia-driver",)
# mode: operator: one node's way through the upgrade states, at most and by default
MAX_OPERATOR_UPGRADE_TIMEOUT_S = 7_200
DEFAULT_OPERATOR_UPGRADE_TIMEOUT_S = 1_800


class DriverMode(Enum):
    """Who installs the driver: apt on the host, or the GPU Operator's driver container."""

    HOST = "host"
    OPERATOR = "operator"


def check_driver_version(value: Any) -> str:
    """A full NVIDIA driver version such as 535.154.05, as a string."""
    if isinstance(value, float):
        raise FieldProblem(
            f'expected a driver version like "550.127.05", found the number {value!r}',
            hint="quote the version; YAML reads 550.127 as a number",
        )
    if not isinstance(value, str) or not _DRIVER_VERSION.match(value):
        raise FieldProblem(
            f'expected a driver version like "550.127.05", found {describe_value(value)}'
        )
    return value


def check_package(value: str) -> str:
    """A Debian package name, without a version pin (rollout pins `version` itself)."""
    if "=" in value:
        raise FieldProblem(
            f"expected a package name without a version, found {describe_value(value)}",
            hint="rollout installs `version`; list names only",
        )
    if not _DEB_PACKAGE.match(value):
        raise FieldProblem(f"expected a Debian package name, found {describe_value(value)}")
    return value


class DriverUpgradeChange(ChangeModel):
    """Move the GPU driver to `version`, by apt (host) or through the GPU Operator (operator):
    the ClusterPolicy's spec.driver.version, or one NVIDIADriver's spec.version."""

    version: Annotated[str, PlainValidator(check_driver_version)]
    mode: DriverMode
    packages: tuple[Annotated[Str, AfterValidator(check_package)], ...] | None = None
    # mode: operator only: how long one node may take through the GPU Operator's upgrade
    # states, from its skip label's removal to upgrade-done (docs/drivers-operator.md)
    upgrade_timeout_s: Annotated[Int, Field(ge=60, le=MAX_OPERATOR_UPGRADE_TIMEOUT_S)] | None = None
    # mode: operator only: a target the GPU Operator left `upgrade-failed` is relabelled
    # `upgrade-required` (the documented manual fix) instead of halting the run; written by
    # `rollout diagnose --fix` once the cause is fixed
    retry_failed: Bool = False
    # mode: operator only: the NVIDIADriver resource whose spec.version changes (its own driver
    # DaemonSet and nodes) instead of the ClusterPolicy's spec.driver.version
    nvidiadriver: KubeName | None = None

    @model_validator(mode="after")
    def _check_packages(self) -> DriverUpgradeChange:
        if self.mode is DriverMode.OPERATOR and self.packages is not None:
            raise FieldProblem(
                "`packages` applies only to mode: host",
                hint="in operator mode the GPU Operator's driver container is upgraded; remove"
                " `packages`",
            )
        if self.mode is DriverMode.HOST and self.upgrade_timeout_s is not None:
            raise FieldProblem(
                "`upgrade_timeout_s` applies only to mode: operator",
                hint="host mode's timeouts are under policy.driver; remove upgrade_timeout_s",
            )
        if self.mode is DriverMode.HOST and self.retry_failed:
            raise FieldProblem(
                "`retry_failed` applies only to mode: operator",
                hint="host mode has no upgrade-failed state to retry; remove retry_failed",
            )
        if self.mode is DriverMode.HOST and self.nvidiadriver is not None:
            raise FieldProblem(
                "`nvidiadriver` applies only to mode: operator",
                hint="an NVIDIADriver resource is the GPU Operator's; host-installed drivers are "
                "upgraded by apt: remove nvidiadriver, or use mode: operator",
            )
        if self.mode is DriverMode.HOST and self.packages == ():
            raise FieldProblem("mode: host needs at least one package in `packages`")
        return self

    def advertises(self, now: Mapping[str, int], physical: int) -> Advertised:
        """Either mode: the same GPUs come back under the new driver, as they are `now`."""
        return Advertised(now)

    def watches_failed_upgrade(self) -> bool:
        """`retry_failed`: driver.release relabels a target's upgrade-failed and watches it."""
        return self.retry_failed

    def driver_version(self) -> str | None:
        """Either mode: the version the node's driver moves to."""
        return self.version

    @property
    def apt_packages(self) -> tuple[str, ...]:
        """The packages to install in host mode (default nvidia-driver); () in operator mode."""
        if self.mode is DriverMode.OPERATOR:
            return ()
        return self.packages if self.packages is not None else DEFAULT_DRIVER_PACKAGES
