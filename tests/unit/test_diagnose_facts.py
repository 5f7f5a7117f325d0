"""The facts diagnose adds: each parser from recorded output, and `facts record` round trips."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import pytest

from rollout.driver.status import DriverStatusFact, parse_driver_status
from rollout.errors import BadInput
from rollout.facts import load_recorded_facts
from rollout.facts.containerd import ConfigMtimesFact, parse_mtimes
from rollout.facts.kernel import KernelXidFact, parse_xids
from rollout.facts.pods import parse_pod_manifest, quantity_value
from rollout.facts.recording import record_fleet, service_text
from rollout.facts.service import parse_service_show
from tests.unit.diagnose_facts import NOW, build_facts, load_cases

DEFAULTS, _ = load_cases()

XID_CASES = [
    ("", []),
    ("kernel: eth0 up\n", []),
    (
        "2026-11-30T10:01:02+0000 n kernel: NVRM: Xid (PCI:0000:3b:00): 79, pid=0, GPU has fallen"
        " off the bus.\n[ 12.3] NVRM: Xid (PCI:0000:3b:00): 79, pid=0, GPU has fallen off the bus.",
        [(79, "PCI:0000:3b:00")],
    ),
    (
        "NVRM: Xid (PCI:0000:af:00): 48, pid=1, DBE\nNVRM: Xid (PCI:0000:b0:00): 13, x",
        [(48, "PCI:0000:af:00"), (13, "PCI:0000:b0:00")],
    ),
]


@pytest.mark.parametrize(("text", "expected"), XID_CASES)
def test_parse_xids(text: str, expected: list[tuple[int, str]]) -> None:
    assert [(x.xid, x.pci) for x in parse_xids(text)] == expected


def test_xid_meaning_from_the_catalog() -> None:
    (event,) = parse_xids("NVRM: Xid (PCI:0000:3b:00): 95, pid=0, Uncontained")
    assert event.meaning == "uncontained ECC error (reset the GPU)"
    assert "not in rollout's Xid table" in parse_xids("NVRM: Xid (PCI:0): 7, x")[0].meaning


DRIVER_CASES = [
    ("GPU 0: NVIDIA A100 (UUID: GPU-aa-bb)\nrollout-exit=0\n", 0, ("GPU-aa-bb",), False),
    (
        "Failed to initialize NVML: Driver/library version mismatch\nrollout-exit=18\n",
        18,
        (),
        True,
    ),
    ("sh: 1: nvidia-smi: not found\nrollout-exit=127\n", 127, (), False),
    ("", 127, (), False),
    (
        "GPU 0: A100 (UUID: GPU-1)\n  MIG 1g.5gb Device 0: (UUID: MIG-2)\nrollout-exit=0",
        0,
        ("GPU-1",),
        False,
    ),
]


@pytest.mark.parametrize(("text", "code", "uuids", "mismatch"), DRIVER_CASES)
def test_parse_driver_status(text: str, code: int, uuids: tuple[str, ...], mismatch: bool) -> None:
    status = parse_driver_status(text)
    assert (status.exit_code, status.uuids, status.library_mismatch) == (code, uuids, mismatch)


def test_commands_are_read_only_argv() -> None:
    assert KernelXidFact().optional and DriverStatusFact().optional and ConfigMtimesFact().optional
    assert ConfigMtimesFact().command()[:2] == ["find", "/etc/containerd"]
    assert "journalctl -k" in KernelXidFact().command()[2]


def test_parse_mtimes() -> None:
    assert parse_mtimes("1700000000.25 /etc/containerd/config.toml\nbad line\n") == {
        "/etc/containerd/config.toml": 1700000000.25
    }


@pytest.mark.parametrize(
    ("manifest", "resources", "whole"),
    [
        (
            {"spec": {"containers": [{"resources": {"limits": {"nvidia.com/gpu": "2"}}}]}},
            {"nvidia.com/gpu": "2"},
            2,
        ),
        (
            {"spec": {"containers": [{"resources": {"requests": {"nvidia.com/gpu": "500m"}}}]}},
            {"nvidia.com/gpu": "0.5"},
            0,
        ),
        ({"spec": {"containers": [{"resources": {"limits": {"cpu": "2"}}}]}}, {}, 0),
        ({"spec": "not a mapping"}, {}, 0),
    ],
)
def test_parse_pod_manifest(manifest: dict, resources: dict, whole: int) -> None:  # type: ignore[type-arg]
    pod = parse_pod_manifest(manifest)
    assert (pod.gpu_resources, pod.gpu_request) == (resources, whole)
    assert parse_pod_manifest(pod.to_manifest()) == pod


def test_quantity() -> None:
    assert [quantity_value(t) for t in ("1", "250m", "x", " 2 ")] == [1, 0.25, 0, 2]


def test_service_text_round_trips() -> None:
    state = parse_service_show(DEFAULTS["all_nodes"]["service"])
    assert parse_service_show(service_text(state)) == state
    assert state.active_enter_at == datetime(2026, 11, 30, 10, 0, tzinfo=UTC) < NOW


def test_record_writes_what_recorded_facts_read_back(tmp_path: Path) -> None:
    cluster = {
        "runtime_classes": {"nvidia": "nvidia"},
        "daemonsets": [
            {
                "metadata": {"namespace": "gpu-operator", "name": "ds"},
                "spec": {
                    "template": {
                        "spec": {
                            "nodeSelector": {"nvidia.com/gpu.deploy.device-plugin": "true"},
                            "tolerations": [{"operator": "Exists"}, {"key": "k", "value": "v"}],
                        }
                    }
                },
                "status": {"desiredNumberScheduled": 3, "numberReady": 2},
            }
        ],
        "pods": [
            {
                "metadata": {"namespace": "ml", "name": "a"},
                "spec": {
                    "nodeName": "gpu-a-1",
                    "containers": [{"name": "m", "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
                },
                "status": {"phase": "Running"},
            }
        ],
    }
    all_nodes = {
        **DEFAULTS["all_nodes"],
        "kernel_log": "NVRM: Xid (PCI:0000:3b:00): 79, pid=0, off the bus.\n",
        "config_mtimes": {"/etc/containerd/config.toml": 1700000000.5},
        "taints": ["a=b:NoSchedule"],
        "driver_kernel": "6.1.0\n---\nNVRM version: NVIDIA UNIX Kernel Module  535.1\n---\n550.2\n",
        "service_journal": "x systemd[1]: containerd.service: Sent signal SIGHUP to main\n",
        "pod_logs": {"gpu-operator/p": "line one\nline two\n"},
        "pods": [
            {
                "metadata": {
                    "namespace": "gpu-operator",
                    "name": "nvidia-device-plugin-x",
                    "uid": "u1",
                    "annotations": {"kubernetes.io/config.mirror": "m"},
                    "ownerReferences": [{"kind": "DaemonSet", "name": "ds", "controller": True}],
                },
                "spec": {
                    "containers": [{"name": "p", "resources": {"limits": {"nvidia.com/gpu": 1}}}],
                    "volumes": [{"name": "v", "emptyDir": {}}],
                },
                "status": {
                    "phase": "Running",
                    "conditions": [{"type": "Ready", "status": "True"}],
                    "containerStatuses": [{"state": {"waiting": {"reason": "CrashLoopBackOff"}}}],
                },
            }
        ],
    }
    fleet = build_facts(tmp_path / "in", all_nodes=all_nodes, cluster=cluster)
    (pod,) = fleet.nodes[0].pods
    assert pod.owners[0].kind == "DaemonSet" and pod.is_mirror and pod.uses_empty_dir
    assert pod.container_reasons == ("CrashLoopBackOff",) and pod.gpu_request == 1 and pod.ready
    record_fleet(fleet, tmp_path / "out")
    again = load_recorded_facts(tmp_path / "out")
    assert [replace(n, recorded_at="") for n in again.nodes] == [
        replace(n, recorded_at="") for n in fleet.nodes
    ]
    assert again.cluster == fleet.cluster
    (daemonset,) = again.cluster.daemonsets or ()
    assert (daemonset.desired, daemonset.ready, len(daemonset.tolerations)) == (3, 2, 2)
    labels = {"nvidia.com/gpu.deploy.device-plugin": "true"}
    assert daemonset.excluded_by(labels, ("x:NoExecute",)) == ""  # tolerated by Exists


def test_record_redacts_secrets_and_refuses_a_used_directory(tmp_path: Path) -> None:
    fleet = build_facts(
        tmp_path / "in",
        node="gpu-a-1",
        files={
            "/etc/containerd/conf.d/50-auth.toml": (
                '[plugins."io.containerd.grpc.v1.cri".registry.configs."r.io".auth]\n'
                'password = "hunter2"\n'
            )
        },
    )
    record_fleet(fleet, tmp_path / "out")
    text = (tmp_path / "out/gpu-a-1/files/etc/containerd/conf.d/50-auth.toml").read_text()
    assert "hunter2" not in text and "redacted" in text
    assert (tmp_path / "out").stat().st_mode & 0o077 == 0
    with pytest.raises(BadInput, match="not empty"):
        record_fleet(fleet, tmp_path / "out")
