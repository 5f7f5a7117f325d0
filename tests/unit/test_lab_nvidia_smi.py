"""The lab's stand-in nvidia-smi as a container sees it: NVIDIA_VISIBLE_DEVICES picks the
GPUs, numbered from 0 (the simulated kubelet runs a smoke pod's command with it)."""

from __future__ import annotations

from types import ModuleType

from tests.script_modules import import_lab_script

GPUS = [
    {"index": 0, "product": "NVIDIA A100", "uuid": "GPU-aaaa"},
    {"index": 1, "product": "NVIDIA A100", "uuid": "GPU-bbbb"},
]


def stand_in() -> ModuleType:
    return import_lab_script("nvidia-smi", "lab_nvidia_smi")


def test_visible_devices_pick_and_renumber_the_gpus() -> None:
    visible = stand_in().visible
    assert visible(GPUS, None) == GPUS  # on the host: every GPU, the host's numbering
    assert visible(GPUS, "all") == GPUS
    assert visible(GPUS, "GPU-bbbb") == [{**GPUS[1], "index": 0}]
    assert visible(GPUS, "1") == [{**GPUS[1], "index": 0}]
    assert visible(GPUS, "GPU-bbbb,GPU-aaaa") == GPUS  # the node's order, not the list's
    assert visible(GPUS, "none") == [] and visible(GPUS, "void") == []
    assert visible(GPUS, "GPU-cccc") == []
