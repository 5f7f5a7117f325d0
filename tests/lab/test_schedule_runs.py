"""Scheduled runs on a lab of their own, end to end: `rollout schedule`'s objects applied with
kubectl, the Job pods run by the lab as containers of rollout's image (built from the
Containerfile, pushed to the lab's registry, pulled by digest) in a node's containerd, as
the manifests ask: non-root, read-only root, the ServiceAccount's token and the SSH Secret
mounted (simulation/jobpods.py, containerruns.py); their run kept in the cluster
(rollout/run/cluster.py).

Two runs started at once (the CronJob's Forbid taken off on purpose): the Lease lets one
proceed and refuses the other, saying who holds it. The one that proceeds is deleted in the
middle of a node (SIGTERM): its step in flight finishes, the Lease is released, and the next
run is killed outright (SIGKILL) in the middle of its work: the Lease stays held until it
expires, and the run after that continues the same run from the cluster and converges:
every node done exactly once, none left cordoned."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Callable, Iterator
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any, TypeVar

import pytest
import yaml

from rollout.inventory import load_inventory
from rollout.lab.cluster import Lab
from rollout.lab.nodes import prepull_images, write_lab_mirror
from rollout.lab.registry import registry_host
from rollout.lab.rolloutimage import build_rollout_image, builder_available, push_rollout_image
from rollout.lab.simulation.containerruns import ENV_HOSTNAME
from rollout.playbook import load_playbooks
from rollout.run.cluster import find_run, journal_text
from rollout.schedule.manifests import (
    KNOWN_HOSTS_KEY,
    NONROOT_UID,
    SSH_KEY,
    Schedule,
    ScheduleOptions,
    build_schedule,
)
from rollout.spec import parse_spec
from rollout.transports.kube import KubeClient, Pod
from tests.conftest import require
from tests.examples import REPO, edited_plan
from tests.lab.labapi import lab_kube_client, wait_for
from tests.lab.test_cluster_shared import own_lab
from tests.lab.test_kubectl_create import header_commands
from tests.lab.test_schedule import lab_kubectl

pytestmark = [pytest.mark.lab, pytest.mark.own_lab]

NAMESPACE = "rollout-runs-test"
PLAN_NAME = "registry-mirror"
CRONJOB = f"rollout-{PLAN_NAME}"
# rollout's image is about 500 MB: pulled into a node under load it takes minutes
IMAGE_PULL_TIMEOUT_S = 600.0
T = TypeVar("T")


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    """A lab of this file's own: the runs converge its nodes to the plan's mirror, which the
    shared lab's other tests must not find (scripts/test runs it with the own-lab tests)."""
    with own_lab(tmp_path_factory.mktemp("runs") / "lab", ("1.6", "1.7", "2.1", "1.7"), 2) as up:
        yield up


def eventually(probe: Callable[[], T | None], what: str, timeout_s: float = 180.0) -> T:
    return wait_for(probe, timeout_s, what=what, interval_s=0.5)


def ssh_secret_command(lab: Lab, namespace: str, name: str) -> list[str]:
    """The command the schedule's output prints for its SSH Secret, with the lab's files."""
    return [
        *("kubectl", "create", "secret", "generic", name, "-n", namespace),
        f"--from-file={SSH_KEY}={lab.ssh.key_file}",
        f"--from-file={KNOWN_HOSTS_KEY}={lab.ssh.known_hosts}",
    ]


def apply_ssh_secret(lab: Lab, home: Path, namespace: str, name: str) -> None:
    """The Secret the operator creates with the lab's key and known_hosts, by that command
    (real kubectl 1.36: it sends the Secret as protobuf)."""
    lab_kubectl(lab, home, *ssh_secret_command(lab, namespace, name)[1:])


def schedule_of(lab: Lab, plan: Path, options: ScheduleOptions) -> Schedule:
    """What `rollout schedule PLAN -i INVENTORY` prints for the lab."""
    text = plan.read_text()
    return build_schedule(
        parse_spec(text, str(plan)),
        text,
        load_playbooks(),
        options,
        load_inventory(lab.inventory),
    )


def schedule_objects(lab: Lab, plan: Path, options: ScheduleOptions) -> list[dict[str, Any]]:
    """The objects of `schedule_of`, as JSON objects."""
    return [json.loads(json.dumps(o)) for o in schedule_of(lab, plan, options).objects]


def pod_of(kube: KubeClient, job: str) -> Pod | None:
    pods = kube.list_pods(NAMESPACE, label_selector=f"job-name={job}")
    return pods[0] if pods else None


