"""policy.notify: webhooks hear every event of a run once, in order, from a real HTTP receiver
on 127.0.0.1; a receiver that is down or slow changes neither the outcome nor, beyond the
flush bound, the run's end; no payload or journal line carries the URL."""

from __future__ import annotations

import http.server
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rollout.errors import InputErrors
from rollout.executor import Executor, RunReport
from rollout.notify import NotifyingProgress, Sender, redact, resolve_receivers
from rollout.notify.sender import DeliveryFailed, post
from rollout.playbook import load_playbooks
from rollout.retry import RetryPolicy
from rollout.run import Notified, RunOutcome
from rollout.schedule.permissions import Grant, schedule_grants
from rollout.spec import parse_spec
from rollout.spec.notify import NotifyEvent
from tests.examples import PLAN
from tests.unit.test_executor import FakeStep, Quiet, make_executor, setup

TOKEN = "T0KEN-b7e1c2d9f00d"  # the secret part of the URL: must never leave the process
FAST = RetryPolicy(attempts=3, first_wait_s=0.05, max_wait_s=0.1, deadline_s=5.0)


class Receiver:
    """An HTTP server on 127.0.0.1:0 that keeps every JSON body posted to it."""

    def __init__(self, status: int = 200, delay_s: float = 0.0) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.raw: list[bytes] = []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                data = self.rfile.read(int(self.headers["Content-Length"]))
                outer.raw.append(data + self.path.encode())
                time.sleep(delay_s)
                if status == 200:
                    outer.bodies.append(json.loads(data))
                self.send_response(status)
                self.end_headers()

            def log_message(self, *args: Any) -> None: ...

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_port}/hooks/{TOKEN}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.close()


def notify_plan(extra: str = "") -> str:
    hook = "  notify:\n    - name: ops\n      url_from: {env: ROLLOUT_TEST_HOOK}\n" + extra
    return PLAN.read_text().replace("  on_failure: rollback\n", "  on_failure: rollback\n" + hook)


def run_with_notices(
    tmp_path: Path, url: str, fail_on: set[str] | None = None, bound_s: float = 10.0
) -> tuple[Any, list[Notified], float]:
    plan, spec, cluster, log, journal, steps = setup(tmp_path, notify_plan(), fail_on)
    for kind in {s.kind for n in plan.nodes for s in n.steps} - steps.keys():  # gates, ...
        steps[kind] = FakeStep(kind, log, cluster, fail_on or set())
    receivers, problems = resolve_receivers(
        spec.policy.notify, lambda ns, n: {}, environ={"ROLLOUT_TEST_HOOK": url}
    )
    assert problems == []
    sender = Sender(receivers, journal.append, policy=FAST, try_timeout_s=1.0)
    waves = {node.name: wave.index for wave in plan.waves for node in wave.nodes}
    progress = NotifyingProgress(Quiet(), sender, run="r1", plan=plan.name, waves=waves)
    executor = make_executor(plan, spec, cluster, journal, steps)
    executor = Executor(plan, spec, steps, journal, cluster, executor.make_context, progress)
    progress.started()
    report = executor.run()
    started = time.monotonic()
    progress.finish(report, bound_s=bound_s)
    took = time.monotonic() - started
    records = [e.record for e in journal.entries() if isinstance(e.record, Notified)]
    return report, records, took


def test_every_event_once_in_order(tmp_path: Path, receiver: Receiver) -> None:
    report, records, _ = run_with_notices(tmp_path, receiver.url)
    assert report.outcome is RunOutcome.SUCCEEDED
    events = [b["event"] for b in receiver.bodies]
    # examples/plan.yaml: 4 nodes, waves [1, "50%"]: 1, 2, 1
    assert events == ["run-started", "wave-done", "wave-done", "wave-done", "run-done"]
    assert [b["wave"] for b in receiver.bodies] == [None, 1, 2, 3, None]
    done = receiver.bodies[-1]
    assert done["text"] == "rollout registry-mirror: run r1 done: succeeded; nodes: 4 succeeded"
    assert {"event", "run", "plan", "node", "wave", "reason", "time", "version", "text"} <= set(
        done
    )
    assert [(r.event, r.outcome, r.tries) for r in records] == [(e, "sent", 1) for e in events]
    assert all(r.webhook == "ops" for r in records)


