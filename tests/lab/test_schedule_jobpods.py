"""The lab's Job controller and the rollout image's Job pods (rollout/lab/simulation/jobpods.py),
fast: no nodes, so each pod runs as a process of the lab host (processruns.py; a lab with
nodes runs it as the image's container: test_schedule_runs.py, test_schedule_windows.py),
with the pod's command, args, env and volumes, the ServiceAccount's token, CA and namespace
at the standard path, the API over HTTPS as the account (RBAC applied); the phase follows the
process, its output is the pod's log, a deleted pod's process is stopped. The schedule's
objects on an in-process simulation."""

from __future__ import annotations

import base64
import copy
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from rollout.lab.apiserver import Registry
from rollout.lab.apiserver.resources import CRONJOBS, JOBS, PODS, ROLES, SECRETS
from rollout.lab.description import LabDescription
from rollout.lab.simulation import jobpods
from rollout.lab.simulation.cronjobs import ScaledClock
from rollout.lab.simulation.engine import Simulation
from rollout.lab.simulation.jobpods import (
    CLOCK_DIR,
    LAB_HOST_NODE,
    image_name,
    is_rollout_job_pod,
)
from rollout.lab.simulation.processruns import ProcessRun
from rollout.lab.simulation.timing import SimulationTimings
from rollout.testclock import CLOCK_FILE_ENV, ScaledTime
from tests.lab.test_schedule import FakeClock, cluster_at

pytestmark = pytest.mark.lab

NAMESPACE = "rollout"
SA = "rollout-mirror"
START = datetime(2024, 1, 1, 12, 0, 30, tzinfo=UTC)


@pytest.fixture
def lab() -> Iterator[tuple[Registry, Simulation, FakeClock]]:
    """The schedule applied (a */10 CronJob), its simulation stepped by the test."""
    api, clock, _, _ = cluster_at(START, "cron=*/10 * * * *")
    simulation = Simulation(
        api,
        LabDescription(nodes=()),
        probe=None,  # type: ignore[arg-type]
        timings=SimulationTimings(),
        clock=clock,
    )
    try:
        yield api, simulation, clock
    finally:
        simulation.stop()


def create_ssh_secret(api: Registry) -> None:
    """The Secret the operator creates (rollout schedule only references it)."""
    key = base64.b64encode(b"not a key\n").decode()
    secret = {"metadata": {"name": f"{SA}-ssh"}, "type": "Opaque"}
    api.create(SECRETS, NAMESPACE, {**secret, "data": {"ssh-privatekey": key}})


