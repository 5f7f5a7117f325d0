"""The lab node image: one cached debootstrap tree plus one containerd layer per series.

Layout under <cache>/lab-image/<key>/ (key: a hash of every input, so a change rebuilds):

    base/                 bookworm minbase + systemd, sshd, python3, apt, runc, kmod; the
                          three containerd .debs under /opt/rollout-lab/debs; a local apt
                          repository of stand-in driver packages under /opt/rollout-lab/apt
                          (DRIVER_VERSIONS and FAILING_DRIVER, whose postinst fails), the
                          oldest driver installed
    layers/<series>/      the overlay upper left by `dpkg -i` of that containerd package on
                          top of base: a node mounts lowerdir=layers/<series>:base
    image.json            the inputs and the measured build time

The containerd packages of trixie (1.7.24) and sid (2.1.9) declare only `runc (>= 0.1.0~)` and
`libc6 (>= 2.34)`; bookworm has runc 1.1.5 and libc6 2.36, so plain `dpkg -i` satisfies them
and no dependency is forced.
"""

from __future__ import annotations

import contextlib
import email.utils
import fcntl
import hashlib
import json
import shutil
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from rollout.commands import CommandFailed, CommandResult, check
from rollout.containerd.binaries import cache_dir, find_deb
from rollout.errors import RolloutError
from rollout.lab.mounts import mount_points_below, read_mounts
from rollout.lab.prerequisites import find_debian_mirror
from rollout.transports.local import LocalRunner

SUITE = "bookworm"
PACKAGES = (
    "systemd",
    "systemd-sysv",
    "dbus",
    "openssh-server",
    "python3",
    "iproute2",
    "apt",
    "ca-certificates",
    "runc",
    # The real modprobe, rmmod, lsmod for every module but the nvidia stand-ins.
    "kmod",
)
SERIES = ("1.6", "1.7", "2.1")
DRIVER_PACKAGE = "nvidia-driver-standin"
# The stand-in driver versions the nodes' apt repository offers; each installs cleanly.
DRIVER_VERSIONS = ("535.183.01", "550.127.05", "550.144.03")
# Offered too, but its postinst always fails (a module build that fails), for failure tests.
# Lower than the newest good version, so apt's candidate stays an installable one.
FAILING_DRIVER = "550.90.07"
INSTALLED_DRIVER = DRIVER_VERSIONS[0]
# Bump when a build step changes in a way the other inputs do not capture.
RECIPE = "3"

IMAGE_DEBS_DIR = "/opt/rollout-lab/debs"
IMAGE_APT_DIR = "/opt/rollout-lab/apt"
# The driver library's version: written by the package's postinst from the version's own
# copy (<dir>/<version>/version), so a failed postinst leaves the previous library in place.
DRIVER_VERSION_FILE = "/usr/lib/rollout-lab/nvidia-driver/version"
# A node with this file fails every stand-in driver package's postinst (a per-node knob).
FAIL_POSTINST_FILE = "/etc/rollout-lab/fail-driver-postinst"
# Timers that would make nodes reach out to the network on their own.
MASKED_UNITS = ("apt-daily.timer", "apt-daily-upgrade.timer")

DEBOOTSTRAP_TIMEOUT_S = 1200.0
STEP_TIMEOUT_S = 300.0

Progress = Callable[[str], None]


class ImageBuildFailed(RolloutError):
    """The lab node image could not be built."""


@dataclass(frozen=True)
class NodeImage:
    """A node image's layout in its directory: complete once image.json is written there."""

    directory: Path
    key: str

    @property
    def base(self) -> Path:
        return self.directory / "base"

    @property
    def apt_archives(self) -> Path:
        """The .debs debootstrap installed the base from (the lab registry's images' source)."""
        return self.base / "var/cache/apt/archives"

    def layer(self, series: str) -> Path:
        """The containerd layer of one series (1.6, 1.7, 2.1)."""
        if series not in SERIES:
            raise ImageBuildFailed(f"no containerd layer {series!r}; known: {', '.join(SERIES)}")
        return self.directory / "layers" / series

    def lower_dirs(self, series: str) -> tuple[Path, ...]:
        """The overlay lower directories of a node of one series, topmost first."""
        return (self.layer(series), self.base)


def overlay_mount_argv(lower: Sequence[Path], upper: Path, work: Path, merged: Path) -> list[str]:
    """The mount argv of an overlay: `lower` (topmost first) under `upper`, seen at `merged`."""
    options = f"lowerdir={':'.join(str(p) for p in lower)},upperdir={upper},workdir={work}"
    return ["mount", "-t", "overlay", "overlay", "-o", options, str(merged)]


def image_root() -> Path:
    """Where node images are cached."""
    return cache_dir() / "lab-image"


