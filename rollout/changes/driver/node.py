"""What the host driver steps do on a node: apt, services, kernel modules and the reboot
request (the wait for the boot is shared: rollout.steps.reboot).

Each operation reads the node through the facts of the driver engine, rollout.driver.host
and rollout.driver.modules (never a second way to read them) and proves its effect by
reading them again. Raises DriverNodeError (permanent) with the command's own words;
transient SSH errors pass through to the retry policy, except while a node reboots, where
a dropped connection is what is expected and the wait goes on.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from rollout.commands import CommandResult, CommandRunner, CommandTimeout
from rollout.driver.host import (
    DriverVersion,
    DriverVersionFact,
    InstalledPackage,
    InstalledPackagesFact,
)
from rollout.driver.modules import (
    GpuClientsFact,
    LoadedModule,
    LoadedModulesFact,
    UnitState,
    unload_order,
)
from rollout.errors import RolloutError, TransientError
from rollout.facts import read_fact

APT_TIMEOUT_S = 900.0
# apt-get waits this long for another apt or dpkg (a killed run's, still finishing) to let go
APT_LOCK_WAIT_S = 300
APT_OPTIONS = (
    "-y",
    "-q",
    "--allow-downgrades",
    "--allow-change-held-packages",
    "-o",
    "Dpkg::Options::=--force-confdef",
    "-o",
    "Dpkg::Options::=--force-confold",
    "-o",
    f"DPkg::Lock::Timeout={APT_LOCK_WAIT_S}",
)
INTERRUPTED = "dpkg was interrupted"
OUTPUT_TAIL = 12


class DriverNodeError(RolloutError):
    """A driver operation on the node failed; the message carries the command's words."""


class ModulesBusy(DriverNodeError):
    """An nvidia module is held by a process: it cannot be unloaded without a reboot."""

    def __init__(self, busy: Sequence[LoadedModule]) -> None:
        self.busy = tuple(busy)
        held = ", ".join(f"{m.name} ({m.held} reference(s) held)" for m in busy)
        super().__init__(
            f"kernel module(s) in use after the operands left: {held}; something still holds "
            "the GPU (`lsof /dev/nvidia*` on the node shows what)"
        )


def _tail(result: CommandResult) -> str:
    text = "\n".join(
        line for line in (result.stdout + "\n" + result.stderr).splitlines() if line.strip()
    )
    return "\n".join(f"    {line}" for line in text.splitlines()[-OUTPUT_TAIL:])


def _failed(what: str, result: CommandResult) -> DriverNodeError:
    return DriverNodeError(
        f"{what}: `{result.command_line}` exited {result.exit_code}\n{_tail(result)}"
    )


# ------------------------------------------------------------------ packages


def read_packages(runner: CommandRunner, names: Sequence[str]) -> dict[str, InstalledPackage]:
    return read_fact(runner, InstalledPackagesFact(tuple(names)))


def read_driver(runner: CommandRunner) -> DriverVersion:
    return read_fact(runner, DriverVersionFact())


def apt_install(runner: CommandRunner, pins: Sequence[str]) -> CommandResult:
    """`apt-get install` of `name=version` pins, non-interactive, downgrades allowed; after a
    dpkg run that was interrupted (a killed run), `dpkg --configure -a` first. The result,
    even a failing one: the caller decides."""
    argv = ["env", "DEBIAN_FRONTEND=noninteractive", "apt-get", "install", *APT_OPTIONS, *pins]
    result = runner.run(argv, timeout_s=APT_TIMEOUT_S)
    if not result.ok and INTERRUPTED in result.stdout + result.stderr:
        configure = ["env", "DEBIAN_FRONTEND=noninteractive", "dpkg", "--configure", "-a"]
        runner.run(configure, timeout_s=APT_TIMEOUT_S)
        result = runner.run(argv, timeout_s=APT_TIMEOUT_S)
    return result


def apt_remove(runner: CommandRunner, names: Sequence[str]) -> None:
    if not names:
        return
    argv = ["env", "DEBIAN_FRONTEND=noninteractive", "apt-get", "remove", *APT_OPTIONS, *names]
    result = runner.run(argv, timeout_s=APT_TIMEOUT_S)
    if not result.ok:
        raise _failed(f"removing {', '.join(names)}", result)


