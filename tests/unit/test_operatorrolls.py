"""The plan and the run say what the GPU Operator restarts after rollout's ClusterPolicy
change, containerd included: a time-slicing change restarts the device plugin, never
containerd; a change the toolkit is rendered from restarts containerd on every GPU node."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rollout.cli import main
from rollout.operatorrolls import describe_rolls
from tests.examples import FACTS
from tests.planning import time_slicing_plan


def test_a_device_plugin_change_restarts_the_plugin_and_no_containerd() -> None:
    said = describe_rolls(["devicePlugin.config.name"])
    assert "restarts the device plugin and GPU feature discovery pods" in said
    assert "containerd is not restarted by it" in said


def test_a_toolkit_change_names_the_containerd_restarts() -> None:
    said = describe_rolls(["toolkit.version"])
    assert "restarts containerd twice on its node" in said
    assert "not restarted" not in said


def test_a_driver_version_change_restarts_nothing_by_itself() -> None:
    said = describe_rolls(["driver.version"])
    assert "OnDelete" in said
    assert "containerd is not restarted by it" in said


def test_the_plan_names_what_the_cluster_policy_change_restarts(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    plan = tmp_path / "plan.yaml"
    plan.write_text(
        time_slicing_plan(name="share", targets="{nodes: [gpu-a-1, gpu-a-2]}", profile="a100-4x")
    )
    assert main(["plan", str(plan), "--facts", str(FACTS), "-o", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    (policy,) = [c for c in data["cluster_changes"] if c["kind"] == "clusterpolicy"]
    assert policy["action"].startswith("set spec.devicePlugin.config.name = 'time-slicing-config'")
    assert policy["action"].endswith(
        "the GPU Operator restarts the device plugin and GPU feature discovery pods on every "
        "GPU node (a DaemonSet rollout); containerd is not restarted by it (the toolkit's "
        "DaemonSet is unchanged)"
    )
