"""The CronJob and Job controllers of the lab cluster, with the real controllers' semantics for
the fields `rollout schedule` writes (pkg/controller/cronjob, pkg/controller/job):

- a CronJob fires at the most recent schedule time it has not run, read in `timeZone`;
  nothing fires while `suspend` is true; a time missed by more than
  `startingDeadlineSeconds` is skipped with a `MissSchedule` Event;
- `concurrencyPolicy`: Forbid skips a run while one is active (`JobAlreadyActive`), Replace
  deletes the active ones first, Allow starts another;
- the Job is named `<cronjob>-<minutes since the epoch of its schedule time>`, owned by the
  CronJob, and lands in `status.active`; `lastScheduleTime`, `lastSuccessfulTime` follow;
  finished Jobs beyond `successfulJobsHistoryLimit` / `failedJobsHistoryLimit` are deleted;
- a Job runs one pod from its template; the pod's end sets the Job's conditions: Complete,
  or Failed with `BackoffLimitExceeded` once failures pass `backoffLimit` (0: the first; a
  pod deleted before it ended counts as failed),
  or `DeadlineExceeded` once it has been active `activeDeadlineSeconds` (its pods deleted).

What runs inside the pod is the kubelet's business; the controllers only read its phase.
Time comes from `clock`: a `ScaledClock` lets tests move the schedule forward or speed it up,
and only tests pass one.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, ClassVar
from zoneinfo import ZoneInfo

from rollout.lab.apiserver.batch import parse_schedule
from rollout.lab.apiserver.errors import ApiError
from rollout.lab.apiserver.metadata import format_timestamp, new_name_suffix
from rollout.lab.apiserver.registry import Registry
from rollout.lab.apiserver.resources import CRONJOBS, JOBS, PODS, ResourceKind
from rollout.lab.simulation.events import EventRecorder
from rollout.testclock import ScaledTime

SCHEDULED_ANNOTATION = "batch.kubernetes.io/cronjob-scheduled-timestamp"
JOB_NAME_LABEL = "batch.kubernetes.io/job-name"
CONTROLLER_UID_LABEL = "batch.kubernetes.io/controller-uid"
# The real controller gives up counting after 100 missed start times (and says so).
MAX_MISSED = 100
# How far back an unmet schedule is looked for: two months of minutes.
_LOOKBACK = timedelta(days=62)


@dataclass
class ScaledClock:
    """Tests only: a clock `offset_s` ahead of real time and running `scale` times faster
    (0: stopped until the test moves it). jobpods.py writes it into each scheduled pod's
    clock file (to_text) as it moves."""

    offset_s: float = 0.0
    scale: float = 1.0
    _start: float = field(default_factory=time.time, init=False)

    def __call__(self) -> float:
        real = time.time()
        return self._start + self.offset_s + (real - self._start) * self.scale

    def set(self, moment: float, scale: float | None = None) -> None:
        """Jump to `moment` (seconds since the epoch), running `scale` times faster from here."""
        if scale is not None:
            self.offset_s += (time.time() - self._start) * (self.scale - scale)
            self.scale = scale
        self.offset_s += moment - self()

    def advance(self, seconds: float) -> None:
        """Move the clock `seconds` ahead at once."""
        self.set(self() + seconds)

    def to_text(self) -> str:
        """The clock as the lab hands it to a Job pod: the file format of the product's
        test-only clock seam (rollout/testclock.py, $ROLLOUT_TEST_CLOCK_FILE)."""
        return ScaledTime(self._start, self.offset_s, self.scale).to_text()

    @classmethod
    def from_text(cls, text: str) -> ScaledClock:
        scaled = ScaledTime.from_text(text)
        clock = cls(scaled.offset_s, scaled.scale)
        clock._start = scaled.start
        return clock


def scheduled_times(schedule: str, zone: str, after: datetime, until: datetime) -> list[datetime]:
    """The schedule's times in (after, until], wall-clock in `zone`, as aware UTC datetimes."""
    fields = parse_schedule(schedule)
    if fields is None:
        return []
    minutes, hours, days, months, weekdays = fields
    star_day = schedule.split()[2] in ("*", "?") if not schedule.startswith("@") else True
    star_weekday = schedule.split()[4] in ("*", "?") if not schedule.startswith("@") else True
    tz = ZoneInfo(zone)
    found: list[datetime] = []
    hour = after.astimezone(UTC).replace(minute=0, second=0, microsecond=0)
    while hour <= until and len(found) <= MAX_MISSED:
        local = hour.astimezone(tz)
        day_ok = local.day in days
        weekday_ok = (local.isoweekday() % 7) in weekdays
        # cron: with both day fields restricted, either may match
        dated = day_ok or weekday_ok if not (star_day or star_weekday) else day_ok and weekday_ok
        if local.month in months and dated and local.hour in hours:
            for minute in sorted(minutes):
                moment = (hour + timedelta(minutes=minute)).astimezone(UTC)
                if moment.astimezone(tz).minute == minute and after < moment <= until:
                    found.append(moment)
        hour += timedelta(hours=1)
    return found


