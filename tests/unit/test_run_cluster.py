"""A run kept in the cluster (rollout/run/cluster.py), against the API emulator: one Secret
named after the plan, every append durable and resourceVersion-checked, continued by the
next process, never silently overwritten by a second writer."""

from __future__ import annotations

import base64
import gzip
import json
from collections.abc import Iterator

import pytest

from rollout.run import (
    Invocation,
    Journal,
    JournalError,
    JournalMismatch,
    JournalWriteFailed,
    RunFinished,
    RunHalted,
    RunId,
    RunOutcome,
    StepStarted,
)
from rollout.run import cluster as cluster_run
from rollout.run.cluster import (
    find_run,
    journal_text,
    open_run,
    pack_text,
    run_object_name,
    start_run,
)
from rollout.transports.kube import KubeClient, Secret
from rollout.transports.kube.resources import SECRETS
from tests.emulator import emulated_kube
from tests.unit.runfakes import PLAN_JSON, FakeClock, run_node

NAMESPACE = "rollout"
PLAN = "registry-mirror"
INVOCATION = Invocation(
    spec_source="/etc/rollout/plan/plan.yaml",
    spec_text="apiVersion: rollout/v1\nkind: Plan\n",
    inventory="/etc/rollout/plan/inventory.yaml",
    kubeconfig=None,
    context=None,
    accept_new_host_keys=False,
)


@pytest.fixture()
def kube() -> Iterator[KubeClient]:
    with emulated_kube(None, NAMESPACE) as client:
        yield client


def start(kube: KubeClient, run_id: str = "20261201-040000-registry-mirror-0001") -> Journal:
    return start_run(
        kube,
        NAMESPACE,
        PLAN,
        PLAN_JSON,
        invocation=INVOCATION,
        run_id=RunId(run_id),
        user="system:serviceaccount:rollout:rollout-registry-mirror",
        host="rollout-registry-mirror-29000000-abcde",
        clock=FakeClock(),
    )


def test_a_run_is_one_opaque_secret_named_after_the_plan(kube: KubeClient) -> None:
    with start(kube) as journal:
        run_node(journal, "gpu-1")
        journal.save_step_data("gpu-1", "containerd.write", {"staged": "/tmp/x"})
    secret = kube.get_secret(NAMESPACE, "rollout-registry-mirror-run")
    assert run_object_name(PLAN) == secret.name
    assert set(secret.data) == {
        "run-id",
        "plan.json.gz",
        "invocation.json",
        "journal.jsonl",
        "steps.json",
    }
    assert secret.labels["app.kubernetes.io/managed-by"] == "rollout"
    assert secret.labels["app.kubernetes.io/instance"] == PLAN
    lines = journal_text(secret).splitlines()
    assert json.loads(lines[0])["kind"] == "run-started"
    assert json.loads(lines[-1]) == {**json.loads(lines[-1]), "kind": "node-finished"}
    assert json.loads(secret.data["steps.json"]) == {
        "gpu-1": {"containerd.write": {"staged": "/tmp/x"}}
    }
    # a Secret, sent base64 and typed Opaque: not readable where only ConfigMaps are
    raw = kube._read_namespaced("secret", SECRETS, NAMESPACE, secret.name)
    assert raw["type"] == "Opaque"
    packed = base64.b64decode(raw["data"]["plan.json.gz"]).decode()
    assert gzip.decompress(base64.b64decode(packed)).decode() == PLAN_JSON


def test_the_next_process_continues_where_the_last_stopped(kube: KubeClient) -> None:
    with start(kube) as journal:
        run_node(journal, "gpu-1")
        journal.append(StepStarted("gpu-2", 0, "cordon", 1))
        journal.save_step_data("gpu-2", "cordon", {"was_unschedulable": False})
        written = journal.entries()
    found = find_run(kube, NAMESPACE, PLAN)
    assert found is not None and not found.state.finished
    assert found.invocation == INVOCATION
    assert found.read_plan_json() == PLAN_JSON
    with open_run(kube, NAMESPACE, PLAN) as again:
        assert again.entries() == written  # every record, in order, none lost
        state = again.replay()
        assert state.node("gpu-1").outcome is not None
        assert state.step_in_flight("gpu-2") is not None
        assert again.load_step_data("gpu-2", "cordon") == {"was_unschedulable": False}
        assert again.load_step_data("gpu-2", "drain") == {}
        assert again.read_plan_json() == PLAN_JSON
        again.append(RunHalted("window closed"))
    found = find_run(kube, NAMESPACE, PLAN)
    assert found is not None and found.state.halted_reason == "window closed"


