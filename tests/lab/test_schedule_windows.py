"""A scheduled rollout of 6 nodes, a few nodes per maintenance window, on a lab of its own:
the CronJob fires when the plan's window opens on the lab's scaled clock, the lab runs each
Job's pod as a container of rollout's image (built from the Containerfile, pulled through the
lab's registry) in a node's containerd, and each run continues the last one's (kept in the
cluster) until every node is done. The window fits about two nodes: the first run
does two and stops with the window closing, the second continues, the third finishes. The
forecast of `rollout plan` (windows needed, nodes per window) is checked against the runs.

Days pass in seconds: the schedule clock (cronjobs.ScaledClock, the CronJobs' and the
pods' window checks, which read it from the file $ROLLOUT_TEST_CLOCK_FILE names in the
container: rollout/testclock.py; tests only) jumps to each window's opening and stops there;
it moves by the forecast's expected duration of a node as each node starts, so that on it
every node takes what the forecast says, whatever the speed of the machine running the lab."""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from rollout.cli import main
from rollout.lab.apiserver import ApiServer, Registry
from rollout.lab.cluster import LAB_FILE, Lab, bring_up_lab, tear_down_lab
from rollout.lab.description import LabDescription
from rollout.lab.simulation.cronjobs import ScaledClock
from rollout.lab.simulation.engine import Simulation
from rollout.lab.simulation.probe import RunningConfigProbe
from rollout.lab.simulation.timing import SimulationTimings
from rollout.run.cluster import find_run, journal_text
from rollout.schedule.manifests import ScheduleOptions
from rollout.transports.kube import KubeClient
from tests.examples import edited_plan
from tests.lab.labapi import fleet_args, lab_kube_client
from tests.lab.test_cluster_shared import (
    OWN_ADDRESS_PREFIX,
    lab_options,
    require_lab_prerequisites,
)
from tests.lab.test_schedule import lab_kubectl
from tests.lab.test_schedule_runs import (
    CRONJOB,
    PLAN_NAME,
    apply_ssh_secret,
    eventually,
    rollout_image_in,
    schedule_objects,
)

pytestmark = [pytest.mark.lab, pytest.mark.own_lab]

NAMESPACE = "rollout"
NODES = 6


@dataclasses.dataclass
class ScheduledLab:
    lab: Lab
    clock: ScaledClock
    image: str


@pytest.fixture(scope="module")
def scheduled(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ScheduledLab]:
    """Six nodes, and a control plane in this process whose CronJobs run on `clock`."""
    require_lab_prerequisites()
    lab_dir = tmp_path_factory.mktemp("windows") / "lab"
    options = lab_options(lab_dir, ("1.7",) * NODES, 1, OWN_ADDRESS_PREFIX)
    built = bring_up_lab(dataclasses.replace(options, controlplane=False), progress=quiet)
    clock = ScaledClock()
    server: ApiServer | None = None
    simulation: Simulation | None = None
    try:
        description = LabDescription.from_file(built.lab_dir / LAB_FILE)
        timings = SimulationTimings.from_lab(description)
        registry = Registry(pod_termination_s=timings.pod_termination_s)
        simulation = Simulation(
            registry,
            description,
            RunningConfigProbe.from_lab(description),
            timings,
            schedule_clock=clock,
        ).start()
        server = ApiServer.start(registry, built.api_host, built.api_port)
        yield ScheduledLab(built, clock, rollout_image_in(built))
    finally:
        if simulation is not None:
            simulation.stop()
        if server is not None:
            server.stop()
        tear_down_lab(lab_dir, progress=quiet)


def quiet(_: str) -> None:
    pass


def forecast_of(
    lab: Lab, plan: Path, capsys: pytest.CaptureFixture[str], *extra: str
) -> dict[str, Any]:
    capsys.readouterr()
    assert main(["plan", str(plan), *fleet_args(lab), "-o", "json", *extra]) in (0, 2)
    return dict(json.loads(capsys.readouterr().out)["forecast"])


def with_window(plan: Path, minutes: int) -> None:
    """Every day from 00:00 UTC, `minutes` long."""
    end = f"{minutes // 60:02d}:{minutes % 60:02d}"
    text = plan.read_text().replace(
        "policy:\n",
        "policy:\n  maintenance_window:\n    days: [mon, tue, wed, thu, fri, sat, sun]\n"
        f'    start: "00:00"\n    end: "{end}"\n    timezone: UTC\n',
    )
    plan.write_text(text)


