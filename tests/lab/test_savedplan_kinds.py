"""Saved plans of every change kind on one lab of the module's own (one node, containerd 1.7,
4 GPUs, as the demo's first apply meets it), run as saved in a directory and in the cluster.

The tests run in file order, each starting where the one before left the lab:
- a saved demo plan (registry mirror + time-slicing) with one byte changed is refused with
  exit 2, before any run starts or any node file changes;
- the time-slicing ConfigMap created by hand after the save refuses the node, naming it;
- an untouched save applies to the end state `rollout apply PLAN` reaches;
- a saved operator driver upgrade is refused once the ClusterPolicy's driver version was
  changed by hand; a save made after that converges through the lab's upgrade controller;
- `rollout schedule FILE`'s CronJob runs a saved registry plan in a pod, the pod is killed
  in the middle of the node, and the next run continues the saved plan and converges.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

import pytest
import yaml

from rollout.lab.cluster import Lab
from rollout.lab.image import INSTALLED_DRIVER
from rollout.lab.simulation.gpuoperator import CLUSTER_POLICY_NAME
from rollout.run import list_runs, read_run
from rollout.run.cluster import find_run
from rollout.savedplan import JOURNAL_KEY
from rollout.transports.kube import KubeClient
from tests.examples import REPO, edited_plan
from tests.lab.labapi import apply_args, fleet_args, wait_for
from tests.lab.test_cluster_shared import own_lab, ssh_check
from tests.lab.test_driver_operator import SKIP, STATE, smi_version
from tests.lab.test_resume_timeslicing import GPUS, assert_demo_converged
from tests.lab.test_schedule import lab_kubectl
from tests.lab.test_schedule_runs import (
    CRONJOB,
    NAMESPACE,
    apply_ssh_secret,
    ended,
    eventually,
    journal_kinds,
    kill_pod_process,
    pod_of,
    rollout_image_in,
)

pytestmark = [pytest.mark.lab, pytest.mark.own_lab]

DEMO_PLAN = REPO / "examples" / "lab-plan.yaml"
CONFIGMAP = "time-slicing-config"
OPERATOR_NAMESPACE = "gpu-operator"
BY_HAND = "550.127.05"  # the driver someone moves the ClusterPolicy to after the save
TARGET = "550.90.07"
DRIVER_PLAN = f"""\
apiVersion: rollout/v1
kind: Plan
metadata: {{name: saved-driver}}
targets: {{selector: nvidia.com/gpu.present=true}}
changes:
  - driver-upgrade: {{version: "{TARGET}", mode: operator, upgrade_timeout_s: 240}}
policy:
  waves: [1]
  max_unavailable: 1
"""
MIRROR = "saved-schedule.registry.internal:5000"
HOSTS_TOML = "/etc/containerd/certs.d/docker.io/hosts.toml"
RUN_S = 480.0


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    with own_lab(tmp_path_factory.mktemp("savedkinds") / "lab", ("1.7",), gpus=GPUS) as built:
        yield built


def rollout(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rollout", *args], capture_output=True, text=True, timeout=RUN_S
    )


def save(lab: Lab, plan: Path, out: Path) -> Path:
    done = rollout("plan", str(plan), *fleet_args(lab), "--out", str(out))
    assert done.returncode == 0, done.stdout + done.stderr
    return out


def node_files(lab: Lab) -> dict[str, str]:
    """Every containerd file of every node with its sha256, and the node's unit state."""
    seen = {}
    for node in lab.nodes:
        listing = [
            "sh",
            "-c",
            "find /etc/containerd -type f -print0 | sort -z | xargs -0 sha256sum",
        ]
        seen[node.name] = ssh_check(lab, node, listing)
    return seen


