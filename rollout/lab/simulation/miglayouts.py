"""MIG layouts of the lab's stand-in GPUs: the mig-parted config, the node's applied layout, and
what the device plugin and GPU feature discovery make of it (FACTS.md "MIG manager").

The node's applied layout is the node's own state, a file on the node (LAYOUT_FILE, under
/var/lib so the control plane's simulated MIG manager writes it from the host, as the driver
container writes the driver state): the stand-in `nvidia-smi` lists the MIG devices from it,
and the simulated device plugin and GFD read it. No file: every GPU has MIG disabled.

The GPUs are A100 40GB parts: 7 compute and 8 memory slices, and the profiles below.
"""

from __future__ import annotations

import json
import uuid
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from rollout.errors import RolloutError
from rollout.lab.description import GpuDescription
from rollout.lab.simulation.gpuoperator import MIG_CONFIGMAP

LAYOUT_FILE = Path("var/lib/rollout-lab/mig-layout.json")
# A node with this file needs a reboot for a MIG mode change (`lab break mig-mode-needs-reboot`).
REBOOT_KNOB_FILE = Path("etc/rollout-lab/mig-mode-needs-reboot")
MIG_CONFIG_KEY = "config.yaml"
CONFIG_LABEL = "nvidia.com/mig.config"
STATE_LABEL = "nvidia.com/mig.config.state"
CAPABLE_LABEL = "nvidia.com/mig.capable"
STRATEGY_LABEL = "nvidia.com/mig.strategy"
DISABLED_CONFIG = "all-disabled"
GPU_RESOURCE = "nvidia.com/gpu"
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"
MIG_CAPABLE_PRODUCTS = ("NVIDIA A100-SXM4-40GB",)
COMPUTE_SLICES = 7
MEMORY_SLICES = 8


@dataclass(frozen=True)
class MigProfile:
    """One A100 40GB MIG profile: its slices and how many fit on one GPU."""

    name: str
    compute: int
    memory: int
    most: int

    @property
    def memory_mib(self) -> int:
        return int(self.name.split(".")[1].removesuffix("gb")) * 1024


PROFILES = {
    p.name: p
    for p in (
        MigProfile("1g.5gb", 1, 1, 7),
        MigProfile("1g.10gb", 1, 2, 4),
        MigProfile("2g.10gb", 2, 2, 3),
        MigProfile("3g.20gb", 3, 4, 2),
        MigProfile("4g.20gb", 4, 4, 1),
        MigProfile("7g.40gb", 7, 8, 1),
    )
}

# The lab's mig-parted config: name -> (mig-enabled, devices of each GPU).
LAB_LAYOUTS: Mapping[str, tuple[bool, Mapping[str, int]]] = {
    "all-disabled": (False, {}),
    "all-enabled": (True, {}),
    "all-1g.5gb": (True, {"1g.5gb": 7}),
    "all-2g.10gb": (True, {"2g.10gb": 3}),
    "all-3g.20gb": (True, {"3g.20gb": 2}),
    "all-7g.40gb": (True, {"7g.40gb": 1}),
}
# The GPU Operator's own default-mig-parted-config gives these layouts one entry per GPU model,
# by PCI device id (`device-filter`): name -> ((device ids, devices of each such GPU), ...).
A100_40GB_IDS = ("0x20B010DE", "0x20B110DE", "0x20F110DE", "0x20F610DE")
A100_80GB_IDS = ("0x20B210DE", "0x20B510DE")
H100_80GB_IDS = ("0x233010DE", "0x233110DE", "0x232210DE", "0x20F310DE", "0x20F510DE")
MODEL_LAYOUTS: Mapping[str, tuple[tuple[tuple[str, ...], Mapping[str, int]], ...]] = {
    "all-1g.10gb": (
        ((*H100_80GB_IDS[:3], *A100_80GB_IDS, *H100_80GB_IDS[3:]), {"1g.10gb": 7}),
        (A100_40GB_IDS, {"1g.10gb": 4}),
    ),
    "all-balanced": (
        (A100_40GB_IDS, {"1g.5gb": 2, "2g.10gb": 1, "3g.20gb": 1}),
        (A100_80GB_IDS, {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}),
    ),
}


