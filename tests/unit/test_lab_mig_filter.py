"""The lab's MIG manager follows mig-parted's `device-filter` (rollout/lab/simulation/
miglayouts.py, the lab's own rule, apart from the product's): its ConfigMap carries the GPU
Operator's per-model entries of all-balanced and all-1g.10gb, each GPU gets the entry its PCI
device id matches, and the stand-in nvidia-smi reports the ids."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from rollout.facts.gpu import parse_gpu_query
from rollout.lab.description import GpuDescription
from rollout.lab.simulation.miglayouts import (
    A100_40GB_IDS,
    A100_80GB_IDS,
    DISABLED,
    MIG_CONFIG_KEY,
    GpuLayout,
    apply_layout,
    parse_config,
    to_configmap_data,
)
from tests.script_modules import import_lab_script

A100 = "NVIDIA A100-SXM4-40GB"
GPUS = (GpuDescription(0, A100, "GPU-aaaa", 40960), GpuDescription(1, A100, "GPU-bbbb", 40960))
CONFIG = to_configmap_data()[MIG_CONFIG_KEY]
BALANCED = GpuLayout(True, (("1g.5gb", 2), ("2g.10gb", 1), ("3g.20gb", 1)))


def test_the_configmap_has_the_operators_entries_per_gpu_model() -> None:
    layouts = yaml.safe_load(CONFIG)["mig-configs"]
    assert layouts["all-balanced"] == [
        {
            "device-filter": list(A100_40GB_IDS),
            "devices": "all",
            "mig-enabled": True,
            "mig-devices": {"1g.5gb": 2, "2g.10gb": 1, "3g.20gb": 1},
        },
        {
            "device-filter": list(A100_80GB_IDS),
            "devices": "all",
            "mig-enabled": True,
            "mig-devices": {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1},
        },
    ]
    assert [e["mig-devices"] for e in layouts["all-1g.10gb"]] == [{"1g.10gb": 7}, {"1g.10gb": 4}]
    assert "0x20B210DE" in layouts["all-1g.10gb"][0]["device-filter"]


def test_each_a100_40gb_gets_its_models_entry_only() -> None:
    # the 80 GB entry's profiles would not fit a 40 GB card: it is not applied to one
    assert parse_config(CONFIG, "all-balanced", GPUS) == {0: BALANCED, 1: BALANCED}
    assert parse_config(CONFIG, "all-1g.10gb", GPUS)[0] == GpuLayout(True, (("1g.10gb", 4),))


@pytest.mark.parametrize(
    "found", ['"0x20b010de"', '["0X20B010DE"]', '["0x1EB810DE", "0x20B010DE"]']
)
def test_a_filter_as_a_string_or_a_list_in_either_case(found: str) -> None:
    text = (
        f"version: v1\nmig-configs:\n  one:\n  - device-filter: {found}\n    devices: all\n"
        "    mig-enabled: true\n    mig-devices: {7g.40gb: 1}\n"
    )
    assert parse_config(text, "one", GPUS)[1] == GpuLayout(True, (("7g.40gb", 1),))


def test_a_gpu_no_entry_matches_is_left_as_it_is() -> None:
    text = (
        'version: v1\nmig-configs:\n  t4-only:\n  - device-filter: "0x1EB810DE"\n'
        "    devices: all\n    mig-enabled: true\n    mig-devices: {7g.40gb: 1}\n"
    )
    current = apply_layout(DISABLED, "all-balanced", parse_config(CONFIG, "all-balanced", GPUS),
                           [0, 1])  # fmt: skip
    assert parse_config(text, "t4-only", GPUS, current) == {0: BALANCED, 1: BALANCED}
    assert parse_config(text, "t4-only", GPUS) == {0: GpuLayout(False), 1: GpuLayout(False)}


def test_the_lab_knows_its_gpus_pci_device_id() -> None:
    assert GPUS[0].pci_device_id == "0x20B010DE"
    assert GpuDescription(0, "NVIDIA H200", "GPU-c", 1).pci_device_id == ""


def test_nvidia_smi_reports_each_gpus_pci_device_id(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    smi = import_lab_script("nvidia-smi", "lab_nvidia_smi_filter")
    gpus = [{**g.to_json(), "pci_device_id": g.pci_device_id} for g in GPUS]
    gpus_file = tmp_path / "gpus.json"
    gpus_file.write_text(json.dumps({"gpus": gpus}))
    monkeypatch.setattr(smi, "GPUS_FILE", str(gpus_file))
    assert smi.query_gpu("index,pci.device_id", "csv,noheader", gpus, "550.90.07") == 0
    out = capsys.readouterr().out
    assert out == "0, 0x20B010DE\n1, 0x20B010DE\n"
    query = smi.query_gpu("uuid,name,driver_version,pci.device_id", "csv,noheader", gpus, "550")
    assert query == 0
    assert parse_gpu_query(capsys.readouterr().out).device_ids == ("0x20B010DE", "0x20B010DE")
