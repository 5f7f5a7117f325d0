"""The duration forecast of `rollout plan`: per wave and in total, the windows a plan needs and
which nodes fall in which, from the steps' waits and timeouts or from an earlier run."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from rollout.cli import main
from rollout.plan import NodePlan, Plan, StepPlan, Wave
from rollout.playbook import load_playbooks
from rollout.run import Journal, NodeFinished, NodeOutcome, StepFinished, StepOutcome, StepStarted
from rollout.schedule.forecast import forecast_lines, forecast_plan, measured_durations
from rollout.spec import Policy
from rollout.steps import step_traits
from tests.examples import FACTS, REPO

# A node of a containerd change runs the built-in containerd playbook's steps, in order.
CONTAINERD_STEPS = tuple(step.kind for step in load_playbooks()["containerd"].steps)
PER_NODE_S = sum(step_traits()[k].expected_s for k in CONTAINERD_STEPS)  # 79 s
NAMES = ("gpu-1", "gpu-2", "gpu-3", "gpu-4", "gpu-5", "gpu-6")


def node(name: str, acting: bool = True) -> NodePlan:
    steps = tuple(
        StepPlan.acting(k, "do it") if acting else StepPlan.skipping(k, "done")
        for k in CONTAINERD_STEPS
    )
    return NodePlan(name=name, containerd_version="1.7.24", steps=steps)


def six_node_plan(sizes: tuple[int, ...] = (1,) * 6, max_unavailable: int = 1) -> Plan:
    waves, start = [], 0
    for index, size in enumerate(sizes, start=1):
        waves.append(Wave(index, tuple(node(n) for n in NAMES[start : start + size])))
        start += size
    return Plan(
        name="mirror",
        source="plan.yaml",
        facts_source="facts",
        changes=("containerd",),
        waves=tuple(waves),
        max_unavailable=max_unavailable,
    )


def policy(**fields: object) -> Policy:
    return Policy.model_validate(fields)


# 22:00-22:03 fits two nodes of 79 s (158 s) and not a third (237 s)
TWO_NODE_WINDOW = {"start": "22:00", "end": "22:03", "timezone": "Europe/Berlin"}


def test_a_window_that_fits_two_nodes_takes_three_windows_for_six() -> None:
    now = datetime(2024, 1, 1, 12, tzinfo=UTC)  # a Monday
    forecast = forecast_plan(six_node_plan(), policy(maintenance_window=TWO_NODE_WINDOW), now=now)
    assert [w.nodes for w in forecast.windows] == [
        ("gpu-1", "gpu-2"),
        ("gpu-3", "gpu-4"),
        ("gpu-5", "gpu-6"),
    ]
    assert [w.opens for w in forecast.windows] == [
        datetime(2024, 1, day, 21, tzinfo=UTC) for day in (1, 2, 3)
    ]
    assert forecast.window_length_s == 180 and forecast.too_long == ()
    assert [w.expected_s for w in forecast.waves] == [PER_NODE_S] * 6
    assert forecast.expected_s == 6 * PER_NODE_S
    lines = forecast_lines(forecast)
    assert "  maintenance windows of 3m: 3 window(s) needed" in lines
    assert "    window 1 (opens Mon 2024-01-01 22:00 Europe/Berlin): gpu-1, gpu-2" in lines


def test_worst_case_comes_from_the_policy_timeouts() -> None:
    tight = policy(
        drain={"timeout_s": 100},
        verify={
            "gpu_wait_timeout_s": 50,
            "smoke_timeout_s": 40,
            "containerd_restart_timeout_s": 30,
        },
    )
    forecast = forecast_plan(six_node_plan(), tight)
    # drain 100, restart 30, gpu.wait 50, smoke 40, and 60 for each of the other seven steps
    # (the health gates' two among them)
    assert forecast.waves[0].worst_s == 100 + 30 + 50 + 40 + 7 * 60
    unbounded = forecast_plan(six_node_plan(), policy(drain={"timeout_s": 0}))
    assert unbounded.waves[0].worst_s > 86_400  # 0 waits without limit: a day counted


def test_nodes_of_a_wave_share_the_unavailability_budget() -> None:
    forecast = forecast_plan(six_node_plan((4, 2), max_unavailable=2), policy())
    assert forecast.parallel == 2
    assert [w.expected_s for w in forecast.waves] == [2 * PER_NODE_S, PER_NODE_S]
    # a window of 3 minutes: wave 1 fills it (2 slots x 2 nodes), wave 2 opens the next
    windowed = forecast_plan(
        six_node_plan((4, 2), max_unavailable=2), policy(maintenance_window=TWO_NODE_WINDOW)
    )
    assert [w.nodes for w in windowed.windows] == [
        ("gpu-1", "gpu-2", "gpu-3", "gpu-4"),
        ("gpu-5", "gpu-6"),
    ]


def test_a_node_longer_than_a_window_is_named_and_still_gets_one() -> None:
    short = {"start": "22:00", "end": "22:01"}
    forecast = forecast_plan(six_node_plan(), policy(maintenance_window=short))
    assert len(forecast.windows) == 6 and forecast.too_long == NAMES
    assert any(
        "gpu-1 is expected to take longer than a whole window" in line
        for line in forecast_lines(forecast)
    )


def test_measured_durations_replace_the_estimate() -> None:
    forecast = forecast_plan(
        six_node_plan(),
        policy(maintenance_window={"start": "22:00", "end": "22:05"}),  # 300 s
        measured={"gpu-1": 90.0, "gpu-2": 110.0},
    )
    assert forecast.measured_nodes == 2
    assert all(n.expected_s == 100.0 and n.measured for w in forecast.waves for n in w.nodes)
    assert [len(w.nodes) for w in forecast.windows] == [3, 3]
    assert "measured on 2 node(s) of an earlier run" in forecast_lines(forecast)[0]


def test_nodes_without_changes_take_no_time_and_no_window() -> None:
    plan = six_node_plan()
    done = Wave(1, (node("gpu-1", acting=False),))
    plan = Plan(**{**plan.__dict__, "waves": (done, *plan.waves[1:])})
    forecast = forecast_plan(plan, policy(maintenance_window=TWO_NODE_WINDOW))
    assert forecast.waves[0].expected_s == 0
    assert forecast.windows[0].nodes == ("gpu-2", "gpu-3")


def test_durations_are_measured_from_an_earlier_runs_journal(tmp_path: Path) -> None:
    times = {"now": datetime(2024, 1, 1, 22, tzinfo=UTC)}

    def tick() -> datetime:
        return times["now"]

    journal = Journal.create(tmp_path, "mirror", "{}", clock=tick)
    for name, seconds, outcome in (
        ("gpu-1", 95, NodeOutcome.SUCCEEDED),
        ("gpu-2", 105, NodeOutcome.SUCCEEDED),
        ("gpu-3", 30, NodeOutcome.ROLLED_BACK),
    ):
        journal.append(StepStarted(name, 0, "preflight", 1))
        times["now"] += timedelta(seconds=seconds)
        journal.append(StepFinished(name, 0, "preflight", 1, StepOutcome.DONE))
        journal.append(NodeFinished(name, outcome))
    journal.close()
    assert measured_durations(tmp_path, "mirror") == {"gpu-1": 95.0, "gpu-2": 105.0}
    assert measured_durations(tmp_path, "another-plan") == {}


def test_rollout_plan_prints_the_forecast(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ROLLOUT_STATE_DIR", str(tmp_path / "state"))
    plan = tmp_path / "plan.yaml"
    window = '  maintenance_window: {start: "22:00", end: "22:03"}\n'
    plan.write_text((REPO / "examples" / "plan.yaml").read_text() + window)
    assert main(["plan", str(plan), "--facts", str(FACTS), "--color", "never"]) == 0
    text = capsys.readouterr().out
    assert "forecast: " in text and "window(s) needed" in text
    assert main(["plan", str(plan), "--facts", str(FACTS), "--output", "json"]) == 0
    data = json.loads(capsys.readouterr().out)["forecast"]
    assert data["window_length_s"] == 180
    assert sorted(n for w in data["windows"] for n in w["nodes"]) == [
        "gpu-a-1",
        "gpu-a-2",
        "gpu-a-3",
        "gpu-b-1",
    ]
    assert main(["plan", str(plan), "--facts", str(FACTS), "--output", "markdown"]) == 0
    assert "#### Forecast" in capsys.readouterr().out


def test_the_scheduled_run_is_read_from_the_cluster_only(
    capsys: pytest.CaptureFixture[str],
) -> None:
    plan = REPO / "examples" / "plan.yaml"
    args = ["plan", str(plan), "--facts", str(FACTS), "--schedule-namespace", "rollout"]
    assert main(args) == 2
    said = capsys.readouterr().err
    assert "--schedule-namespace reads the scheduled run from the cluster" in said
    assert "pass --inventory FILE" in said
