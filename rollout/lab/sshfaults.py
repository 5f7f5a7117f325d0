"""SSH faults on the lab's nodes, injected from the control plane while `ssh=RATE` is set.

A watcher thread looks at the commands that the nodes' sshd sessions run (the processes
whose parent is a session's sshd) and, for each command it sees, decides from the seed,
the node, the command line with its random parts replaced (`decision_key`) and how often
that command was seen before whether to fault it:

- cut: the session's sshd processes SIGKILLed while the command runs: the connection dies
  and the client never learns the command's exit status;
- refused: ssh.service stopped (the session cut too), started again `refused` seconds later:
  new connections are refused meanwhile;
- slow-link: the node's link throttled to `link-rate` kbit/s for `link` seconds
  (rollout.lab.linkshaper: tc on the host's loopback, filtered on the node's address), so
  this command's answer and everything else said to or by the node in that time crawl; a
  second slow-link while one lasts extends it.

Each fault goes to faults.log with the node's name as `where` and the command as `request`.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import threading
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from rollout.lab import linkshaper
from rollout.lab.faults import (
    FAULT_LOG,
    FAULTS_FILE,
    SSH_KINDS,
    FaultLog,
    FaultSettings,
    SshFault,
    allowed,
    decide,
    read_settings,
    without_random_parts,
)
from rollout.lab.nodes import NodeDirs

log = logging.getLogger("rollout.lab.sshfaults")

POLL_S = 0.02
SHELLS = frozenset({"bash", "sh", "dash"})


@dataclass(frozen=True)
class NodeProcesses:
    """Where to find a node from the host: its name, its address and its init's pid."""

    name: str
    address: str  # the node's loopback address, which its sshd listens on
    pid_file: Path  # the node's nspawn pid (rollout.lab.nodeprocess writes it)


@dataclass(frozen=True)
class Proc:
    pid: int
    ppid: int
    comm: str
    cmdline: str


def read_proc(pid: int) -> Proc | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            text = stat.read().decode(errors="replace")
        comm = text[text.index("(") + 1 : text.rindex(")")]
        ppid = int(text[text.rindex(")") + 2 :].split()[1])
        with open(f"/proc/{pid}/cmdline", "rb") as cmd:
            cmdline = cmd.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except (OSError, ValueError):
        return None
    return Proc(pid, ppid, comm, cmdline)


def node_processes(leader: int) -> list[Proc]:
    """Every process in the PID namespace of the node whose init is `leader`."""
    try:
        namespace = os.readlink(f"/proc/{leader}/ns/pid")
    except OSError:
        return []
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if os.readlink(f"/proc/{entry}/ns/pid") != namespace:
                continue
        except OSError:
            continue
        proc = read_proc(int(entry))
        if proc is not None:
            found.append(proc)
    return found


def leader_of(node: NodeProcesses) -> int | None:
    """The pid of the node's init (the nspawn's child), None while it is down."""
    try:
        nspawn = int(node.pid_file.read_text().strip())
        children = Path(f"/proc/{nspawn}/task/{nspawn}/children").read_text().split()
    except (OSError, ValueError):
        return None
    return int(children[0]) if children else None


