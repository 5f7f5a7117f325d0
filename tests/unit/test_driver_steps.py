"""The host driver steps against a fake node (dpkg, apt, lsmod, nvidia-smi, systemd that keep
state and answer in the real tools' words) and a fake API: apply, failures, undo order."""

from __future__ import annotations

import shlex
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, cast

import pytest

from rollout.commands import CommandResult
from rollout.driver.host import read_driver_host
from rollout.driver.operator import OPERAND_PAUSED as PAUSED
from rollout.executor import Executor
from rollout.facts import ClusterFacts, FleetFacts, GpuFacts, NodeFacts
from rollout.gates.kernel import XID_SCRIPT
from rollout.plan import NodePlan, Wave
from rollout.planner import build_plan
from rollout.playbook import load_playbooks
from rollout.run import Journal, StepOutcome
from rollout.spec import Spec, parse_spec
from rollout.steps import builtin_steps
from rollout.steps.base import StepContext, StepFailed
from rollout.transports.errors import SshConnectError
from rollout.transports.kube import KubeClient, Node, Pod
from tests.fakes import InMemoryKube, ScriptedRunner
from tests.node_facts import containerd_node

NODE = "gpu-1"
OLD, NEW, BROKEN = "535.183.01", "550.127.05", "560.35.03"
PACKAGE = "nvidia-driver-standin"
DEVICE_PLUGIN = "nvidia.com/gpu.deploy.device-plugin"
DCGM = "nvidia.com/gpu.deploy.dcgm"


