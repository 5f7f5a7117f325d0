"""Host-installed driver facts: what a `mode: host` driver upgrade reads of a node.

One Fact per command (command + pure parser), read alike by `rollout plan` (live, or from
recorded raw texts) and by the driver steps' drift checks:

- `DriverVersionFact`: `nvidia-smi --query-gpu=driver_version` with its exit code, so a
  "Driver/library version mismatch" or a driver that is not loaded is a state, not an error;
- `InstalledPackagesFact`: `dpkg-query -W` of the driver packages (version, dpkg status);
- `HeldPackagesFact`: `apt-mark showhold`;
- `AptVersionsFact`: `apt-cache madison`: every version the node's apt sources offer;
- `SecureBootFact`: `mokutil --sb-state` where mokutil exists;
- rollout.driver.modules: `GpuClientsFact` (`systemctl show` of nvidia-persistenced
  and nvidia-fabricmanager), `LoadedModulesFact` (`lsmod`: the nvidia modules, their users
  and reference counts), `BootIdFact` (the proof that a reboot happened).

The running kernel is `DriverKernelFact` (rollout.driver.status), read once for both.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TypeVar

from rollout.commands import CommandRunner
from rollout.driver.modules import (
    GpuClientsFact,
    LoadedModule,
    LoadedModulesFact,
    UnitState,
    parse_lsmod,
    parse_unit_states,
)
from rollout.driver.status import (
    MAX_OUTPUT_LINES,
    MISMATCH,
    DriverKernelFact,
    split_exit_code,
)
from rollout.fact import CommandFact, ShellFact, read_output

_VERSION = re.compile(r"^\d+(?:\.\d+)+$")
NO_MOKUTIL = "rollout-no-mokutil"
T = TypeVar("T")


# ------------------------------------------------------------------ nvidia-smi's version


@dataclass(frozen=True)
class DriverVersion:
    """What nvidia-smi says of the driver: its version, or why it cannot say."""

    exit_code: int
    version: str | None = None
    output: tuple[str, ...] = ()

    @property
    def mismatch(self) -> bool:
        """The library (packages) and the loaded kernel module differ."""
        return any(MISMATCH in line for line in self.output)

    @property
    def loaded(self) -> bool:
        """A driver answers (a mismatch means one is loaded, only not the installed one)."""
        return self.version is not None or self.mismatch

    def describe(self) -> str:
        if self.version is not None:
            return f"nvidia-smi reports {self.version}"
        if self.mismatch:
            return "nvidia-smi: Failed to initialize NVML: Driver/library version mismatch"
        if self.exit_code == 127:
            return "nvidia-smi is not installed"
        last = self.output[-1] if self.output else "(no output)"
        return f"nvidia-smi exited {self.exit_code}: {last}"


def parse_driver_version(text: str) -> DriverVersion:
    """The fact's output (one version line per GPU, then `rollout-exit=N`) -> DriverVersion."""
    lines, code = split_exit_code(text)
    versions = {line.strip() for line in lines if _VERSION.match(line.strip())}
    version = versions.pop() if code == 0 and len(versions) == 1 else None
    return DriverVersion(code, version, tuple(lines[-MAX_OUTPUT_LINES:]))


class DriverVersionFact(ShellFact[DriverVersion]):
    """`nvidia-smi --query-gpu=driver_version` and its exit code -> DriverVersion."""

    optional = True
    sentence = "read the driver version with nvidia-smi"
    script = (
        'nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>&1; echo "rollout-exit=$?"'
    )
    parser = staticmethod(parse_driver_version)


# ------------------------------------------------------------------ packages


