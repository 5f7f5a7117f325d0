"""One lab node: an overlay over the cached image, booted with `systemd-nspawn --boot`.

A node shares the host's network namespace; its sshd listens on its own loopback address
(127.0.1.N needs no `ip addr add`: Linux routes all of 127.0.0.0/8 to lo). nspawn runs
without machined (`--register=no`), as a background process whose pid is kept in the node
directory, under a supervisor (rollout.lab.nodeprocess) that boots it again after a reboot:
stopping is SIGTERM to the supervisor, which passes it to nspawn, which turns it into an
orderly poweroff of the container (SIGRTMIN+3 to its systemd); then the overlay is unmounted.

Node directory (<lab-dir>/nodes/<name>/): upper/ and work/ (the overlay's writable side),
merged/ (the node's root filesystem as the host sees it), containerd/ (the node's
/var/lib/containerd, bound in: snapshots cannot live on the overlay), console.log, nspawn.pid (the
nspawn of the current boot) and supervisor.pid (rollout.lab.nodeprocess, which boots the
node again when it reboots: nspawn's exit status 133, as systemd-nspawn@.service does).
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import tomllib
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import tomli_w

from rollout.commands import CommandResult, check
from rollout.containerd import HostEndpoint, hosts_toml_path, render_hosts_toml
from rollout.containerd.version import CRI_IMAGES, CRI_V2
from rollout.errors import RolloutError
from rollout.lab.description import LabNode
from rollout.lab.image import DRIVER_VERSION_FILE, NodeImage, overlay_mount_argv
from rollout.lab.mounts import is_mounted, read_mounts
from rollout.lab.nodedriver import install_driver_stand_ins
from rollout.lab.nodeprocess import (
    CONSOLE_LOG,
    NSPAWN_PID_FILE,
    SUPERVISOR_PID_FILE,
    remove_cgroup,
)
from rollout.lab.toolkit import install_toolkit
from rollout.transports.local import LocalRunner

CONTAINERD_CONFIG = "/etc/containerd/config.toml"
CONTAINERD_DROP_IN_DIR = "/etc/containerd/conf.d"
NVIDIA_DROP_IN = f"{CONTAINERD_DROP_IN_DIR}/99-nvidia.toml"
RUNNING_RECORD = "/var/lib/rollout-lab/containerd-running.toml"
GPUS_FILE = "/etc/rollout-lab/gpus.json"
UNIT_DROP_IN = "/etc/systemd/system/containerd.service.d/50-rollout-lab.conf"
READY_TIMEOUT_S = 90.0
# Password-prompt agents: nobody types a password into a lab node.
INOTIFY_UNITS = ("systemd-ask-password-console.path", "systemd-ask-password-wall.path")
STOP_TIMEOUT_S = 30.0
START_TIMEOUT_S = 10.0
# How long a reboot may leave a node without an nspawn before the next boot starts.
REBOOT_GAP_S = 5.0
NODE_PROCESS_MODULE = "rollout.lab.nodeprocess"
POLL_S = 0.25
# What runc needs to start a pod's containers inside a node (measured, docs/lab.md "Pods
# through the CRI"): CAP_NET_ADMIN (a container's network namespace, the device cgroup's BPF
# program), CAP_BPF, and the bpf and keyring system calls nspawn's filter denies.
NSPAWN_RUNTIME_OPTIONS = (
    "--capability=CAP_NET_ADMIN,CAP_BPF",
    "--system-call-filter=bpf keyctl add_key request_key",
)
CONTAINERD_STATE = "/var/lib/containerd"
# Where the lab's own registry mirror config lives (not containerd's config_path): what `lab up`
# pulls every node's images through (prepull_images).
LAB_CERTS_DIR = "/etc/rollout-lab/certs.d"
# The NVIDIA runtime's BinaryName of each handler the toolkit adds (data/toolkit/nvidia-toolkit).
NVIDIA_RUNTIMES = (
    "/usr/local/nvidia/toolkit/nvidia-container-runtime",
    "/usr/local/nvidia/toolkit/nvidia-container-runtime.cdi",
    "/usr/local/nvidia/toolkit/nvidia-container-runtime.legacy",
)
PULL_TIMEOUT_S = 60.0


class NodeFailed(RolloutError):
    """A lab node could not be created, started, reached or stopped."""


@dataclass(frozen=True)
class NodeSpec(LabNode):
    """A lab node as the host runs it: with its nspawn machine name."""

    # Unique per lab so two labs on one host never collide.
    machine: str


@dataclass(frozen=True)
class NodeDirs:
    """Where one node lives on the host."""

    directory: Path

    @classmethod
    def from_lab_dir(cls, lab_dir: Path, name: str) -> NodeDirs:
        return cls(lab_dir / "nodes" / name)

    @property
    def upper(self) -> Path:
        return self.directory / "upper"

    @property
    def work(self) -> Path:
        return self.directory / "work"

    @property
    def root(self) -> Path:
        """The node's root filesystem (the merged overlay)."""
        return self.directory / "merged"

    @property
    def containerd_state(self) -> Path:
        """containerd's /var/lib/containerd, bound into the node (snapshots, images)."""
        return self.directory / "containerd"

    @property
    def console_log(self) -> Path:
        return self.directory / CONSOLE_LOG

    @property
    def pid_file(self) -> Path:
        return self.directory / NSPAWN_PID_FILE

    @property
    def supervisor_pid_file(self) -> Path:
        return self.directory / SUPERVISOR_PID_FILE

    def host_path(self, node_path: str) -> Path:
        """A path inside the node, as seen from the host."""
        return self.root / node_path.lstrip("/")