@dataclass(kw_only=True)
class FakeHost(ScriptedRunner):
    """A node with a host-installed driver: packages, holds, loaded modules, GPU clients."""

    installed: str = OLD
    status: str = "ii "
    held: set[str] = field(default_factory=lambda: {PACKAGE})
    loaded: str | None = OLD  # the module's version; None: not loaded
    extra_modules: list[str] = field(default_factory=lambda: ["nvidia_uvm", "nvidia_modeset"])
    holders: int = 0  # references a process holds on `nvidia`
    mods: set[str] = field(default_factory=lambda: {"nvidia_uvm", "nvidia_modeset"})
    services: dict[str, bool] = field(default_factory=lambda: {"nvidia-persistenced.service": True})
    offered: tuple[str, ...] = (NEW, OLD, BROKEN)
    failing: str = BROKEN  # its postinst fails
    boot_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    reboots: int = 0
    down_polls: int = 0  # SSH answers nothing for this many commands after a reboot

    def answer(self, argv: tuple[str, ...], stdin: bytes | None, timeout_s: float) -> CommandResult:
        if self.down_polls > 0:
            self.down_polls -= 1
            raise SshConnectError(NODE, "root@gpu-1", "cannot connect: connection refused")
        code, out = self.respond(argv)
        return CommandResult(argv, code, out, "", NODE)

    def held_by(self) -> int:
        """References on `nvidia` from processes: a holder, and each running GPU client."""
        return self.holders + sum(self.services.values())

    def respond(self, argv: tuple[str, ...]) -> tuple[int, str]:
        """The exit code and stdout the real tool gives, after changing the node as it would."""
        line = shlex.join(argv)
        if "nvidia-smi --query-gpu=driver_version" in line:
            if self.loaded is None:
                return (
                    0,
                    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA "
                    "driver.\nrollout-exit=9\n",
                )
            if self.loaded != self.installed:
                return (
                    0,
                    "Failed to initialize NVML: Driver/library version mismatch\nrollout-exit=18\n",
                )
            return 0, f"{self.installed}\nrollout-exit=0\n"
        if "uname -r" in line:
            return 0, "6.1.0-18-amd64\n---\n---\n"
        if "dpkg-query" in line:
            # dpkg's desired-action flag is `h` for a held package: `hi ` is held and installed
            status = ("h" if PACKAGE in self.held else "i") + self.status[1:]
            return 0, f"{PACKAGE}\t{self.installed}-1\t{status}\n" if self.installed else ""
        if argv[:2] == ("apt-mark", "showhold"):
            return 0, "".join(f"{p}\n" for p in sorted(self.held))
        if argv[:2] == ("apt-mark", "hold"):
            self.held |= set(argv[2:])
            return 0, ""
        if "mokutil" in line:
            return 0, "rollout-no-mokutil\n"
        if argv[:3] == ("systemctl", "show", "-p"):
            return 0, "\n".join(
                f"Id={u}\nLoadState={'loaded' if u in self.services else 'not-found'}\n"
                f"ActiveState={'active' if self.services.get(u) else 'inactive'}\n"
                for u in argv[5:]
            )
        if argv[:3] == ("systemctl", "show", "containerd"):
            return 0, "MainPID=42\nActiveState=active\nSubState=running\n"
        if argv[:2] in (("systemctl", "stop"), ("systemctl", "start")):
            self.services[argv[2]] = argv[1] == "start"
            return 0, ""
        if argv == ("systemctl", "reboot"):
            self.reboots += 1
            self.boot_id = str(uuid.uuid4())
            self.loaded = self.installed
            self.holders = 0
            self.mods = set(self.extra_modules)
            self.services = dict.fromkeys(self.services, True)
            self.down_polls = 3
            return 0, ""
        if argv == ("lsmod",):
            users = [m for m in self.extra_modules if m in self.mods]
            return 0, "Module  Size  Used by\n" + "".join(f"{m}  1000  0\n" for m in users) + (
                f"nvidia  1000  {len(users) + self.held_by()} {','.join(users)}\n"
                if self.loaded
                else ""
            )
        if argv[0] == "rmmod":
            if argv[1] == "nvidia" and (self.held_by() or self.mods):
                return 1, "rmmod: ERROR: Module nvidia is in use\n"
            if argv[1] == "nvidia":
                self.loaded = None
            self.mods.discard(argv[1])
            return 0, ""
        if argv[0] == "modprobe":
            if argv[1] == "nvidia" or self.loaded is None:
                self.loaded = self.installed
            if argv[1] != "nvidia":
                self.mods.add(argv[1])
            return 0, ""
        if "apt-cache madison" in line:
            return 0, "".join(
                f"{PACKAGE} | {v}-1 | file:/opt/rollout-lab/apt ./ Packages\n" for v in self.offered
            )
        if "apt-get" in argv and "install" in argv:
            (pin,) = [a for a in argv if a.startswith(f"{PACKAGE}=")]
            version = pin.split("=")[1].removesuffix("-1")
            self.installed = version
            if version == self.failing:
                self.status = "iF "
                return 100, (
                    f"Setting up {PACKAGE} ({version}-1) ...\n"
                    f"dpkg: error processing package {PACKAGE} (--configure):\n"
                    " installed nvidia-driver-standin package post-installation script "
                    "subprocess returned error exit status 1\n"
                    "E: Sub-process /usr/bin/dpkg returned an error code (1)\n"
                )
            self.status = "ii "
            return 0, f"Setting up {PACKAGE} ({version}-1) ...\n"
        if argv == ("cat", "/proc/sys/kernel/random/boot_id"):
            return 0, self.boot_id + "\n"
        if argv == ("sh", "-c", XID_SCRIPT):  # the gates, read before a rollback uncordons
            return 0, f"{self.boot_id}\n1000.00\n"
        raise AssertionError(f"unscripted command: {argv}")


class FakeKube(InMemoryKube):
    """Node labels and the operand pods that follow them, as the operator's DaemonSets do."""

    def __init__(self, labels: Mapping[str, str]) -> None:
        super().__init__(
            Node(
                name=NODE,
                uid="n1",
                resource_version="1",
                labels=dict(labels),
                conditions={"Ready": "True"},
            )
        )
        self.patches: list[dict[str, str | None]] = []

    def list_nodes(self, label_selector: str | None = None) -> list[Node]:
        return [] if label_selector else [self.node]

    def patch_node_labels(self, name: str, labels: Mapping[str, str | None]) -> Node:
        self.patches.append(dict(labels))
        return super().patch_node_labels(name, labels)

    def list_pods(self, namespace: str | None = None, label_selector: str | None = None,
                  field_selector: str | None = None) -> list[Pod]:  # fmt: skip
        return [
            Pod(
                namespace="gpu-operator",
                name=f"{key.rsplit('.', 1)[1]}-x",
                uid=key,
                resource_version="1",
                node_name=NODE,
                phase="Running",
                node_selector={key: "true"},
            )
            for key, value in self.node.labels.items()
            if key.startswith("nvidia.com/gpu.deploy.") and value == "true"
        ]


