"""Step `systemd.restart`: restart containerd through systemd and prove the restart.

Invariant 3: containerd restarts only through systemd, never by a signal (FACTS.md: SIGHUP
is a restart by systemd's Restart=always, not a reload, and it bypasses the job queue), and
the restart is proven before anything depends on it: ActiveState=active with a MainPID other
than the one before.

The service's state is one fact (rollout.facts.service: `systemctl show` and its parser), so
the decisions are tested from recorded `systemctl show` output.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, ClassVar, NoReturn

from rollout.commands import CommandRunner, CommandTimeout, check
from rollout.errors import RolloutError
from rollout.facts import ProbeFailed, read_fact
from rollout.facts.service import SERVICE, ServiceFact, ServiceState
from rollout.steps.base import StepContext, StepResult
from rollout.steps.nodechanges import WRITE_STEP, ContainerdFileStep
from rollout.steps.traits import StepTraits

POLL_INTERVAL_S = 1.0
# ActiveStates of a unit that a job (or an automatic restart) is still moving
TRANSITIONS = frozenset({"activating", "deactivating", "reloading"})
JOURNAL_LINES = 20


class RestartFailed(RolloutError):
    """The service did not come back active with a new main process in time."""


@dataclass(frozen=True)
class RestartProof:
    """The service before and after a restart, and every state seen while waiting."""

    before: ServiceState
    after: ServiceState
    seen: tuple[str, ...]

    def describe(self) -> str:
        return (
            f"{SERVICE} restarted through systemd: MainPID {self.before.main_pid} -> "
            f"{self.after.main_pid}, {self.after.active_state}/{self.after.sub_state}"
        )


def probe_service(runner: CommandRunner, unit: str = SERVICE) -> ServiceState:
    """The service's state now: the service fact, read over the runner."""
    return read_fact(runner, ServiceFact(unit))


def read_node_clock(runner: CommandRunner) -> datetime:
    """The node's clock now: the same clock systemd stamps ActiveEnterTimestamp with."""
    out = check(runner.run(["date", "-u", "+%s.%N"]), "read the node's clock").stdout.strip()
    try:
        return datetime.fromtimestamp(float(out), UTC)
    except ValueError as exc:
        raise ProbeFailed(f"{runner.host}: `date -u +%s.%N` printed {out!r}") from exc


def read_unit_journal(
    runner: CommandRunner, unit: str = SERVICE, lines: int = JOURNAL_LINES
) -> str:
    """The last lines of the unit's journal, for a failure message; never raises."""
    try:
        result = runner.run(["journalctl", "-u", unit, "-n", str(lines), "--no-pager"])
    except RolloutError as exc:
        return f"(journalctl failed: {exc})"
    return (result.stdout.strip() or result.stderr.strip()) or "(no journal lines)"