def run_job(
    api: Registry,
    name: str,
    args: list[str],
    grace_s: int | None = None,
    empty_dir_at: str | None = None,
) -> None:
    """A Job of the schedule's pod template, running `rollout ARGS` instead of the apply
    (with one more emptyDir volume, mounted at `empty_dir_at`, when given)."""
    if api.find(SECRETS, NAMESPACE, f"{SA}-ssh") is None:
        create_ssh_secret(api)
    template = copy.deepcopy(api.get(CRONJOBS, NAMESPACE, SA)["spec"]["jobTemplate"])
    template["spec"]["template"]["spec"]["containers"][0]["args"] = args
    if empty_dir_at is not None:
        pod_spec = template["spec"]["template"]["spec"]
        pod_spec["volumes"].append({"name": "extra", "emptyDir": {}})
        mount = {"name": "extra", "mountPath": empty_dir_at}
        pod_spec["containers"][0]["volumeMounts"].append(mount)
    if grace_s is not None:
        template["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = grace_s
    api.create(JOBS, NAMESPACE, {"metadata": {"name": name}, "spec": template["spec"]})


def pod_of(api: Registry, job: str) -> dict[str, Any] | None:
    for pod in api.list_objects(PODS, NAMESPACE):
        if pod["metadata"]["labels"].get("job-name") == job:
            return pod
    return None


def step_until(
    simulation: Simulation, done: Callable[[], bool], what: str, timeout_s: float = 60.0
) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        simulation.step()
        if done():
            return
        time.sleep(0.1)
    raise AssertionError(f"not within {timeout_s}s: {what}")


def phase(api: Registry, job: str) -> str | None:
    pod = pod_of(api, job)
    return None if pod is None else (pod.get("status") or {}).get("phase")


def finished(api: Registry, job: str) -> Callable[[], bool]:
    return lambda: phase(api, job) in ("Succeeded", "Failed")


def test_the_rollout_image_is_recognised_by_its_name_and_command() -> None:
    assert image_name("registry.example/rollout@sha256:" + "ab" * 32) == "rollout"
    assert image_name("registry.example:5000/team/rollout:0.1") == "rollout"
    assert image_name("registry.example/rollout-tools@sha256:00") == "rollout-tools"
    owner = [{"kind": "Job", "name": "j", "uid": "u"}]
    pod = {
        "metadata": {"ownerReferences": owner},
        "spec": {"containers": [{"command": ["rollout"], "image": "r.example/rollout:1"}]},
    }
    assert is_rollout_job_pod(pod)
    assert not is_rollout_job_pod({**pod, "metadata": {}})  # not a Job's
    other = copy.deepcopy(pod)
    other["spec"]["containers"][0]["command"] = ["sh"]
    assert not is_rollout_job_pod(other)


def test_a_job_pod_runs_as_its_service_account_over_https(
    lab: tuple[Registry, Simulation, FakeClock],
) -> None:
    api, simulation, _ = lab
    run_job(api, "status", ["status", "--schedule", "mirror", "-n", NAMESPACE])
    step_until(simulation, finished(api, "status"), "the status pod finished")
    pod = pod_of(api, "status")
    assert pod is not None and pod["spec"]["nodeName"] == LAB_HOST_NODE
    log = api.read_log(NAMESPACE, pod["metadata"]["name"], None, None)
    # in the pod: no kubeconfig, the account's files at the standard path, its namespace,
    # https to KUBERNETES_SERVICE_HOST with the lab CA, and the Role's `get` on the Secret
    assert "no run of plan mirror kept in the cluster (secret rollout/rollout-mirror-run)" in log
    assert phase(api, "status") == "Succeeded", log
    (state,) = pod["status"]["containerStatuses"]
    assert state["state"]["terminated"]["exitCode"] == 0


def test_a_volume_over_the_tree_rollout_runs_from_does_not_hide_it(
    lab: tuple[Registry, Simulation, FakeClock],
) -> None:
    """In a pod the entrypoint is the image's, under no volume; on the lab's host it is this
    checkout (or install), which an emptyDir at /tmp hides when the checkout is under /tmp."""
    api, simulation, _ = lab
    tree = str(Path(jobpods.__file__).resolve().parents[3])
    args = ["status", "--schedule", "mirror", "-n", NAMESPACE]
    run_job(api, "covered", args, empty_dir_at=tree)
    step_until(simulation, finished(api, "covered"), "the covered pod finished")
    pod = pod_of(api, "covered")
    assert pod is not None
    log = api.read_log(NAMESPACE, pod["metadata"]["name"], None, None)
    assert phase(api, "covered") == "Succeeded", log
    assert "no run of plan mirror kept in the cluster" in log


def test_the_account_is_held_to_its_role(lab: tuple[Registry, Simulation, FakeClock]) -> None:
    api, simulation, _ = lab
    api.delete(ROLES, NAMESPACE, SA)  # the Role with the Secret's get
    run_job(api, "refused", ["status", "--schedule", "mirror", "-n", NAMESPACE])
    step_until(simulation, finished(api, "refused"), "the refused pod finished")
    pod = pod_of(api, "refused")
    assert pod is not None
    log = api.read_log(NAMESPACE, pod["metadata"]["name"], None, None)
    assert f'"system:serviceaccount:{NAMESPACE}:{SA}" cannot get resource "secrets"' in log, log
    assert phase(api, "refused") == "Failed"


def test_the_pod_reads_its_configmap_at_its_mount_path(
    lab: tuple[Registry, Simulation, FakeClock],
) -> None:
    api, simulation, _ = lab
    args = ["schedule", "/etc/rollout/plan/plan.yaml", "-i", "/etc/rollout/plan/inventory.yaml"]
    args += ["--cron", "0 3 * * *"]
    run_job(api, "reads", [*args, "--image", "registry.example/rollout@sha256:" + "cd" * 32])
    step_until(simulation, finished(api, "reads"), "the schedule pod finished")
    pod = pod_of(api, "reads")
    assert pod is not None
    log = api.read_log(NAMESPACE, pod["metadata"]["name"], None, None)
    assert phase(api, "reads") == "Succeeded", log
    assert "kind: CronJob" in log and "sha256:" + "cd" * 32 in log
    assert not Path("/etc/rollout").exists()  # mounted in the pod's namespace only


def test_the_scheduled_pod_waits_for_its_secret_and_stops_when_deleted(
    lab: tuple[Registry, Simulation, FakeClock],
) -> None:
    api, simulation, clock = lab
    clock.set(START + timedelta(minutes=10))
    simulation.step()
    (job,) = api.list_objects(JOBS, NAMESPACE)
    name = job["metadata"]["name"]

    def waiting() -> bool:
        pod = pod_of(api, name)
        statuses = ((pod or {}).get("status") or {}).get("containerStatuses") or [{}]
        reason = ((statuses[0].get("state") or {}).get("waiting") or {}).get("reason")
        return reason == "CreateContainerConfigError"

    step_until(simulation, waiting, "the pod waits for its SSH Secret")
    create_ssh_secret(api)
    step_until(simulation, lambda: phase(api, name) == "Running", "the pod runs")
    running = simulation._jobpods._running  # the process behind the pod
    (tracked,) = running.values()
    process = tracked.run
    assert isinstance(process, ProcessRun)
    pod = pod_of(api, name)
    assert pod is not None
    api.delete(PODS, NAMESPACE, pod["metadata"]["name"])
    step_until(simulation, lambda: not running, "the deleted pod's process is stopped", 30.0)
    assert process.popen.returncode == -signal.SIGTERM  # stopped, not ended on its own
    assert not tracked.staging.exists()


def test_a_process_that_ignores_sigterm_is_killed_after_the_grace_period(
    lab: tuple[Registry, Simulation, FakeClock], tmp_path: Path
) -> None:
    """SIGTERM, and SIGKILL once the pod's grace period has passed."""
    api, simulation, _ = lab
    run_job(api, "stubborn", ["status", "--schedule", "mirror", "-n", NAMESPACE], grace_s=1)
    simulation.step()  # the Job's pod
    simulation.step()  # claimed and started
    jobpods = simulation._jobpods  # the processes behind the pods
    (tracked,) = jobpods._running.values()
    process = tracked.run
    assert isinstance(process, ProcessRun)
    process.popen.kill()  # the pod's process, swapped for one that ignores SIGTERM
    process.popen.wait()
    ready = tmp_path / "trapped"
    script = f"trap '' TERM; touch {ready}; sleep 60"
    process.popen = subprocess.Popen(["sh", "-c", script], start_new_session=True)
    step_until(simulation, ready.exists, "SIGTERM ignored", 10.0)
    pod = pod_of(api, "stubborn")
    assert pod is not None
    api.delete(PODS, NAMESPACE, pod["metadata"]["name"])
    deleted = time.monotonic()
    step_until(simulation, lambda: not jobpods._running, "the process killed", 30.0)
    assert process.popen.returncode == -signal.SIGKILL
    assert time.monotonic() - deleted >= 1.0  # not before the grace period


def test_a_pod_under_a_scaled_clock_is_given_it_as_it_moves() -> None:
    """The pod's window checks read the lab's scaled clock: a file mounted into the pod and
    named by $ROLLOUT_TEST_CLOCK_FILE (the product reads it: tests/unit/test_testclock.py),
    written again when the clock moves."""
    api, clock, _, _ = cluster_at(START, "cron=*/10 * * * *")
    scaled = ScaledClock()
    scaled.set(START.timestamp(), scale=0)
    simulation = Simulation(
        api,
        LabDescription(nodes=()),
        probe=None,  # type: ignore[arg-type]
        timings=SimulationTimings(),
        clock=clock,
        schedule_clock=scaled,
    )
    try:
        run_job(api, "clocked", ["status", "--schedule", "mirror", "-n", NAMESPACE])
        simulation.step()  # the Job's pod
        simulation.step()  # claimed and started
        (tracked,) = simulation._jobpods._running.values()
        process = tracked.run
        assert isinstance(process, ProcessRun)
        os.killpg(process.popen.pid, signal.SIGSTOP)  # held while the test looks
        environ = Path(f"/proc/{process.popen.pid}/environ").read_bytes().split(b"\0")
        assert f"{CLOCK_FILE_ENV}={CLOCK_DIR}/now".encode() in environ
        clock_file = tracked.staging / "clock" / "now"
        given = ScaledTime.from_text(clock_file.read_text())
        assert given.at(time.time()) == pytest.approx(START.timestamp())  # stopped there
        scaled.advance(3600)
        simulation.step()
        moved = ScaledTime.from_text(clock_file.read_text())
        assert moved.at(time.time()) == pytest.approx(START.timestamp() + 3600)
        os.killpg(process.popen.pid, signal.SIGCONT)
        step_until(simulation, finished(api, "clocked"), "the clocked pod finished")
    finally:
        simulation.stop()
