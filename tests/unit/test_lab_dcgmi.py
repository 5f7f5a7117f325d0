"""The lab's stand-in dcgmi: its results follow the node's stand-in GPU state, and what it
prints is what the DCGM gate reads (rollout/gates/dcgm.py)."""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType

import pytest

from rollout.gates.dcgm import DcgmStatus, parse_dcgm_output
from tests.script_modules import import_lab_script

GPUS = [
    {"index": 0, "product": "NVIDIA A100", "uuid": "GPU-aaaa"},
    {"index": 1, "product": "NVIDIA A100", "uuid": "GPU-bbbb"},
]
XID_ON_GPU_1 = "[  120.5] NVRM: Xid (PCI:0000:0F:00): 79, pid=0, GPU has fallen off the bus.\n"
APP_XID_ON_GPU_1 = "[  121.0] NVRM: Xid (PCI:0000:0F:00): 13, pid=7, Graphics Exception\n"


@pytest.fixture
def dcgmi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """The stand-in, reading a node's files under tmp_path."""
    module = import_lab_script("dcgmi", "lab_dcgmi")
    (tmp_path / "gpus.json").write_text(json.dumps({"gpus": GPUS}))
    (tmp_path / "version").write_text("550.90.07\n")
    for name, file in (
        ("GPUS_FILE", "gpus.json"),
        ("DRIVER_VERSION_FILE", "version"),
        ("KERNEL_LOG", "kern.log"),
        ("ROW_REMAP_FILE", "row-remap-pending"),
    ):
        monkeypatch.setattr(module, name, str(tmp_path / file))
    return module


def run(dcgmi: ModuleType, capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    capsys.readouterr()
    code = dcgmi.main(list(args))
    return code, capsys.readouterr().out


def test_a_healthy_node_passes_every_test_of_the_level(
    dcgmi: ModuleType, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NVIDIA_VISIBLE_DEVICES", "GPU-aaaa,GPU-bbbb")
    code, out = run(dcgmi, capsys, "diag", "-r", "2", "-j")
    reading = parse_dcgm_output(out)
    assert code == 0 and reading.failed == ()
    assert (
        reading.summary()
        == "software Pass (GPU 0, 1); pcie Pass (GPU 0, 1); memory Pass (GPU 0, 1)"
    )


def test_a_critical_xid_fails_every_test_of_that_gpu_and_an_application_one_does_not(
    dcgmi: ModuleType,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    monkeypatch.delenv("NVIDIA_VISIBLE_DEVICES", raising=False)
    (tmp_path / "kern.log").write_text(APP_XID_ON_GPU_1)
    assert run(dcgmi, capsys, "diag", "-r", "1", "-j")[0] == 0
    (tmp_path / "kern.log").write_text(APP_XID_ON_GPU_1 + XID_ON_GPU_1)
    code, out = run(dcgmi, capsys, "diag", "-r", "2", "-j")
    failed = parse_dcgm_output(out).failed
    assert code == 1
    assert [(r.test, r.gpu) for r in failed] == [("software", 1), ("pcie", 1), ("memory", 1)]
    assert "Xid 79" in failed[0].warnings[0]


def test_row_remaps_pending_fail_the_software_test_alone(
    dcgmi: ModuleType,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    # the container was given GPU 1 alone: DCGM numbers it 0
    monkeypatch.setenv("NVIDIA_VISIBLE_DEVICES", "GPU-bbbb")
    (tmp_path / "row-remap-pending").write_text("1\n")
    code, out = run(dcgmi, capsys, "diag", "-r", "medium", "-j")
    reading = parse_dcgm_output(out)
    assert code == 1
    assert [(r.test, r.gpu, r.status) for r in reading.results] == [
        ("software", 0, DcgmStatus.FAIL),
        ("pcie", 0, DcgmStatus.PASS),
        ("memory", 0, DcgmStatus.PASS),
    ]
    assert "row remapping is pending" in reading.failed[0].warnings[0]


def test_no_gpu_given_is_a_runtime_error(
    dcgmi: ModuleType, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NVIDIA_VISIBLE_DEVICES", "GPU-cccc")
    code, out = run(dcgmi, capsys, "diag", "-r", "1", "-j")
    assert code == 1
    assert json.loads(out)["DCGM Diagnostic"]["runtime_error"].startswith("Error: no GPUs")
