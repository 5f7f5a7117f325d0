"""What the lab could not do is said where a user looks: a Warning event the simulation records
is also in the control plane's log, and `rollout lab status` quotes the log's latest warnings."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from rollout.lab.apiserver.registry import Registry
from rollout.lab.cli import format_status
from rollout.lab.cluster import LabStatus
from rollout.lab.controlplane_process import LOG_FILE, read_controlplane_warnings
from rollout.lab.simulation.events import EventRecorder

POD = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {"name": "smoke", "namespace": "default", "uid": "u1"},
}
NO_GRPC = "Failed to create pod sandbox: grpc is not installed"


def test_a_warning_event_is_logged_as_written(caplog: pytest.LogCaptureFixture) -> None:
    now = [100.0]
    recorder = EventRecorder(Registry(), "kubelet", "lab-node-1", clock=lambda: now[0])
    with caplog.at_level(logging.INFO, logger="rollout.lab.simulation"):
        recorder.record(POD, "Normal", "Scheduled", "assigned")  # not a warning: not logged
        recorder.record(POD, "Warning", "FailedCreatePodSandBox", NO_GRPC)
        now[0] += 1  # a repeat within repeat_s is neither written nor logged
        recorder.record(POD, "Warning", "FailedCreatePodSandBox", NO_GRPC)
        now[0] += 10  # a repeat after it bumps the count, and is logged again
        recorder.record(POD, "Warning", "FailedCreatePodSandBox", NO_GRPC)
    said = f"kubelet lab-node-1: pod default/smoke: FailedCreatePodSandBox: {NO_GRPC}"
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [("WARNING", said)] * 2


def test_lab_status_quotes_the_latest_warnings_of_the_control_planes_log(tmp_path: Path) -> None:
    lines = [
        f"2026-12-01 18:09:{i:02d},000 INFO rollout.lab.simulation: tick {i}" for i in range(9)
    ]
    lines += [
        f"2026-12-01 18:10:{i:02d},000 WARNING rollout.lab.simulation: kubelet lab-node-1: pod "
        f"default/smoke-{i}: FailedCreatePodSandBox: {NO_GRPC}"
        for i in range(6)
    ]
    lines.insert(3, "2026-12-01 18:09:59,000 ERROR rollout.lab.controlplane: cannot serve: x")
    lines.append("Traceback (most recent call last):")
    (tmp_path / LOG_FILE).write_text("\n".join(lines) + "\n")
    warnings = read_controlplane_warnings(tmp_path)
    assert len(warnings) == 5 and warnings[-1].endswith(
        f"smoke-5: FailedCreatePodSandBox: {NO_GRPC}"
    )
    assert "ERROR" in read_controlplane_warnings(tmp_path, count=7)[0]
    assert read_controlplane_warnings(tmp_path / "absent") == ()

    status = LabStatus(tmp_path, "http://127.0.0.1:1", True, (), warnings)
    text = format_status(status).splitlines()
    at = text.index(f"  its latest warnings ({tmp_path / LOG_FILE}):")
    assert text[at - 1] == "control plane: up (http://127.0.0.1:1)"
    assert text[at + 1 : at + 6] == [f"    {line}" for line in warnings]
    assert "its latest warnings" not in format_status(LabStatus(tmp_path, "u", True, ()))


def test_only_the_end_of_a_long_log_is_read(tmp_path: Path) -> None:
    warning = "2026-12-01 18:10:00,000 WARNING rollout.lab.simulation: the last one"
    # a first line cut in the middle is not taken for a line of its own
    cut = "2026-12-01 18:09:00,000 WARNING rollout.lab.simulation: " + "x" * 300_000
    (tmp_path / LOG_FILE).write_text(f"{cut}\n{warning}\n")
    assert read_controlplane_warnings(tmp_path) == (warning,)
