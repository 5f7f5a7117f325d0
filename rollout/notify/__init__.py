"""Notifications (policy.notify): webhooks told of a run's events, never in its way.

`NotifyingProgress` wraps the executor's Progress and turns what it hears into notices (run
started, wave done, node failed or left cordoned, halted, window closed, paused, run done);
a `Sender` posts each as JSON from one background thread with a bounded queue, retried with
backoff a bounded number of times, and journals every delivery's end (sent, or failed after
N tries). The run never waits on a receiver except for a bounded flush at its end
(`FLUSH_BOUND_S`), and no notice fails it. A webhook's URL is a secret: read at the start
from an environment variable, a file or a Secret (`urls`), never printed or journalled.
"""

from rollout.notify.notices import Notice, payload
from rollout.notify.progress import NotifyingProgress
from rollout.notify.sender import FLUSH_BOUND_S, SEND_POLICY, Delivery, Sender
from rollout.notify.urls import Receiver, redact, resolve_receivers

__all__ = [
    "FLUSH_BOUND_S",
    "SEND_POLICY",
    "Delivery",
    "Notice",
    "NotifyingProgress",
    "Receiver",
    "Sender",
    "payload",
    "redact",
    "resolve_receivers",
]