def job_name(cronjob: str, scheduled: datetime) -> str:
    """`<cronjob>-<minutes since the epoch>`: one Job per schedule time, whatever retries."""
    return f"{cronjob}-{int(scheduled.timestamp() // 60)}"


def _parse_time(text: str | None) -> datetime | None:
    if not text:
        return None
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)


def _condition(job: Mapping[str, Any]) -> str | None:
    """ "Complete" or "Failed" once the Job has finished, else None."""
    for condition in (job.get("status") or {}).get("conditions") or []:
        if condition.get("type") in ("Complete", "Failed") and condition.get("status") == "True":
            return str(condition["type"])
    return None


def _owned_by(obj: Mapping[str, Any], owner: Mapping[str, Any]) -> bool:
    uid = owner["metadata"]["uid"]
    return any(r.get("uid") == uid for r in obj["metadata"].get("ownerReferences") or [])


def _create_told(
    registry: Registry,
    events: EventRecorder,
    resource: ResourceKind,
    owner: Mapping[str, Any],
    obj: dict[str, Any],
    said: tuple[str, str],
) -> dict[str, Any] | None:
    """Create `obj` for its controller `owner`, whose Event tells how it went: `said` words the
    failure ({error}) and the success ({name}) as that controller does."""
    failed, done = said
    try:
        created = registry.create(resource, obj["metadata"]["namespace"], obj)
    except ApiError as exc:
        events.record(owner, "Warning", "FailedCreate", failed.format(error=exc))
        return None
    name = created["metadata"]["name"]
    events.record(owner, "Normal", "SuccessfulCreate", done.format(name=name))
    return created