class LayoutError(RolloutError):
    """A layout the MIG manager refuses (unknown name, a layout that does not fit)."""


@dataclass(frozen=True)
class GpuLayout:
    """What one GPU should be: MIG mode and its devices by profile (a mig-parted entry)."""

    enabled: bool
    devices: tuple[tuple[str, int], ...] = ()

    def profiles(self) -> Counter[str]:
        return Counter({name: count for name, count in self.devices if count})


@dataclass(frozen=True)
class MigDevice:
    """One MIG device on a GPU of the node."""

    gpu: int
    profile: str
    uuid: str


@dataclass(frozen=True)
class NodeLayout:
    """The MIG state of a node's GPUs: the config applied, MIG-enabled GPUs, their devices."""

    config: str
    enabled: frozenset[int]
    devices: tuple[MigDevice, ...]

    @property
    def any_enabled(self) -> bool:
        return bool(self.enabled)

    def gpu_layout(self, index: int) -> GpuLayout:
        counts = Counter(d.profile for d in self.devices if d.gpu == index)
        return GpuLayout(index in self.enabled, tuple(sorted(counts.items())))

    def to_json(self) -> dict[str, Any]:
        return {
            "config": self.config,
            "mig_enabled": sorted(self.enabled),
            "devices": [{"gpu": d.gpu, "profile": d.profile, "uuid": d.uuid} for d in self.devices],
        }


DISABLED = NodeLayout(DISABLED_CONFIG, frozenset(), ())


def to_configmap_data() -> dict[str, str]:
    """The lab's `default-mig-parted-config` data, in mig-parted's format."""
    configs: dict[str, list[dict[str, Any]]] = {
        name: [
            {
                "devices": "all",
                "mig-enabled": enabled,
                **({"mig-devices": dict(devices)} if enabled else {}),
            }
        ]
        for name, (enabled, devices) in LAB_LAYOUTS.items()
    }
    for name, entries in MODEL_LAYOUTS.items():
        configs[name] = [
            {"device-filter": list(ids), "devices": "all", "mig-enabled": True,
             "mig-devices": dict(devices)}
            for ids, devices in entries
        ]  # fmt: skip
    text = yaml.safe_dump({"version": "v1", "mig-configs": configs}, sort_keys=False)
    return {MIG_CONFIG_KEY: text}


def read_layout(root: Path | None) -> NodeLayout:
    """The node's applied layout (its file); MIG disabled everywhere when there is none."""
    if root is None:
        return DISABLED
    try:
        data = json.loads((root / LAYOUT_FILE).read_text())
    except (OSError, ValueError):
        return DISABLED
    return NodeLayout(
        config=str(data.get("config") or DISABLED_CONFIG),
        enabled=frozenset(int(i) for i in data.get("mig_enabled") or []),
        devices=tuple(
            MigDevice(int(d["gpu"]), str(d["profile"]), str(d["uuid"]))
            for d in data.get("devices") or []
        ),
    )


def write_layout(root: Path, layout: NodeLayout) -> None:
    """Write the node's layout file whole (a reader never sees half of it)."""
    path = root / LAYOUT_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(path.name + ".lab-tmp")
    temporary.write_text(json.dumps(layout.to_json(), indent=1) + "\n")
    temporary.replace(path)


