"""The executor's Progress, wrapped: what it hears becomes notices, and it goes on to the
Progress it wraps unchanged (the executor has no notification branches)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Protocol

from rollout.executor import Progress, RunReport
from rollout.notify.notices import Notice
from rollout.notify.sender import FLUSH_BOUND_S, Sender
from rollout.notify.urls import DEFAULT_SECRET_NAMESPACE, resolve_receivers
from rollout.run import Journal, NodeOutcome, RunOutcome, RunResumed, utc_now
from rollout.spec import Spec
from rollout.spec.notify import NotifyEvent
from rollout.transports.kube.incluster import find_service_account
from rollout.transports.kube.secret import Secret


class SecretApi(Protocol):
    """The little of KubeClient a webhook's Secret is read through."""

    def get_secret(self, namespace: str, name: str) -> Secret: ...


_NODE_EVENTS = {
    NodeOutcome.FAILED.value: NotifyEvent.NODE_FAILED,
    NodeOutcome.ROLLED_BACK.value: NotifyEvent.NODE_FAILED,
    NodeOutcome.LEFT_CORDONED.value: NotifyEvent.NODE_LEFT_CORDONED,
}


class NotifyingProgress:
    """A Progress that also tells the webhooks; `started` and `finish` bracket the run.

    `waves` maps each node of the plan to its wave; `finished` names the nodes already
    finished before this process (a resumed run), so a wave they complete is told once.
    """

    def __init__(
        self,
        inner: Progress,
        sender: Sender,
        *,
        run: str,
        plan: str,
        waves: Mapping[str, int],
        finished: frozenset[str] = frozenset(),
        clock: Callable[[], datetime] = utc_now,
    ) -> None:
        self._inner = inner
        self._sender = sender
        self._run, self._plan, self._clock = run, plan, clock
        self._waves = dict(waves)
        self._left = {
            wave: {n for n, w in waves.items() if w == wave and n not in finished}
            for wave in set(waves.values())
        }
        self._outcomes: dict[int, dict[str, int]] = {wave: {} for wave in self._left}
        self._halt = ""

    def notify(
        self, event: NotifyEvent, reason: str = "", node: str | None = None, wave: int | None = None
    ) -> None:
        notice = Notice(event, self._run, self._plan, self._clock(), node, wave, reason)
        self._sender.send(notice)

    def started(self, resumed: bool = False) -> None:
        self.notify(NotifyEvent.RUN_STARTED, "resumed" if resumed else "")

    def finish(self, report: RunReport, bound_s: float = FLUSH_BOUND_S) -> None:
        """The run's last notices (its pause, halt or the window closing; done), then the
        bounded flush."""
        if report.paused:  # rollout pause: the reason says by whom and why
            self.notify(NotifyEvent.PAUSED, report.halt_reason or self._halt)
        elif report.window_closed:
            self.notify(NotifyEvent.WINDOW_CLOSED, report.halt_reason)
        elif report.outcome is RunOutcome.HALTED:
            self.notify(NotifyEvent.HALTED, report.halt_reason or self._halt)
        counts: dict[str, int] = {}
        for outcome, _reason in report.nodes.values():
            counts[outcome] = counts.get(outcome, 0) + 1
        summary = ", ".join(f"{n} {outcome}" for outcome, n in sorted(counts.items()))
        self.notify(NotifyEvent.RUN_DONE, f"{report.outcome.value}; nodes: {summary or 'none'}")
        self._sender.flush(bound_s)

    # --- Progress ---------------------------------------------------------------------------

    def node_started(self, wave: int, node: str) -> None:
        self._inner.node_started(wave, node)

    def step_started(self, node: str, step: str) -> None:
        self._inner.step_started(node, step)

    def step_finished(self, node: str, step: str, outcome: str, detail: str) -> None:
        self._inner.step_finished(node, step, outcome, detail)

    def node_finished(self, node: str, outcome: str, reason: str) -> None:
        self._inner.node_finished(node, outcome, reason)
        event = _NODE_EVENTS.get(outcome)
        wave = self._waves.get(node)
        if event is not None:
            self.notify(event, reason, node=node, wave=wave)
        left = self._left.get(wave) if wave is not None else None
        if wave is None or left is None:
            return
        left.discard(node)
        self._outcomes[wave][outcome] = self._outcomes[wave].get(outcome, 0) + 1
        if not left:
            counts = self._outcomes[wave]
            said = ", ".join(f"{n} {o}" for o, n in sorted(counts.items()))
            self.notify(NotifyEvent.WAVE_DONE, said, wave=wave)
            self._left.pop(wave)

    def halted(self, reason: str) -> None:
        self._inner.halted(reason)
        self._halt = reason  # told by finish, which knows whether the window closed


def start_notifying(
    inner: Progress,
    spec: Spec,
    journal: Journal,
    kube: SecretApi,
    waves: Mapping[str, int],
    say: Callable[[str], None],
) -> NotifyingProgress | None:
    """The run's NotifyingProgress, run-started already told; None when the plan notifies no
    one. A webhook whose URL cannot be read is said and left out, never fatal."""
    if not spec.policy.notify:
        return None
    account = find_service_account()  # a scheduled run reads Secrets in its own namespace
    namespace = (account.namespace if account else None) or DEFAULT_SECRET_NAMESPACE
    receivers, problems = resolve_receivers(
        spec.policy.notify, lambda where, name: kube.get_secret(where, name).data, namespace
    )
    for problem in problems:
        say(problem)
    state = journal.replay()
    finished = frozenset(n for n in waves if state.node(n).outcome is not None)
    sender = Sender(receivers, journal.append)
    progress = NotifyingProgress(
        inner,
        sender,
        run=str(journal.run_id),
        plan=spec.metadata.name,
        waves=waves,
        finished=finished,
    )
    progress.started(resumed=any(isinstance(e.record, RunResumed) for e in journal.entries()))
    return progress
