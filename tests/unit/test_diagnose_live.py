"""The live seam of diagnose: one node probed through a scripted runner, facts that fail to
read named instead of fatal, and the findings they lead to."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from rollout.commands import DEFAULT_TIMEOUT_S, CommandResult
from rollout.diagnose import diagnose
from rollout.facts import ClusterFacts, FleetFacts
from rollout.facts.live import probe_node_tolerantly
from rollout.transports.kube import Node
from tests.unit.diagnose_facts import EXAMPLES, NOW

MAIN = (EXAMPLES / "gpu-a-2/files/etc/containerd/config.toml").read_text()
TOOLKIT = (EXAMPLES / "gpu-a-2/files/etc/containerd/conf.d/99-nvidia.toml").read_text()
FILES = f"/etc/containerd/config.toml\0{MAIN}\0/etc/containerd/conf.d/99-nvidia.toml\0{TOOLKIT}\0"


@dataclass
class ScriptedRunner:
    """Answers each command by its first words; anything else exits 127."""

    answers: Mapping[str, tuple[int, str]]
    host: str = "gpu-a-2"
    ran: list[str] = field(default_factory=list)

    def run(
        self,
        argv: Sequence[str],
        *,
        stdin: bytes | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> CommandResult:
        line = " ".join(argv)
        self.ran.append(line)
        for prefix, (code, out) in self.answers.items():
            if line.startswith(prefix):
                return CommandResult(tuple(argv), code, out, "boom" if code else "", self.host)
        return CommandResult(tuple(argv), 127, "", "not found", self.host)


NODE = Node(
    name="gpu-a-2",
    uid="u",
    resource_version="1",
    labels={"nvidia.com/gpu.present": "true"},
    conditions={"Ready": "True"},
    capacity={"nvidia.com/gpu": "4"},
    allocatable={"nvidia.com/gpu": "0"},
)
BASE = {
    "containerd --version": (0, "containerd github.com/containerd/containerd 1.7.24~ds1 x\n"),
    "find /etc/containerd -type f -size": (0, FILES),
}


def test_a_stopped_containerd_is_a_finding_not_a_failed_probe() -> None:
    runner = ScriptedRunner(
        {
            **BASE,
            "systemctl show containerd": (
                0,
                "MainPID=0\nActiveState=failed\nSubState=failed\nNRestarts=5\n"
                "ActiveEnterTimestamp=n/a\n",
            ),
            "containerd --config": (1, ""),
            "sh -c nvidia-smi": (0, "GPU 0: A100 (UUID: GPU-1)\nrollout-exit=0\n"),
            "sh -c journalctl -k": (
                0,
                "kernel: NVRM: Xid (PCI:0000:3b:00): 79, pid=0, GPU has fallen off the bus.\n",
            ),
        }
    )
    node = probe_node_tolerantly("gpu-a-2", runner, NODE)
    assert node.service is not None and not node.service.running
    assert node.effective_config == {}
    assert any("config dump" in what for what in node.probe_errors)
    assert [x.xid for x in node.xids] == [79]
    assert node.driver_status is not None and node.driver_status.ok
    fleet = FleetFacts((node,), ClusterFacts(), "live")
    findings = diagnose(fleet, NOW).findings
    assert findings[0].check == "runtime.containerd-down"
    assert any("config dump" in e for e in findings[0].evidence)
    assert "advertising.unhealthy-devices" in {f.check for f in findings}


def test_no_nvidia_smi_and_no_log_reader_say_nothing() -> None:
    runner = ScriptedRunner(
        {
            **BASE,
            "systemctl show containerd": (
                0,
                "MainPID=9\nActiveState=active\nSubState=running\nNRestarts=0\n"
                "ActiveEnterTimestamp=Mon 2026-11-30 10:00:00 UTC\n",
            ),
        }
    )
    node = probe_node_tolerantly("gpu-a-2", runner, NODE)
    assert node.xids == () and node.config_mtimes == {}
    checks = {f.check for f in diagnose(FleetFacts((node,), ClusterFacts(), "live"), NOW).findings}
    assert "operator.nvidia-smi-failed" not in checks
    assert "operator.driver-library-mismatch" not in checks
