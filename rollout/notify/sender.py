"""Delivery: one background thread posts each notice to its receivers, retried with backoff
under a bound, and journals how each delivery ended; the run never waits on it except for
`flush`, bounded."""

from __future__ import annotations

import contextlib
import json
import queue
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from rollout.notify.notices import Notice, payload
from rollout.notify.urls import Receiver, redact
from rollout.retry import RetryPolicy, call_with_policy
from rollout.run import Notified

# 3 tries over at most ~30 s per delivery: a receiver down for a minute misses the notice
# rather than holding the run's end.
SEND_POLICY = RetryPolicy(attempts=3, first_wait_s=2.0, max_wait_s=10.0, deadline_s=30.0)
TRY_TIMEOUT_S = 5.0
# The most the run's end waits for deliveries still queued or being retried (docs/notify.md).
FLUSH_BOUND_S = 10.0
QUEUE_SIZE = 256

Record = Callable[[Notified], object]


class DeliveryFailed(Exception):
    """One try failed; `retry` says whether another may succeed (a 4xx other than 429 won't)."""

    def __init__(self, message: str, retry: bool) -> None:
        super().__init__(message)
        self.retry = retry


class _Abandoned(Exception):
    """The flush bound passed: the delivery stops waiting for its next try."""


@dataclass(frozen=True)
class Delivery:
    receiver: Receiver
    notice: Notice


def post(url: str, document: dict[str, object], timeout_s: float) -> None:
    """POST `document` as JSON; DeliveryFailed (message without the URL) on any failure."""
    body = json.dumps(document).encode()
    request = urllib.request.Request(
        url, data=body, method="POST", headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            response.read(65536)
    except urllib.error.HTTPError as exc:
        raise DeliveryFailed(f"HTTP {exc.code}", retry=exc.code == 429 or exc.code >= 500) from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", None) or exc
        raise DeliveryFailed(redact(str(reason), [url]) or type(exc).__name__, retry=True) from None


class Sender:
    """Queues deliveries and posts them from one daemon thread, in order."""

    def __init__(
        self,
        receivers: Sequence[Receiver],
        record: Record,
        *,
        policy: RetryPolicy = SEND_POLICY,
        try_timeout_s: float = TRY_TIMEOUT_S,
    ) -> None:
        self._receivers = list(receivers)
        self._urls = [r.url for r in receivers]
        self._record = record
        self._policy = policy
        self._try_timeout_s = try_timeout_s
        self._queue: queue.Queue[Delivery | None] = queue.Queue(QUEUE_SIZE)
        self._abandon = threading.Event()
        self._lock = threading.Lock()
        self._closed = False
        self._current: Delivery | None = None
        self._thread = threading.Thread(target=self._work, name="rollout-notify", daemon=True)
        self._thread.start()

    def send(self, notice: Notice) -> None:
        """Queue `notice` for every receiver that hears its event; never blocks."""
        for receiver in self._receivers:
            if notice.event not in receiver.events:
                continue
            try:
                self._queue.put_nowait(Delivery(receiver, notice))
            except queue.Full:
                self._journal(Delivery(receiver, notice), "failed", 0, "queue full")

    def flush(self, bound_s: float = FLUSH_BOUND_S) -> None:
        """Wait at most `bound_s` for what is queued; what is left is journalled as not sent,
        and nothing is journalled after this returns (the journal may close)."""
        deadline = time.monotonic() + bound_s
        with contextlib.suppress(queue.Full):
            self._queue.put(None, timeout=bound_s)
        self._thread.join(max(0.0, deadline - time.monotonic()))
        self._abandon.set()
        with self._lock:
            self._closed = True
            current = self._current if self._thread.is_alive() else None
        left = [current] if current is not None else []
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if item is not None:
                left.append(item)
        why = f"not sent within the {bound_s:g} s flush at exit"
        for item in left:
            self._journal(item, "failed", 0, why, closing=True)

    def _work(self) -> None:
        while (item := self._queue.get()) is not None:
            if self._abandon.is_set():
                self._journal(item, "failed", 0, "not sent within the flush at exit", True)
                continue
            with self._lock:
                self._current = item
            self._deliver(item)
            with self._lock:
                self._current = None

    def _deliver(self, item: Delivery) -> None:
        tries = 0
        document = payload(item.notice)

        def attempt() -> None:
            nonlocal tries
            tries += 1
            post(item.receiver.url, document, self._try_timeout_s)

        def sleep(seconds: float) -> None:
            if self._abandon.wait(seconds):
                raise _Abandoned

        try:
            call_with_policy(
                attempt,
                self._policy,
                sleep=sleep,
                operation=f"notify {item.receiver.name}",
                retry_on=lambda e: isinstance(e, DeliveryFailed) and e.retry,
            )
        except DeliveryFailed as exc:
            self._journal(item, "failed", tries, str(exc).splitlines()[0])
        except _Abandoned:
            self._journal(item, "failed", tries, "abandoned at the flush at exit", True)
        except Exception as exc:  # a notification never fails a run
            self._journal(item, "failed", tries, redact(str(exc), self._urls)[:300])
        else:
            self._journal(item, "sent", tries, "")

    def _journal(
        self, item: Delivery, outcome: str, tries: int, error: str, closing: bool = False
    ) -> None:
        with self._lock:
            if self._closed and not closing:
                return
            record = Notified(item.receiver.name, item.notice.event.value, outcome, tries, error)
            try:
                self._record(record)
            except Exception:  # the journal's own failure is the run's to notice
                return
