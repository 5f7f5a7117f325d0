"""The lab's API faults: the settings, the seeded decisions, and what the emulator does with
them, seen through rollout's own KubeClient (which must retry each fault exactly as its class
allows and never do a write twice)."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from rollout.cli import main
from rollout.errors import BadInput
from rollout.lab.apiserver import ApiServer, Registry
from rollout.lab.apiserver.faults import ApiFaultInjector
from rollout.lab.faults import (
    ONCE,
    ApiFault,
    FaultSettings,
    decide,
    parse_fault_spec,
    read_fault_log,
    write_settings,
)
from rollout.lab.sshfaults import Proc, _is_session, asked_command, node_processes
from rollout.retry import RetryEvent, RetryPolicy, watch_retries
from rollout.transports.errors import KubeUnreachable, ServerError
from rollout.transports.kube import ConfigMap, KubeClient, Lease
from rollout.transports.kube.calls import JsonCalls
from rollout.transports.kube.resources import NODES

FAST = RetryPolicy(attempts=6, first_wait_s=0.01, max_wait_s=0.05, deadline_s=30)


def test_spec_parses_rates_kinds_and_once() -> None:
    settings = parse_fault_spec("api=0.2,ssh=0.1", seed=7)
    assert (settings.api_read, settings.api_write, settings.ssh, settings.seed) == (
        0.2,
        0.2,
        0.1,
        7,
    )
    once = parse_fault_spec("api-write=once,kinds=503+429,slow=2")
    assert once.api_write == ONCE and once.api_read == 0.0
    assert once.kinds == ("503", "429") and once.slow_s == 2.0
    assert not parse_fault_spec("off").active
    assert FaultSettings.from_json(once.to_json()) == once


@pytest.mark.parametrize(
    ("spec", "words"),
    [
        ("api=1.5", "not a probability"),
        ("api", "not KEY=VALUE"),
        ("ssh=once", "not a probability between 0 and 1"),
        ("kinds=418", "unknown kind(s) 418"),
        ("colour=red", "unknown key 'colour'"),
    ],
)
def test_bad_specs_say_what_is_wrong(spec: str, words: str) -> None:
    with pytest.raises(BadInput, match=words.replace("(", r"\(").replace(")", r"\)")):
        parse_fault_spec(spec)


def test_decisions_are_reproducible_and_near_the_rate() -> None:
    kinds = list(ApiFault)
    first = [decide(3, 0.2, f"GET /api/v1/nodes/n{i}", 0, kinds) for i in range(2000)]
    again = [decide(3, 0.2, f"GET /api/v1/nodes/n{i}", 0, kinds) for i in range(2000)]
    other = [decide(4, 0.2, f"GET /api/v1/nodes/n{i}", 0, kinds) for i in range(2000)]
    assert first == again and first != other
    hits = sum(1 for d in first if d is not None)
    assert 300 < hits < 500  # 20% of 2000, give or take
    assert {d for d in first if d is not None} == set(kinds)
    # "once": the first sight of each request, never a later one
    assert decide(1, ONCE, "PUT /x", 0, kinds) is not None
    assert all(decide(1, ONCE, "PUT /x", n, kinds) is None for n in range(1, 20))


@dataclass
class FaultyApi:
    url: str
    lab_dir: Path
    registry: Registry

    def set(self, spec: str, seed: int = 0) -> None:
        write_settings(self.lab_dir, parse_fault_spec(spec, seed))

    def client(self, timeout_s: float = 5.0) -> KubeClient:
        kube = KubeClient.from_url(self.url)
        kube._calls = JsonCalls(kube._api, (timeout_s, timeout_s), FAST)
        return kube


@pytest.fixture
def api(tmp_path: Path) -> Iterator[FaultyApi]:
    registry = Registry()
    with ApiServer.start(registry) as server:
        server.inject_faults(ApiFaultInjector(tmp_path))
        yield FaultyApi(server.url, tmp_path, registry)


def seed_objects(kube: KubeClient) -> None:
    kube.create_configmap(ConfigMap("default", "cm", {"a": "1"}))
    for name in ("n1", "n2"):
        body = {"metadata": {"name": name}, "status": {"conditions": []}}
        kube._calls.request_once("create", f"node {name}", NODES.create(body))


def test_every_write_fails_once_and_is_retried_exactly_once(api: FaultyApi) -> None:
    kube = api.client()
    seed_objects(kube)
    api.set("api-write=once,kinds=503+500+429+reset+409", seed=5)
    events: list[RetryEvent] = []
    with watch_retries(events.append):
        kube.patch_node_labels("n1", {"a": "b"})
        kube.patch_node_labels("n2", {"a": "b"})
        kube.set_unschedulable("n1", True)  # the same PATCH path: seen before, not faulted
        current = kube.get_configmap("default", "cm")
        kube.replace_configmap(current.with_data({"a": "2"}))
        kube.create_configmap(ConfigMap("default", "cm2", {"b": "1"}))
        kube.create_event("default", "n1", "RolloutTest", "one event")
    faults = read_fault_log(api.lab_dir)
    writes = [f.request for f in faults]
    assert len(writes) == len(set(writes)) == 5, writes
    assert len(events) == len(faults), [e.describe() for e in events]
    # each retry names the fault that caused it (the Status message carries its id)
    for fault in faults:
        if fault.fault not in ("reset",):
            assert any(f"#{fault.id} " in str(e.error) for e in events), fault
    # and nothing was done twice
    assert kube.get_configmap("default", "cm").data == {"a": "2"}
    assert kube.get_configmap("default", "cm2").data == {"b": "1"}
    api.set("off")
    assert len([e for e in kube.list_events("default") if e.reason == "RolloutTest"]) == 1
    assert kube.get_node("n1").labels["a"] == "b" and kube.get_node("n1").unschedulable


def test_slow_answers_after_the_timeout_are_rechecked_not_redone(api: FaultyApi) -> None:
    kube = api.client(timeout_s=0.5)
    seed_objects(kube)
    api.set("api-write=once,kinds=slow,slow=1")
    events: list[RetryEvent] = []
    with watch_retries(events.append):
        kube.create_configmap(ConfigMap("default", "late", {"x": "1"}))
        kube.create_event("default", "n1", "RolloutSlow", "late event")
        lease = kube.create_lease(Lease("default", "l", holder_identity="me", lease_duration_s=30))
        kube.replace_lease(Lease(**{**lease.__dict__, "holder_identity": "me-again"}))
    assert [e.kind for e in events] == ["api timeout"] * 4
    api.set("off")
    # the re-check found each write done: one event, not two; the lease replaced once
    assert len([e for e in kube.list_events("default") if e.reason == "RolloutSlow"]) == 1
    assert kube.get_lease("default", "l").holder_identity == "me-again"
    slow = [f for f in read_fault_log(api.lab_dir) if f.fault == "slow"]
    assert len(slow) == 4


def test_a_real_conflict_is_not_retried_blindly(api: FaultyApi) -> None:
    kube = api.client()
    seed_objects(kube)
    stale = kube.get_configmap("default", "cm")
    kube.replace_configmap(stale.with_data({"a": "other writer"}))
    with pytest.raises(Exception, match="changed by another writer"):
        kube.replace_configmap(stale.with_data({"a": "mine"}))
    assert kube.get_configmap("default", "cm").data == {"a": "other writer"}


def test_reads_fail_with_each_kind_and_are_retried(api: FaultyApi) -> None:
    kube = api.client(timeout_s=0.5)
    seed_objects(kube)
    api.set("api-read=1,kinds=503,retry-after=1")
    with pytest.raises(ServerError, match="injected fault"):
        kube.get_node("n1")
    api.set("api-read=once,kinds=429,retry-after=1")
    events: list[RetryEvent] = []
    with watch_retries(events.append):
        assert kube.get_node("n1").name == "n1"
    # Retry-After is honoured: the wait is at least the server's second
    assert [(e.kind, e.wait_s >= 1.0) for e in events] == [("api 429", True)]
    api.set("api-read=1,kinds=reset")
    with pytest.raises(KubeUnreachable):
        kube.get_node("n1")


def test_a_watch_is_cut_mid_way(api: FaultyApi) -> None:
    kube = api.client()
    seed_objects(kube)
    api.set("api-read=1,kinds=watch-cut")
    url = f"{api.url}/api/v1/nodes?watch=true&timeoutSeconds=20"
    started = time.monotonic()
    lines = []
    with (
        urllib.request.urlopen(url, timeout=10) as response,
        contextlib.suppress(http.client.IncompleteRead),  # no terminating chunk
    ):
        for line in response:
            lines.append(json.loads(line))
    # the stream ended long before its 20 s, after the initial events
    assert time.monotonic() - started < 5
    assert [e["type"] for e in lines] == ["ADDED", "ADDED"]
    assert [f.fault for f in read_fault_log(api.lab_dir)] == ["watch-cut"]


def test_ssh_settings_and_sessions() -> None:
    settings = parse_fault_spec("ssh=0.1,ssh-kinds=cut+slow-link,link=1.5,refused=4")
    assert (settings.ssh, settings.ssh_kinds) == (0.1, ("cut", "slow-link"))
    assert (settings.link_s, settings.link_kbit, settings.refused_s) == (1.5, 256, 4.0)
    slow = parse_fault_spec("ssh=1,link-rate=64")
    assert slow.link_kbit == 64 and FaultSettings.from_json(slow.to_json()) == slow
    with pytest.raises(BadInput, match="link-rate"):
        parse_fault_spec("link-rate=fast")
    with pytest.raises(BadInput, match="node-killed"):
        parse_fault_spec("ssh-kinds=node-killed")  # node death is not a rate's to decide
    # the per-connection sshd is a session; the listener (child of init) is not
    procs = {
        1: Proc(1, 0, "systemd", "/sbin/init"),
        44: Proc(44, 1, "sshd", "sshd: /usr/sbin/sshd -D [listener]"),
        985: Proc(985, 44, "sshd", "sshd: root@notty"),
        991: Proc(991, 985, "timeout", "timeout 60s cat /etc/hostname"),
    }
    assert _is_session(procs[985], procs) and not _is_session(procs[44], procs)
    assert not _is_session(procs[991], procs)
    # one request whether the watcher saw the shell or the command it exec'd
    seen = ("bash -c timeout 60s cat '/etc/a b'", "timeout 60s cat /etc/a b")
    assert {asked_command(c) for c in seen} == {"timeout 60s cat /etc/a b"}
    assert asked_command("sh -c") == "sh -c" and asked_command("bashful -c x") == "bashful -c x"


def test_faults_switched_off_end_those_in_progress(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stopped sshd is started and a slowed link restored the moment faults go off, not
    `refused`/`link` seconds later: the chaos test's checks after `off` met a refused
    connection (a refusal injected on the run's last command was still running)."""
    from rollout.lab import sshfaults

    done: list[str] = []
    monkeypatch.setattr(
        sshfaults, "_in_node", lambda leader, argv: done.append(f"{leader} {argv[1]}")
    )
    monkeypatch.setattr(sshfaults.linkshaper, "slow_down", lambda a, k: done.append(f"slow {a}"))
    monkeypatch.setattr(sshfaults.linkshaper, "restore", lambda a: done.append(f"restore {a}"))
    injector = sshfaults.SshFaultInjector(tmp_path, [])
    on = parse_fault_spec("ssh=0.5,refused=600,link=600")
    write_settings(tmp_path, on)
    assert injector._current() == on
    node = sshfaults.NodeProcesses("n1", "127.0.9.1", tmp_path / "pid")
    session = Proc(985, 44, "sshd", "sshd: root@notty")
    command = Proc(991, 985, "cat", "cat /etc/hostname")
    injector._inject(node, 4242, sshfaults.SshFault.REFUSED, [], command, on)
    injector._inject(node, 4242, sshfaults.SshFault.SLOW, [session], command, on)
    assert done == ["4242 stop", "slow 127.0.9.1"]

    write_settings(tmp_path, parse_fault_spec("off"))
    os.utime(tmp_path / "faults.json", ns=(1, 1))  # a new mtime even on a coarse clock
    assert not injector._current().ssh
    assert done[2:] == ["restore 127.0.9.1", "4242 start"]
    injector._end_faults()  # nothing left to end: no second start
    assert len(done) == 4


def test_this_namespace_lists_this_process() -> None:
    listed = {p.pid: p for p in node_processes(os.getpid())}
    # comm is the interpreter's, or the script's when pytest runs as `.venv/bin/pytest`
    assert os.getpid() in listed and listed[os.getpid()].comm.startswith(("python", "pytest"))


def test_lab_faults_sets_and_shows_a_labs_faults(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["lab", "faults", "api=0.1", "--lab-dir", str(tmp_path)]) == 2
    assert "no lab at" in capsys.readouterr().err
    (tmp_path / "lab.json").write_text("{}")
    spec = ["api-write=once,kinds=503", "--seed", "9"]
    assert main(["lab", "faults", *spec, "--lab-dir", str(tmp_path)]) == 0
    settings = FaultSettings.from_json(json.loads((tmp_path / "faults.json").read_text()))
    assert (settings.api_write, settings.kinds, settings.seed) == (ONCE, ("503",), 9)
    capsys.readouterr()
    assert main(["lab", "faults", "--lab-dir", str(tmp_path)]) == 0
    assert "api-read=0.0,api-write=once" in capsys.readouterr().out
    assert main(["lab", "faults", "api=2", "--lab-dir", str(tmp_path)]) == 2
