"""How a plan is rolled out: waves, budgets, halts, drain, verification, time window."""

from __future__ import annotations

import re
import zoneinfo
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, time, timedelta
from enum import Enum
from functools import cache
from typing import Annotated, Any

from pydantic import AfterValidator, Field, PlainSerializer, PlainValidator, model_validator

from rollout.inputs.fieldproblems import FieldProblem, describe_value, did_you_mean, shorten
from rollout.inputs.fieldtypes import (
    AmountField,
    Bool,
    ImageRef,
    Int,
    NodeAmount,
    SpecModel,
    Str,
    check_label_key,
    check_label_value,
)
from rollout.operatornames import UPGRADE_FAILED, UPGRADE_STATE_LABEL
from rollout.spec.gates import GatesPolicy
from rollout.spec.notify import NotifyField
from rollout.spec.selector import LabelSelector, LabelSelectorError, parse_label_selector

# The label the operator puts on a node whose driver upgrade failed: every plan halts on it
UPGRADE_FAILED_LABEL = f"{UPGRADE_STATE_LABEL}={UPGRADE_FAILED}"
DRAIN_SKIP_LABEL = "nvidia.com/gpu-driver-upgrade-drain.skip"
DEFAULT_SMOKE_IMAGE = "nvcr.io/nvidia/cuda:12.4.1-base-ubuntu22.04"

# Upper bounds on durations: far beyond any sane wait, low enough to catch a value written
# in milliseconds or minutes by mistake.
MAX_DRAIN_TIMEOUT_S = 86_400
MAX_VERIFY_TIMEOUT_S = 3_600
MAX_RESTART_TIMEOUT_S = 600


class OnFailure(Enum):
    """What to do with a node whose step failed."""

    ROLLBACK = "rollback"
    HALT = "halt"


class Ungrouped(Enum):
    """What becomes of a target without the `group_by` label."""

    ALONE = "alone"  # each such node is a topology group of its own
    REFUSE = "refuse"  # the plan is refused, naming them


class Weekday(Enum):
    """A day of the week as a plan writes it."""

    MON = "mon"
    TUE = "tue"
    WED = "wed"
    THU = "thu"
    FRI = "fri"
    SAT = "sat"
    SUN = "sun"

    @property
    def index(self) -> int:
        """Monday 0 .. Sunday 6, as datetime.weekday()."""
        return list(Weekday).index(self)

    @classmethod
    def from_index(cls, index: int) -> Weekday:
        return list(cls)[index % 7]


@dataclass(frozen=True)
class Label:
    """A `key=value` node label."""

    key: str
    value: str

    def is_on(self, labels: Mapping[str, str]) -> bool:
        """True when `labels` carry this label with this value."""
        return labels.get(self.key) == self.value

    def __str__(self) -> str:
        return f"{self.key}={self.value}"


def parse_label(value: Any) -> Label:
    """`key=value` with a valid label key and value."""
    if isinstance(value, Label):
        return value
    if not isinstance(value, str) or "=" not in value:
        raise FieldProblem(
            f"expected a label as key=value, found {describe_value(value)}",
            hint=f'e.g. "{UPGRADE_FAILED_LABEL}"',
        )
    key, _, label_value = value.partition("=")
    problem = check_label_key(key.strip()) or check_label_value(label_value.strip())
    if problem:
        raise FieldProblem(problem)
    return Label(key.strip(), label_value.strip())


LabelField = Annotated[Label, PlainValidator(parse_label), PlainSerializer(str)]


def validate_selector(value: Any) -> LabelSelector:
    """A label selector string, parsed."""
    if isinstance(value, LabelSelector):
        return value
    if not isinstance(value, str):
        raise FieldProblem(
            f"expected a label selector string, found {describe_value(value)}",
            hint='write it as one string, e.g. "nvidia.com/gpu.present=true"',
        )
    try:
        return parse_label_selector(value)
    except LabelSelectorError as exc:
        raise FieldProblem(
            f"bad label selector {shorten(value)!r}: {exc.message}", exc.hint
        ) from exc


SelectorField = Annotated[
    LabelSelector,
    PlainValidator(validate_selector),
    PlainSerializer(lambda selector: selector.to_string()),
]


def _check_label_key(value: str) -> str:
    problem = check_label_key(value)
    if problem:
        raise FieldProblem(problem)
    return value


