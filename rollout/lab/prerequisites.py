"""What the lab needs from this machine, checked before anything is touched.

Each missing part is reported with what to do about it, all at once, so a fresh machine is
fixed in one pass rather than one failure at a time.
"""

from __future__ import annotations

import importlib
import os
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from rollout.containerd.binaries import BinariesMissing, find_deb
from rollout.errors import ExitCode, RolloutError
from rollout.lab.cri.protocol import (
    FETCH_CRI_API,
    INSTALL_LAB_EXTRA,
    CriUnavailable,
    load_protocol,
    missing_protocol_file,
    protocol_dir,
)
from rollout.lab.mounts import Mount, read_mounts

DEBIAN_SOURCES = Path("/etc/apt/sources.list.d/debian.sources")
SOURCES_LIST = Path("/etc/apt/sources.list")
ARCHIVE_KEYRING = Path("/usr/share/keyrings/debian-archive-keyring.gpg")

# program -> the Debian package that provides it, for the hint
PROGRAMS = {
    "systemd-nspawn": "systemd-container",
    "debootstrap": "debootstrap",
    "nsenter": "util-linux",
    "mount": "mount",
    "umount": "mount",
    "chroot": "coreutils",
    "dpkg": "dpkg",
    "dpkg-deb": "dpkg",
    "ssh": "openssh-client",
    "ssh-keygen": "openssh-client",
    # the lab's image registry (rollout.lab.registry)
    "docker-registry": "docker-registry",
    # slow and lossy node links (rollout.lab.linkshaper)
    "tc": "iproute2",
}
# The namespaces systemd-nspawn gives each node (the lab's kubelet enters them with nsenter).
NAMESPACES = ("mnt", "pid", "net", "uts", "ipc")


@dataclass(frozen=True)
class CriNeeds:
    """What the lab's kubelet needs to run pods through each node's containerd CRI: the
    Python modules of the `lab` extra (module, the distribution that provides it) and the
    CRI API compiled by scripts/fetch-cri-api (None: where the cache keeps it)."""

    modules: tuple[tuple[str, str], ...] = (
        ("grpc", "grpcio"),
        ("grpc_tools", "grpcio-tools"),
        ("google.protobuf", "protobuf"),
    )
    api_dir: Path | None = None

    def find_missing(self) -> list[Missing]:
        """The modules that do not import, else whatever keeps the compiled API from loading."""
        missing = [
            Missing(f"Python module {module} ({package})", INSTALL_LAB_EXTRA)
            for module, package in self.modules
            if not _imports(module)
        ]
        directory = self.api_dir or protocol_dir()
        if missing:  # the compiled API cannot load without them: only say whether it is there
            absent = missing_protocol_file(directory)
            if absent is not None:
                missing.append(Missing(f"compiled CRI API ({absent})", FETCH_CRI_API))
            return missing
        try:
            load_protocol(directory)
        except CriUnavailable as exc:
            missing.append(Missing("the lab kubelet's CRI client", str(exc)))
        return missing


KUBELET_CRI = CriNeeds()


@dataclass(frozen=True)
class Missing:
    """One part the lab needs that this machine lacks, and how to provide it."""

    what: str
    fix: str

    def __str__(self) -> str:
        return f"{self.what}: {self.fix}"


class PrerequisitesMissing(RolloutError):
    """The machine cannot run the lab; the message lists every missing part."""

    exit_code = ExitCode.BAD_INPUT

    def __init__(self, missing: Sequence[Missing]) -> None:
        self.missing = tuple(missing)
        lines = "\n".join(f"  - {m}" for m in self.missing)
        super().__init__(f"the lab cannot start on this machine:\n{lines}")


class MirrorNotFound(RolloutError):
    """No Debian mirror is configured in the system's apt sources."""


def find_debian_mirror() -> str:
    """The Debian mirror URI of the system's apt sources (deb822 first, then sources.list)."""
    if DEBIAN_SOURCES.is_file():
        uri = _mirror_from_deb822(DEBIAN_SOURCES.read_text())
        if uri:
            return uri
    if SOURCES_LIST.is_file():
        uri = _mirror_from_one_line(SOURCES_LIST.read_text())
        if uri:
            return uri
    raise MirrorNotFound(
        f"no Debian mirror found in {DEBIAN_SOURCES} or {SOURCES_LIST}; "
        "configure apt with a Debian mirror"
    )


