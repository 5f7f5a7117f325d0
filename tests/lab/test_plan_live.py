"""`rollout plan` with live facts: the lab's nodes probed over real SSH and the API emulator."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from rollout.cli import main
from rollout.facts import ConfigFilesFact, ProbeFailed, parse_file_dump, parse_gpu_query
from rollout.facts.gpu import GpuQueryFact
from rollout.lab.cluster import Lab
from rollout.transports.local import LocalRunner
from tests.examples import PLAN
from tests.lab.labapi import api_lab, apply_args
from tests.lab.test_cluster_shared import node_of_series, ssh_check

pytestmark = pytest.mark.lab

NAIVE = "/etc/containerd/conf.d/zz-registry.toml"


@pytest.fixture(scope="module")
def lab(request: pytest.FixtureRequest) -> Lab:
    return api_lab(request)


def plan_live(lab: Lab, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    code = main(
        [
            "plan",
            str(PLAN),
            "--inventory",
            str(lab.inventory),
            "--kubeconfig",
            str(lab.kubeconfig),
            "--output",
            "json",
        ]
    )
    captured = capsys.readouterr()
    assert code == 0, captured.err
    data: dict[str, Any] = json.loads(captured.out)
    return {n["name"]: n for w in data["waves"] for n in w["nodes"]}


@pytest.fixture
def naive_dropin(lab: Lab) -> Iterator[str]:
    """A hand-written registry drop-in on the 1.7 node, removed afterwards (no restart)."""
    node = node_of_series(lab, "1.7")
    text = (
        '[plugins."io.containerd.grpc.v1.cri".registry]\n'
        '  config_path = "/etc/containerd/certs.d"\n'
    )
    ssh_check(lab, node, ["sh", "-c", f"cat > {NAIVE}"], stdin=text.encode())
    try:
        yield node.name
    finally:
        ssh_check(lab, node, ["rm", "-f", NAIVE])


def test_live_plan_reads_every_node(lab: Lab, capsys: pytest.CaptureFixture[str]) -> None:
    nodes = plan_live(lab, capsys)
    assert set(nodes) == {n.name for n in lab.nodes}
    for series in ("1.6", "1.7", "2.1"):
        node = nodes[node_of_series(lab, series).name]
        assert node["containerd_version"].startswith(series)
        intended = [c for c in node["effective_changes"] if c["intended"]]
        assert [c["after"] for c in intended] == ["/etc/containerd/certs.d"]
        paths = {f["path"] for f in node["files"]}
        assert "/etc/containerd/certs.d/docker.io/hosts.toml" in paths
        # 1.x: the toolkit's drop-in carries the whole CRI table, so it carries the intent too
        assert ("/etc/containerd/conf.d/99-nvidia.toml" in paths) == (series != "2.1")


def test_live_plan_finds_a_shadowing_dropin(
    lab: Lab, capsys: pytest.CaptureFixture[str], naive_dropin: str
) -> None:
    node = plan_live(lab, capsys)[naive_dropin]
    assert len(node["shadowing"]) == 1
    assert f"{NAIVE} replaces the whole" in node["shadowing"][0]
    assert node["repairs"] and "nvidia" in node["repairs"][0]


def test_gpu_query_parser_reads_the_lab_nvidia_smi(lab: Lab) -> None:
    node = node_of_series(lab, "1.7")
    out = ssh_check(lab, node, GpuQueryFact().command())
    gpus = parse_gpu_query(out)
    assert gpus.count == len(node.gpus) and gpus.uuids == tuple(g.uuid for g in node.gpus)
    assert gpus.driver_version
    assert gpus.device_ids == tuple(g.pci_device_id for g in node.gpus)


def test_gpu_query_parser_on_recorded_output() -> None:
    text = (
        "GPU-838f60d9-651f-9166-ea42-f9da674a6947, NVIDIA A100-SXM4-40GB, 535.183.01\n"
        "GPU-9e3a2f10-1111-2222-3333-444455556666, NVIDIA A100-SXM4-40GB, 535.183.01\n"
    )
    gpus = parse_gpu_query(text)
    assert gpus.count == 2 and gpus.product == "NVIDIA A100-SXM4-40GB"
    assert gpus.driver_version == "535.183.01"
    assert parse_gpu_query("No devices were found\n").count == 0


def test_file_dump_reads_a_tree_in_one_command(tmp_path: Path) -> None:
    (tmp_path / "conf.d").mkdir()
    (tmp_path / "config.toml").write_text('version = 2\nimports = ["conf.d/*.toml"]\n')
    (tmp_path / "conf.d" / "with space.toml").write_text("# a 'quoted' \"name\"\n\n")
    (tmp_path / "empty.toml").write_text("")
    fact = ConfigFilesFact(f"{tmp_path}/config.toml", directory=str(tmp_path))
    result = LocalRunner().run(fact.command())
    assert result.ok, result.stderr
    assert parse_file_dump(result.stdout) == {
        f"{tmp_path}/conf.d/with space.toml": "# a 'quoted' \"name\"\n\n",
        f"{tmp_path}/config.toml": 'version = 2\nimports = ["conf.d/*.toml"]\n',
        f"{tmp_path}/empty.toml": "",
    }
    assert fact.parse(result.stdout, "here").files == parse_file_dump(result.stdout)
    assert parse_file_dump("") == {}
    with pytest.raises(ProbeFailed, match=r"here: .*config\.toml not found"):
        ConfigFilesFact("/etc/containerd/config.toml", directory=str(tmp_path)).parse(
            result.stdout, "here"
        )
    with pytest.raises(ProbeFailed, match="ends inside a record"):
        parse_file_dump("/etc/containerd/config.toml\0version = 2\n\0/etc/x\0")


def test_live_plan_shows_service_gpus_and_what_drain_would_do(
    lab: Lab, capsys: pytest.CaptureFixture[str]
) -> None:
    from rollout.lab.cluster import CONTEXT
    from rollout.transports.kube import KubeClient

    node = node_of_series(lab, "2.1")
    with KubeClient.from_kubeconfig(str(lab.kubeconfig), context=CONTEXT) as kube:
        kube.create_pod(
            "default",
            {
                "metadata": {"name": "bare-pod", "labels": {"app": "bare"}},
                "spec": {"nodeName": node.name, "containers": [{"name": "c", "image": "busybox"}]},
            },
        )
        try:
            planned = plan_live(lab, capsys)
        finally:
            kube.delete_pod("default", "bare-pod", grace_period_s=0, missing_ok=True)
    status = planned[node.name]["status"]
    assert "containerd active (MainPID" in status
    gpus = len(node.gpus)
    assert f"nvidia.com/gpu {gpus}/{gpus} allocatable" in status
    drain = next(s for s in planned[node.name]["steps"] if s["kind"] == "drain")
    assert drain["action"] == "would refuse: 1 pod(s) block the drain (see the warning)"
    assert any(
        "default/bare-pod" in w and "policy.drain.force" in w
        for w in planned[node.name]["warnings"]
    )
    other = node_of_series(lab, "1.6").name
    assert next(s for s in planned[other]["steps"] if s["kind"] == "drain")["action"] == (
        "nothing to evict now (checked again at apply time)"
    )


CONTAINERD_SUMS = ["sh", "-c", "find /etc/containerd -type f | sort | xargs sha256sum"]


def test_apply_outside_the_window_starts_no_node_and_exits_4(
    lab: Lab, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A window that opens in two hours: apply journals the run as halted at the window, names
    the nodes left, changes nothing and exits 4, the status a scheduled run reads as "the
    next window continues"."""
    opens = datetime.now(UTC) + timedelta(hours=2)
    window = (
        f'  maintenance_window: {{start: "{opens:%H:%M}", '
        f'end: "{opens + timedelta(hours=1):%H:%M}", timezone: UTC}}\n'
    )
    plan = tmp_path / "plan.yaml"
    plan.write_text(PLAN.read_text().replace("policy:\n", "policy:\n" + window))
    before = {n.name: ssh_check(lab, n, CONTAINERD_SUMS) for n in lab.nodes}
    state = tmp_path / "state"
    capsys.readouterr()
    assert main(apply_args(lab, plan, state)) == 4
    out = capsys.readouterr().out
    assert f"window closed ({opens:%H:%M}-" in out
    assert f"{len(lab.nodes)} node(s) left; resume the run inside the window" in out
    after = {n.name: ssh_check(lab, n, CONTAINERD_SUMS) for n in lab.nodes}
    assert after == before