def _owner_reference(owner: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": owner["apiVersion"],
        "kind": owner["kind"],
        "name": owner["metadata"]["name"],
        "uid": owner["metadata"]["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


class _BatchController:
    """What both batch controllers hold: the registry, the batch clock, and an Event recorder
    under the component name the real controller reports its Events as."""

    component: ClassVar[str]

    def __init__(self, registry: Registry, clock: Callable[[], float] = time.time) -> None:
        self.registry = registry
        self.clock = clock
        self.events = EventRecorder(registry, self.component, clock=clock)


class CronJobController(_BatchController):
    """Creates a CronJob's Jobs on schedule and keeps its status and history."""

    component = "cronjob-controller"

    def reconcile(self) -> None:
        for cronjob in self.registry.list_objects(CRONJOBS):
            self._sync(cronjob)

    def _sync(self, cronjob: dict[str, Any]) -> None:
        metadata, spec = cronjob["metadata"], cronjob.get("spec") or {}
        namespace, name = metadata["namespace"], metadata["name"]
        now = datetime.fromtimestamp(self.clock(), UTC)
        jobs = [j for j in self.registry.list_objects(JOBS, namespace) if _owned_by(j, cronjob)]
        active = [j for j in jobs if _condition(j) is None]
        self._record_finished(cronjob, jobs)
        self._clean_history(cronjob, jobs)
        if spec.get("suspend"):
            self._write_status(cronjob, active)
            return
        status = cronjob.get("status") or {}
        since = _parse_time(status.get("lastScheduleTime")) or _parse_time(
            metadata.get("creationTimestamp")
        )
        earliest = max(since or now, now - _LOOKBACK)
        deadline = spec.get("startingDeadlineSeconds")
        if deadline is not None:
            earliest = max(earliest, now - timedelta(seconds=int(deadline)))
        times = scheduled_times(spec["schedule"], spec.get("timeZone") or "UTC", earliest, now)
        if len(times) > MAX_MISSED:
            self.events.record(
                cronjob,
                "Warning",
                "TooManyMissedTimes",
                "too many missed start times. Set or decrease .spec.startingDeadlineSeconds"
                " or check clock skew",
            )
        if not times:
            self._write_status(cronjob, active)
            return
        scheduled = times[-1]
        if deadline is not None and scheduled + timedelta(seconds=int(deadline)) < now:
            self.events.record(
                cronjob,
                "Warning",
                "MissSchedule",
                f"Missed scheduled time to start a job: {scheduled:%a, %d %b %Y %H:%M:%S +0000}",
            )
            self._write_status(cronjob, active)
            return
        if any(j["metadata"]["name"] == job_name(name, scheduled) for j in jobs):
            self._write_status(cronjob, active)
            return
        policy = spec.get("concurrencyPolicy") or "Allow"
        if policy == "Forbid" and active:
            # the real controller neither creates nor records the time: it comes back later
            self.events.record(
                cronjob,
                "Normal",
                "JobAlreadyActive",
                "Not starting job because prior execution is running and concurrency policy"
                " is Forbid",
            )
            self._write_status(cronjob, active)
            return
        if policy == "Replace":
            for job in active:
                self._delete_job(cronjob, job)
            active = []
        created = self._create_job(cronjob, scheduled)
        if created is not None:
            active.append(created)
        self._write_status(cronjob, active, scheduled)

    def _create_job(self, cronjob: dict[str, Any], scheduled: datetime) -> dict[str, Any] | None:
        metadata, spec = cronjob["metadata"], cronjob["spec"]
        template = spec.get("jobTemplate") or {}
        zone = ZoneInfo(spec.get("timeZone") or "UTC")
        job = {
            "metadata": {
                "name": job_name(metadata["name"], scheduled),
                "namespace": metadata["namespace"],
                "labels": dict((template.get("metadata") or {}).get("labels") or {}),
                "annotations": {
                    **((template.get("metadata") or {}).get("annotations") or {}),
                    SCHEDULED_ANNOTATION: scheduled.astimezone(zone).isoformat(),
                },
                "ownerReferences": [_owner_reference(cronjob)],
            },
            "spec": template.get("spec") or {},
        }
        said = ("Error creating job: {error}", "Created job {name}")  # the CronJob controller's
        return _create_told(self.registry, self.events, JOBS, cronjob, job, said)

    def _delete_job(self, cronjob: dict[str, Any], job: Mapping[str, Any]) -> None:
        name = job["metadata"]["name"]
        try:
            self.registry.delete(JOBS, job["metadata"]["namespace"], name)
        except ApiError:
            return
        self.events.record(cronjob, "Normal", "SuccessfulDelete", f"Deleted job {name}")

    def _record_finished(self, cronjob: dict[str, Any], jobs: list[dict[str, Any]]) -> None:
        listed = {a.get("uid") for a in (cronjob.get("status") or {}).get("active") or []}
        for job in jobs:
            outcome = _condition(job)
            if outcome is not None and job["metadata"]["uid"] in listed:
                self.events.record(
                    cronjob,
                    "Normal",
                    "SawCompletedJob",
                    f"Saw completed job: {job['metadata']['name']}, status: {outcome}",
                )

    def _clean_history(self, cronjob: dict[str, Any], jobs: list[dict[str, Any]]) -> None:
        spec = cronjob.get("spec") or {}
        for outcome, field_name in (
            ("Complete", "successfulJobsHistoryLimit"),
            ("Failed", "failedJobsHistoryLimit"),
        ):
            limit = spec.get(field_name)
            if limit is None:
                continue
            finished = sorted(
                (j for j in jobs if _condition(j) == outcome),
                key=lambda j: (j.get("status") or {}).get("startTime") or "",
            )
            for job in finished[: max(0, len(finished) - int(limit))]:
                self._delete_job(cronjob, job)

    def _write_status(
        self,
        cronjob: Mapping[str, Any],
        active: list[dict[str, Any]],
        scheduled: datetime | None = None,
    ) -> None:
        metadata = cronjob["metadata"]
        refs = [
            {
                "apiVersion": "batch/v1",
                "kind": "Job",
                "name": j["metadata"]["name"],
                "namespace": j["metadata"]["namespace"],
                "uid": j["metadata"]["uid"],
                "resourceVersion": j["metadata"].get("resourceVersion"),
            }
            for j in active
        ]
        succeeded = [
            _parse_time((j.get("status") or {}).get("completionTime"))
            for j in self.registry.list_objects(JOBS, metadata["namespace"])
            if _owned_by(j, cronjob) and _condition(j) == "Complete"
        ]

        def change(obj: dict[str, Any]) -> None:
            status = obj.setdefault("status", {})
            if refs:
                status["active"] = refs
            else:
                status.pop("active", None)
            if scheduled is not None:
                status["lastScheduleTime"] = format_timestamp(scheduled.timestamp())
            done = [t for t in succeeded if t is not None]
            if done:
                status["lastSuccessfulTime"] = format_timestamp(max(done).timestamp())

        self.registry.mutate(CRONJOBS, metadata["namespace"], metadata["name"], change)


class JobController(_BatchController):
    """Runs each Job's one pod and turns the pod's end into the Job's conditions."""

    component = "job-controller"

    def reconcile(self) -> None:
        for job in self.registry.list_objects(JOBS):
            if _condition(job) is None and not (job.get("spec") or {}).get("suspend"):
                self._sync(job)

    def _sync(self, job: dict[str, Any]) -> None:
        metadata, spec = job["metadata"], job.get("spec") or {}
        namespace, name = metadata["namespace"], metadata["name"]
        now = self.clock()
        pods = [p for p in self.registry.list_objects(PODS, namespace) if _owned_by(p, job)]
        # a pod that went away before it finished (deleted, its node gone) counts as failed,
        # as with the real controller's finalizers: the Job's counts say how many it had
        last = job.get("status") or {}
        had = sum(int(last.get(k) or 0) for k in ("active", "failed", "succeeded"))
        vanished = max(0, had - len(pods))
        failed = vanished + sum(1 for p in pods if (p.get("status") or {}).get("phase") == "Failed")
        succeeded = sum(1 for p in pods if (p.get("status") or {}).get("phase") == "Succeeded")
        running = [
            p for p in pods if (p.get("status") or {}).get("phase") not in ("Failed", "Succeeded")
        ]
        started = _parse_time((job.get("status") or {}).get("startTime"))
        deadline = spec.get("activeDeadlineSeconds")
        if started is not None and deadline is not None and now - started.timestamp() >= deadline:
            for pod in running:
                self._delete_pod(pod)
            self._finish(
                job,
                "Failed",
                "DeadlineExceeded",
                "Job was active longer than specified deadline",
                failed + len(running),
                succeeded,
                now,
            )
            return
        if succeeded >= int(spec.get("completions") or 1):
            self._finish(job, "Complete", "", "", failed, succeeded, now)
            return
        if failed > int(spec.get("backoffLimit", 6)):
            self._finish(
                job,
                "Failed",
                "BackoffLimitExceeded",
                "Job has reached the specified backoff limit",
                failed,
                succeeded,
                now,
            )
            return
        if not running:
            created = self._create_pod(job)
            if created is not None:
                running.append(created)

        def change(obj: dict[str, Any]) -> None:
            status = obj.setdefault("status", {})
            status.setdefault("startTime", format_timestamp(now))
            status["active"] = len(running)
            if failed:
                status["failed"] = failed
            status["ready"] = sum(1 for p in running if _pod_ready(p))

        self.registry.mutate(JOBS, namespace, name, change)

    def _create_pod(self, job: dict[str, Any]) -> dict[str, Any] | None:
        metadata = job["metadata"]
        template = (job.get("spec") or {}).get("template") or {}
        labels = {
            **((template.get("metadata") or {}).get("labels") or {}),
            CONTROLLER_UID_LABEL: metadata["uid"],
            JOB_NAME_LABEL: metadata["name"],
            "controller-uid": metadata["uid"],
            "job-name": metadata["name"],
        }
        pod = {
            "metadata": {
                "name": f"{metadata['name']}-{new_name_suffix()}",
                "namespace": metadata["namespace"],
                "labels": labels,
                "ownerReferences": [_owner_reference(job)],
            },
            "spec": template.get("spec") or {},
        }
        said = ("Error creating: {error}", "Created pod: {name}")  # the Job controller's words
        return _create_told(self.registry, self.events, PODS, job, pod, said)

    def _delete_pod(self, pod: Mapping[str, Any]) -> None:
        try:
            self.registry.delete(PODS, pod["metadata"]["namespace"], pod["metadata"]["name"])
        except ApiError:
            return

    def _finish(
        self,
        job: dict[str, Any],
        outcome: str,
        reason: str,
        message: str,
        failed: int,
        succeeded: int,
        now: float,
    ) -> None:
        stamp = format_timestamp(now)

        def change(obj: dict[str, Any]) -> None:
            status = obj.setdefault("status", {})
            status.setdefault("startTime", stamp)
            status["active"] = 0
            status["ready"] = 0
            if failed:
                status["failed"] = failed
            if succeeded:
                status["succeeded"] = succeeded
            condition: dict[str, Any] = {
                "type": outcome,
                "status": "True",
                "lastProbeTime": stamp,
                "lastTransitionTime": stamp,
            }
            if reason:
                condition.update(reason=reason, message=message)
            status["conditions"] = [*status.get("conditions", []), condition]
            if outcome == "Complete":
                status["completionTime"] = stamp

        self.registry.mutate(JOBS, job["metadata"]["namespace"], job["metadata"]["name"], change)
        if reason:
            self.events.record(job, "Warning", reason, message)
        else:
            self.events.record(job, "Normal", "Completed", "Job completed")


def _pod_ready(pod: Mapping[str, Any]) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