@dataclass(frozen=True)
class SshAccess:
    """How to reach nodes over SSH: the lab's key and known_hosts, strict host checking."""

    key_file: Path
    known_hosts: Path
    connect_timeout_s: int = 5

    def argv(self, address: str, command: Sequence[str]) -> list[str]:
        """The ssh argv that runs `command` on a node (quoted for the remote shell)."""
        return [
            "ssh",
            "-i",
            str(self.key_file),
            "-o",
            "IdentitiesOnly=yes",
            "-o",
            "BatchMode=yes",
            "-o",
            f"UserKnownHostsFile={self.known_hosts}",
            "-o",
            "GlobalKnownHostsFile=/dev/null",
            "-o",
            "StrictHostKeyChecking=yes",
            "-o",
            f"ConnectTimeout={self.connect_timeout_s}",
            "-o",
            "LogLevel=ERROR",
            f"root@{address}",
            # ssh hands one string to the remote shell: quote each word so argv survives.
            shlex.join(command),
        ]

    def run(self, address: str, command: Sequence[str], timeout_s: float = 30.0) -> CommandResult:
        result = LocalRunner().run(self.argv(address, command), timeout_s=timeout_s)
        return CommandResult(
            argv=tuple(command),
            exit_code=result.exit_code,
            stdout=result.stdout,
            stderr=result.stderr,
            host=address,
        )


@dataclass(frozen=True)
class NodeStatus:
    """What `lab status` reports for one node."""

    name: str
    address: str
    containerd_series: str
    running: bool
    ssh_ok: bool
    containerd_version: str | None
    containerd_state: str | None


def create_node(spec: NodeSpec, image: NodeImage, dirs: NodeDirs, authorized_key: str) -> str:
    """Mount the node's overlay and write its identity and config; return its host key line.

    The returned line is the node's ed25519 public host key, for the lab's known_hosts.
    """
    if is_mounted(dirs.root):
        raise NodeFailed(f"{spec.name}: {dirs.root} is already mounted; run `rollout lab down`")
    for directory in (dirs.upper, dirs.work, dirs.root, dirs.containerd_state):
        directory.mkdir(parents=True, exist_ok=True)
    lower = image.lower_dirs(spec.containerd)
    _check(overlay_mount_argv(lower, dirs.upper, dirs.work, dirs.root), spec.name)
    _write_identity(spec, dirs, authorized_key)
    _mask_units(dirs)
    host_key = _generate_host_key(spec, dirs)
    _write_gpu_files(spec, dirs)
    write_containerd_config(spec, dirs)
    return host_key


