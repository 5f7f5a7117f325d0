"""The process that keeps one lab node's systemd-nspawn running across reboots.

`python -m rollout.lab.nodeprocess --node-dir DIR [--cgroup DIR ...] -- systemd-nspawn ...`

It does for a lab node what systemd's own `systemd-nspawn@.service` does for a machine
(`RestartForceExitStatus=133`): nspawn exits with status 133 when the container's systemd
reboots (`systemctl reboot` inside the node), and this process starts the same nspawn
command again, on the same overlay (still mounted), so the node comes back with the same
root filesystem, address and SSH host key, a new boot_id and an empty /run. Any other exit
(`systemctl poweroff`, a crash) ends it, as it ends the unit.

SIGTERM (what `rollout lab down` sends) is passed to the running nspawn, which powers the
node off in order; no restart follows, even when the node was rebooting at that moment.

Files in the node directory: supervisor.pid (this process), nspawn.pid (the nspawn that
runs now, rewritten at each boot), console.log (every boot's console, appended).
Only the standard library is used: the process lives as long as the node.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from types import FrameType

REBOOT_EXIT = 133  # systemd-nspawn's exit status when the container rebooted
SUPERVISOR_PID_FILE = "supervisor.pid"
NSPAWN_PID_FILE = "nspawn.pid"
CONSOLE_LOG = "console.log"


class _Supervisor:
    def __init__(self, node_dir: Path, cgroups: Sequence[Path], argv: Sequence[str]) -> None:
        self.node_dir = node_dir
        self.cgroups = tuple(cgroups)
        self.argv = list(argv)
        self.stopping = False
        self.child: subprocess.Popen[bytes] | None = None

    def on_term(self, signum: int, frame: FrameType | None) -> None:
        self.stopping = True
        if self.child is not None and self.child.poll() is None:
            self.child.send_signal(signal.SIGTERM)

    def run(self) -> int:
        boots = 0
        while True:
            if boots:
                self._log(f"node rebooted (systemd-nspawn exited {REBOOT_EXIT}); booting again")
                self._reset_cgroups()
            self.child = self._start()
            _write_atomic(self.node_dir / NSPAWN_PID_FILE, f"{self.child.pid}\n")
            if self.stopping:  # SIGTERM arrived while this boot was being started
                self.child.send_signal(signal.SIGTERM)
            status = self.child.wait()
            boots += 1
            if status != REBOOT_EXIT or self.stopping:
                return status

    def _start(self) -> subprocess.Popen[bytes]:
        cgroups = self.cgroups
        with (self.node_dir / CONSOLE_LOG).open("ab") as log:
            return subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                # A session of its own, as when `lab up` started nspawn directly: without
                # one, nodes of a 4-node lab stalled at boot now and then (every systemd
                # job waiting, none running; 3 of 3 tries failed, 5 of 5 pass with it).
                start_new_session=True,
                preexec_fn=(lambda: _join_cgroups(cgroups)) if cgroups else None,
            )

    def _reset_cgroups(self) -> None:
        # The previous boot's systemd left its sub-cgroups (empty now) below the node's own.
        for directory in self.cgroups:
            subs = sorted((p for p in directory.rglob("*") if p.is_dir()), reverse=True)
            for sub in subs:
                remove_cgroup(sub)
            directory.mkdir(exist_ok=True)

    def _log(self, line: str) -> None:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S")
        with (self.node_dir / CONSOLE_LOG).open("a") as log:
            log.write(f"-- rollout lab {stamp}: {line}\n")


def _join_cgroups(cgroups: Sequence[Path]) -> None:
    # Runs in the child between fork and exec: "0" is the writing process itself.
    for directory in cgroups:
        (directory / "cgroup.procs").write_text("0\n")


def remove_cgroup(directory: Path) -> bool:
    """Remove a cgroup directory (gone already counts); False while it still has processes
    after 5 s."""
    for _ in range(50):
        try:
            directory.rmdir()
            return True
        except FileNotFoundError:
            return True
        except OSError:
            time.sleep(0.1)  # the kernel frees a cgroup a moment after its last process
    return False


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)


def main(args: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m rollout.lab.nodeprocess",
        description="Run a lab node's systemd-nspawn; boot it again when it exits 133 (reboot).",
    )
    parser.add_argument("--node-dir", type=Path, required=True, help="the node's directory")
    parser.add_argument(
        "--cgroup",
        type=Path,
        action="append",
        default=[],
        help="a cgroup each boot's nspawn joins (repeatable; hosts without systemd)",
    )
    parser.add_argument("argv", nargs=argparse.REMAINDER, help="-- the systemd-nspawn command")
    options = parser.parse_args(args)
    argv = options.argv[1:] if options.argv[:1] == ["--"] else options.argv
    if not argv:
        parser.error("the systemd-nspawn command is missing after --")
    supervisor = _Supervisor(options.node_dir, options.cgroup, argv)
    signal.signal(signal.SIGTERM, supervisor.on_term)
    signal.signal(signal.SIGINT, supervisor.on_term)
    _write_atomic(options.node_dir / SUPERVISOR_PID_FILE, f"{os.getpid()}\n")
    return supervisor.run()


if __name__ == "__main__":
    sys.exit(main())
