"""The MIG layout engine, pure: the MIG manager's mig-parted config, the MIG profiles of each
GPU product, whether a layout fits a GPU, the devices it makes and what the device plugin
advertises for them under the ClusterPolicy's MIG strategy.

The config is the one the GPU Operator's MIG manager reads (ConfigMap
`default-mig-parted-config`, key `config.yaml`): `version: v1` and `mig-configs`, each name
a list of entries `{device-filter: ID | [IDs], devices: all | [indices], mig-enabled: bool,
mig-devices: {profile: N}}`.
An entry applies to the GPUs its `device-filter` matches (PCI device ids as nvidia-smi prints
`pci.device_id`, `0x20B010DE`; compared as numbers, so case does not matter; no filter matches
every GPU) and its `devices` selects by index. This is mig-parted's rule (its
WalkSelectedMigConfigForEachGPU and MigConfigSpec.MatchesDeviceFilter): the entries are
applied in order to each GPU they match, so the last that matches a GPU decides it, and a GPU
no entry matches is left as it is.
The profile tables are NVIDIA's MIG user guide's ("Supported MIG Profiles"): a GPU has 7
compute slices and 8 memory slices; each profile takes some of each and has a most it can be
made. The fit counts slices; the hardware's placement rules can still refuse a layout that
fits by count, which the MIG manager then reports as `failed`.
"""

from __future__ import annotations

import enum
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rollout.facts.migmode import MigConfigError, read_layout_entries
from rollout.operatornames import GPU_RESOURCE, MIG_RESOURCE_PREFIX

COMPUTE_SLICES = 7
MEMORY_SLICES = 8
_PROFILE_NAME = re.compile(r"^(?P<compute>\d)g\.(?P<memory_gb>\d+)gb$")


class MigStrategy(enum.Enum):
    """The ClusterPolicy's `mig.strategy`: how the device plugin advertises MIG devices."""

    SINGLE = "single"
    MIXED = "mixed"


@dataclass(frozen=True)
class MigProfile:
    """One MIG profile of one GPU product: the slices it takes and how many a GPU holds."""

    name: str
    compute: int
    memory: int
    most: int

    @property
    def memory_gb(self) -> int:
        match = _PROFILE_NAME.match(self.name)
        return int(match["memory_gb"]) if match else 0


def _profiles(gb_per_slice: int) -> Mapping[str, MigProfile]:
    # the same six shapes on A100 and H100; the names say the memory of the card's slices
    shapes = ((1, 1, 7), (1, 2, 4), (2, 2, 3), (3, 4, 2), (4, 4, 1), (7, 8, 1))
    made = (
        MigProfile(f"{compute}g.{memory * gb_per_slice}gb", compute, memory, most)
        for compute, memory, most in shapes
    )
    return {p.name: p for p in made}


@dataclass(frozen=True)
class GpuModel:
    """A MIG-capable GPU product: its memory and its profiles."""

    family: str
    memory_gb: int
    profiles: Mapping[str, MigProfile]


A100_40GB = GpuModel("A100 40GB", 40, _profiles(5))
A100_80GB = GpuModel("A100 80GB", 80, _profiles(10))
H100_80GB = GpuModel("H100 80GB", 80, _profiles(10))
# nvidia-smi's product names (--query-gpu=name) of each model, as the driver prints them
GPU_MODELS: Mapping[str, GpuModel] = {
    "NVIDIA A100-SXM4-40GB": A100_40GB,
    "NVIDIA A100-PCIE-40GB": A100_40GB,
    "NVIDIA A100-SXM4-80GB": A100_80GB,
    "NVIDIA A100 80GB PCIe": A100_80GB,
    "NVIDIA H100 80GB HBM3": H100_80GB,
    "NVIDIA H100 PCIe": H100_80GB,
}


def gpu_model(product: str) -> GpuModel | None:
    """The MIG model of a product nvidia-smi names; None for one rollout has no table of."""
    return GPU_MODELS.get(product.strip())


class UnknownDeviceId(MigConfigError):
    """An entry filters GPUs by PCI device id and the node's ids were not read."""


def parse_device_id(text: str) -> int | None:
    """`0x20B010DE` (either case) -> its number, read as mig-parted reads it (a 32-bit number
    with Go's base prefixes); None where that fails (a filter it cannot read matches no GPU)."""
    try:
        number = int(text, 0)
    except ValueError:
        return None
    return number if 0 <= number <= 0xFFFFFFFF else None