@dataclass(frozen=True)
class InstalledPackage:
    """One package as dpkg knows it: its version and dpkg's status abbreviation (`ii`)."""

    name: str
    version: str
    status: str

    @property
    def installed(self) -> bool:
        """Fully installed: status `i`, no error flag (`ii `, or `hi ` when held); `iF` and
        `iU` are half-configured or unpacked, `iiR` needs reinstalling."""
        return self.status[1:2] == "i" and self.status[2:3].strip() == ""

    @property
    def present(self) -> bool:
        """Some version's files are on the node (installed, unpacked or half-configured)."""
        return bool(self.version) and self.status[1:2] in {"i", "U", "F", "W", "t"}


def parse_installed_packages(text: str) -> dict[str, InstalledPackage]:
    """`dpkg-query -W -f='${binary:Package}\\t${Version}\\t${db:Status-Abbrev}\\n'` lines."""
    found: dict[str, InstalledPackage] = {}
    for line in text.splitlines():
        parts = line.split("\t")
        if len(parts) != 3 or not parts[0].strip():
            continue
        name = parts[0].strip().split(":")[0]  # binary:Package may carry `:amd64`
        found[name] = InstalledPackage(name, parts[1].strip(), parts[2].strip())
    return found


@dataclass(frozen=True)
class PackagesFact(ShellFact[T]):
    """A fact about the named packages: its script reads their names as "$@"."""

    packages: tuple[str, ...]
    optional = True

    def command(self) -> list[str]:
        return [*super().command(), "sh", *self.packages]


class InstalledPackagesFact(PackagesFact[dict[str, InstalledPackage]]):
    """`dpkg-query -W` of the named packages -> name -> InstalledPackage (absent: unknown)."""

    sentence = "read the installed driver packages"
    script = (
        "dpkg-query -W -f='${binary:Package}\\t${Version}\\t${db:Status-Abbrev}\\n'"
        ' "$@" 2>/dev/null; true'
    )
    parser = staticmethod(parse_installed_packages)


def parse_held_packages(text: str) -> tuple[str, ...]:
    """One name per line (`:arch` dropped), sorted."""
    return tuple(sorted({w.split(":")[0] for w in text.split() if not w.startswith("W:")}))


class HeldPackagesFact(CommandFact[tuple[str, ...]]):
    """`apt-mark showhold` -> the held package names."""

    optional = True
    sentence = "read the held packages"
    argv = ("apt-mark", "showhold")
    parser = staticmethod(parse_held_packages)


@dataclass(frozen=True)
class AptVersion:
    """One version of a package the node's apt sources offer, and where from."""

    version: str
    source: str

    @property
    def upstream(self) -> str:
        """The Debian version without epoch and revision: 1:550.127.05-1~deb12u1 -> 550.127.05."""
        version = self.version.split(":", 1)[-1]
        return version.rsplit("-", 1)[0] if "-" in version else version


def parse_madison(text: str) -> dict[str, tuple[AptVersion, ...]]:
    """`apt-cache madison` lines (`name | version | source`) -> name -> versions, in order.

    Source lines (`Sources`) are left out: only binary packages install.
    """
    found: dict[str, list[AptVersion]] = {}
    for line in text.splitlines():
        parts = [p.strip() for p in line.split("|")]
        if len(parts) != 3 or not parts[0] or not parts[1] or parts[2].endswith(" Sources"):
            continue
        versions = found.setdefault(parts[0], [])
        offered = AptVersion(parts[1], parts[2])
        if offered not in versions:
            versions.append(offered)
    return {name: tuple(versions) for name, versions in found.items()}


class AptVersionsFact(PackagesFact[dict[str, tuple[AptVersion, ...]]]):
    """`apt-cache madison` of the named packages -> name -> the versions offered."""

    sentence = "read the versions the apt sources offer"
    script = 'apt-cache madison "$@" 2>&1; true'
    parser = staticmethod(parse_madison)


def matching_version(offered: tuple[AptVersion, ...], driver: str) -> AptVersion | None:
    """The first offered version whose upstream part is the driver version."""
    return next((v for v in offered if v.upstream == driver), None)


# ------------------------------------------------------------------ Secure Boot


