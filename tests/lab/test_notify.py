"""policy.notify on a lab of its own (2 nodes): `rollout apply` of the demo plan, its webhook URL
read from a Secret through the API, tells a local HTTP receiver every event once, in order,
journals each delivery as sent, and no payload or journal line holds the URL's token."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from rollout.cli import main
from rollout.lab.cluster import Lab
from rollout.transports.kube import KubeClient, Secret
from tests.examples import PLAN
from tests.lab.labapi import apply_args
from tests.lab.test_cluster_shared import own_lab
from tests.unit.test_notify import TOKEN, Receiver

pytestmark = [pytest.mark.lab, pytest.mark.own_lab]


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    with own_lab(tmp_path_factory.mktemp("notify") / "lab", ("1.7", "2.1"), 1) as built:
        yield built


def test_apply_tells_the_webhook_every_event_in_order(
    lab: Lab, kube: KubeClient, tmp_path: Path
) -> None:
    receiver = Receiver()
    try:
        kube.create_secret(Secret("kube-system", "rollout-webhooks", {"ops": receiver.url}))
        hook = (
            "  notify:\n    - name: ops\n"
            "      url_from: {secret: {name: rollout-webhooks, key: ops, namespace: kube-system}}\n"
        )
        plan = tmp_path / "plan.yaml"
        plan.write_text(
            PLAN.read_text().replace("  on_failure: rollback\n", "  on_failure: rollback\n" + hook)
        )
        state = tmp_path / "state"
        assert main(apply_args(lab, plan, state)) == 0
    finally:
        receiver.close()
    told = [(b["event"], b["wave"]) for b in receiver.bodies]
    # two nodes, waves [1, "50%"]: one node a wave
    assert told == [
        ("run-started", None),
        ("wave-done", 1),
        ("wave-done", 2),
        ("run-done", None),
    ]
    assert receiver.bodies[1]["reason"] == "1 succeeded"
    assert receiver.bodies[-1]["text"].endswith("done: succeeded; nodes: 2 succeeded")
    (journal,) = state.glob("runs/*/journal.jsonl")
    records = [json.loads(line) for line in journal.read_text().splitlines()]
    notified = [(r["event"], r["outcome"], r["tries"]) for r in records if r["kind"] == "notified"]
    assert notified == [(event, "sent", 1) for event, _ in told]
    assert TOKEN not in journal.read_text()
    assert all(TOKEN.encode() not in raw.split(b"/hooks/")[0] for raw in receiver.raw)
