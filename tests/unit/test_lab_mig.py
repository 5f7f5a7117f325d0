"""The lab's MIG layouts (rollout/lab/simulation/miglayouts.py) and its stand-in nvidia-smi on
a node with MIG devices: the config, the node's layout file, what the device plugin and GFD
make of it under each strategy."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest
import yaml

from rollout.lab.description import GpuDescription
from rollout.lab.simulation.miglayouts import (
    DISABLED,
    LAB_LAYOUTS,
    LAYOUT_FILE,
    MIG_CONFIG_KEY,
    MODEL_LAYOUTS,
    GpuLayout,
    LayoutError,
    NodeLayout,
    apply_layout,
    gfd_mig_labels,
    mode_changes,
    parse_config,
    plugin_devices,
    read_layout,
    same_gpus,
    stale_gfd_labels,
    to_configmap_data,
    write_layout,
)
from tests.script_modules import import_lab_script

A100 = "NVIDIA A100-SXM4-40GB"
GPUS = (
    GpuDescription(0, A100, "GPU-aaaa", 40960),
    GpuDescription(1, A100, "GPU-bbbb", 40960),
)
INDICES = [0, 1]
CONFIG = to_configmap_data()[MIG_CONFIG_KEY]


def applied(name: str, current: NodeLayout = DISABLED) -> NodeLayout:
    return apply_layout(current, name, parse_config(CONFIG, name, GPUS), INDICES)


def test_the_configmap_holds_every_lab_layout_in_mig_parted_form() -> None:
    document = yaml.safe_load(CONFIG)
    assert document["version"] == "v1"
    assert list(document["mig-configs"]) == [*LAB_LAYOUTS, *MODEL_LAYOUTS]
    assert document["mig-configs"]["all-3g.20gb"] == [
        {"devices": "all", "mig-enabled": True, "mig-devices": {"3g.20gb": 2}}
    ]
    assert document["mig-configs"]["all-disabled"] == [{"devices": "all", "mig-enabled": False}]


def test_every_lab_layout_fits_an_a100() -> None:
    for name in [*LAB_LAYOUTS, *MODEL_LAYOUTS]:
        parse_config(CONFIG, name, GPUS)  # raises when it does not


@pytest.mark.parametrize(
    ("text", "why"),
    [
        (CONFIG, "no layout 'all-9g.80gb'"),
        (
            "version: v1\nmig-configs:\n  all-9g.80gb:\n  - devices: all\n    mig-enabled: true\n"
            "    mig-devices: {1g.5gb: 8}\n",
            "does not fit",
        ),
        (
            "version: v1\nmig-configs:\n  all-9g.80gb:\n  - devices: all\n    mig-enabled: true\n"
            "    mig-devices: {3g.20gb: 2, 1g.5gb: 1}\n",
            "more slices",
        ),
    ],
)
def test_an_unknown_or_oversized_layout_is_refused(text: str, why: str) -> None:
    with pytest.raises(LayoutError, match=why):
        parse_config(text, "all-9g.80gb", GPUS)


def test_a_layout_may_name_gpus_by_index() -> None:
    text = (
        "version: v1\nmig-configs:\n  half:\n  - devices: [1]\n    mig-enabled: true\n"
        "    mig-devices: {7g.40gb: 1}\n"
    )
    wanted = parse_config(text, "half", GPUS)
    layout = apply_layout(DISABLED, "half", wanted, INDICES)
    assert layout.enabled == {1}
    assert [(d.gpu, d.profile) for d in layout.devices] == [(1, "7g.40gb")]


def test_applying_makes_new_devices_and_keeps_the_unchanged_gpus_devices(tmp_path: Path) -> None:
    first = applied("all-1g.5gb")
    assert len(first.devices) == 14 and all(d.uuid.startswith("MIG-") for d in first.devices)
    assert len({d.uuid for d in first.devices}) == 14
    again = applied("all-1g.5gb", first)
    assert again.devices == first.devices  # nothing recreated
    other = applied("all-3g.20gb", first)
    assert {d.uuid for d in other.devices}.isdisjoint(d.uuid for d in first.devices)
    write_layout(tmp_path, other)
    assert read_layout(tmp_path) == other
    assert read_layout(tmp_path / "nowhere") == DISABLED
    assert read_layout(None) == DISABLED
    assert (tmp_path / LAYOUT_FILE).is_file()


def test_same_gpus_and_mode_changes_compare_the_gpus_not_the_names() -> None:
    enabled = applied("all-enabled")
    assert same_gpus(enabled, parse_config(CONFIG, "all-enabled", GPUS), INDICES)
    assert not same_gpus(enabled, parse_config(CONFIG, "all-1g.5gb", GPUS), INDICES)
    assert not mode_changes(enabled, parse_config(CONFIG, "all-1g.5gb", GPUS))
    assert mode_changes(DISABLED, parse_config(CONFIG, "all-1g.5gb", GPUS))
    assert mode_changes(enabled, {0: GpuLayout(False), 1: GpuLayout(False)})


def test_the_plugin_advertises_whole_gpus_as_ever_without_mig() -> None:
    assert plugin_devices(DISABLED, GPUS, "single") is None
    assert plugin_devices(DISABLED, GPUS, "mixed") is None
    assert gfd_mig_labels(DISABLED, GPUS, "single") == {}


def test_single_strategy_advertises_the_mig_devices_as_gpus() -> None:
    layout = applied("all-1g.5gb")
    devices = plugin_devices(layout, GPUS, "single")
    assert devices is not None and list(devices) == ["nvidia.com/gpu"]
    assert [uuid for _, uuid in devices["nvidia.com/gpu"]] == [d.uuid for d in layout.devices]
    assert gfd_mig_labels(layout, GPUS, "single") == {
        "nvidia.com/mig.strategy": "single",
        "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb",
        "nvidia.com/gpu.count": "14",
        "nvidia.com/gpu.memory": "5120",
    }


def test_single_strategy_refuses_mixed_profiles() -> None:
    layout = applied("all-balanced")
    assert plugin_devices(layout, GPUS, "single") == {"nvidia.com/gpu": []}
    labels = gfd_mig_labels(layout, GPUS, "single")
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-40GB-MIG-INVALID"


def test_mixed_strategy_advertises_each_profile_and_the_whole_gpus_left() -> None:
    text = (
        "version: v1\nmig-configs:\n  half:\n  - devices: [0]\n    mig-enabled: true\n"
        "    mig-devices: {1g.5gb: 2, 3g.20gb: 1}\n"
    )
    layout = apply_layout(DISABLED, "half", parse_config(text, "half", GPUS), INDICES)
    devices = plugin_devices(layout, GPUS, "mixed")
    assert devices is not None
    assert {k: len(v) for k, v in devices.items()} == {
        "nvidia.com/gpu": 1,
        "nvidia.com/mig-1g.5gb": 2,
        "nvidia.com/mig-3g.20gb": 1,
    }
    assert devices["nvidia.com/gpu"] == [(1, "GPU-bbbb")]
    assert gfd_mig_labels(layout, GPUS, "mixed") == {
        "nvidia.com/mig.strategy": "mixed",
        "nvidia.com/mig-1g.5gb.count": "2",
        "nvidia.com/mig-3g.20gb.count": "1",
    }


def test_gfd_drops_the_mig_labels_it_no_longer_sets() -> None:
    labels = {
        "nvidia.com/mig.strategy": "mixed",
        "nvidia.com/mig-1g.5gb.count": "7",
        "nvidia.com/mig.config": "all-1g.5gb",
        "nvidia.com/gpu.count": "1",
    }
    assert stale_gfd_labels(labels, {}) == [
        "nvidia.com/mig.strategy",
        "nvidia.com/mig-1g.5gb.count",
    ]
    assert stale_gfd_labels(labels, {"nvidia.com/mig.strategy": "single"}) == [
        "nvidia.com/mig-1g.5gb.count"
    ]


# ------------------------------------------------------------ the stand-in nvidia-smi


def stand_in() -> ModuleType:
    return import_lab_script("nvidia-smi", "lab_nvidia_smi_mig")


SMI_GPUS = [
    {"index": 0, "product": A100, "uuid": "GPU-aaaa"},
    {"index": 1, "product": A100, "uuid": "GPU-bbbb"},
]
SMI_DEVICES = [
    {"gpu": 0, "profile": "1g.5gb", "uuid": "MIG-0001"},
    {"gpu": 0, "profile": "1g.10gb", "uuid": "MIG-0002"},
    {"gpu": 1, "profile": "7g.40gb", "uuid": "MIG-0003"},
]


def test_nvidia_smi_lists_each_gpus_mig_devices(capsys: pytest.CaptureFixture[str]) -> None:
    smi = stand_in()
    smi.list_gpus(smi.with_mig(SMI_GPUS, {0, 1}, SMI_DEVICES))
    assert capsys.readouterr().out == (
        f"GPU 0: {A100} (UUID: GPU-aaaa)\n"
        "  MIG 1g.5gb      Device  0: (UUID: MIG-0001)\n"
        "  MIG 1g.10gb     Device  1: (UUID: MIG-0002)\n"
        f"GPU 1: {A100} (UUID: GPU-bbbb)\n"
        "  MIG 7g.40gb     Device  0: (UUID: MIG-0003)\n"
    )


def test_a_container_given_one_mig_device_sees_its_gpu_and_that_device(
    capsys: pytest.CaptureFixture[str],
) -> None:
    smi = stand_in()
    gpus = smi.with_mig(SMI_GPUS, {0, 1}, SMI_DEVICES)
    smi.list_gpus(smi.visible(gpus, "MIG-0002"))
    assert capsys.readouterr().out == (
        f"GPU 0: {A100} (UUID: GPU-aaaa)\n  MIG 1g.10gb     Device  0: (UUID: MIG-0002)\n"
    )
    smi.list_gpus(smi.visible(gpus, "MIG-0003"))
    assert capsys.readouterr().out == (
        f"GPU 0: {A100} (UUID: GPU-bbbb)\n  MIG 7g.40gb     Device  0: (UUID: MIG-0003)\n"
    )


def test_nvidia_smi_reports_the_mig_mode(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    smi = stand_in()
    gpus = smi.with_mig(SMI_GPUS, {1}, SMI_DEVICES[2:])
    assert smi.field_value(gpus[0], "mig.mode.current", "550.90.07", True) == "Disabled"
    assert smi.field_value(gpus[1], "mig.mode.current", "550.90.07", True) == "Enabled"
    monkeypatch.setattr(smi, "MIG_FILE", str(tmp_path / "absent.json"))
    assert smi.read_mig() == (set(), [])
    write_layout(tmp_path, applied("all-7g.40gb"))
    monkeypatch.setattr(smi, "MIG_FILE", str(tmp_path / LAYOUT_FILE))
    enabled, devices = smi.read_mig()
    assert enabled == {0, 1} and [d["profile"] for d in devices] == ["7g.40gb", "7g.40gb"]