def parse_secure_boot(text: str) -> bool | None:
    """`SecureBoot enabled` -> True, `SecureBoot disabled` -> False, anything else None."""
    for line in text.splitlines():
        words = line.strip().split()
        if len(words) == 2 and words[0] == "SecureBoot":
            return {"enabled": True, "disabled": False}.get(words[1])
    return None


class SecureBootFact(ShellFact[bool | None]):
    """`mokutil --sb-state` -> True / False; None where mokutil is missing or cannot say."""

    optional = True
    sentence = "read the Secure Boot state"
    script = (
        f"command -v mokutil >/dev/null 2>&1 || {{ echo {NO_MOKUTIL}; exit 0; }}; "
        "mokutil --sb-state 2>&1; true"
    )
    parser = staticmethod(parse_secure_boot)


# ------------------------------------------------------------------ together


@dataclass(frozen=True)
class DriverHost:
    """Everything a host-mode driver upgrade reads of one node before it starts.

    `raw` keeps each command's output by record key, so `rollout facts record` writes what
    the parsers read back (rollout.facts.recorded: `driver_host:` of node.yaml).
    """

    driver: DriverVersion
    kernel: str
    packages: Mapping[str, InstalledPackage]
    held: tuple[str, ...]
    offered: Mapping[str, tuple[AptVersion, ...]]
    secure_boot: bool | None
    clients: tuple[UnitState, ...]
    modules: tuple[LoadedModule, ...]
    raw: Mapping[str, str] = field(default_factory=dict, compare=False)


RAW_KEYS = ("nvidia_smi", "kernel", "packages", "held", "apt", "secure_boot", "clients", "lsmod")


def driver_host_from_raw(raw: Mapping[str, str]) -> DriverHost:
    """The facts from the raw outputs, key by key (RAW_KEYS); a missing key reads as empty."""

    def text(key: str) -> str:
        return raw.get(key) or ""

    return DriverHost(
        driver=parse_driver_version(text("nvidia_smi")),
        kernel=_kernel_release(text("kernel")),
        packages=parse_installed_packages(text("packages")),
        held=parse_held_packages(text("held")),
        offered=parse_madison(text("apt")),
        secure_boot=parse_secure_boot(text("secure_boot")),
        clients=parse_unit_states(text("clients")),
        modules=parse_lsmod(text("lsmod")),
        raw={k: v for k, v in raw.items() if k in RAW_KEYS},
    )


def _kernel_release(text: str) -> str:
    """The running kernel's release: the first line of DriverKernelFact's output (`uname -r`);
    "" where there is none."""
    lines = text.strip().splitlines()
    return lines[0] if lines else ""


def signed_module_package(driver: str, kernel: str) -> str:
    """The distribution-signed module package of a driver branch for a kernel (Ubuntu's
    linux-modules-nvidia-<branch>-<kernel release>)."""
    return f"linux-modules-nvidia-{driver.split('.')[0]}-{kernel}"


def read_driver_host(runner: CommandRunner, packages: tuple[str, ...], version: str) -> DriverHost:
    """Every host driver fact of one node, for a plan that installs `packages` at `version`.

    The signed module package of the running kernel is asked of apt alongside the packages.
    """
    raw = {
        "nvidia_smi": read_output(runner, DriverVersionFact()),
        "kernel": read_output(runner, DriverKernelFact()),
        "packages": read_output(runner, InstalledPackagesFact(packages)),
        "held": read_output(runner, HeldPackagesFact()),
        "secure_boot": read_output(runner, SecureBootFact()),
        "clients": read_output(runner, GpuClientsFact()),
        "lsmod": read_output(runner, LoadedModulesFact()),
    }
    kernel = _kernel_release(raw["kernel"])
    asked = packages + ((signed_module_package(version, kernel),) if kernel else ())
    raw["apt"] = read_output(runner, AptVersionsFact(asked))
    return driver_host_from_raw(raw)
