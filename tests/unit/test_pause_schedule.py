"""A scheduled plan's pause (`rollout pause --schedule PLAN`): the mark on the plan's
ConfigMap, and a scheduled run in a pod that exits 5 at once while it is there, against the
API emulator as the pod's service account."""

from __future__ import annotations

import pytest

from rollout.cli import main
from rollout.errors import ExitCode
from rollout.lab.apiserver import ApiServer
from rollout.run.pause import PAUSE_ANNOTATION, read_schedule_pause
from rollout.transports.kube import ConfigMap, KubeClient
from tests.examples import PLAN, REPO
from tests.unit.test_schedule_incluster import pod, server

__all__ = ["pod", "server"]  # the fixtures, used by name

PLAN_NAME = "registry-mirror"  # the example plan's metadata.name
NAMESPACE = "rollout"
INVENTORY = REPO / "examples" / "inventory" / "example.yaml"


@pytest.mark.usefixtures("pod")
def test_a_paused_schedule_makes_each_scheduled_run_exit_at_once(
    server: tuple[ApiServer, bytes], capsys: pytest.CaptureFixture[str]
) -> None:
    server[0].registry.ensure_namespace(NAMESPACE)
    with KubeClient.from_kubeconfig() as kube:
        kube.create_configmap(ConfigMap(NAMESPACE, f"rollout-{PLAN_NAME}", {"plan.yaml": "x"}))
        pause = ["pause", "--schedule", PLAN_NAME, "--reason", "vendor ticket 4711"]
        assert main(pause) == ExitCode.OK
        assert "every scheduled run exits at once" in capsys.readouterr().out
        mark = read_schedule_pause(kube, NAMESPACE, PLAN_NAME)
        assert mark is not None and mark.reason == "vendor ticket 4711"
        assert "@" in mark.by  # user@host

        # the scheduled pod's run: nothing gathered, nothing started, status 5, said why
        apply = ["apply", str(PLAN), "-i", str(INVENTORY), "--yes"]
        assert main(apply) == ExitCode.PAUSED
        err = capsys.readouterr().err
        assert f"plan {PLAN_NAME} paused by {mark.by} at " in err and "vendor ticket 4711" in err
        assert f"`rollout unpause --schedule {PLAN_NAME}`" in err
        assert main(apply) == ExitCode.PAUSED  # and the next one, until it is cleared
        capsys.readouterr()

        assert main(["unpause", "--schedule", PLAN_NAME]) == ExitCode.OK
        assert f"plan {PLAN_NAME} unpaused (was paused by " in capsys.readouterr().out
        assert read_schedule_pause(kube, NAMESPACE, PLAN_NAME) is None
        configmap = kube.get_configmap(NAMESPACE, f"rollout-{PLAN_NAME}")
        assert PAUSE_ANNOTATION not in configmap.annotations
        assert dict(configmap.data) == {"plan.yaml": "x"}  # the rest of it untouched
        assert main(["unpause", "--schedule", PLAN_NAME]) == ExitCode.OK
        assert "is not paused" in capsys.readouterr().out


def test_pause_names_a_run_or_a_schedule(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["pause", "--reason", "x"]) == ExitCode.BAD_INPUT
    assert "name a run (RUN) or a scheduled plan (--schedule PLAN)" in capsys.readouterr().err
