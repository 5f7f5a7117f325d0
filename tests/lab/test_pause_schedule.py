"""A paused scheduled plan, through the lab's real CronJob, on a lab of this module's own.

`rollout schedule`'s objects applied with real kubectl 1.36; each run a Job made from the
CronJob as a user makes one (`kubectl create job --from=cronjob/...`), its pod a container
of rollout's image in a node's containerd (simulation/jobpods.py). A run is killed with
SIGKILL in the middle of a node (its Lease stays held by the dead pod); then `rollout pause
--schedule PLAN`: each later run exits at once with status 5, its log saying who paused the
plan and why, touching neither the run kept in the cluster nor the Lease, also once that
Lease has expired; `rollout unpause --schedule PLAN`, and the next run continues the killed
run from the cluster and converges: every node done, none left cordoned."""

from __future__ import annotations

import contextlib
import json
import os
import signal
from collections.abc import Iterator
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from rollout.cli import main
from rollout.lab.cluster import CONTEXT, Lab
from rollout.lab.simulation.containerruns import ENV_HOSTNAME
from rollout.run.cluster import find_run, journal_text
from rollout.schedule.manifests import ScheduleOptions
from rollout.transports.kube import KubeClient
from tests.examples import edited_plan
from tests.lab.labapi import lab_kube_client
from tests.lab.test_cluster_shared import own_lab
from tests.lab.test_schedule import lab_kubectl
from tests.lab.test_schedule_runs import (
    PLAN_NAME,
    apply_ssh_secret,
    eventually,
    rollout_image_in,
    schedule_of,
)

pytestmark = [pytest.mark.lab, pytest.mark.own_lab]

NAMESPACE = "rollout-pause-test"
CRONJOB = f"rollout-{PLAN_NAME}"
REASON = "vendor ticket 4711"
# Generous: the machine running the suite may be loaded; a hang fails here, not in CI's limit.
RUN_S = 480.0


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    with own_lab(tmp_path_factory.mktemp("pauseschedule") / "lab", ("1.7", "1.7"), 1) as up:
        yield up


def kill_pod_processes(pod: str) -> None:
    """SIGKILL every process of `pod`'s container (its environment names the pod), as the
    OOM killer or a lost machine ends a run: nothing of it gets to release anything."""
    wanted = f"{ENV_HOSTNAME}={pod}".encode()
    killed = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if wanted in environ:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(entry.name), signal.SIGKILL)
                killed += 1
    assert killed, f"no process of pod {pod}"


def records(kube: KubeClient) -> list[dict[str, Any]]:
    found = find_run(kube, NAMESPACE, PLAN_NAME)
    if found is None:
        return []
    return [json.loads(line) for line in journal_text(found.secret).splitlines()]


def schedule_args(*args: str, lab: Lab) -> list[str]:
    where = ["-n", NAMESPACE, "--kubeconfig", str(lab.kubeconfig), "--context", CONTEXT]
    return [*args, "--schedule", PLAN_NAME, *where]


class Runs:
    """Jobs made from the CronJob, as a user makes them, and what their pods ended with."""

    def __init__(self, lab: Lab, home: Path, kube: KubeClient) -> None:
        self.lab, self.home, self.kube = lab, home, kube

    def start(self, job: str) -> None:
        command = ("create", "job", job, f"--from=cronjob/{CRONJOB}", "-n", NAMESPACE)
        assert self.kubectl(*command) == f"job.batch/{job} created\n"

    def kubectl(self, *args: str) -> str:
        return lab_kubectl(self.lab, self.home, *args)

    def pod(self, job: str) -> str | None:
        pods = self.kube.list_pods(NAMESPACE, label_selector=f"job-name={job}")
        return pods[0].name if pods else None

    def ended(self, job: str, timeout_s: float = RUN_S) -> tuple[int, str]:
        """The exit status of the job's pod (read with kubectl, as a user would) and its log."""

        def finished() -> str | None:
            pod = self.pod(job)
            if pod is None:
                return None
            phase = self.kube.get_pod(NAMESPACE, pod).phase
            return pod if phase in ("Succeeded", "Failed") else None

        pod = eventually(finished, f"the run of job {job} ended", timeout_s)
        path = "jsonpath={.status.containerStatuses[0].state.terminated.exitCode}"
        code = self.kubectl("get", "pod", pod, "-n", NAMESPACE, "-o", path)
        return int(code), self.kube.read_pod_log(NAMESPACE, pod)