def compute_image_key() -> str:
    """A hash of every input of the image: recipe, packages, containerd debs, driver sources."""
    debs = {series: find_deb(series) for series in SERIES}
    inputs = {
        "recipe": RECIPE,
        "suite": SUITE,
        "packages": PACKAGES,
        # Debian package files are named by version; the size guards against a truncated copy.
        "debs": {s: [p.name, p.stat().st_size] for s, p in debs.items()},
        "driver_versions": DRIVER_VERSIONS,
        "failing_driver": FAILING_DRIVER,
        "installed_driver": INSTALLED_DRIVER,
        "driver_control": _data_text("driver/control.in"),
        "driver_postinst": _data_text("driver/postinst.in"),
        "driver_postrm": _data_text("driver/postrm.in"),
    }
    blob = json.dumps(inputs, sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def find_image() -> NodeImage | None:
    """The cached image for the current inputs, or None when it must be built."""
    key = compute_image_key()
    directory = image_root() / key
    if (directory / "image.json").is_file():
        return NodeImage(directory=directory, key=key)
    return None


def build_image(progress: Progress = print) -> NodeImage:
    """Return the cached node image, building it first when missing (idempotent, locked)."""
    root = image_root()
    root.mkdir(parents=True, exist_ok=True)
    with build_lock(root / ".lock", progress):
        found = find_image()
        if found is not None:
            return found
        key = compute_image_key()
        partial = root / f"{key}.partial"
        _remove_tree(partial)
        started = time.monotonic()
        try:
            _build_into(NodeImage(directory=partial, key=key), progress)
        except (CommandFailed, OSError) as exc:
            _unmount_below(partial)
            raise ImageBuildFailed(
                f"building the lab node image in {partial} failed: {exc}\n"
                "  the partial tree is left there for inspection; the next build removes it"
            ) from exc
        elapsed_s = time.monotonic() - started
        record = {"key": key, "suite": SUITE, "build_s": round(elapsed_s, 1)}
        (partial / "image.json").write_text(json.dumps(record, indent=2) + "\n")
        final = root / key
        partial.rename(final)
        progress(f"lab image: built {final} in {elapsed_s:.0f}s")
        _prune_images(root, keep=key, progress=progress)
        return NodeImage(directory=final, key=key)


@contextlib.contextmanager
def build_lock(path: Path, progress: Progress) -> Iterator[None]:
    """Hold the build lock at path (flock), saying so when another build holds it."""
    with path.open("a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            progress(f"waiting for another build to finish ({path})")
            fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _build_into(image: NodeImage, progress: Progress) -> None:
    runner = LocalRunner()
    partial, base = image.directory, image.base
    partial.mkdir(parents=True)
    mirror = find_debian_mirror()
    progress(f"lab image: debootstrap {SUITE} from {mirror} (a minute or two)")
    argv = [
        "debootstrap",
        "--variant=minbase",
        "--include=" + ",".join(PACKAGES),
        SUITE,
        str(base),
        mirror,
    ]
    _run(runner, argv, "debootstrap", timeout_s=DEBOOTSTRAP_TIMEOUT_S)

    progress("lab image: configuring the base tree")
    _configure_base(base)

    versions = ", ".join((*DRIVER_VERSIONS, f"{FAILING_DRIVER} (fails)"))
    progress(f"lab image: building the stand-in driver repository ({versions})")
    _build_driver_repository(runner, partial / "driver-build", base / IMAGE_APT_DIR.lstrip("/"))
    _chroot(runner, base, ["apt-get", "-q", "update"], "apt-get update of the local repository")
    _chroot(
        runner,
        base,
        ["apt-get", "-q", "-y", "install", f"{DRIVER_PACKAGE}={INSTALLED_DRIVER}-1"],
        f"installing {DRIVER_PACKAGE} {INSTALLED_DRIVER}",
    )
    shutil.rmtree(partial / "driver-build")

    for series in SERIES:
        progress(f"lab image: containerd {series} layer (dpkg -i {find_deb(series).name})")
        _build_containerd_layer(runner, image, series)


def _configure_base(base: Path) -> None:
    # Per-node identity is written at node creation: host keys, machine id, hostname.
    for key in (base / "etc/ssh").glob("ssh_host_*"):
        key.unlink()
    (base / "etc/machine-id").write_text("")
    (base / "etc/hostname").write_text("")
    # Nodes install only from the local repository: upgrades stay offline and fast.
    sources = base / "etc/apt/sources.list"
    if sources.exists():
        sources.unlink()
    for unit in MASKED_UNITS:
        link = base / "etc/systemd/system" / unit
        link.unlink(missing_ok=True)
        link.symlink_to("/dev/null")
    (base / "var/lib/rollout-lab").mkdir(parents=True, exist_ok=True)
    debs = base / IMAGE_DEBS_DIR.lstrip("/")
    debs.mkdir(parents=True)
    for series in SERIES:
        shutil.copy2(find_deb(series), debs / find_deb(series).name)
    sources_d = base / "etc/apt/sources.list.d"
    sources_d.mkdir(parents=True, exist_ok=True)
    (sources_d / "rollout-lab.list").write_text(f"deb [trusted=yes] file:{IMAGE_APT_DIR} ./\n")


def _build_driver_repository(runner: LocalRunner, staging: Path, repository: Path) -> None:
    repository.mkdir(parents=True)
    stanzas: list[str] = []
    for version in sorted((*DRIVER_VERSIONS, FAILING_DRIVER), key=_version_key):
        tree = staging / version
        (tree / "DEBIAN").mkdir(parents=True)
        control = _driver_text("driver/control.in", version)
        (tree / "DEBIAN/control").write_text(control)
        for script in ("postinst", "postrm"):
            (tree / "DEBIAN" / script).write_text(_driver_text(f"driver/{script}.in", version))
            (tree / "DEBIAN" / script).chmod(0o755)
        library = Path(DRIVER_VERSION_FILE).parent / version / "version"
        version_file = tree / str(library).lstrip("/")
        version_file.parent.mkdir(parents=True)
        version_file.write_text(version + "\n")
        deb = repository / f"{DRIVER_PACKAGE}_{version}-1_all.deb"
        _run(
            runner,
            ["dpkg-deb", "--root-owner-group", "--build", str(tree), str(deb)],
            f"building {deb.name}",
        )
        stanzas.append(_packages_stanza(control, deb))
    packages = "\n".join(stanzas)
    (repository / "Packages").write_text(packages)
    digest = hashlib.sha256(packages.encode()).hexdigest()
    size = len(packages.encode())
    # apt warns about a Release file without a Date.
    date = email.utils.formatdate(usegmt=True)
    (repository / "Release").write_text(
        "Origin: rollout-lab\nLabel: rollout-lab\nSuite: lab\nCodename: lab\n"
        f"Date: {date}\nArchitectures: all amd64\nSHA256:\n {digest} {size} Packages\n"
    )


def _driver_text(template: str, version: str) -> str:
    fails = version == FAILING_DRIVER
    why = "this version's postinst always fails" if fails else f"{FAIL_POSTINST_FILE} exists"
    text = _data_text(template).replace("@VERSION@", version)
    return text.replace("@FAILS@", "yes" if fails else "no").replace("@WHY@", why)


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


def _packages_stanza(control: str, deb: Path) -> str:
    """The Packages index entry of one .deb: its control fields plus where and what it is."""
    data = deb.read_bytes()
    fields = control.rstrip("\n")
    extra = (
        f"Filename: ./{deb.name}\n"
        f"Size: {len(data)}\n"
        f"MD5sum: {hashlib.md5(data).hexdigest()}\n"
        f"SHA256: {hashlib.sha256(data).hexdigest()}\n"
    )
    # Description must stay last: its continuation lines belong to it.
    head, sep, description = fields.partition("\nDescription:")
    return head + "\n" + extra + (sep.lstrip("\n") + description if sep else "") + "\n"


def _build_containerd_layer(runner: LocalRunner, image: NodeImage, series: str) -> None:
    layer = image.layer(series)
    work = image.directory / f"work-{series}"
    merged = image.directory / f"mnt-{series}"
    for directory in (layer, work, merged):
        directory.mkdir(parents=True)
    _run(runner, overlay_mount_argv((image.base,), layer, work, merged), "mount")
    try:
        deb = f"{IMAGE_DEBS_DIR}/{find_deb(series).name}"
        _chroot(runner, merged, ["dpkg", "-i", deb], f"dpkg -i containerd {series}")
    finally:
        _run(runner, ["umount", str(merged)], "umount")
    merged.rmdir()
    shutil.rmtree(work)


def _chroot(runner: LocalRunner, root: Path, argv: Sequence[str], what: str) -> CommandResult:
    # A package's postinst sees no /run/systemd/system in a chroot, so it enables units
    # without starting them on this machine.
    env_argv = ["chroot", str(root), "/usr/bin/env", "DEBIAN_FRONTEND=noninteractive", *argv]
    return _run(runner, env_argv, what)


def _run(
    runner: LocalRunner, argv: Sequence[str], what: str, *, timeout_s: float = STEP_TIMEOUT_S
) -> CommandResult:
    return check(runner.run(argv, timeout_s=timeout_s), what)


def _data_text(name: str) -> str:
    return resources.files("rollout.lab").joinpath("data", name).read_text()


def _unmount_below(directory: Path) -> None:
    for mount_point in reversed(mount_points_below(directory)):
        LocalRunner().run(["umount", "-l", str(mount_point)])


def _prune_images(root: Path, *, keep: str, progress: Progress) -> None:
    """Remove images of older inputs that no mounted overlay still uses."""
    options = [option for mount in read_mounts() for option in mount.options]
    for candidate in root.iterdir():
        if candidate.name in {keep, ".lock"} or not candidate.is_dir():
            continue
        if any(str(candidate) in option for option in options) or mount_points_below(candidate):
            continue
        progress(f"lab image: removing the outdated image {candidate}")
        _remove_tree(candidate)


def _remove_tree(path: Path) -> None:
    if path.exists():
        _unmount_below(path)
        shutil.rmtree(path)