def ended(kube: KubeClient, job: str) -> Pod | None:
    pod = pod_of(kube, job)
    return pod if pod is not None and pod.phase in ("Succeeded", "Failed") else None


def rollout_image_in(lab: Lab) -> str:
    """rollout's image built from this checkout (once per change of its inputs: the build is
    cached by their digest), pushed to the lab's registry and pulled by digest, through it,
    into the node whose containerd runs the lab's Job pods (the last); its pinned reference,
    as `rollout schedule --image` takes it."""
    if not builder_available():
        require("buildah is missing: scripts/setup --lab installs it")
    image = build_rollout_image(REPO, progress=lambda line: None)
    registry = registry_host(lab.nodes[0].address)
    reference = push_rollout_image(image, registry)
    node = lab.nodes[-1]
    dirs = lab.node_dirs(node)
    write_lab_mirror(dirs, registry, [registry])
    prepull_images(node, dirs, [reference], timeout_s=IMAGE_PULL_TIMEOUT_S)
    return reference


def kill_pod_process(pod: str) -> tuple[str, str] | None:
    """SIGKILL the container of `pod` (its environment names the pod), as the OOM killer
    or a lost machine ends it: its first process (whose parent is none of the container's),
    which takes the rest of its PID namespace with it. What it ran as: its user ids (`Uid:`
    of its status) and the options of its root mount; None when no container runs it."""
    wanted = f"{ENV_HOSTNAME}={pod}".encode()
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
            status = (entry / "status").read_text()
        except OSError:
            continue
        if wanted in environ:
            ppid = next(line for line in status.splitlines() if line.startswith("PPid:"))
            parents[int(entry.name)] = int(ppid.split()[1])
    first = [pid for pid, parent in parents.items() if parent not in parents]
    if not first:
        return None
    (pid,) = first
    status = Path(f"/proc/{pid}/status").read_text()
    uids = next(line for line in status.splitlines() if line.startswith("Uid:"))
    mounts = Path(f"/proc/{pid}/mountinfo").read_text().splitlines()
    root = next(line.split()[5] for line in mounts if line.split()[4] == "/")
    os.kill(pid, signal.SIGKILL)
    return " ".join(uids.split()[1:]), root


def journal_kinds(kube: KubeClient) -> list[dict[str, Any]]:
    found = find_run(kube, NAMESPACE, PLAN_NAME)
    if found is None:
        return []
    return [json.loads(line) for line in journal_text(found.secret).splitlines()]


def test_overlapping_runs_one_refused_a_killed_run_continued(shared: Lab, tmp_path: Path) -> None:
    plan = edited_plan(
        tmp_path, "mirror.registry.internal:5000", "scheduled-runs.registry.internal:5000"
    )
    image = rollout_image_in(shared)
    options = ScheduleOptions(image=image, namespace=NAMESPACE, cron="0 3 * * *", suspend=True)
    printed = schedule_of(shared, plan, options)
    objects = [json.loads(json.dumps(o)) for o in printed.objects]
    cronjob = next(o for o in objects if o["kind"] == "CronJob")
    cronjob["spec"]["concurrencyPolicy"] = "Allow"  # on purpose: the Lease must hold alone
    manifest = yaml.safe_dump_all(objects)
    lab_kubectl(shared, tmp_path, "apply", "-f", "-", stdin=manifest)
    try:
        said = header_commands(printed.to_yaml())
        files = {"PATH/TO/KEY": shared.ssh.key_file, "PATH/TO/known_hosts": shared.ssh.known_hosts}
        for placeholder, path in files.items():
            said = [arg.replace(placeholder, str(path)) for arg in said]
        assert said == ssh_secret_command(shared, NAMESPACE, f"{CRONJOB}-ssh")
        apply_ssh_secret(shared, tmp_path, NAMESPACE, f"{CRONJOB}-ssh")
        with lab_kube_client(shared) as kube:
            secret = kube.get_secret(NAMESPACE, f"{CRONJOB}-ssh")
            assert secret.data.keys() == {SSH_KEY, KNOWN_HOSTS_KEY}
            run_scheduled(shared, tmp_path, kube)
    finally:
        lab_kubectl(
            shared,
            tmp_path,
            *("delete", "-f", "-", "--wait=false", "--ignore-not-found"),
            stdin=manifest,
        )
        lab_kubectl(shared, tmp_path, "delete", "namespace", NAMESPACE, "--ignore-not-found")