def _write_identity(spec: NodeSpec, dirs: NodeDirs, authorized_key: str) -> None:
    _write(dirs.host_path("/etc/hostname"), spec.name + "\n")
    # containerd writes each pod sandbox's hosts file from the node's.
    _write(dirs.host_path("/etc/hosts"), f"127.0.0.1\tlocalhost\n127.0.1.1\t{spec.name}\n")
    _write(dirs.host_path("/etc/machine-id"), uuid.uuid4().hex + "\n")
    _write(
        dirs.host_path("/etc/ssh/sshd_config.d/50-rollout-lab.conf"),
        _data_text("sshd-rollout-lab.conf"),
    )
    _write(
        dirs.host_path("/etc/ssh/sshd_config.d/60-rollout-lab-listen.conf"),
        f"ListenAddress {spec.address}\n",
    )
    ssh_dir = dirs.host_path("/root/.ssh")
    ssh_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    _write(ssh_dir / "authorized_keys", authorized_key.strip() + "\n", mode=0o600)


def _mask_units(dirs: NodeDirs) -> None:
    """Mask units a lab node has no use for that each hold an inotify instance.

    inotify instances are counted per user on the host (fs.inotify.max_user_instances, 128 by
    default), and every node's processes run as root: a node used 9 (systemd 5, containerd 2,
    dbus, logind). A boot that finds none left stalls with its mount jobs waiting forever, so
    many labs on one host fail to boot or to come back from a reboot.
    """
    for unit in INOTIFY_UNITS:
        link = dirs.host_path(f"/etc/systemd/system/{unit}")
        link.parent.mkdir(parents=True, exist_ok=True)
        link.unlink(missing_ok=True)
        link.symlink_to("/dev/null")


def _generate_host_key(spec: NodeSpec, dirs: NodeDirs) -> str:
    key = dirs.host_path("/etc/ssh/ssh_host_ed25519_key")
    key.unlink(missing_ok=True)
    Path(str(key) + ".pub").unlink(missing_ok=True)
    argv = ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"root@{spec.name}"]
    _check([*argv, "-f", str(key)], spec.name)
    return Path(str(key) + ".pub").read_text().strip()


def _write_gpu_files(spec: NodeSpec, dirs: NodeDirs) -> None:
    # the hardware nvidia-smi reports: the description and the product's PCI device id
    gpus = {"gpus": [{**gpu.to_json(), "pci_device_id": gpu.pci_device_id} for gpu in spec.gpus]}
    _write(dirs.host_path(GPUS_FILE), json.dumps(gpus, indent=2) + "\n")
    _write(dirs.host_path("/usr/bin/nvidia-smi"), _data_text("nvidia-smi"), mode=0o755)
    _write(dirs.host_path("/usr/bin/dcgmi"), _data_text("dcgmi"), mode=0o755)
    install_driver_stand_ins(dirs.root)
    # Before /usr/bin on PATH: the node's kernel messages are its kernel-log stand-in.
    _write(dirs.host_path("/usr/local/bin/dmesg"), _data_text("dmesg"), mode=0o755)
    _write(dirs.host_path(UNIT_DROP_IN), _data_text("containerd-running-record.conf"))
    runtime = _data_text("nvidia-container-runtime")
    for binary in NVIDIA_RUNTIMES:
        _write(dirs.host_path(binary), runtime, mode=0o755)


def write_containerd_config(spec: NodeSpec, dirs: NodeDirs) -> None:
    """Lay out /etc/containerd as the GPU Operator leaves it on a node of this series.

    config.toml is Debian's packaged file (version 2 on every series) with the toolkit's
    `imports` added: the toolkit keeps the top-level file's version and only adds imports.
    conf.d/99-nvidia.toml is not written here: the node's toolkit unit (rollout.lab.toolkit)
    writes it from `containerd config dump` whenever the toolkit pod starts it.
    """
    main_path = dirs.host_path(CONTAINERD_CONFIG)
    main = tomllib.loads(main_path.read_text()) if main_path.is_file() else {}
    imports = [f"{CONTAINERD_DROP_IN_DIR}/*.toml"]
    ordered: dict[str, Any] = {"version": main.pop("version", 2), "imports": imports}
    ordered.update((k, v) for k, v in main.items() if k != "imports")
    _write(main_path, tomli_w.dumps(ordered))
    dirs.host_path(CONTAINERD_DROP_IN_DIR).mkdir(parents=True, exist_ok=True)
    install_toolkit(dirs.root)


