"""A pause asked of a run: who asked and why, kept where the run is kept.

`rollout pause RUN` writes it while the run may be going (it takes no lock: the run holds
the journal's), and the run reads it before it starts each node: nodes in flight finish, no
node starts, and the run exits with ExitCode.PAUSED. For a run directory it is a file of its
own beside the journal, written whole or not at all; for a scheduled plan (`--schedule`) it
is the `rollout.dev/paused` annotation on the plan's ConfigMap `rollout-<plan>`, which the
scheduled pod may already read, and not the run's Secret, whose every write the running pod
checks against its own (a pause written there would stop the run as a Conflict). Either
outlives a kill -9 of the run and the run's Lease; `rollout resume` (or `rollout unpause`)
removes it, and every scheduled run started while it is there exits at once.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import Protocol

from rollout.errors import RolloutError
from rollout.run.cluster import SecretStore
from rollout.run.errors import JournalError
from rollout.run.files import fsync_dir, replace_file
from rollout.run.journal import Journal
from rollout.run.records import format_time, parse_time
from rollout.run.store import RunDirectory
from rollout.transports.errors import Conflict, NotFound
from rollout.transports.kube import ConfigMap
from rollout.transports.kube.objects import frozen_map

PAUSE_FILE = "paused.json"
PAUSE_ANNOTATION = "rollout.dev/paused"
# a pause written while someone else changed the ConfigMap is tried again, this many times
PAUSE_WRITE_TRIES = 5


@dataclass(frozen=True)
class PauseMark:
    """Who paused a run (user@host), why, and when."""

    by: str
    reason: str
    at: datetime

    def describe(self) -> str:
        because = f": {self.reason}" if self.reason else ""
        return f"paused by {self.by} at {format_time(self.at)}{because}"

    def to_json(self) -> str:
        return json.dumps({"by": self.by, "reason": self.reason, "at": format_time(self.at)})

    @classmethod
    def from_json(cls, text: str, where: str) -> PauseMark:
        try:
            data = json.loads(text)
            return cls(str(data["by"]), str(data["reason"]), parse_time(str(data["at"])))
        except (ValueError, KeyError, TypeError) as exc:
            raise JournalError(f"{where}: not a pause mark ({exc}); remove it") from None


def pause_run(run_dir: Path, mark: PauseMark) -> None:
    """Mark the run paused (durably; a later pause replaces the mark)."""
    replace_file(run_dir / PAUSE_FILE, mark.to_json().encode())


def read_pause(run_dir: Path) -> PauseMark | None:
    """The run's pause mark, or None when it is not paused."""
    path = run_dir / PAUSE_FILE
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    return PauseMark.from_json(text, str(path))


def clear_pause(run_dir: Path) -> PauseMark | None:
    """Remove the run's pause mark; the mark removed, or None when there was none."""
    mark = read_pause(run_dir)
    if mark is not None:
        (run_dir / PAUSE_FILE).unlink(missing_ok=True)
        fsync_dir(run_dir)
    return mark


class ConfigMapApi(Protocol):
    """The little of KubeClient a scheduled plan's pause needs."""

    def get_configmap(self, namespace: str, name: str) -> ConfigMap: ...

    def replace_configmap(self, configmap: ConfigMap) -> ConfigMap: ...


def plan_configmap_name(plan_name: str) -> str:
    """The scheduled plan's ConfigMap (rollout schedule), which holds its pause."""
    return f"rollout-{plan_name}"


def read_schedule_pause(kube: ConfigMapApi, namespace: str, plan_name: str) -> PauseMark | None:
    """A scheduled plan's pause mark, or None when it is not paused (or has no ConfigMap: a
    run in a pod that `rollout schedule` did not make, which nobody can pause either)."""
    try:
        configmap = kube.get_configmap(namespace, plan_configmap_name(plan_name))
    except NotFound:
        return None
    text = configmap.annotations.get(PAUSE_ANNOTATION)
    where = f"configmap {namespace}/{configmap.name} annotation {PAUSE_ANNOTATION}"
    return None if text is None else PauseMark.from_json(text, where)


def mark_schedule_paused(
    kube: ConfigMapApi, namespace: str, plan_name: str, mark: PauseMark | None
) -> PauseMark | None:
    """Set (or with None, clear) a scheduled plan's pause; the mark it replaced, if any."""
    for _ in range(PAUSE_WRITE_TRIES):
        configmap = kube.get_configmap(namespace, plan_configmap_name(plan_name))
        annotations = dict(configmap.annotations)
        before = annotations.pop(PAUSE_ANNOTATION, None)
        if mark is not None:
            annotations[PAUSE_ANNOTATION] = mark.to_json()
        elif before is None:
            return None
        try:
            kube.replace_configmap(replace(configmap, annotations=frozen_map(annotations)))
        except Conflict:
            continue  # changed meanwhile (kubectl apply of the schedule): read it again
        where = f"configmap {namespace}/{configmap.name}"
        return None if before is None else PauseMark.from_json(before, where)
    raise RolloutError(
        f"configmap {namespace}/{plan_configmap_name(plan_name)} kept changing while the pause "
        "was written; try again"
    )


def describe_pause_of(journal: Journal, kube: ConfigMapApi, plan_name: str) -> str:
    """What the run's pause mark says, wherever the run is kept; "" when it is not paused."""
    if isinstance(journal.store, RunDirectory):
        mark = read_pause(journal.store.run_dir)
    elif isinstance(journal.store, SecretStore):
        mark = read_schedule_pause(kube, journal.store.namespace, plan_name)
    else:
        mark = None
    return "" if mark is None else mark.describe()