def test_a_saved_plan_with_one_byte_changed_is_refused_untouched(
    lab: Lab, kube: KubeClient, tmp_path: Path
) -> None:
    saved = save(lab, DEMO_PLAN, tmp_path / "demo.saved")
    text = saved.read_bytes()
    at = text.index(b"replicas: 4") + len(b"replicas: ")
    saved.write_bytes(text[:at] + b"8" + text[at + 1 :])  # four-way sharing made eight-way
    before = node_files(lab)
    state = tmp_path / "state"
    done = rollout(*apply_args(lab, saved, state))
    assert done.returncode == 2, done.stdout + done.stderr
    assert "the saved plan was edited since it was saved" in done.stderr, done.stderr
    assert not state.exists() or not list_runs(state)  # no run started
    assert node_files(lab) == before
    for node in lab.nodes:
        seen = kube.get_node(node.name)
        assert not seen.unschedulable and "nvidia.com/device-plugin.config" not in seen.labels


def test_the_time_slicing_configmap_made_by_hand_after_the_save_refuses_the_node(
    lab: Lab, kube: KubeClient, tmp_path: Path
) -> None:
    saved = save(lab, DEMO_PLAN, tmp_path / "demo.saved")
    before = node_files(lab)
    create = ("create", "configmap", CONFIGMAP, "-n", OPERATOR_NAMESPACE)
    lab_kubectl(lab, tmp_path, *create, "--from-literal=default=version: v1\n")
    try:
        state = tmp_path / "state"
        done = rollout(*apply_args(lab, saved, state))
        said = done.stdout + done.stderr
        assert done.returncode == 1, said
        (first,) = lab.nodes
        fact = f"ConfigMap {OPERATOR_NAMESPACE}/{CONFIGMAP} appeared since the plan was saved"
        assert f"{first.name}: {fact}" in said, said
        assert f"({first.name} was not touched)" in said, said
        (run,) = list_runs(state)
        assert not read_run(state, run.run_id).node(first.name).completed
        assert node_files(lab) == before
        assert not kube.get_node(first.name).unschedulable
    finally:
        lab_kubectl(lab, tmp_path, "delete", "configmap", CONFIGMAP, "-n", OPERATOR_NAMESPACE)


def test_an_untouched_saved_demo_plan_converges_as_apply_plan_does(
    lab: Lab, kube: KubeClient, tmp_path: Path
) -> None:
    saved = save(lab, DEMO_PLAN, tmp_path / "demo.saved")
    done = rollout(*apply_args(lab, saved, tmp_path / "state"))
    assert done.returncode == 0, done.stdout + done.stderr
    assert_demo_converged(lab, kube)
    # nothing left for the plan itself to do
    again = rollout("plan", str(DEMO_PLAN), *fleet_args(lab), "--detailed-exitcode")
    assert again.returncode == 0, again.stdout + again.stderr


def driver_settled(kube: KubeClient, lab: Lab, version: str) -> bool:
    return all(
        kube.get_node(n.name).labels.get(STATE) == "upgrade-done"
        and smi_version(lab, n.name) == version
        and not kube.get_node(n.name).unschedulable
        for n in lab.nodes
    )


def test_a_saved_driver_upgrade_refused_after_a_hand_change_then_a_new_save_converges(
    lab: Lab, kube: KubeClient, tmp_path: Path
) -> None:
    plan = tmp_path / "driver.yaml"
    plan.write_text(DRIVER_PLAN)
    stale = save(lab, plan, tmp_path / "driver.saved")
    kube.patch_cluster_policy(CLUSTER_POLICY_NAME, {"spec": {"driver": {"version": BY_HAND}}})
    state = tmp_path / "stale-state"
    done = rollout(*apply_args(lab, stale, state))
    said = done.stdout + done.stderr
    assert done.returncode == 1, said
    (first,) = lab.nodes
    # named with the upgrade state the operator moved the node to since (a label)
    assert f"halted: {first.name}: " in said, said
    assert "ClusterPolicy changed since the plan was saved" in said, said
    policy = kube.get_cluster_policy(CLUSTER_POLICY_NAME)
    assert policy["spec"]["driver"]["version"] == BY_HAND  # the run changed nothing
    assert SKIP not in kube.get_node(first.name).labels  # nor pinned a node
    assert "to go back to driver" not in said  # patching back would undo the hand change

    # the operator upgrades the node to the version set by hand; planned again, saved again
    wait_for(
        lambda: driver_settled(kube, lab, BY_HAND), 240.0, what=f"the hand upgrade to {BY_HAND}"
    )
    fresh = save(lab, plan, tmp_path / "driver-again.saved")
    done = rollout(*apply_args(lab, fresh, tmp_path / "state"))
    assert done.returncode == 0, done.stdout + done.stderr
    assert kube.get_cluster_policy(CLUSTER_POLICY_NAME)["spec"]["driver"]["version"] == TARGET
    assert driver_settled(kube, lab, TARGET)
    assert SKIP not in kube.get_node(first.name).labels
    assert INSTALLED_DRIVER != TARGET