def parse_config(
    text: str, name: str, gpus: Sequence[GpuDescription], current: NodeLayout = DISABLED
) -> dict[int, GpuLayout]:
    """The layout `name` of a mig-parted config for each GPU index; LayoutError when the
    config lacks the name or a GPU cannot hold what it asks (`assert --valid-config`).

    As mig-parted walks them: each entry in order, on every GPU its `device-filter` (the
    GPU's PCI device id, or one of a list; none: any GPU) and its `devices` select, so the
    last such entry decides a GPU; a GPU no entry selects stays as it is (`current`)."""
    try:
        document = yaml.safe_load(text) or {}
    except yaml.YAMLError as error:
        raise LayoutError(f"the mig-parted config is not YAML: {error}") from error
    configs = document.get("mig-configs") if isinstance(document, Mapping) else None
    entries = (configs or {}).get(name) if isinstance(configs, Mapping) else None
    if not isinstance(entries, list):
        raise LayoutError(f"the mig-parted config has no layout {name!r}")
    wanted = {gpu.index: current.gpu_layout(gpu.index) for gpu in gpus}
    for entry in entries:
        if not isinstance(entry, Mapping):
            raise LayoutError(f"layout {name!r}: an entry is not a mapping")
        for gpu in gpus:
            if _selects(entry, gpu):
                wanted[gpu.index] = _gpu_layout(entry, name)
    for gpu in gpus:
        if wanted[gpu.index].profiles() and gpu.product not in MIG_CAPABLE_PRODUCTS:
            raise LayoutError(f"GPU {gpu.index} ({gpu.product}) is not MIG capable")
    return wanted


def _selects(entry: Mapping[str, Any], gpu: GpuDescription) -> bool:
    devices = entry.get("devices", "all")
    if devices != "all" and not (isinstance(devices, list) and gpu.index in devices):
        return False
    found = entry.get("device-filter") or []
    ids = [found] if isinstance(found, str) else found
    return not ids or any(_same_id(str(i), gpu.pci_device_id) for i in ids)


def _same_id(one: str, other: str) -> bool:
    # mig-parted compares the numbers (0x20b010de is 0x20B010DE); an unreadable one matches none
    try:
        return int(one, 16) == int(other, 16)
    except ValueError:
        return False


def _gpu_layout(entry: Mapping[str, Any], name: str) -> GpuLayout:
    enabled = entry.get("mig-enabled") is True
    devices = entry.get("mig-devices") or {}
    if not isinstance(devices, Mapping):
        raise LayoutError(f"layout {name!r}: mig-devices must be a mapping")
    compute = memory = 0
    for profile, count in devices.items():
        known = PROFILES.get(str(profile))
        if known is None or not isinstance(count, int) or count < 0 or count > known.most:
            raise LayoutError(f"layout {name!r}: {count} x {profile} does not fit an A100 40GB")
        compute, memory = compute + known.compute * count, memory + known.memory * count
    if compute > COMPUTE_SLICES or memory > MEMORY_SLICES:
        raise LayoutError(f"layout {name!r} needs more slices than an A100 40GB has")
    if devices and not enabled:
        raise LayoutError(f"layout {name!r} asks for MIG devices with MIG disabled")
    return GpuLayout(enabled, tuple(sorted((str(p), int(c)) for p, c in devices.items())))


def same_gpus(current: NodeLayout, wanted: Mapping[int, GpuLayout], indices: Sequence[int]) -> bool:
    """Whether the node's GPUs already are what `wanted` asks (mig-parted's `assert`)."""
    return all(
        current.gpu_layout(i).enabled == wanted.get(i, GpuLayout(False)).enabled
        and current.gpu_layout(i).profiles() == wanted.get(i, GpuLayout(False)).profiles()
        for i in indices
    )


def mode_changes(current: NodeLayout, wanted: Mapping[int, GpuLayout]) -> bool:
    """Whether applying `wanted` switches MIG mode on or off on some GPU."""
    return any((i in current.enabled) != layout.enabled for i, layout in wanted.items())


def apply_layout(
    current: NodeLayout, name: str, wanted: Mapping[int, GpuLayout], indices: Sequence[int]
) -> NodeLayout:
    """The node's layout once `wanted` is applied: a GPU left as it was keeps its devices'
    UUIDs; a reconfigured one gets new devices, as mig-parted recreates them."""
    enabled = frozenset(i for i in indices if wanted.get(i, GpuLayout(False)).enabled)
    devices: list[MigDevice] = []
    for index in indices:
        layout = wanted.get(index, GpuLayout(False))
        if same_gpus(current, {index: layout}, [index]):
            devices.extend(d for d in current.devices if d.gpu == index)
            continue
        for profile, count in layout.devices:
            devices.extend(MigDevice(index, profile, f"MIG-{uuid.uuid4()}") for _ in range(count))
    return NodeLayout(name, enabled, tuple(devices))