def _mirror_from_deb822(text: str) -> str | None:
    # Stanzas are separated by blank lines; the security archive has its own layout and
    # cannot serve a bookworm debootstrap, so it is skipped.
    for stanza in text.split("\n\n"):
        fields: dict[str, str] = {}
        for line in stanza.splitlines():
            if ":" in line and not line.startswith((" ", "#")):
                key, _, value = line.partition(":")
                fields[key.strip().lower()] = value.strip()
        if "deb" not in fields.get("types", "").split():
            continue
        for uri in fields.get("uris", "").split():
            if "security" not in uri:
                return uri.rstrip("/")
    return None


def _mirror_from_one_line(text: str) -> str | None:
    for line in text.splitlines():
        words = line.split()
        if not words or words[0] != "deb" or "security" in line:
            continue
        for word in words[1:]:
            if "://" in word:
                return word.rstrip("/")
    return None


def find_missing(
    series: Sequence[str] = ("1.6", "1.7", "2.1"), cri: CriNeeds | None = KUBELET_CRI
) -> list[Missing]:
    """Every lab prerequisite this machine lacks (empty when the lab can run); `cri`: what
    the kubelet needs to run pods (None: nodes only, no control plane)."""
    missing: list[Missing] = []
    if os.geteuid() != 0:
        missing.append(Missing("root", "the lab mounts overlays and boots containers: run as root"))
    for program, package in PROGRAMS.items():
        if shutil.which(program) is None:
            missing.append(Missing(program, f"apt-get install {package}"))
    if cri is not None:
        missing.extend(cri.find_missing())
    if not _overlayfs_available():
        missing.append(Missing("overlayfs", "load the overlay kernel module (modprobe overlay)"))
    missing.extend(find_missing_namespaces())
    if not find_node_cgroups(read_mounts()):
        missing.append(
            Missing(
                "cgroups",
                "no cgroup2 (nor v1 name=systemd) hierarchy is mounted, which systemd in the "
                "nodes needs: mount cgroup2 on /sys/fs/cgroup",
            )
        )
    if not ARCHIVE_KEYRING.is_file():
        missing.append(Missing(str(ARCHIVE_KEYRING), "apt-get install debian-archive-keyring"))
    try:
        find_debian_mirror()
    except MirrorNotFound as exc:
        missing.append(Missing("Debian mirror", str(exc)))
    for one in series:
        try:
            find_deb(one)
        except BinariesMissing as exc:
            missing.append(Missing(f"containerd {one} package", str(exc)))
    return missing


def require_prerequisites(
    series: Sequence[str] = ("1.6", "1.7", "2.1"), cri: CriNeeds | None = KUBELET_CRI
) -> None:
    """Raise PrerequisitesMissing listing every missing part; return when all are present."""
    missing = find_missing(series, cri)
    if missing:
        raise PrerequisitesMissing(missing)


def find_missing_namespaces(proc: Path = Path("/proc")) -> list[Missing]:
    """The kinds of namespace the kernel does not offer (each node runs in its own)."""
    return [
        Missing(f"{kind} namespaces", "a kernel with namespaces (CONFIG_NAMESPACES and its kind)")
        for kind in NAMESPACES
        if not (proc / "self" / "ns" / kind).exists()
    ]


def find_node_cgroups(mounts: Sequence[Mount]) -> list[Mount]:
    """The hierarchies the nodes' systemd can run on: cgroup2, or v1's name=systemd."""
    return [
        m
        for m in mounts
        if m.fstype == "cgroup2" or (m.fstype == "cgroup" and "name=systemd" in m.options)
    ]


def _imports(module: str) -> bool:
    try:
        importlib.import_module(module)
    except ImportError:
        return False
    return True


def _overlayfs_available() -> bool:
    try:
        filesystems = Path("/proc/filesystems").read_text()
    except OSError:
        return False
    if any(line.split()[-1:] == ["overlay"] for line in filesystems.splitlines()):
        return True
    # The module may be loadable but not yet loaded; mount(8) would load it on demand.
    release = os.uname().release
    return any(Path(f"/lib/modules/{release}/kernel/fs/overlayfs").glob("overlay.ko*"))
