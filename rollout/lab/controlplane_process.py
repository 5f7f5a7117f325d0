"""The control plane as the lab's child process: launch it, ask whether it answers, stop it.

The process itself is `python -m rollout.lab.controlplane --lab-dir DIR`; it writes its pid
and log into the lab directory under the names below, which both sides share.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Callable
from pathlib import Path

from rollout.errors import RolloutError
from rollout.lab.daemons import http_answers, start_daemon, stop_daemon
from rollout.lab.nodes import process_alive

CONTROLPLANE_MODULE = "rollout.lab.controlplane"
READY_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0
LOG_FILE = "controlplane.log"
PID_FILE = "controlplane.pid"
# Our own record of the pid we launched, in case the control plane never wrote its own.
LAUNCH_PID_FILE = ".controlplane-launch.pid"
# `lab status` quotes the latest warnings of the log, from its last bytes only.
WARNINGS_SHOWN = 5
WARNINGS_READ_BYTES = 256 * 1024

Progress = Callable[[str], None]


class ControlPlaneFailed(RolloutError):
    """The control plane did not start, or exited."""


class ApiPortTaken(ControlPlaneFailed):
    """The control plane could not bind its port: another process holds it."""


def controlplane_available() -> bool:
    """Whether the control plane module is installed (it is written separately)."""
    return importlib.util.find_spec(CONTROLPLANE_MODULE) is not None


def launch_controlplane(lab_dir: Path, api_url: str, progress: Progress) -> None:
    """Start the control plane for the lab in lab_dir and wait until api_url answers."""
    progress(f"lab: starting the control plane on {api_url}")
    process, answered = start_daemon(
        [sys.executable, "-m", CONTROLPLANE_MODULE, "--lab-dir", str(lab_dir)],
        lab_dir / LOG_FILE,
        lab_dir / LAUNCH_PID_FILE,
        lambda: controlplane_answers(api_url),
        READY_TIMEOUT_S,
        poll_s=0.2,
    )
    if answered:
        progress(f"lab: control plane ready on {api_url}")
        return
    tail = _tail(lab_dir / LOG_FILE)
    if process.returncode is not None:
        error = ApiPortTaken if "Address already in use" in tail else ControlPlaneFailed
        raise error(f"the control plane exited with {process.returncode}\n" + tail)
    raise ControlPlaneFailed(
        f"the control plane did not answer {api_url}/healthz within {READY_TIMEOUT_S:g}s\n" + tail
    )


def stop_controlplane(lab_dir: Path, progress: Progress) -> None:
    """SIGTERM (then SIGKILL) the lab's control plane, if one of ours is running."""
    recorded = (_read_pid(lab_dir / name) for name in (PID_FILE, LAUNCH_PID_FILE))
    pids = {pid for pid in recorded if pid}
    for pid in pids:
        if not _is_controlplane(pid, lab_dir):
            continue
        stop_daemon(pid, STOP_TIMEOUT_S, poll_s=0.1)
        progress(f"lab: control plane {pid} stopped")
    for name in (PID_FILE, LAUNCH_PID_FILE):
        (lab_dir / name).unlink(missing_ok=True)


def controlplane_answers(api_url: str) -> bool:
    """Whether the API at api_url answers /healthz."""
    return http_answers(f"{api_url}/healthz")


def _is_controlplane(pid: int, lab_dir: Path) -> bool:
    """Only a live `-m rollout.lab.controlplane --lab-dir <this dir>` is ours to signal."""
    if not process_alive(pid):
        return False
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return False
    return CONTROLPLANE_MODULE in argv and str(lab_dir) in argv


def _read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def read_controlplane_warnings(lab_dir: Path, count: int = WARNINGS_SHOWN) -> tuple[str, ...]:
    """The latest WARNING and ERROR lines of the control plane's log, oldest first: what the
    simulation could not do (a pod it cannot run, with the kubelet's Warning) is said there."""
    try:
        with (lab_dir / LOG_FILE).open("rb") as log:
            size = log.seek(0, os.SEEK_END)
            log.seek(max(0, size - WARNINGS_READ_BYTES))
            text = log.read().decode(errors="replace")
    except OSError:
        return ()
    lines = text.splitlines()[1 if size > WARNINGS_READ_BYTES else 0 :]  # a cut first line
    # "<date> <time> LEVEL logger: message"
    found = [line for line in lines if line.split(maxsplit=3)[2:3] in (["WARNING"], ["ERROR"])]
    return tuple(found[-count:])


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""