def plugin_devices(
    layout: NodeLayout, gpus: Sequence[GpuDescription], strategy: str
) -> dict[str, list[tuple[int, str]]] | None:
    """What the device plugin advertises on a node with MIG enabled on some GPU, by resource:
    (GPU index, device UUID) each. None when no GPU has MIG enabled (whole GPUs, as ever).
    single: the MIG devices as nvidia.com/gpu, when every GPU is MIG-enabled with one profile
    (else none, as the real plugin refuses such a node); mixed: nvidia.com/mig-<profile> per
    profile and the GPUs with MIG disabled as nvidia.com/gpu."""
    if not layout.any_enabled:
        return None
    found: dict[str, list[tuple[int, str]]] = {}
    if strategy == "mixed":
        for gpu in gpus:
            if gpu.index not in layout.enabled:
                found.setdefault(GPU_RESOURCE, []).append((gpu.index, gpu.uuid))
        for device in layout.devices:
            resource = MIG_RESOURCE_PREFIX + device.profile
            found.setdefault(resource, []).append((device.gpu, device.uuid))
        return found
    profiles = {d.profile for d in layout.devices}
    uniform = len(profiles) <= 1 and all(g.index in layout.enabled for g in gpus)
    found[GPU_RESOURCE] = [(d.gpu, d.uuid) for d in layout.devices] if uniform else []
    return found


def is_plugin_resource(name: str) -> bool:
    """A resource the NVIDIA device plugin advertises (whole GPUs or MIG devices)."""
    return name == GPU_RESOURCE or name.startswith(MIG_RESOURCE_PREFIX)


def gfd_mig_labels(
    layout: NodeLayout, gpus: Sequence[GpuDescription], strategy: str
) -> dict[str, str]:
    """GPU feature discovery's MIG labels, over its other labels (which they may replace)."""
    if not layout.any_enabled:
        return {}
    labels = {STRATEGY_LABEL: strategy}
    if strategy == "mixed":
        for profile, count in sorted(Counter(d.profile for d in layout.devices).items()):
            labels[f"{MIG_RESOURCE_PREFIX}{profile}.count"] = str(count)
        return labels
    profiles = sorted({d.profile for d in layout.devices})
    product = "-".join(gpus[0].product.split())
    suffix = profiles[0] if len(profiles) == 1 else "INVALID"
    labels["nvidia.com/gpu.product"] = f"{product}-MIG-{suffix}"
    labels["nvidia.com/gpu.count"] = str(len(layout.devices))
    if len(profiles) == 1:
        labels["nvidia.com/gpu.memory"] = str(PROFILES[profiles[0]].memory_mib)
    return labels


def stale_gfd_labels(labels: Mapping[str, str], fresh: Mapping[str, str]) -> list[str]:
    """GFD's MIG labels on the node that its fresh labels no longer carry."""
    ours = [k for k in labels if k == STRATEGY_LABEL or _is_count_label(k)]
    return [key for key in ours if key not in fresh]


def _is_count_label(key: str) -> bool:
    return key.startswith(MIG_RESOURCE_PREFIX) and key.endswith(".count")


def mig_strategy(cluster_policy: Mapping[str, Any] | None) -> str:
    """The ClusterPolicy's spec.mig.strategy (the operator's default: single)."""
    mig = ((cluster_policy or {}).get("spec") or {}).get("mig") or {}
    return str(mig.get("strategy") or "single")


def configmap_name(cluster_policy: Mapping[str, Any] | None) -> str:
    """The mig-parted ConfigMap the MIG manager reads (spec.migManager.config.name)."""
    manager = ((cluster_policy or {}).get("spec") or {}).get("migManager") or {}
    return str((manager.get("config") or {}).get("name") or MIG_CONFIGMAP)