def test_a_scheduled_saved_plan_killed_in_its_pod_continues_and_converges(
    lab: Lab, kube: KubeClient, tmp_path: Path
) -> None:
    plan = edited_plan(tmp_path, "mirror.registry.internal:5000", MIRROR)
    saved = save(lab, plan, tmp_path / "mirror.saved")
    image = rollout_image_in(lab)  # the lab runs the Job's pod as the image's container
    printed = rollout(
        *("schedule", str(saved), "--inventory", str(lab.inventory), "--image", image),
        *("--namespace", NAMESPACE, "--cron", "0 3 * * *", "--suspend"),
    )
    assert printed.returncode == 0, printed.stderr
    manifest = printed.stdout
    configmap = next(o for o in yaml.safe_load_all(manifest) if o and o["kind"] == "ConfigMap")
    assert saved.read_text() in configmap["data"].values()  # the saved file, whole
    lab_kubectl(lab, tmp_path, "apply", "-f", "-", stdin=manifest)
    try:
        apply_ssh_secret(lab, tmp_path, NAMESPACE, f"{CRONJOB}-ssh")
        run_killed_then_continued(lab, tmp_path, kube)
    finally:
        lab_kubectl(
            lab,
            tmp_path,
            *("delete", "-f", "-", "--wait=false", "--ignore-not-found"),
            stdin=manifest,
        )
        lab_kubectl(lab, tmp_path, "delete", "namespace", NAMESPACE, "--ignore-not-found")


def run_killed_then_continued(lab: Lab, home: Path, kube: KubeClient) -> None:
    def start(job: str) -> None:
        command = ("create", "job", job, f"--from=cronjob/{CRONJOB}", "-n", NAMESPACE)
        assert lab_kubectl(lab, home, *command) == f"job.batch/{job} created\n"

    start("first")
    eventually(
        lambda: any(
            r["kind"] == "step-started" and r["step"] == "containerd.write"
            for r in journal_kinds(kube)
        ),
        "the scheduled run in the middle of its node",
    )
    killed = pod_of(kube, "first")
    assert killed is not None
    assert kill_pod_process(killed.name) is not None, "no container runs the pod"
    assert eventually(lambda: ended(kube, "first"), "the killed run's pod ended").phase == "Failed"
    assert not any(r["kind"] == "run-finished" for r in journal_kinds(kube))
    found = find_run(kube, NAMESPACE, "registry-mirror")
    assert found is not None
    assert JOURNAL_KEY in json.loads(found.read_plan_json())  # a run of the saved plan
    # the killed pod's Lease expires before the next run
    lease = kube.get_lease("kube-system", "rollout")
    assert lease.renew_time is not None
    stale = lease.renew_time - timedelta(seconds=2 * (lease.lease_duration_s or 60))
    kube.replace_lease(replace(lease, renew_time=stale))
    start("second")
    done = eventually(lambda: ended(kube, "second"), "the second run ended", RUN_S)
    log = kube.read_pod_log(NAMESPACE, done.name)
    assert done.phase == "Succeeded", log
    assert f"continuing run {found.run_id}" in log, log
    records = journal_kinds(kube)
    assert [r["kind"] for r in records].count("run-started") == 1
    assert records[-1] == {**records[-1], "kind": "run-finished", "outcome": "succeeded"}
    assert [r["node"] for r in records if r["kind"] == "node-finished"] == [
        n.name for n in lab.nodes
    ]
    for node in lab.nodes:
        assert MIRROR in ssh_check(lab, node, ["cat", HOSTS_TOML]), node.name
        assert not kube.get_node(node.name).unschedulable, node.name