class SshFaultInjector:
    """The watcher thread: faults the nodes' SSH sessions as the lab's settings say."""

    def __init__(self, lab_dir: Path, nodes: list[NodeProcesses]) -> None:
        self._lab_dir = lab_dir
        self._nodes = nodes
        self._log = FaultLog(lab_dir / FAULT_LOG)
        self._seen: Counter[str] = Counter()
        self._handled: set[tuple[str, int]] = set()
        self._stop = threading.Event()
        self._mtime: float | None = None
        self._settings = FaultSettings()
        self._links: dict[str, threading.Timer] = {}  # slowed node address -> its restore
        self._lock = threading.Lock()
        self._refusals: dict[int, threading.Timer] = {}  # stopped sshd's node leader -> restart
        self._thread = threading.Thread(target=self._watch, name="ssh-faults", daemon=True)

    def start(self) -> SshFaultInjector:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._end_faults()

    def _end_faults(self) -> None:
        """End every fault still in progress at once: stopped sshds started, slowed links
        restored. Faults switched off (or the injector stopped) leave the lab undisturbed
        from then on, not up to `refused`/`link` seconds later."""
        with self._lock:
            links, self._links = self._links, {}
            refusals, self._refusals = self._refusals, {}
        for address, timer in links.items():
            timer.cancel()
            linkshaper.restore(address)
        for leader, timer in refusals.items():
            timer.cancel()
            _in_node(leader, ["systemctl", "start", "ssh.service"])

    def _current(self) -> FaultSettings:
        try:
            mtime: float | None = (self._lab_dir / FAULTS_FILE).stat().st_mtime
        except OSError:
            mtime = None
        if mtime != self._mtime:
            self._mtime = mtime
            self._settings = read_settings(self._lab_dir) if mtime else FaultSettings()
            self._seen.clear()
            if not self._settings.ssh:
                self._end_faults()
        return self._settings

    def _watch(self) -> None:
        while not self._stop.wait(POLL_S):
            try:
                settings = self._current()
                if settings.ssh:
                    for node in self._nodes:
                        self._look_at(node, settings)
            except Exception:  # the watcher must outlive any one odd process table
                log.exception("ssh fault watcher")

    def _look_at(self, node: NodeProcesses, settings: FaultSettings) -> None:
        leader = leader_of(node)
        if leader is None:
            return
        procs = {p.pid: p for p in node_processes(leader)}
        for proc in procs.values():
            parent = procs.get(proc.ppid)
            if parent is None or parent.comm != "sshd" or proc.comm == "sshd":
                continue  # not a command a session runs
            if "update-motd" in proc.cmdline:
                continue  # PAM's message of the day, run as the session opens
            if (node.name, proc.pid) in self._handled:
                continue
            self._handled.add((node.name, proc.pid))
            request = f"{node.name} {decision_key(proc.cmdline)}"
            occurrence = self._seen[request]
            self._seen[request] += 1
            kinds = allowed(SSH_KINDS, settings.ssh_kinds)
            fault = decide(settings.seed, settings.ssh, request, occurrence, kinds)
            if isinstance(fault, SshFault):
                pair = (parent, procs.get(parent.ppid))
                session = [p for p in pair if p is not None and _is_session(p, procs)]
                self._inject(node, leader, fault, session, proc, settings)

    def _inject(
        self,
        node: NodeProcesses,
        leader: int,
        fault: SshFault,
        session: list[Proc],
        command: Proc,
        settings: FaultSettings,
    ) -> None:
        self._log.record(node.name, asked_command(command.cmdline), fault)
        if fault is SshFault.SLOW:
            self._slow_link(node.address, settings)
            return
        if fault is SshFault.REFUSED:
            _in_node(leader, ["systemctl", "stop", "ssh.service"])
            timer = threading.Timer(settings.refused_s, self._end_refusal, (leader,))
            timer.args = (leader, timer)
            timer.daemon = True
            with self._lock:
                running = self._refusals.pop(leader, None)
                if running is not None:
                    running.cancel()  # this refusal's restart replaces the earlier one's
                self._refusals[leader] = timer
            timer.start()
        _signal(session, signal.SIGKILL)

    def _slow_link(self, address: str, settings: FaultSettings) -> None:
        with self._lock:
            running = self._links.pop(address, None)
            if running is not None:
                running.cancel()
            linkshaper.slow_down(address, settings.link_kbit)
            timer = threading.Timer(settings.link_s, self._restore_link, (address,))
            timer.args = (address, timer)
            timer.daemon = True
            self._links[address] = timer
            timer.start()

    def _end_refusal(self, leader: int, timer: threading.Timer) -> None:
        with self._lock:
            if self._refusals.get(leader) is not timer:
                return  # a later refusal extended it, or _end_faults started sshd
            del self._refusals[leader]
        _in_node(leader, ["systemctl", "start", "ssh.service"])

    def _restore_link(self, address: str, timer: threading.Timer) -> None:
        with self._lock:
            if self._links.get(address) is not timer:
                return  # a later slow-link extended it, or stop() restored it
            del self._links[address]
            linkshaper.restore(address)


def asked_command(cmdline: str) -> str:
    """The command a session asked for, the same whether its shell has exec'd it yet or not.

    sshd runs `bash -c COMMAND`, and bash execs a simple command in its place: the watcher
    sees `bash -c sleep 1` or `sleep 1` depending on when it looks. Both are one request, so
    the shell is dropped, and quotes with it (the shell's argument has them, the argv not).
    """
    shell, flag, rest = [*cmdline.split(" ", 2), "", ""][:3]
    if os.path.basename(shell) in SHELLS and flag == "-c" and rest:
        cmdline = rest
    return cmdline.replace("'", "").replace('"', "")


def decision_key(cmdline: str) -> str:
    """The command a session asked for (`asked_command`), its random parts replaced.

    A command line rollout sends may hold a part chosen at random on each run (a run id, the
    fact batch's frame, a `mktemp` name: rollout.lab.faults.RANDOM_PARTS); keyed on the raw
    line, a seed would fault different commands each run. With each such part replaced by a
    placeholder, the same seed faults the same commands at the same sight, run after run.
    """
    return without_random_parts(asked_command(cmdline))


def _is_session(proc: Proc | None, procs: dict[int, Proc]) -> bool:
    """A per-connection sshd (not the listener, whose parent is the node's init)."""
    if proc is None or proc.comm != "sshd":
        return False
    parent = procs.get(proc.ppid)
    return parent is not None and parent.comm == "sshd"


def _signal(procs: list[Proc], signum: int) -> None:
    for proc in procs:
        try:
            os.kill(proc.pid, signum)
        except ProcessLookupError:
            continue


def _in_node(leader: int, argv: list[str]) -> None:
    subprocess.run(
        ["nsenter", f"--target={leader}", "--all", *argv],
        check=False,
        capture_output=True,
        timeout=30,
    )


def injector_for_lab(lab_dir: Path, nodes_named: list[tuple[str, str]]) -> SshFaultInjector:
    """The watcher for a lab's nodes, by their names and addresses."""
    nodes = [
        NodeProcesses(name, address, NodeDirs.from_lab_dir(lab_dir, name).pid_file)
        for name, address in nodes_named
    ]
    return SshFaultInjector(lab_dir, nodes)