SPEC = """\
apiVersion: rollout/v1
kind: Plan
metadata: {{name: unit}}
targets: {{nodes: [gpu-1]}}
changes:
  - driver-upgrade: {{version: "{version}", mode: host, packages: [nvidia-driver-standin]}}
policy:
  driver: {{reload: {reload}{extra}}}
"""
LABELS = {"nvidia.com/gpu.present": "true", DEVICE_PLUGIN: "true", DCGM: "false"}


def make_spec(reload: str = "modules", version: str = NEW, extra: str = "") -> Spec:
    return parse_spec(SPEC.format(version=version, reload=reload, extra=extra), "unit.yaml")


def node_facts(host: FakeHost, spec: Spec) -> NodeFacts:
    change_packages = (PACKAGE,)
    return replace(
        containerd_node(NODE, config=""),
        labels=dict(LABELS),
        gpus=GpuFacts(count=0, driver_version=host.installed),
        driver_host=read_driver_host(cast(Any, host), change_packages, NEW),
    )


def context_for(
    host: FakeHost, spec: Spec, kube: FakeKube, journal: Journal, facts: NodeFacts | None = None
) -> StepContext:
    """A step's context on NODE: the fake host and cluster, no output, no sleeping; the
    node's facts read from the host unless given."""
    return StepContext(
        NODE,
        NodePlan(NODE, "1.7.24", ()),
        facts or node_facts(host, spec),
        spec,
        cast(Any, host),
        cast(KubeClient, kube),
        journal,
        progress=lambda _: None,
        sleep=lambda _: None,
    )


@dataclass
class Run:
    host: FakeHost
    kube: FakeKube
    journal: Journal
    report: Any

    def outcomes(self) -> list[tuple[str, str]]:
        state = self.journal.replay().node(NODE)
        return [(c.kind, c.outcome.value) for c in state.completed]


def apply(tmp_path: Path, spec: Spec, host: FakeHost, kube: FakeKube | None = None) -> Run:
    kube = kube or FakeKube(LABELS)
    facts = node_facts(host, spec)
    fleet = FleetFacts((facts,), ClusterFacts(), "unit")
    plan = build_plan(spec, "unit.yaml", fleet, load_playbooks())
    # only the driver steps: the GPU checks and drain have their own tests
    keep = {"cordon", "uncordon"} | {
        s.kind for s in plan.nodes[0].steps if s.kind.startswith("driver.")
    }
    node = replace(plan.nodes[0], steps=tuple(s for s in plan.nodes[0].steps if s.kind in keep))
    plan = replace(plan, waves=(Wave(1, (node,)),))
    journal = Journal.create(tmp_path, "unit", "{}")

    def context(node_plan: NodePlan) -> StepContext:
        return replace(context_for(host, spec, kube, journal, facts), node_plan=node_plan)

    class Quiet:
        def __getattr__(self, name: str) -> Any:
            return lambda *args, **kwargs: None

    executor = Executor(plan, spec, builtin_steps(), journal, cast(Any, kube), context, Quiet())
    return Run(host, kube, journal, executor.run())


def test_module_reload_upgrades_pauses_and_restores_operands(tmp_path: Path) -> None:
    host = FakeHost()
    run = apply(tmp_path, make_spec("modules"), host)
    assert run.report.outcome.value == "succeeded", run.report
    assert (host.installed, host.loaded, host.held, host.reboots) == (NEW, NEW, {PACKAGE}, 0)
    assert host.services == {"nvidia-persistenced.service": True}
    # paused, then the original values back; `false` never touched
    assert run.kube.patches == [{DEVICE_PLUGIN: PAUSED}, {DEVICE_PLUGIN: "true"}]
    assert run.kube.node.labels[DCGM] == "false"
    rmmods = [c[1] for c in host.calls if c[0] == "rmmod"]
    assert rmmods.index("nvidia") == len(rmmods) - 1  # users first
    install = [c for c in host.calls if "apt-get" in c]
    assert "--allow-downgrades" in install[0] and f"{PACKAGE}={NEW}-1" in install[0]


def test_reboot_mode_leaves_the_module_until_the_boot_and_proves_it(tmp_path: Path) -> None:
    host = FakeHost()
    run = apply(tmp_path, make_spec("reboot"), host)
    assert run.report.outcome.value == "succeeded", run.report
    assert host.reboots == 1 and host.loaded == NEW
    assert not any(c[0] == "rmmod" for c in host.calls)
    boot_reads = [c for c in host.calls if c == ("cat", "/proc/sys/kernel/random/boot_id")]
    assert len(boot_reads) >= 2  # before, and the new one after