def test_a_paused_schedule_stops_each_cronjob_run_until_unpaused_across_kill_9_and_lease_expiry(
    lab: Lab, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plan = edited_plan(tmp_path, "mirror.registry.internal:5000", "paused.registry.internal:5000")
    image = rollout_image_in(lab)
    options = ScheduleOptions(image=image, namespace=NAMESPACE, cron="0 3 * * *", suspend=True)
    objects = [json.loads(json.dumps(o)) for o in schedule_of(lab, plan, options).objects]
    manifest = yaml.safe_dump_all(objects)
    lab_kubectl(lab, tmp_path, "apply", "-f", "-", stdin=manifest)
    try:
        apply_ssh_secret(lab, tmp_path, NAMESPACE, f"{CRONJOB}-ssh")
        with lab_kube_client(lab) as kube:
            paused_runs(Runs(lab, tmp_path, kube), capsys)
    finally:
        lab_kubectl(
            lab,
            tmp_path,
            *("delete", "-f", "-", "--wait=false", "--ignore-not-found"),
            stdin=manifest,
        )
        lab_kubectl(lab, tmp_path, "delete", "namespace", NAMESPACE, "--ignore-not-found")


def paused_runs(runs: Runs, capsys: pytest.CaptureFixture[str]) -> None:
    kube, lab = runs.kube, runs.lab
    # a run killed outright in the middle of a node: its Lease stays held by the dead pod
    runs.start("first")
    eventually(
        lambda: (
            any(
                r["kind"] == "step-started" and r["step"] == "containerd.write"
                for r in records(kube)
            )
            or None
        ),
        "the first run in the middle of a node",
    )
    killed = runs.pod("first")
    assert killed is not None
    kill_pod_processes(killed)
    assert runs.ended("first")[0] != 0
    lease = kube.get_lease("kube-system", "rollout")
    found = find_run(kube, NAMESPACE, PLAN_NAME)
    assert found is not None
    # still the dead run's: rollout/<run>/<the pod's host name>
    assert (lease.holder_identity or "").startswith(f"rollout/{found.run_id}/"), lease
    journal = records(kube)
    assert not any(r["kind"] == "run-finished" for r in journal)

    capsys.readouterr()
    assert main(schedule_args("pause", "--reason", REASON, lab=lab)) == 0
    said = capsys.readouterr().out
    assert f"plan {PLAN_NAME} paused by " in said and REASON in said, said
    by = said.split("paused by ", 1)[1].split(" at ", 1)[0]

    # each later run exits at once, saying who paused it: the Lease held by the dead run,
    # then expired; neither the run in the cluster nor the Lease is touched
    for job in ("second", "third"):
        runs.start(job)
        code, log = runs.ended(job)
        assert code == 5, log
        assert f"plan {PLAN_NAME} paused by {by} at " in log and REASON in log, log
        assert f"`rollout unpause --schedule {PLAN_NAME}`" in log, log
        assert "continuing run" not in log and "another rollout run" not in log, log
        assert records(kube) == journal
        held = kube.get_lease("kube-system", "rollout")
        assert (held.holder_identity, held.renew_time) == (lease.holder_identity, lease.renew_time)
        if job == "second":  # the dead run's Lease expires while the plan is paused
            assert lease.renew_time is not None
            stale = lease.renew_time - timedelta(seconds=2 * (lease.lease_duration_s or 60))
            kube.replace_lease(replace(held, renew_time=stale))
            lease = kube.get_lease("kube-system", "rollout")

    assert main(schedule_args("unpause", lab=lab)) == 0
    assert f"plan {PLAN_NAME} unpaused (was paused by {by} at " in capsys.readouterr().out
    runs.start("fourth")
    code, log = runs.ended("fourth")
    assert code == 0, log
    assert "continuing run " in log, log
    journal = records(kube)
    assert journal[-1]["kind"] == "run-finished" and journal[-1]["outcome"] == "succeeded"
    finished = [r["node"] for r in journal if r["kind"] == "node-finished"]
    assert sorted(finished) == sorted(n.name for n in lab.nodes)  # each node done once
    assert not any(kube.get_node(n.name).unschedulable for n in lab.nodes)