class DrainPolicy(SpecModel):
    """How pods leave a node before it is changed (kubectl drain semantics)."""

    timeout_s: Annotated[Int, Field(ge=0, le=MAX_DRAIN_TIMEOUT_S)] = 300
    grace_period_s: Annotated[Int, Field(ge=0, le=MAX_DRAIN_TIMEOUT_S)] | None = None
    delete_emptydir_data: Bool = False
    force: Bool = False
    pod_selector: SelectorField = LabelSelector()
    skip_label: Annotated[Str, AfterValidator(_check_label_key)] = DRAIN_SKIP_LABEL


class VerifyPolicy(SpecModel):
    """How long each health gate may take before the node counts as failed."""

    smoke_image: ImageRef = DEFAULT_SMOKE_IMAGE
    smoke_timeout_s: Annotated[Int, Field(ge=1, le=MAX_VERIFY_TIMEOUT_S)] = 300
    gpu_wait_timeout_s: Annotated[Int, Field(ge=1, le=MAX_VERIFY_TIMEOUT_S)] = 300
    containerd_restart_timeout_s: Annotated[Int, Field(ge=1, le=MAX_RESTART_TIMEOUT_S)] = 60
    gates: GatesPolicy = GatesPolicy()


class DriverReload(Enum):
    """How a host-installed driver's new kernel module gets loaded after the packages change."""

    REBOOT = "reboot"
    MODULES = "modules"


MAX_REBOOT_TIMEOUT_S = 3_600
MAX_SOAK_S = 86_400  # a day: longer is a plan of separate runs


class DriverPolicy(SpecModel):
    """How a `mode: host` driver upgrade loads the new driver (docs/drivers.md)."""

    # reboot: the new module loads at boot; modules: stop the GPU clients, unload the nvidia
    # modules in dependency order, load them again
    reload: DriverReload = DriverReload.REBOOT
    # reload: modules only: a module still in use after the operands left falls back to a
    # reboot instead of failing the node
    reboot_if_busy: Bool = False
    reboot_timeout_s: Annotated[Int, Field(ge=30, le=MAX_REBOOT_TIMEOUT_S)] = 600
    operands_timeout_s: Annotated[Int, Field(ge=1, le=MAX_VERIFY_TIMEOUT_S)] = 300

    @model_validator(mode="after")
    def _check_fallback(self) -> DriverPolicy:
        if self.reboot_if_busy and self.reload is DriverReload.REBOOT:
            raise FieldProblem(
                "`reboot_if_busy` applies only to reload: modules (reload: reboot always reboots)",
                hint="set reload: modules, or remove reboot_if_busy",
                at=("reboot_if_busy",),
            )
        return self


_CLOCK = re.compile(r"^([01]?[0-9]|2[0-3]):([0-5][0-9])$")


def parse_clock_time(value: Any) -> time:
    """ "HH:MM" on a 24-hour clock."""
    if isinstance(value, time):
        return value
    match = _CLOCK.match(value) if isinstance(value, str) else None
    if match is None:
        raise FieldProblem(
            f'expected a time as "HH:MM" (24-hour clock), found {describe_value(value)}',
            hint='quote it: "22:00"' if isinstance(value, int) else None,
        )
    return time(int(match.group(1)), int(match.group(2)))


ClockTime = Annotated[
    time, PlainValidator(parse_clock_time), PlainSerializer(lambda t: t.strftime("%H:%M"))
]


# The longest IANA name is 32 characters (America/Argentina/ComodRivadavia).
_MAX_ZONE_NAME = 64


@cache
def _known_zones() -> frozenset[str]:
    return frozenset(zoneinfo.available_timezones())


def check_timezone(value: str) -> str:
    """An IANA time zone name known to this machine's zoneinfo."""
    try:
        if len(value) > _MAX_ZONE_NAME:
            raise ValueError("too long for a time zone name")
        zoneinfo.ZoneInfo(value)
    # OSError: zoneinfo opens a file named by the value (a directory, a name too long)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError, OSError) as exc:
        raise FieldProblem(
            f"unknown time zone {shorten(value)!r}",
            hint=did_you_mean(value, _known_zones()) or "use an IANA name like Europe/Berlin",
        ) from exc
    return value


def _check_days(value: tuple[Weekday, ...]) -> tuple[Weekday, ...]:
    for index, day in enumerate(value):
        if day in value[:index]:
            raise FieldProblem(f"day {day.value!r} is listed twice", at=(index,))
    return value


