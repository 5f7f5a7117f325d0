"""`rollout apply` running a wave's nodes in parallel, on a 4-node lab of this module's own:
a kill -9 in the middle of a parallel wave, then `resume`, converges; a failure on one node
of a parallel wave rolls that node back while the others finish, and the cluster never has
more nodes unavailable than max_unavailable, as watched through the API from the side."""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rollout.cli import main
from rollout.lab.cluster import Lab
from rollout.run import list_runs, read_run
from rollout.transports.kube import KubeClient
from tests.examples import PLAN
from tests.lab.converged import assert_converged, dump_of
from tests.lab.labapi import apply_args, apply_killed_when, watching
from tests.lab.test_cluster_shared import own_lab, ssh_check

pytestmark = [pytest.mark.lab, pytest.mark.own_lab]

BROKEN_START = "/etc/systemd/system/containerd.service.d/90-test-parallel.conf"


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    """One lab for the module: each test applies a change the other does not depend on."""
    with own_lab(
        tmp_path_factory.mktemp("parallel") / "lab", ("1.6", "1.7", "2.1", "1.7"), 2
    ) as built:
        yield built


def journal_records(state: Path) -> list[dict[str, Any]]:
    runs = list(state.glob("runs/*/journal.jsonl"))
    if not runs:
        return []
    lines = runs[0].read_text().splitlines()
    records = []
    for line in lines:
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            break  # a line being written
    return records


def writes_done(records: list[dict[str, Any]]) -> list[str]:
    return [
        r["node"]
        for r in records
        if r.get("kind") == "step-finished"
        and r.get("step") == "containerd.write"
        and r.get("outcome") == "done"
    ]


def test_kill_9_during_a_parallel_wave_then_resume_converges(
    lab: Lab, kube: KubeClient, tmp_path: Path
) -> None:
    plan = tmp_path / "plan.yaml"
    plan.write_text(
        PLAN.read_text()
        .replace('waves: [1, "50%"]', "waves: [4]")
        .replace("max_unavailable: 1", "max_unavailable: 4")
    )
    state = tmp_path / "state"
    # killed once two nodes have written their files: the wave is in the middle of things
    status = apply_killed_when(
        lab, plan, state, lambda: len(writes_done(journal_records(state))) >= 2, timeout_s=120
    )
    assert status == -signal.SIGKILL, "apply finished before it could be killed"
    before = journal_records(state)
    started = [r["node"] for r in before if r.get("kind") == "step-started"]
    assert len(set(started)) == 4, "every node of the wave had started: they run in parallel"
    (run,) = list_runs(state)
    assert main(["resume", run.run_id, "--state-dir", str(state)]) == 0
    final = read_run(state, run.run_id)
    assert final.outcome is not None and final.outcome.value == "succeeded"
    assert_converged(lab, kube)
    # a write finished before the kill is not redone; a write in flight at the kill is
    # applied again and finds its files already there (or writes them), never twice
    records = journal_records(state)
    written_before = set(writes_done(before))
    assert len(written_before) >= 2
    again = [
        r["node"]
        for r in records[len(before) :]
        if r.get("kind") == "step-started" and r.get("step") == "containerd.write"
    ]
    assert written_before.isdisjoint(again)
    done = writes_done(records)
    assert len(done) == len(set(done)), "no node's files written twice"
    finished = {
        r["node"]
        for r in records
        if r.get("kind") == "step-finished"
        and r.get("step") == "containerd.write"
        and r.get("outcome") in ("done", "noop")
    }
    assert finished == {n.name for n in lab.nodes}


def test_a_failure_in_a_parallel_wave_rolls_back_that_node_within_the_budget(
    lab: Lab, kube: KubeClient, tmp_path: Path
) -> None:
    plan = tmp_path / "plan.yaml"
    plan.write_text(
        "apiVersion: rollout/v1\nkind: Plan\nmetadata: {name: log-line-size}\n"
        "targets: {selector: nvidia.com/gpu.present=true}\n"
        "changes:\n  - containerd: {settings: {max_container_log_line_size: 32768}}\n"
        "policy: {waves: [4], max_unavailable: 3, on_failure: rollback}\n"
    )
    # lab-node-2's containerd refuses to start while a file carries the new setting: its
    # restart fails, and the restart of the rollback (original files) succeeds
    victim = lab.nodes[1]
    before = {spec.name: dump_of(lab, spec.name) for spec in lab.nodes}
    guard = "! grep -qs 'max_container_log_line_size = 32768' /etc/containerd/config.toml"
    ssh_check(
        lab,
        victim,
        [
            "sh",
            "-c",
            f"mkdir -p {Path(BROKEN_START).parent} && cat > {BROKEN_START} "
            "&& systemctl daemon-reload",
        ],
        stdin=(
            f'[Service]\nExecStartPre=/bin/sh -c "{guard} /etc/containerd/conf.d/*.toml"\n'
        ).encode(),
    )

    def sample(side: KubeClient) -> list[tuple[float, tuple[str, ...]]]:
        # the API's view, from the side: which nodes are cordoned or NotReady, over time
        down = tuple(n.name for n in side.list_nodes() if n.unschedulable or not n.ready)
        return [(time.monotonic(), down)]

    try:
        with watching(lab, sample, interval_s=0.05) as seen:
            assert main(apply_args(lab, plan, tmp_path / "state")) == 1
    finally:
        ssh_check(lab, victim, ["sh", "-c", f"rm -f {BROKEN_START} && systemctl daemon-reload"])
    assert len(seen) > 20, "the watch saw the run"
    assert max(len(down) for _, down in seen) == 3, "three nodes at once, never more"
    (run,) = list_runs(tmp_path / "state")
    state = read_run(tmp_path / "state", run.run_id)
    outcomes = {
        spec.name: (o.value if (o := state.node(spec.name).outcome) else "pending")
        for spec in lab.nodes
    }
    assert outcomes[victim.name] == "rolled-back"
    assert run.halted_reason and "failure budget of 0" in run.halted_reason
    # the two started beside it finish; the fourth started only if a slot freed before the
    # failure halted the run
    assert outcomes["lab-node-1"] == outcomes["lab-node-3"] == "succeeded"
    assert outcomes["lab-node-4"] in ("succeeded", "pending")
    assert dump_of(lab, victim.name) == before[victim.name], "the victim's files are the originals"
    for spec in lab.nodes:
        assert not kube.get_node(spec.name).unschedulable, spec.name
        dump = dump_of(lab, spec.name)
        if outcomes[spec.name] == "pending":
            assert dump == before[spec.name], f"{spec.name} was not touched"
        elif spec.name != victim.name:
            plugins = dump["plugins"]
            cri = (
                plugins.get("io.containerd.cri.v1.runtime") or plugins["io.containerd.grpc.v1.cri"]
            )
            assert cri["max_container_log_line_size"] == 32768, spec.name
