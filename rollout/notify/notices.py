"""A notice: one event of a run, as structured fields and a one-line `text`."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from rollout import __version__
from rollout.spec.notify import NotifyEvent

# Each event's line, from the notice's fields (Slack-compatible receivers show `text`).
_TEXT = {
    NotifyEvent.RUN_STARTED: "rollout {plan}: run {run} started",
    NotifyEvent.WAVE_DONE: "rollout {plan}: wave {wave} done ({reason})",
    NotifyEvent.NODE_FAILED: "rollout {plan}: node {node} failed: {reason}",
    NotifyEvent.NODE_LEFT_CORDONED: "rollout {plan}: node {node} left cordoned: {reason}",
    NotifyEvent.HALTED: "rollout {plan}: run {run} halted: {reason}",
    NotifyEvent.WINDOW_CLOSED: "rollout {plan}: run {run} stopped, window closed: {reason}",
    NotifyEvent.PAUSED: "rollout {plan}: run {run} paused: {reason}",
    NotifyEvent.RUN_DONE: "rollout {plan}: run {run} done: {reason}",
}

# A reason is a line of the run's output, cut for a chat line.
MAX_REASON_CHARS = 500


@dataclass(frozen=True)
class Notice:
    event: NotifyEvent
    run: str
    plan: str
    at: datetime
    node: str | None = None
    wave: int | None = None
    reason: str = ""

    @property
    def text(self) -> str:
        return _TEXT[self.event].format(
            plan=self.plan, run=self.run, node=self.node, wave=self.wave, reason=self.reason
        )


def payload(notice: Notice) -> dict[str, Any]:
    """The JSON document a webhook receives."""
    reason = notice.reason[:MAX_REASON_CHARS]
    return {
        "text": Notice(**{**notice.__dict__, "reason": reason}).text,
        "event": notice.event.value,
        "run": notice.run,
        "plan": notice.plan,
        "node": notice.node,
        "wave": notice.wave,
        "reason": reason,
        "time": notice.at.isoformat(),
        "tool": "rollout",
        "version": __version__,
    }