def test_a_busy_module_fails_the_node_before_anything_is_installed(tmp_path: Path) -> None:
    host = FakeHost(holders=1)
    run = apply(tmp_path, make_spec("modules"), host)
    assert run.report.outcome.value == "halted"
    outcome, reason = run.report.nodes[NODE]
    assert outcome == "rolled-back" and "in use" in reason and "reboot_if_busy is false" in reason
    assert host.installed == OLD and not any("apt-get" in c for c in host.calls)
    assert host.services["nvidia-persistenced.service"]  # started again by the undo
    assert run.kube.node.labels[DEVICE_PLUGIN] == "true"


def test_a_busy_module_reboots_where_the_plan_allows_it(tmp_path: Path) -> None:
    host = FakeHost(holders=1)
    run = apply(tmp_path, make_spec("modules", extra=", reboot_if_busy: true"), host)
    assert run.report.outcome.value == "succeeded", run.report
    assert host.reboots == 1 and host.loaded == NEW


def test_a_failing_package_is_rolled_back_to_the_previous_version(tmp_path: Path) -> None:
    host = FakeHost()
    run = apply(tmp_path, make_spec("modules", version=BROKEN), host)
    assert run.report.outcome.value == "halted"
    outcome, reason = run.report.nodes[NODE]
    assert outcome == "rolled-back"
    assert "post-installation script" in reason and f"{PACKAGE}={OLD}-1" in reason
    assert (host.installed, host.status, host.held) == (OLD, "ii ", {PACKAGE})
    assert host.loaded == OLD  # modprobed again by driver.unload's undo
    assert run.kube.node.labels[DEVICE_PLUGIN] == "true"
    assert not run.kube.node.unschedulable


def test_undo_after_the_reload_reinstalls_then_reloads_then_resumes(tmp_path: Path) -> None:
    """A failure after driver.resume: undo pauses the operands again, reinstalls and holds the
    previous version, reloads it, and puts the labels back, in that order."""
    host = FakeHost()
    spec = make_spec("modules")
    run = apply(tmp_path, spec, host)
    assert run.report.outcome.value == "succeeded"
    steps = builtin_steps()
    state = run.journal.replay().node(NODE)
    order = [c.kind for c in reversed(state.completed) if c.outcome is StepOutcome.DONE]
    assert order[:6] == ["uncordon", "driver.resume", "driver.verify", "driver.reload",
                         "driver.install", "driver.unload"]  # fmt: skip
    host.calls.clear()
    facts = node_facts(host, spec)
    ctx = context_for(host, spec, run.kube, run.journal, facts)
    seen: list[str] = []
    for kind in order[1:]:
        steps[kind].undo(ctx)
        seen.append(
            f"{kind}: {host.installed} loaded {host.loaded} {run.kube.node.labels[DEVICE_PLUGIN]}"
        )
    assert seen[0] == f"driver.resume: {NEW} loaded {NEW} {PAUSED}"
    assert seen[3] == f"driver.install: {OLD} loaded {NEW} {PAUSED}"  # the mismatch, until...
    assert seen[4] == f"driver.unload: {OLD} loaded {OLD} {PAUSED}"  # ...the reload
    assert seen[5] == f"driver.pause: {OLD} loaded {OLD} true"
    assert host.held == {PACKAGE}


def test_install_resumed_after_a_kill_finds_it_done_and_keeps_the_first_previous(
    tmp_path: Path,
) -> None:
    host = FakeHost()
    spec = make_spec("modules")
    facts = node_facts(host, spec)
    journal = Journal.create(tmp_path, "unit", "{}")
    ctx = context_for(host, spec, FakeKube(LABELS), journal, facts)
    install = builtin_steps()["driver.install"]
    assert install.apply(ctx).kind.value == "done"
    # a resumed run applies the step in flight again: it is already there
    again = install.apply(ctx)
    assert again.kind.value == "noop" and "already installed and held" in again.detail
    assert journal.load_step_data(NODE, "driver.install")["previous"] == {PACKAGE: f"{OLD}-1"}