def apt_mark(runner: CommandRunner, action: str, names: Sequence[str]) -> None:
    """`apt-mark hold|unhold` of the names."""
    if not names:
        return
    result = runner.run(["apt-mark", action, *names])
    if not result.ok:
        raise _failed(f"apt-mark {action}", result)


def check_versions(
    runner: CommandRunner, wanted: Mapping[str, str | None], what: str
) -> dict[str, InstalledPackage]:
    """Every package installed (`ii`) at its wanted version (None: not installed), or
    DriverNodeError naming each one that is not."""
    found = read_packages(runner, list(wanted))
    wrong = []
    for name, version in wanted.items():
        package = found.get(name)
        if version is None:
            if package is not None and package.present:
                wrong.append(f"{name} is {package.version} ({package.status}), expected removed")
        elif package is None or not package.installed or package.version != version:
            now = f"{package.version} ({package.status.strip()})" if package else "not installed"
            wrong.append(f"{name} is {now}, expected {version}")
    if wrong:
        raise DriverNodeError(f"{what}: " + "; ".join(wrong))
    return found


# ------------------------------------------------------------------ GPU clients


def read_clients(runner: CommandRunner) -> tuple[UnitState, ...]:
    return read_fact(runner, GpuClientsFact())


def stop_units(runner: CommandRunner, units: Sequence[str]) -> None:
    for unit in units:
        result = runner.run(["systemctl", "stop", unit])
        if not result.ok:
            raise _failed(f"stopping {unit}", result)
    still = [u.unit for u in read_clients(runner) if u.unit in units and u.active]
    if still:
        raise DriverNodeError(f"still active after `systemctl stop`: {', '.join(still)}")


def start_units(runner: CommandRunner, units: Sequence[str]) -> None:
    for unit in units:
        result = runner.run(["systemctl", "start", unit])
        if not result.ok:
            raise _failed(f"starting {unit}", result)


# ------------------------------------------------------------------ kernel modules


def read_modules(runner: CommandRunner) -> tuple[LoadedModule, ...]:
    return read_fact(runner, LoadedModulesFact())


def busy_modules(modules: Sequence[LoadedModule]) -> list[LoadedModule]:
    """The modules a process holds (references beyond those of other modules)."""
    return [m for m in modules if m.held > 0]


def unload_modules(runner: CommandRunner) -> list[str]:
    """Unload every nvidia module, users first, after a reference-count check; the names
    unloaded. ModulesBusy (nothing unloaded) when a process holds one."""
    modules = read_modules(runner)
    busy = busy_modules(modules)
    if busy:
        raise ModulesBusy(busy)
    order = unload_order(modules)
    for name in order:
        result = runner.run(["rmmod", name])
        if not result.ok:
            words = result.stdout + result.stderr
            if "in use" in words.lower():
                raise ModulesBusy([m for m in read_modules(runner) if m.name == name])
            raise _failed(f"unloading {name}", result)
    left = [m.name for m in read_modules(runner)]
    if left:
        raise DriverNodeError(f"still loaded after rmmod: {', '.join(left)}")
    return order


def load_modules(runner: CommandRunner, names: Sequence[str]) -> None:
    """modprobe the modules (the reverse of their unload order: nvidia first)."""
    for name in reversed(list(names)):
        result = runner.run(["modprobe", name])
        if not result.ok:
            raise _failed(f"loading {name}", result)


def reload_missing(runner: CommandRunner, names: Sequence[str]) -> None:
    """modprobe those of `names` (in unload order) that are not loaded now."""
    loaded = {m.name for m in read_modules(runner)}
    load_modules(
        runner, [n for n in names if n not in loaded] or (["nvidia"] if not loaded else [])
    )


# ------------------------------------------------------------------ reboot


def request_reboot(runner: CommandRunner) -> None:
    """`systemctl reboot`; a connection that drops under it is the reboot starting."""
    try:
        result = runner.run(["systemctl", "reboot"], timeout_s=30)
    except (TransientError, CommandTimeout):
        return
    if not result.ok and result.exit_code != 255:
        raise _failed("requesting the reboot", result)
