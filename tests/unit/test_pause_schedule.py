"""A scheduled plan's pause (`rollout pause --schedule PLAN`): the mark on the plan's
ConfigMap, and a scheduled run in a pod that exits 5 at once while it is there, against the
API emulator as the pod's service account."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from rollout.cli import main
from rollout.errors import ExitCode
from rollout.lab.apiserver import ApiServer
from rollout.lease import LEASE_NAME, LEASE_NAMESPACE
from rollout.run import Journal, RunId, utc_now
from rollout.run.cluster import SecretStore, find_run
from rollout.run.pause import (
    PAUSE_ANNOTATION,
    PauseMark,
    describe_pause_of,
    mark_schedule_paused,
    read_schedule_pause,
)
from rollout.transports.errors import Conflict, NotFound
from rollout.transports.kube import ConfigMap, KubeClient, Lease, Secret
from tests.examples import PLAN, REPO
from tests.unit.test_schedule_incluster import pod, server

__all__ = ["pod", "server"]  # the fixtures, used by name

PLAN_NAME = "registry-mirror"  # the example plan's metadata.name
NAMESPACE = "rollout"
INVENTORY = REPO / "examples" / "inventory" / "example.yaml"


@pytest.mark.usefixtures("pod")
def test_a_paused_schedule_makes_each_scheduled_run_exit_at_once(
    server: tuple[ApiServer, bytes], capsys: pytest.CaptureFixture[str]
) -> None:
    server[0].registry.ensure_namespace(NAMESPACE)
    with KubeClient.from_kubeconfig() as kube:
        kube.create_configmap(ConfigMap(NAMESPACE, f"rollout-{PLAN_NAME}", {"plan.yaml": "x"}))
        pause = ["pause", "--schedule", PLAN_NAME, "--reason", "vendor ticket 4711"]
        assert main(pause) == ExitCode.OK
        assert "every scheduled run exits at once" in capsys.readouterr().out
        mark = read_schedule_pause(kube, NAMESPACE, PLAN_NAME)
        assert mark is not None and mark.reason == "vendor ticket 4711"
        assert "@" in mark.by  # user@host

        # the scheduled pod's run: nothing gathered, nothing started, status 5, said why
        apply = ["apply", str(PLAN), "-i", str(INVENTORY), "--yes"]
        assert main(apply) == ExitCode.PAUSED
        err = capsys.readouterr().err
        assert f"plan {PLAN_NAME} paused by {mark.by} at " in err and "vendor ticket 4711" in err
        assert f"`rollout unpause --schedule {PLAN_NAME}`" in err
        assert main(apply) == ExitCode.PAUSED  # and the next one, until it is cleared
        capsys.readouterr()

        assert main(["unpause", "--schedule", PLAN_NAME]) == ExitCode.OK
        assert f"plan {PLAN_NAME} unpaused (was paused by " in capsys.readouterr().out
        assert read_schedule_pause(kube, NAMESPACE, PLAN_NAME) is None
        configmap = kube.get_configmap(NAMESPACE, f"rollout-{PLAN_NAME}")
        assert PAUSE_ANNOTATION not in configmap.annotations
        assert dict(configmap.data) == {"plan.yaml": "x"}  # the rest of it untouched
        assert main(["unpause", "--schedule", PLAN_NAME]) == ExitCode.OK
        assert "is not paused" in capsys.readouterr().out


def test_pause_names_a_run_or_a_schedule(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["pause", "--reason", "x"]) == ExitCode.BAD_INPUT
    assert "name a run (RUN) or a scheduled plan (--schedule PLAN)" in capsys.readouterr().err


class FakeConfigMaps:
    """The plan's ConfigMap, replaced under its resourceVersion like the API server does."""

    def __init__(self, conflicts: int = 0) -> None:
        self.configmap = ConfigMap(NAMESPACE, f"rollout-{PLAN_NAME}", resource_version="1")
        self.conflicts = conflicts

    def get_configmap(self, namespace: str, name: str) -> ConfigMap:
        assert (namespace, name) == (NAMESPACE, f"rollout-{PLAN_NAME}")
        return self.configmap

    def replace_configmap(self, configmap: ConfigMap) -> ConfigMap:
        if self.conflicts:
            self.conflicts -= 1
            raise Conflict("replace", f"configmap {configmap.name}", status=409)
        self.configmap = replace(
            configmap, resource_version=str(int(configmap.resource_version or 0) + 1)
        )
        return self.configmap


