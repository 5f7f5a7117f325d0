"""The Xid gate's reading: only Xid lines logged since the node's change began count; the
soak's wait between waves."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from rollout.facts import load_recorded_facts
from rollout.gates.kernel import KernelClock, parse_xid_reading
from rollout.gates.soak import Soak
from rollout.planner import build_plan
from rollout.playbook import load_playbooks
from rollout.spec import load_spec, parse_spec
from tests.examples import FACTS, PLAN

BOOT = "0b1c2d3e-0000-4000-8000-000000000001"
OLD = "[  100.000000] NVRM: Xid (PCI:0000:0F:00): 79, pid=0, GPU has fallen off the bus."
NEW = "[  900.500000] NVRM: Xid (PCI:0000:07:00): 48, pid=0, DBE (double bit error)."
APP = "[  950.000000] NVRM: Xid (PCI:0000:07:00): 13, pid=77, Graphics Exception"


def reading(*lines: str, boot: str = BOOT, uptime: str = "1000.25") -> str:
    return "\n".join([boot, uptime, *lines]) + "\n"


def test_an_xid_before_the_change_does_not_count_and_one_after_does() -> None:
    parsed = parse_xid_reading(reading(OLD, NEW, NEW))  # journalctl and dmesg both print NEW
    assert parsed.clock == KernelClock(BOOT, 1000.25)
    new = parsed.since(KernelClock(BOOT, 500.0))
    assert [(e.xid, e.pci) for e in new] == [(48, "PCI:0000:07:00")]


def test_an_old_xid_alone_passes() -> None:
    assert parse_xid_reading(reading(OLD)).since(KernelClock(BOOT, 500.0)) == []


def test_application_xids_never_count() -> None:
    assert parse_xid_reading(reading(APP)).since(KernelClock(BOOT, 500.0)) == []


def test_after_a_reboot_every_xid_of_the_new_boot_counts() -> None:
    parsed = parse_xid_reading(reading(OLD, boot="another-boot"))
    assert [e.xid for e in parsed.since(KernelClock(BOOT, 500.0))] == [79]


def test_a_line_without_a_timestamp_counts() -> None:
    line = "NVRM: Xid (PCI:0000:07:00): 79, pid=0, GPU has fallen off the bus."
    assert [e.xid for e in parse_xid_reading(reading(line)).since(KernelClock(BOOT, 500.0))] == [79]


def test_the_soak_waits_its_time_checking_the_run_between_polls() -> None:
    now = [datetime(2026, 1, 1, tzinfo=UTC)]
    checks: list[datetime] = []

    def sleep(seconds: float) -> None:
        now[0] += timedelta(seconds=seconds)

    soak = Soak(12, lambda: now[0], sleep, lambda: checks.append(now[0]), lambda _: None)
    soak.wait(1, 2, soak.ends_from_now())
    assert now[0] == datetime(2026, 1, 1, 0, 0, 12, tzinfo=UTC)
    assert [c.second for c in checks] == [0, 5, 10, 12]


def test_a_halt_during_the_soak_ends_it() -> None:
    class Stop(Exception):
        pass

    def check() -> None:
        raise Stop

    soak = Soak(600, lambda: datetime(2026, 1, 1, tzinfo=UTC), lambda _: None, check, print)
    with pytest.raises(Stop):
        soak.wait(1, 1, soak.ends_from_now())


def gate_actions(spec_text: str | None = None) -> list[str | None]:
    spec = parse_spec(spec_text, "plan.yaml") if spec_text else load_spec(PLAN)
    plan = build_plan(spec, "plan.yaml", load_recorded_facts(FACTS), load_playbooks())
    return [s.action for n in plan.nodes for s in n.steps if s.kind == "gates"]


def test_the_plan_lists_each_nodes_gates_and_leaves_out_those_turned_off() -> None:
    (first, *_) = gate_actions()
    assert first is not None
    assert "resources whole (nvidia.com/gpu = 4, allocatable = capacity)" in first
    assert "no new Xid in the kernel log since the change began" in first
    text = PLAN.read_text() + "  verify:\n    gates: {xid: false}\n"
    (first, *_) = gate_actions(text)
    assert first is not None and "Xid" not in first and "resources whole" in first
