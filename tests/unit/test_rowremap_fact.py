"""The row-remap fact (`nvidia-smi --query-remapped-rows`), its recording, and the lab's stand-in
nvidia-smi answering the fact's own command from the node's row-remap state."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from rollout.containerd import ContainerdVersion
from rollout.diagnose import diagnose, plan_remedies
from rollout.diagnose.remedy import MANUAL_REASONS
from rollout.facts import ClusterFacts, FleetFacts, GpuFacts, load_recorded_facts
from rollout.facts.recording import record_fleet
from rollout.facts.rowremap import (
    RemappedRowsFact,
    parse_flag,
    parse_remapped_rows,
    remapped_rows_text,
)
from rollout.transports.kube import Pod
from tests.node_facts import containerd_node
from tests.script_modules import import_lab_script
from tests.unit.diagnose_facts import NOW

HEADER = "gpu_bus_id, remapped_rows.pending, remapped_rows.failure\n"


@pytest.mark.parametrize(
    ("text", "flag"),
    [("1", True), ("Yes", True), ("0", False), ("No", False), ("[N/A]", None), ("N/A", None)],
)
def test_flags_read_either_spelling_and_not_reported_is_none(text: str, flag: bool | None) -> None:
    assert parse_flag(text) is flag


def test_lines_by_header_without_header_and_error_lines() -> None:
    text = HEADER + "00000000:07:00.0, 0, 0\n00000000:0F:00.0, 1, No\n"
    rows = parse_remapped_rows(text)
    assert [(r.bus_id, r.pending, r.failure) for r in rows] == [
        ("00000000:07:00.0", False, False),
        ("00000000:0F:00.0", True, False),
    ]
    # another column order, as the header says; `noheader`: the queried order
    swapped = "gpu_bus_id, remapped_rows.failure, remapped_rows.pending\n00000000:07:00.0, 1, 0\n"
    assert [(r.pending, r.failure) for r in parse_remapped_rows(swapped)] == [(False, True)]
    assert parse_remapped_rows("00000000:07:00.0, Yes, No\n")[0].pending is True
    assert parse_remapped_rows("No devices were found\n") == ()
    assert parse_remapped_rows(remapped_rows_text(rows)) == rows


def test_recorded_facts_keep_the_remaps_and_the_validators_init_statuses(tmp_path: Path) -> None:
    validator = Pod.from_json(
        {
            "metadata": {
                "namespace": "gpu-operator",
                "name": "nvidia-operator-validator-x",
                "labels": {"app": "nvidia-operator-validator"},
            },
            "spec": {"nodeName": "n1", "containers": [{"name": "nvidia-operator-validator"}]},
            "status": {
                "phase": "Pending",
                "initContainerStatuses": [
                    {"name": "driver-validation", "state": {"terminated": {"exitCode": 0}}},
                    {
                        "name": "cuda-validation",
                        "restartCount": 3,
                        "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                    },
                ],
            },
        }
    )
    rows = parse_remapped_rows(HEADER + "00000000:0F:00.0, 1, 0\n")
    node = replace(
        containerd_node("n1"),
        containerd=ContainerdVersion.from_output("containerd x 1.7.24 abc\n"),
        labels={"nvidia.com/gpu.present": "true"},
        gpus=GpuFacts(count=2),
        pods=(validator,),
        remapped_rows=rows,
    )
    fleet = FleetFacts(nodes=(node,), cluster=ClusterFacts(), source="unit")
    record_fleet(fleet, tmp_path / "facts")
    (read,) = load_recorded_facts(tmp_path / "facts").nodes
    assert read.remapped_rows == rows
    assert read.pods[0].init_statuses == validator.init_statuses
    live = {(f.check, f.evidence) for f in diagnose(fleet, NOW).findings}
    recorded = {
        (f.check, f.evidence)
        for f in diagnose(load_recorded_facts(tmp_path / "facts"), NOW).findings
    }
    assert {c for c, _ in live} >= {"operator.validator-not-ready", "advertising.row-remap-pending"}
    assert recorded == live


def test_the_lab_stand_in_answers_the_facts_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    smi = import_lab_script("nvidia-smi", "lab_nvidia_smi_remaps")
    remaps = tmp_path / "row-remap-pending"
    monkeypatch.setattr(smi, "ROW_REMAP_FILE", str(remaps))
    gpus = [{"index": 0, "uuid": "GPU-a"}, {"index": 1, "uuid": "GPU-b"}]
    argv = RemappedRowsFact().command()
    fields = smi.option_value(argv[1:], "--query-remapped-rows")
    assert smi.query_remapped_rows(fields, smi.option_value(argv[1:], "--format"), gpus) == 0
    healthy = parse_remapped_rows(capsys.readouterr().out)
    assert [(r.bus_id, r.pending, r.failure) for r in healthy] == [
        ("00000000:07:00.0", False, False),
        ("00000000:0F:00.0", False, False),
    ]
    remaps.write_text("1\n")  # what `lab break row-remap-pending` writes
    assert smi.query_remapped_rows(fields, "csv", gpus) == 0
    assert [r.pending for r in RemappedRowsFact().parse(capsys.readouterr().out, "n1")] == [
        False,
        True,
    ]
    assert smi.query_remapped_rows("remapped_rows.bogus", "csv", gpus) == 2


def test_a_failed_remap_needs_a_person_who_replaces_the_gpu() -> None:
    rows = parse_remapped_rows(HEADER + "00000000:07:00.0, 0, 1\n")
    node = replace(
        containerd_node("n1"),
        labels={"nvidia.com/gpu.present": "true"},
        gpus=GpuFacts(count=1),
        remapped_rows=rows,
    )
    fleet = FleetFacts(nodes=(node,), cluster=ClusterFacts(), source="unit")
    remedies = plan_remedies(diagnose(fleet, NOW), fleet)
    mine = [
        (f.node, why) for f, why in remedies.manual if f.check == "advertising.row-remap-failed"
    ]
    assert mine == [("n1", MANUAL_REASONS["advertising.row-remap-failed"])]
    assert "have the GPU replaced" in mine[0][1]