class MaintenanceWindow(SpecModel):
    """When apply may start work on a node; a window with start > end wraps past midnight."""

    days: Annotated[tuple[Weekday, ...], Field(min_length=1), AfterValidator(_check_days)] = tuple(
        Weekday
    )
    start: ClockTime
    end: ClockTime
    timezone: Annotated[Str, AfterValidator(check_timezone)] = "UTC"

    @model_validator(mode="after")
    def _check_not_empty(self) -> MaintenanceWindow:
        if self.start == self.end:
            raise FieldProblem(
                "start and end are equal: the window would be empty",
                hint="leave maintenance_window out to allow any time",
            )
        return self

    @property
    def zone(self) -> zoneinfo.ZoneInfo:
        return zoneinfo.ZoneInfo(self.timezone)

    def contains(self, moment: datetime) -> bool:
        """True when `moment` (timezone-aware) lies in the window.

        A window that wraps midnight belongs to the day it starts: `fri 22:00-04:00` covers
        Friday 22:00 to Saturday 04:00, whether or not Saturday is listed.
        """
        if moment.tzinfo is None or moment.utcoffset() is None:
            raise ValueError("MaintenanceWindow.contains needs a timezone-aware datetime")
        local = moment.astimezone(self.zone)
        clock = local.time().replace(tzinfo=None)
        today = Weekday.from_index(local.weekday())
        if self.start < self.end:
            return today in self.days and self.start <= clock < self.end
        yesterday = Weekday.from_index((local - timedelta(days=1)).weekday())
        return (today in self.days and clock >= self.start) or (
            yesterday in self.days and clock < self.end
        )


class Policy(SpecModel):
    """Waves, failure handling and health gates of a rollout."""

    waves: Annotated[tuple[AmountField, ...], Field(min_length=1)] = (NodeAmount(1),)
    max_unavailable: AmountField = NodeAmount(1)
    failure_budget: Annotated[Int, Field(ge=0)] = 0
    halt_on_labels: tuple[LabelField, ...] = (parse_label(UPGRADE_FAILED_LABEL),)
    on_failure: OnFailure = OnFailure.ROLLBACK
    drain: DrainPolicy = DrainPolicy()
    verify: VerifyPolicy = VerifyPolicy()
    driver: DriverPolicy = DriverPolicy()
    maintenance_window: MaintenanceWindow | None = None
    # after each wave but the last: wait, then read the done nodes' health gates again
    soak_s: Annotated[Int, Field(ge=0, le=MAX_SOAK_S)] = 0
    # topology groups (rollout.topology): a group's nodes are always in the same wave
    group_by: Annotated[Str, AfterValidator(_check_label_key)] | None = None
    max_unavailable_per_group: AmountField | None = None
    ungrouped: Ungrouped = Ungrouped.ALONE
    notify: NotifyField = ()  # webhooks told of the run's events (rollout/notify/)

    @model_validator(mode="after")
    def _check_group_limit(self) -> Policy:
        if self.max_unavailable_per_group is not None and self.group_by is None:
            raise FieldProblem(
                "max_unavailable_per_group is set but group_by is not: there are no groups",
                hint="set group_by to the label that groups nodes, e.g. nvidia.com/gpu.clique",
            )
        return self

    def wave_sizes(self, total_nodes: int) -> list[int]:
        """Nodes per wave, Ansible `serial` style, until `total_nodes` are covered.

        A percentage is of the total, rounded up, at least 1 (Ansible rounds down; up is
        what the plan format promises). The last entry repeats; the last wave holds what is
        left. 0 nodes give no waves.
        """
        if total_nodes < 0:
            raise ValueError(f"total_nodes must be >= 0, got {total_nodes}")
        sizes: list[int] = []
        remaining = total_nodes
        while remaining > 0:
            amount = self.waves[min(len(sizes), len(self.waves) - 1)]
            size = min(amount.resolve_up(total_nodes), remaining)
            sizes.append(size)
            remaining -= size
        return sizes

    def max_unavailable_count(self, total_nodes: int) -> int:
        """Nodes that may be unavailable at once: a percentage rounded down, at least 1.

        Rounding down keeps the budget a guarantee (25% of 6 nodes is 1, not 2), like the GPU
        Operator's maxUnavailable; at least 1 so that a small cluster can make progress.
        """
        if total_nodes < 0:
            raise ValueError(f"total_nodes must be >= 0, got {total_nodes}")
        return self.max_unavailable.resolve_down(total_nodes)

    @property
    def effective_halt_labels(self) -> tuple[Label, ...]:
        """`halt_on_labels` plus the GPU Operator's upgrade-failed label, which always halts."""
        always = parse_label(UPGRADE_FAILED_LABEL)
        labels = tuple(dict.fromkeys(self.halt_on_labels))
        return labels if always in labels else (*labels, always)

    def find_halting_labels(self, labels: Mapping[str, str]) -> tuple[Label, ...]:
        """The halting labels a node carries; non-empty means the run must halt."""
        return tuple(label for label in self.effective_halt_labels if label.is_on(labels))
