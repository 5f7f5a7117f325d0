"""Host driver facts of the node's processes and kernel: the GPU client services, the
loaded nvidia modules (lsmod) and the boot id (rollout.driver.host gathers them)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from rollout.fact import CommandFact, ProbeFailed
from rollout.inputs.wholenumber import whole_number

PERSISTENCED = "nvidia-persistenced.service"
FABRICMANAGER = "nvidia-fabricmanager.service"
GPU_CLIENT_UNITS = (PERSISTENCED, FABRICMANAGER)


# ------------------------------------------------------------------ GPU clients


@dataclass(frozen=True)
class UnitState:
    """One systemd unit: loaded at all, and running."""

    unit: str
    load_state: str
    active_state: str

    @property
    def exists(self) -> bool:
        return self.load_state not in {"not-found", ""}

    @property
    def active(self) -> bool:
        return self.active_state in {"active", "activating", "reloading"}


@dataclass(frozen=True)
class GpuClientsFact(CommandFact[tuple[UnitState, ...]]):
    """`systemctl show` of nvidia-persistenced and nvidia-fabricmanager -> UnitStates."""

    units: tuple[str, ...] = GPU_CLIENT_UNITS
    optional = True
    sentence = "read the state of nvidia-persistenced and nvidia-fabricmanager"

    def command(self) -> list[str]:
        return ["systemctl", "show", "-p", "Id,LoadState,ActiveState", "--", *self.units]

    def parse(self, text: str, host: str) -> tuple[UnitState, ...]:
        return parse_unit_states(text, self.units)


def parse_unit_states(
    text: str, units: tuple[str, ...] = GPU_CLIENT_UNITS
) -> tuple[UnitState, ...]:
    """`systemctl show` blocks (blank-line separated, any property order) -> UnitStates.

    A unit the output does not mention is reported as not found.
    """
    blocks: list[dict[str, str]] = [{}]
    for line in text.splitlines():
        if not line.strip():
            if blocks[-1]:
                blocks.append({})
            continue
        key, _, value = line.partition("=")
        blocks[-1][key.strip()] = value.strip()
    by_id = {b["Id"]: b for b in blocks if b.get("Id")}
    return tuple(
        UnitState(
            unit,
            by_id.get(unit, {}).get("LoadState", "not-found"),
            by_id.get(unit, {}).get("ActiveState", "inactive"),
        )
        for unit in units
    )


# ------------------------------------------------------------------ kernel modules


@dataclass(frozen=True)
class LoadedModule:
    """One line of lsmod: the module, its reference count and the modules using it."""

    name: str
    used: int
    users: tuple[str, ...] = ()

    @property
    def held(self) -> int:
        """References not explained by other modules: processes holding the module."""
        return max(0, self.used - len(self.users))


def parse_lsmod(text: str) -> tuple[LoadedModule, ...]:
    """`Module Size Used by` lines -> the nvidia modules (name starts with `nvidia`)."""
    modules: list[LoadedModule] = []
    for line in text.splitlines():
        words = line.split()
        count = whole_number(words[2]) if len(words) >= 3 else None
        if count is None or not words[0].startswith("nvidia"):
            continue
        users = tuple(u for u in (words[3].split(",") if len(words) > 3 else []) if u and u != "-")
        modules.append(LoadedModule(words[0], count, users))
    return tuple(modules)


class LoadedModulesFact(CommandFact[tuple[LoadedModule, ...]]):
    """`lsmod` -> the nvidia modules loaded now."""

    optional = True
    sentence = "list the loaded kernel modules"
    argv = ("lsmod",)
    parser = staticmethod(parse_lsmod)


def unload_order(modules: tuple[LoadedModule, ...]) -> list[str]:
    """The loaded nvidia modules, each after every module that uses it (rmmod's order)."""
    loaded = {m.name: m for m in modules}
    order: list[str] = []

    def visit(name: str, seen: frozenset[str]) -> None:
        if name in order or name in seen or name not in loaded:
            return
        for user in loaded[name].users:
            visit(user, seen | {name})
        order.append(name)

    for name in sorted(loaded, key=lambda n: (n == "nvidia", n)):
        visit(name, frozenset())
    return order


# ------------------------------------------------------------------ boot id


class BootIdFact(CommandFact[str]):
    """/proc/sys/kernel/random/boot_id: changes on every boot."""

    sentence = "read the boot id"
    argv = ("cat", "/proc/sys/kernel/random/boot_id")

    def parse(self, text: str, host: str) -> str:
        boot_id = text.strip()
        if not re.fullmatch(r"[0-9a-f-]{32,36}", boot_id):
            raise ProbeFailed(f"{host}: boot_id is not a UUID: {boot_id[:80]!r}")
        return boot_id
