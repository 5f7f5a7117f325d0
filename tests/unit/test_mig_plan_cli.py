"""`rollout plan` of a `mig` change from recorded facts (the example gpu-a-1, 4 A100 40GB, with
MIG labels and a cluster.yaml holding the MIG manager's ConfigMap): the label, the forecast
and the caveat in text, JSON and markdown; a node already on the layout; an unknown layout's
refusal, exit 2."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from rollout.cli import main
from tests.examples import FACTS
from tests.unit.test_mig_layout import LAB_CONFIG

CONFIGMAP = "gpu-operator/default-mig-parted-config"


PLAN_TEXT = """\
apiVersion: rollout/v1
kind: Plan
metadata: {name: mig}
targets: {nodes: [gpu-a-1]}
changes:
  - mig:
      config: LAYOUT
"""


def recorded_facts(tmp_path: Path, labels: dict[str, str], strategy: str = "mixed") -> Path:
    """The example facts of gpu-a-1 (4 A100-SXM4-40GB) with MIG labels and its advertised
    GPUs, and a cluster.yaml with the ClusterPolicy and the MIG manager's ConfigMap."""
    facts = tmp_path / "facts"
    shutil.copytree(FACTS, facts)
    node = facts / "gpu-a-1" / "node.yaml"
    document = yaml.safe_load(node.read_text())
    document["labels"].update(labels)
    document["capacity"] = {"nvidia.com/gpu": "4"}
    document["allocatable"] = {"nvidia.com/gpu": "4"}
    node.write_text(yaml.safe_dump(document))
    cluster = {
        "configmaps": {CONFIGMAP: {"config.yaml": LAB_CONFIG}},
        "cluster_policy": {"mig": {"strategy": strategy}, "migManager": {"enabled": True}},
    }
    (facts / "cluster.yaml").write_text(yaml.safe_dump(cluster))
    return facts


MIG_LABELS = {
    "nvidia.com/mig.capable": "true",
    "nvidia.com/mig.config": "all-disabled",
    "nvidia.com/mig.config.state": "success",
}


def run_plan(
    tmp_path: Path, layout: str, capsys: pytest.CaptureFixture[str], *options: str, **kw: Any
) -> tuple[int, str, str]:
    facts = recorded_facts(tmp_path, {**MIG_LABELS, **kw.pop("labels", {})}, **kw)
    plan = tmp_path / "plan.yaml"
    plan.write_text(PLAN_TEXT.replace("LAYOUT", layout))
    capsys.readouterr()
    code = main(["plan", str(plan), "--facts", str(facts), *options])
    out, err = capsys.readouterr()
    return code, out, err


def test_plan_shows_the_label_and_the_forecast_in_text(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run_plan(tmp_path, "all-1g.5gb", capsys, "--full")
    assert code == 0, err
    assert "nvidia.com/mig.config all-disabled -> all-1g.5gb" in out
    assert "nvidia.com/gpu 4 -> 0, nvidia.com/mig-1g.5gb 0 -> 28" in out
    assert "7 x 1g.5gb makes MIG devices of 35 of each A100 40GB's 40 GB" in out
    for step in ("cordon", "drain", "mig.configure", "mig.wait", "gpu.wait", "gpu.smoke"):
        assert step in out
    # the checks say what the forecast promises, not whole GPUs
    assert "wait for allocatable nvidia.com/mig-1g.5gb = 28" in out
    assert "resources whole (nvidia.com/mig-1g.5gb = 28, allocatable = capacity)" in out


def test_plan_shows_the_label_and_the_forecast_in_json_and_markdown(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run_plan(tmp_path, "all-1g.5gb", capsys, "--output", "json")
    assert code == 0, err
    planned = json.loads(out)
    (node,) = planned["waves"][0]["nodes"]
    steps = {s["kind"]: s for s in node["steps"]}
    assert steps["mig.configure"]["action"] == "nvidia.com/mig.config all-disabled -> all-1g.5gb"
    assert steps["cordon"]["action"] is not None
    forecast = {r["resource"]: (r["before"], r["after"]) for r in node["capacity"]["resources"]}
    assert forecast == {"nvidia.com/gpu": (4, 0), "nvidia.com/mig-1g.5gb": (0, 28)}
    code, out, err = run_plan(tmp_path / "md", "all-1g.5gb", capsys, "--output", "markdown")
    assert code == 0, err
    assert "nvidia.com/mig-1g.5gb" in out and "all-1g.5gb" in out


def test_plan_of_a_node_already_on_the_layout_changes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    labels = {"nvidia.com/mig.config": "all-1g.5gb"}
    code, out, err = run_plan(
        tmp_path, "all-1g.5gb", capsys, "--output", "json", "--detailed-exitcode", labels=labels
    )
    assert code == 0, err
    (node,) = json.loads(out)["waves"][0]["nodes"]
    steps = {s["kind"]: s for s in node["steps"]}
    assert steps["mig.configure"]["noop_reason"] == "already on layout all-1g.5gb (state success)"
    assert steps["cordon"]["action"] is None


def test_plan_refuses_an_unknown_layout_with_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _out, err = run_plan(tmp_path, "all-9g.99gb", capsys)
    assert code == 2
    assert f"{tmp_path / 'plan.yaml'}:7" in err
    assert "layout 'all-9g.99gb' is not defined by the MIG manager's ConfigMap" in err
    assert "it defines all-1g.5gb, all-3g.20gb, all-balanced" in err