def test_a_reboot_resumed_after_a_kill_waits_instead_of_rebooting_again(tmp_path: Path) -> None:
    host = FakeHost()
    spec = make_spec("reboot")
    journal = Journal.create(tmp_path, "unit", "{}")
    journal.save_step_data(NODE, "driver.unload", {"stopped": [], "reboot": True})
    ctx = context_for(host, spec, FakeKube(LABELS), journal)
    before = host.boot_id
    # the first attempt: boot id saved, reboot requested, then the process is killed
    journal.save_step_data(NODE, "driver.reload", {"reboot": {"boot_before": before}})
    host.respond(("systemctl", "reboot"))
    result = builtin_steps()["driver.reload"].apply(ctx)
    assert host.reboots == 1, "a resumed wait must not reboot again"
    assert result.kind.value == "done" and before[:8] in result.detail


def test_a_reboot_that_never_comes_back_times_out_naming_the_stage(tmp_path: Path) -> None:
    host = FakeHost()
    spec = make_spec("reboot", extra=", reboot_timeout_s: 30")
    journal = Journal.create(tmp_path, "unit", "{}")
    journal.save_step_data(NODE, "driver.unload", {"stopped": [], "reboot": True})
    host.respond = lambda argv, real=host.respond: (  # type: ignore[method-assign]
        (0, "") if argv == ("systemctl", "reboot") else real(argv)
    )
    ctx = context_for(host, spec, FakeKube(LABELS), journal)
    with pytest.raises(
        StepFailed, match=r"waited 30s \(policy.driver.reboot_timeout_s\) for a new boot_id"
    ):
        builtin_steps()["driver.reload"].apply(ctx)


def test_verify_refuses_a_library_mismatch(tmp_path: Path) -> None:
    host = FakeHost(installed=NEW, loaded=OLD)
    spec = make_spec("modules")
    ctx = context_for(host, spec, FakeKube(LABELS), Journal.create(tmp_path, "unit", "{}"))
    with pytest.raises(StepFailed, match="Driver/library version mismatch"):
        builtin_steps()["driver.verify"].apply(ctx)


def test_every_host_driver_step_is_registered() -> None:
    kinds = set(builtin_steps())
    assert {"driver.pause", "driver.unload", "driver.install", "driver.reload",
            "driver.verify", "driver.resume"} <= kinds  # fmt: skip


def test_a_resumed_run_expects_the_gpus_gfd_counted_when_nvidia_smi_lists_none() -> None:
    from rollout.steps.gpu_wait import expect_gpus

    host = FakeHost(loaded=None)  # modules unloaded by the killed run: nvidia-smi lists nothing
    spec = make_spec("modules")
    facts = replace(node_facts(host, spec), labels={**LABELS, "nvidia.com/gpu.count": "2"})
    assert facts.gpus.count == 0
    assert expect_gpus(spec, facts).count == 2


def test_a_reload_resumed_after_a_partial_modprobe_loads_the_rest(tmp_path: Path) -> None:
    host = FakeHost(installed=NEW, loaded=NEW, mods=set())  # killed after `modprobe nvidia`
    ctx = context_for(
        host, make_spec("modules"), FakeKube(LABELS), Journal.create(tmp_path, "unit", "{}")
    )
    order = ["nvidia_modeset", "nvidia_uvm", "nvidia"]
    ctx.save_data("driver.unload", {"stopped": [], "loaded_before": order, "unloaded": order})
    result = builtin_steps()["driver.reload"].apply(ctx)
    assert host.mods == {"nvidia_uvm", "nvidia_modeset"}
    assert ("modprobe", "nvidia") not in host.calls  # loaded already: not again
    assert f"nvidia-smi reports {NEW}" in result.detail


def test_reboot_mode_undo_after_the_reboot_reinstalls_and_reboots_into_the_old_driver(
    tmp_path: Path,
) -> None:
    host = FakeHost()
    spec = make_spec("reboot")
    run = apply(tmp_path, spec, host)
    assert run.report.outcome.value == "succeeded" and host.reboots == 1
    state = run.journal.replay().node(NODE)
    order = [c.kind for c in reversed(state.completed) if c.outcome is StepOutcome.DONE]
    facts = node_facts(host, spec)
    ctx = context_for(host, spec, run.kube, run.journal, facts)
    steps = builtin_steps()
    for kind in order[1:]:  # all but uncordon, as the executor would after a later failure
        steps[kind].undo(ctx)
    assert (host.installed, host.loaded, host.reboots) == (OLD, OLD, 2)
    assert host.services == {"nvidia-persistenced.service": True}
    assert run.kube.node.labels[DEVICE_PLUGIN] == "true"