def write_lab_mirror(dirs: NodeDirs, registry: str, namespaces: Sequence[str]) -> None:
    """The lab's own hosts.toml for each registry namespace: the lab registry (host:port) as
    its mirror, under LAB_CERTS_DIR, which containerd does not read (only prepull_images)."""
    for namespace in namespaces:
        text = render_hosts_toml(f"https://{namespace}", [HostEndpoint(f"http://{registry}")])
        _write(dirs.host_path(hosts_toml_path(LAB_CERTS_DIR, namespace)), text)


def prepull_images(
    spec: NodeSpec, dirs: NodeDirs, images: Sequence[str], timeout_s: float = PULL_TIMEOUT_S
) -> None:
    """Pull the images every node already has (the sandbox image of its containerd, the
    smoke image) into the CRI's namespace, through the lab's mirror (write_lab_mirror);
    `timeout_s` for each (rollout's own image is larger)."""
    pid = read_node_pid(spec, dirs)
    if pid is None:
        raise NodeFailed(f"{spec.name}: not running; cannot pull its images")
    for image in (sandbox_image(dirs), *images):
        argv = ["ctr", "--namespace=k8s.io", "images", "pull", f"--hosts-dir={LAB_CERTS_DIR}"]
        result = run_in_node(dirs, [*argv, image], pid, timeout_s=timeout_s)
        if not result.ok:
            raise NodeFailed(f"{spec.name}: pulling {image} failed: {result.tail()}")


def sandbox_image(dirs: NodeDirs) -> str:
    """The pod sandbox image of the node's running containerd (1.x or 2.x layout)."""
    record = dirs.host_path(RUNNING_RECORD)
    try:
        plugins = tomllib.loads(record.read_text()).get("plugins") or {}
    except (OSError, tomllib.TOMLDecodeError) as error:
        raise NodeFailed(f"cannot read the sandbox image from {record}: {error}") from error
    v1 = (plugins.get(CRI_V2) or {}).get("sandbox_image")
    v2 = ((plugins.get(CRI_IMAGES) or {}).get("pinned_images") or {}).get("sandbox")
    image = v1 or v2
    if not image:
        raise NodeFailed(f"{record} names no sandbox image")
    return str(image)


