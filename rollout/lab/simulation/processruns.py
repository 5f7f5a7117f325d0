"""A Job pod of the rollout image run as a process of the lab host (fast controller tests).

Only for a lab without nodes (the Job controller's tests on an in-process registry): the
pod's command runs as the lab host's own rollout (`python -m rollout` of the interpreter
running the lab) in a private mount and UTS namespace (`unshare`), where each mount is bound
at its path (a mount point missing on the host is made inside an overlay of its nearest
existing parent: nothing is written on the host) and the host name is the pod's. It runs as
the lab's user (root), not the pod's runAsUser, and from this checkout, not the image: a lab
with nodes runs the pod as the image's container instead (containerruns.py).
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from rollout.lab.simulation.jobpodspec import JobPodLaunch, PodNotRunnable, StagedMount

# a private mount namespace (the volumes) and host name (the pod's), nothing else
UNSHARE = ("unshare", "--mount", "--uts", "--propagation", "private", "--")
# A process that does not exit on SIGKILL is the kernel's business; stop waiting after this.
KILL_WAIT_S = 5.0


class ProcessRunner:
    """Starts Job pods as processes of the lab host."""

    def staging(self, uid: str) -> Path:
        return Path(tempfile.mkdtemp(prefix=f"rollout-lab-jobpod-{uid[:8]}-"))

    def start(self, launch: JobPodLaunch) -> ProcessRun:
        script = _namespace_script(launch.name, launch.mounts, launch.staging)
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOSTNAME": launch.name}
        env.update(launch.env)
        command = [sys.executable, "-m", "rollout", *launch.command[1:]]
        log_path = launch.staging / "output.log"
        with log_path.open("wb") as output:
            popen = subprocess.Popen(
                [*UNSHARE, "sh", "-ec", script, "sh", *command],
                env=env,
                cwd="/",
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        return ProcessRun(popen, launch.staging, log_path)


@dataclass
class ProcessRun:
    """One pod's process; its output is read from its log file as it grows."""

    popen: subprocess.Popen[bytes]
    staging: Path
    log_path: Path
    log_offset: int = 0
    term_sent_at: float | None = None

    def exit_code(self) -> int | None:
        code = self.popen.poll()
        # killed by a signal: the shell's convention, 128 + the signal
        return None if code is None else code if code >= 0 else 128 - code

    def not_started(self) -> tuple[str, str] | None:
        return None

    def read_output(self) -> str:
        try:
            with self.log_path.open("rb") as output:
                output.seek(self.log_offset)
                data = output.read()
        except OSError:
            return ""
        self.log_offset += len(data)
        return data.decode(errors="replace")

    def stop(self, grace_s: float) -> None:
        """SIGTERM at the first call, SIGKILL at a call once `grace_s` has passed since."""
        now = time.monotonic()
        if self.term_sent_at is None:
            self.term_sent_at = now
            self._signal(signal.SIGTERM)
        elif now - self.term_sent_at >= grace_s:
            self._signal(signal.SIGKILL)

    def close(self) -> None:
        """Stop the process if it runs (TERM, then KILL) and remove its staging."""
        if self.popen.poll() is None:
            self._signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout=KILL_WAIT_S)
            except subprocess.TimeoutExpired:
                self._signal(signal.SIGKILL)
                self.popen.wait(timeout=KILL_WAIT_S)
        shutil.rmtree(self.staging, ignore_errors=True)

    def _signal(self, number: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, number)


def _entrypoint_paths() -> list[Path]:
    """What the image's entrypoint runs from on this host (the interpreter's prefixes and the
    tree rollout is imported from), outermost only: in a pod these are the image's own files,
    never under a volume."""
    found = [Path(sys.prefix), Path(sys.base_prefix), Path(__file__).resolve().parents[3]]
    resolved = sorted({p.resolve() for p in found}, key=lambda p: len(p.parts))
    outermost: list[Path] = []
    for path in resolved:
        if not any(path == o or o in path.parents for o in outermost):
            outermost.append(path)
    return outermost


def _namespace_script(hostname: str, mounts: tuple[StagedMount, ...], staging: Path) -> str:
    """The shell run inside the new namespaces: host name, overlays, bind mounts, then the
    command ("$@"). A volume mounted over what the entrypoint runs from (an emptyDir at /tmp
    over a checkout under /tmp) would hide it: such a tree is held open (fd 3 up) before the
    mounts and bound back at its path after them."""
    targets = [Path(m.target) for m in mounts]
    hidden = [
        path for path in _entrypoint_paths() if any(path == t or t in path.parents for t in targets)
    ][:7]
    lines = [f"hostname {shlex.quote(hostname)}"]
    lines += [f"exec {3 + i}<{shlex.quote(str(path))}" for i, path in enumerate(hidden)]
    # a mount over a source's parents (an emptyDir at /tmp) hides the sources below it:
    # those go last
    sources = [staging, *(m.source for m in mounts)]
    ordered = sorted(mounts, key=lambda m: any(_is_under(s, Path(m.target)) for s in sources))
    overlays = staging / "overlays"
    lines.append(f"mkdir -p {shlex.quote(str(overlays))}")
    lines.append(f"mount -t tmpfs rollout-lab-overlays {shlex.quote(str(overlays))}")
    overlaid: list[str] = []
    for index, mount in enumerate(ordered):
        target = mount.target
        parent = _existing_parent(target)
        if parent != target and not any(
            parent == o or parent.startswith(o + "/") for o in overlaid
        ):
            if parent == "/":
                raise PodNotRunnable("CreateContainerError", f"cannot mount at {target}")
            upper, work = overlays / f"upper{index}", overlays / f"work{index}"
            lines.append(f"mkdir -p {shlex.quote(str(upper))} {shlex.quote(str(work))}")
            options = f"lowerdir={parent},upperdir={upper},workdir={work}"
            lines.append(
                f"mount -t overlay overlay -o {shlex.quote(options)} {shlex.quote(parent)}"
            )
            overlaid.append(parent)
        quoted = shlex.quote(target)
        lines.append(f"mkdir -p {quoted}")
        lines.append(f"mount --bind {shlex.quote(str(mount.source))} {quoted}")
        if mount.read_only:
            lines.append(f"mount -o remount,bind,ro {quoted}")
    for i, path in enumerate(hidden):
        quoted = shlex.quote(str(path))
        lines.append(f"mkdir -p {quoted}")
        # not canonicalized: the fd's link names a path the mounts above now hide
        lines.append(f"mount --no-canonicalize --bind /proc/self/fd/{3 + i} {quoted}")
        lines.append(f"exec {3 + i}<&-")
    lines.append('exec "$@"')
    return "\n".join(lines)


def _is_under(path: Path, directory: Path) -> bool:
    return path == directory or directory in path.parents


def _existing_parent(target: str) -> str:
    """The target itself when it exists on the host, else its nearest existing ancestor
    (symbolic links resolved: /var/run is /run)."""
    path = Path(target)
    while not path.exists():
        path = path.parent
    return str(path.resolve())