@dataclass(frozen=True)
class LayoutEntry:
    """One entry of a layout: the GPUs it selects (devices None: all; device_filter None:
    every model, else the PCI device ids it matches) and what they become."""

    devices: tuple[int, ...] | None
    mig_enabled: bool
    mig_devices: Mapping[str, int]
    device_filter: tuple[int | None, ...] | None = None

    def selects(self, index: int, device_id: str | None = None) -> bool:
        """Whether the entry applies to GPU `index` of PCI device id `device_id`;
        UnknownDeviceId where it filters by id and the id is not known."""
        if self.devices is not None and index not in self.devices:
            return False
        if self.device_filter is None:
            return True
        if device_id is None:
            raise UnknownDeviceId(f"GPU {index}: its PCI device id is not known")
        return parse_device_id(device_id) in self.device_filter


DISABLED = LayoutEntry(None, False, {})


@dataclass(frozen=True)
class MigLayout:
    """One named layout of the MIG manager's config."""

    name: str
    entries: tuple[LayoutEntry, ...]

    def for_gpu(self, index: int, device_id: str | None = None) -> LayoutEntry | None:
        """The entry that applies to GPU `index` of PCI device id `device_id` (mig-parted
        applies them in order, so the last that selects it decides); None where no entry
        selects it."""
        chosen = [e for e in self.entries if e.selects(index, device_id)]
        return chosen[-1] if chosen else None


@dataclass(frozen=True)
class MigConfig:
    """The MIG manager's config: its layouts by name."""

    layouts: Mapping[str, MigLayout]

    def names(self) -> list[str]:
        return sorted(self.layouts)


def parse_mig_config(text: str) -> MigConfig:
    """`config.yaml` of the MIG manager's ConfigMap -> MigConfig; MigConfigError where it is
    not mig-parted's v1 shape."""
    entries = read_layout_entries(text)
    return MigConfig({name: _parse_layout(name, v) for name, v in entries.items()})


def _parse_layout(name: str, entries: Any) -> MigLayout:
    if not isinstance(entries, Sequence) or isinstance(entries, str):
        raise MigConfigError(f"layout {name}: expected a list of entries")
    return MigLayout(name, tuple(_parse_entry(name, entry) for entry in entries))


def _parse_entry(name: str, entry: Any) -> LayoutEntry:
    if not isinstance(entry, Mapping):
        raise MigConfigError(f"layout {name}: an entry is not a mapping")
    devices = entry.get("devices", "all")
    if devices == "all":
        selected: tuple[int, ...] | None = None
    elif isinstance(devices, Sequence) and all(type(d) is int for d in devices):
        selected = tuple(devices)
    else:
        raise MigConfigError(f"layout {name}: devices must be 'all' or a list of GPU indices")
    enabled = entry.get("mig-enabled")
    if not isinstance(enabled, bool):
        raise MigConfigError(f"layout {name}: mig-enabled must be true or false")
    made = entry.get("mig-devices") or {}
    if not isinstance(made, Mapping) or not all(type(n) is int and n >= 0 for n in made.values()):
        raise MigConfigError(f"layout {name}: mig-devices must map profiles to counts")
    counts = {str(k): v for k, v in made.items() if v}
    return LayoutEntry(selected, enabled, counts, _parse_filter(name, entry.get("device-filter")))


def _parse_filter(name: str, found: Any) -> tuple[int | None, ...] | None:
    # mig-parted: an empty filter (absent, "" or []) matches every GPU
    ids = ([found] if found else []) if isinstance(found, str) else found
    if not ids:
        return None
    if not isinstance(ids, Sequence) or not all(isinstance(i, str) for i in ids):
        raise MigConfigError(f"layout {name}: device-filter must be a PCI device id or a list")
    if any(":" in i for i in ids):
        raise MigConfigError(
            f"layout {name}: device-filter {found!r} names a subsystem id; rollout reads "
            "each GPU's pci.device_id only"
        )
    return tuple(parse_device_id(i) for i in ids)