def start_node(spec: NodeSpec, dirs: NodeDirs) -> int:
    """Boot the node in the background; return the pid of its systemd-nspawn.

    nspawn runs under rollout.lab.nodeprocess, which boots it again when the node reboots
    (nspawn's exit status 133) and records each boot's nspawn pid in nspawn.pid.
    """
    argv = [
        "systemd-nspawn",
        "--quiet",
        "--boot",
        f"--directory={dirs.root}",
        f"--machine={spec.machine}",
        f"--hostname={spec.name}",
        # No machined is needed (nor present on every host); nothing registers the node.
        "--register=no",
        # Never create journal directories on the host.
        "--link-journal=no",
        "--console=pipe",
        *NSPAWN_RUNTIME_OPTIONS,
        # containerd's snapshots are overlay mounts, whose upper directory cannot be on the
        # node's own overlay root: its state lives on the host's file system.
        f"--bind={dirs.containerd_state}:{CONTAINERD_STATE}",
    ]
    env = dict(os.environ)
    cgroups: tuple[Path, ...] = ()
    if not _host_runs_systemd():
        # Without a systemd on the host, nspawn cannot ask for a scope of its own; it would
        # split its caller's cgroup, and every node would share one `payload` cgroup, so
        # one node's systemd would see (and signal) another's units. Each nspawn starts in
        # a cgroup of its own instead, and stays there (--keep-unit).
        argv.insert(-1, "--keep-unit")
        cgroups = create_node_cgroups(spec)
    if _unified_cgroup_mount() is not None:
        # Nodes run on cgroup v2, as current GPU nodes do, even on a hybrid host.
        env["SYSTEMD_NSPAWN_UNIFIED_HIERARCHY"] = "1"
    _remove_pid_files(dirs)
    supervisor = [sys.executable, "-m", NODE_PROCESS_MODULE, f"--node-dir={dirs.directory}"]
    supervisor += [f"--cgroup={c}" for c in cgroups]
    with dirs.console_log.open("ab") as log:
        process = subprocess.Popen(
            [*supervisor, "--", *argv],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        pid = read_node_pid(spec, dirs)
        if pid is not None:
            return pid
        if process.poll() is not None:
            break
        time.sleep(0.05)
    process.poll()
    raise NodeFailed(
        f"{spec.name}: systemd-nspawn did not start (supervisor exit {process.returncode})\n"
        f"{_console_tail(dirs)}"
    )


def create_node_cgroups(spec: NodeSpec) -> tuple[Path, ...]:
    """One cgroup per hierarchy systemd uses (cgroup2, v1 name=systemd) for this node."""
    created = []
    for directory in node_cgroup_dirs(spec):
        directory.mkdir(exist_ok=True)
        created.append(directory)
    return tuple(created)


def remove_node_cgroups(spec: NodeSpec) -> None:
    """Remove the node's cgroups, deepest first; they must be empty of processes by now."""
    for directory in node_cgroup_dirs(spec):
        if not directory.is_dir():
            continue
        for sub in sorted((p for p in directory.rglob("*") if p.is_dir()), reverse=True):
            _rmdir_cgroup(sub, spec)
        _rmdir_cgroup(directory, spec)


def node_cgroup_dirs(spec: NodeSpec) -> tuple[Path, ...]:
    """Where the node's own cgroups are (or would be) on this host."""
    own = _own_cgroups()
    dirs = []
    unified = _unified_cgroup_mount()
    if unified is not None and "" in own:
        dirs.append(unified / own[""].lstrip("/") / f"rollout-lab-{spec.machine}")
    named = _named_systemd_mount()
    if named is not None and "name=systemd" in own:
        dirs.append(named / own["name=systemd"].lstrip("/") / f"rollout-lab-{spec.machine}")
    return tuple(dirs)


def _rmdir_cgroup(directory: Path, spec: NodeSpec) -> None:
    if not remove_cgroup(directory):
        raise NodeFailed(f"{spec.name}: cgroup {directory} still has processes")


def _host_runs_systemd() -> bool:
    return Path("/run/systemd/system").is_dir()


def _unified_cgroup_mount() -> Path | None:
    for mount in read_mounts():
        if mount.fstype == "cgroup2":
            return mount.point
    return None


def _named_systemd_mount() -> Path | None:
    for mount in read_mounts():
        if mount.fstype == "cgroup" and "name=systemd" in mount.options:
            return mount.point
    return None


def _own_cgroups() -> dict[str, str]:
    """This process's cgroup per hierarchy: "" for cgroup2, "name=systemd" for the v1 one."""
    own = {}
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        own[controllers] = path
    return own


def wait_node_ready(
    spec: NodeSpec, dirs: NodeDirs, ssh: SshAccess, timeout_s: float = READY_TIMEOUT_S
) -> str:
    """Wait until containerd is active, its running config recorded, and ssh answers.

    Returns `containerd --version` as read over SSH with the lab's key and known_hosts.
    """
    deadline = time.monotonic() + timeout_s
    record = dirs.host_path(RUNNING_RECORD)
    state = "not started"
    while time.monotonic() < deadline:
        pid = read_node_pid(spec, dirs)
        if pid is None:
            raise NodeFailed(f"{spec.name}: systemd-nspawn exited\n{_console_tail(dirs)}")
        leader = _leader_pid(pid)
        if leader is not None:
            state = run_in_node(dirs, ["systemctl", "is-active", "containerd"], pid).stdout.strip()
            if state == "failed":
                journal = run_in_node(
                    dirs, ["journalctl", "-u", "containerd", "-n", "20", "--no-pager"], pid
                )
                raise NodeFailed(f"{spec.name}: containerd failed\n{journal.stdout}")
            if state == "active" and record.is_file() and _port_open(spec.address, 22):
                break
        time.sleep(POLL_S)
    else:
        raise NodeFailed(
            f"{spec.name}: not ready after {timeout_s:g}s (containerd {state}, "
            f"record {'present' if record.is_file() else 'missing'}, "
            f"ssh {'open' if _port_open(spec.address, 22) else 'closed'})"
        )
    result = ssh.run(spec.address, ["containerd", "--version"])
    if not result.ok:
        raise NodeFailed(f"{spec.name}: ssh to {spec.address} failed: {result.tail()}")
    return result.stdout.strip()


def run_in_node(
    dirs: NodeDirs, argv: Sequence[str], nspawn_pid: int, timeout_s: float = 30.0
) -> CommandResult:
    """Run a command inside a running node through its namespaces (no SSH involved)."""
    leader = _leader_pid(nspawn_pid)
    if leader is None:
        raise NodeFailed(f"{dirs.directory.name}: no container process under pid {nspawn_pid}")
    return LocalRunner().run(["nsenter", f"--target={leader}", "--all", *argv], timeout_s=timeout_s)


def read_node_pid(spec: NodeSpec, dirs: NodeDirs) -> int | None:
    """The pid of this node's running systemd-nspawn, or None when it does not run.

    The recorded pid counts only while it is still an nspawn of this very machine, so a pid
    reused by another process is never signalled. While the node reboots (its nspawn exited
    133 and the supervisor starts the next one) this waits for the next boot's pid.
    """
    deadline = time.monotonic() + REBOOT_GAP_S
    while True:
        pid = _nspawn_pid(spec, dirs)
        if pid is not None:
            return pid
        if read_supervisor_pid(spec, dirs) is None or time.monotonic() > deadline:
            return None
        time.sleep(0.05)


def read_supervisor_pid(spec: NodeSpec, dirs: NodeDirs) -> int | None:
    """The pid of the process that reboots this node's nspawn (rollout.lab.nodeprocess)."""
    return _recorded_pid(dirs.supervisor_pid_file, spec, NODE_PROCESS_MODULE.encode())


def _nspawn_pid(spec: NodeSpec, dirs: NodeDirs) -> int | None:
    """The pid of this boot's nspawn as recorded, without waiting through a reboot."""
    return _recorded_pid(dirs.pid_file, spec, b"systemd-nspawn")


def _remove_pid_files(dirs: NodeDirs) -> None:
    """Forget the node's nspawn and supervisor pids (both gone, or about to start again)."""
    dirs.pid_file.unlink(missing_ok=True)
    dirs.supervisor_pid_file.unlink(missing_ok=True)


def _recorded_pid(pid_file: Path, spec: NodeSpec, program: bytes) -> int | None:
    try:
        pid = int(pid_file.read_text().strip())
    except (OSError, ValueError):
        return None
    if not process_alive(pid):
        return None
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return None
    if program not in Path(cmdline[0].decode()).name.encode() and program not in cmdline:
        return None
    if f"--machine={spec.machine}".encode() not in cmdline:
        return None
    return pid


def stop_node(spec: NodeSpec, dirs: NodeDirs, timeout_s: float = STOP_TIMEOUT_S) -> None:
    """Power the node off for good (SIGTERM: an orderly shutdown), then unmount its root.

    SIGTERM goes to the node's supervisor, which passes it to nspawn and boots nothing
    again; nspawn turns it into an orderly poweroff of the container.
    """
    supervisor = read_supervisor_pid(spec, dirs)
    pid = _nspawn_pid(spec, dirs)
    first = supervisor if supervisor is not None else pid
    if first is not None:
        os.kill(first, signal.SIGTERM)
        if not _wait_exit(first, timeout_s):
            for victim in (pid, supervisor):
                if victim is not None and process_alive(victim):
                    os.kill(victim, signal.SIGKILL)
            if not _wait_exit(first, 10.0):
                raise NodeFailed(f"{spec.name}: process {first} survived SIGKILL")
    if pid is not None and not _wait_exit(pid, 10.0):
        os.kill(pid, signal.SIGKILL)
        if not _wait_exit(pid, 10.0):
            raise NodeFailed(f"{spec.name}: systemd-nspawn {pid} survived SIGKILL")
    _remove_pid_files(dirs)
    remove_node_cgroups(spec)
    unmount_root(dirs.root, spec.name)


def kill_node(spec: NodeSpec, dirs: NodeDirs) -> None:
    """The node dies at once, as on a power cut: its supervisor (so nothing boots it again),
    its container's init (the whole PID namespace with it) and nspawn SIGKILLed, no shutdown.
    Its root stays mounted: start_node boots it again."""
    supervisor = read_supervisor_pid(spec, dirs)
    pid = _nspawn_pid(spec, dirs)
    leader = _leader_pid(pid) if pid is not None else None
    victims = [p for p in (supervisor, leader, pid) if p is not None]
    for victim in victims:
        if process_alive(victim):  # nspawn may be gone with the namespace already
            os.kill(victim, signal.SIGKILL)
    for victim in victims:
        if not _wait_exit(victim, 10.0):
            raise NodeFailed(f"{spec.name}: process {victim} survived SIGKILL")
    _remove_pid_files(dirs)
    remove_node_cgroups(spec)


def unmount_root(root: Path, node: str) -> None:
    """Unmount a node's overlay, retrying while the last container processes exit."""
    runner = LocalRunner()
    for _ in range(40):
        if not is_mounted(root):
            return
        runner.run(["umount", str(root)])
        if is_mounted(root):
            time.sleep(POLL_S)
    # Still busy after 10 s: detach it so nothing stays visible; the kernel frees it later.
    check(runner.run(["umount", "--lazy", str(root)]), f"{node}: umount")


def remove_node_dirs(spec: NodeSpec, dirs: NodeDirs) -> None:
    """Delete the node's directory; refuses while its root is still mounted."""
    if is_mounted(dirs.root):
        raise NodeFailed(f"{spec.name}: {dirs.root} is still mounted; not deleting it")
    if dirs.directory.exists():
        shutil.rmtree(dirs.directory)


def probe_node(spec: NodeSpec, dirs: NodeDirs, ssh: SshAccess) -> NodeStatus:
    """Ask one node, over SSH, for its containerd version and state."""
    running = read_node_pid(spec, dirs) is not None
    version: str | None = None
    state: str | None = None
    ssh_ok = False
    if running:
        result = ssh.run(spec.address, ["containerd", "--version"], timeout_s=15.0)
        ssh_ok = result.exit_code != 255
        if result.ok:
            version = result.stdout.strip()
        if ssh_ok:
            active = ssh.run(spec.address, ["systemctl", "is-active", "containerd"], 15.0)
            state = active.stdout.strip() or None
    return NodeStatus(
        name=spec.name,
        address=spec.address,
        containerd_series=spec.containerd,
        running=running,
        ssh_ok=ssh_ok,
        containerd_version=version,
        containerd_state=state,
    )


def read_driver_version(dirs: NodeDirs) -> str | None:
    """The stand-in driver version installed on the node (what its nvidia-smi reports)."""
    try:
        return dirs.host_path(DRIVER_VERSION_FILE).read_text().strip() or None
    except OSError:
        return None


def process_alive(pid: int) -> bool:
    """Whether pid runs; a child of ours that exited is reaped here, so it counts as gone."""
    try:
        reaped, _ = os.waitpid(pid, os.WNOHANG)
        if reaped == pid:
            return False
    except ChildProcessError:
        pass
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    # The state follows the parenthesised command name; Z is a zombie, as good as gone.
    return stat.rpartition(")")[2].split()[:1] != ["Z"]


def _wait_exit(pid: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not process_alive(pid):
            return True
        time.sleep(0.1)
    return not process_alive(pid)


def _leader_pid(nspawn_pid: int) -> int | None:
    try:
        children = Path(f"/proc/{nspawn_pid}/task/{nspawn_pid}/children").read_text().split()
    except OSError:
        return None
    return int(children[0]) if children else None


def _port_open(address: str, port: int) -> bool:
    try:
        with socket.create_connection((address, port), timeout=1.0):
            return True
    except OSError:
        return False


def _console_tail(dirs: NodeDirs, lines: int = 20) -> str:
    try:
        text = dirs.console_log.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def _check(argv: Sequence[str], node: str) -> CommandResult:
    return check(LocalRunner().run(argv, timeout_s=60.0), node)


def _write(path: Path, text: str, mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(mode)


def _data_text(name: str) -> str:
    return resources.files("rollout.lab").joinpath("data", name).read_text()