def run_scheduled(lab: Lab, home: Path, kube: KubeClient) -> None:
    def start(job: str) -> None:
        """A run now, as a user starts one (real kubectl 1.36, which sends it as protobuf)."""
        command = ("create", "job", job, f"--from=cronjob/{CRONJOB}", "-n", NAMESPACE)
        assert lab_kubectl(lab, home, *command) == f"job.batch/{job} created\n"

    # two runs at once, as a CronJob without Forbid would start them
    start("first")
    start("second")
    loser = eventually(
        lambda: next((p for p in (ended(kube, j) for j in ("first", "second")) if p), None),
        "one of the two overlapping runs refused",
    )
    assert loser.phase == "Failed"
    refused = kube.read_pod_log(NAMESPACE, loser.name)
    # held by the other run, or taken by it just now (both created the Lease at once)
    assert "another rollout run is working on this cluster (lease kube-system/rollout " in (
        refused
    ), refused
    winner_job = "second" if loser.labels["job-name"] == "first" else "first"
    winner = pod_of(kube, winner_job)
    assert winner is not None and winner.phase == "Running"
    assert f"/{winner.name}" in refused  # the holder: the run in the other pod
    # the winner deleted in the middle of a node: after a step has started, before its node ends
    mid_node = eventually(
        lambda: next(
            (
                r["node"]
                for r in journal_kinds(kube)
                if r["kind"] == "step-started" and r["step"] == "containerd.write"
            ),
            None,
        ),
        "a node in the middle of its steps",
    )
    kube.delete_pod(NAMESPACE, winner.name)
    # SIGTERM: the step in flight finishes, the Lease is released (no wait for it to expire)
    eventually(
        lambda: kube.get_lease("kube-system", "rollout").holder_identity in (None, ""),
        "the deleted run's Lease released",
        120.0,
    )
    assert pod_of(kube, winner_job) is None  # a deleted pod is a failed one: not replaced
    stopped = journal_kinds(kube)
    assert not any(r["kind"] == "run-finished" for r in stopped)
    # the next one killed outright in the middle of a node (the OOM killer, a lost machine):
    # no step finishes, nothing is released
    start("third")
    eventually(lambda: len(journal_kinds(kube)) > len(stopped) + 2 or None, "the third run at work")
    killed = pod_of(kube, "third")
    assert killed is not None
    ran_as = kill_pod_process(killed.name)
    assert ran_as is not None, (killed.phase, kube.read_pod_log(NAMESPACE, killed.name))
    uids, root = ran_as
    # the image's container as the manifests ask: non-root, on a read-only root
    assert uids == " ".join([str(NONROOT_UID)] * 4), uids
    assert "ro" in root.split(","), root
    assert eventually(lambda: ended(kube, "third"), "the killed run's pod ended").phase == "Failed"
    lease = kube.get_lease("kube-system", "rollout")
    assert (lease.holder_identity or "").endswith(f"/{killed.name}"), lease
    assert not any(r["kind"] == "run-finished" for r in journal_kinds(kube))
    # the next schedule comes after the dead run's Lease has expired: the run continues from
    # the cluster, and converges
    assert lease.renew_time is not None
    stale = lease.renew_time - timedelta(seconds=2 * (lease.lease_duration_s or 60))
    kube.replace_lease(replace(lease, renew_time=stale))
    start("fourth")
    done = eventually(lambda: ended(kube, "fourth"), "the fourth run ended", 300.0)
    log = kube.read_pod_log(NAMESPACE, done.name)
    assert done.phase == "Succeeded", log
    found = find_run(kube, NAMESPACE, PLAN_NAME)
    assert found is not None
    assert f"continuing run {found.run_id}" in log
    records = journal_kinds(kube)
    assert [r["kind"] for r in records].count("run-started") == 1
    assert records[-1] == {**records[-1], "kind": "run-finished", "outcome": "succeeded"}
    finished = [r["node"] for r in records if r["kind"] == "node-finished"]
    assert sorted(finished) == sorted(n.name for n in lab.nodes)  # each node done once
    assert mid_node in finished
    for node in lab.nodes:
        assert not kube.get_node(node.name).unschedulable, node.name
    reasons = [e.reason for e in kube.list_events(NAMESPACE) if e.reason == "RolloutDone"]
    assert reasons == ["RolloutDone"]
    # as an operator sees it
    described = lab_kubectl(lab, home, "describe", "configmap", CRONJOB, "-n", NAMESPACE)
    assert "RolloutDone" in described and "every node done" in described, described
    listed = lab_kubectl(lab, home, "get", "events", "-n", NAMESPACE)
    assert f"configmap/{CRONJOB}" in listed and "RolloutDone" in listed, listed