def test_a_failed_node_and_the_halt_are_told(tmp_path: Path, receiver: Receiver) -> None:
    report, records, _ = run_with_notices(tmp_path, receiver.url, {"gpu-a-2/systemd.restart"})
    assert report.outcome is RunOutcome.HALTED
    told = [(b["event"], b["node"]) for b in receiver.bodies]
    assert told == [
        ("run-started", None),
        ("wave-done", None),
        ("node-failed", "gpu-a-2"),
        ("halted", None),
        ("run-done", None),
    ]
    failed = receiver.bodies[2]
    assert failed["reason"] == "gpu-a-2: systemd.restart: injected failure"
    assert failed["text"] == (
        "rollout registry-mirror: node gpu-a-2 failed: gpu-a-2: systemd.restart: injected failure"
    )
    assert len(records) == 5


def test_a_receiver_that_is_down_changes_nothing_but_the_journal(tmp_path: Path) -> None:
    down = Receiver()
    url = down.url
    down.close()  # nothing listens on the port any more
    report, records, _ = run_with_notices(tmp_path, url)
    assert report.outcome is RunOutcome.SUCCEEDED
    assert [(r.event, r.outcome, r.tries) for r in records] == [
        (e, "failed", 3) for e in ("run-started", "wave-done", "wave-done", "wave-done", "run-done")
    ]
    assert all(TOKEN not in r.error and "127.0.0.1" not in r.error for r in records)


def test_a_slow_receiver_costs_the_run_at_most_the_flush_bound(tmp_path: Path) -> None:
    slow = Receiver(delay_s=30.0)  # each try times out (1 s here), then backs off
    try:
        report, records, took = run_with_notices(tmp_path, slow.url, bound_s=2.0)
    finally:
        slow.close()
    assert report.outcome is RunOutcome.SUCCEEDED
    assert took < 10.0  # the bound (2 s) with room for a loaded machine, far below 5 x 3 tries
    assert {r.outcome for r in records} == {"failed"}
    assert any("flush at exit" in r.error for r in records)


def test_a_server_error_is_retried_and_a_client_error_is_not(tmp_path: Path) -> None:
    for status, retried in ((503, True), (404, False)):
        r = Receiver(status=status)
        try:
            with pytest.raises(DeliveryFailed) as caught:
                post(r.url, {"text": "x"}, 2.0)
        finally:
            r.close()
        assert caught.value.retry is retried
        assert str(caught.value) == f"HTTP {status}"


def test_no_secret_in_any_payload_or_journal_line(tmp_path: Path, receiver: Receiver) -> None:
    run_with_notices(tmp_path, receiver.url, {"gpu-a-2/systemd.restart"})
    bodies = b"".join(raw.split(b"/hooks/")[0] for raw in receiver.raw)  # the bodies only
    assert receiver.raw and TOKEN.encode() not in bodies
    journal = next(tmp_path.rglob("journal.jsonl")).read_text()
    assert '"notified"' in journal and TOKEN not in journal and "/hooks/" not in journal


def test_redact_hides_the_url_and_its_path() -> None:
    url = f"https://hooks.example.invalid/services/{TOKEN}?k=v"
    said = redact(f"error posting to {url}; path /services/{TOKEN}?k=v", [url])
    assert TOKEN not in said and said == "error posting to <webhook URL>; path <webhook URL>"


def test_a_literal_url_is_refused() -> None:
    text = notify_plan().replace("url_from: {env: ROLLOUT_TEST_HOOK}", f"url: https://x/{TOKEN}")
    with pytest.raises(InputErrors) as caught:
        parse_spec(text, "plan.yaml")
    said = str(caught.value)
    assert "a webhook's URL is a secret and is never written in the plan" in said
    assert "url_from" in said


