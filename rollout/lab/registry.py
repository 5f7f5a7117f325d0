"""The lab's image registry: Debian's docker-registry on a lab address, started by `lab up`.

It serves the images a lab node runs through the CRI (rollout.lab.registryimages builds and
pushes them): a pod sandbox (pause) image and the smoke image. Nodes reach it only through a
registry mirror in hosts.toml: the one a plan's registry change writes under containerd's
config_path, or the lab's own under /etc/rollout-lab/certs.d that `lab up` uses to pull the
images every node already has (rollout.lab.nodes.prepull_images).

Lab directory: registry/config.yml, registry/storage/, registry.log, registry.pid.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

from rollout.errors import RolloutError
from rollout.lab.daemons import http_answers, start_daemon, stop_daemon
from rollout.lab.nodes import process_alive

REGISTRY_PROGRAM = "docker-registry"
# The last octet of the registry's address in the lab's loopback /24 (nodes count from .1).
REGISTRY_OCTET = 250
REGISTRY_PORT = 5000
PID_FILE = "registry.pid"
LOG_FILE = "registry.log"
READY_TIMEOUT_S = 15.0
STOP_TIMEOUT_S = 10.0

Progress = Callable[[str], None]


class RegistryFailed(RolloutError):
    """The lab's registry could not be started, reached or stopped."""


def registry_host(node_address: str) -> str:
    """host:port of the lab registry for a lab whose nodes have addresses like node_address."""
    prefix = node_address.rsplit(".", 1)[0]
    return f"{prefix}.{REGISTRY_OCTET}:{REGISTRY_PORT}"


def registry_available() -> bool:
    return shutil.which(REGISTRY_PROGRAM) is not None


def start_registry(lab_dir: Path, host: str, progress: Progress) -> None:
    """Serve an empty registry on host (address:port), storage in the lab directory."""
    if not registry_available():
        raise RegistryFailed(
            f"{REGISTRY_PROGRAM} not found: install Debian's docker-registry (scripts/setup --lab)"
        )
    directory = lab_dir / "registry"
    (directory / "storage").mkdir(parents=True, exist_ok=True)
    config = directory / "config.yml"
    config.write_text(_config_text(host, directory / "storage"))
    progress(f"lab: starting the image registry on http://{host}")
    process, answered = start_daemon(
        [REGISTRY_PROGRAM, "serve", str(config)],
        lab_dir / LOG_FILE,
        lab_dir / PID_FILE,
        lambda: registry_answers(host),
        READY_TIMEOUT_S,
    )
    if answered:
        return
    if process.returncode is not None:
        raise RegistryFailed(
            f"{REGISTRY_PROGRAM} exited ({process.returncode}); see {lab_dir / LOG_FILE}"
        )
    raise RegistryFailed(f"the registry on {host} did not answer in {READY_TIMEOUT_S:g}s")


def registry_answers(host: str) -> bool:
    return http_answers(f"http://{host}/v2/")


def stop_registry(lab_dir: Path, progress: Progress) -> None:
    """Stop the registry this lab directory started, if it runs."""
    pid = _registry_pid(lab_dir)
    if pid is None:
        (lab_dir / PID_FILE).unlink(missing_ok=True)
        return
    stop_daemon(pid, STOP_TIMEOUT_S)
    (lab_dir / PID_FILE).unlink(missing_ok=True)
    progress("lab: stopped the image registry")


def _registry_pid(lab_dir: Path) -> int | None:
    """The recorded pid while it is still this lab's docker-registry (never a reused pid)."""
    try:
        pid = int((lab_dir / PID_FILE).read_text().strip())
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except (OSError, ValueError):
        return None
    config = str(lab_dir / "registry" / "config.yml").encode()
    if not process_alive(pid) or config not in cmdline:
        return None
    return pid


def _config_text(host: str, storage: Path) -> str:
    return (
        "version: 0.1\n"
        "log:\n  level: warn\n"
        f"storage:\n  filesystem:\n    rootdirectory: {storage}\n"
        f"http:\n  addr: {host}\n"
    )