def records(kube: KubeClient) -> list[dict[str, Any]]:
    found = find_run(kube, NAMESPACE, PLAN_NAME)
    if found is None:
        return []
    return [json.loads(line) for line in journal_text(found.secret).splitlines()]


def test_six_nodes_two_per_window_as_forecast(
    scheduled: ScheduledLab, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lab, clock = scheduled.lab, scheduled.clock
    plan = edited_plan(tmp_path, "mirror.registry.internal:5000", "windows.registry.internal:5000")
    # one node per wave, one at a time: the forecast's expected duration of a node
    text = plan.read_text().replace('waves: [1, "50%"]', "waves: [1]")
    plan.write_text(text)
    expected_s = forecast_of(lab, plan, capsys)["waves"][0]["expected_s"]
    # a window for about two and a half of them (whole minutes): two fit, a third does not
    minutes = max(1, round(2.5 * expected_s / 60))
    assert 2 * expected_s < minutes * 60 < 3 * expected_s, expected_s
    with_window(plan, minutes)
    forecast = forecast_of(lab, plan, capsys)
    predicted = [w["nodes"] for w in forecast["windows"]]
    assert [len(w) for w in predicted] == [2, 2, 2], forecast

    options = ScheduleOptions(image=scheduled.image, namespace=NAMESPACE)
    objects = schedule_objects(lab, plan, options)
    lab_kubectl(lab, tmp_path, "apply", "-f", "-", stdin=yaml.safe_dump_all(objects))
    apply_ssh_secret(lab, tmp_path, NAMESPACE, f"{CRONJOB}-ssh")

    day = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    done: list[list[str]] = []
    logs: list[str] = []
    with lab_kube_client(lab) as kube:
        for window in range(1, 5):
            day += timedelta(days=1)
            # The window opens, and the lab's clock stops there: it moves only as each node
            # of the run starts, by the forecast's expected duration of a node, so each node
            # takes on it what the forecast says, whatever the machine's speed.
            clock.set(day.timestamp(), scale=0)
            before = {r["node"] for r in records(kube) if r["kind"] == "node-finished"}
            job = eventually(lambda: next(iter(jobs_of(kube)[len(done) :]), None), "a Job", 60)
            started: set[str] = set()
            deadline = time.monotonic() + 300
            while (ended := job_ended(kube, job)) is None:
                assert time.monotonic() < deadline, f"run {window} did not end"
                for record in records(kube):
                    node = record.get("node")
                    if record["kind"] == "step-started" and node not in before | started:
                        started.add(node)
                        clock.advance(expected_s)
                time.sleep(0.2)
            logs.append(ended)
            journal = records(kube)
            finished = [r["node"] for r in journal if r["kind"] == "node-finished"]
            done.append([n for n in finished if n not in before])
            if journal and journal[-1]["kind"] == "run-finished":
                break
            if window == 1:  # the forecast of what is left learns from the scheduled run
                learned = forecast_of(lab, plan, capsys, "--schedule-namespace", NAMESPACE)
                assert learned["measured_nodes"] == len(done[0]), learned
        # each run: the window's nodes as forecast, and a window closing but the last
        assert done == predicted, (done, predicted, logs)
        assert all("window clos" in log for log in logs[:-1]), logs
        assert journal[-1] == {**journal[-1], "kind": "run-finished", "outcome": "succeeded"}
        assert sorted(finished) == sorted(n.name for n in lab.nodes)  # each node done once
        for node in lab.nodes:
            assert not kube.get_node(node.name).unschedulable, node.name
        said = [e.reason for e in kube.list_events(NAMESPACE) if e.reason in REASONS]
        assert sorted(said) == ["RolloutDone"] + ["WindowClosed"] * (len(done) - 1)


REASONS = ("WindowClosed", "RolloutDone", "RunHalted", "RunFailed")


def jobs_of(kube: KubeClient) -> list[str]:
    """The CronJob's Jobs, oldest first (their names grow with their schedule time)."""
    pods = kube.list_pods(NAMESPACE)
    names = {p.labels.get("job-name", "") for p in pods} - {""}
    return sorted(names, key=lambda n: int(n.rsplit("-", 1)[-1]))


def job_ended(kube: KubeClient, job: str) -> str | None:
    """The pod's log once the Job's pod has ended."""
    pods = kube.list_pods(NAMESPACE, label_selector=f"job-name={job}")
    if not pods or pods[0].phase not in ("Succeeded", "Failed"):
        return None
    return kube.read_pod_log(NAMESPACE, pods[0].name) or " "
