"""rollout's image (built by rolloutimage.py from the Containerfile) run as a pod's container
through a lab node's own containerd, as the scheduled CronJob's pod runs in a cluster: pushed
to the lab's registry, pulled by digest through it, run as the manifests' non-root user on a
read-only root file system with a Secret-like volume mounted read-only, in the node's network
(the lab's nodes have no pod network)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rollout.inventory import load_inventory
from rollout.lab.cluster import Lab
from rollout.lab.cri import ContainerRequest, CriPodRunner
from rollout.lab.cri.pods import ContainerMount
from rollout.lab.nodes import LAB_CERTS_DIR, prepull_images, read_node_pid, write_lab_mirror
from rollout.lab.registry import registry_host
from rollout.lab.rolloutimage import build_rollout_image, builder_available, push_rollout_image
from rollout.lab.simulation.jobpods import container_security
from rollout.playbook import load_playbooks
from rollout.schedule.manifests import NONROOT_UID, ScheduleOptions, build_schedule
from rollout.spec import load_spec
from tests.conftest import require
from tests.examples import REPO
from tests.lab.test_cluster_shared import own_lab

pytestmark = [pytest.mark.lab, pytest.mark.own_lab]

SECRET_DIR = "/var/lib/rollout-lab/test-secret"


def scheduled_pod_spec() -> dict[str, Any]:
    """The pod spec `rollout schedule` writes for the example plan (the image's reference is
    a stand-in: only the securityContext is read)."""
    built = build_schedule(
        load_spec(REPO / "examples" / "plan.yaml"),
        (REPO / "examples" / "plan.yaml").read_text(encoding="utf-8"),
        load_playbooks(),
        ScheduleOptions(image="registry.example/rollout@sha256:" + "ab" * 32, cron="0 2 * * *"),
        load_inventory(REPO / "inventory" / "example.yaml"),
    )
    (cronjob,) = [o for o in built.objects if o["kind"] == "CronJob"]
    spec: dict[str, Any] = cronjob["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    return spec


POD_SPEC = scheduled_pod_spec()


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    if not builder_available():
        require("buildah is missing: scripts/setup --lab installs it")
    # a GPU: the toolkit configures the `nvidia` runtime the pod runs with
    with own_lab(tmp_path_factory.mktemp("image-pod") / "lab", ("1.7",), 1) as up:
        yield up


@pytest.fixture(scope="module")
def pinned(lab: Lab) -> str:
    """The image pushed to the lab's registry and pulled into the node by digest, through
    the registry (the lab's own hosts.toml names it as an http endpoint)."""
    image = build_rollout_image(REPO, progress=lambda line: None)
    registry = registry_host(lab.nodes[0].address)
    reference = push_rollout_image(image, registry)
    (node,) = lab.nodes
    dirs = lab.node_dirs(node)
    write_lab_mirror(dirs, registry, [registry])
    assert dirs.host_path(f"{LAB_CERTS_DIR}/{registry}/hosts.toml").is_file()
    prepull_images(node, dirs, [reference])
    return reference


def node_runner(lab: Lab) -> CriPodRunner:
    """The node's CRI, through its root as its own processes see it (its /run is the node's
    tmpfs): /proc/<the container's init>/root."""
    (node,) = lab.nodes
    nspawn = read_node_pid(node, lab.node_dirs(node))
    assert nspawn is not None
    (init, *_) = Path(f"/proc/{nspawn}/task/{nspawn}/children").read_text().split()
    return CriPodRunner(Path(f"/proc/{init}/root"))


def run_request(lab: Lab, pinned: str, name: str, command: list[str]) -> ContainerRequest:
    (node,) = lab.nodes
    secret = lab.node_dirs(node).host_path(SECRET_DIR)
    secret.mkdir(parents=True, exist_ok=True)
    (secret / "id_ed25519").write_text("not a real key\n")
    (secret / "id_ed25519").chmod(0o400)
    return ContainerRequest(
        namespace="rollout",
        pod=name,
        uid=f"uid-{name}",
        container="rollout",
        image=pinned,
        command=command,
        # runc alone cannot start a sandbox in a lab node (the host withholds
        # CAP_SYS_RESOURCE: oom_score_adj; docs/lab.md): the nodes' `nvidia` runtime
        # works around it, as for smoke pods
        handler="nvidia",
        # the securityContext the schedule's manifests give the pod, as the kubelet hands it
        security=container_security(POD_SPEC, POD_SPEC["containers"][0]),
        mounts=(ContainerMount("/etc/rollout/ssh", SECRET_DIR, read_only=True),),
        wait_s=120.0,
    )


def test_the_image_runs_rollout_in_a_node_s_containerd(lab: Lab, pinned: str) -> None:
    runner = node_runner(lab)
    request = run_request(lab, pinned, "version", ["rollout", "version", "--output", "json"])
    outcome = runner.run(request)
    assert outcome.started, outcome.message
    assert outcome.exit_code == 0, outcome.output
    assert json.loads(outcome.output)["commit_source"] == "build"


def test_the_container_is_non_root_on_a_read_only_root_with_its_secret(
    lab: Lab, pinned: str
) -> None:
    runner = node_runner(lab)
    script = (
        "id -u; id -g; ls /etc/rollout/ssh; "
        "touch /probe 2>&1 || echo root-read-only; "
        "touch /etc/rollout/ssh/probe 2>&1 || echo secret-read-only"
    )
    outcome = runner.run(run_request(lab, pinned, "checks", ["sh", "-c", script]))
    assert outcome.started, outcome.message
    lines = outcome.output.splitlines()
    assert lines[:3] == [str(NONROOT_UID), str(NONROOT_UID), "id_ed25519"]
    assert "root-read-only" in lines and "secret-read-only" in lines
    assert not Path(lab.node_dirs(lab.nodes[0]).host_path(SECRET_DIR), "probe").exists()


def test_the_container_runs_with_the_manifests_confinement(lab: Lab, pinned: str) -> None:
    """Every capability dropped (the bounding set too), no new privileges and containerd's
    default seccomp filter, read by the container's own process in /proc/self/status."""
    runner = node_runner(lab)
    script = "grep -E '^(CapEff|CapBnd|NoNewPrivs|Seccomp):' /proc/self/status"
    outcome = runner.run(run_request(lab, pinned, "confined", ["sh", "-c", script]))
    assert outcome.started, outcome.message
    status = dict(line.split(":\t", 1) for line in outcome.output.splitlines())
    assert status == {
        "CapEff": "0000000000000000",
        "CapBnd": "0000000000000000",
        "NoNewPrivs": "1",
        "Seccomp": "2",
    }
