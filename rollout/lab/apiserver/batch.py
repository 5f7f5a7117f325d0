"""batch/v1 CronJob and Job: their defaults and validation, as the real server's registry
strategies and pkg/apis/batch/validation have them for the fields `rollout schedule` writes
(schedule, timeZone, concurrencyPolicy, startingDeadlineSeconds, suspend, history limits,
backoffLimit, activeDeadlineSeconds, the pod template's restartPolicy)."""

from __future__ import annotations

import re
import zoneinfo
from collections.abc import Mapping
from typing import Any

from rollout.lab.apiserver.errors import StatusCause
from rollout.lab.apiserver.fielderrors import invalid, max_len_error, not_supported, required
from rollout.lab.apiserver.resources import CRONJOBS, JOBS, ResourceKind

# A Job's name is the CronJob's plus a dash and up to 10 digits; labels cap it at 63.
MAX_CRONJOB_NAME = 52
CONCURRENCY_POLICIES = ("Allow", "Forbid", "Replace")
_CRON_MACROS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
_NAMES = {
    3: ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"),
    4: ("sun", "mon", "tue", "wed", "thu", "fri", "sat"),
}
_BOUNDS = ((0, 59), (0, 23), (1, 31), (1, 12), (0, 7))


def default_batch(kind: ResourceKind, obj: dict[str, Any]) -> None:
    """SetDefaults_CronJob and SetDefaults_Job, and a fresh empty status."""
    spec = obj.setdefault("spec", {})
    if kind == CRONJOBS:
        spec.setdefault("concurrencyPolicy", "Allow")
        spec.setdefault("suspend", False)
        spec.setdefault("successfulJobsHistoryLimit", 3)
        spec.setdefault("failedJobsHistoryLimit", 1)
        _default_job_spec(spec.setdefault("jobTemplate", {}).setdefault("spec", {}))
    elif kind == JOBS:
        _default_job_spec(spec)
    obj["status"] = {}


def _default_job_spec(spec: dict[str, Any]) -> None:
    spec.setdefault("completions", 1)
    spec.setdefault("parallelism", 1)
    spec.setdefault("backoffLimit", 6)
    spec.setdefault("completionMode", "NonIndexed")
    spec.setdefault("suspend", False)
    template = spec.setdefault("template", {})
    template.setdefault("spec", {}).setdefault("restartPolicy", "Always")


def batch_causes(kind: ResourceKind, obj: Mapping[str, Any]) -> list[StatusCause]:
    """What ValidateCronJob / ValidateJob refuse among the fields served here."""
    spec = obj.get("spec") or {}
    if kind == CRONJOBS:
        name = str((obj.get("metadata") or {}).get("name") or "")
        causes = []
        if len(name) > MAX_CRONJOB_NAME:
            causes.append(invalid("metadata.name", name, max_len_error(MAX_CRONJOB_NAME)))
        causes += _schedule_causes(spec.get("schedule"), spec.get("timeZone"))
        policy = spec.get("concurrencyPolicy")
        if policy not in CONCURRENCY_POLICIES:
            causes.append(not_supported("spec.concurrencyPolicy", policy, CONCURRENCY_POLICIES))
        causes += _non_negative(spec, "startingDeadlineSeconds", "spec")
        causes += _non_negative(spec, "successfulJobsHistoryLimit", "spec")
        causes += _non_negative(spec, "failedJobsHistoryLimit", "spec")
        job = (spec.get("jobTemplate") or {}).get("spec") or {}
        return causes + _job_causes(job, "spec.jobTemplate.spec")
    if kind == JOBS:
        return _job_causes(spec, "spec")
    return []


def _job_causes(spec: Mapping[str, Any], at: str) -> list[StatusCause]:
    causes = _non_negative(spec, "backoffLimit", at)
    deadline = spec.get("activeDeadlineSeconds")
    if deadline is not None and (not isinstance(deadline, int) or deadline <= 0):
        causes.append(invalid(f"{at}.activeDeadlineSeconds", deadline, "must be greater than 0"))
    template = (spec.get("template") or {}).get("spec") or {}
    policy = template.get("restartPolicy")
    if policy not in ("OnFailure", "Never"):
        causes.append(
            not_supported(f"{at}.template.spec.restartPolicy", policy, ("OnFailure", "Never"))
        )
    if not template.get("containers"):
        causes.append(required(f"{at}.template.spec.containers"))
    return causes


def _schedule_causes(schedule: Any, time_zone: Any) -> list[StatusCause]:
    causes: list[StatusCause] = []
    if not schedule:
        return [required("spec.schedule")]
    if not isinstance(schedule, str) or parse_schedule(schedule) is None:
        causes.append(invalid("spec.schedule", schedule, "unparseable schedule"))
    elif "TZ" in schedule:
        causes.append(
            invalid(
                "spec.schedule",
                schedule,
                "cannot use TZ or CRON_TZ in schedule, use timeZone field instead",
            )
        )
    if time_zone is not None:
        try:
            if not isinstance(time_zone, str) or not time_zone or time_zone.startswith("/"):
                raise ValueError(time_zone)
            zoneinfo.ZoneInfo(time_zone)
        except (zoneinfo.ZoneInfoNotFoundError, ValueError, OSError):
            causes.append(invalid("spec.timeZone", time_zone, "unknown time zone"))
    return causes


def parse_schedule(text: str) -> tuple[frozenset[int], ...] | None:
    """The five fields as sets of allowed values (day of week: Sunday 0), or None when the
    text is not a schedule robfig/cron's standard parser would take."""
    text = _CRON_MACROS.get(text.strip(), text)
    fields = text.split()
    if len(fields) != 5:
        return None
    parsed = []
    for index, field in enumerate(fields):
        values = _parse_field(field.lower(), index)
        if values is None:
            return None
        if index == 4:
            values = frozenset(v % 7 for v in values)
        parsed.append(values)
    return tuple(parsed)


def _parse_field(field: str, index: int) -> frozenset[int] | None:
    low, high = _BOUNDS[index]
    names = _NAMES.get(index, ())
    values: set[int] = set()
    for part in field.split(","):
        match = re.fullmatch(r"(\*|\?|[a-z0-9]+(?:-[a-z0-9]+)?)(?:/([0-9]+))?", part)
        if match is None:
            return None
        span, step_text = match.groups()
        step = int(step_text) if step_text else 1
        if span in ("*", "?"):
            start, end = low, high
        else:
            ends = [_value(v, names, index) for v in span.split("-")]
            if any(v is None for v in ends):
                return None
            start = ends[0]  # type: ignore[assignment]
            end = ends[-1] if len(ends) == 2 or step_text else start  # type: ignore[assignment]
            if step_text and len(ends) == 1:
                end = high
        if step < 1 or not low <= start <= end <= high:
            return None
        values.update(range(start, end + 1, step))
    return frozenset(values)


def _value(text: str, names: tuple[str, ...], index: int) -> int | None:
    if text.isdigit():
        return int(text)
    if text in names:
        return names.index(text) + (1 if index == 3 else 0)
    return None


def _non_negative(spec: Mapping[str, Any], field: str, at: str) -> list[StatusCause]:
    value = spec.get(field)
    if value is None or (isinstance(value, int) and value >= 0):
        return []
    return [invalid(f"{at}.{field}", value, "must be greater than or equal to 0")]