def test_url_from_names_exactly_one_place() -> None:
    text = notify_plan().replace("{env: ROLLOUT_TEST_HOOK}", "{env: A, file: /run/hook}")
    with pytest.raises(InputErrors, match="url_from needs exactly one of env, file, secret"):
        parse_spec(text, "plan.yaml")


def test_events_filter_and_defaults() -> None:
    spec = parse_spec(notify_plan("      events: [halted, run-done]\n"), "plan.yaml")
    assert spec.policy.notify[0].events == (NotifyEvent.HALTED, NotifyEvent.RUN_DONE)
    assert parse_spec(notify_plan(), "plan.yaml").policy.notify[0].events == tuple(NotifyEvent)


def test_a_url_that_cannot_be_read_leaves_the_webhook_out(tmp_path: Path) -> None:
    spec = parse_spec(notify_plan(), "plan.yaml")
    receivers, problems = resolve_receivers(spec.policy.notify, lambda ns, n: {}, environ={})
    assert receivers == []
    assert problems == [
        "notify ops: environment variable ROLLOUT_TEST_HOOK is empty or unset; not notified"
    ]


def test_a_secret_is_read_in_the_namespace_given(tmp_path: Path) -> None:
    text = notify_plan().replace("{env: ROLLOUT_TEST_HOOK}", "{secret: {name: hooks, key: slack}}")
    spec = parse_spec(text, "plan.yaml")
    asked: list[tuple[str, str]] = []

    def read(namespace: str, name: str) -> dict[str, str]:
        asked.append((namespace, name))
        return {"slack": f"https://hooks.example.invalid/{TOKEN}\n"}

    receivers, problems = resolve_receivers(spec.policy.notify, read, "gpu-ops")
    assert problems == [] and asked == [("gpu-ops", "hooks")]
    assert receivers[0].url == f"https://hooks.example.invalid/{TOKEN}"
    assert TOKEN not in repr(receivers[0])


def test_the_schedule_role_gets_exactly_the_webhook_secret() -> None:
    text = notify_plan().replace("{env: ROLLOUT_TEST_HOOK}", "{secret: {name: hooks, key: k}}")
    plain = schedule_grants(parse_spec(notify_plan(), "plan.yaml"), load_playbooks(), "rollout")
    grants = schedule_grants(parse_spec(text, "plan.yaml"), load_playbooks(), "rollout")
    assert set(grants) - set(plain) == {Grant("", "secrets", "get", "rollout", "hooks")}
    secrets = {g.name for g in grants if g.resource == "secrets" and g.verb == "get"}
    assert secrets == {"hooks", "rollout-registry-mirror-run"}  # the run kept in the cluster


@pytest.mark.parametrize(
    ("paused", "window_closed", "event"),
    [(True, False, "paused"), (False, True, "window-closed"), (False, False, "halted")],
)
def test_the_end_of_a_stopped_run_says_why(
    tmp_path: Path, receiver: Receiver, paused: bool, window_closed: bool, event: str
) -> None:
    (hook,) = resolve_receivers(
        parse_spec(notify_plan(), "plan.yaml").policy.notify,
        lambda ns, n: {},
        environ={"ROLLOUT_TEST_HOOK": receiver.url},
    )[0]
    progress = NotifyingProgress(
        Quiet(), Sender([hook], lambda r: None), run="r1", plan="p", waves={"n1": 1}
    )
    reason = "paused by ops@laptop: rack 7 maintenance" if paused else "stopped"
    progress.halted(reason)
    report = RunReport(RunOutcome.HALTED, reason, {"n1": ("pending", "")}, window_closed, paused)
    progress.finish(report)
    assert [(b["event"], b["reason"]) for b in receiver.bodies] == [
        (event, reason),
        ("run-done", "halted; nodes: 1 pending"),
    ]