def check_fit(
    layout: MigLayout, model: GpuModel, gpus: int, device_ids: Sequence[str] | None = None
) -> list[str]:
    """Why the layout does not fit the node's GPUs, one line per GPU and reason; [] when it
    does: each profile one of the model's, at most its most, within 7 compute and 8 memory
    slices; devices only on a GPU with MIG enabled. UnknownDeviceId where an entry filters
    by PCI device id and `device_ids` (by GPU index) is None."""
    problems: list[str] = []
    for index in range(gpus):
        entry = layout.for_gpu(index, device_id_of(device_ids, index))
        if entry is None or not entry.mig_devices:
            continue
        where = f"GPU {index} ({model.family})"
        if not entry.mig_enabled:
            problems.append(f"{where}: mig-devices with mig-enabled: false")
            continue
        unknown = [p for p in entry.mig_devices if p not in model.profiles]
        if unknown:
            problems.append(
                f"{where}: no profile {', '.join(unknown)} (it has {', '.join(model.profiles)})"
            )
            continue
        profiles = [(model.profiles[p], n) for p, n in entry.mig_devices.items()]
        problems.extend(
            f"{where}: {n} x {p.name}, at most {p.most} per GPU" for p, n in profiles if n > p.most
        )
        compute = sum(p.compute * n for p, n in profiles)
        memory = sum(p.memory * n for p, n in profiles)
        if compute > COMPUTE_SLICES or memory > MEMORY_SLICES:
            problems.append(
                f"{where}: {describe_devices(entry.mig_devices)} takes {compute} compute and "
                f"{memory} memory slices, a GPU has {COMPUTE_SLICES} and {MEMORY_SLICES}"
            )
    return problems


def describe_devices(devices: Mapping[str, int]) -> str:
    """`2 x 1g.5gb + 1 x 2g.10gb`; `no MIG devices` for none."""
    return " + ".join(f"{n} x {p}" for p, n in devices.items()) or "no MIG devices"


def device_id_of(device_ids: Sequence[str] | None, index: int) -> str | None:
    """GPU `index`'s PCI device id; None where the ids were not read, or nvidia-smi did not
    list that GPU."""
    return device_ids[index] if device_ids is not None and index < len(device_ids) else None


def gpu_entries(
    layout: MigLayout,
    gpus: int,
    current: MigLayout | None = None,
    device_ids: Sequence[str] | None = None,
) -> tuple[LayoutEntry, ...]:
    """What each of the node's GPUs becomes: the layout's entry for it; a GPU it does not
    select keeps what the current layout made of it (MIG disabled where that is unknown).
    UnknownDeviceId where a layout filters by PCI device id and `device_ids` is None."""

    def entry(index: int) -> LayoutEntry:
        device_id = device_id_of(device_ids, index)
        chosen = layout.for_gpu(index, device_id)
        kept = current.for_gpu(index, device_id) if current and chosen is None else None
        return chosen or kept or DISABLED

    return tuple(entry(i) for i in range(gpus))


def mixed_profiles(entries: Sequence[LayoutEntry]) -> list[str]:
    """The distinct kinds of device the node's GPUs would hold: each MIG profile, and
    `MIG disabled` for a GPU without MIG; more than one is a mixed layout."""
    kinds: dict[str, None] = {}
    for entry in entries:
        if not entry.mig_enabled:
            kinds["MIG disabled"] = None
        kinds.update(dict.fromkeys(entry.mig_devices))
    return list(kinds)


def advertised_resources(entries: Sequence[LayoutEntry], strategy: MigStrategy) -> dict[str, int]:
    """The GPU resources the device plugin advertises for the GPUs' entries.

    mixed: `nvidia.com/mig-<profile>` per MIG device, `nvidia.com/gpu` per GPU without MIG;
    single: `nvidia.com/gpu` per MIG device, or per GPU where MIG is disabled (the planner
    refuses a single-strategy layout of more than one kind, mixed_profiles).
    """
    made: Counter[str] = Counter()
    for entry in entries:
        if not entry.mig_enabled:
            made[GPU_RESOURCE] += 1
            continue
        for profile, count in entry.mig_devices.items():
            name = GPU_RESOURCE if strategy is MigStrategy.SINGLE else MIG_RESOURCE_PREFIX + profile
            made[name] += count
    return dict(made)


def unused_memory(entries: Sequence[LayoutEntry], model: GpuModel) -> list[str]:
    """Per distinct entry, the card memory its MIG devices leave unused (7 x 1g.5gb makes
    35 of an A100 40GB's 40 GB); a reviewer's caveat of the forecast."""
    notes: dict[str, None] = {}
    for entry in entries:
        if not entry.mig_enabled:
            continue
        used = sum(
            model.profiles[p].memory_gb * n
            for p, n in entry.mig_devices.items()
            if p in model.profiles
        )
        if used < model.memory_gb:
            notes[
                f"{describe_devices(entry.mig_devices)} makes MIG devices of {used} of each "
                f"{model.family}'s {model.memory_gb} GB"
            ] = None
    return list(notes)