def test_a_second_writer_fails_loudly_and_loses_nothing(kube: KubeClient) -> None:
    with start(kube) as journal:
        journal.append(StepStarted("gpu-1", 0, "cordon", 1))
    first = open_run(kube, NAMESPACE, PLAN)
    second = open_run(kube, NAMESPACE, PLAN)
    first.append(StepStarted("gpu-2", 0, "cordon", 1))
    with pytest.raises(JournalWriteFailed, match="changed by another writer"):
        second.append(StepStarted("gpu-3", 0, "cordon", 1))
    with pytest.raises(JournalWriteFailed, match="unusable"):
        second.append(StepStarted("gpu-3", 0, "cordon", 1))
    found = find_run(kube, NAMESPACE, PLAN)
    assert found is not None
    assert found.state.step_in_flight("gpu-2") is not None  # the first writer's record
    assert found.state.step_in_flight("gpu-3") is None


def test_an_unfinished_run_is_not_replaced(kube: KubeClient) -> None:
    with start(kube, "20261201-040000-registry-mirror-0001") as journal:
        journal.append(StepStarted("gpu-1", 0, "cordon", 1))
    with pytest.raises(JournalError, match="holds run 20261201-040000-registry-mirror-0001, not"):
        start(kube, "20261201-050000-registry-mirror-0002")
    found = find_run(kube, NAMESPACE, PLAN)
    assert found is not None and found.run_id == "20261201-040000-registry-mirror-0001"


def test_a_finished_run_is_replaced_by_the_next_new_run(kube: KubeClient) -> None:
    with start(kube, "20261201-040000-registry-mirror-0001") as journal:
        run_node(journal, "gpu-1")
        journal.append(RunFinished(RunOutcome.SUCCEEDED))
    with start(kube, "20261201-050000-registry-mirror-0002") as journal:
        assert journal.replay().run_id == "20261201-050000-registry-mirror-0002"
    found = find_run(kube, NAMESPACE, PLAN)
    assert found is not None and found.run_id == "20261201-050000-registry-mirror-0002"
    assert len(journal_text(found.secret).splitlines()) == 1


def test_a_changed_plan_json_is_refused(kube: KubeClient) -> None:
    with start(kube) as journal:
        journal.append(StepStarted("gpu-1", 0, "cordon", 1))
    secret = kube.get_secret(NAMESPACE, run_object_name(PLAN))
    for changed, said in (
        (pack_text("{}"), "does not match the plan run"),
        ("not gzip", "cannot be read"),
    ):
        secret = kube.get_secret(NAMESPACE, run_object_name(PLAN))
        kube.replace_secret(secret.with_data({**secret.data, "plan.json.gz": changed}))
        found = find_run(kube, NAMESPACE, PLAN)
        assert found is not None
        with pytest.raises(JournalMismatch, match="secret rollout/rollout-registry-mirror-run"):
            found.read_plan_json()
        with open_run(kube, NAMESPACE, PLAN) as journal, pytest.raises(JournalMismatch, match=said):
            journal.read_plan_json()


def test_a_run_too_big_for_a_secret_stops_before_acting(
    kube: KubeClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cluster_run, "MAX_DATA_BYTES", 2000)
    with start(kube) as journal, pytest.raises(JournalWriteFailed, match="split the plan"):
        run_node(journal, "gpu-1")
    found = find_run(kube, NAMESPACE, PLAN)
    assert found is not None and isinstance(found.secret, Secret)


def test_a_long_journal_is_kept_in_packed_chunks(
    kube: KubeClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cluster_run, "CHUNK_CHARS", 2000)
    with start(kube) as journal:
        for node in ("gpu-1", "gpu-2", "gpu-3", "gpu-4"):
            run_node(journal, node)
        written = journal.entries()
    secret = kube.get_secret(NAMESPACE, run_object_name(PLAN))
    chunks = sorted(k for k in secret.data if k.startswith("journal.0"))
    assert len(chunks) >= 3 and chunks[0] == "journal.0000.jsonl.gz"
    assert len(secret.data["journal.jsonl"]) <= 2000
    # reopened: every record, in order, from the chunks and the open part
    with open_run(kube, NAMESPACE, PLAN) as again:
        assert again.entries() == written
        again.append(StepStarted("gpu-5", 0, "cordon", 1))
    found = find_run(kube, NAMESPACE, PLAN)
    assert found is not None and found.state.step_in_flight("gpu-5") is not None
    # a chunk gone is said, not skipped over
    secret = kube.get_secret(NAMESPACE, run_object_name(PLAN))
    kube.replace_secret(secret.with_data({k: v for k, v in secret.data.items() if k != chunks[1]}))
    with pytest.raises(JournalError, match="one is missing"):
        find_run(kube, NAMESPACE, PLAN)