def restart_service(
    runner: CommandRunner,
    timeout_s: float,
    *,
    unit: str = SERVICE,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> RestartProof:
    """`systemctl restart` (never a signal), then wait for active with a new MainPID.

    Raises RestartFailed naming every state seen and the unit's last journal lines.
    """
    before = probe_service(runner, unit)
    seen: list[str] = [f"before: {before.describe()}"]
    deadline = clock() + timeout_s
    # Count polls as well as time: a fake sleep in tests does not move the clock.
    max_polls = max(1, math.ceil(timeout_s / POLL_INTERVAL_S))
    try:
        restarted = runner.run(["systemctl", "restart", unit], timeout_s=timeout_s)
    except CommandTimeout:
        restarted = None
    if restarted is not None and not restarted.ok:
        seen.append(f"`systemctl restart {unit}` exited {restarted.exit_code}: {restarted.tail(3)}")
        _raise_restart_failed(runner, unit, seen, probe_service(runner, unit))
    if restarted is None:
        seen.append(f"`systemctl restart {unit}` ran past {timeout_s:g}s")
    polls = 0
    while True:
        now = probe_service(runner, unit)
        label = now.describe()
        if not seen[-1].endswith(label):
            seen.append(f"then: {label}")
        if now.running and now.main_pid != before.main_pid:
            return RestartProof(before, now, tuple(seen))
        polls += 1
        if polls >= max_polls or clock() >= deadline:
            _raise_restart_failed(runner, unit, seen, now, timeout_s)
        sleep(POLL_INTERVAL_S)


def wait_out_transition(
    runner: CommandRunner,
    state: ServiceState,
    timeout_s: float,
    *,
    unit: str = SERVICE,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> ServiceState:
    """The service once no job is moving it (not activating, deactivating or reloading), or as
    last seen when timeout_s ran out."""
    deadline = clock() + timeout_s
    max_polls = max(1, math.ceil(timeout_s / POLL_INTERVAL_S))
    polls = 0
    while state.active_state in TRANSITIONS and polls < max_polls and clock() < deadline:
        sleep(POLL_INTERVAL_S)
        polls += 1
        state = probe_service(runner, unit)
    return state


def _raise_restart_failed(
    runner: CommandRunner,
    unit: str,
    seen: Sequence[str],
    last: ServiceState,
    timeout_s: float | None = None,
) -> NoReturn:
    waited = f" within {timeout_s:g}s" if timeout_s is not None else ""
    journal = read_unit_journal(runner, unit)
    raise RestartFailed(
        f"{unit}.service did not come back active with a new MainPID{waited} "
        f"(last: {last.describe()}); states seen:\n"
        + "\n".join(f"  {s}" for s in seen)
        + f"\nlast {JOURNAL_LINES} lines of `journalctl -u {unit}`:\n"
        + "\n".join(f"  | {line}" for line in journal.splitlines())
        + f"\n  check the unit on the node: systemctl status {unit}"
    )


def written_at_of(data: Mapping[str, Any]) -> datetime | None:
    """The node-clock time containerd.write finished replacing files, from its saved data."""
    text = data.get("written_at")
    return datetime.fromisoformat(text) if isinstance(text, str) else None


class SystemdRestart(ContainerdFileStep):
    """Restart containerd through systemd after the write, and prove the new process runs.

    An SSH drop, even after `systemctl restart` ran, goes to the retry policy: the retried
    step waits for a restart job still under way, finds the MainPID recorded before its
    restart gone and does not restart again; the restart is journalled as done, as its own."""

    kind: ClassVar[str] = "systemd.restart"
    # systemd's RestartSec, then the new MainPID and ActiveState
    traits: ClassVar[StepTraits] = StepTraits(
        cluster_wide=False,
        takes_down=False,
        uses_ssh=True,
        grants=(),
        expected_s=5.0,
        worst_s=lambda policy: float(policy.verify.containerd_restart_timeout_s),
    )
    action: ClassVar[str] = "systemctl restart containerd"

    def act(self, ctx: StepContext) -> StepResult:
        written_at = written_at_of(ctx.load_data(WRITE_STEP))
        timeout_s = float(ctx.spec.policy.verify.containerd_restart_timeout_s)
        state = probe_service(ctx.runner)
        # A retry after a lost answer: the MainPID recorded before this run's restart is gone
        # and a new process runs, so `systemctl restart` did its work: never restart twice.
        # The restart job may still be running (activating, deactivating): wait it out first.
        pid_before = ctx.load_data(self.kind).get("main_pid_before")
        if pid_before is not None:
            state = wait_out_transition(ctx.runner, state, timeout_s, sleep=ctx.sleep)
            if state.running and state.main_pid != pid_before:
                # rollout's own restart, so journalled as done: only its answer was lost
                return StepResult.done(
                    f"{SERVICE} restarted by an earlier attempt whose answer was lost: "
                    f"MainPID {pid_before} -> {state.describe()}"
                )
        elif written_at is not None and state.started_after(written_at):
            # Resume: the process running now already read the written files, and no attempt
            # of this run restarted it.
            return StepResult.noop(
                f"already restarted after the write ({state.describe()}, "
                f"files written {written_at.isoformat()})"
            )
        ctx.save_data(self.kind, {"main_pid_before": state.main_pid})
        proof = restart_service(ctx.runner, timeout_s, sleep=ctx.sleep)
        return StepResult.done(proof.describe())

    def undo(self, ctx: StepContext) -> None:
        """Nothing: a restart cannot be taken back; containerd.write's undo restarts again."""