def test_a_run_kept_in_the_cluster_reads_its_plans_pause() -> None:
    """What the executor asks before each node of a scheduled run (a pause written meanwhile,
    twice refused by a concurrent change of the ConfigMap, is written again)."""
    kube = FakeConfigMaps(conflicts=2)
    secret = Secret(NAMESPACE, f"rollout-{PLAN_NAME}-run")
    journal = Journal(
        SecretStore(kube, secret, "r1", created=False),  # type: ignore[arg-type]
        RunId("r1"),
        contents=None,
        clock=utc_now,
    )
    assert describe_pause_of(journal, kube, PLAN_NAME) == ""
    mark = PauseMark("ana@laptop", "vendor ticket", datetime(2026, 12, 1, 22, 0, tzinfo=UTC))
    assert mark_schedule_paused(kube, NAMESPACE, PLAN_NAME, mark) is None
    assert describe_pause_of(journal, kube, PLAN_NAME) == mark.describe()
    assert mark_schedule_paused(kube, NAMESPACE, PLAN_NAME, None) == mark
    assert describe_pause_of(journal, kube, PLAN_NAME) == ""


def test_a_plan_without_its_configmap_is_not_paused() -> None:
    class NoConfigMaps(FakeConfigMaps):
        def get_configmap(self, namespace: str, name: str) -> ConfigMap:
            raise NotFound("get", f"configmap {namespace}/{name}", status=404)

    assert read_schedule_pause(NoConfigMaps(), NAMESPACE, PLAN_NAME) is None


@pytest.mark.usefixtures("pod")
def test_a_paused_schedule_stops_runs_whether_the_dead_runs_lease_is_held_or_expired(
    server: tuple[ApiServer, bytes], capsys: pytest.CaptureFixture[str]
) -> None:
    """A run killed with SIGKILL leaves its Lease held; the plan paused then: each scheduled
    run exits 5 at once, before the Lease (held, then expired) is read or taken, and writes
    no run of its own; unpaused, nothing of the pause is left."""
    server[0].registry.ensure_namespace(NAMESPACE)
    server[0].registry.ensure_namespace(LEASE_NAMESPACE)
    with KubeClient.from_kubeconfig() as kube:
        kube.create_configmap(ConfigMap(NAMESPACE, f"rollout-{PLAN_NAME}", {"plan.yaml": "x"}))
        now = utc_now()
        dead = Lease(
            LEASE_NAMESPACE,
            LEASE_NAME,
            holder_identity="rollout/r1/rollout-registry-mirror-29400000-dead",
            lease_duration_s=60,
            acquire_time=now,
            renew_time=now,
        )
        kube.create_lease(dead)
        assert main(["pause", "--schedule", PLAN_NAME, "--reason", "vendor ticket"]) == 0
        capsys.readouterr()
        apply = ["apply", str(PLAN), "-i", str(INVENTORY), "--yes"]
        for held in (True, False):
            before = kube.get_lease(LEASE_NAMESPACE, LEASE_NAME)
            assert main(apply) == ExitCode.PAUSED
            err = capsys.readouterr().err
            assert f"plan {PLAN_NAME} paused by " in err and "vendor ticket" in err, err
            assert "another rollout run" not in err and "continuing run" not in err, err
            assert kube.get_lease(LEASE_NAMESPACE, LEASE_NAME) == before  # not read to take
            assert find_run(kube, NAMESPACE, PLAN_NAME) is None  # no run of its own
            if held:  # the dead run's Lease expires while the plan is paused
                expired = now - timedelta(seconds=300)
                kube.replace_lease(replace(before, renew_time=expired, acquire_time=expired))
        assert main(["unpause", "--schedule", PLAN_NAME]) == 0
        assert read_schedule_pause(kube, NAMESPACE, PLAN_NAME) is None
